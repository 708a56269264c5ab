//! The server side of rdma-core's `ibv_rc_pingpong`, `ibv_uc_pingpong`,
//! `ibv_ud_pingpong` and `ibv_srq_pingpong`, for the framework's out-of-band ports.
//!
//! The stock server receives into one buffer and sends that same buffer back, once per
//! message, `-n` times, then exits. Here each message is answered with its own bytes (so
//! the client's `-c` pattern comes back intact, whatever `-s` it chose up to the
//! port's receive size), and a connection closes after `iters` answers when the port is
//! configured with the client's `-n` (for an SRQ client, `-n` counts the messages of all
//! its QPs, as the tool does). The tools say nothing once the ping-pong starts, so a
//! client that vanishes is noticed by silence: a connection with no message for `idle`
//! closes, and so does a finished one at the next tick (after its last answer left).
//! On UD every message starts with the 40-byte GRH, which is checked and stripped.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdmactor::runtime::{Framing, Incoming, PeerInfo, Service, Session, SessionCx, SessionError};
use rdmactor::verbs::{Grh, GRH_LEN};

/// How the stock-tool ping-pong server behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StockConfig {
    /// Largest message accepted (the receive buffer; the tools' `-s`, default 4096).
    pub size: u32,
    /// Answers before the connection (the SRQ client's group) is done: the tools' `-n`.
    /// `None`: answer until the client goes quiet.
    pub iters: Option<u64>,
    /// A connection with no message for this long is closed (its client is gone).
    pub idle: Duration,
    /// How often idleness and completion are checked.
    pub tick: Duration,
}

impl Default for StockConfig {
    fn default() -> Self {
        StockConfig {
            size: 4096,
            iters: None,
            idle: Duration::from_secs(3),
            tick: Duration::from_millis(250),
        }
    }
}

/// Which tool's messages a session handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StockKind {
    /// RC, UC and SRQ: the message is the payload.
    Connected,
    /// UD: a 40-byte GRH, then the payload.
    Datagram,
}

/// Why a stock ping-pong connection ends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StockError {
    /// A UD message shorter than its GRH or with none recognisable.
    #[error("UD message of {0} bytes without a GRH")]
    NoGrh(usize),
}

/// One connection's ping-pong, without I/O or clock (the caller passes `now`).
#[derive(Debug)]
pub struct StockPingPong {
    kind: StockKind,
    config: StockConfig,
    /// Answers counted for this connection's client (shared by an SRQ client's QPs).
    answered: Arc<AtomicU64>,
    last: Instant,
}

impl StockPingPong {
    /// A fresh connection at `now`, counting into `answered`.
    pub fn new(
        kind: StockKind,
        config: StockConfig,
        answered: Arc<AtomicU64>,
        now: Instant,
    ) -> Self {
        StockPingPong {
            kind,
            config,
            answered,
            last: now,
        }
    }

    /// A message arrived: returns the bytes to send back.
    pub fn handle_message<'a>(
        &mut self,
        now: Instant,
        data: &'a [u8],
    ) -> Result<&'a [u8], StockError> {
        let payload = match self.kind {
            StockKind::Connected => data,
            StockKind::Datagram => {
                if Grh::parse(data).is_none() {
                    return Err(StockError::NoGrh(data.len()));
                }
                &data[GRH_LEN..]
            }
        };
        if let Some(iters) = self.config.iters {
            if self.answered.load(Ordering::Relaxed) >= iters {
                // An SRQ client may have a few more in flight when its -n is reached;
                // the tool ignores them, and so do we (no answer).
                self.last = now;
                return Ok(&[]);
            }
        }
        self.answered.fetch_add(1, Ordering::Relaxed);
        self.last = now;
        Ok(payload)
    }

    /// A tick at `now`: the reason to close, once finished or idle too long.
    pub fn poll_close(&self, now: Instant) -> Option<String> {
        if let Some(iters) = self.config.iters {
            let n = self.answered.load(Ordering::Relaxed);
            if n >= iters {
                return Some(format!("done: {n} of {iters} iterations answered"));
            }
        }
        let quiet = now.saturating_duration_since(self.last);
        (quiet >= self.config.idle).then(|| {
            format!(
                "no message for {:.1} s: the client is gone ({} answered)",
                quiet.as_secs_f64(),
                self.answered.load(Ordering::Relaxed)
            )
        })
    }
}

/// Answer counters of SRQ clients, by TCP address (unique while the client is served).
type Groups = Arc<Mutex<HashMap<SocketAddr, Arc<AtomicU64>>>>;

/// The service for one out-of-band port kind. Register it under a name and give that
/// name to an `OobPort` of the matching transport.
#[derive(Debug, Clone)]
pub struct StockPingPongService {
    kind: StockKind,
    config: StockConfig,
    /// Per SRQ client (by its TCP address): the answers of all its QPs.
    groups: Option<Groups>,
}

impl StockPingPongService {
    /// For `ibv_rc_pingpong` and `ibv_uc_pingpong` clients.
    pub fn connected(config: StockConfig) -> Self {
        StockPingPongService {
            kind: StockKind::Connected,
            config,
            groups: None,
        }
    }

