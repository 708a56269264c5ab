//! Request handlers (`RequestHandler`, issue 32): the key-value example with 8
//! connections of 400 requests each, every answer checked, its store an owner actor the
//! handler awaits (and the same service as a raw session, answering alike); and what a handler's client is told when the handler fails, panics,
//! is sent bytes it cannot decode or is busy, and what happens to a call whose
//! connection closes while it runs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rdmactor::prelude::*;
use rdmactor::runtime::Answer;
use rdmactor_examples::kv::{run_clients, Kv, KvClient, KvError, KvLimits};
use rdmactor_examples::kv_session::KvSessions;
use rdmactor_tests::{
    actix_run, assert_released, eventually, rdma_context, resource_counts, test_addr, wait_idle,
};
use serde::{Deserialize, Serialize};

#[test]
fn kv_eight_connections_of_400_requests_every_answer_checked() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let server = Server::builder()
            .listen(test_addr(), None)
            .handler("kv", Kv::default())
            .max_connections_per_peer(0)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let started = std::time::Instant::now();
        let round_trips = run_clients(&client, addr, 8, 400)
            .await
            .expect("every answer right");
        assert_eq!(round_trips.len(), 8 * 400);
        println!(
            "kv: {} answers verified in {:?}",
            round_trips.len(),
            started.elapsed()
        );

        // Typed errors reach the client as the handler returned them.
        let kv = KvClient(client.connect(addr, "kv").await.expect("connect"));
        assert!(matches!(
            kv.get("never put").await,
            Err(CallError::Handler(KvError::NotFound))
        ));
        let long = "k".repeat(300);
        assert!(matches!(
            kv.put(&long, vec![1]).await,
            Err(CallError::Handler(KvError::KeyTooLong(300)))
        ));
        kv.0.close().await;
        wait_idle(
            &server,
            "every kv connection released",
            Duration::from_secs(10),
        )
        .await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}

/// Issue 32: a handler awaits RDMA READs and WRITEs of the client's memory. A 3 MiB
/// value (four chunks) goes in by the server's READ and out by its WRITE, byte for byte;
/// a short region and an oversized claim fail the call and not the connection; a forged
/// rkey fails the READ with a remote access error, which ends that connection only.
#[test]
fn kv_values_moved_by_the_servers_reads_and_writes_of_client_memory() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let server = Server::builder()
            .listen(test_addr(), None)
            .handler("kv", Kv::default())
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let kv = KvClient(client.connect(addr, "kv").await.expect("connect"));
        let len = (3 << 20) + 123;
        let value = rdmactor_testkit::pattern(len, 32);
        let mut src = client.register(len, Access::REMOTE_READ).expect("register");
        src.as_mut_slice().copy_from_slice(&value);
        assert!(!kv.put_from("big", src.remote()).await.expect("put_from"));
        let dst = client
            .register(4 << 20, Access::REMOTE_WRITE)
            .expect("register");
        assert_eq!(
            kv.get_into("big", dst.remote()).await.expect("get_into"),
            len as u64
        );
        assert!(
            dst.as_slice()[..len] == value[..],
            "the WRITE landed intact"
        );
        assert_eq!(
            kv.get("big").await.expect("get"),
            value,
            "the READ stored it intact"
        );

        // The call fails and the connection goes on.
        let short = dst.remote().slice(0, 1000).expect("slice");
        match kv.get_into("big", short).await {
            Err(CallError::Handler(KvError::Transfer(why))) => {
                assert!(why.contains("do not fit"), "{why}")
            }
            other => panic!("a WRITE into a short region answered {other:?}"),
        }
        let claim = RemoteRegion {
            len: 1 << 30,
            ..src.remote()
        };
        // Refused by the store's largest value before any READ (issue 45).
        match kv.put_from("huge", claim).await {
            Err(CallError::Handler(KvError::ValueTooLarge { len, max })) => {
                assert_eq!((len, max), (1 << 30, KvLimits::DEFAULT_MAX_VALUE))
            }
            other => panic!("a READ of 1 GiB answered {other:?}"),
        }
        assert_eq!(kv.get("big").await.expect("still served").len(), len);

        // A forged rkey: this connection ends with the reason, another is served.
        let other = KvClient(client.connect(addr, "kv").await.expect("connect"));
        let forged = RemoteRegion {
            rkey: src.rkey() ^ 0x5a5a_0000,
            ..src.remote()
        };
        match kv.put_from("forged", forged).await {
            Err(CallError::Request(RequestError::Closed(reason))) => {
                println!("forged rkey: the connection closed: {reason}")
            }
            other => panic!("a READ through a forged rkey answered {other:?}"),
        }
        assert!(matches!(
            other.get("forged").await,
            Err(CallError::Handler(KvError::NotFound))
        ));
        assert_eq!(other.get("big").await.expect("other served").len(), len);
        other.0.close().await;
        drop((src, dst));
        wait_idle(
            &server,
            "every kv connection released",
            Duration::from_secs(10),
        )
        .await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}

