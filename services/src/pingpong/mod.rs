//! Ping-pong: the client sends `Ping { seq }` with a payload, the server answers
//! `Pong { seq }` with the same payload. Sequence numbers must rise by one per ping; a
//! client that skips or repeats one is cut off with the reason (the lab exercise's
//! "detect lost or duplicated messages", done by the state machine below).
//!
//! [`stock`] serves rdma-core's unmodified `ibv_{rc,uc,ud,srq}_pingpong` clients on the
//! framework's out-of-band ports.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

pub mod stock;

pub use stock::{StockConfig, StockPingPongService};

use rdmactor::runtime::{Incoming, PeerInfo, Service, Session, SessionCx, SessionError};
use rdmactor::transport::Transport;
use serde::{Deserialize, Serialize};

/// A ping or a pong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PingPong {
    /// Client to server.
    Ping {
        /// 0, 1, 2, ...
        seq: u64,
        /// Echoed back.
        payload: Vec<u8>,
    },
    /// Server to client.
    Pong {
        /// The ping's sequence number.
        seq: u64,
        /// The ping's payload.
        payload: Vec<u8>,
    },
}

/// The sequence check, without I/O.
#[derive(Debug, Default, Clone)]
pub struct PingPongState {
    next: u64,
}

impl PingPongState {
    /// Checks a ping and returns the pong to send.
    pub fn handle_ping(&mut self, msg: PingPong) -> Result<PingPong, String> {
        match msg {
            PingPong::Ping { seq, payload } if seq == self.next => {
                // The client's count: after ping u64::MAX there is no next one.
                self.next = seq
                    .checked_add(1)
                    .ok_or_else(|| format!("ping {seq}: no sequence number after it"))?;
                Ok(PingPong::Pong { seq, payload })
            }
            PingPong::Ping { seq, .. } => {
                Err(format!("ping {seq} out of order, expected {}", self.next))
            }
            PingPong::Pong { .. } => Err("a client sent a pong".into()),
        }
    }

    /// Pings answered so far.
    pub fn count(&self) -> u64 {
        self.next
    }
}

/// The ping-pong service.
#[derive(Debug, Clone, Copy, Default)]
pub struct PingPongService;

impl<T: Transport> Service<T> for PingPongService {
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session<T>> {
        Box::new(PingPongSession::default())
    }
}

#[derive(Default)]
struct PingPongSession {
    state: PingPongState,
}

impl<T: Transport> Session<T> for PingPongSession {
    fn on_message(&mut self, cx: &mut SessionCx<'_, T>, msg: Incoming) -> Result<(), SessionError> {
        let ping: PingPong = postcard::from_bytes(&msg.data)
            .map_err(|e| SessionError::new(format!("malformed ping: {e}")))?;
        let pong = self.state.handle_ping(ping).map_err(SessionError::new)?;
        let bytes = postcard::to_allocvec(&pong).map_err(|e| SessionError::new(e.to_string()))?;
        cx.reply(&msg, bytes)
    }
}

// The tests' own numbers, not a peer's.
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn pings_in_order_get_pongs() {
        let mut s = PingPongState::default();
        for seq in 0..5 {
            let pong = s
                .handle_ping(PingPong::Ping {
                    seq,
                    payload: vec![seq as u8],
                })
                .unwrap();
            assert_eq!(
                pong,
                PingPong::Pong {
                    seq,
                    payload: vec![seq as u8]
                }
            );
        }
        assert_eq!(s.count(), 5);
    }

    #[test]
    fn skipped_or_repeated_pings_are_refused() {
        let mut s = PingPongState::default();
        s.handle_ping(PingPong::Ping {
            seq: 0,
            payload: vec![],
        })
        .unwrap();
        assert!(s
            .handle_ping(PingPong::Ping {
                seq: 0,
                payload: vec![]
            })
            .is_err());
        assert!(s
            .handle_ping(PingPong::Ping {
                seq: 2,
                payload: vec![]
            })
            .is_err());
        assert!(s
            .handle_ping(PingPong::Pong {
                seq: 1,
                payload: vec![]
            })
            .is_err());
    }

    #[test]
    fn the_last_sequence_number_is_refused_not_wrapped() {
        let mut s = PingPongState { next: u64::MAX };
        assert!(s
            .handle_ping(PingPong::Ping {
                seq: u64::MAX,
                payload: vec![]
            })
            .is_err());
        assert_eq!(s.next, u64::MAX);
    }
}
