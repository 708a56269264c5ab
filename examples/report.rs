//! The `RESULT` line the latency runs print for `scripts/bench`, shared by the binaries
//! whose figures the bench compares, so they use one definition of a percentile.

use std::time::Duration;

/// Prints `RESULT kind=KIND size=.. iters=.. p50_us=.. p99_us=..` for round trips `rtts`.
pub fn latency(kind: &str, size: usize, iters: usize, mut rtts: Vec<Duration>) {
    rtts.sort();
    let pct = |p: f64| rtts[((rtts.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
    println!(
        "RESULT kind={kind} size={size} iters={iters} p50_us={:.2} p99_us={:.2}",
        pct(0.50),
        pct(0.99)
    );
}
