//! The `read` service under real verbs: many clients read random ranges of the one shared
//! copy of a region the server keeps updating in place, see the updates without asking,
//! and the versioned API never returns a torn value; static regions and files read with
//! plain READs; a READ past a region's end is a remote access error, and one
//! connection's rkey is useless on another connection.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdmactor::runtime::{Client, ClientConnection, NodeConfig, Server};
use rdmactor_services::read::layout::FIRST_VERSION;
use rdmactor_services::read::{self, ReadError, ReadRegions, ReadService, RegionHandle};
use rdmactor_testkit::rng::Rng;
use rdmactor_testkit::versioned::{consistent, uniform, LEN, WORDS};
use rdmactor_tests::{
    actix_run, assert_released, pattern, rdma_context, resource_counts, serve, test_addr, wait_idle,
};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Default)]
struct Tally {
    reads: AtomicU64,
    retries: AtomicU64,
    plain_reads: AtomicU64,
    torn_plain: AtomicU64,
}

/// One client: reads random ranges (mostly versioned, some plain for comparison) until
/// `deadline`. It never sends the server anything: updates reach it through the shared
/// registration alone.
async fn reader(
    c: u64,
    conn: ClientConnection,
    handle: RegionHandle,
    deadline: Instant,
    tally: Arc<Tally>,
) -> (u64, u64) {
    let reading = async {
        let mut rng = Rng(0x5eed ^ ((c + 1) * 0x9e37_79b9));
        let (mut first, mut last) = (u64::MAX, 0);
        while Instant::now() < deadline {
            let offset = rng.below(LEN as u64);
            let len = 1 + rng.below(LEN as u64 - offset) as usize;
            if rng.below(8) == 0 {
                let data = read::read(&conn, &handle, offset, len).await.expect("read");
                tally.plain_reads.fetch_add(1, Ordering::Relaxed);
                if !uniform(offset, &data) {
                    tally.torn_plain.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            }
            let v = read::read_versioned(&conn, &handle, offset, len, read::MAX_ATTEMPTS)
                .await
                .unwrap_or_else(|e| panic!("client {c}: versioned read {offset}+{len}: {e}"));
            assert!(
                consistent(offset, &v.data, v.version),
                "client {c}: torn read returned as version {} at {offset}+{len}",
                v.version
            );
            assert!(v.version >= last, "client {c}: version went back");
            first = first.min(v.version);
            last = v.version;
            tally.reads.fetch_add(1, Ordering::Relaxed);
            tally
                .retries
                .fetch_add(u64::from(v.retries), Ordering::Relaxed);
        }
        (first, last)
    };
    reading.await
}

#[test]
fn versioned_reads_are_never_torn_while_the_server_updates() {
    let Some(_ctx) = rdma_context() else { return };
    let clients = env_or("RDMACTOR_READ_CLIENTS", 32);
    let seconds = env_or("RDMACTOR_READ_SECONDS", 5);
    let base = resource_counts();
    actix_run(async move {
        let regions = ReadRegions::new();
        // The writer below updates about every 0.5 ms; under the VM's emulation a READ
        // takes milliseconds when 32 clients read at once, so a versioned read (three
        // READs) overlaps tens of updates. With a single copy every such read retries
        // (readers starved: 32 reads in 11 s, measured); a ring of 64 copies (256 KiB,
        // once for all connections) lets a read succeed while up to 63 updates happen.
        let writer = regions
            .add_buffer_with_copies("live", (FIRST_VERSION / 2).to_le_bytes().repeat(WORDS), 64)
            .unwrap();
        let server = Server::builder()
            .listen(test_addr(), None)
            .service("read", ReadService::new(regions))
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];

        // The application's writer: updates continuously on its own thread.
        let stop = Arc::new(AtomicBool::new(false));
        let updates = std::thread::spawn({
            let stop = stop.clone();
            let writer = writer.clone();
            move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    writer.update(|v, bytes| {
                        let word = (v / 2).to_le_bytes();
                        for chunk in bytes.chunks_mut(8) {
                            chunk.copy_from_slice(&word);
                        }
                    });
                    n += 1;
                    std::thread::sleep(Duration::from_micros(200));
                }
                n
            }
        });

        let client = Client::start(NodeConfig::default()).expect("client");
        let mut readers = Vec::new();
        for _ in 0..clients {
            let conn = client.connect(addr, "read").await.expect("connect");
            let handle = read::lookup(&conn, "live").await.expect("lookup");
            assert_eq!(handle.len(), LEN as u64);
            assert!(handle.is_mutable());
            readers.push((conn, handle));
        }
        let tally = Arc::new(Tally::default());
        let start = Instant::now();
        let deadline = start + Duration::from_secs(seconds);
        let seen =
            futures::future::join_all(readers.iter().cloned().enumerate().map(
                |(c, (conn, handle))| reader(c as u64, conn, handle, deadline, tally.clone()),
            ))
            .await;
        let elapsed = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        let updates = updates.join().unwrap();

        let t = &*tally;
        let reads = t.reads.load(Ordering::Relaxed);
        println!(
            "{clients} clients, {elapsed:.1?}: {reads} versioned reads ({:.0}/s), {} retries, \
             {} plain reads of which {} torn, {updates} updates",
            reads as f64 / elapsed.as_secs_f64(),
            t.retries.load(Ordering::Relaxed),
            t.plain_reads.load(Ordering::Relaxed),
            t.torn_plain.load(Ordering::Relaxed),
        );
        assert!(reads >= clients, "every client read");
        for (c, (first, last)) in seen.iter().enumerate() {
            assert!(
                last > first,
                "client {c} saw only version {first}: updates never reached it"
            );
        }

        // One shared copy: every connection was granted the same bytes, each with an rkey
        // of its own.
        let (first, second) = (readers[0].1.info().grant, readers[1].1.info().grant);
        assert_eq!(
            first.addr, second.addr,
            "one registration for all connections"
        );
        assert_ne!(first.rkey, second.rkey, "one window per connection");

        // Isolation: connection 1 uses connection 0's rkey and gets a remote access error
        // (the window is bound to connection 0's QP); connection 0 reads on.
        let (conn0, handle0) = &readers[0];
        let (conn1, _) = &readers[1];
        let err = read::read(conn1, handle0, 0, 8).await.unwrap_err();
        assert!(err.is_remote_access_error(), "{err}");
        read::read_consistent(conn0, handle0, 0, 8)
            .await
            .expect("the owner still reads");

        for (conn, _) in readers {
            conn.close().await;
        }
        wait_idle(&server, "connections to close", Duration::from_secs(20)).await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}

