//! The registry against a real etcd: registration, lease expiry, draining, withdrawal,
//! etcd restarting, a lost lease, and fencing of a duplicate node id.

mod util;

use std::net::SocketAddr;
use std::time::Duration;

use etcd_client::{EventType, GetOptions};
use rdmactor_cluster::{
    record, Load, Membership, Registrar, RegistrationConfig, RegistrationState,
};
use util::{eventually, Etcd, EtcdExt};

const TTL: Duration = Duration::from_secs(2);

fn config(node: &str, addr: &str, services: &[&str]) -> RegistrationConfig {
    let addr: SocketAddr = addr.parse().unwrap();
    let mut config = RegistrationConfig::new("test", node, addr, services.iter().copied());
    config.ttl = TTL;
    config.load_interval = Duration::from_millis(200);
    config.retry_min = Duration::from_millis(100);
    config.retry_max = Duration::from_millis(500);
    config
}

async fn registered(registrar: &Registrar) -> i64 {
    let mut states = registrar.states();
    let state = tokio::time::timeout(
        Duration::from_secs(10),
        states.wait_for(RegistrationState::is_registered),
    )
    .await
    .expect("registered within 10 s")
    .expect("registrar running")
    .clone();
    match state {
        RegistrationState::Registered { lease } => lease,
        other => unreachable!("{other:?}"),
    }
}

/// Node "a" registered for `echo` (its lease returned) and listed by a watcher of it.
async fn node_a_listed(etcd: &Etcd) -> (Registrar, i64, Membership) {
    let registrar =
        Registrar::start(etcd.config(), config("a", "192.0.2.1:7471", &["echo"])).unwrap();
    let lease = registered(&registrar).await;
    let echo = Membership::watch(etcd.config(), "test", "echo").unwrap();
    echo.wait_for(Duration::from_secs(5), |n| n.len() == 1)
        .await
        .unwrap();
    (registrar, lease, echo)
}

