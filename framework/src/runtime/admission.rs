//! Whether a connect request is admitted: a decision on facts the CM actor gathers (is
//! the server shutting down, does the device serve, what the private data says, which
//! services exist, how many connections the peer holds), made here without I/O so that
//! every reason to refuse is tested natively. The CM actor applies the outcome: it
//! builds the connection, or rejects with the [`Reject`] returned, whose codes and texts
//! clients and tests match on.
//!
//! The checks run in a fixed order, and the first that fails names the reason:
//!
//! 1. shutting down (`ShuttingDown`);
//! 2. the device gone (`Internal`);
//! 3. the private data: a malformed hello (`BadHello`), none and no default service on
//!    the port (`UnknownService`), another protocol version (`VersionMismatch`), a
//!    receive depth that cannot carry a credit window (`BadHello`);
//! 4. the service unknown (`UnknownService`);
//! 5. the server's QP budget spent (`ServerFull`);
//! 6. the peer address at its own limit (`ServerFull`);
//! 7. a framed service asked for without a hello, by a plain client (`BadHello`).
//!
//! The CM actor then makes one more check, on state of its own (`auth/door.rs`): an
//! authenticated-only service asked for from an address out of authentication tokens
//! (too many attempts failed lately or in flight) is rejected (`Throttled`), still before
//! any QP is made.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use super::budget::BudgetFull;
use super::service::{Framing, Service};
use crate::proto::credits::{Advert, MIN_DEPTH};
use crate::proto::hello::{Hello, Reject, RejectCode, PROTOCOL_VERSION};
use crate::transport::{Transport, Verbs};

/// The facts about one connect request, gathered by the CM actor.
pub(crate) struct Request<'a, N, T: Transport = Verbs> {
    /// Whether the server is shutting down.
    pub shutting_down: bool,
    /// The node, while the device serves.
    pub node: Option<N>,
    /// The request's private data: an rdmactor hello, or whatever a plain client sent.
    pub private_data: &'a [u8],
    /// The default service of the listener the request came in on.
    pub default_service: Option<&'a str>,
    /// The registered services, by name.
    pub services: &'a HashMap<String, Arc<dyn Service<T>>>,
    /// The peer's address, when the CM knows it.
    pub peer: Option<IpAddr>,
    /// Most connections one peer address may hold (0: no limit).
    pub max_per_peer: usize,
    /// Connections open per peer address now.
    pub per_peer: &'a PeerCounts,
}

/// An admitted request: what the CM actor builds the connection from.
pub(crate) struct Admitted<N, S, T: Transport = Verbs> {
    pub node: N,
    pub service_name: String,
    pub service: Arc<dyn Service<T>>,
    pub framing: Framing,
    /// The client's credits and receive buffer size, from its hello (`None`: a plain
    /// client, which sent none).
    pub peer_depth: Option<(Advert, u32)>,
    /// The connection's slot under the server's QP budget.
    pub slot: S,
}

/// Decides on `req`. `take_slot` takes the connection's slot from the server's QP
/// budget (shared with the out-of-band ports, so it is taken, not read): called once,
/// and only when the checks before it passed; a later refusal gives the slot back as it
/// drops.
pub(crate) fn decide<N, S, T: Transport>(
    req: Request<'_, N, T>,
    take_slot: impl FnOnce() -> Result<S, BudgetFull>,
) -> Result<Admitted<N, S, T>, Reject> {
    if req.shutting_down {
        return Err(Reject::new(
            RejectCode::ShuttingDown,
            "server is shutting down",
        ));
    }
    let Some(node) = req.node else {
        return Err(Reject::new(
            RejectCode::Internal,
            "the server's RDMA device is gone",
        ));
    };
    let (service_name, peer_depth) = match Hello::decode(req.private_data) {
        Err(e) => return Err(Reject::new(RejectCode::BadHello, e.to_string())),
        Ok(None) => match req.default_service {
            Some(name) => (name.to_owned(), None),
            None => {
                return Err(Reject::new(
                    RejectCode::UnknownService,
                    "no default service on this port",
                ))
            }
        },
        Ok(Some(hello)) => {
            if hello.version != PROTOCOL_VERSION {
                return Err(Reject::new(
                    RejectCode::VersionMismatch,
                    format!(
                        "client speaks version {}, server {PROTOCOL_VERSION}",
                        hello.version
                    ),
                ));
            }
            let advert = hello.advert();
            if !advert.is_valid() {
                return Err(Reject::new(
                    RejectCode::BadHello,
                    format!(
                        "receive depth {} (at most {}) is below {MIN_DEPTH} or above its maximum",
                        advert.initial, advert.max
                    ),
                ));
            }
            (hello.service, Some((advert, hello.recv_size)))
        }
    };
    let Some(service) = req.services.get(&service_name).cloned() else {
        return Err(Reject::new(
            RejectCode::UnknownService,
            format!("unknown service {service_name:?}"),
        ));
    };
    let slot = take_slot().map_err(|full| Reject::new(RejectCode::ServerFull, full.to_string()))?;
    if let Some(ip) = req.peer.filter(|_| req.max_per_peer > 0) {
        let open = req.per_peer.open(ip);
        if open >= req.max_per_peer {
            return Err(Reject::new(
                RejectCode::ServerFull,
                format!(
                    "per-peer connection limit of {} reached ({ip} has {open} open)",
                    req.max_per_peer
                ),
            ));
        }
    }
    let framing = service.framing();
    if framing == Framing::Framed && peer_depth.is_none() {
        return Err(Reject::new(
            RejectCode::BadHello,
            format!("service {service_name:?} needs an rdmactor client"),
        ));
    }
    Ok(Admitted {
        node,
        service_name,
        service,
        framing,
        peer_depth,
        slot,
    })
}

