//! The `lambda` service under real verbs: a module and a native lambda give the same
//! checksum of an input the server READs from the client; a trap, an infinite loop (out
//! of fuel, and past its wall clock), a memory bomb, an invalid module and other bad
//! requests each come back as their own error within the limits, while another client's
//! invocations keep being served; a region without the access it needs costs only its
//! own connection; the module cache is bounded, and one client loading past its quota
//! evicts its own modules, never another client's.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdmactor::runtime::{Client, ClientConnection};
use rdmactor::verbs::{Access, MemoryRegion};
use rdmactor_services::lambda::{
    self, checksum_native, CallError, FailureKind, Invocation, LambdaConfig, LambdaRef,
    LambdaService, Limits, ModuleHash, NativeLambdas, Sandbox, SandboxConfig,
};
use rdmactor_tests::{
    actix_run, assert_released, eventually, pattern, rdma_context, resource_counts, serve,
    wait_idle,
};

fn module(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../examples/lambdas/{name}.wat",
        env!("CARGO_MANIFEST_DIR")
    );
    wat::parse_file(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The server's caps: generous for the examples, far below what a bomb wants.
fn cap() -> Limits {
    Limits {
        fuel: 200_000_000,
        max_memory_bytes: 16 << 20,
        wall_clock: Duration::from_secs(10),
        max_output: 1 << 20,
    }
}

fn service() -> (LambdaService, Arc<Sandbox>) {
    let sandbox = Arc::new(Sandbox::new());
    let natives = NativeLambdas::new();
    natives.register("checksum", Arc::new(|i: &[u8]| Ok(checksum_native(i))));
    let config = LambdaConfig {
        cap: cap(),
        ..LambdaConfig::default()
    };
    (
        LambdaService::new(sandbox.clone(), Arc::new(natives), config),
        sandbox,
    )
}

/// A client's two regions: input (REMOTE_READ) and output (REMOTE_WRITE).
struct Regions {
    input: MemoryRegion,
    output: MemoryRegion,
}

impl Regions {
    fn new(client: &Client, input: &[u8], output_len: usize) -> Regions {
        let mut i = client
            .register(input.len().max(1), Access::REMOTE_READ)
            .unwrap();
        i.as_mut_slice()[..input.len()].copy_from_slice(input);
        Regions {
            input: i,
            output: client.register(output_len, Access::REMOTE_WRITE).unwrap(),
        }
    }

    fn invocation(
        &self,
        lambda: LambdaRef,
        input_len: usize,
        limits: Option<Limits>,
    ) -> Invocation {
        Invocation {
            lambda,
            input: self.input.remote(),
            input_len: input_len as u64,
            output: self.output.remote(),
            limits,
        }
    }

    fn output(&self, len: u64) -> &[u8] {
        &self.output.as_slice()[..len as usize]
    }
}

/// Runs `inv` and checks it fails with `kind` within `within`.
async fn expect_failure(
    conn: &ClientConnection,
    what: &str,
    inv: &Invocation,
    kind: FailureKind,
    within: Duration,
) {
    let start = Instant::now();
    let result = lambda::invoke(conn, inv).await;
    let elapsed = start.elapsed();
    match result {
        Err(CallError::Failed(f)) if f.kind == kind => {
            println!("{what}: {kind:?} after {elapsed:.1?} ({})", f.message)
        }
        other => panic!("{what}: expected {kind:?}, got {other:?}"),
    }
    assert!(elapsed < within, "{what}: {elapsed:?}, limit {within:?}");
}

/// Invokes `inv` on `conn`, which must fail [`FailureKind::Busy`] with a message naming
/// each of `names`.
async fn expect_busy(conn: &ClientConnection, inv: &Invocation, what: &str, names: &[&str]) {
    match lambda::invoke(conn, inv).await {
        Err(CallError::Failed(f)) if f.kind == FailureKind::Busy => {
            println!("{what}: {}", f.message);
            for name in names {
                assert!(f.message.contains(name), "{what}: {}", f.message);
            }
        }
        other => panic!("{what}: expected Busy, got {other:?}"),
    }
}

/// A lambda server whose pool has room for 2 MiB beyond its receive buffers, offering
/// `natives` and the native `checksum` (what [`served_after_a_refusal`] runs), and a
/// client connected to it.
async fn with_2_mib_of_room(
    natives: NativeLambdas,
    config: LambdaConfig,
) -> (rdmactor::runtime::Server, Client, ClientConnection) {
    natives.register("checksum", Arc::new(|i: &[u8]| Ok(checksum_native(i))));
    let service = LambdaService::new(Arc::new(Sandbox::new()), Arc::new(natives), config);
    let (server, addr, client) =
        rdmactor_tests::serve_with(rdmactor_tests::capped_pool(2 << 20), "lambda", service);
    let conn = client.connect(addr, "lambda").await.expect("connect");
    (server, client, conn)
}

/// After an invocation refused at the pool's cap: the same connection computes `input`'s
/// checksum right, nothing stays charged to the cap, and everything closes.
async fn served_after_a_refusal(
    server: rdmactor::runtime::Server,
    client: Client,
    conn: ClientConnection,
    input: &[u8],
) {
    let regions = Regions::new(&client, input, 4096);
    let sum = regions.invocation(LambdaRef::Native("checksum".into()), input.len(), None);
    let len = lambda::invoke(&conn, &sum)
        .await
        .expect("the same connection still serves");
    assert_eq!(regions.output(len), checksum_native(input));
    assert_eq!(
        server.stats().await.pool.charged_bytes,
        0,
        "nothing stays charged"
    );
    conn.close().await;
    drop(regions);
    wait_idle(&server, "the connection to close", Duration::from_secs(20)).await;
    client.shutdown().await;
    server.shutdown().await;
}

#[test]
fn an_output_beyond_the_pools_cap_fails_its_invocation_busy_and_the_connection_stays() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let natives = NativeLambdas::new();
        // 4 MiB out of 4 KiB in: more than the pool's largest class, so the output is
        // registered for the WRITE, and charged to the cap.
        natives.register("grow", Arc::new(|_: &[u8]| Ok(vec![7; 4 << 20])));
        let config = LambdaConfig {
            cap: Limits {
                max_output: 8 << 20,
                ..cap()
            },
            ..LambdaConfig::default()
        };
        let (server, client, conn) = with_2_mib_of_room(natives, config).await;
        let input = pattern(4096, 9);
        let regions = Regions::new(&client, &input, 4 << 20);
        let grow = regions.invocation(LambdaRef::Native("grow".into()), input.len(), None);
        expect_busy(
            &conn,
            &grow,
            "4 MiB output through 2 MiB of room",
            &["no memory for the output", "pool's cap"],
        )
        .await;
        drop(regions);
        served_after_a_refusal(server, client, conn, &input).await;
    });
    assert_released(&base);
}

