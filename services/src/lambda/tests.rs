//! Sandbox tests: the example modules in `examples/lambdas/`, each failure mode, the cache
//! and concurrency.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rdmactor_testkit::pattern;

use super::*;

fn example(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../examples/lambdas/{name}.wat",
        env!("CARGO_MANIFEST_DIR")
    );
    wat::parse_file(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn wasm(text: &str) -> Vec<u8> {
    wat::parse_str(text).unwrap()
}

/// Small limits that still let the examples process 1 MiB.
fn limits() -> Limits {
    Limits {
        fuel: 100_000_000,
        max_memory_bytes: 8 << 20,
        // Generous: debug builds and a loaded CI machine.
        wall_clock: Duration::from_secs(60),
        max_output: 4 << 20,
    }
}

/// Fuel the sandbox burns per second on this machine, measured with the infinite loop.
fn fuel_per_second(sandbox: &Sandbox) -> u64 {
    let hash = sandbox.load(&example("infinite_loop")).unwrap();
    let fuel = 100_000_000;
    let start = Instant::now();
    let outcome = sandbox.run(&hash, b"", &Limits { fuel, ..limits() });
    assert_eq!(outcome, Err(LambdaError::OutOfFuel { fuel }));
    (fuel as f64 / start.elapsed().as_secs_f64()) as u64
}

#[test]
fn checksum_matches_native() {
    let sandbox = Sandbox::new();
    let simd = sandbox.load(&example("checksum")).unwrap();
    let words = sandbox.load(&example("checksum_words")).unwrap();
    let bytewise = sandbox.load(&example("checksum_bytes")).unwrap();
    for input in [
        Vec::new(),
        b"a".to_vec(),
        b"foobar".to_vec(),
        pattern(7, 1),
        // `checksum_words` hashes 32 bytes per loop iteration and `checksum` 128, then
        // the rest byte by byte.
        pattern(31, 1),
        pattern(32, 1),
        pattern(33, 1),
        pattern(127, 1),
        pattern(128, 1),
        pattern(129, 1),
        pattern(1000, 1),
        pattern(1_000_003, 1),
        pattern(65_536, 1),
        pattern(200_000, 1),
        pattern(1 << 20, 1),
    ] {
        for hash in [simd, words, bytewise] {
            let output = sandbox.run(&hash, &input, &limits()).unwrap();
            assert_eq!(
                output,
                checksum_native(&input),
                "input of {} bytes",
                input.len()
            );
        }
    }
}

#[test]
fn echo_upper_uppercases_ascii_only() {
    let sandbox = Sandbox::new();
    let hash = sandbox.load(&example("echo_upper")).unwrap();
    let out = sandbox
        .run(&hash, "Hello, wörld! az{AZ`".as_bytes(), &limits())
        .unwrap();
    assert_eq!(out, "HELLO, WöRLD! AZ{AZ`".as_bytes());
    assert_eq!(sandbox.run(&hash, b"", &limits()).unwrap(), b"");
    let big = pattern(1 << 20, 1);
    assert_eq!(
        sandbox.run(&hash, &big, &limits()).unwrap(),
        big.to_ascii_uppercase()
    );
}

#[test]
fn infinite_loop_runs_out_of_fuel() {
    let sandbox = Sandbox::new();
    let hash = sandbox.load(&example("infinite_loop")).unwrap();
    let limits = Limits {
        fuel: 1_000_000,
        ..limits()
    };
    let start = Instant::now();
    assert_eq!(
        sandbox.run(&hash, b"x", &limits),
        Err(LambdaError::OutOfFuel { fuel: 1_000_000 })
    );
    // Well under a millisecond: the loop is compiled code.
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn infinite_loop_times_out() {
    let sandbox = Sandbox::new();
    let hash = sandbox.load(&example("infinite_loop")).unwrap();
    let wall_clock = Duration::from_millis(100);
    let limits = Limits {
        // About 2 s of work: far more than 100 ms; the epoch stops it at the deadline.
        fuel: 2 * fuel_per_second(&sandbox),
        wall_clock,
        ..limits()
    };
    let start = Instant::now();
    assert_eq!(
        sandbox.run(&hash, b"x", &limits),
        Err(LambdaError::Timeout { limit: wall_clock })
    );
    let elapsed = start.elapsed();
    assert!(
        elapsed >= wall_clock && elapsed < wall_clock * 5,
        "{elapsed:?}"
    );
    // The answer came only once the guest had stopped: no worker burns on.
    assert_eq!(sandbox.running_workers(), 0);
}

/// The epoch ticker sleeps until the earliest deadline of the invocations running: a
/// short deadline that arrives while it sleeps towards a long one must wake it, and the
/// long-running invocation must still be stopped at its own deadline afterwards.
#[test]
fn a_short_deadline_is_kept_while_a_long_one_runs() {
    let sandbox = Arc::new(Sandbox::new());
    let hash = sandbox.load(&example("infinite_loop")).unwrap();
    let fuel = 20 * fuel_per_second(&sandbox);
    let long = Duration::from_millis(1500);
    let short = Duration::from_millis(50);
    let long_run = {
        let sandbox = Arc::clone(&sandbox);
        thread::spawn(move || {
            let start = Instant::now();
            let limits = Limits {
                fuel,
                wall_clock: long,
                ..limits()
            };
            (sandbox.run(&hash, b"x", &limits), start.elapsed())
        })
    };
    // Let the long one start and the ticker go to sleep until its deadline.
    thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    let limits = Limits {
        fuel,
        wall_clock: short,
        ..limits()
    };
    assert_eq!(
        sandbox.run(&hash, b"x", &limits),
        Err(LambdaError::Timeout { limit: short })
    );
    let elapsed = start.elapsed();
    assert!(elapsed >= short && elapsed < long / 2, "{elapsed:?}");
    let (outcome, elapsed) = long_run.join().unwrap();
    assert_eq!(outcome, Err(LambdaError::Timeout { limit: long }));
    assert!(elapsed >= long && elapsed < long * 3, "{elapsed:?}");
    assert_eq!(sandbox.running_workers(), 0);
}

/// Security issue item 6: a timed-out invocation used to keep its worker until its fuel
/// (up to 1e9 units) ran out, so 100 instant timeouts filled every worker and everyone
/// else got `Busy`. Now each one stops at its deadline and frees its worker.
#[test]
fn a_hundred_instant_timeouts_leave_no_worker_behind() {
    let sandbox = Sandbox::with_config(SandboxConfig {
        max_workers: 4,
        ..SandboxConfig::default()
    });
    let looping = sandbox.load(&example("infinite_loop")).unwrap();
    let checksum = sandbox.load(&example("checksum")).unwrap();
    let endless = Limits {
        fuel: 1_000_000_000,
        wall_clock: Duration::ZERO,
        ..limits()
    };
    for i in 0..100 {
        assert!(
            matches!(
                sandbox.run(&looping, b"x", &endless),
                Err(LambdaError::Timeout { .. })
            ),
            "invocation {i}"
        );
        assert_eq!(sandbox.running_workers(), 0, "after invocation {i}");
    }
    let input = pattern(1000, 1);
    assert_eq!(
        sandbox.run(&checksum, &input, &limits()).unwrap(),
        checksum_native(&input)
    );
}

#[test]
fn memory_bomb_hits_the_memory_limit() {
    let sandbox = Sandbox::new();
    let hash = sandbox.load(&example("memory_bomb")).unwrap();
    let start = Instant::now();
    assert_eq!(
        sandbox.run(&hash, b"x", &limits()),
        Err(LambdaError::MemoryLimit { limit: 8 << 20 })
    );
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn memory_bomb_out_of_fuel_before_the_limit() {
    let sandbox = Sandbox::new();
    let hash = sandbox.load(&example("memory_bomb")).unwrap();
    // Each round of the bomb's loop (grow by 1 MiB, drop, branch) costs a few units of
    // fuel; 12 units run out within the first few growths, far below the 8 MiB limit.
    let limits = Limits {
        fuel: 12,
        ..limits()
    };
    assert_eq!(
        sandbox.run(&hash, b"x", &limits),
        Err(LambdaError::OutOfFuel { fuel: 12 })
    );
}

#[test]
fn unreachable_traps() {
    let sandbox = Sandbox::new();
    let hash = sandbox.load(&example("trap")).unwrap();
    match sandbox.run(&hash, b"x", &limits()) {
        Err(LambdaError::Trap(what)) => assert!(what.contains("unreachable"), "{what}"),
        other => panic!("expected a trap, got {other:?}"),
    }
}

#[test]
fn runaway_recursion_traps() {
    let sandbox = Sandbox::new();
    let hash = sandbox
        .load(&wasm(
            r#"(module
                (memory (export "memory") 1)
                (func (export "alloc") (param i32) (result i32) (i32.const 0))
                (func $deep (export "run") (param i32 i32) (result i64)
                  (call $deep (local.get 0) (local.get 1))))"#,
        ))
        .unwrap();
    match sandbox.run(&hash, b"x", &limits()) {
        Err(LambdaError::Trap(what)) => assert!(what.contains("stack"), "{what}"),
        other => panic!("expected a stack overflow, got {other:?}"),
    }
}

#[test]
fn garbage_is_an_invalid_module() {
    let sandbox = Sandbox::new();
    for garbage in [
        &b""[..],
        b"garbage",
        b"\0asm\x01\0\0\0\xff\xff\xff",
        &pattern(4096, 1),
    ] {
        assert!(
            matches!(sandbox.load(garbage), Err(LambdaError::InvalidModule(_))),
            "{garbage:?}"
        );
    }
    assert_eq!(sandbox.cached_modules(), 0);
}

#[test]
fn imports_are_refused() {
    let sandbox = Sandbox::new();
    let err = sandbox
        .load(&wasm(
            r#"(module
                (import "env" "exfiltrate" (func (param i32)))
                (import "env" "mem" (memory 1))
                (func (export "alloc") (param i32) (result i32) (i32.const 0))
                (func (export "run") (param i32 i32) (result i64) (i64.const 0))
                (export "memory" (memory 0)))"#,
        ))
        .unwrap_err();
    assert_eq!(
        err,
        LambdaError::ImportsNotAllowed(vec!["env.exfiltrate".into(), "env.mem".into()])
    );
    assert!(err.to_string().contains("env.exfiltrate"));
}

#[test]
fn missing_or_mistyped_exports_are_refused() {
    let sandbox = Sandbox::new();
    let no_memory = r#"(module
        (func (export "alloc") (param i32) (result i32) (i32.const 0))
        (func (export "run") (param i32 i32) (result i64) (i64.const 0)))"#;
    let no_alloc = r#"(module
        (memory (export "memory") 1)
        (func (export "run") (param i32 i32) (result i64) (i64.const 0)))"#;
    let run_returns_i32 = r#"(module
        (memory (export "memory") 1)
        (func (export "alloc") (param i32) (result i32) (i32.const 0))
        (func (export "run") (param i32 i32) (result i32) (i32.const 0)))"#;
    for (text, name) in [
        (no_memory, "memory"),
        (no_alloc, "alloc"),
        (run_returns_i32, "run"),
    ] {
        match sandbox.load(&wasm(text)) {
            Err(LambdaError::MissingExport(what)) => assert!(what.contains(name), "{what}"),
            other => panic!("expected MissingExport({name}), got {other:?}"),
        }
    }
}

