//! The `read` service and `SessionCx::grant` over the loopback transport, through the
//! whole runtime: natively, no RDMA device. A real `Server::over(Loopback)` serves one
//! shared registration per region, windows bound per connection, while the application
//! updates the bytes in place; real `Client<Loopback>`s READ them.
//!
//! Loopback's READs copy the server's memory word by word while its writer stores word
//! by word, with no lock between them, so the torn reads the versioned layout guards
//! against really happen here (`plain_reads_tear_where_versioned_reads_retry` shows they
//! do). The real-verbs runs of the same properties are `tests/verbs/read_service.rs` and
//! `tests/verbs/shared_grants.rs` (the VM suite).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rdmactor::runtime::{
    Client, ClientConnection, GrantId, Incoming, NodeConfig, PeerInfo, RequestError, Server,
    Service, Session, SessionCx, SessionError,
};
use rdmactor::transport::loopback::{Device, Fabric, Loopback, Shared};
use rdmactor::transport::SharedRegion as _;
use rdmactor::verbs::{Access, RemoteRegion};
use rdmactor_services::read::layout::FIRST_VERSION;
use rdmactor_services::read::{
    self, ReadError, ReadRegions, ReadService, RegionHandle, RegionWriter,
};
use rdmactor_testkit::pattern;
use rdmactor_testkit::remote_region::{decode, encode};
use rdmactor_testkit::rng::Rng;
use rdmactor_testkit::versioned::{consistent, uniform, LEN, WORDS};

const AT: SocketAddr = SocketAddr::new(
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2)),
    7472,
);

/// A server of `service` on its own device of `fabric` (returned, for its fault hooks),
/// and a client on another.
fn serve<S: Service<Loopback>>(
    fabric: &Fabric,
    service: S,
) -> (Server<Loopback>, Client<Loopback>, Device) {
    let device = fabric.device("server");
    let server = Server::over(Loopback)
        .domain(device.clone())
        .listen(AT, None)
        .service("read", service)
        .start()
        .expect("server");
    let client = Client::<Loopback>::on(fabric.device("client"), NodeConfig::default()).unwrap();
    (server, client, device)
}

/// A live region of `copies` copies, all words `FIRST_VERSION / 2`.
fn live(regions: &ReadRegions<Loopback>, copies: usize) -> RegionWriter<Loopback> {
    regions
        .add_buffer_with_copies(
            "live",
            (FIRST_VERSION / 2).to_le_bytes().repeat(WORDS),
            copies,
        )
        .unwrap()
}

/// The application's writer on its own thread: every word to `version / 2`, then a
/// pause of `pause`, whenever `go` says so, until stopped; how many updates it made.
fn keep_updating(
    writer: RegionWriter<Loopback>,
    pause: Duration,
    mut go: impl FnMut() -> bool + Send + 'static,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let thread = std::thread::spawn({
        let stop = stop.clone();
        move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                if !go() {
                    std::thread::sleep(pause);
                    continue;
                }
                writer.update(|v, bytes| {
                    let word = (v / 2).to_le_bytes();
                    for chunk in bytes.chunks_mut(8) {
                        chunk.copy_from_slice(&word);
                    }
                });
                n += 1;
                if !pause.is_zero() {
                    std::thread::sleep(pause);
                }
            }
            n
        }
    });
    (stop, thread)
}

#[derive(Default)]
struct Tally {
    reads: AtomicU64,
    retries: AtomicU64,
    plain: AtomicU64,
    torn_plain: AtomicU64,
    contended: AtomicU64,
}

/// Attempts a versioned read makes here before giving up with `Contended`: an outcome
/// the API promises (counted, not a failure), which keeps a loaded machine's slow READs
/// from holding a test for long.
const ATTEMPTS: u32 = 1_000;

