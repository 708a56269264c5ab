//! What the host can spare the pollers, sampled from Linux's `/proc` by each poller
//! thread itself (for [`SpinPolicy::host`](super::spin::SpinPolicy::host)):
//! - the idle time of the CPUs this process may run on (`/proc/stat`, the CPUs of
//!   `Cpus_allowed_list` in `/proc/self/status`: a container or `taskset` limit is what
//!   counts, not the machine's size), as a number of cores;
//! - the time all of this process's poller threads spent on a CPU (each adds its own,
//!   from `/proc/thread-self/schedstat`, to one count): what the pollers would have
//!   if they all spun is their own time plus the idle time, and the rest of the busy
//!   time is wanted by something else;
//! - the share of the time the calling thread waited for a CPU while it could run
//!   (`/proc/thread-self/schedstat` again). A spinning thread that shares its core with
//!   a busy one waits out the other's time slices, half the time or more; one that is
//!   only preempted now and then by threads that wake, work briefly and sleep (the
//!   threads it serves, usually) hardly waits at all.
//!
//! Reading two small files every [`EVERY`] costs a few microseconds of a poller that
//! is idle anyway. Where they cannot be read (no `/proc`), there is no sample, and the
//! poller goes by its traffic alone.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How often a poller samples the host: long enough that `/proc/stat`'s ticks (100 a
/// second per CPU) give an idle share to about 0.04 of a core.
pub(crate) const EVERY: Duration = Duration::from_millis(250);

/// Nanoseconds on a CPU of every poller thread of this process, as each last added it.
static POLLERS_RAN_NS: AtomicU64 = AtomicU64::new(0);
/// Poller threads of this process that sample the host (all nodes together).
static POLLERS: AtomicUsize = AtomicUsize::new(0);

/// What the host could spare over one sampling period.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct HostSample {
    /// Cores idle: the allowed CPUs' idle time per unit of time.
    pub(crate) idle_cores: f64,
    /// Cores this process's pollers used (their work and their spinning).
    pub(crate) pollers_cores: f64,
    /// This process's poller threads.
    pub(crate) pollers: usize,
    /// The share of the time this thread waited for a CPU while it could run.
    pub(crate) waited: f64,
}

impl HostSample {
    /// Cores the pollers would have if they all spun: their own time and the idle time.
    pub(crate) fn cores_for_pollers(&self) -> f64 {
        self.idle_cores + self.pollers_cores
    }
}

/// One reading of the counters.
#[derive(Debug, Clone, Copy)]
struct Reading {
    at: Instant,
    /// Idle and total ticks of the allowed CPUs.
    idle: u64,
    total: u64,
    /// Every poller's nanoseconds on a CPU, as added so far.
    pollers_ran: u64,
    /// This thread's nanoseconds waiting for a CPU so far.
    waited: u64,
}

/// Samples the host for one poller thread (the thread counters are the caller's: call
/// it from the poller thread only).
pub(crate) struct HostSampler {
    /// The CPUs this process may run on; `None` when unknown (every CPU counts).
    cpus: Option<Vec<usize>>,
    last: Option<Reading>,
    /// This thread's nanoseconds on a CPU when it last added them to the count.
    ran: Option<u64>,
}