#[test]
fn start_functions_and_memory64_are_refused() {
    let sandbox = Sandbox::new();
    let start = r#"(module
        (memory (export "memory") 1)
        (func $init)
        (start $init)
        (func (export "alloc") (param i32) (result i32) (i32.const 0))
        (func (export "run") (param i32 i32) (result i64) (i64.const 0)))"#;
    let memory64 = r#"(module
        (memory (export "memory") i64 1)
        (func (export "alloc") (param i32) (result i32) (i32.const 0))
        (func (export "run") (param i32 i32) (result i64) (i64.const 0)))"#;
    for text in [start, memory64] {
        assert!(matches!(
            sandbox.load(&wasm(text)),
            Err(LambdaError::InvalidModule(_))
        ));
    }
}

/// A module whose `run` returns the constant `result`.
fn returning(result: i64) -> Vec<u8> {
    wasm(&format!(
        r#"(module
            (memory (export "memory") 1)
            (func (export "alloc") (param i32) (result i32) (i32.const 0))
            (func (export "run") (param i32 i32) (result i64) (i64.const {result})))"#
    ))
}

#[test]
fn guest_results_are_checked() {
    let sandbox = Sandbox::new();
    let run = |result: i64, limits: &Limits| {
        let hash = sandbox.load(&returning(result)).unwrap();
        sandbox.run(&hash, b"abc", limits)
    };
    assert_eq!(run(-7, &limits()), Err(LambdaError::GuestError(-7)));
    // 3 bytes at 0: the input itself.
    assert_eq!(run(3, &limits()), Ok(b"abc".to_vec()));
    // Past the end of the 64 KiB memory.
    assert!(matches!(
        run((65_530 << 32) | 10, &limits()),
        Err(LambdaError::BadResult(_))
    ));
    let small_output = Limits {
        max_output: 2,
        ..limits()
    };
    assert_eq!(
        run(3, &small_output),
        Err(LambdaError::OutputTooLarge { len: 3, limit: 2 })
    );
}

