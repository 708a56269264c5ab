//! Issue 45: what a handler's client can make the server hold is counted against the
//! server's heap budget (`PoolConfig::heap_bytes`) and its service's call bound, over the
//! loopback transport (no RDMA device). A hostile client keeps many READs of its memory
//! in flight; the server's count never passes the budget, the calls past it wait their
//! turn and then fail with `NoRoom`, a polite client is answered all along, and the
//! counts go back to zero.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use rdmactor::memory::PoolConfig;
use rdmactor::prelude::*;
use rdmactor::runtime::NodeConfig;
use rdmactor::transport::loopback::{Fabric, Loopback};
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

#[derive(Serialize, Deserialize)]
enum Req {
    /// READ all of the region and hold the bytes until the gate lets the call go.
    Hold(RemoteRegion),
    /// Answer at once.
    Ping(u32),
}

/// READs the client's memory and keeps the bytes until the test opens the gate: the
/// longest a hostile client can make a call hold what it READ.
struct Hog {
    gate: Arc<Semaphore>,
}

impl RequestHandler for Hog {
    type Req = Req;
    type Resp = u64;
    type Error = String;

    async fn call(&self, req: Req, cx: &RequestCx) -> Result<u64, String> {
        match req {
            Req::Ping(n) => Ok(u64::from(n)),
            Req::Hold(src) => {
                let bytes = cx.read(src).await.map_err(|e| e.to_string())?;
                let _pass = self.gate.acquire().await.map_err(|e| e.to_string())?;
                Ok(bytes.len() as u64)
            }
        }
    }
}

const MIB: usize = 1 << 20;

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], port))
}

#[test]
fn reads_in_flight_never_pass_the_heap_budget_and_a_polite_client_is_served() {
    actix::System::new().block_on(async {
        let fabric = Fabric::default();
        let heap = 8 * MIB;
        let config = NodeConfig {
            pool: PoolConfig {
                heap_bytes: heap,
                ..PoolConfig::default()
            },
            ..NodeConfig::default()
        };
        let gate = Arc::new(Semaphore::new(0));
        let server = Server::over(Loopback)
            .domain(fabric.device("server"))
            .config(config)
            .listen(addr(7100), None)
            .service(
                "hog",
                HandlerService::new(Hog {
                    gate: Arc::clone(&gate),
                })
                .budget_wait(Duration::from_millis(300)),
            )
            .start()
            .expect("server");
        let client = Client::<Loopback>::on(fabric.device("client"), NodeConfig::default())
            .expect("client");
        let len = 3 * MIB;
        let mut src = client
            .register(len, Access::REMOTE_READ)
            .expect("register");
        src.write(0, &vec![7u8; len]).expect("fill");
        let hostile = connect_n(&client, addr(7100), 4).await;
        let polite = client.connect(addr(7100), "hog").await.expect("polite");

        // 4 connections x 4 READs of 3 MiB: 48 MiB asked of an 8 MiB budget.
        let (tx, mut results) = tokio::sync::mpsc::unbounded_channel();
        for conn in &hostile {
            for _ in 0..4 {
                let (conn, tx) = (Rc::clone(conn), tx.clone());
                let region = src.remote();
                actix::spawn(async move {
                    let got = conn.call_typed::<_, u64, String>(&Req::Hold(region)).await;
                    let _ = tx.send(got);
                });
            }
        }
        drop(tx);
        // The budget fills (two READs fit) and stays within its limit while the rest
        // wait their turn; the polite client is answered meanwhile.
        let mut most = 0;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let held = server.stats().await.pool.heap_bytes;
            assert!(held <= heap, "{held} B held of a budget of {heap}");
            most = most.max(held);
            if held >= 2 * len {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the READs never filled the budget");
            tokio::task::yield_now().await;
        }
        for n in 0..20 {
            let got = tokio::time::timeout(
                Duration::from_secs(1),
                polite.call_typed::<_, u64, String>(&Req::Ping(n)),
            )
            .await
            .expect("the polite client is answered within 1 s")
            .expect("answered");
            assert_eq!(got, u64::from(n));
        }
        // The READs that waited past `budget_wait` fail with the budget named, while
        // the two that hold the budget keep it; then those are let go.
        let (mut done, mut no_room) = (0, 0);
        let mut tally = |got: Result<u64, CallError<String>>| match got {
            Ok(n) => {
                assert_eq!(n, len as u64);
                done += 1;
            }
            Err(CallError::Handler(why)) if why.contains("no room") => no_room += 1,
            Err(other) => panic!("a READ past the budget answered {other}"),
        };
        for _ in 0..14 {
            tally(results.recv().await.expect("a result"));
            let held = server.stats().await.pool.heap_bytes;
            assert!(held <= heap, "{held} B held of {heap}");
        }
        gate.add_permits(64);
        while let Some(got) = results.recv().await {
            tally(got);
        }
        assert_eq!((done, no_room), (2, 14), "served, refused with NoRoom");
        println!("hostile READs: {done} served, {no_room} refused with NoRoom; most held {most} B of {heap}");
        // Nothing stays counted once the calls are over.
        wait_for(&server, |s| s.pool.heap_bytes == 0).await;
        close_all(hostile).await;
        polite.close().await;
        wait_for(&server, |s| s.connections == 0).await;
        client.shutdown().await;
        server.shutdown().await;
    });
}

