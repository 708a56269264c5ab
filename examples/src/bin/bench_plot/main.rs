//! Draws `scripts/bench`'s results as one SVG: rdmactor's ratio to perftest per metric
//! (from the markdown table), and the echo round-trip distribution (CDF) of rdmactor
//! and `ib_send_lat` from the same VM run (from their per-iteration samples).
//!
//! ```sh
//! bench_plot --table bench/results.md --rdmactor bench/echo-rtt-us.txt \
//!     --perftest bench/ib-send-lat-rtt-us.txt --out bench/results.svg
//! ```
//! Sample files hold one round trip in microseconds per line (`ib_send_lat -H` prints
//! half round trips; `scripts/lib/bench-in-vm` doubles them).
//!
//! `--native` draws `scripts/bench --native`'s table instead (`bench/results-native.md`,
//! read from its RESULT lines): each figure over its floor on the bare loopback
//! transport, each figure against issue 30's target, and the figures with neither.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context as _, Result};
use clap::Parser;
use plotters::prelude::*;

mod native;

#[derive(Parser)]
#[command(about = "SVG chart of scripts/bench results: ratios per metric, echo latency CDF")]
struct Args {
    /// The markdown table scripts/bench wrote.
    #[arg(long)]
    table: PathBuf,
    /// rdmactor echo round trips, microseconds, one per line.
    #[arg(long, required_unless_present = "native")]
    rdmactor: Option<PathBuf>,
    /// ib_send_lat round trips, microseconds, one per line.
    #[arg(long, required_unless_present = "native")]
    perftest: Option<PathBuf>,
    /// The table is `scripts/bench --native`'s (no samples).
    #[arg(long)]
    native: bool,
    /// Where to write the SVG.
    #[arg(long)]
    out: PathBuf,
}

/// One table row with a ratio: the metric's name and rdmactor / perftest.
struct Ratio {
    metric: String,
    ratio: f64,
}

/// Rows of `| metric | rdmactor | perftest | ratio |` whose ratio column starts with a
/// number followed by `x`; rows without a reference (`-`) are left out.
fn ratios(table: &str) -> Vec<Ratio> {
    table
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
            let [metric, .., last] = cells[..] else {
                return None;
            };
            let last = last.trim();
            let number: String = last
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let ratio: f64 = number.parse().ok()?;
            last[number.len()..].starts_with('x').then(|| Ratio {
                metric: metric.trim().to_string(),
                ratio,
            })
        })
        .collect()
}

/// Sorted samples from a file of one number per line (other lines are skipped).
fn samples(path: &Path) -> Result<Vec<f64>> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut v: Vec<f64> = text
        .lines()
        .filter_map(|l| l.trim().parse::<f64>().ok())
        .filter(|x| x.is_finite())
        .collect();
    ensure!(!v.is_empty(), "{} holds no samples", path.display());
    v.sort_by(f64::total_cmp);
    Ok(v)
}

/// A metric's name shortened to fit the chart's label column.
fn short(metric: &str, max: usize) -> String {
    if metric.chars().count() <= max {
        metric.to_string()
    } else {
        let cut: String = metric.chars().take(max - 1).collect();
        format!("{cut}…")
    }
}

/// (value, fraction of samples <= value), thinned to at most ~1000 points.
fn cdf(sorted: &[f64]) -> Vec<(f64, f64)> {
    let step = (sorted.len() / 1000).max(1);
    let n = sorted.len() as f64;
    let mut points: Vec<(f64, f64)> = sorted
        .iter()
        .enumerate()
        .step_by(step)
        .map(|(i, &x)| (x, (i + 1) as f64 / n))
        .collect();
    points.push((sorted[sorted.len() - 1], 1.0));
    points
}

fn main() -> Result<()> {
    let args = Args::parse();
    let table = fs::read_to_string(&args.table)
        .with_context(|| format!("reading {}", args.table.display()))?;
    if args.native {
        return native::plot(&table, &args.out);
    }
    let (Some(rdmactor), Some(perftest)) = (&args.rdmactor, &args.perftest) else {
        anyhow::bail!("--rdmactor and --perftest are needed without --native");
    };
    let rows = ratios(&table);
    ensure!(
        !rows.is_empty(),
        "no ratio rows in {}",
        args.table.display()
    );
    let ours = samples(rdmactor)?;
    let theirs = samples(perftest)?;

    let bar_height = 26;
    let top = 60 + bar_height * rows.len() as u32;
    let size = (1100, top + 420);
    let root = SVGBackend::new(&args.out, size).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = root.split_vertically(top);
    draw_ratios(&upper, &rows)?;
    draw_cdf(&lower, &ours, &theirs)?;
    root.present()?;
    println!(
        "wrote {} ({} ratios, {} + {} latency samples)",
        args.out.display(),
        rows.len(),
        ours.len(),
        theirs.len()
    );
    Ok(())
}

