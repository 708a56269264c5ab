//! A closed control plane (issue 47): etcd behind TLS with client certificates and its
//! RBAC, set up by scripts/etcd-secure as docs/operations.md says. Servers (the
//! `rdmactor-server` certificate) register and write the catalog; a client given the
//! documented client set-up (the `rdmactor-client` certificate) reads membership and
//! records and can change neither, however it tries; a process with no certificate is
//! not let in at all.

mod util;

use std::time::Duration;

use etcd_client::{Certificate, ConnectOptions, Identity, PutOptions, TlsOptions};
use rdmactor_cluster::files::{file_key, AddedCopy, Catalog, FileRecord};
use rdmactor_cluster::record::service_prefix;
use rdmactor_cluster::{
    Error, EtcdConfig, EtcdTls, Membership, Registrar, RegistrationConfig, RegistrationState,
};
use util::{addr, eventually, Etcd};

const CLUSTER: &str = "test";

/// The crate's config as `user` (a certificate made by scripts/etcd-secure).
fn config_as(etcd: &Etcd, user: &str) -> EtcdConfig {
    let (ca, cert, key) = etcd.cert(user);
    let tls = EtcdTls::from_ca(&ca)
        .unwrap()
        .with_client_cert(&cert, &key)
        .unwrap();
    let mut config = EtcdConfig::new([etcd.url()]).with_tls(tls);
    config.connect_timeout = Duration::from_secs(2);
    config.request_timeout = Duration::from_secs(3);
    config
}

/// A raw etcd client as `user`, to try what the crate never would.
async fn raw_as(etcd: &Etcd, user: &str) -> etcd_client::Client {
    let (ca, cert, key) = etcd.cert(user);
    let tls = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()))
        .identity(Identity::from_pem(
            std::fs::read(cert).unwrap(),
            std::fs::read(key).unwrap(),
        ));
    etcd_client::Client::connect([etcd.url()], Some(ConnectOptions::new().with_tls(tls)))
        .await
        .expect("connecting to etcd with a certificate")
}

fn record(nodes: &[&str]) -> FileRecord {
    FileRecord {
        alg: "sha256".into(),
        digest: "ab".repeat(32),
        size: 4,
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        owner: None,
    }
}

/// Whether an etcd-client call was refused for want of permission (or of a user).
fn denied<T: std::fmt::Debug>(what: &str, result: Result<T, etcd_client::Error>) {
    match result {
        Err(etcd_client::Error::GRpcStatus(status))
            if status.message().contains("permission denied")
                || status.message().contains("user name is empty") => {}
        other => panic!("{what}: expected a refusal for want of permission, got {other:?}"),
    }
}

#[tokio::test]
async fn a_client_with_the_documented_set_up_reads_but_cannot_change_membership_or_the_catalog() {
    let Some(etcd) = Etcd::start_secured(CLUSTER) else {
        return;
    };
    let server = config_as(&etcd, "rdmactor-server");
    let client = config_as(&etcd, "rdmactor-client");

    // A server registers and records a file.
    let mut config = RegistrationConfig::new(CLUSTER, "a", addr(1), ["files"]);
    config.ttl = Duration::from_secs(2);
    let a = Registrar::start(server.clone(), config).unwrap();
    let mut states = a.states();
    tokio::time::timeout(
        Duration::from_secs(10),
        states.wait_for(RegistrationState::is_registered),
    )
    .await
    .expect("the server registers within 10 s")
    .unwrap();
    let catalog = Catalog::new(server.clone(), CLUSTER).unwrap();
    catalog.create("f", &record(&["a"])).await.unwrap();

    // The client reads both.
    let files = Membership::watch(client.clone(), CLUSTER, "files").unwrap();
    let listed = files
        .wait_for(Duration::from_secs(10), |n| !n.is_empty())
        .await
        .expect("the client lists node a");
    assert_eq!(listed.len(), 1);
    let read = Catalog::new(client.clone(), CLUSTER).unwrap();
    let stored = read.get("f").await.unwrap().expect("the client reads f");
    assert_eq!(stored.record, record(&["a"]));

    // Through the crate: registering and recording are refused, by name.
    let mut fake = RegistrationConfig::new(CLUSTER, "fake", addr(9), ["files"]);
    fake.ttl = Duration::from_secs(2);
    let fake = Registrar::start(client.clone(), fake).unwrap();
    let mut states = fake.states();
    let refused = tokio::time::timeout(
        Duration::from_secs(10),
        states.wait_for(|s| matches!(s, RegistrationState::Retrying { .. })),
    )
    .await
    .expect("the client's registration fails within 10 s")
    .unwrap()
    .clone();
    assert!(
        matches!(&refused, RegistrationState::Retrying { error, .. } if error.contains("permission denied")),
        "{refused:?}"
    );
    drop(fake);
    let tampered = read.create("g", &record(&["fake"])).await;
    assert!(
        matches!(tampered, Err(Error::PermissionDenied { .. })),
        "{tampered:?}"
    );

    // Raw, as a hostile client would: a fake node key, a's own key under the client's
    // lease, a rewritten and a deleted record. Each is refused.
    let mut raw = raw_as(&etcd, "rdmactor-client").await;
    let nodes = service_prefix(CLUSTER, "files");
    denied(
        "a fake node key",
        raw.put(format!("{nodes}fake"), b"{}".to_vec(), None).await,
    );
    let lease = raw.lease_grant(30, None).await.map(|l| l.id());
    if let Ok(lease) = lease {
        denied(
            "node a's key under the client's lease",
            raw.put(
                format!("{nodes}a"),
                b"{}".to_vec(),
                Some(PutOptions::new().with_lease(lease)),
            )
            .await,
        );
    }
    let f = file_key(CLUSTER, "f");
    denied(
        "a rewritten record",
        raw.put(f.clone(), record(&["fake"]).to_json(), None).await,
    );
    denied("a deleted record", raw.delete(f.clone(), None).await);
    denied(
        "a key outside the cluster's services and files",
        raw.get(format!("/rdmactor/{CLUSTER}/locks/"), None).await,
    );

    // Nothing changed: a alone is listed, f's record is the server's.
    let stored = read.get("f").await.unwrap().expect("f is still recorded");
    assert_eq!(stored.record, record(&["a"]));
    assert!(read.get("g").await.unwrap().is_none());
    eventually("a listed alone", Duration::from_secs(5), || {
        let nodes = files.nodes();
        nodes.len() == 1 && nodes[0].node == "a"
    })
    .await;
    a.withdraw().await.unwrap();
}