    /// For `ibv_ud_pingpong` clients.
    pub fn datagram(config: StockConfig) -> Self {
        StockPingPongService {
            kind: StockKind::Datagram,
            config,
            groups: None,
        }
    }

    /// For `ibv_srq_pingpong` clients: `-n` counts over all QPs of a client.
    pub fn shared(config: StockConfig) -> Self {
        StockPingPongService {
            kind: StockKind::Connected,
            config,
            groups: Some(Arc::default()),
        }
    }
}

impl Service for StockPingPongService {
    fn framing(&self) -> Framing {
        Framing::Raw {
            recv_size: self.config.size,
        }
    }

    fn session(&self, peer: &PeerInfo) -> Box<dyn Session> {
        let answered = match (&self.groups, peer.addr) {
            (Some(groups), Some(addr)) => groups
                .lock()
                .expect("groups lock")
                .entry(addr)
                .or_default()
                .clone(),
            _ => Arc::default(),
        };
        Box::new(StockSession {
            machine: StockPingPong::new(self.kind, self.config, answered, Instant::now()),
            tick: self.config.tick,
            group: self.groups.clone().zip(peer.addr),
        })
    }
}

const TICK: u64 = 1;

struct StockSession {
    machine: StockPingPong,
    tick: Duration,
    group: Option<(Groups, SocketAddr)>,
}

impl Session for StockSession {
    fn on_established(&mut self, cx: &mut SessionCx<'_>) -> Result<(), SessionError> {
        let waker = cx.waker();
        let tick = self.tick;
        // The ticker ends by itself once the connection (its actor) is gone.
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                if !waker.wake(TICK) {
                    break;
                }
            }
        });
        Ok(())
    }

    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Incoming) -> Result<(), SessionError> {
        let reply = self
            .machine
            .handle_message(Instant::now(), &msg.data)
            .map_err(|e| SessionError::new(e.to_string()))?;
        if reply.is_empty() && !msg.data.is_empty() {
            return Ok(());
        }
        cx.send_raw(reply, None)
    }

    fn on_wake(&mut self, cx: &mut SessionCx<'_>, _token: u64) -> Result<(), SessionError> {
        if let Some(reason) = self.machine.poll_close(Instant::now()) {
            cx.close(reason);
        }
        Ok(())
    }

    fn on_close(&mut self, _reason: &rdmactor::runtime::CloseReason) {
        if let Some((groups, addr)) = &self.group {
            let mut g = groups.lock().expect("groups lock");
            // The last of the client's QPs to close forgets the group.
            if g.get(addr).is_some_and(|c| Arc::strong_count(c) <= 2) {
                g.remove(addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(kind: StockKind, iters: Option<u64>) -> (StockPingPong, Instant) {
        let now = Instant::now();
        let cfg = StockConfig {
            iters,
            idle: Duration::from_secs(2),
            ..StockConfig::default()
        };
        (StockPingPong::new(kind, cfg, Arc::default(), now), now)
    }

    #[test]
    fn connected_messages_come_back_whole() {
        let (mut m, now) = machine(StockKind::Connected, None);
        let data = vec![0x7b; 4096];
        assert_eq!(m.handle_message(now, &data).unwrap(), &data[..]);
        assert_eq!(m.poll_close(now + Duration::from_secs(1)), None);
    }

    #[test]
    fn ud_messages_lose_their_grh() {
        let (mut m, now) = machine(StockKind::Datagram, None);
        let mut data = vec![0u8; GRH_LEN + 3];
        data[20] = 0x45;
        data[GRH_LEN..].copy_from_slice(b"abc");
        assert_eq!(m.handle_message(now, &data).unwrap(), b"abc");
        assert_eq!(
            m.handle_message(now, &[0u8; 10]),
            Err(StockError::NoGrh(10))
        );
    }

    #[test]
    fn done_after_iters_and_quiet_clients_are_gone() {
        let (mut m, now) = machine(StockKind::Connected, Some(2));
        m.handle_message(now, b"a").unwrap();
        assert_eq!(m.poll_close(now), None);
        m.handle_message(now, b"b").unwrap();
        assert!(m.poll_close(now).unwrap().starts_with("done: 2 of 2"));
        // Late messages of a client's other QPs are not answered.
        assert_eq!(m.handle_message(now, b"c").unwrap(), b"");

        let (m, now) = machine(StockKind::Connected, None);
        let reason = m.poll_close(now + Duration::from_secs(3)).unwrap();
        assert!(reason.contains("client is gone"), "{reason}");
    }

    #[test]
    fn an_srq_client_counts_over_its_qps() {
        let now = Instant::now();
        let shared = Arc::new(AtomicU64::new(0));
        let cfg = StockConfig {
            iters: Some(3),
            ..StockConfig::default()
        };
        let mut a = StockPingPong::new(StockKind::Connected, cfg, shared.clone(), now);
        let mut b = StockPingPong::new(StockKind::Connected, cfg, shared, now);
        a.handle_message(now, b"1").unwrap();
        b.handle_message(now, b"2").unwrap();
        assert_eq!(a.poll_close(now), None);
        b.handle_message(now, b"3").unwrap();
        assert!(a.poll_close(now).is_some() && b.poll_close(now).is_some());
    }
}