#[test]
fn kv_as_a_raw_session_answers_alike() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let server = Server::builder()
            .listen(test_addr(), None)
            .service("kv", KvSessions::default())
            .max_connections_per_peer(0)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let round_trips = run_clients(&client, addr, 8, 400)
            .await
            .expect("every answer right");
        assert_eq!(round_trips.len(), 8 * 400);
        wait_idle(
            &server,
            "every kv connection released",
            Duration::from_secs(10),
        )
        .await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}

/// A call that sleeps `ms` (on a timer, or on the blocking pool; the poller thread goes on
/// meanwhile), then fails or panics if asked to.
#[derive(Serialize, Deserialize)]
struct Nap {
    ms: u64,
    blocking: bool,
    fail: bool,
    panic: bool,
}

static ENDED: AtomicUsize = AtomicUsize::new(0); // calls dropped, finished or not
static WOKE: AtomicUsize = AtomicUsize::new(0); // calls that slept their whole nap

struct Ends;
impl Drop for Ends {
    fn drop(&mut self) {
        ENDED.fetch_add(1, Ordering::SeqCst);
    }
}

struct Sleepy;

impl RequestHandler for Sleepy {
    type Req = Nap;
    type Resp = u64;
    type Error = String;

    async fn call(&self, nap: Nap, cx: &RequestCx) -> Result<u64, String> {
        let _ends = Ends;
        if nap.blocking {
            let ms = nap.ms;
            let slept = cx.spawn_blocking(move || std::thread::sleep(Duration::from_millis(ms)));
            slept.await.map_err(|e| e.to_string())?;
        } else {
            actix::clock::sleep(Duration::from_millis(nap.ms)).await;
        }
        WOKE.fetch_add(1, Ordering::SeqCst);
        assert!(!nap.panic, "asked to panic after {} ms", nap.ms);
        if nap.fail {
            return Err(format!("failed after {} ms", nap.ms));
        }
        Ok(nap.ms)
    }
}

async fn nap(
    conn: &ClientConnection,
    ms: u64,
    fail: bool,
    panic: bool,
) -> Result<u64, CallError<String>> {
    let blocking = false;
    conn.call_typed(&Nap {
        ms,
        blocking,
        fail,
        panic,
    })
    .await
}

