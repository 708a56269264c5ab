//! How the demo judges: each step runs under a deadline and passes only when its
//! scenario verified what it did (a step that fails is reported and the others still
//! run); a child process passes when it exits 0.
//!
//! A step may also be skipped, when what it needs was not given (the identity step
//! against another host's server without `--key`). The skip is decided before the step
//! runs, from the options alone: once a step runs, whatever goes wrong is a failure,
//! never a skip. A skipped step counts as neither verified nor failed: it prints
//! `SKIPPED: why` where a verified step prints its `RESULT` line and a failed one
//! `FAILED: why` (so a script that counts `RESULT` lines counts verified steps only),
//! its row in the table says it was skipped and why, and the run's last line names it.
//! The verdict fails when any step failed, skipped steps or not; a run with skips and
//! no failure exits 0, since nothing it checked was wrong.

use std::future::Future;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::table::Row;

/// Runs the steps one after another and keeps their rows, failures and skips.
pub struct Verifier {
    steps: usize,
    limit: Duration,
    started: usize,
    rows: Vec<Row>,
    failures: Vec<String>,
    skipped: Vec<String>,
}

impl Verifier {
    /// For `steps` steps, each given `limit` to finish.
    pub fn new(steps: usize, limit: Duration) -> Verifier {
        Verifier {
            steps,
            limit,
            started: 0,
            rows: Vec::new(),
            failures: Vec::new(),
            skipped: Vec::new(),
        }
    }

    /// Runs the next step, `name`: prints `[n/steps] name`, then either its verified
    /// result and a `RESULT step=.. secs=.. verified=..` line for scripts, or `FAILED`
    /// with the reason (an error, or no result within the limit).
    pub async fn step(&mut self, name: &str, scenario: impl Future<Output = Result<Row>>) {
        self.started += 1;
        println!("[{}/{}] {}", self.started, self.steps, name);
        let t = Instant::now();
        let limit = self.limit;
        let result = match actix_rt::time::timeout(limit, scenario).await {
            Ok(result) => result,
            Err(_) => Err(anyhow::anyhow!("no result after {limit:?}")),
        };
        match result {
            Ok(mut row) => {
                row.secs = t.elapsed().as_secs_f64();
                println!(
                    "      {}: {} verified in {:.1} s",
                    row.service, row.verified, row.secs
                );
                println!(
                    "RESULT step={} secs={:.3} verified={}",
                    row.service,
                    row.secs,
                    row.verified.replace(' ', "_")
                );
                self.rows.push(row);
            }
            Err(e) => {
                println!("      FAILED: {e:#}");
                self.failures.push(format!("{name}: {e:#}"));
            }
        }
    }

    /// Counts the next step, `name`, as skipped because `why` (short: it goes in the
    /// table), without running it; `how` says what would run it. See the module's doc
    /// for how a skip is counted.
    pub fn skip(&mut self, name: &'static str, why: &str, how: &str) {
        self.started += 1;
        println!("[{}/{}] {}", self.started, self.steps, name);
        println!("      SKIPPED: {why} ({how})");
        self.rows.push(Row {
            service: name,
            clients: 0,
            operations: "not run".into(),
            verified: format!("SKIPPED: {why}"),
            secs: 0.0,
        });
        self.skipped.push(format!("{name} ({why})"));
    }

    /// The rows of the steps that passed or were skipped, in order.
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// What was skipped, for the run's last line: `None` when every step ran.
    pub fn skipped(&self) -> Option<String> {
        (!self.skipped.is_empty()).then(|| {
            format!(
                "{} step(s) skipped, not verified: {}",
                self.skipped.len(),
                self.skipped.join("; ")
            )
        })
    }

    /// Ok only when no step failed (skipped steps are named by
    /// [`skipped`](Self::skipped), and do not fail the run).
    pub fn verdict(self) -> Result<()> {
        if !self.failures.is_empty() {
            bail!(
                "{} step(s) failed: {}",
                self.failures.len(),
                self.failures.join("; ")
            );
        }
        Ok(())
    }
}

/// A child process the demo waits for, with a deadline.
pub struct Proc {
    /// What it is, for messages.
    pub what: String,
    /// The process.
    pub child: Child,
}

/// Waits (without blocking the actors) for every process; returns the ones that
/// exited 0, and the others with their stderr.
pub async fn wait_all(mut procs: Vec<Proc>, limit: Duration) -> Result<(usize, Vec<String>)> {
    let deadline = Instant::now() + limit;
    let mut ok = 0;
    let mut failed = Vec::new();
    while !procs.is_empty() {
        let mut i = 0;
        while i < procs.len() {
            if let Some(status) = procs[i].child.try_wait()? {
                let mut p = procs.swap_remove(i);
                if status.success() {
                    ok += 1;
                } else {
                    let mut err = String::new();
                    if let Some(mut e) = p.child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    failed.push(format!("{} ({status}): {}", p.what, err.trim()));
                }
            } else {
                i += 1;
            }
        }
        if Instant::now() > deadline {
            for p in &mut procs {
                let _ = p.child.kill();
                let _ = p.child.wait();
                failed.push(format!("{}: still running after {limit:?}, killed", p.what));
            }
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((ok, failed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(service: &'static str) -> Row {
        Row {
            service,
            clients: 1,
            operations: "one".into(),
            verified: "1/1".into(),
            secs: 0.0,
        }
    }

    /// A skip is neither verified nor failed: alone it does not fail the run, beside a
    /// failure it does not hide it, and either way the run names it.
    #[test]
    fn a_skip_passes_for_nothing_and_hides_no_failure() {
        actix::System::new().block_on(async {
            let mut steps = Verifier::new(2, Duration::from_secs(5));
            steps.step("echo", async { Ok(row("echo")) }).await;
            steps.skip("identity", "no --key given", "pass --key");
            let rows: Vec<_> = steps.rows().iter().map(|r| r.verified.as_str()).collect();
            assert_eq!(rows, ["1/1", "SKIPPED: no --key given"]);
            assert_eq!(
                steps.skipped().as_deref(),
                Some("1 step(s) skipped, not verified: identity (no --key given)")
            );
            assert!(steps.verdict().is_ok());

            let mut steps = Verifier::new(2, Duration::from_secs(5));
            steps
                .step("echo", async { Err(anyhow::anyhow!("reply differs")) })
                .await;
            steps.skip("identity", "no --key given", "pass --key");
            let err = steps.verdict().unwrap_err().to_string();
            assert_eq!(err, "1 step(s) failed: echo: reply differs");

            let mut steps = Verifier::new(1, Duration::from_secs(5));
            steps.step("echo", async { Ok(row("echo")) }).await;
            assert_eq!(steps.skipped(), None);
        });
    }
}