impl HostSampler {
    pub(crate) fn new() -> HostSampler {
        let cpus = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .and_then(|list| parse_cpu_list(list.trim()))
            });
        POLLERS.fetch_add(1, Ordering::Relaxed);
        HostSampler {
            cpus,
            last: None,
            ran: None,
        }
    }

    /// A sample of the period since the last one, once [`EVERY`] has passed; `None`
    /// before that, at the first call, or when the counters cannot be read.
    pub(crate) fn sample(&mut self, now: Instant) -> Option<HostSample> {
        if self
            .last
            .is_some_and(|last| now.saturating_duration_since(last.at) < EVERY)
        {
            return None;
        }
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let sched = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
        let (idle, total, cpus) = cpu_ticks(&stat, self.cpus.as_deref())?;
        let (ran, waited) = parse_schedstat(&sched)?;
        // Only what ran since this thread last added: the first reading is a baseline.
        let added = self
            .ran
            .replace(ran)
            .map_or(0, |before| ran.saturating_sub(before));
        let pollers_ran = POLLERS_RAN_NS
            .fetch_add(added, Ordering::Relaxed)
            .wrapping_add(added);
        let reading = Reading {
            at: now,
            idle,
            total,
            pollers_ran,
            waited,
        };
        let before = self.last.replace(reading)?;
        between(&before, &reading, cpus, POLLERS.load(Ordering::Relaxed))
    }
}