#[tokio::test]
async fn register_list_report_load_withdraw() {
    let Some(etcd) = Etcd::start() else { return };
    let registrar = Registrar::start(
        etcd.config(),
        config("a", "192.0.2.1:7471", &["echo", "files"]),
    )
    .unwrap();
    let lease = registered(&registrar).await;
    let echo = Membership::watch(etcd.config(), "test", "echo").unwrap();
    let files = Membership::watch(etcd.config(), "test", "files").unwrap();
    let other = Membership::watch(etcd.config(), "test", "read").unwrap();
    for m in [&echo, &files] {
        let nodes = m
            .wait_for(Duration::from_secs(5), |n| n.len() == 1)
            .await
            .expect("listed");
        let node = &nodes[0];
        assert_eq!(node.node, "a");
        assert_eq!(node.lease, lease);
        assert_eq!(node.record.addr, "192.0.2.1:7471".parse().unwrap());
        assert_eq!(node.record.service, m.service());
        assert_eq!(node.record.version, env!("CARGO_PKG_VERSION"));
        assert!(!node.record.draining);
    }
    eventually(
        "the other service's watch is synced",
        Duration::from_secs(5),
        || other.is_synced(),
    )
    .await;
    assert!(other.nodes().is_empty());

    // The layout, as etcdctl shows it: one JSON value per service, under the lease.
    let mut raw = etcd.client().await;
    let got = raw
        .get(
            record::cluster_prefix("test"),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let keys: Vec<&str> = got.kvs().iter().map(|kv| kv.key_str().unwrap()).collect();
    assert_eq!(
        keys,
        [
            "/rdmactor/test/services/echo/a",
            "/rdmactor/test/services/files/a"
        ]
    );
    assert!(got.kvs().iter().all(|kv| kv.lease() == lease));
    let json: serde_json::Value = serde_json::from_slice(got.kvs()[0].value()).unwrap();
    assert_eq!(json["addr"], "192.0.2.1:7471");

    // Load: reported at the next interval, seen by the watchers.
    let load = Load {
        connections: 42,
        pool_bytes: 1 << 20,
        pool_max_bytes: 1 << 30,
    };
    registrar.set_load(load);
    echo.wait_for(Duration::from_secs(5), |n| {
        n.first().is_some_and(|n| n.record.load == load)
    })
    .await
    .expect("the load report reaches the watcher");

    registrar.withdraw().await.unwrap();
    echo.wait_for(Duration::from_secs(5), <[_]>::is_empty)
        .await
        .expect("withdrawn: gone from the list");
    let got = raw
        .get(
            record::cluster_prefix("test"),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert!(got.kvs().is_empty(), "no key left after withdraw");
}

#[tokio::test]
async fn draining_is_visible_to_watchers_before_the_node_goes() {
    let Some(etcd) = Etcd::start() else { return };
    let (registrar, _, echo) = node_a_listed(&etcd).await;
    // etcd's own event stream, not the `Membership`: its change counter is a
    // `tokio::sync::watch`, which coalesces, so a watcher that samples it may see the
    // draining record and the delete as one change (CI once did). The events do not.
    let mut raw = etcd.client().await;
    let key = record::node_key("test", "echo", "a");
    let mut events = raw.watch(key.as_str(), None).await.unwrap();
    registrar.withdraw().await.unwrap();
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|e: &(EventType, bool)| e.0 == EventType::Delete)
    {
        let response = tokio::time::timeout(Duration::from_secs(5), events.message())
            .await
            .expect("the withdrawal reaches etcd's watchers within 5 s")
            .unwrap()
            .expect("watch stream open");
        for event in response.events() {
            let draining = event
                .kv()
                .filter(|kv| !kv.value().is_empty())
                .map(|kv| {
                    record::NodeRecord::from_json(&key, kv.value())
                        .unwrap()
                        .draining
                })
                .unwrap_or(false);
            seen.push((event.event_type(), draining));
        }
    }
    assert_eq!(
        seen,
        [(EventType::Put, true), (EventType::Delete, false)],
        "marked draining, then gone, and nothing between"
    );
    // The watcher ends with the node gone.
    echo.wait_for(Duration::from_secs(5), <[_]>::is_empty)
        .await
        .expect("gone from the list");
}

#[tokio::test]
async fn a_node_that_stops_without_withdrawing_expires_with_its_lease() {
    let Some(etcd) = Etcd::start() else { return };
    let (registrar, _, echo) = node_a_listed(&etcd).await;
    // What SIGKILL does to a server: its keepalive stops, nothing is withdrawn.
    drop(registrar);
    let start = std::time::Instant::now();
    echo.wait_for(TTL + Duration::from_secs(3), <[_]>::is_empty)
        .await
        .expect("gone within the TTL and 3 s of slack");
    eprintln!(
        "expired {:?} after the keepalive stopped (TTL {TTL:?})",
        start.elapsed()
    );
    assert!(
        start.elapsed() >= TTL / 2,
        "not before the lease could expire"
    );
}

#[tokio::test]
async fn etcd_down_at_start_then_up_registers_and_withdraw_never_hangs() {
    let Some(mut etcd) = Etcd::start() else {
        return;
    };
    etcd.kill();
    let registrar =
        Registrar::start(etcd.config(), config("a", "192.0.2.1:7471", &["echo"])).unwrap();
    let mut states = registrar.states();
    let retrying = tokio::time::timeout(
        Duration::from_secs(10),
        states.wait_for(|s| matches!(s, RegistrationState::Retrying { .. })),
    )
    .await
    .expect("retrying within 10 s")
    .unwrap()
    .clone();
    eprintln!("with etcd down: {retrying:?}");
    etcd.restart();
    registered(&registrar).await;
    etcd.kill();
    // Withdrawing with etcd gone: an error naming etcd, within the call timeouts.
    let start = std::time::Instant::now();
    let err = registrar.withdraw().await.unwrap_err();
    eprintln!("withdraw with etcd down: {err} after {:?}", start.elapsed());
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(err.to_string().contains("etcd"), "{err}");
}

/// The backoff counts failures in a row: once a session registered, the next failure
/// is retried after the shortest delay again, not after the longest delay a past
/// outage reached (which, past the TTL, made every later hiccup lapse the lease).
#[tokio::test]
async fn after_an_outage_the_next_failure_backs_off_from_the_start_again() {
    let Some(mut etcd) = Etcd::start() else {
        return;
    };
    etcd.kill();
    let mut config = config("a", "192.0.2.1:7471", &["echo"]);
    // Long enough that each state is seen by the test, however busy the machine.
    config.retry_min = Duration::from_millis(500);
    config.retry_max = Duration::from_secs(5);
    let registrar = Registrar::start(etcd.config(), config).unwrap();
    let mut states = registrar.states();
    tokio::time::timeout(
        Duration::from_secs(60),
        states.wait_for(
            |s| matches!(s, RegistrationState::Retrying { attempt, .. } if *attempt >= 3),
        ),
    )
    .await
    .expect("three failures in a row within 60 s")
    .unwrap();
    etcd.restart();
    let lease = registered(&registrar).await;
    // A lapse (as a partition past the TTL would cause): a failure after a success.
    etcd.client().await.lease_revoke(lease).await.unwrap();
    let retrying = tokio::time::timeout(
        Duration::from_secs(10),
        states.wait_for(|s| matches!(s, RegistrationState::Retrying { .. })),
    )
    .await
    .expect("the registrar notices the lapse within 10 s")
    .unwrap()
    .clone();
    assert!(
        matches!(retrying, RegistrationState::Retrying { attempt: 1, .. }),
        "the first failure after a registration: {retrying:?}"
    );
    registered(&registrar).await;
    registrar.withdraw().await.unwrap();
}

#[tokio::test]
async fn after_etcd_restarts_the_node_is_registered_and_watchers_see_it() {
    let Some(mut etcd) = Etcd::start() else {
        return;
    };
    let (registrar, before, echo) = node_a_listed(&etcd).await;

    etcd.kill();
    let mut states = registrar.states();
    tokio::time::timeout(
        Duration::from_secs(10),
        states.wait_for(|s| matches!(s, RegistrationState::Retrying { .. })),
    )
    .await
    .expect("the registrar notices within 10 s")
    .unwrap();
    eventually("the watcher notices", Duration::from_secs(10), || {
        !echo.is_synced()
    })
    .await;
    // The last list is kept while etcd is away.
    assert_eq!(echo.nodes().len(), 1);
    // Longer than the TTL: etcd renews leases when it elects a leader again.
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;

    etcd.restart();
    let after = registered(&registrar).await;
    let took = eventually("the watcher re-syncs", Duration::from_secs(15), || {
        echo.is_synced() && echo.nodes().first().is_some_and(|n| n.lease == after)
    })
    .await;
    eprintln!(
        "after the restart: lease {} ({}), watcher synced in {took:?}",
        after,
        if after == before { "resumed" } else { "fresh" }
    );
    assert!(!echo.nodes()[0].record.draining);
    registrar.withdraw().await.unwrap();
}

#[tokio::test]
async fn a_lost_lease_is_never_reused_the_node_registers_under_a_fresh_one() {
    let Some(etcd) = Etcd::start() else { return };
    let (registrar, old, echo) = node_a_listed(&etcd).await;
    // As if it expired during a partition: revoked behind the registrar's back.
    etcd.client().await.lease_revoke(old).await.unwrap();
    let nodes = echo
        .wait_for(Duration::from_secs(10), |n| {
            n.len() == 1 && n[0].lease != old
        })
        .await
        .expect("registered again under a new lease");
    assert_ne!(nodes[0].lease, old);
    // The registrar says so (its state may follow the watcher's event by a moment).
    let fresh = nodes[0].lease;
    let mut states = registrar.states();
    tokio::time::timeout(
        Duration::from_secs(5),
        states.wait_for(|s| *s == RegistrationState::Registered { lease: fresh }),
    )
    .await
    .expect("the registrar reports the fresh lease")
    .unwrap();
    // The old lease is dead: nothing can be put under it any more.
    let put = etcd
        .client()
        .await
        .put(
            "/rdmactor/test/services/echo/a",
            "stale",
            Some(etcd_client::PutOptions::new().with_lease(old)),
        )
        .await;
    assert!(put.is_err(), "etcd refuses a put under a revoked lease");
    registrar.withdraw().await.unwrap();
}

#[tokio::test]
async fn a_second_server_with_the_same_node_id_is_fenced_until_the_first_lease_expires() {
    let Some(etcd) = Etcd::start() else { return };
    let first = Registrar::start(etcd.config(), config("a", "192.0.2.1:7471", &["echo"])).unwrap();
    registered(&first).await;
    let second = Registrar::start(etcd.config(), config("a", "192.0.2.2:7471", &["echo"])).unwrap();
    let mut states = second.states();
    let state = tokio::time::timeout(
        Duration::from_secs(10),
        states.wait_for(|s| matches!(s, RegistrationState::Retrying { .. })),
    )
    .await
    .unwrap()
    .unwrap()
    .clone();
    let RegistrationState::Retrying { error, .. } = state else {
        unreachable!()
    };
    assert!(error.contains("node id \"a\" is taken"), "{error}");
    let echo = Membership::watch(etcd.config(), "test", "echo").unwrap();
    let nodes = echo
        .wait_for(Duration::from_secs(5), |n| n.len() == 1)
        .await
        .unwrap();
    assert_eq!(nodes[0].record.addr, "192.0.2.1:7471".parse().unwrap());
    // The first crashes: once its lease expires, the second takes the id over.
    drop(first);
    echo.wait_for(TTL + Duration::from_secs(5), |n| {
        n.len() == 1 && n[0].record.addr == "192.0.2.2:7471".parse().unwrap()
    })
    .await
    .expect("the second server takes over after the first lease expires");
    second.withdraw().await.unwrap();
}

/// The `members` service's view (`EtcdDirectory`): a server answers clients that
/// bootstrap from its address from this, least loaded first, draining nodes left out,
/// and only for the services it watches.
#[cfg(feature = "rdmactor")]
#[tokio::test]
async fn a_servers_directory_lists_live_nodes_least_loaded_first() {
    use rdmactor_cluster::EtcdDirectory;
    use rdmactor_services::members::{Directory, MembersError};

    let Some(etcd) = Etcd::start() else { return };
    let a = Registrar::start(etcd.config(), config("a", "192.0.2.1:7471", &["echo"])).unwrap();
    let b = Registrar::start(etcd.config(), config("b", "192.0.2.2:7471", &["echo"])).unwrap();
    registered(&a).await;
    registered(&b).await;
    let directory = EtcdDirectory::new(etcd.config(), "test", ["echo"]);
    let order = || -> Vec<(String, u64)> {
        directory
            .members("echo")
            .map(|list| list.into_iter().map(|m| (m.node, m.connections)).collect())
            .unwrap_or_default()
    };
    a.set_load(Load {
        connections: 7,
        ..Load::default()
    });
    b.set_load(Load {
        connections: 2,
        ..Load::default()
    });
    eventually("b (2) listed before a (7)", Duration::from_secs(10), || {
        order() == [("b".to_owned(), 2), ("a".to_owned(), 7)]
    })
    .await;
    let listed = directory.members("echo").unwrap();
    assert_eq!(listed[0].addr, "192.0.2.2:7471".parse().unwrap());
    b.set_load(Load {
        connections: 9,
        ..Load::default()
    });
    eventually("a (7) listed before b (9)", Duration::from_secs(10), || {
        order() == [("a".to_owned(), 7), ("b".to_owned(), 9)]
    })
    .await;
    assert_eq!(
        directory.members("files"),
        Err(MembersError::UnknownService("files".into())),
        "a service the server does not watch is unknown"
    );
    // A withdrawn node leaves the answer.
    a.withdraw().await.unwrap();
    eventually("only b listed", Duration::from_secs(10), || {
        order() == [("b".to_owned(), 9)]
    })
    .await;
    b.withdraw().await.unwrap();
}