#[test]
fn an_input_beyond_the_pools_cap_fails_its_invocation_busy_and_the_connection_stays() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        // Chunks of 1.5 MiB, larger than the pool's largest class: each is registered
        // for its READ and charged to the cap, and four are asked for at once. In 2 MiB
        // of room the first fits, the second does not, while the first is still READ.
        let config = LambdaConfig {
            read_chunk: 3 << 19,
            reads_in_flight: 4,
            ..LambdaConfig::default()
        };
        let (server, client, conn) = with_2_mib_of_room(NativeLambdas::new(), config).await;
        let big = pattern(6 << 20, 5);
        let regions = Regions::new(&client, &big, 4096);
        let sum = regions.invocation(LambdaRef::Native("checksum".into()), big.len(), None);
        expect_busy(
            &conn,
            &sum,
            "6 MiB input in 1.5 MiB chunks through 2 MiB of room",
            &["no memory for the input", "pool's cap"],
        )
        .await;
        drop(regions);
        // One chunk's worth is served on the same connection.
        served_after_a_refusal(server, client, conn, &pattern(1 << 20, 6)).await;
    });
    assert_released(&base);
}

#[test]
fn results_are_correct_and_bad_lambdas_fail_alone() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let (service, sandbox) = service();
        let (server, addr, client) = serve("lambda", service);
        let good = client.connect(addr, "lambda").await.expect("connect");
        let bad = client.connect(addr, "lambda").await.expect("connect");

        // Correct results: the module and the native lambda agree, over 1 MiB.
        let input = pattern(1 << 20, 3);
        let big = Regions::new(&client, &input, 4096);
        let checksum = lambda::upload(&good, &module("checksum")).await.unwrap();
        let start = Instant::now();
        let len = lambda::invoke(
            &good,
            &big.invocation(LambdaRef::Module(checksum), input.len(), None),
        )
        .await
        .unwrap();
        let sandboxed = start.elapsed();
        assert_eq!(big.output(len), checksum_native(&input));
        let start = Instant::now();
        let len = lambda::invoke(
            &good,
            &big.invocation(LambdaRef::Native("checksum".into()), input.len(), None),
        )
        .await
        .unwrap();
        println!(
            "checksum of 1 MiB over RDMA: sandbox {sandboxed:.1?}, native {:.1?}",
            start.elapsed()
        );
        assert_eq!(big.output(len), checksum_native(&input));
        let upper = lambda::upload(&good, &module("echo_upper")).await.unwrap();
        let text = Regions::new(&client, b"Hello, RDMA world!", 64);
        let len = lambda::invoke(&good, &text.invocation(LambdaRef::Module(upper), 18, None))
            .await
            .unwrap();
        assert_eq!(text.output(len), b"HELLO, RDMA WORLD!");

        // How fast this build burns fuel here, to size a loop that outlives its clock.
        let looping = lambda::upload(&bad, &module("infinite_loop"))
            .await
            .unwrap();
        let small = Regions::new(&client, b"x", 4096);
        let fuel = 20_000_000;
        let start = Instant::now();
        let out_of_fuel = small.invocation(
            LambdaRef::Module(looping),
            1,
            Some(Limits { fuel, ..cap() }),
        );
        expect_failure(
            &bad,
            "infinite loop, little fuel",
            &out_of_fuel,
            FailureKind::OutOfFuel,
            Duration::from_secs(30),
        )
        .await;
        let fuel_per_second = fuel as f64 / start.elapsed().as_secs_f64();

        // Another client keeps invoking while the bad one misbehaves.
        let chunk = pattern(64 << 10, 9);
        let steady_regions = Regions::new(&client, &chunk, 4096);
        let misbehaving = Cell::new(true);
        let steady = async {
            let mut served = 0u32;
            let mut slowest = Duration::ZERO;
            loop {
                let lambda = if served % 2 == 0 {
                    LambdaRef::Module(checksum)
                } else {
                    LambdaRef::Native("checksum".into())
                };
                let start = Instant::now();
                let len =
                    lambda::invoke(&good, &steady_regions.invocation(lambda, chunk.len(), None))
                        .await
                        .expect("the well-behaved client is served");
                slowest = slowest.max(start.elapsed());
                assert_eq!(steady_regions.output(len), checksum_native(&chunk));
                served += 1;
                if !misbehaving.get() {
                    return (served, slowest);
                }
            }
        };
        let misbehave = async {
            let wall_clock = Duration::from_millis(300);
            let slack = Duration::from_secs(3);
            let timeout = small.invocation(
                LambdaRef::Module(looping),
                1,
                Some(Limits {
                    // About two seconds of work: the clock, not the fuel, stops it.
                    fuel: (fuel_per_second * 2.0) as u64,
                    wall_clock,
                    ..cap()
                }),
            );
            expect_failure(
                &bad,
                "infinite loop",
                &timeout,
                FailureKind::Timeout,
                wall_clock + slack,
            )
            .await;

            let trap = lambda::upload(&bad, &module("trap")).await.unwrap();
            let inv = small.invocation(LambdaRef::Module(trap), 1, None);
            expect_failure(&bad, "trap", &inv, FailureKind::Trap, slack).await;

            let bomb = lambda::upload(&bad, &module("memory_bomb")).await.unwrap();
            let inv = small.invocation(
                LambdaRef::Module(bomb),
                1,
                Some(Limits {
                    max_memory_bytes: 8 << 20,
                    ..cap()
                }),
            );
            expect_failure(&bad, "memory bomb", &inv, FailureKind::MemoryLimit, slack).await;
            // Asking for more memory than the server allows gets the server's cap.
            let inv = small.invocation(
                LambdaRef::Module(bomb),
                1,
                Some(Limits {
                    max_memory_bytes: 1 << 30,
                    ..cap()
                }),
            );
            expect_failure(&bad, "capped bomb", &inv, FailureKind::MemoryLimit, slack).await;

            let start = Instant::now();
            match lambda::upload(&bad, b"\0asm but not really").await {
                Err(e) if e.kind() == Some(FailureKind::InvalidModule) => {
                    println!("invalid module: refused after {:.1?}", start.elapsed())
                }
                other => panic!("invalid module: {other:?}"),
            }
            let inv = small.invocation(LambdaRef::Native("nope".into()), 1, None);
            expect_failure(
                &bad,
                "unknown native",
                &inv,
                FailureKind::UnknownLambda,
                slack,
            )
            .await;
            let inv = small.invocation(LambdaRef::Module(ModuleHash::from_bytes([7; 32])), 1, None);
            expect_failure(
                &bad,
                "unknown module",
                &inv,
                FailureKind::UnknownLambda,
                slack,
            )
            .await;
            let long = Regions::new(&client, &[b'a'; 100], 64);
            let inv = long.invocation(LambdaRef::Module(upper), 100, None);
            expect_failure(
                &bad,
                "output too large",
                &inv,
                FailureKind::OutputTooLarge,
                slack,
            )
            .await;
            let mut inv = small.invocation(LambdaRef::Module(upper), 1, None);
            inv.input_len = 2; // more than the 1-byte input region holds
            expect_failure(
                &bad,
                "input past its region",
                &inv,
                FailureKind::BadRequest,
                slack,
            )
            .await;
            misbehaving.set(false);
        };
        let ((served, slowest), ()) = futures::join!(steady, misbehave);
        println!("the other client was served {served} times meanwhile, slowest {slowest:.1?}");
        assert!(served >= 3, "only {served} invocations of the other client");

        // The misbehaving client's connection still works.
        let len = lambda::invoke(&bad, &text.invocation(LambdaRef::Module(upper), 5, None))
            .await
            .unwrap();
        assert_eq!(text.output(len), b"HELLO");

        good.close().await;
        bad.close().await;
        drop((big, text, small, steady_regions));
        wait_idle(&server, "connections to close", Duration::from_secs(20)).await;
        eventually(
            "timed-out workers to burn their fuel",
            Duration::from_secs(60),
            || async { sandbox.running_workers() == 0 },
        )
        .await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}

