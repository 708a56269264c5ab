//! The `RESULT` line the latency runs print for `scripts/bench`, shared by the binaries
//! whose figures the bench compares, so they use one definition of a percentile.

use std::time::Duration;

/// Prints `RESULT kind=KIND size=.. iters=.. p50_us=.. p99_us=..` for round trips `rtts`.
/// With `RDMACTOR_LATENCY_SAMPLES=PATH` it also writes every round trip there, in
/// microseconds, one per line (for the latency CDF of `scripts/lib/bench-plot`).
pub fn latency(kind: &str, size: usize, iters: usize, mut rtts: Vec<Duration>) {
    rtts.sort();
    if let Some(path) = std::env::var_os("RDMACTOR_LATENCY_SAMPLES") {
        let lines: String = rtts
            .iter()
            .map(|d| format!("{:.3}\n", d.as_secs_f64() * 1e6))
            .collect();
        if let Err(e) = std::fs::write(&path, lines) {
            eprintln!(
                "cannot write the samples to {}: {e}",
                path.to_string_lossy()
            );
        }
    }
    let pct = |p: f64| rtts[((rtts.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
    println!(
        "RESULT kind={kind} size={size} iters={iters} p50_us={:.2} p99_us={:.2}",
        pct(0.50),
        pct(0.99)
    );
}
