//! Lambda benchmark: the FNV-1a checksum over 1 MiB, in the WebAssembly sandbox
//! (`examples/lambdas/checksum.wat`, compiled by wasmtime) and natively. No RDMA.
//!
//! ```sh
//! cargo run --release -p rdmactor-examples --bin lambda_bench
//! RESULT kind=lambda sandbox_ms=... native_ms=... ratio=... bytes=1048576
//! ```
//! Each figure is the median of `--rounds` runs; a sandbox run includes instantiation,
//! copying the input in and the output out, as a server invocation does (without RDMA).

use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use clap::Parser;
use rdmactor_services::lambda::{checksum_native, Limits, Sandbox};

#[derive(Parser)]
#[command(about = "checksum over 1 MiB: sandboxed WebAssembly vs native")]
struct Args {
    /// Input size in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    bytes: usize,
    /// Runs of each; the median is reported.
    #[arg(long, default_value_t = 21)]
    rounds: usize,
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn time(rounds: usize, mut f: impl FnMut() -> Result<Vec<u8>>) -> Result<Duration> {
    f()?; // warm-up
    let samples = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(f()?);
            Ok(start.elapsed())
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(median(samples))
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(args.rounds > 0, "--rounds must be at least 1");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/lambdas/checksum.wat");
    let wasm = wat::parse_file(path).with_context(|| format!("parsing {path}"))?;
    let sandbox = Sandbox::new();
    let hash = sandbox.load(&wasm).context("loading checksum.wat")?;

    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let input: Vec<u8> = (0..args.bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let limits = Limits {
        fuel: u64::MAX / 2,
        wall_clock: Duration::from_secs(600),
        ..Limits::default()
    };
    ensure!(
        sandbox.run(&hash, &input, &limits)? == checksum_native(&input),
        "the sandbox and native checksums differ"
    );

    let sandbox_time = time(args.rounds, || Ok(sandbox.run(&hash, &input, &limits)?))?;
    let native_time = time(args.rounds, || {
        Ok(checksum_native(std::hint::black_box(&input)))
    })?;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "RESULT kind=lambda sandbox_ms={:.3} native_ms={:.3} ratio={:.2} bytes={}",
        ms(sandbox_time),
        ms(native_time),
        sandbox_time.as_secs_f64() / native_time.as_secs_f64(),
        args.bytes,
    );
    Ok(())
}
