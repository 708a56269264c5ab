//! The Prometheus recorder the tools install for the `metrics` facade: one definition,
//! so that `server --metrics` and `bench_native --metrics` pay for the same recording
//! (the native bench's A/B of metrics on and off measures what a server with
//! `--metrics` costs).

use anyhow::{Context as _, Result};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Installs the Prometheus exporter's recorder and turns on the per-message timings
/// (`rdmactor::metrics::set_timing`). Latencies and sizes become histograms with
/// buckets that fit them (the exporter's default would be summaries). Call it before
/// any server or client starts: connections register their handles when they are set
/// up, and a handle registered before the recorder stays a no-op.
///
/// The handle renders the text (`/metrics`); someone must render it or call
/// `run_upkeep` now and then, or the histograms' samples pile up in memory.
pub fn install() -> Result<PrometheusHandle> {
    let seconds = |name: &str| Matcher::Full(name.to_string());
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            seconds("rdmactor_echo_handling_seconds"),
            &[1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 1e-3],
        )?
        .set_buckets_for_metric(
            seconds("rdmactor_connection_lifetime_seconds"),
            &[0.01, 0.1, 1.0, 10.0, 60.0, 600.0, 3600.0, 86400.0],
        )?
        .set_buckets_for_metric(
            seconds("rdmactor_cq_poll_batch"),
            &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0],
        )?
        .install_recorder()
        .context("installing the metrics recorder")?;
    // The per-message timings (the echo handling histogram) cost a clock read per
    // request, so they are taken only once a recorder keeps them.
    rdmactor::metrics::set_timing(true);
    Ok(handle)
}