/// Accepted connections open per peer address, so that one host cannot take every slot
/// under `max_connections`.
#[derive(Debug, Default)]
pub(crate) struct PeerCounts(HashMap<IpAddr, usize>);

impl PeerCounts {
    /// Connections `ip` holds now.
    pub fn open(&self, ip: IpAddr) -> usize {
        self.0.get(&ip).copied().unwrap_or(0)
    }

    /// `ip` holds one more.
    pub fn add(&mut self, ip: IpAddr) {
        *self.0.entry(ip).or_default() += 1;
    }

    /// One of `ip`'s connections was released.
    pub fn remove(&mut self, ip: IpAddr) {
        if let Some(open) = self.0.get_mut(&ip) {
            *open -= 1;
            if *open == 0 {
                self.0.remove(&ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::runtime::budget::QpBudget;
    use crate::runtime::service::{PeerInfo, Session};

    struct Svc(Framing);

    impl Service for Svc {
        fn framing(&self) -> Framing {
            self.0
        }
        fn session(&self, _peer: &PeerInfo) -> Box<dyn Session> {
            unreachable!("admission makes no session")
        }
    }

    const RAW: Framing = Framing::Raw { recv_size: 64 };

    fn services() -> HashMap<String, Arc<dyn Service>> {
        let mut s: HashMap<String, Arc<dyn Service>> = HashMap::new();
        s.insert("echo".into(), Arc::new(Svc(Framing::Framed)));
        s.insert("rping".into(), Arc::new(Svc(RAW)));
        s
    }

    fn hello(service: &str) -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            service: service.into(),
            recv_depth: 16,
            recv_size: 4096,
            max_credits: 32,
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    /// A request that is admitted to "echo" unless a test changes a fact.
    struct Facts {
        shutting_down: bool,
        node: Option<()>,
        private_data: Vec<u8>,
        default_service: Option<&'static str>,
        services: HashMap<String, Arc<dyn Service>>,
        peer: Option<IpAddr>,
        max_per_peer: usize,
        per_peer: PeerCounts,
    }

    impl Facts {
        fn new() -> Facts {
            Facts {
                shutting_down: false,
                node: Some(()),
                private_data: hello("echo").encode().unwrap(),
                default_service: None,
                services: services(),
                peer: Some(ip(1)),
                max_per_peer: 2,
                per_peer: PeerCounts::default(),
            }
        }

        fn request(&self) -> Request<'_, ()> {
            Request {
                shutting_down: self.shutting_down,
                node: self.node,
                private_data: &self.private_data,
                default_service: self.default_service,
                services: &self.services,
                peer: self.peer,
                max_per_peer: self.max_per_peer,
                per_peer: &self.per_peer,
            }
        }

        /// The decision with a budget that always has room.
        fn decide(&self) -> Result<Admitted<(), ()>, Reject> {
            decide(self.request(), || Ok(()))
        }

        /// The reason it is refused, and whether a slot was asked for.
        fn refused(&self) -> (RejectCode, String, bool) {
            let asked = Cell::new(false);
            let outcome = decide(self.request(), || {
                asked.set(true);
                Ok(())
            });
            match outcome {
                Err(r) => (r.code, r.message, asked.get()),
                Ok(a) => panic!("admitted to {}", a.service_name),
            }
        }
    }

    #[test]
    fn an_rdmactor_client_is_admitted_with_its_credits() {
        let admitted = Facts::new().decide().unwrap();
        assert_eq!(admitted.service_name, "echo");
        assert_eq!(admitted.framing, Framing::Framed);
        let (advert, recv_size) = admitted.peer_depth.unwrap();
        assert_eq!((advert.initial, advert.max, recv_size), (16, 32, 4096));
    }

    #[test]
    fn a_plain_client_gets_the_ports_default_service() {
        let mut f = Facts::new();
        f.private_data = b"rping's own bytes".to_vec();
        f.default_service = Some("rping");
        let admitted = f.decide().unwrap();
        assert_eq!(admitted.service_name, "rping");
        assert_eq!(admitted.framing, RAW);
        assert!(admitted.peer_depth.is_none());
        f.private_data.clear();
        assert_eq!(f.decide().unwrap().service_name, "rping");
    }

    #[test]
    fn shutting_down_refuses_before_anything_else() {
        let mut f = Facts::new();
        f.shutting_down = true;
        f.node = None;
        f.private_data = b"rAcT".to_vec();
        let refused = f.refused();
        assert_eq!(
            refused,
            (
                RejectCode::ShuttingDown,
                "server is shutting down".into(),
                false
            )
        );
    }

    #[test]
    fn no_device_is_an_internal_refusal() {
        let mut f = Facts::new();
        f.node = None;
        let refused = f.refused();
        assert_eq!(
            refused,
            (
                RejectCode::Internal,
                "the server's RDMA device is gone".into(),
                false
            )
        );
    }

    #[test]
    fn a_malformed_hello_is_bad_hello() {
        let mut f = Facts::new();
        f.private_data.truncate(8);
        f.default_service = Some("rping");
        let refused = f.refused();
        assert_eq!(
            refused,
            (RejectCode::BadHello, "private data truncated".into(), false)
        );
    }

    #[test]
    fn a_plain_client_on_a_port_without_default_is_unknown_service() {
        let mut f = Facts::new();
        f.private_data = Vec::new();
        let refused = f.refused();
        assert_eq!(
            refused,
            (
                RejectCode::UnknownService,
                "no default service on this port".into(),
                false
            )
        );
    }

    #[test]
    fn another_protocol_version_is_refused_with_both_versions() {
        let mut f = Facts::new();
        let mut h = hello("echo");
        h.version = PROTOCOL_VERSION + 1;
        f.private_data = h.encode().unwrap();
        let refused = f.refused();
        let text = format!(
            "client speaks version {}, server {PROTOCOL_VERSION}",
            PROTOCOL_VERSION + 1
        );
        assert_eq!(refused, (RejectCode::VersionMismatch, text, false));
    }

    #[test]
    fn a_receive_depth_no_window_can_use_is_bad_hello() {
        let mut f = Facts::new();
        let mut h = hello("echo");
        h.recv_depth = (MIN_DEPTH - 1) as u16;
        f.private_data = h.encode().unwrap();
        let text = format!(
            "receive depth {} (at most 32) is below {MIN_DEPTH} or above its maximum",
            MIN_DEPTH - 1
        );
        assert_eq!(f.refused(), (RejectCode::BadHello, text, false));
        // More to start with than it may ever grant.
        let mut h = hello("echo");
        h.max_credits = 8;
        f.private_data = h.encode().unwrap();
        let text =
            format!("receive depth 16 (at most 8) is below {MIN_DEPTH} or above its maximum");
        assert_eq!(f.refused(), (RejectCode::BadHello, text, false));
    }

    #[test]
    fn an_unknown_service_is_named() {
        let mut f = Facts::new();
        f.private_data = hello("nope").encode().unwrap();
        let text = "unknown service \"nope\"".to_string();
        assert_eq!(f.refused(), (RejectCode::UnknownService, text, false));
        // A default service that is not registered (the builder refuses it; the
        // decision still holds).
        f.private_data = Vec::new();
        f.default_service = Some("gone");
        let text = "unknown service \"gone\"".to_string();
        assert_eq!(f.refused(), (RejectCode::UnknownService, text, false));
    }

    #[test]
    fn a_spent_budget_is_server_full_with_the_budgets_words() {
        let f = Facts::new();
        let budget = QpBudget::new(1);
        let _held = budget.take(1).unwrap();
        let refused = decide(f.request(), || budget.take(1)).err().unwrap();
        assert_eq!(refused.code, RejectCode::ServerFull);
        assert_eq!(
            refused.message,
            "connection limit of 1 reached (1 QPs open, rdma_cm and out-of-band together)"
        );
    }

    #[test]
    fn the_per_peer_limit_refuses_only_that_peer_and_gives_the_slot_back() {
        let mut f = Facts::new();
        f.per_peer.add(ip(1));
        f.per_peer.add(ip(1));
        let budget = QpBudget::new(10);
        let refused = decide(f.request(), || budget.take(1)).err().unwrap();
        assert_eq!(refused.code, RejectCode::ServerFull);
        assert_eq!(
            refused.message,
            "per-peer connection limit of 2 reached (10.0.0.1 has 2 open)"
        );
        assert_eq!(budget.used(), 0, "the slot taken went back");
        f.peer = Some(ip(2));
        assert!(f.decide().is_ok(), "another peer gets in");
        f.peer = None;
        assert!(f.decide().is_ok(), "an unknown address is not limited");
        f.peer = Some(ip(1));
        f.max_per_peer = 0;
        assert!(f.decide().is_ok(), "0 lifts the limit");
    }

    /// The default limit is a fixed 64 per address, not a share of `max_connections`:
    /// one address is refused at its 65th however large the budget, and two addresses
    /// together hold 128 of 1,024 slots, not all of them.
    #[test]
    fn by_default_one_address_holds_64_however_large_the_budget() {
        use crate::runtime::DEFAULT_MAX_CONNECTIONS_PER_PEER as DEFAULT;
        assert_eq!(DEFAULT, 64);
        let mut f = Facts::new();
        f.max_per_peer = DEFAULT;
        let budget = QpBudget::new(1024);
        let mut held = Vec::new();
        for last in [1, 2] {
            f.peer = Some(ip(last));
            for _ in 0..DEFAULT {
                let admitted = decide(f.request(), || budget.take(1)).expect("admitted");
                held.push(admitted.slot);
                f.per_peer.add(ip(last));
            }
            let refused = decide(f.request(), || budget.take(1)).err().unwrap();
            assert_eq!(refused.code, RejectCode::ServerFull);
            assert_eq!(
                refused.message,
                format!("per-peer connection limit of 64 reached (10.0.0.{last} has 64 open)")
            );
        }
        assert_eq!(budget.used(), 128, "two addresses hold 128 of 1,024");
        f.peer = Some(ip(3));
        assert!(
            decide(f.request(), || budget.take(1)).is_ok(),
            "a third host gets in"
        );
    }

    #[test]
    fn a_framed_service_needs_a_hello() {
        let mut f = Facts::new();
        f.private_data = Vec::new();
        f.default_service = Some("echo");
        let text = "service \"echo\" needs an rdmactor client".to_string();
        assert_eq!(f.refused(), (RejectCode::BadHello, text, true));
    }

    #[test]
    fn the_first_failing_check_names_the_reason() {
        // An unknown service and a spent budget: the service is named, no slot asked.
        let mut f = Facts::new();
        f.private_data = hello("nope").encode().unwrap();
        let refused = decide(f.request(), || -> Result<(), BudgetFull> {
            panic!("no slot for an unknown service")
        });
        assert_eq!(refused.err().unwrap().code, RejectCode::UnknownService);
        // A spent budget and a peer at its limit: the budget is named.
        f.private_data = hello("echo").encode().unwrap();
        f.max_per_peer = 1;
        f.per_peer.add(ip(1));
        let full = BudgetFull { limit: 4, used: 4 };
        let refused = decide(f.request(), || Err::<(), _>(full)).err().unwrap();
        assert_eq!(refused.message, full.to_string());
    }

    #[test]
    fn peer_counts_forget_a_peer_with_nothing_open() {
        let mut counts = PeerCounts::default();
        counts.add(ip(1));
        counts.add(ip(1));
        counts.add(ip(2));
        assert_eq!((counts.open(ip(1)), counts.open(ip(2))), (2, 1));
        counts.remove(ip(1));
        counts.remove(ip(2));
        counts.remove(ip(3));
        assert_eq!((counts.open(ip(1)), counts.open(ip(2))), (1, 0));
        counts.remove(ip(1));
        assert!(counts.0.is_empty());
    }
}
