//! Echo services: `echo` answers each typed request with its payload (the smallest useful
//! request/response service, and the load for the framework's benchmarks); `raw-echo`
//! sends every received SEND back byte for byte, so a plain verbs client that posts a
//! receive and sends N bytes gets the same N bytes back.

use rdmactor::runtime::{Framing, Incoming, PeerInfo, Service, Session, SessionCx, SessionError};
use rdmactor::transport::Transport;
use serde::{Deserialize, Serialize};

/// The `echo` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EchoRequest {
    /// Bytes to send back.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
}

/// The `echo` response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EchoResponse {
    /// The request's bytes.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
}

/// [`EchoRequest`] decoded in place.
#[derive(Deserialize)]
struct EchoRequestRef<'a> {
    #[serde(borrow)]
    payload: &'a [u8],
}

/// Typed echo (postcard-encoded [`EchoRequest`] / [`EchoResponse`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Echo;

impl<T: Transport> Service<T> for Echo {
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session<T>> {
        Box::new(EchoSession)
    }
}

struct EchoSession;

impl<T: Transport> Session<T> for EchoSession {
    fn on_message(&mut self, cx: &mut SessionCx<'_, T>, msg: Incoming) -> Result<(), SessionError> {
        // A response has the same fields as its request, so its encoding is the request's
        // bytes: check that they decode (borrowing, no copy), then send them back as
        // they are. This service is the load of the framework's benchmarks, and an
        // allocation and a copy per message show there; so does a clock read, taken
        // only when the server keeps metrics (`rdmactor::metrics::set_timing`), and then
        // for a sample of the requests.
        let start = rdmactor::metrics::sample_timing().then(std::time::Instant::now);
        let req: EchoRequestRef<'_> = postcard::from_bytes(&msg.data)
            .map_err(|e| SessionError::new(format!("malformed echo request: {e}")))?;
        let _ = req.payload;
        let tag = msg.tag;
        let sent = cx.send(tag, msg.data);
        if let Some(start) = start {
            rdmactor::metrics::echo_handled(start);
        }
        sent
    }
}

/// Raw echo for plain verbs clients: each SEND (with its immediate, if any) goes back
/// unchanged.
#[derive(Debug, Clone, Copy)]
pub struct RawEcho {
    /// Largest message accepted (each receive buffer's size).
    pub max_message: u32,
}

impl Default for RawEcho {
    fn default() -> Self {
        RawEcho { max_message: 4096 }
    }
}

impl<T: Transport> Service<T> for RawEcho {
    fn framing(&self) -> Framing {
        Framing::Raw {
            recv_size: self.max_message,
        }
    }

    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session<T>> {
        Box::new(RawEchoSession)
    }
}

struct RawEchoSession;

impl<T: Transport> Session<T> for RawEchoSession {
    fn on_message(&mut self, cx: &mut SessionCx<'_, T>, msg: Incoming) -> Result<(), SessionError> {
        cx.send_raw(&msg.data, msg.imm)
    }
}

/// `discard`: one-way messages (tag 0) are counted and dropped; a request (any other
/// tag) is answered with the count so far, postcard-encoded as a `u64`. Messages on a
/// connection arrive in order, so that answer doubles as a barrier: every message sent
/// before the request has been received. The load for one-way message-rate runs (what
/// `ib_send_bw` measures), with credits as the only back-pressure.
#[derive(Debug, Clone, Copy, Default)]
pub struct Discard;

impl<T: Transport> Service<T> for Discard {
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session<T>> {
        Box::new(DiscardSession { received: 0 })
    }
}

struct DiscardSession {
    received: u64,
}

impl<T: Transport> Session<T> for DiscardSession {
    fn on_message(&mut self, cx: &mut SessionCx<'_, T>, msg: Incoming) -> Result<(), SessionError> {
        if msg.tag == 0 {
            self.received += 1;
            return Ok(());
        }
        let count =
            postcard::to_allocvec(&self.received).map_err(|e| SessionError::new(e.to_string()))?;
        cx.reply(&msg, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The echo session sends a request's bytes back as the response: that is only
    /// right while the two types encode alike.
    #[test]
    fn a_response_encodes_as_its_request() {
        for len in [0usize, 1, 64, 127, 128, 70_000] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let req = postcard::to_allocvec(&EchoRequest {
                payload: payload.clone(),
            })
            .unwrap();
            let resp = postcard::to_allocvec(&EchoResponse {
                payload: payload.clone(),
            })
            .unwrap();
            assert_eq!(req, resp, "{len} bytes");
            let back: EchoRequestRef<'_> = postcard::from_bytes(&req).unwrap();
            assert_eq!(back.payload, &payload[..]);
        }
    }

    /// `payload` goes through serde as bytes (one length, one copy) instead of a
    /// sequence of `u8`s; postcard encodes both alike, so peers built before the change
    /// still understand it.
    #[test]
    fn bytes_encode_as_the_sequence_they_replaced() {
        #[derive(Serialize)]
        struct AsSequence {
            payload: Vec<u8>,
        }
        let payload: Vec<u8> = (0..300u32).map(|i| (i * 13) as u8).collect();
        let old = postcard::to_allocvec(&AsSequence {
            payload: payload.clone(),
        })
        .unwrap();
        let new = postcard::to_allocvec(&EchoRequest {
            payload: payload.clone(),
        })
        .unwrap();
        assert_eq!(old, new);
        let back: EchoResponse = postcard::from_bytes(&old).unwrap();
        assert_eq!(back.payload, payload);
    }

    #[test]
    fn malformed_requests_do_not_decode() {
        // A length prefix promising more bytes than follow.
        assert!(postcard::from_bytes::<EchoRequestRef<'_>>(&[10, 1, 2]).is_err());
    }
}