#[test]
fn alloc_out_of_bounds_is_a_bad_result() {
    let sandbox = Sandbox::new();
    let hash = sandbox
        .load(&wasm(
            r#"(module
                (memory (export "memory") 1)
                (func (export "alloc") (param i32) (result i32) (i32.const 65535))
                (func (export "run") (param i32 i32) (result i64) (i64.const 0)))"#,
        ))
        .unwrap();
    assert!(matches!(
        sandbox.run(&hash, b"two", &limits()),
        Err(LambdaError::BadResult(_))
    ));
}

#[test]
fn inputs_and_initial_memory_must_fit_the_memory_limit() {
    let sandbox = Sandbox::new();
    let small = Limits {
        max_memory_bytes: 1 << 20,
        ..limits()
    };
    let checksum = sandbox.load(&example("checksum")).unwrap();
    assert_eq!(
        sandbox.run(&checksum, &pattern(2 << 20, 1), &small),
        Err(LambdaError::InputTooLarge {
            len: 2 << 20,
            limit: 1 << 20
        })
    );
    // The input fits the limit, but not together with the allocator's first 1 KiB.
    assert_eq!(
        sandbox.run(&checksum, &pattern(1 << 20, 1), &small),
        Err(LambdaError::MemoryLimit { limit: 1 << 20 })
    );
    let big_memory = sandbox
        .load(&wasm(
            r#"(module
                (memory (export "memory") 32)
                (func (export "alloc") (param i32) (result i32) (i32.const 0))
                (func (export "run") (param i32 i32) (result i64) (i64.const 0)))"#,
        ))
        .unwrap();
    assert_eq!(
        sandbox.run(&big_memory, b"x", &small),
        Err(LambdaError::MemoryLimit { limit: 1 << 20 })
    );
}

