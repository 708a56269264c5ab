//! How the demo judges: each step runs under a deadline and passes only when its
//! scenario verified what it did (a step that fails is reported and the others still
//! run); a child process passes when it exits 0.

use std::future::Future;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::table::Row;

/// Runs the steps one after another and keeps their rows and failures.
pub struct Verifier {
    steps: usize,
    limit: Duration,
    started: usize,
    rows: Vec<Row>,
    failures: Vec<String>,
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

    /// The rows of the steps that passed, in order.
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// Ok only when every step passed.
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
