//! The `ingest` service under real verbs: several clients flood records through small
//! rings into a deliberately slow sink; every record arrives exactly once, intact and in
//! order, with RNR retries disabled on the clients (any RNR would fail them). A client
//! that writes into a slot it was not granted, or a record with a bad checksum, loses
//! its connection and nobody else notices.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdmactor::runtime::{Client, ConnectionConfig, NodeConfig, Server};
use rdmactor_services::ingest::{
    seal, ImmCodec, Ingest, IngestConfig, IngestRequest, IngestResponse, IngestService, Record,
};
use rdmactor_tests::{
    actix_run, assert_released, eventually, pattern, rdma_context, resource_counts, serve,
    test_addr, wait_idle,
};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Record `n` of client `c`: its ids, then a pattern of a length that varies per record.
fn record(c: u32, n: u32, max: usize) -> Vec<u8> {
    let len = (n as usize * 97 + c as usize * 31) % (max - 8 + 1);
    let mut r = Vec::with_capacity(8 + len);
    r.extend_from_slice(&c.to_le_bytes());
    r.extend_from_slice(&n.to_le_bytes());
    r.extend_from_slice(&pattern(len, u64::from(c) << 32 | u64::from(n)));
    r
}

/// What the sink saw: per connection, the ids in arrival order.
#[derive(Default)]
struct Seen {
    by_connection: HashMap<u64, Vec<(u32, u32)>>,
    bad: Vec<String>,
}

fn small_ring() -> IngestConfig {
    IngestConfig {
        slots: 8,
        slot_len: 1024,
        credit_batch: 3,
    }
}

#[test]
fn flooding_clients_deliver_every_record_exactly_once() {
    let Some(_ctx) = rdma_context() else { return };
    let clients = env_or("RDMACTOR_INGEST_CLIENTS", 8) as u32;
    let records = env_or("RDMACTOR_INGEST_RECORDS", 2000) as u32;
    let base = resource_counts();
    actix_run(async move {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let sink = {
            let seen = seen.clone();
            Arc::new(move |r: Record| {
                let max = small_ring().slot_len as usize - 8;
                let c = u32::from_le_bytes(r.data[0..4].try_into().unwrap());
                let n = u32::from_le_bytes(r.data[4..8].try_into().unwrap());
                let mut guard = seen.lock().unwrap();
                let seen = &mut *guard;
                if r.data != record(c, n, max) {
                    seen.bad.push(format!("record {n} of client {c} differs"));
                }
                let list = seen.by_connection.entry(r.connection).or_default();
                if r.seq != list.len() as u64 {
                    seen.bad
                        .push(format!("seq {} after {} records", r.seq, list.len()));
                }
                list.push((c, n));
                drop(guard);
                // A slow consumer now and then: writers must wait for slots, not overrun.
                if n % 200 == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        let server = Server::builder()
            .listen(test_addr(), None)
            .service("ingest", IngestService::new(small_ring(), sink))
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig {
            connection: ConnectionConfig {
                rnr_retry_count: 0,
                ..ConnectionConfig::default()
            },
            ..NodeConfig::default()
        })
        .expect("client");

        let start = Instant::now();
        let writers = (0..clients).map(|c| {
            let client = &client;
            async move {
                let mut ingest = Ingest::connect(client, addr, "ingest")
                    .await
                    .expect("connect");
                assert_eq!(ingest.ring().slots, 8);
                let max = ingest.max_record();
                for n in 0..records {
                    ingest
                        .push(&record(c, n, max))
                        .await
                        .unwrap_or_else(|e| panic!("client {c} record {n}: {e}"));
                }
                assert_eq!(ingest.flush().await.expect("flush"), u64::from(records));
                assert_eq!(ingest.free_slots(), 8, "every slot came back");
                ingest.close().await;
            }
        });
        futures::future::join_all(writers).await;
        let elapsed = start.elapsed();
        let total = clients * records;
        println!(
            "{clients} clients x {records} records through 8-slot rings in {elapsed:.1?} \
             ({:.0} records/s)",
            f64::from(total) / elapsed.as_secs_f64()
        );

        {
            let seen = seen.lock().unwrap();
            assert!(
                seen.bad.is_empty(),
                "{:?}",
                &seen.bad[..seen.bad.len().min(5)]
            );
            assert_eq!(seen.by_connection.len(), clients as usize);
            let mut all = std::collections::HashSet::new();
            for list in seen.by_connection.values() {
                let c = list[0].0;
                let expected: Vec<(u32, u32)> = (0..records).map(|n| (c, n)).collect();
                assert!(
                    *list == expected,
                    "client {c}: records missing, repeated or out of order"
                );
                assert!(all.insert(c), "client {c} on two connections");
            }
        }

        wait_idle(&server, "connections to close", Duration::from_secs(20)).await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}

#[test]
fn overrunning_or_corrupting_clients_are_disconnected() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let delivered = Arc::new(Mutex::new(Vec::new()));
        let sink = {
            let delivered = delivered.clone();
            Arc::new(move |r: Record| delivered.lock().unwrap().push(r.data))
        };
        let (server, addr, client) = serve("ingest", IngestService::new(small_ring(), sink));
        let mut good = Ingest::connect(&client, addr, "ingest").await.unwrap();

        // Raw connections that skip the slot bookkeeping.
        let open = |conn: rdmactor::runtime::ClientConnection| async move {
            match conn.request_typed(&IngestRequest::Open).await.unwrap() {
                IngestResponse::Ring(info) => (conn, info),
                other => panic!("{other:?}"),
            }
        };
        let (overrun, ring) = open(client.connect(addr, "ingest").await.unwrap()).await;
        let codec = ImmCodec::new(ring.slots, ring.slot_len).unwrap();
        let sealed = seal(b"first");
        let imm = codec.encode(0, sealed.len() as u32);
        overrun
            .write(ring.remote, sealed.clone(), Some(imm))
            .await
            .unwrap();
        // Slot 0 again, with no credit for it.
        let _ = overrun.write(ring.remote, sealed, Some(imm)).await;

        let (corrupt, ring) = open(client.connect(addr, "ingest").await.unwrap()).await;
        let mut bad = seal(b"second");
        bad[0] ^= 0xff;
        let imm = codec.encode(3, bad.len() as u32);
        let slot3 = ring
            .remote
            .slice(ring.slot_offset(3), bad.len() as u64)
            .unwrap();
        let _ = corrupt.write(slot3, bad, Some(imm)).await;

        eventually(
            "the two bad connections to be closed",
            Duration::from_secs(10),
            || async { server.stats().await.connections == 1 },
        )
        .await;
        assert!(overrun.recv().await.is_none(), "no credits, then closed");
        assert_eq!(*delivered.lock().unwrap(), [b"first".to_vec()]);

        // The well-behaved client is unaffected.
        for n in 0..50u32 {
            good.push(&n.to_le_bytes()).await.unwrap();
        }
        assert_eq!(good.flush().await.unwrap(), 50);
        assert_eq!(delivered.lock().unwrap().len(), 51);

        good.close().await;
        overrun.close().await;
        corrupt.close().await;
        wait_idle(&server, "connections to close", Duration::from_secs(20)).await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}