#[test]
fn a_region_without_access_costs_only_its_connection() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let (service, _sandbox) = service();
        let (server, addr, client) = serve("lambda", service);
        let careless = client.connect(addr, "lambda").await.expect("connect");
        let other = client.connect(addr, "lambda").await.expect("connect");

        // Input registered for local use only: the server's READ is refused.
        let input = client.register(64, Access::LOCAL_WRITE).unwrap();
        let output = client.register(64, Access::REMOTE_WRITE).unwrap();
        let inv = Invocation {
            lambda: LambdaRef::Native("checksum".into()),
            input: input.remote(),
            input_len: 64,
            output: output.remote(),
            limits: None,
        };
        match lambda::invoke(&careless, &inv).await {
            Err(CallError::Request(e)) => println!("careless client: {e}"),
            other => panic!("expected the connection to close, got {other:?}"),
        }
        // Output without REMOTE_WRITE: the server's WRITE is refused.
        let readable = client.register(64, Access::REMOTE_READ).unwrap();
        let inv = Invocation {
            input: readable.remote(),
            output: readable.remote(),
            ..inv
        };
        match lambda::invoke(&other, &inv).await {
            Err(CallError::Request(e)) => println!("output without REMOTE_WRITE: {e}"),
            other => panic!("expected the connection to close, got {other:?}"),
        }
        let third = client.connect(addr, "lambda").await.expect("connect");
        let inv = Invocation {
            output: output.remote(),
            ..inv
        };
        assert_eq!(lambda::invoke(&third, &inv).await.unwrap(), 8);
        assert_eq!(&output.as_slice()[..8], checksum_native(&[0; 64]));

        careless.close().await;
        other.close().await;
        third.close().await;
        drop((input, output, readable));
        wait_idle(&server, "connections to close", Duration::from_secs(20)).await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}

