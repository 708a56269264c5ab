//! The CM actor's side of authentication: which services need a proof, which addresses
//! spent their tokens (`throttle.rs`) and may not try again yet, which gates are still
//! waiting for their proof (each holding its address's token; closed after the
//! timeout), and which key proved each open connection (so that a reload that removes a
//! key closes its connections). No I/O: the CM actor applies what this decides, and
//! passes the time in.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Recipient;

use super::credential::random32;
use super::gate::{AuthReport, Gate};
use super::identities::IdentityCounts;
use super::keys::{KeySet, Keys};
use super::proof::NONCE_LEN;
use super::proof::{AuthRefusal, Verified};
use super::throttle::{FailureBuckets, RateLimitedLog};
use crate::runtime::service::{PeerInfo, Service, Session};
use crate::transport::Transport;

/// Whether a service takes anonymous clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuthPolicy {
    /// Anyone who reaches the port (stock rdma-core tools, clients without a key).
    Anonymous,
    /// Only clients that prove an identity of the authorized keys.
    Authenticated,
}

/// Time a client has, from its accept, to prove its identity.
pub const DEFAULT_AUTH_TIMEOUT: Duration = Duration::from_secs(10);

/// A server's authentication settings.
#[derive(Debug, Clone)]
pub(crate) struct AuthSetup {
    pub keys: Arc<Keys>,
    /// Services that take anonymous clients although keys are configured.
    pub anonymous: HashSet<String>,
    pub timeout: Duration,
    /// Connections open per identity, against the per-peer cap.
    pub identities: Arc<IdentityCounts>,
}

/// A gate's makings: the nonce its accept carries, and the keys it checks against.
pub(crate) struct GateSeed {
    pub nonce: [u8; NONCE_LEN],
    keys: Arc<Keys>,
    identities: Arc<IdentityCounts>,
}

impl GateSeed {
    /// The gate session for connection `key` to `service` (see `gate.rs`).
    pub fn session<T: Transport, K: Copy + Send + Unpin + 'static>(
        &self,
        service: &Arc<dyn Service<T>>,
        peer: &PeerInfo,
        key: K,
        report: Recipient<AuthReport<K>>,
    ) -> Box<dyn Session<T>> {
        let gate = Gate::new(
            self.nonce,
            service.clone(),
            peer.clone(),
            self.keys.clone(),
            self.identities.clone(),
            key,
            report,
        );
        Box::new(gate)
    }
}

struct Waiting {
    since: Instant,
    ip: Option<IpAddr>,
    /// The address whose token this attempt took at connect: given back if its proof
    /// is good, spent otherwise (a failure, the timeout, or a close before any proof).
    token: Option<IpAddr>,
    service: String,
}

/// See the module's doc. `K` is the transport's connection key.
pub(crate) struct Door<K> {
    setup: Option<AuthSetup>,
    buckets: FailureBuckets,
    log: RateLimitedLog,
    waiting: HashMap<K, Waiting>,
    /// The open connections proved with a key: identity and key fingerprint.
    proved: HashMap<K, (String, [u8; 32])>,
}

impl<K: Copy + Eq + std::hash::Hash> Door<K> {
    /// A door with `setup` (`None`: every service anonymous, as without keys).
    pub fn new(setup: Option<AuthSetup>) -> Self {
        Door {
            setup,
            buckets: FailureBuckets::default(),
            log: RateLimitedLog::default(),
            waiting: HashMap::new(),
            proved: HashMap::new(),
        }
    }

    /// The keys, when configured.
    pub fn keys(&self) -> Option<&Arc<Keys>> {
        self.setup.as_ref().map(|s| &s.keys)
    }

    /// `service`'s policy.
    pub fn policy(&self, service: &str) -> AuthPolicy {
        match &self.setup {
            Some(s) if !s.anonymous.contains(service) => AuthPolicy::Authenticated,
            _ => AuthPolicy::Anonymous,
        }
    }