#[test]
fn static_regions_read_plainly_and_reads_past_the_end_fail() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let content = pattern(10_000, 7);
        let dir = std::env::temp_dir().join(format!("rdmactor-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("data");
        std::fs::write(&file, &content).unwrap();
        let regions = ReadRegions::new();
        regions.add_file("file", &file).unwrap();
        regions.add_static("small", b"0123456789".to_vec()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let (server, addr, client) = serve("read", ReadService::new(regions.clone()));
        // Registered up front, from this thread: two more MRs before any client asks
        // (otherwise the first lookup would pin them on the poller thread).
        let before = resource_counts().get("mr");
        regions
            .register_all(&server.protection_domain().await.expect("device present"))
            .unwrap();
        assert_eq!(
            resource_counts().get("mr"),
            before + 2,
            "both regions registered"
        );
        regions
            .register_all(&server.protection_domain().await.expect("device present"))
            .unwrap();
        assert_eq!(resource_counts().get("mr"), before + 2, "registered once");
        let conn = client.connect(addr, "read").await.expect("connect");

        assert_eq!(read::list(&conn).await.unwrap(), ["file", "small"]);
        assert_eq!(
            read::lookup(&conn, "nope").await,
            Err(ReadError::UnknownRegion("nope".into()))
        );
        let file = read::lookup(&conn, "file").await.unwrap();
        assert!(!file.is_mutable());
        assert_eq!(file.len(), 10_000);
        assert_eq!(
            file.info().grant.len,
            10_000,
            "granted exactly the file (no version word)"
        );
        let mut rng = Rng(42);
        for _ in 0..200 {
            let offset = rng.below(10_000);
            let len = 1 + rng.below(10_000 - offset) as usize;
            let data = read::read(&conn, &file, offset, len).await.unwrap();
            assert!(data == content[offset as usize..offset as usize + len]);
        }
        let (data, version) = read::read_consistent(&conn, &file, 9_990, 10)
            .await
            .unwrap();
        assert_eq!((&data[..], version), (&content[9_990..], FIRST_VERSION));
        // The very last byte is fine; one more is outside the registration.
        read::read(&conn, &file, 9_999, 1).await.unwrap();
        let err = read::read(&conn, &file, 9_996, 8).await.unwrap_err();
        assert!(err.is_remote_access_error(), "{err}");

        // The failed READ put that QP in error; another connection reads on.
        let conn2 = client.connect(addr, "read").await.expect("connect");
        let small = read::lookup(&conn2, "small").await.unwrap();
        assert_eq!(read::read(&conn2, &small, 2, 3).await.unwrap(), b"234");
        let err = read::read_consistent(&conn2, &small, 10, 1)
            .await
            .unwrap_err();
        assert!(err.is_remote_access_error(), "{err}");

        conn.close().await;
        conn2.close().await;
        wait_idle(&server, "connections to close", Duration::from_secs(20)).await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}