/// One client: random ranges, mostly versioned, one in eight plain, until `deadline`;
/// the first and last versions it read. It never sends the server anything after its
/// lookup: updates reach it through the shared registration alone.
async fn reader(
    c: u64,
    conn: ClientConnection<Loopback>,
    handle: RegionHandle,
    deadline: Instant,
    tally: Arc<Tally>,
) -> (u64, u64) {
    let mut rng = Rng(0x5eed ^ ((c + 1) * 0x9e37_79b9));
    let (mut first, mut last) = (u64::MAX, 0);
    while Instant::now() < deadline {
        let offset = rng.below(LEN as u64);
        let len = 1 + rng.below(LEN as u64 - offset) as usize;
        if rng.below(8) == 0 {
            let data = read::read(&conn, &handle, offset, len).await.expect("read");
            tally.plain.fetch_add(1, Ordering::Relaxed);
            if !uniform(offset, &data) {
                tally.torn_plain.fetch_add(1, Ordering::Relaxed);
            }
            continue;
        }
        let v = match read::read_versioned(&conn, &handle, offset, len, ATTEMPTS).await {
            Ok(v) => v,
            Err(ReadError::Contended(_)) => {
                tally.contended.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Err(e) => panic!("client {c}: versioned read {offset}+{len}: {e}"),
        };
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
}

#[test]
fn sixteen_clients_never_accept_a_torn_read_while_the_server_updates_in_place() {
    actix::System::new().block_on(async {
        let regions = ReadRegions::<Loopback>::default();
        // Two copies: a reader whose three READs overlap two updates retries, so the
        // version check decides often (a larger ring would hide a broken check).
        let writer = live(&regions, 2);
        let (server, client, _device) = serve(&Fabric::default(), ReadService::new(regions));
        // Paced by the readers: an update per 8 reads finished, so that a read overlaps
        // about two updates however slow a loaded machine makes the READs (a writer on a
        // clock starved the readers there: 30 reads in 3 s).
        let tally = Arc::new(Tally::default());
        let (stop, updates) = keep_updating(writer, Duration::from_micros(20), {
            let tally = tally.clone();
            let mut next = 0;
            move || {
                let done = tally.reads.load(Ordering::Relaxed)
                    + tally.plain.load(Ordering::Relaxed)
                    + tally.contended.load(Ordering::Relaxed);
                let go = done >= next;
                if go {
                    next = done + 8;
                }
                go
            }
        });

        let mut readers = Vec::new();
        for _ in 0..16 {
            let conn = client.connect(AT, "read").await.expect("connect");
            let handle = read::lookup(&conn, "live").await.expect("lookup");
            assert_eq!(handle.len(), LEN as u64);
            assert!(handle.is_mutable());
            readers.push((conn, handle));
        }
        let start = Instant::now();
        let deadline = start + Duration::from_secs(2);
        let tasks: Vec<_> = readers
            .iter()
            .cloned()
            .enumerate()
            .map(|(c, (conn, handle))| {
                actix::spawn(reader(c as u64, conn, handle, deadline, tally.clone()))
            })
            .collect();
        let mut seen = Vec::new();
        for task in tasks {
            seen.push(task.await.expect("a reader panicked"));
        }
        let elapsed = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        let updates = updates.join().unwrap();

        let t = &*tally;
        let reads = t.reads.load(Ordering::Relaxed);
        println!(
            "16 clients, {elapsed:.1?}: {reads} versioned reads, {} retries, {} contended, \
             {} plain reads of which {} torn, {updates} updates",
            t.retries.load(Ordering::Relaxed),
            t.contended.load(Ordering::Relaxed),
            t.plain.load(Ordering::Relaxed),
            t.torn_plain.load(Ordering::Relaxed),
        );
        for (c, (first, last)) in seen.iter().enumerate() {
            assert!(
                last > first,
                "client {c} saw only version {first}: updates never reached it"
            );
        }

        // One shared registration, one window per connection.
        let grants: Vec<RemoteRegion> = readers.iter().map(|(_, h)| h.info().grant).collect();
        assert!(
            grants.iter().all(|g| g.addr == grants[0].addr),
            "one registration for all connections"
        );
        let mut rkeys: Vec<u32> = grants.iter().map(|g| g.rkey).collect();
        rkeys.sort_unstable();
        rkeys.dedup();
        assert_eq!(rkeys.len(), 16, "an rkey of its own per connection");

        client.shutdown().await;
        server.shutdown().await;
    });
}

#[test]
fn plain_reads_tear_where_versioned_reads_retry() {
    actix::System::new().block_on(async {
        let regions = ReadRegions::<Loopback>::default();
        // One copy, rewritten by every update: the classic seqlock, where a READ
        // overlapping an update sees part of it.
        let writer = live(&regions, 1);
        let (server, client, _device) = serve(&Fabric::default(), ReadService::new(regions));
        let (stop, updates) = keep_updating(writer, Duration::from_micros(50), || true);
        let conn = client.connect(AT, "read").await.expect("connect");
        let handle = read::lookup(&conn, "live").await.expect("lookup");

        let (mut plain, mut torn, mut versioned, mut retries) = (0u64, 0u64, 0u64, 0u64);
        let mut contended = 0;
        let deadline = Instant::now() + Duration::from_secs(30);
        while (torn == 0 || versioned < 100) && Instant::now() < deadline {
            let data = read::read(&conn, &handle, 0, LEN).await.expect("read");
            plain += 1;
            if !uniform(0, &data) {
                torn += 1;
            }
            let v = match read::read_versioned(&conn, &handle, 0, LEN, ATTEMPTS).await {
                Ok(v) => v,
                Err(ReadError::Contended(_)) => {
                    contended += 1;
                    continue;
                }
                Err(e) => panic!("versioned read: {e}"),
            };
            assert!(
                consistent(0, &v.data, v.version),
                "a torn read returned as version {}",
                v.version
            );
            versioned += 1;
            retries += u64::from(v.retries);
        }
        stop.store(true, Ordering::Relaxed);
        let updates = updates.join().unwrap();
        println!(
            "{plain} plain reads of which {torn} torn; {versioned} versioned reads, \
             {retries} retries, {contended} contended; {updates} updates"
        );
        assert!(
            torn > 0,
            "no plain READ of {plain} overlapped an update: the race the version check \
             guards against never happened, so the test proves nothing"
        );
        assert!(
            versioned >= 100,
            "only {versioned} versioned reads finished"
        );
        client.shutdown().await;
        server.shutdown().await;
    });
}

#[test]
fn an_rkey_used_on_another_connection_ends_that_connection_and_the_others_read_on() {
    actix::System::new().block_on(async {
        let regions = ReadRegions::<Loopback>::default();
        let writer = live(&regions, 4);
        let (server, client, _device) = serve(&Fabric::default(), ReadService::new(regions));
        let mut conns = Vec::new();
        for _ in 0..3 {
            let conn = client.connect(AT, "read").await.expect("connect");
            let handle = read::lookup(&conn, "live").await.expect("lookup");
            conns.push((conn, handle));
        }
        let (owner, theirs) = &conns[0];
        let (prober, _) = &conns[1];
        let err = read::read(prober, theirs, 0, 8).await.unwrap_err();
        assert!(err.is_remote_access_error(), "{err}");
        // The prober's QP is in error: its connection ends, saying why.
        let reason = wait_for(|| prober.close_reason()).await;
        assert!(
            reason.to_string().contains("RemoteAccess"),
            "the reason names the remote access error: {reason}"
        );
        match prober.request(b"anything".to_vec()).await {
            Err(RequestError::Closed(_)) => {}
            other => panic!("a request on the ended connection: {other:?}"),
        }
        // The others are served as before, updates included.
        let version = writer.write(0, &[9; 8]).unwrap();
        for (conn, handle) in [&conns[0], &conns[2]] {
            let (data, v) = read::read_consistent(conn, handle, 0, 8).await.unwrap();
            assert_eq!((data, v), (vec![9; 8], version));
        }
        assert!(owner.close_reason().is_none());
        // The server's side of it ended too (its responder QP went to the error state).
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.stats().await.connections != 2 {
            assert!(
                Instant::now() < deadline,
                "the server still serves the prober"
            );
            actix::clock::sleep(Duration::from_millis(5)).await;
        }
        client.shutdown().await;
        server.shutdown().await;
    });
}

#[test]
fn reads_past_the_end_of_a_grant_are_remote_access_errors() {
    actix::System::new().block_on(async {
        let content = pattern(10_000, 7);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, &content).unwrap();
        let regions = ReadRegions::<Loopback>::default();
        regions.add_file("file", &path).unwrap();
        regions.add_static("small", b"0123456789".to_vec()).unwrap();
        live(&regions, 3);
        let (server, client, _device) = serve(&Fabric::default(), ReadService::new(regions));

        // A file, its bytes copied into the registration: every range reads back.
        let conn = client.connect(AT, "read").await.expect("connect");
        assert_eq!(read::list(&conn).await.unwrap(), ["file", "live", "small"]);
        assert_eq!(
            read::lookup(&conn, "nope").await,
            Err(ReadError::UnknownRegion("nope".into()))
        );
        let file = read::lookup(&conn, "file").await.unwrap();
        assert!(!file.is_mutable());
        assert_eq!(file.info().grant.len, 10_000, "exactly the file");
        let mut rng = Rng(42);
        for _ in 0..200 {
            let offset = rng.below(10_000);
            let len = 1 + rng.below(10_000 - offset) as usize;
            let data = read::read(&conn, &file, offset, len).await.unwrap();
            assert!(data == content[offset as usize..offset as usize + len]);
        }
        read::read(&conn, &file, 9_999, 1).await.unwrap();
        let err = read::read(&conn, &file, 9_996, 8).await.unwrap_err();
        assert!(err.is_remote_access_error(), "{err}");

        // A static region: one byte past its end.
        let conn = client.connect(AT, "read").await.expect("connect");
        let small = read::lookup(&conn, "small").await.unwrap();
        assert_eq!(read::read(&conn, &small, 2, 3).await.unwrap(), b"234");
        let err = read::read(&conn, &small, 9, 2).await.unwrap_err();
        assert!(err.is_remote_access_error(), "{err}");

        // A versioned region: the grant is the version word and every copy, exactly.
        let conn = client.connect(AT, "read").await.expect("connect");
        let live = read::lookup(&conn, "live").await.unwrap();
        let grant = live.info().grant;
        assert_eq!(grant.len, 8 + 3 * LEN as u64);
        let all = conn.read(grant, grant.len as usize).await.unwrap();
        assert_eq!(all.len(), grant.len as usize);
        let past = RemoteRegion {
            len: grant.len + 1,
            ..grant
        };
        let err = conn.read(past, past.len as usize).await.unwrap_err();
        assert!(err.to_string().contains("RemoteAccess"), "{err}");

        client.shutdown().await;
        server.shutdown().await;
    });
}

/// What `SessionCx::grant` gives, over loopback: the shared region and the file of
/// `tests/verbs/shared_grants.rs`, registered once the server's domain exists.
type Regions = Arc<OnceLock<(Shared, Shared)>>;

/// The granted range of the 64-byte region: in its middle, so that loopback's check of
/// the window's own range shows (rxe would let a READ run on to the region's end).
const GRANTED: std::ops::Range<usize> = 16..32;

struct Grants(Regions);

impl Service<Loopback> for Grants {
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session<Loopback>> {
        Box::new(GrantSession {
            regions: self.0.clone(),
            grant: None,
        })
    }
}

struct GrantSession {
    regions: Regions,
    grant: Option<GrantId>,
}

impl Session<Loopback> for GrantSession {
    fn on_message(
        &mut self,
        cx: &mut SessionCx<'_, Loopback>,
        msg: Incoming,
    ) -> Result<(), SessionError> {
        let (memory, file) = self.regions.get().expect("regions registered first");
        let reply = match &msg.data[..] {
            b"grant" => {
                let grant = cx.grant(memory, GRANTED, Access::REMOTE_READ)?;
                assert_eq!(cx.granted(grant.id), Some(grant.remote));
                self.grant = Some(grant.id);
                encode(grant.remote)
            }
            b"revoke" => {
                let id = self.grant.take().expect("a grant to revoke");
                cx.revoke(id);
                assert_eq!(cx.granted(id), None);
                b"revoked".to_vec()
            }
            b"write the file" => match cx.grant(file, 0..4, Access::REMOTE_WRITE) {
                Ok(_) => b"granted".to_vec(),
                Err(e) => e.to_string().into_bytes(),
            },
            other => return Err(SessionError::new(format!("unknown request {other:?}"))),
        };
        cx.reply(&msg, reply)
    }
}

async fn grant(conn: &ClientConnection<Loopback>) -> RemoteRegion {
    decode(&conn.request(b"grant".to_vec()).await.expect("grant"))
}

fn remote_access_error(e: &RequestError) -> bool {
    e.to_string().contains("RemoteAccess")
}

#[test]
fn grants_give_their_access_and_range_until_revoked() {
    actix::System::new().block_on(async {
        let regions: Regions = Arc::new(OnceLock::new());
        let (server, client, _device) = serve(&Fabric::default(), Grants(regions.clone()));
        let domain = server.protection_domain().await.expect("device present");
        let memory = Shared::alloc(&domain, 64).unwrap();
        memory.write(GRANTED.start, b"first version...").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"file bytes").unwrap();
        let file =
            Shared::map_file(&domain, &std::fs::File::open(dir.path().join("f")).unwrap()).unwrap();
        assert!(!file.is_writable());
        assert!(
            file.write(0, b"x").is_err(),
            "read-only for the application too"
        );
        assert_eq!(file.read(0, 10).unwrap(), b"file bytes");
        assert!(regions.set((memory.clone(), file)).is_ok(), "set once");

        // Reads see the application's updates in place, no message needed.
        let a = client.connect(AT, "read").await.expect("connect");
        let g = grant(&a).await;
        assert_eq!(
            (g.addr, g.len),
            (memory.addr() + 16, 16),
            "exactly the range"
        );
        assert_eq!(a.read(g, 16).await.unwrap(), b"first version...");
        memory.write(GRANTED.start, b"second version..").unwrap();
        assert_eq!(a.read(g, 16).await.unwrap(), b"second version..");
        // Revoked: the same rkey is dead at once, on the connection it was granted to.
        assert_eq!(a.request(b"revoke".to_vec()).await.unwrap(), b"revoked");
        let err = a.read(g, 16).await.unwrap_err();
        assert!(remote_access_error(&err), "{err}");

        // Granted again (a new connection: the failed READ ended the last one): a new
        // rkey, the old one dead on this QP too.
        let b = client.connect(AT, "read").await.expect("connect");
        let g2 = grant(&b).await;
        assert_ne!(g2.rkey, g.rkey);
        assert_eq!(b.read(g2, 16).await.unwrap(), b"second version..");
        assert_eq!(b.request(b"revoke".to_vec()).await.unwrap(), b"revoked");
        let g3 = grant(&b).await;
        assert_ne!(g3.rkey, g2.rkey, "a bind after a revoke gives a new key");
        assert_eq!(b.read(g3, 16).await.unwrap(), b"second version..");
        let err = b.read(g2, 16).await.unwrap_err();
        assert!(
            remote_access_error(&err),
            "the revoked key on its own QP: {err}"
        );

        // A READ grant does not allow WRITE.
        let c = client.connect(AT, "read").await.expect("connect");
        let g = grant(&c).await;
        let err = c.write(g, b"nope".to_vec(), None).await.unwrap_err();
        assert!(remote_access_error(&err), "{err}");
        assert_eq!(&memory.read(16, 4).unwrap(), b"seco", "nothing written");

        // One byte past the granted range, inside the region: loopback checks the
        // window's own range. One byte before it, too.
        for outside in [
            RemoteRegion { len: 17, ..g },
            RemoteRegion {
                addr: g.addr - 1,
                ..g
            },
        ] {
            let d = client.connect(AT, "read").await.expect("connect");
            let g = grant(&d).await;
            let err = d
                .read(
                    RemoteRegion {
                        rkey: g.rkey,
                        ..outside
                    },
                    outside.len as usize,
                )
                .await
                .unwrap_err();
            assert!(remote_access_error(&err), "{outside:?}: {err}");
        }

        // A read-only file cannot be granted for writing.
        let e = client.connect(AT, "read").await.expect("connect");
        let answer = e.request(b"write the file".to_vec()).await.unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.contains("read-only"), "{answer}");

        client.shutdown().await;
        server.shutdown().await;
    });
}

