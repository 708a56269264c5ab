//! The `lambda` service served and called over the loopback transport through the whole
//! runtime, natively: the server READs the client's input and WRITEs the output into
//! the client's regions, modules run in the Wasm sandbox, bad lambdas fail alone, and a
//! region without the access a request needs costs only its connection. The real-verbs
//! runs (timeouts, quotas, the pool's cap, 64 MiB inputs) are in `tests/verbs/lambda.rs`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rdmactor::memory::PoolConfig;
use rdmactor::runtime::{Client, ClientConnection, NodeConfig, Server};
use rdmactor::transport::loopback::{Fabric, Loopback, Mr};
use rdmactor::verbs::Access;
use rdmactor_services::lambda::{
    self, checksum_native, CallError, FailureKind, Invocation, LambdaConfig, LambdaRef,
    LambdaService, Limits, NativeLambdas, Sandbox,
};
use rdmactor_testkit::pattern;

const AT: SocketAddr = SocketAddr::new(
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1)),
    7400,
);

fn module(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../examples/lambdas/{name}.wat",
        env!("CARGO_MANIFEST_DIR")
    );
    wat::parse_file(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn cap() -> Limits {
    Limits {
        fuel: 200_000_000,
        max_memory_bytes: 16 << 20,
        wall_clock: Duration::from_secs(20),
        max_output: 1 << 20,
    }
}

/// A server of `lambda` (with the native `checksum`) on `fabric`, and a client.
fn serve(fabric: &Fabric) -> (Server<Loopback>, Client<Loopback>) {
    serve_with(fabric, NodeConfig::default())
}

/// [`serve`] with the server's `node` configuration.
fn serve_with(fabric: &Fabric, node: NodeConfig) -> (Server<Loopback>, Client<Loopback>) {
    let natives = NativeLambdas::new();
    natives.register("checksum", Arc::new(|i: &[u8]| Ok(checksum_native(i))));
    let config = LambdaConfig {
        cap: cap(),
        ..LambdaConfig::default()
    };
    let service = LambdaService::new(Arc::new(Sandbox::new()), Arc::new(natives), config);
    let server = Server::over(Loopback)
        .config(node)
        .domain(fabric.device("server"))
        .listen(AT, None)
        .service("lambda", service)
        .start()
        .expect("server");
    let client = Client::<Loopback>::on(fabric.device("client"), NodeConfig::default()).unwrap();
    (server, client)
}

/// The client's input (remote READ) and output (remote WRITE) regions.
struct Regions {
    input: Mr,
    output: Mr,
}

impl Regions {
    fn new(client: &Client<Loopback>, input: &[u8], output_len: usize) -> Regions {
        let mut i = client
            .register(input.len().max(1), Access::REMOTE_READ)
            .unwrap();
        i.write(0, input).unwrap();
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

    fn output(&self, len: u64) -> Vec<u8> {
        let mut out = vec![0; len as usize];
        self.output.read(0, &mut out).unwrap();
        out
    }
}

async fn expect_failure(conn: &ClientConnection<Loopback>, inv: &Invocation, kind: FailureKind) {
    match lambda::invoke(conn, inv).await {
        Err(CallError::Failed(f)) if f.kind == kind => {}
        other => panic!("expected {kind:?}, got {other:?}"),
    }
}

#[test]
fn results_equal_native_ones_and_bad_lambdas_fail_alone() {
    actix::System::new().block_on(async {
        let fabric = Fabric::default();
        let (server, client) = serve(&fabric);
        let good = client.connect(AT, "lambda").await.unwrap();
        let bad = client.connect(AT, "lambda").await.unwrap();

        // 3 MiB of input: READ by the server in chunks, summed by the module and by
        // the native lambda alike.
        let input = pattern(3 << 20, 3);
        let big = Regions::new(&client, &input, 4096);
        let checksum = lambda::upload(&good, &module("checksum")).await.unwrap();
        for lambda in [
            LambdaRef::Module(checksum),
            LambdaRef::Native("checksum".into()),
        ] {
            let len = lambda::invoke(&good, &big.invocation(lambda.clone(), input.len(), None))
                .await
                .unwrap_or_else(|e| panic!("{lambda:?}: {e}"));
            assert_eq!(big.output(len), checksum_native(&input), "{lambda:?}");
        }
        let upper = lambda::upload(&good, &module("echo_upper")).await.unwrap();
        let text = Regions::new(&client, b"Hello, loopback!", 64);
        let len = lambda::invoke(&good, &text.invocation(LambdaRef::Module(upper), 16, None))
            .await
            .unwrap();
        assert_eq!(text.output(len), b"HELLO, LOOPBACK!");

        // Each bad lambda fails with its own kind, and the good connection is served
        // after each.
        let small = Regions::new(&client, b"x", 4096);
        let looping = lambda::upload(&bad, &module("infinite_loop"))
            .await
            .unwrap();
        let little_fuel = Limits {
            fuel: 1_000_000,
            ..cap()
        };
        let trap = lambda::upload(&bad, &module("trap")).await.unwrap();
        let bomb = lambda::upload(&bad, &module("memory_bomb")).await.unwrap();
        let bomb_limits = Limits {
            max_memory_bytes: 8 << 20,
            ..cap()
        };
        let failures = [
            (
                LambdaRef::Module(looping),
                Some(little_fuel),
                FailureKind::OutOfFuel,
            ),
            (LambdaRef::Module(trap), None, FailureKind::Trap),
            (
                LambdaRef::Module(bomb),
                Some(bomb_limits),
                FailureKind::MemoryLimit,
            ),
            (
                LambdaRef::Native("nope".into()),
                None,
                FailureKind::UnknownLambda,
            ),
        ];
        let chunk = pattern(64 << 10, 9);
        let steady = Regions::new(&client, &chunk, 4096);
        for (lambda, limits, kind) in failures {
            expect_failure(&bad, &small.invocation(lambda, 1, limits), kind).await;
            let len = lambda::invoke(
                &good,
                &steady.invocation(LambdaRef::Native("checksum".into()), chunk.len(), None),
            )
            .await
            .unwrap();
            assert_eq!(steady.output(len), checksum_native(&chunk));
        }
        match lambda::upload(&bad, b"\0asm but not really").await {
            Err(e) if e.kind() == Some(FailureKind::InvalidModule) => {}
            other => panic!("invalid module: {other:?}"),
        }
        // An output larger than the region the client gave: refused, nothing written
        // past it.
        let tiny = Regions::new(&client, &input[..100], 4);
        expect_failure(
            &bad,
            &tiny.invocation(LambdaRef::Native("checksum".into()), 100, None),
            FailureKind::OutputTooLarge,
        )
        .await;
        client.shutdown().await;
        server.shutdown().await;
    });
}

#[test]
fn a_region_without_the_access_a_request_needs_costs_only_its_connection() {
    actix::System::new().block_on(async {
        let fabric = Fabric::default();
        let (server, client) = serve(&fabric);
        let careless = client.connect(AT, "lambda").await.unwrap();
        let other = client.connect(AT, "lambda").await.unwrap();
        // Input registered for local use only: the server's READ is a remote access
        // error, and its connection closes.
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
            Err(CallError::Request(_)) => {}
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
            Err(CallError::Request(_)) => {}
            other => panic!("expected the connection to close, got {other:?}"),
        }
        // A third connection with a correct request is served.
        let third = client.connect(AT, "lambda").await.unwrap();
        let inv = Invocation {
            output: output.remote(),
            ..inv
        };
        assert_eq!(lambda::invoke(&third, &inv).await.unwrap(), 8);
        let mut sum = [0; 8];
        output.read(0, &mut sum).unwrap();
        assert_eq!(sum.as_slice(), checksum_native(&[0; 64]));
        let stats = server.stats().await;
        assert_eq!(stats.connections, 1, "only the third connection is left");
        client.shutdown().await;
        server.shutdown().await;
    });
}

/// Issue 45: an invocation's input and output are counted against the server's heap
/// budget before the input is allocated or READ; past it the invocation fails with
/// `HeapFull`, nothing is held, and the connection goes on.
#[test]
fn an_invocation_past_the_heap_budget_is_refused_and_the_connection_goes_on() {
    actix::System::new().block_on(async {
        const BUDGET: usize = 1 << 20;
        let fabric = Fabric::default();
        let node = NodeConfig {
            pool: PoolConfig {
                heap_bytes: BUDGET,
                ..PoolConfig::default()
            },
            ..NodeConfig::default()
        };
        let (server, client) = serve_with(&fabric, node);
        let conn = client.connect(AT, "lambda").await.unwrap();

        let input = pattern(2 * BUDGET, 5);
        let big = Regions::new(&client, &input, 64);
        let refused = big.invocation(LambdaRef::Native("checksum".into()), input.len(), None);
        match lambda::invoke(&conn, &refused).await {
            Err(CallError::Failed(f)) if f.kind == FailureKind::HeapFull => {
                assert!(f.message.contains("heap budget"), "{}", f.message);
            }
            other => panic!("expected HeapFull, got {other:?}"),
        }

        let small = pattern(1000, 6);
        let fits = Regions::new(&client, &small, 64);
        let len = lambda::invoke(
            &conn,
            &fits.invocation(LambdaRef::Native("checksum".into()), small.len(), None),
        )
        .await
        .expect("the connection goes on");
        assert_eq!(fits.output(len), checksum_native(&small));
        assert_eq!(
            server.stats().await.pool.heap_bytes,
            0,
            "every hold came back"
        );
        server.shutdown().await;
    });
}