/// Horizontal bars: one per metric, rdmactor / perftest, with 1.0 marked.
fn draw_ratios<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    rows: &[Ratio],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let max = rows.iter().map(|r| r.ratio).fold(1.0f64, f64::max) * 1.15;
    let n = rows.len();
    let mut chart = ChartBuilder::on(area)
        .caption(
            "rdmactor / perftest, same VM run (1.0 = parity)",
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(430)
        .build_cartesian_2d(0.0..max, 0.0..n as f64)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let labels: Vec<String> = rows.iter().map(|r| short(&r.metric, 62)).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n * 2 + 1)
        .y_label_formatter(&|y| {
            // Labels at bar centres (i + 0.5) only.
            let i = (n as f64 - *y - 0.5).round();
            if (y.fract() - 0.5).abs() < 1e-6 && i >= 0.0 && (i as usize) < n {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        })
        .x_desc("ratio")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, r)| {
            let y = (n - 1 - i) as f64;
            let colour = if r.ratio >= 1.0 {
                RGBColor(70, 110, 180)
            } else {
                RGBColor(230, 140, 50)
            };
            Rectangle::new([(0.0, y + 0.15), (r.ratio, y + 0.85)], colour.filled())
        }))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .draw_series(rows.iter().enumerate().map(|(i, r)| {
            let y = (n - 1 - i) as f64 + 0.5;
            Text::new(
                format!("{:.2}x", r.ratio),
                (r.ratio + max * 0.01, y + 0.2),
                ("sans-serif", 13),
            )
        }))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .draw_series(LineSeries::new(
            [(1.0, 0.0), (1.0, n as f64)],
            BLACK.stroke_width(1),
        ))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// The two round-trip CDFs, up to a little past the larger 99th percentile (the last
/// percent's tail would squeeze the rest into a corner).
fn draw_cdf<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    ours: &[f64],
    theirs: &[f64],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let p99 = |v: &[f64]| v[((v.len() - 1) as f64 * 0.99) as usize];
    let x_max = p99(ours).max(p99(theirs)) * 1.3;
    let x_min = ours[0].min(theirs[0]) * 0.9;
    let mut chart = ChartBuilder::on(area)
        .caption(
            "echo round trip, 64 B: CDF (x axis to 1.3 x p99)",
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x_min..x_max, 0.0..1.0)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc("round trip (us)")
        .y_desc("fraction of round trips")
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let blue = RGBColor(70, 110, 180);
    let orange = RGBColor(230, 140, 50);
    chart
        .draw_series(LineSeries::new(cdf(ours), blue.stroke_width(2)))
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .label(format!(
            "rdmactor echo (client-side session), {} samples",
            ours.len()
        ))
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], blue.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(cdf(theirs), orange.stroke_width(2)))
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .label(format!("2 x ib_send_lat, {} samples", theirs.len()))
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], orange.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_are_read_from_the_table() {
        let table = "| metric | rdmactor | perftest | ratio |\n|---|---|---|---|\n\
            | echo p50 | 79.8 us | 57.3 us | 1.39x (target <= 1.5x) |\n\
            | echo/s | 13961 | 39829 msg/s | 0.35x in requests, 0.70x in messages |\n\
            | 256 connections | 35525 | ib_send_bw -q 256 failed | - |\n";
        let rows = ratios(table);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].metric, "echo p50");
        assert!((rows[0].ratio - 1.39).abs() < 1e-9);
        assert!((rows[1].ratio - 0.35).abs() < 1e-9);
    }

    #[test]
    fn cdf_ends_at_one() {
        let v: Vec<f64> = (1..=5000).map(f64::from).collect();
        let c = cdf(&v);
        assert!(c.len() <= 1002);
        assert_eq!(*c.last().unwrap(), (5000.0, 1.0));
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
    }
}