#[test]
fn past_the_service_wide_call_bound_calls_wait_and_a_connections_first_call_still_runs() {
    actix::System::new().block_on(async {
        let fabric = Fabric::default();
        let gate = Arc::new(Semaphore::new(0));
        let server = Server::over(Loopback)
            .domain(fabric.device("server"))
            .listen(addr(7101), None)
            .service(
                "hog",
                HandlerService::new(Hog {
                    gate: Arc::clone(&gate),
                })
                .max_calls(2),
            )
            .start()
            .expect("server");
        let client =
            Client::<Loopback>::on(fabric.device("client"), NodeConfig::default()).expect("client");
        let region = client
            .register(4096, Access::REMOTE_READ)
            .expect("register");
        let hogs = connect_n(&client, addr(7101), 2).await;
        let (tx, mut held) = tokio::sync::mpsc::unbounded_channel();
        // Three calls on each: the first of each and one more fill the bound (2 beyond
        // the firsts); the rest wait in their connections' lines.
        for conn in &hogs {
            for _ in 0..3 {
                let (conn, remote, tx) = (Rc::clone(conn), region.remote(), tx.clone());
                actix::spawn(async move {
                    let got = conn.call_typed::<_, u64, String>(&Req::Hold(remote)).await;
                    let _ = tx.send(got);
                });
            }
        }
        drop(tx);
        // A polite connection's one call runs at once, bound or not.
        let polite = client.connect(addr(7101), "hog").await.expect("polite");
        for n in 0..5 {
            assert_eq!(
                polite
                    .call_typed::<_, u64, String>(&Req::Ping(n))
                    .await
                    .expect("a first call always runs"),
                u64::from(n)
            );
        }
        assert!(held.try_recv().is_err(), "nothing held was answered yet");
        // Let them go: every waiting call runs in its turn, none is refused.
        gate.add_permits(64);
        let mut answered = 0;
        while let Some(got) = held.recv().await {
            assert_eq!(got.expect("served in its turn"), 4096);
            answered += 1;
        }
        assert_eq!(answered, 6);
        close_all(hogs).await;
        polite.close().await;
        wait_for(&server, |s| s.connections == 0).await;
        client.shutdown().await;
        server.shutdown().await;
    });
}

/// `n` connections, shared with the calls spawned on them.
async fn connect_n(
    client: &Client<Loopback>,
    at: SocketAddr,
    n: usize,
) -> Vec<Rc<ClientConnection<Loopback>>> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(Rc::new(client.connect(at, "hog").await.expect("connect")));
    }
    out
}

/// Closes connections whose calls are all done.
async fn close_all(conns: Vec<Rc<ClientConnection<Loopback>>>) {
    for conn in conns {
        Rc::into_inner(conn)
            .expect("no call holds it")
            .close()
            .await;
    }
}

async fn wait_for(
    server: &Server<Loopback>,
    done: impl Fn(&rdmactor::runtime::ServerStats) -> bool,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let stats = server.stats().await;
        if done(&stats) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never settled: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
