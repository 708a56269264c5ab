//! A figure's repetitions, its floor's, and how they are printed: one `RESULT` line for
//! scripts (`RESULT metric=NAME value=V unit=U floor=F ratio=R`, `-` where there is no
//! floor) and one markdown row for `bench/results-native.md`, with the spread.

use std::io::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;

/// The median of `values` (the mean of the middle two for an even count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A histogram of round trips in nanoseconds, 1 ns to 100 s, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid histogram bounds")
}

/// Records `d` in `h` (clamped into its range).
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1));
}

/// The `q` quantile of `h` in microseconds.
pub fn quantile_us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// One figure: its repetitions, and its floor's when it has one.
#[derive(Debug, Clone)]
pub struct Figure {
    /// The metric's name, as issue 30 spells it.
    pub metric: String,
    /// Its unit (`us`, `ns`, `req/s`, ...).
    pub unit: &'static str,
    /// Each repetition's value.
    pub reps: Vec<f64>,
    /// Each repetition of the floor, in the same unit (empty: no floor).
    pub floor_reps: Vec<f64>,
    /// What was measured and against what, for the table. The ratio is always value
    /// over floor: above 1 a time is slower than the floor, below 1 a rate reaches that
    /// share of it.
    pub what: String,
}

impl Figure {
    /// A figure with no floor.
    pub fn new(metric: &str, unit: &'static str, reps: Vec<f64>, what: impl Into<String>) -> Self {
        Figure {
            metric: metric.to_owned(),
            unit,
            reps,
            floor_reps: Vec::new(),
            what: what.into(),
        }
    }

    /// The same, measured against `floor_reps`.
    pub fn with_floor(mut self, floor_reps: Vec<f64>) -> Self {
        self.floor_reps = floor_reps;
        self
    }

    /// The median of the repetitions.
    pub fn value(&self) -> f64 {
        median(&self.reps)
    }

    /// The median of the floor's repetitions, if there is a floor.
    pub fn floor(&self) -> Option<f64> {
        (!self.floor_reps.is_empty()).then(|| median(&self.floor_reps))
    }

    /// Value over floor.
    pub fn ratio(&self) -> Option<f64> {
        self.floor().filter(|f| *f > 0.0).map(|f| self.value() / f)
    }

    /// The `RESULT` line.
    pub fn result_line(&self) -> String {
        let floor = self.floor().map_or("-".to_owned(), |f| fmt(f, self.unit));
        let ratio = self.ratio().map_or("-".to_owned(), |r| format!("{r:.2}"));
        format!(
            "RESULT metric={} value={} unit={} floor={floor} ratio={ratio}",
            self.metric,
            fmt(self.value(), self.unit),
            self.unit
        )
    }

    /// The markdown row: metric, value, floor, ratio, spread of both, what it is.
    pub fn table_row(&self) -> String {
        let spread = |reps: &[f64]| {
            if reps.is_empty() {
                return "-".to_owned();
            }
            let lo = reps.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = reps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let all: Vec<String> = reps.iter().map(|r| fmt(*r, self.unit)).collect();
            format!(
                "{} to {} ({})",
                fmt(lo, self.unit),
                fmt(hi, self.unit),
                all.join(", ")
            )
        };
        let floor = self.floor().map_or("-".to_owned(), |f| {
            format!("{} {}", fmt(f, self.unit), self.unit)
        });
        let ratio = self.ratio().map_or("-".to_owned(), |r| format!("{r:.2}x"));
        format!(
            "| `{}` | {} {} | {floor} | {ratio} | {} | {} | {} |",
            self.metric,
            fmt(self.value(), self.unit),
            self.unit,
            spread(&self.reps),
            spread(&self.floor_reps),
            self.what
        )
    }
}

/// A value in `unit` with the digits that mean something.
fn fmt(v: f64, unit: &str) -> String {
    match unit {
        "us" | "x" => format!("{v:.2}"),
        "ns" | "KiB" | "MB/s" | "conn/s" => format!("{v:.1}"),
        _ => format!("{v:.0}"),
    }
}

/// Where figures go: their `RESULT` lines to stdout as each is measured, their rows to
/// the table file (if any) at the end.
#[derive(Default)]
pub struct Report {
    rows: Vec<String>,
}

impl Report {
    /// Prints `figure`'s `RESULT` line and keeps its row.
    pub fn add(&mut self, figure: Figure) {
        self.add_printed(&figure.result_line(), &figure.table_row());
    }

    /// Prints a `RESULT` line and keeps a row made elsewhere (another process's figure).
    pub fn add_printed(&mut self, result: &str, row: &str) {
        println!("{result}");
        let _ = std::io::stdout().flush();
        self.rows.push(row.to_owned());
    }

    /// Writes the rows of every figure so far to `path`, one per line.
    pub fn write_rows(&self, path: &std::path::Path) -> std::io::Result<()> {
        let rows: String = self.rows.iter().map(|r| r.clone() + "\n").collect();
        std::fs::write(path, rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_or_the_mean_of_the_middle_two() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[f64::INFINITY, 5.0]), 5.0);
    }

    #[test]
    fn a_result_line_has_exactly_the_issues_fields() {
        let f = Figure::new("echo_rtt_p50_us_session", "us", vec![2.0, 3.0, 2.5], "x")
            .with_floor(vec![1.0, 1.0, 1.25]);
        assert_eq!(
            f.result_line(),
            "RESULT metric=echo_rtt_p50_us_session value=2.50 unit=us floor=1.00 ratio=2.50"
        );
        let f = Figure::new("setup_conn_per_s", "conn/s", vec![100.0], "y");
        assert_eq!(
            f.result_line(),
            "RESULT metric=setup_conn_per_s value=100.0 unit=conn/s floor=- ratio=-"
        );
        assert!(f.table_row().starts_with(
            "| `setup_conn_per_s` | 100.0 conn/s | - | - | 100.0 to 100.0 (100.0) | - | y |"
        ));
    }
}