#[test]
fn regions_registered_up_front_are_served_without_registering_again() {
    actix::System::new().block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        std::fs::write(&path, pattern(5_000, 3)).unwrap();
        let regions = ReadRegions::<Loopback>::default();
        let writer = live(&regions, 4);
        regions.add_file("file", &path).unwrap();
        regions.add_static("small", b"0123456789".to_vec()).unwrap();
        let (server, client, device) = serve(&Fabric::default(), ReadService::new(regions.clone()));
        let domain = server.protection_domain().await.expect("device present");
        regions
            .register_all(&domain)
            .expect("registered from this thread");

        let mut conns = Vec::new();
        for _ in 0..3 {
            let conn = client.connect(AT, "read").await.expect("connect");
            assert_eq!(read::list(&conn).await.unwrap().len(), 3);
            conns.push(conn);
        }
        // From now on the server's device registers nothing: lookups must find every
        // region registered already, and registering them all again must not try.
        device.refuse_registrations(true);
        regions
            .register_all(&domain)
            .expect("nothing left to register");
        let version = writer.write(8, b"up front").unwrap();
        let mut addrs = Vec::new();
        for conn in &conns {
            for name in ["live", "file", "small"] {
                let handle = read::lookup(conn, name).await.expect(name);
                addrs.push((name, handle.info().grant.addr));
            }
            let live = read::lookup(conn, "live").await.unwrap();
            let (data, v) = read::read_consistent(conn, &live, 8, 8).await.unwrap();
            assert_eq!((&data[..], v), (&b"up front"[..], version));
        }
        for (name, addr) in &addrs {
            let first = addrs.iter().find(|(n, _)| n == name).unwrap().1;
            assert_eq!(
                *addr, first,
                "{name}: one registration for every connection"
            );
        }
        // A region added later registers on first lookup, which the device refuses now.
        regions.add_static("late", vec![1; 100]).unwrap();
        match read::lookup(&conns[0], "late").await {
            Err(ReadError::Refused(why)) => assert!(why.contains("refused"), "{why}"),
            other => panic!("a lookup that must register: {other:?}"),
        }
        device.refuse_registrations(false);
        let late = read::lookup(&conns[0], "late")
            .await
            .expect("registered now");
        assert_eq!(
            read::read(&conns[0], &late, 0, 100).await.unwrap(),
            vec![1; 100]
        );

        client.shutdown().await;
        server.shutdown().await;
    });
}

/// Polls `f` every few milliseconds until it gives something (at most 10 s).
async fn wait_for<R>(mut f: impl FnMut() -> Option<R>) -> R {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(r) = f() {
            return r;
        }
        assert!(Instant::now() < deadline, "waited 10 s in vain");
        actix::clock::sleep(Duration::from_millis(5)).await;
    }
}
