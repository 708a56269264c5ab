//! Lambda benchmark: the FNV-1a checksum over 1 MiB, in the WebAssembly sandbox
//! (`examples/lambdas/checksum.wat`, compiled by wasmtime) and natively. No RDMA.
//!
//! ```sh
//! cargo run --release -p rdmactor-examples --bin lambda_bench
//! RESULT kind=lambda sandbox_ms=... native_ms=... ratio=... bytes=1048576 ...
//! ```
//! Each figure is the median of `--rounds` runs, sandbox and native rounds taking turns
//! (so that a busy machine slows both alike); a sandbox run includes instantiation,
//! copying the input in and the output out, and resetting the instance's memory, as a
//! server invocation does (without RDMA). The phases of a sandbox run are reported too
//! (each its own median), so that the guest's loop (`run_ms`) can be told apart from the
//! sandbox's fixed costs; and, for scale, what this machine takes to copy (`memcpy_ms`)
//! and to zero (`memset_ms`) as many bytes with the C library, the work behind `copy_in`
//! and `teardown`. `min_ratio` compares the fastest round of each: on a busy machine it
//! is the less noisy estimate of what each path costs by itself.
//! `--module` picks another checksum module; `--emit-obj` writes the machine code
//! Cranelift made of it, for `objdump -d`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use clap::Parser;
use rdmactor_services::lambda::{checksum_native, Limits, Phases, Sandbox};

#[derive(Parser)]
#[command(about = "checksum over 1 MiB: sandboxed WebAssembly vs native")]
struct Args {
    /// Input size in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    bytes: usize,
    /// Runs of each; the median is reported.
    #[arg(long, default_value_t = 21)]
    rounds: usize,
    /// The checksum module (.wat or .wasm); it must return what `checksum_native` does.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/lambdas/checksum.wat"))]
    module: PathBuf,
    /// Write the compiled module (an ELF object) here and go on.
    #[arg(long)]
    emit_obj: Option<PathBuf>,
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<Duration> {
    let start = Instant::now();
    std::hint::black_box(f()?);
    Ok(start.elapsed())
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(args.rounds > 0, "--rounds must be at least 1");
    let path = &args.module;
    let wasm = wat::parse_file(path).with_context(|| format!("parsing {}", path.display()))?;
    let sandbox = Sandbox::new();
    if let Some(obj) = &args.emit_obj {
        std::fs::write(obj, sandbox.precompile(&wasm)?)
            .with_context(|| format!("writing {}", obj.display()))?;
    }
    let hash = sandbox
        .load(&wasm)
        .with_context(|| format!("loading {}", path.display()))?;

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

    let mut phases = Vec::with_capacity(args.rounds);
    let (mut sandbox_times, mut native_times) = (Vec::new(), Vec::new());
    let (mut memcpy_times, mut memset_times) = (Vec::new(), Vec::new());
    let mut scratch = vec![0u8; input.len()];
    for round in 0..=args.rounds {
        let mut p = Phases::default();
        let sandboxed = timed(|| Ok(sandbox.run_with_phases(&hash, &input, &limits, &mut p)?))?;
        let native = timed(|| Ok(checksum_native(std::hint::black_box(&input))))?;
        let memcpy = timed(|| {
            scratch.copy_from_slice(std::hint::black_box(&input));
            Ok(())
        })?;
        let memset = timed(|| {
            std::hint::black_box(&mut scratch).fill(0);
            Ok(())
        })?;
        if round > 0 {
            // Round 0 warms up.
            phases.push(p);
            sandbox_times.push(sandboxed);
            native_times.push(native);
            memcpy_times.push(memcpy);
            memset_times.push(memset);
        }
    }
    let min_ratio = sandbox_times.iter().min().unwrap().as_secs_f64()
        / native_times.iter().min().unwrap().as_secs_f64();
    let (sandbox_time, native_time) = (median(sandbox_times), median(native_times));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let phase = |f: fn(&Phases) -> Duration| ms(median(phases.iter().map(f).collect()));
    println!(
        "RESULT kind=lambda sandbox_ms={:.3} native_ms={:.3} ratio={:.2} bytes={} \
         instantiate_ms={:.3} copy_in_ms={:.3} run_ms={:.3} copy_out_ms={:.3} teardown_ms={:.3} \
         other_ms={:.3} run_ratio={:.2} min_ratio={:.2} memcpy_ms={:.3} memset_ms={:.3}",
        ms(sandbox_time),
        ms(native_time),
        sandbox_time.as_secs_f64() / native_time.as_secs_f64(),
        args.bytes,
        phase(|p| p.instantiate),
        phase(|p| p.copy_in),
        phase(|p| p.run),
        phase(|p| p.copy_out),
        phase(|p| p.teardown),
        phase(|p| p
            .total
            .saturating_sub(p.instantiate + p.copy_in + p.run + p.copy_out + p.teardown)),
        phase(|p| p.run) / ms(native_time),
        min_ratio,
        ms(median(memcpy_times)),
        ms(median(memset_times)),
    );
    Ok(())
}
