//! Passive connections accepted but not yet ESTABLISHED, and which of them have waited
//! past `ConnectionConfig::handshake_timeout`: the CM actor closes those, since their peer
//! never finished the rdma_cm handshake.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::Message;

use crate::verbs::CmIdKey;

/// How often the event thread checks for handshakes that did not finish.
pub(crate) const HANDSHAKE_TICK: Duration = Duration::from_secs(1);

/// Sent by the event thread once per [`HANDSHAKE_TICK`], stamped when sent. It queues
/// behind every event the thread read before it, so when the CM actor handles it, every
/// ESTABLISHED that had arrived by then has been handled: a connection still
/// handshaking whose accept is `handshake_timeout` older than the stamp has really not
/// heard from its peer. (A timer per connection fired under connect storms while the
/// ESTABLISHED events were merely waiting in this actor's mailbox.)
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct HandshakeTick(pub Instant);

/// The accepted connections still handshaking, with when each was accepted.
#[derive(Debug)]
pub(crate) struct Handshakes<K = CmIdKey>(HashMap<K, Instant>);

impl<K> Default for Handshakes<K> {
    fn default() -> Self {
        Handshakes(HashMap::new())
    }
}

impl<K: Copy + Eq + std::hash::Hash> Handshakes<K> {
    /// Connection `key` was accepted `at`.
    pub fn begin(&mut self, key: K, at: Instant) {
        self.0.insert(key, at);
    }

    /// Connection `key` is established, or gone.
    pub fn done(&mut self, key: K) {
        self.0.remove(&key);
    }

    /// The connections accepted `limit` or longer before `tick`, forgotten here: the
    /// caller closes them.
    pub fn expired(&mut self, tick: Instant, limit: Duration) -> Vec<K> {
        let expired: Vec<K> = self
            .0
            .iter()
            .filter(|(_, &at)| tick.saturating_duration_since(at) >= limit)
            .map(|(&k, _)| k)
            .collect();
        for key in &expired {
            self.0.remove(key);
        }
        expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handshake_expires_once_at_its_limit_and_not_when_done() {
        let t0 = Instant::now();
        let limit = Duration::from_secs(5);
        let (a, b, c) = (
            CmIdKey::out_of_band(1),
            CmIdKey::out_of_band(2),
            CmIdKey::out_of_band(3),
        );
        let mut h = Handshakes::default();
        h.begin(a, t0);
        h.begin(b, t0 + Duration::from_secs(2));
        h.begin(c, t0);
        h.done(c);
        assert!(h.expired(t0 + Duration::from_secs(4), limit).is_empty());
        assert_eq!(h.expired(t0 + limit, limit), vec![a], "at the limit");
        assert!(
            h.expired(t0 + limit, limit).is_empty(),
            "closed once, not on every tick"
        );
        // A tick stamped before the accept (it waited in the mailbox) expires nothing.
        h.begin(a, t0 + Duration::from_secs(10));
        assert_eq!(h.expired(t0 + Duration::from_secs(7), limit), vec![b]);
        assert!(h.expired(t0 + Duration::from_secs(9), limit).is_empty());
    }
}