#[test]
fn handler_errors_refusals_limits_and_a_close_mid_call() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let sleepy = HandlerService::new(Sleepy).max_in_flight(2).max_waiting(1);
        let server = Server::builder()
            .listen(test_addr(), None)
            .service("sleepy", sleepy)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let conn = client.connect(addr, "sleepy").await.expect("connect");

        assert_eq!(
            nap(&conn, 0, false, false)
                .await
                .expect("answered in its own turn"),
            0
        );
        assert_eq!(
            nap(&conn, 20, false, false)
                .await
                .expect("answered after a wake-up"),
            20
        );
        let on_the_pool = Nap {
            ms: 30,
            blocking: true,
            fail: false,
            panic: false,
        };
        let slept: Result<u64, CallError<String>> = conn.call_typed(&on_the_pool).await;
        assert_eq!(slept.expect("a call awaiting the blocking pool"), 30);
        match nap(&conn, 5, true, false).await {
            Err(CallError::Handler(why)) => assert_eq!(why, "failed after 5 ms"),
            other => panic!("a failing call answered {other:?}"),
        }
        match nap(&conn, 5, false, true).await {
            Err(CallError::Refused(Refusal::Panicked(why))) => {
                assert!(why.contains("asked to panic"), "{why}")
            }
            other => panic!("a panicking call answered {other:?}"),
        }
        let bad = conn
            .request(vec![0xff; 12])
            .await
            .expect("an answer to bad bytes");
        match postcard::from_bytes::<Answer<u64, String>>(&bad) {
            Ok(Answer::Refused(Refusal::BadRequest(_))) => {}
            other => panic!("bytes that are no request answered {other:?}"),
        }

        // Two run, one waits, the other three are refused at once; the connection goes on.
        let six = (0..6).map(|_| nap(&conn, 300, false, false));
        let answers = futures::future::join_all(six).await;
        let ok = answers.iter().filter(|a| matches!(a, Ok(300))).count();
        let busy = answers
            .iter()
            .filter(|a| matches!(a, Err(CallError::Refused(Refusal::Busy { .. }))))
            .count();
        assert_eq!((ok, busy), (3, 3), "{answers:?}");
        assert_eq!(nap(&conn, 1, false, false).await.expect("still serving"), 1);

        // A connection closed mid-call: the call's future is dropped, the server goes on.
        let (ended, woke) = (ENDED.load(Ordering::SeqCst), WOKE.load(Ordering::SeqCst));
        let doomed = client.connect(addr, "sleepy").await.expect("connect");
        let pending = actix::spawn({
            let doomed = doomed.clone();
            async move { nap(&doomed, 5_000, false, false).await }
        });
        actix::clock::sleep(Duration::from_millis(200)).await;
        doomed.close().await;
        assert!(matches!(
            pending.await.expect("task"),
            Err(CallError::Request(_))
        ));
        eventually(
            "the closed connection's call dropped",
            Duration::from_secs(3),
            || async { ENDED.load(Ordering::SeqCst) == ended + 1 },
        )
        .await;
        assert_eq!(
            WOKE.load(Ordering::SeqCst),
            woke,
            "the dropped call never finished its nap"
        );
        assert_eq!(
            nap(&conn, 1, false, false)
                .await
                .expect("the other connection serves"),
            1
        );

        conn.close().await;
        wait_idle(
            &server,
            "every connection released",
            Duration::from_secs(10),
        )
        .await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}

/// Issue 45: the store is bounded. A Put past its bytes is refused with
/// `KvError::StoreFull`, a value past its largest with `ValueTooLarge`; nothing is
/// replaced, the connection and the service go on, and a Delete makes room again.
#[test]
fn kv_a_put_past_the_stores_bound_is_refused_and_the_service_goes_on() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let limits = KvLimits {
            max_bytes: 1 << 20,
            max_value: 600 << 10,
        };
        let server = Server::builder()
            .listen(test_addr(), None)
            .handler("kv", Kv::with_limits(limits))
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let client = Client::start(NodeConfig::default()).expect("client");
        let kv = KvClient(client.connect(addr, "kv").await.expect("connect"));
        assert!(!kv.put("a", vec![1; 500 << 10]).await.expect("fits"));
        assert!(!kv.put("b", vec![2; 500 << 10]).await.expect("fits"));
        match kv.put("c", vec![3; 100 << 10]).await {
            Err(CallError::Handler(KvError::StoreFull { limit, .. })) => {
                assert_eq!(limit, 1 << 20)
            }
            other => panic!("a put past the bound answered {other:?}"),
        }
        assert!(matches!(
            kv.put("d", vec![4; 700 << 10]).await,
            Err(CallError::Handler(KvError::ValueTooLarge { .. }))
        ));
        assert!(matches!(
            kv.get("c").await,
            Err(CallError::Handler(KvError::NotFound))
        ));
        assert_eq!(kv.get("a").await.expect("still served").len(), 500 << 10);
        kv.delete("b").await.expect("delete");
        assert!(!kv.put("c", vec![3; 100 << 10]).await.expect("room again"));
        kv.0.close().await;
        wait_idle(
            &server,
            "the kv connection released",
            Duration::from_secs(10),
        )
        .await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}