impl Drop for HostSampler {
    fn drop(&mut self) {
        POLLERS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The sample between two readings of `cpus` CPUs, with `pollers` poller threads.
fn between(before: &Reading, after: &Reading, cpus: usize, pollers: usize) -> Option<HostSample> {
    let wall = after.at.checked_duration_since(before.at)?.as_nanos() as f64;
    let total = after.total.checked_sub(before.total)?;
    if wall <= 0.0 || total == 0 {
        return None;
    }
    let idle = after.idle.checked_sub(before.idle)?;
    let waited = after.waited.checked_sub(before.waited)?;
    let pollers_ran = after.pollers_ran.wrapping_sub(before.pollers_ran);
    Some(HostSample {
        idle_cores: idle as f64 / total as f64 * cpus as f64,
        // Each poller adds its time at its own samples: over one period the sum may
        // run ahead or behind by part of a period; never more than every CPU.
        pollers_cores: (pollers_ran as f64 / wall).min(cpus as f64),
        pollers,
        waited: (waited as f64 / wall).min(1.0),
    })
}

/// `0-3,5,7-8` as CPU numbers; `None` if it does not parse.
fn parse_cpu_list(list: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
                // A list of a machine's CPUs, not a range a hostile peer chose; still,
                // a nonsense range is no list.
                if b < a || b - a > 65_536 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    (!cpus.is_empty()).then_some(cpus)
}

/// Idle (idle + iowait) and total ticks of the `cpuN` lines of `/proc/stat` for the
/// CPUs in `allowed` (all of them when `None`), and how many CPUs that was.
fn cpu_ticks(stat: &str, allowed: Option<&[usize]>) -> Option<(u64, u64, usize)> {
    let (mut idle, mut total, mut n) = (0u64, 0u64, 0usize);
    for line in stat.lines() {
        // The first line, "cpu" alone, is the sum of all: skipped.
        let Some(rest) = line
            .strip_prefix("cpu")
            .filter(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        else {
            continue;
        };
        let mut fields = rest.split_ascii_whitespace();
        let Some(Ok(cpu)) = fields.next().map(str::parse::<usize>) else {
            continue;
        };
        if allowed.is_some_and(|a| !a.contains(&cpu)) {
            continue;
        }
        let ticks: Vec<u64> = fields.filter_map(|f| f.parse().ok()).collect();
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        if ticks.len() < 5 {
            return None;
        }
        idle = idle.saturating_add(ticks[3]).saturating_add(ticks[4]);
        total = ticks
            .iter()
            .take(8)
            .fold(total, |sum, t| sum.saturating_add(*t));
        n += 1;
    }
    (n > 0).then_some((idle, total, n))
}

/// The first two fields of a `schedstat` file: nanoseconds on a CPU, nanoseconds
/// waiting for one while runnable.
fn parse_schedstat(s: &str) -> Option<(u64, u64)> {
    let mut fields = s.split_ascii_whitespace().map(str::parse::<u64>);
    Some((fields.next()?.ok()?, fields.next()?.ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT_A: &str = "cpu  300 0 100 1600 0 0 0 0 0 0\n\
                          cpu0 100 0 50 850 0 0 0 0 0 0\n\
                          cpu1 200 0 50 750 0 0 0 0 0 0\n\
                          intr 1 2 3\n";
    // 100 ticks later on each CPU: cpu0 idle for 60 of them, cpu1 for none.
    const STAT_B: &str = "cpu  440 0 100 1660 0 0 0 0 0 0\n\
                          cpu0 140 0 50 910 0 0 0 0 0 0\n\
                          cpu1 300 0 50 750 0 0 0 0 0 0\n";

    #[test]
    fn cpu_lists_parse_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-1"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0,2-3,7"), Some(vec![0, 2, 3, 7]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn idle_cores_are_the_allowed_cpus_and_the_pollers_share_is_their_time() {
        let (idle_a, total_a, n) = cpu_ticks(STAT_A, None).unwrap();
        assert_eq!((idle_a, total_a, n), (1600, 2000, 2));
        let (idle_b, total_b, _) = cpu_ticks(STAT_B, None).unwrap();
        let now = Instant::now();
        let before = Reading {
            at: now,
            idle: idle_a,
            total: total_a,
            pollers_ran: 1_000,
            waited: 7,
        };
        // Over half a second: the pollers ran 0.3 s, this one waited 0.1 s for a CPU.
        let after = Reading {
            at: now + Duration::from_millis(500),
            idle: idle_b,
            total: total_b,
            pollers_ran: 300_001_000,
            waited: 100_000_007,
        };
        let s = between(&before, &after, 2, 2).unwrap();
        // 60 idle ticks of 200 on two CPUs: 0.6 of a core; the pollers had 0.6 too.
        assert!((s.idle_cores - 0.6).abs() < 1e-9, "{s:?}");
        assert!((s.pollers_cores - 0.6).abs() < 1e-9, "{s:?}");
        assert!((s.cores_for_pollers() - 1.2).abs() < 1e-9, "{s:?}");
        assert!((s.waited - 0.2).abs() < 1e-6, "{s:?}");
        // Only cpu1 allowed: no idle time there.
        let (i1, t1, n1) = cpu_ticks(STAT_A, Some(&[1])).unwrap();
        let (i2, t2, _) = cpu_ticks(STAT_B, Some(&[1])).unwrap();
        assert_eq!(n1, 1);
        let s = between(
            &Reading {
                idle: i1,
                total: t1,
                ..before
            },
            &Reading {
                idle: i2,
                total: t2,
                ..after
            },
            1,
            2,
        )
        .unwrap();
        assert_eq!(s.idle_cores, 0.0, "{s:?}");
    }

    #[test]
    fn counters_that_went_backwards_or_did_not_move_give_no_sample() {
        let now = Instant::now();
        let r = Reading {
            at: now,
            idle: 10,
            total: 100,
            pollers_ran: 0,
            waited: 5,
        };
        assert_eq!(between(&r, &r, 2, 1), None, "no time passed");
        let back = Reading {
            at: now + Duration::from_secs(1),
            total: 50,
            ..r
        };
        assert_eq!(between(&r, &back, 2, 1), None);
        assert_eq!(parse_schedstat("12 34 5\n"), Some((12, 34)));
        assert_eq!(parse_schedstat(""), None);
    }

    #[test]
    fn this_threads_counters_read_on_linux() {
        let mut s = HostSampler::new();
        let start = Instant::now();
        assert_eq!(s.sample(start), None, "the first reading is a baseline");
        // Spin on this thread past one period, so it has time of its own to count.
        while start.elapsed() < EVERY + Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let sample = s.sample(Instant::now());
        if std::path::Path::new("/proc/thread-self/schedstat").exists() {
            let sample = sample.expect("a sample after one period");
            assert!(sample.idle_cores >= 0.0, "{sample:?}");
            assert!(sample.pollers >= 1, "{sample:?}");
            assert!((0.0..=1.0).contains(&sample.waited), "{sample:?}");
        }
    }
}
