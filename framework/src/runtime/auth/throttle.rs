//! What failed authentications cost: a token bucket of failures per peer address,
//! checked at CONNECT_REQUEST (an address out of tokens is rejected before any QP is
//! made, and no other address waits for it), and a log that says each reason at most
//! once per second, counting the rest. No I/O and no clock: the caller passes `now`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Failures an address may have before it is throttled.
pub const FAILURE_BURST: f64 = 10.0;
/// Failures per second an address earns back.
pub const FAILURE_REFILL_PER_SEC: f64 = 1.0;
/// Addresses tracked before full buckets are forgotten (a bucket that refilled is the
/// same as none), so that a spray of addresses cannot grow the map without bound.
const PRUNE_ABOVE: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn refilled(self, now: Instant) -> f64 {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * FAILURE_REFILL_PER_SEC;
        (self.tokens + earned).min(FAILURE_BURST)
    }
}

/// The failure buckets of every address that failed lately.
#[derive(Debug, Default)]
pub struct FailureBuckets(HashMap<IpAddr, Bucket>);

impl FailureBuckets {
    /// Whether `ip` may try to authenticate now (it has a failure to spend).
    pub fn allows(&self, ip: IpAddr, now: Instant) -> bool {
        self.0.get(&ip).is_none_or(|b| b.refilled(now) >= 1.0)
    }

    /// `ip` failed to authenticate: one token spent.
    pub fn charge(&mut self, ip: IpAddr, now: Instant) {
        if self.0.len() >= PRUNE_ABOVE && !self.0.contains_key(&ip) {
            self.0.retain(|_, b| b.refilled(now) < FAILURE_BURST);
        }
        let b = self.0.entry(ip).or_insert(Bucket {
            tokens: FAILURE_BURST,
            at: now,
        });
        b.tokens = (b.refilled(now) - 1.0).max(0.0);
        b.at = now;
    }
}

/// Says each reason at most once per `every`, with how many were not said since.
#[derive(Debug, Default)]
pub struct RateLimitedLog {
    last: HashMap<&'static str, (Instant, u64)>,
}

impl RateLimitedLog {
    /// One more of `reason` at `now`: `Some(n)` when it should be logged now, `n` the
    /// occurrences held back since the last line; `None` to hold this one back.
    pub fn note(&mut self, reason: &'static str, now: Instant, every: Duration) -> Option<u64> {
        match self.last.get_mut(reason) {
            Some((at, held)) if now.saturating_duration_since(*at) < every => {
                *held += 1;
                None
            }
            Some((at, held)) => {
                let n = *held;
                *at = now;
                *held = 0;
                Some(n)
            }
            None => {
                self.last.insert(reason, (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_failures_then_one_per_second_and_other_addresses_unaffected() {
        let t0 = Instant::now();
        let (a, b): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        let mut buckets = FailureBuckets::default();
        for _ in 0..10 {
            assert!(buckets.allows(a, t0));
            buckets.charge(a, t0);
        }
        assert!(!buckets.allows(a, t0));
        assert!(buckets.allows(b, t0), "another address is not throttled");
        assert!(!buckets.allows(a, t0 + Duration::from_millis(900)));
        assert!(buckets.allows(a, t0 + Duration::from_secs(1)));
        buckets.charge(a, t0 + Duration::from_secs(1));
        assert!(!buckets.allows(a, t0 + Duration::from_secs(1)));
        assert!(buckets.allows(a, t0 + Duration::from_secs(60)));
    }

    #[test]
    fn the_log_says_a_reason_once_a_second() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut log = RateLimitedLog::default();
        assert_eq!(log.note("bad_proof", t0, s), Some(0));
        assert_eq!(log.note("bad_proof", t0, s), None);
        assert_eq!(log.note("unknown_identity", t0, s), Some(0));
        assert_eq!(
            log.note("bad_proof", t0 + Duration::from_millis(500), s),
            None
        );
        assert_eq!(log.note("bad_proof", t0 + s, s), Some(2));
    }
}
