//! What failed authentications cost: a token bucket per peer address, and a log that
//! says each reason at most once per second, counting the rest. No I/O and no clock: the
//! caller passes `now`.
//!
//! An attempt takes its token when it is accepted, at CONNECT_REQUEST, and holds it
//! while its proof is awaited; a good proof gives it back, a failure (or a timeout, or a
//! connection that closes before proving) keeps it spent. An address with no token left
//! is rejected at CONNECT_REQUEST, before any QP is made, and no other address waits for
//! it. Taking the token up front is what holds an address to its bucket however many
//! attempts it has in flight: were it spent only once a proof failed, every attempt
//! accepted before the first failure came back would pass.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Unproven attempts an address may make at once (in flight, or failed lately) before it
/// is throttled: the size of its bucket. As many as the connections one address may hold
/// by default (`DEFAULT_MAX_CONNECTIONS_PER_PEER`), because a token is held from the
/// connect until the proof is checked: a client that opens up to 64 connections at once,
/// every one with a good key, is not throttled, and a guesser gets 64 checks (a few
/// milliseconds of CPU) and then one a second. Like OpenSSH's `MaxStartups`, this bounds
/// the attempts still proving, not the connections: an authenticated client may hold
/// more (its identity's cap counts them), but more than 64 connects in flight at once
/// from one address are refused `Throttled` until proofs come back (200 at once with
/// good keys: about two in three refused, bench/notes/2026-11-28-auth.md).
pub const FAILURE_BURST: f64 = 64.0;
/// Tokens per second an address earns back: once its burst is spent, the most attempts
/// per second that reach a proof check, however many it has in flight.
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

/// The buckets of every address that spent tokens lately (a full bucket is forgotten).
#[derive(Debug, Default)]
pub struct FailureBuckets(HashMap<IpAddr, Bucket>);

impl FailureBuckets {
    /// Whether `ip` may start an attempt now (it has a token to take).
    pub fn allows(&self, ip: IpAddr, now: Instant) -> bool {
        self.0.get(&ip).is_none_or(|b| b.refilled(now) >= 1.0)
    }

    /// `ip` starts an attempt: one token taken, held until its proof is checked.
    /// False, and nothing taken, when it has none (see [`allows`](Self::allows)).
    pub fn take(&mut self, ip: IpAddr, now: Instant) -> bool {
        if !self.allows(ip, now) {
            return false;
        }
        if self.0.len() >= PRUNE_ABOVE && !self.0.contains_key(&ip) {
            self.0.retain(|_, b| b.refilled(now) < FAILURE_BURST);
        }
        let b = self.0.entry(ip).or_insert(Bucket {
            tokens: FAILURE_BURST,
            at: now,
        });
        b.tokens = (b.refilled(now) - 1.0).max(0.0);
        b.at = now;
        true
    }

    /// An attempt of `ip` proved a key: the token it took is given back (a full bucket
    /// is forgotten, as one never taken from).
    pub fn give_back(&mut self, ip: IpAddr, now: Instant) {
        let Some(b) = self.0.get_mut(&ip) else {
            return;
        };
        b.tokens = (b.refilled(now) + 1.0).min(FAILURE_BURST);
        b.at = now;
        if b.tokens >= FAILURE_BURST {
            self.0.remove(&ip);
        }
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
        for _ in 0..FAILURE_BURST as usize {
            assert!(buckets.take(a, t0));
        }
        assert!(!buckets.allows(a, t0));
        assert!(!buckets.take(a, t0), "nothing left to take");
        assert!(buckets.allows(b, t0), "another address is not throttled");
        assert!(!buckets.allows(a, t0 + Duration::from_millis(900)));
        assert!(buckets.take(a, t0 + Duration::from_secs(1)));
        assert!(!buckets.allows(a, t0 + Duration::from_secs(1)));
        assert!(buckets.allows(a, t0 + Duration::from_secs(60)));
    }

    /// The bug this shape fixes: with `K` attempts in flight, a token checked at connect
    /// but spent only when the proof failed let every attempt accepted before the first
    /// failure through (about `K` proof checks a second instead of 1). Taken at connect,
    /// the address gets its burst, then one a second, whatever `K` is.
    #[test]
    fn parallel_attempts_are_held_to_the_bucket() {
        const K: usize = 16;
        let t0 = Instant::now();
        let ip: IpAddr = [10, 0, 0, 3].into();
        let mut buckets = FailureBuckets::default();
        // Each attempt takes 50 ms to fail; K are kept in flight, retried as they end.
        let step = Duration::from_millis(50);
        let mut in_flight: Vec<Instant> = Vec::new();
        let mut checked = 0;
        let mut now = t0;
        while now < t0 + Duration::from_secs(20) {
            in_flight.retain(|until| *until > now);
            while in_flight.len() < K && buckets.take(ip, now) {
                in_flight.push(now + step);
                checked += 1;
            }
            now += Duration::from_millis(10);
        }
        let allowed = FAILURE_BURST + 20.0 * FAILURE_REFILL_PER_SEC;
        assert!(
            checked as f64 <= allowed,
            "{checked} checks, at most {allowed}"
        );
        assert!(checked as f64 >= allowed - 1.0, "{checked} checks");
    }

    #[test]
    fn a_good_proof_gives_its_token_back() {
        let t0 = Instant::now();
        let ip: IpAddr = [10, 0, 0, 4].into();
        let mut buckets = FailureBuckets::default();
        // 100 good connections, 4 at a time: none throttled, the bucket full after.
        for round in 0..100 / 4 {
            for _ in 0..4 {
                assert!(buckets.take(ip, t0), "round {round}");
            }
            for _ in 0..4 {
                buckets.give_back(ip, t0);
            }
        }
        assert!(buckets.0.is_empty(), "a full bucket is forgotten");
        // Ten attempts in flight spend the bucket; the one that proves gives its token
        // back, for one attempt more.
        for _ in 0..FAILURE_BURST as usize {
            assert!(buckets.take(ip, t0));
        }
        buckets.give_back(ip, t0);
        assert!(buckets.take(ip, t0));
        assert!(!buckets.take(ip, t0));
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