#[test]
fn modules_are_compiled_once() {
    let sandbox = Sandbox::new();
    let bytes = example("checksum");
    let first = sandbox.load(&bytes).unwrap();
    let second = sandbox.load(&bytes).unwrap();
    assert_eq!(first, second);
    assert_eq!(first, ModuleHash::of(&bytes));
    assert_eq!(sandbox.compilations(), 1);
    assert_eq!(sandbox.cached_modules(), 1);
    sandbox.load(&example("echo_upper")).unwrap();
    assert_eq!(sandbox.compilations(), 2);
    assert!(sandbox.unload(&first));
    assert!(!sandbox.contains(&first));
    assert_eq!(
        sandbox.run(&first, b"", &limits()),
        Err(LambdaError::UnknownLambda(first.to_string()))
    );
    sandbox.load(&bytes).unwrap();
    assert_eq!(sandbox.compilations(), 3);
}

#[test]
fn concurrent_loads_of_the_same_module_compile_once() {
    let sandbox = Sandbox::new();
    let bytes = example("echo_upper");
    let hashes: Vec<ModuleHash> = thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| s.spawn(|| sandbox.load(&bytes).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(hashes.iter().all(|h| *h == hashes[0]));
    assert_eq!(sandbox.compilations(), 1);
}

#[test]
fn sandbox_limits_are_enforced() {
    let sandbox = Sandbox::with_config(SandboxConfig {
        max_module_bytes: 1000,
        max_workers: 1,
        ..SandboxConfig::default()
    });
    assert_eq!(
        sandbox.load(&[0; 1001]),
        Err(LambdaError::ModuleTooLarge {
            len: 1001,
            limit: 1000
        })
    );
    let looping = sandbox.load(&example("infinite_loop")).unwrap();
    // The one worker is busy while an invocation runs.
    let limits = Limits {
        fuel: u64::MAX,
        wall_clock: Duration::from_millis(500),
        ..limits()
    };
    thread::scope(|s| {
        let long = s.spawn(|| sandbox.run(&looping, b"", &limits));
        while sandbox.running_workers() == 0 {
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            sandbox.run(&looping, b"", &limits),
            Err(LambdaError::Busy { limit: 1 })
        );
        assert!(matches!(
            long.join().unwrap(),
            Err(LambdaError::Timeout { .. })
        ));
    });
    assert_eq!(sandbox.running_workers(), 0);
}

/// The cache keeps at most `max_cached_modules` modules in at most `max_cached_bytes`,
/// evicting the least recently *used* (a run counts as a use); an evicted module is
/// unknown until uploaded again, and is then compiled again.
#[test]
fn the_module_cache_evicts_the_least_recently_used() {
    let sandbox = Sandbox::with_config(SandboxConfig {
        max_cached_modules: 2,
        ..SandboxConfig::default()
    });
    let checksum = sandbox.load(&example("checksum")).unwrap();
    let upper = sandbox.load(&example("echo_upper")).unwrap();
    // Use checksum, so that echo_upper is the least recently used.
    assert_eq!(
        sandbox.run(&checksum, b"a", &limits()).unwrap(),
        checksum_native(b"a")
    );
    let trap = sandbox.load(&example("trap")).unwrap();
    assert_eq!(sandbox.cached_modules(), 2);
    assert_eq!(sandbox.evictions(), 1);
    assert!(sandbox.contains(&checksum) && sandbox.contains(&trap));
    assert_eq!(
        sandbox.run(&upper, b"a", &limits()),
        Err(LambdaError::UnknownLambda(upper.to_string()))
    );
    assert_eq!(sandbox.compilations(), 3);
    // Uploading it again compiles it again and evicts checksum (trap was loaded later).
    assert_eq!(sandbox.load(&example("echo_upper")).unwrap(), upper);
    assert_eq!(sandbox.compilations(), 4);
    assert!(!sandbox.contains(&checksum));
    assert_eq!(sandbox.run(&upper, b"a", &limits()).unwrap(), b"A");

    // By bytes: a cache that holds one compiled module (but not two) keeps only the
    // newest; a module bigger than the whole cache is refused.
    let one = Sandbox::new();
    one.load(&example("checksum")).unwrap();
    let cost = one.cached_bytes();
    assert!(
        cost > example("checksum").len(),
        "machine code counts: {cost}"
    );
    let small = Sandbox::with_config(SandboxConfig {
        max_cached_bytes: cost * 3 / 2,
        ..SandboxConfig::default()
    });
    let checksum = small.load(&example("checksum")).unwrap();
    let upper = small.load(&example("echo_upper")).unwrap();
    assert!(!small.contains(&checksum) && small.contains(&upper));
    assert!(small.cached_bytes() <= cost * 3 / 2);
    let tiny = Sandbox::with_config(SandboxConfig {
        max_cached_bytes: 100,
        ..SandboxConfig::default()
    });
    assert!(matches!(
        tiny.load(&example("checksum")),
        Err(LambdaError::CacheFull { limit: 100, .. })
    ));
    assert_eq!(tiny.cached_modules(), 0);
}

#[test]
fn concurrent_runs_from_several_threads() {
    let sandbox = Arc::new(Sandbox::new());
    let checksum = sandbox.load(&example("checksum")).unwrap();
    let upper = sandbox.load(&example("echo_upper")).unwrap();
    let trap = sandbox.load(&example("trap")).unwrap();
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let sandbox = Arc::clone(&sandbox);
            thread::spawn(move || {
                for i in 0..10 {
                    let input = pattern(1000 * t + i, 1);
                    assert_eq!(
                        sandbox.run(&checksum, &input, &limits()).unwrap(),
                        checksum_native(&input)
                    );
                    assert_eq!(
                        sandbox.run(&upper, &input, &limits()).unwrap(),
                        input.to_ascii_uppercase()
                    );
                    assert!(matches!(
                        sandbox.run(&trap, &input, &limits()),
                        Err(LambdaError::Trap(_))
                    ));
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    assert_eq!(sandbox.compilations(), 3);
}

#[test]
fn limits_are_capped_per_field() {
    let asked = Limits {
        fuel: 10,
        max_memory_bytes: 1 << 30,
        wall_clock: Duration::from_millis(5),
        max_output: 1 << 30,
    };
    let capped = asked.capped_by(&Limits::default());
    assert_eq!(capped.fuel, 10);
    assert_eq!(capped.max_memory_bytes, Limits::default().max_memory_bytes);
    assert_eq!(capped.wall_clock, Duration::from_millis(5));
    assert_eq!(capped.max_output, Limits::default().max_output);
}

/// Checksum over 1 MiB in the sandbox and natively. Timing only; run with
/// `cargo test --release -p rdmactor-services lambda_timing -- --ignored --nocapture`.
#[test]
#[ignore = "timing, not a check; run in release mode"]
fn lambda_timing_checksum_1mib() {
    let sandbox = Sandbox::new();
    let hash = sandbox.load(&example("checksum")).unwrap();
    let input = pattern(1 << 20, 1);
    let rounds = 20;
    let best = |f: &dyn Fn() -> Vec<u8>| {
        (0..rounds)
            .map(|_| {
                let start = Instant::now();
                std::hint::black_box(f());
                start.elapsed()
            })
            .min()
            .unwrap()
    };
    let wasm = best(&|| sandbox.run(&hash, &input, &Limits::default()).unwrap());
    let native = best(&|| checksum_native(std::hint::black_box(&input)));
    let no_input = best(&|| sandbox.run(&hash, b"", &Limits::default()).unwrap());
    println!(
        "checksum over 1 MiB, best of {rounds}: sandbox {wasm:?} ({:.0} MB/s), native \
         {native:?} ({:.0} MB/s), {:.0}x; empty-input invocation {no_input:?}",
        1.048576e6 / wasm.as_secs_f64() / 1e6,
        1.048576e6 / native.as_secs_f64() / 1e6,
        wasm.as_secs_f64() / native.as_secs_f64()
    );
}

/// A distinct module per `n`: its output is `n` zero bytes.
fn numbered(n: u32) -> Vec<u8> {
    wasm(&format!(
        r#"(module
            (memory (export "memory") 1)
            (func (export "alloc") (param i32) (result i32) (i32.const 0))
            (func (export "run") (param i32 i32) (result i64) (i64.const {n})))"#
    ))
}

fn quota_sandbox(per_client: usize, in_all: usize) -> Arc<Sandbox> {
    Arc::new(Sandbox::with_config(SandboxConfig {
        max_cached_modules: in_all,
        max_modules_per_client: per_client,
        ..SandboxConfig::default()
    }))
}

/// A client loading past its quota lets go of its own least recently used module (a run
/// counts as a use), never another client's.
#[test]
fn each_client_evicts_only_its_own_modules() {
    let sandbox = quota_sandbox(2, 4);
    let a = SandboxClient::new(sandbox.clone());
    let b = SandboxClient::new(sandbox.clone());
    let a1 = a.load(&numbered(1)).unwrap();
    let a2 = a.load(&numbered(2)).unwrap();
    let b3 = b.load(&numbered(3)).unwrap();
    let b4 = b.load(&numbered(4)).unwrap();
    // b3 is used, so b4 is b's least recently used when b loads a third module.
    assert_eq!(b.run(&b3, b"", &limits()).unwrap(), [0; 3]);
    let b5 = b.load(&numbered(5)).unwrap();
    assert_eq!((a.held(), b.held(), sandbox.cached_modules()), (2, 2, 4));
    assert!(a.holds(&a1) && a.holds(&a2) && b.holds(&b3) && b.holds(&b5));
    assert!(!sandbox.contains(&b4));
    assert_eq!(sandbox.evictions(), 1);
    assert_eq!(
        b.run(&b4, b"", &limits()),
        Err(LambdaError::UnknownLambda(b4.to_string()))
    );
    // a's modules were never touched: loading them again compiles nothing.
    assert_eq!(sandbox.compilations(), 5);
    assert_eq!(a.load(&numbered(1)).unwrap(), a1);
    assert_eq!(sandbox.compilations(), 5);
    assert_eq!(a.run(&a2, b"", &limits()).unwrap(), [0; 2]);
    // A client's holds end with it.
    drop(b);
    assert_eq!(sandbox.cached_modules(), 2);
    assert!(!sandbox.contains(&b3) && !sandbox.contains(&b5));
}

/// A module two clients hold counts against each one's quota, and stays cached until
/// both have let go of it.
#[test]
fn a_shared_module_stays_until_every_holder_lets_go() {
    let sandbox = quota_sandbox(2, 8);
    let a = SandboxClient::new(sandbox.clone());
    let b = SandboxClient::new(sandbox.clone());
    let shared = a.load(&numbered(1)).unwrap();
    assert_eq!(b.load(&numbered(1)).unwrap(), shared);
    assert_eq!(sandbox.compilations(), 1);
    assert_eq!((a.held(), b.held(), sandbox.cached_modules()), (1, 1, 1));
    // b loads two more: over its quota of 2, it lets go of the shared module, which a
    // still holds.
    b.load(&numbered(2)).unwrap();
    b.load(&numbered(3)).unwrap();
    assert!(!b.holds(&shared) && a.holds(&shared) && sandbox.contains(&shared));
    assert_eq!(sandbox.evictions(), 0);
    drop(a);
    assert!(!sandbox.contains(&shared));
    assert_eq!(sandbox.evictions(), 1);
}

/// When the cache is at its bounds with other clients' modules, a client holding nothing
/// is refused instead of evicting them.
#[test]
fn a_full_cache_refuses_rather_than_evicting_others() {
    let sandbox = quota_sandbox(2, 4);
    let a = SandboxClient::new(sandbox.clone());
    let b = SandboxClient::new(sandbox.clone());
    let c = SandboxClient::new(sandbox.clone());
    for n in 1..=2 {
        a.load(&numbered(n)).unwrap();
        b.load(&numbered(10 + n)).unwrap();
    }
    assert!(matches!(
        c.load(&numbered(20)),
        Err(LambdaError::CacheTaken { modules: 4, .. })
    ));
    assert_eq!(
        (sandbox.cached_modules(), a.held(), b.held(), c.held()),
        (4, 2, 2, 0)
    );
    // A module already cached costs the cache nothing: c may hold it.
    c.load(&numbered(1)).unwrap();
    assert_eq!(c.held(), 1);
    drop(a);
    c.load(&numbered(20)).unwrap();
    assert_eq!((sandbox.cached_modules(), c.held()), (4, 2));
}

/// The byte quota: a client whose quota holds one compiled module keeps only its newest,
/// and a module bigger than its quota alone is refused.
#[test]
fn the_byte_quota_per_client() {
    let probe = Sandbox::new();
    probe.load(&numbered(1)).unwrap();
    let cost = probe.cached_bytes();
    let sandbox = Arc::new(Sandbox::with_config(SandboxConfig {
        max_bytes_per_client: cost * 3 / 2,
        ..SandboxConfig::default()
    }));
    let a = SandboxClient::new(sandbox.clone());
    let b = SandboxClient::new(sandbox.clone());
    let first = a.load(&numbered(1)).unwrap();
    let other = b.load(&numbered(2)).unwrap();
    let second = a.load(&numbered(3)).unwrap();
    assert!(!sandbox.contains(&first) && a.holds(&second) && b.holds(&other));
    // The same module as `first`'s plus a data segment as large as the whole quota.
    let padded = wasm(&format!(
        r#"(module
            (memory (export "memory") 1)
            (data (i32.const 0) "{}")
            (func (export "alloc") (param i32) (result i32) (i32.const 0))
            (func (export "run") (param i32 i32) (result i64) (i64.const 1)))"#,
        "x".repeat(cost * 3 / 2)
    ));
    assert!(matches!(
        a.load(&padded),
        Err(LambdaError::CacheFull { limit, .. }) if limit == cost * 3 / 2
    ));
    assert!(a.holds(&second));
}
