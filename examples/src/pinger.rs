//! A client-side echo session for `client latency --session`: each reply's handler,
//! on the connection's own thread, checks it and sends the next request, so a round
//! trip crosses no thread in the client.

use std::time::{Duration, Instant};

use anyhow::Result;
use rdmactor::prelude::*;
use rdmactor_services::echo::{EchoRequest, EchoResponse};

/// A client-side session that sends the next echo request from the reply's handler.
pub struct Pinger {
    payload: Vec<u8>,
    warmup: usize,
    left: usize,
    sent_at: Instant,
    rtts: Vec<Duration>,
    done: Option<tokio::sync::oneshot::Sender<Result<Vec<Duration>>>>,
}

impl Pinger {
    /// Times `iters` round trips of `payload` after `warmup` untimed ones; the round
    /// trips (or why the connection closed first) go to `done`.
    pub fn new(
        payload: Vec<u8>,
        warmup: usize,
        iters: usize,
        done: tokio::sync::oneshot::Sender<Result<Vec<Duration>>>,
    ) -> Pinger {
        Pinger {
            payload,
            warmup,
            left: iters,
            sent_at: Instant::now(),
            rtts: Vec::with_capacity(iters),
            done: Some(done),
        }
    }

    fn ping(&mut self, cx: &mut SessionCx<'_>) -> Result<(), SessionError> {
        let req = postcard::to_allocvec(&EchoRequest {
            payload: self.payload.clone(),
        })
        .map_err(|e| SessionError::new(e.to_string()))?;
        self.sent_at = Instant::now();
        cx.send(1, req)
    }
}

impl Session for Pinger {
    fn on_established(&mut self, cx: &mut SessionCx<'_>) -> Result<(), SessionError> {
        self.ping(cx)
    }

    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Incoming) -> Result<(), SessionError> {
        let rtt = self.sent_at.elapsed();
        let resp: EchoResponse = postcard::from_bytes(&msg.data)
            .map_err(|e| SessionError::new(format!("bad echo reply: {e}")))?;
        if resp.payload != self.payload {
            return Err(SessionError::new("echo payload differs"));
        }
        if self.warmup > 0 {
            self.warmup -= 1;
        } else {
            self.rtts.push(rtt);
            self.left -= 1;
        }
        if self.left == 0 {
            if let Some(done) = self.done.take() {
                let _ = done.send(Ok(std::mem::take(&mut self.rtts)));
            }
            return Ok(());
        }
        self.ping(cx)
    }

    fn on_close(&mut self, reason: &CloseReason) {
        if let Some(done) = self.done.take() {
            let _ = done.send(Err(anyhow::anyhow!("connection closed: {reason}")));
        }
    }
}