    /// What a connection to `service` starts with: a gate's fresh nonce and
    /// the keys, or `None` (no proof asked). Fails only when the OS has no random bytes.
    pub fn gate(&self, service: &str) -> Result<Option<GateSeed>, String> {
        match (self.policy(service), &self.setup) {
            (AuthPolicy::Authenticated, Some(setup)) => Ok(Some(GateSeed {
                nonce: random32().map_err(|e| e.to_string())?,
                keys: setup.keys.clone(),
                identities: setup.identities.clone(),
            })),
            _ => Ok(None),
        }
    }

    /// Whether `ip` may ask for `service` now: always for an anonymous service, else
    /// while it has a token left (else it is rejected at connect). The attempt takes
    /// the token in [`begin`](Self::begin), in the same CONNECT_REQUEST's handling, so
    /// no other attempt can pass on it meanwhile.
    pub fn allows(&self, service: &str, ip: Option<IpAddr>, now: Instant) -> bool {
        self.policy(service) == AuthPolicy::Anonymous
            || ip.is_none_or(|ip| self.buckets.allows(ip, now))
    }

    /// A gate started for connection `key` from `ip`: it takes one of the address's
    /// tokens, held until its proof is checked (see `throttle.rs`).
    pub fn begin(&mut self, key: K, ip: Option<IpAddr>, service: &str, now: Instant) {
        let token = ip.filter(|ip| self.buckets.take(*ip, now));
        let w = Waiting {
            since: now,
            ip,
            token,
            service: service.to_owned(),
        };
        self.waiting.insert(key, w);
    }

    /// A gate ended. A success is remembered with its key, and gives its address's
    /// token back; a failure keeps the token spent, and is logged (rate-limited) and
    /// counted. Returns a reason to close the connection when its key was removed while
    /// it was being checked.
    pub fn report(
        &mut self,
        key: K,
        service: &str,
        outcome: Result<Verified, AuthRefusal>,
        now: Instant,
    ) -> Option<String> {
        let waited = self.waiting.remove(&key);
        let ip = waited.as_ref().and_then(|w| w.ip);
        // A good key costs nothing, nor does a good proof over its identity's cap (no
        // guess at a key): the token back. Any other refusal keeps it spent.
        let good_key = matches!(outcome, Ok(_) | Err(AuthRefusal::TooManyConnections { .. }));
        if let Some(token) = waited.as_ref().and_then(|w| w.token).filter(|_| good_key) {
            self.buckets.give_back(token, now);
        }
        match outcome {
            Ok(v) => {
                tracing::info!(identity = %v.identity, service, peer = ?ip, "authenticated");
                let still = self
                    .keys()
                    .is_some_and(|k| k.current().holds(&v.identity, &v.fingerprint));
                // Released already (the report crossed its close): nothing to keep.
                waited.as_ref()?;
                if !still {
                    return Some("key removed".into());
                }
                self.proved.insert(key, (v.identity, v.fingerprint));
                None
            }
            Err(why) => {
                self.refused(ip, service, &why, now);
                None
            }
        }
    }

    /// Counts and logs a refusal (its token was settled by the caller).
    fn refused(&mut self, ip: Option<IpAddr>, service: &str, why: &AuthRefusal, now: Instant) {
        crate::metrics::auth_refused(service, why.label());
        if let Some(held_back) = self.log.note(why.label(), now, Duration::from_secs(1)) {
            tracing::warn!(service, peer = ?ip, reason = %why, held_back, "authentication refused");
        }
    }

    /// The gates that waited past the timeout, forgotten here (their tokens stay spent):
    /// the caller closes them with the returned reason.
    pub fn expired(&mut self, now: Instant) -> Vec<(K, String)> {
        let Some(limit) = self.setup.as_ref().map(|s| s.timeout) else {
            return Vec::new();
        };
        let late: Vec<K> = self
            .waiting
            .iter()
            .filter(|(_, w)| now.saturating_duration_since(w.since) >= limit)
            .map(|(k, _)| *k)
            .collect();
        let mut out = Vec::with_capacity(late.len());
        for key in late {
            let w = self.waiting.remove(&key).expect("listed");
            let why = AuthRefusal::TimedOut(limit);
            self.refused(w.ip, &w.service, &why, now);
            out.push((key, format!("{}{why}", super::gate::REFUSED_PREFIX)));
        }
        out
    }