/// Security issue item 6: 100 infinite-loop invocations asking for `wall_clock_ms = 0`
/// (and the default cap's 1e9 fuel) used to time out at once while each worker burned
/// on, so the 64 workers filled up and every other client got `Busy`. With the floor,
/// and timed-out work stopped for real, the other client is still served and no worker
/// is left running.
#[test]
fn a_hundred_instant_timeouts_do_not_starve_another_client() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let sandbox = Arc::new(Sandbox::new());
        let natives = Arc::new(NativeLambdas::new());
        let service = LambdaService::new(sandbox.clone(), natives, LambdaConfig::default());
        let (server, addr, client) = serve("lambda", service);
        let hostile = client.connect(addr, "lambda").await.expect("connect");
        let other = client.connect(addr, "lambda").await.expect("connect");
        let looping = lambda::upload(&hostile, &module("infinite_loop"))
            .await
            .unwrap();
        let small = Regions::new(&client, b"x", 64);
        let zero = Limits {
            wall_clock: Duration::ZERO,
            ..Limits::default()
        };
        let inv = small.invocation(LambdaRef::Module(looping), 1, Some(zero));
        let (mut timeouts, mut busy) = (0, 0);
        // Four at a time, the per-connection limit.
        for _ in 0..25 {
            let calls = (0..4).map(|_| lambda::invoke(&hostile, &inv));
            for r in futures::future::join_all(calls).await {
                match r {
                    Err(CallError::Failed(f)) if f.kind == FailureKind::Timeout => timeouts += 1,
                    Err(CallError::Failed(f)) if f.kind == FailureKind::Busy => busy += 1,
                    other => panic!("looping invocation: {other:?}"),
                }
            }
        }
        println!("100 instant timeouts: {timeouts} timed out, {busy} busy");
        assert!(timeouts > 0);
        let checksum = lambda::upload(&other, &module("checksum")).await.unwrap();
        let input = pattern(4096, 5);
        let regions = Regions::new(&client, &input, 64);
        let len = lambda::invoke(
            &other,
            &regions.invocation(LambdaRef::Module(checksum), input.len(), None),
        )
        .await
        .expect("the other client is served, not Busy");
        assert_eq!(regions.output(len), checksum_native(&input));
        assert_eq!(sandbox.running_workers(), 0, "no timed-out worker burns on");
        hostile.close().await;
        other.close().await;
        drop((small, regions));
        wait_idle(&server, "connections to close", Duration::from_secs(20)).await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}

