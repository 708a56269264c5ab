//! The chart of `bench/results-native.md`: its RESULT lines in three panels.
//! - Over the floor: each figure measured beside the same exchange on the bare loopback
//!   transport. For a time, above 1 is slower than the floor; for a rate, below 1 reaches
//!   that share of it.
//! - Against issue 30's targets, drawn as how far a figure is from its target, so that 1
//!   is the target for every row whatever its direction, and at most 1 means met.
//! - The figures with neither, as text.
//!
//! The spreads of both panels reach four decades (a bulk echo at 0.07 of its floor, a
//! tail at 300 times its target), so the axes are logarithmic.

use std::path::Path;

use anyhow::{ensure, Result};
use plotters::prelude::*;

/// One `RESULT metric=NAME value=V unit=U floor=F ratio=R` line.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    pub metric: String,
    pub value: f64,
    pub unit: String,
    pub floor: Option<f64>,
}

/// Issue 30's targets: the metric, the bound, and whether the figure must stay under it
/// (a cost, a tail), reach it (a rate), or stay within it of its floor (a latency).
const TARGETS: [(&str, f64, Bound); 5] = [
    ("echo_rtt_p50_us_session", 2.0, Bound::AboveFloor),
    ("server_cpu_ns_per_request", 1000.0, Bound::AtMost),
    ("echo_requests_per_core_16", 1_000_000.0, Bound::AtLeast),
    ("small_p99_under_bulk_x", 2.0, Bound::AtMost),
    ("small_p99_loaded_over_idle_x", 1.2, Bound::AtMost),
];

#[derive(Debug, Clone, Copy)]
enum Bound {
    AtMost,
    AtLeast,
    /// At most this much above the figure's floor.
    AboveFloor,
}

/// The RESULT lines of a table (a `-` floor is none).
pub fn figures(table: &str) -> Vec<Figure> {
    table
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("RESULT ")?;
            let field = |k: &str| {
                rest.split_whitespace()
                    .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            };
            Some(Figure {
                metric: field("metric")?.to_string(),
                value: field("value")?.parse().ok()?,
                unit: field("unit").unwrap_or("").to_string(),
                floor: field("floor").and_then(|f| f.parse().ok()),
            })
        })
        .collect()
}

/// A bar: its label, its length, and the text written at its end.
struct Bar {
    label: String,
    length: f64,
    text: String,
}

/// The figures with a floor, as value over floor.
fn over_floor(figures: &[Figure]) -> Vec<Bar> {
    figures
        .iter()
        .filter_map(|f| {
            let floor = f.floor.filter(|fl| *fl > 0.0)?;
            let ratio = f.value / floor;
            Some(Bar {
                label: f.metric.clone(),
                length: ratio,
                text: format!("{ratio:.2}x ({} {} vs {floor})", f.value, f.unit),
            })
        })
        .collect()
}

/// The figures with a target, as their distance from it (at most 1: met).
fn against_targets(figures: &[Figure]) -> Vec<Bar> {
    TARGETS
        .iter()
        .filter_map(|(metric, target, bound)| {
            let f = figures.iter().find(|f| f.metric == *metric)?;
            let (length, target) = match bound {
                Bound::AtMost => (f.value / target, format!("<= {target}")),
                Bound::AtLeast => (
                    target / f.value.max(f64::MIN_POSITIVE),
                    format!(">= {target}"),
                ),
                Bound::AboveFloor => {
                    let floor = f.floor?;
                    let above = (f.value - floor).max(0.0);
                    (above / target, format!("floor {floor} + {target}"))
                }
            };
            let verdict = if length <= 1.0 { "met" } else { "not met" };
            Some(Bar {
                label: f.metric.clone(),
                length,
                text: format!("{} {} (target {target}): {verdict}", f.value, f.unit),
            })
        })
        .collect()
}