    /// Connection `key` was released. One still waiting for its proof was an unproven
    /// attempt: its token stays spent.
    pub fn released(&mut self, key: K) {
        self.waiting.remove(&key);
        self.proved.remove(&key);
    }

    /// The keys are now `set`: the open connections whose key it no longer holds,
    /// forgotten here, for the caller to close ("key removed").
    pub fn swept(&mut self, set: &KeySet) -> Vec<K> {
        let gone: Vec<K> = self
            .proved
            .iter()
            .filter(|(_, (id, fp))| !set.holds(id, fp))
            .map(|(k, _)| *k)
            .collect();
        for k in &gone {
            self.proved.remove(k);
        }
        gone
    }

    /// Connections proved with a key, open now.
    pub fn proved(&self) -> usize {
        self.proved.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::auth::credential::Credential;
    use crate::runtime::auth::throttle::FAILURE_BURST;

    fn door(keys: &KeySet, timeout: Duration) -> Door<u32> {
        Door::new(Some(AuthSetup {
            keys: Arc::new(Keys::from_set(keys.clone())),
            anonymous: ["rping".to_owned()].into(),
            timeout,
            identities: Arc::new(IdentityCounts::new(0)),
        }))
    }

    fn verified(set: &KeySet, who: &str) -> Verified {
        Verified {
            identity: who.into(),
            fingerprint: set.get(who).unwrap()[0].fingerprint(),
        }
    }

    #[test]
    fn policy_follows_the_keys_and_the_anonymous_list() {
        assert_eq!(Door::<u32>::new(None).policy("kv"), AuthPolicy::Anonymous);
        let d = door(&KeySet::default(), DEFAULT_AUTH_TIMEOUT);
        assert_eq!(d.policy("kv"), AuthPolicy::Authenticated);
        assert_eq!(d.policy("rping"), AuthPolicy::Anonymous);
    }

    #[test]
    fn a_reload_sweeps_exactly_the_connections_of_removed_keys() {
        let (a, b) = (
            Credential::generate_ed25519("alice").unwrap(),
            Credential::generate_psk("jobs").unwrap(),
        );
        let both =
            KeySet::parse(&format!("{}\n{}", a.authorized_line(), b.authorized_line())).unwrap();
        let mut d = door(&both, DEFAULT_AUTH_TIMEOUT);
        let now = Instant::now();
        for (key, who) in [(1, "alice"), (2, "jobs"), (3, "alice")] {
            d.begin(key, None, "kv", now);
            assert_eq!(d.report(key, "kv", Ok(verified(&both, who)), now), None);
        }
        assert_eq!(d.proved(), 3);
        let jobs_only = KeySet::parse(&b.authorized_line()).unwrap();
        let mut gone = d.swept(&jobs_only);
        gone.sort();
        assert_eq!(gone, vec![1, 3]);
        assert_eq!(d.proved(), 1);
        d.released(2);
        assert_eq!(d.proved(), 0);
    }

    #[test]
    fn a_silent_gate_times_out_and_its_token_stays_spent() {
        let mut d = door(&KeySet::default(), Duration::from_secs(1));
        let ip: IpAddr = [10, 0, 0, 9].into();
        let t0 = Instant::now();
        for key in 0..FAILURE_BURST as u32 {
            assert!(d.allows("kv", Some(ip), t0));
            d.begin(key, Some(ip), "kv", t0);
        }
        assert!(
            !d.allows("kv", Some(ip), t0),
            "ten attempts waiting hold the address's ten tokens"
        );
        assert!(d.expired(t0 + Duration::from_millis(900)).is_empty());
        let t1 = t0 + Duration::from_secs(1);
        let late = d.expired(t1);
        assert_eq!(late.len(), FAILURE_BURST as usize);
        assert_eq!(late[0].1, "authentication refused: no proof within 1s");
        // Not given back: the second earned one token, and only one.
        assert!(d.allows("kv", Some(ip), t1));
        d.begin(10, Some(ip), "kv", t1);
        assert!(!d.allows("kv", Some(ip), t1));
        assert!(
            d.allows("rping", Some(ip), t0),
            "anonymous services are not throttled"
        );
        assert!(d.allows("kv", Some([10, 0, 0, 8].into()), t0));
    }

    /// `K` attempts from one address in flight at once, each failing 50 ms after its
    /// connect: the address gets its burst, then one proof check a second, not `K`.
    #[test]
    fn parallel_failures_are_held_to_the_bucket() {
        const K: usize = 16;
        let mut d = door(&KeySet::default(), DEFAULT_AUTH_TIMEOUT);
        let ip: IpAddr = [10, 0, 0, 10].into();
        let t0 = Instant::now();
        let mut in_flight: Vec<(u32, Instant)> = Vec::new();
        let (mut next_key, mut checked, mut throttled) = (0u32, 0, 0);
        let mut now = t0;
        while now < t0 + Duration::from_secs(10) {
            for (key, _) in in_flight.iter().filter(|(_, until)| *until <= now) {
                assert_eq!(d.report(*key, "kv", Err(AuthRefusal::BadProof), now), None);
                checked += 1;
            }
            in_flight.retain(|(_, until)| *until > now);
            while in_flight.len() < K {
                if !d.allows("kv", Some(ip), now) {
                    throttled += 1;
                    break;
                }
                d.begin(next_key, Some(ip), "kv", now);
                in_flight.push((next_key, now + Duration::from_millis(50)));
                next_key += 1;
            }
            now += Duration::from_millis(10);
        }
        let (began, burst) = (next_key as usize, FAILURE_BURST as usize);
        assert!(began <= burst + 10, "{began} attempts began in 10 s");
        assert!(checked >= burst + 9 - K, "{checked} checked");
        assert!(throttled > 900, "{throttled} throttled");
    }

    #[test]
    fn a_good_key_costs_nothing_and_a_close_before_proof_keeps_its_token() {
        let alice = Credential::generate_ed25519("alice").unwrap();
        let set = KeySet::parse(&alice.authorized_line()).unwrap();
        let mut d = door(&set, DEFAULT_AUTH_TIMEOUT);
        let ip: IpAddr = [10, 0, 0, 11].into();
        let now = Instant::now();
        // Sixteen good connections at once, twice over: the first ten take the
        // address's tokens, and each proof gives its token back for the next.
        let mut key = 0;
        for _ in 0..2 {
            let mut open = Vec::new();
            for _ in 0..16 {
                if !d.allows("kv", Some(ip), now) {
                    let first = open.remove(0);
                    assert_eq!(
                        d.report(first, "kv", Ok(verified(&set, "alice")), now),
                        None
                    );
                }
                d.begin(key, Some(ip), "kv", now);
                open.push(key);
                key += 1;
            }
            for k in open {
                assert_eq!(d.report(k, "kv", Ok(verified(&set, "alice")), now), None);
            }
        }
        // A good proof over its identity's cap gives its token back too.
        for _ in 0..FAILURE_BURST as usize {
            d.begin(key, Some(ip), "kv", now);
            let over = AuthRefusal::TooManyConnections { max: 1 };
            assert_eq!(d.report(key, "kv", Err(over), now), None);
            key += 1;
        }
        assert!(d.allows("kv", Some(ip), now));
        // Ten attempts that close before proving spend the ten tokens.
        for _ in 0..FAILURE_BURST as usize {
            assert!(d.allows("kv", Some(ip), now));
            d.begin(key, Some(ip), "kv", now);
            d.released(key);
            key += 1;
        }
        assert!(!d.allows("kv", Some(ip), now));
        // A proof whose connection was released first (its report crossed the close)
        // gives nothing back: the token was settled at the close.
        let later = now + Duration::from_secs(1);
        d.begin(key, Some(ip), "kv", later);
        d.released(key);
        assert_eq!(
            d.report(key, "kv", Ok(verified(&set, "alice")), later),
            None
        );
        assert!(!d.allows("kv", Some(ip), later));
    }
}