/// The module cache is bounded: with room for two modules, a third upload evicts the
/// least recently used one (an invocation counts as a use), which is then unknown until
/// uploaded again, and compiled again. Every module still answers correctly.
#[test]
fn the_module_cache_evicts_the_least_recently_used() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let sandbox = Arc::new(Sandbox::with_config(SandboxConfig {
            max_cached_modules: 2,
            ..SandboxConfig::default()
        }));
        let service = LambdaService::new(
            sandbox.clone(),
            Arc::new(NativeLambdas::new()),
            LambdaConfig::default(),
        );
        let cache = service.cache();
        let (server, addr, client) = serve("lambda", service);
        let conn = client.connect(addr, "lambda").await.expect("connect");
        let text = Regions::new(&client, b"evict me", 64);

        let checksum = lambda::upload(&conn, &module("checksum")).await.unwrap();
        let upper = lambda::upload(&conn, &module("echo_upper")).await.unwrap();
        let len = lambda::invoke(
            &conn,
            &text.invocation(LambdaRef::Module(checksum), 8, None),
        )
        .await
        .unwrap();
        assert_eq!(text.output(len), checksum_native(b"evict me"));
        // echo_upper is now the least recently used: the third module evicts it.
        let trap = lambda::upload(&conn, &module("trap")).await.unwrap();
        assert_eq!((cache.cached_modules().await, sandbox.evictions()), (2, 1));
        let inv = text.invocation(LambdaRef::Module(upper), 8, None);
        expect_failure(
            &conn,
            "evicted module",
            &inv,
            FailureKind::UnknownLambda,
            Duration::from_secs(5),
        )
        .await;
        let inv = text.invocation(LambdaRef::Module(trap), 8, None);
        expect_failure(
            &conn,
            "trap",
            &inv,
            FailureKind::Trap,
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(sandbox.compilations(), 3);

        // Uploaded again: compiled again (evicting checksum), and it works.
        assert_eq!(
            lambda::upload(&conn, &module("echo_upper")).await.unwrap(),
            upper
        );
        assert_eq!(sandbox.compilations(), 4);
        let len = lambda::invoke(&conn, &text.invocation(LambdaRef::Module(upper), 8, None))
            .await
            .unwrap();
        assert_eq!(text.output(len), b"EVICT ME");
        assert!(!cache.contains(&checksum).await);

        conn.close().await;
        drop(text);
        wait_idle(&server, "connections to close", Duration::from_secs(20)).await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}