/// Draws the chart of `table` (the native results) into `out`.
pub fn plot(table: &str, out: &Path) -> Result<()> {
    let all = figures(table);
    ensure!(!all.is_empty(), "no RESULT lines in the table");
    let floors = over_floor(&all);
    let targets = against_targets(&all);
    let rest: Vec<&Figure> = all
        .iter()
        .filter(|f| f.floor.is_none() && !TARGETS.iter().any(|(m, _, _)| *m == f.metric))
        .collect();

    let bar = 30;
    let panel = |n: usize| 70 + bar * n as u32;
    let (h1, h2) = (panel(floors.len()), panel(targets.len()));
    let h3 = 50 + 22 * rest.len() as u32;
    let root = SVGBackend::new(out, (1100, h1 + h2 + h3)).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = root.split_vertically(h1);
    let (middle, bottom) = lower.split_vertically(h2);
    draw_log_bars(
        &upper,
        &floors,
        "rdmactor over the bare loopback transport, same run (1 = the floor)",
        false,
    )?;
    draw_log_bars(
        &middle,
        &targets,
        "against issue 30's targets (1 = the target; at most 1 = met)",
        true,
    )?;
    bottom.draw(&Text::new(
        "with neither floor nor target:",
        (20, 15),
        ("sans-serif", 18),
    ))?;
    for (i, f) in rest.iter().enumerate() {
        bottom.draw(&Text::new(
            format!("{}: {} {}", f.metric, f.value, f.unit),
            (40, 42 + 22 * i as i32),
            ("sans-serif", 15),
        ))?;
    }
    root.present()?;
    println!(
        "wrote {} ({} figures over their floor, {} against targets, {} others)",
        out.display(),
        floors.len(),
        targets.len(),
        rest.len()
    );
    Ok(())
}

/// Horizontal bars on a logarithmic axis, with 1 marked; coloured by whether they reach
/// 1 when that is a verdict (a ratio to a floor is not one: a rate under 1 is slower,
/// a time under 1 faster).
fn draw_log_bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    bars: &[Bar],
    caption: &str,
    verdict: bool,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let n = bars.len().max(1);
    let lo = bars.iter().map(|b| b.length).fold(1.0f64, f64::min) / 2.0;
    let hi = bars.iter().map(|b| b.length).fold(1.0f64, f64::max) * 8.0;
    let lo = 10f64.powf(lo.log10().floor());
    let hi = 10f64.powf(hi.log10().ceil());
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(260)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..n as f64)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let labels: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n * 2 + 1)
        .y_label_formatter(&|y| {
            let i = (n as f64 - *y - 0.5).round();
            if (y.fract() - 0.5).abs() < 1e-6 && i >= 0.0 && (i as usize) < labels.len() {
                labels[i as usize].clone()
            } else {
                String::new()
            }
        })
        .x_label_formatter(&|x| format!("{x}"))
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let blue = RGBColor(70, 110, 180);
    let orange = RGBColor(230, 140, 50);
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let y = (n - 1 - i) as f64;
            let colour = if !verdict || b.length <= 1.0 {
                blue
            } else {
                orange
            };
            Rectangle::new([(lo, y + 0.15), (b.length, y + 0.85)], colour.filled())
        }))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let y = (n - 1 - i) as f64 + 0.5;
            Text::new(
                b.text.clone(),
                (b.length * 1.08, y + 0.2),
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

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "| metric | value |\n\
        RESULT metric=echo_rtt_p50_us_session value=4.08 unit=us floor=2.69 ratio=1.52\n\
        RESULT metric=server_cpu_ns_per_request value=1729.0 unit=ns floor=- ratio=-\n\
        RESULT metric=echo_requests_per_core_16 value=568698 unit=req/s floor=- ratio=-\n\
        RESULT metric=setup_conn_per_s value=36345.8 unit=conn/s floor=- ratio=-\n";

    #[test]
    fn result_lines_are_read_with_and_without_a_floor() {
        let f = figures(TABLE);
        assert_eq!(f.len(), 4);
        assert_eq!(f[0].metric, "echo_rtt_p50_us_session");
        assert_eq!(f[0].floor, Some(2.69));
        assert_eq!(f[1].floor, None);
        assert_eq!(f[3].unit, "conn/s");
    }

    #[test]
    fn a_target_is_one_whichever_way_it_points() {
        let bars = against_targets(&figures(TABLE));
        assert_eq!(bars.len(), 3);
        // 4.08 us is 1.39 us above its floor of 2.69, within the 2 us asked: met.
        assert!((bars[0].length - (4.08 - 2.69) / 2.0).abs() < 1e-9);
        assert!(bars[0].text.ends_with(": met"));
        // A cost of 1729 ns against at most 1000: 1.73, not met.
        assert!((bars[1].length - 1.729).abs() < 1e-9);
        assert!(bars[1].text.ends_with("not met"));
        // A rate of 568,698 against at least 1,000,000: 1.76, not met either.
        assert!((bars[2].length - 1_000_000.0 / 568_698.0).abs() < 1e-9);
        let floors = over_floor(&figures(TABLE));
        assert_eq!(floors.len(), 1);
        assert!((floors[0].length - 4.08 / 2.69).abs() < 1e-9);
    }
}