#[tokio::test]
async fn a_process_without_a_certificate_is_not_let_in() {
    let Some(etcd) = Etcd::start_secured(CLUSTER) else {
        return;
    };
    let (ca, _, _) = etcd.cert("rdmactor-client");
    // TLS that trusts etcd but shows no certificate of its own.
    let tls = TlsOptions::new().ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()));
    let anonymous = tokio::time::timeout(
        Duration::from_secs(10),
        etcd_client::Client::connect([etcd.url()], Some(ConnectOptions::new().with_tls(tls))),
    )
    .await
    .expect("connect answers within 10 s");
    if let Ok(mut raw) = anonymous {
        let got = tokio::time::timeout(
            Duration::from_secs(10),
            raw.get(service_prefix(CLUSTER, "files"), None),
        )
        .await
        .expect("a read answers within 10 s");
        assert!(got.is_err(), "a read with no certificate: {got:?}");
    }
    // Plain HTTP to the TLS port is no way in either.
    let plain = etcd.url().replacen("https", "http", 1);
    let mut config = EtcdConfig::new([plain]);
    config.connect_timeout = Duration::from_secs(2);
    config.request_timeout = Duration::from_secs(2);
    let catalog = Catalog::new(config, CLUSTER).unwrap();
    assert!(catalog.get("f").await.is_err());
}

/// What each server's recorder does with the copy it verified: the first creates the
/// record, the others add themselves, all racing; other bytes under the name are
/// refused, and the same bytes from another identity add a replica and keep the owner.
#[tokio::test]
async fn servers_racing_to_record_their_copies_all_land_and_other_bytes_are_refused() {
    let Some(etcd) = Etcd::start_secured(CLUSTER) else {
        return;
    };
    let server = config_as(&etcd, "rdmactor-server");
    let catalog = std::sync::Arc::new(Catalog::new(server, CLUSTER).unwrap());
    let mut copy = record(&[]);
    copy.owner = Some("alice".into());
    let adds = ["a", "b", "c", "d"].map(|node| {
        let (catalog, copy) = (catalog.clone(), copy.clone());
        tokio::spawn(async move { catalog.add_copy("f", &copy, node).await.unwrap() })
    });
    let mut outcomes = Vec::new();
    for add in adds {
        outcomes.push(add.await.unwrap());
    }
    assert_eq!(
        outcomes.iter().filter(|o| **o == AddedCopy::New).count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes.iter().filter(|o| **o == AddedCopy::Added).count(),
        3,
        "{outcomes:?}"
    );
    let stored = catalog.get("f").await.unwrap().unwrap().record;
    let mut nodes = stored.nodes.clone();
    nodes.sort();
    assert_eq!(nodes, ["a", "b", "c", "d"]);
    assert_eq!(stored.owner.as_deref(), Some("alice"));
    // Again: listed already, nothing written.
    assert_eq!(
        catalog.add_copy("f", &copy, "b").await.unwrap(),
        AddedCopy::Listed
    );
    // The same bytes from another identity: a replica, alice still owns it.
    let mut mallory = copy.clone();
    mallory.owner = Some("mallory".into());
    assert_eq!(
        catalog.add_copy("f", &mallory, "e").await.unwrap(),
        AddedCopy::Added
    );
    assert_eq!(
        catalog
            .get("f")
            .await
            .unwrap()
            .unwrap()
            .record
            .owner
            .as_deref(),
        Some("alice")
    );
    // Other bytes: refused, with what the name holds.
    let mut junk = copy.clone();
    junk.digest = "cd".repeat(32);
    match catalog.add_copy("f", &junk, "z").await.unwrap() {
        AddedCopy::Taken(existing) => assert_eq!(existing.digest, copy.digest),
        other => panic!("junk under f: {other:?}"),
    }
    assert!(!catalog
        .get("f")
        .await
        .unwrap()
        .unwrap()
        .record
        .nodes
        .contains(&"z".to_owned()));
}