/// A lambda over 64 MiB of input: the server READs it in 1 MiB chunks (pooled buffers,
/// a few in flight), the compiled module and the native lambda both checksum it, and
/// both results match the checksum computed here.
#[test]
fn a_lambda_over_64_mib_of_input() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let sandbox = Arc::new(Sandbox::new());
        let natives = NativeLambdas::new();
        natives.register("checksum", Arc::new(|i: &[u8]| Ok(checksum_native(i))));
        let config = LambdaConfig {
            cap: Limits {
                fuel: 4_000_000_000,
                // The input plus the module's first KiB and its output.
                max_memory_bytes: 65 << 20,
                wall_clock: Duration::from_secs(60),
                max_output: 4096,
            },
            max_input: 64 << 20,
            ..LambdaConfig::default()
        };
        let service = LambdaService::new(sandbox, Arc::new(natives), config);
        let (server, addr, client) = serve("lambda", service);
        let conn = client.connect(addr, "lambda").await.expect("connect");
        let input = pattern(64 << 20, 11);
        let expected = checksum_native(&input);
        let regions = Regions::new(&client, &input, 4096);
        let checksum = lambda::upload(&conn, &module("checksum")).await.unwrap();
        for lambda in [
            LambdaRef::Module(checksum),
            LambdaRef::Native("checksum".into()),
        ] {
            let start = Instant::now();
            let len = lambda::invoke(
                &conn,
                &regions.invocation(lambda.clone(), input.len(), None),
            )
            .await
            .unwrap_or_else(|e| panic!("{lambda:?}: {e}"));
            println!("{lambda:?} over 64 MiB: {:.1?}", start.elapsed());
            assert_eq!(regions.output(len), expected, "{lambda:?}");
        }
        conn.close().await;
        drop(regions);
        wait_idle(&server, "connections to close", Duration::from_secs(20)).await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}

/// Per-client quotas of the module cache (2 modules per connection, 4 in all): client A
/// loads two modules, client B loads three. B's third load lets go of B's own least
/// recently used module, not A's (the cache's old, shared LRU would have evicted A's
/// oldest): A's modules still run without being uploaded again, and uploading one again
/// compiles nothing; B's oldest is unknown. When A's connection closes, its modules
/// leave the cache.
#[test]
fn one_client_past_its_quota_evicts_its_own_modules() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let sandbox = Arc::new(Sandbox::with_config(SandboxConfig {
            max_cached_modules: 4,
            max_modules_per_client: 2,
            ..SandboxConfig::default()
        }));
        let config = LambdaConfig {
            cap: cap(),
            ..LambdaConfig::default()
        };
        let service = LambdaService::new(sandbox.clone(), Arc::new(NativeLambdas::new()), config);
        let cache = service.cache();
        let (server, addr, client) = serve("lambda", service);
        let a = client.connect(addr, "lambda").await.expect("connect a");
        let b = client.connect(addr, "lambda").await.expect("connect b");
        let text = Regions::new(&client, b"mine too", 64);

        let checksum = lambda::upload(&a, &module("checksum")).await.unwrap();
        let upper = lambda::upload(&a, &module("echo_upper")).await.unwrap();
        let trap = lambda::upload(&b, &module("trap")).await.unwrap();
        let bomb = lambda::upload(&b, &module("memory_bomb")).await.unwrap();
        let looping = lambda::upload(&b, &module("infinite_loop")).await.unwrap();
        assert_eq!(
            (
                cache.cached_modules().await,
                sandbox.evictions(),
                sandbox.compilations()
            ),
            (4, 1, 5)
        );
        assert!(cache.contains(&checksum).await && cache.contains(&upper).await);
        assert!(!cache.contains(&trap).await);
        assert!(cache.contains(&bomb).await && cache.contains(&looping).await);

        // A's modules are still cached: they run, and uploading one again is a cache hit.
        let len = lambda::invoke(&a, &text.invocation(LambdaRef::Module(checksum), 8, None))
            .await
            .unwrap();
        assert_eq!(text.output(len), checksum_native(b"mine too"));
        let len = lambda::invoke(&a, &text.invocation(LambdaRef::Module(upper), 8, None))
            .await
            .unwrap();
        assert_eq!(text.output(len), b"MINE TOO");
        assert_eq!(
            lambda::upload(&a, &module("checksum")).await.unwrap(),
            checksum
        );
        assert_eq!(sandbox.compilations(), 5);
        // B's oldest is gone; its newer ones answer.
        let inv = text.invocation(LambdaRef::Module(trap), 8, None);
        expect_failure(
            &b,
            "B's evicted module",
            &inv,
            FailureKind::UnknownLambda,
            Duration::from_secs(5),
        )
        .await;
        let inv = text.invocation(LambdaRef::Module(bomb), 8, None);
        expect_failure(
            &b,
            "B's memory bomb",
            &inv,
            FailureKind::MemoryLimit,
            Duration::from_secs(10),
        )
        .await;
        // A third client finds the cache full of A's and B's modules: refused, with a
        // reason, and nobody's module is evicted for it.
        let c = client.connect(addr, "lambda").await.expect("connect c");
        match lambda::upload(&c, &module("trap")).await {
            Err(CallError::Failed(f)) if f.kind == FailureKind::CacheFull => {
                println!("third client: {}", f.message);
                assert!(f.message.contains("other clients"), "{}", f.message);
            }
            other => panic!("third client: expected CacheFull, got {other:?}"),
        }
        assert_eq!(
            (cache.cached_modules().await, sandbox.compilations()),
            (4, 6)
        );

        // A's holds end with its connection: its modules leave, B's stay.
        a.close().await;
        eventually(
            "A's modules to leave the cache",
            Duration::from_secs(20),
            || async { cache.cached_modules().await == 2 },
        )
        .await;
        assert!(!cache.contains(&checksum).await && !cache.contains(&upper).await);
        assert!(cache.contains(&bomb).await && cache.contains(&looping).await);
        // Now there is room for c.
        let trap = lambda::upload(&c, &module("trap")).await.unwrap();
        let inv = text.invocation(LambdaRef::Module(trap), 8, None);
        expect_failure(&c, "trap", &inv, FailureKind::Trap, Duration::from_secs(5)).await;

        b.close().await;
        c.close().await;
        drop(text);
        wait_idle(&server, "connections to close", Duration::from_secs(20)).await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_released(&base);
}
