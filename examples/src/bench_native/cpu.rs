//! CPU time of this process's threads, one by one, from `/proc/self/task/TID/`.
//!
//! Server and client share the process (the loopback transport lives in its memory), so
//! `getrusage` of the process would add the client's CPU to the server's. The kernel
//! keeps each thread's time on CPU apart: `schedstat`'s first field is the scheduler's
//! own sum in nanoseconds; without schedstats (a kernel built without
//! `CONFIG_SCHED_INFO`) `stat`'s utime + stime, in clock ticks of 10 ms, is the
//! fallback. Reading them needs no `unsafe` and no change to the framework.

use std::collections::BTreeSet;
use std::io;

/// The ids of this process's threads now.
pub fn tids() -> io::Result<BTreeSet<u32>> {
    let mut out = BTreeSet::new();
    for entry in std::fs::read_dir("/proc/self/task")? {
        if let Some(tid) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) {
            out.insert(tid);
        }
    }
    Ok(out)
}

/// Thread `tid`'s name (`comm`, at most 15 bytes), or empty if it is gone.
pub fn name(tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
        .map(|s| s.trim_end().to_owned())
        .unwrap_or_default()
}

/// Nanoseconds thread `tid` has run on a CPU; `None` once it is gone.
pub fn thread_ns(tid: u32) -> Option<u64> {
    if let Ok(s) = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")) {
        if let Some(ns) = s.split_whitespace().next().and_then(|f| f.parse().ok()) {
            return Some(ns);
        }
    }
    // utime and stime are fields 14 and 15; the name (field 2) may hold spaces, so
    // count from the parenthesis that closes it. USER_HZ is 100 on every Linux ABI.
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks * 10_000_000)
}

/// A set of threads whose CPU time is summed.
#[derive(Debug, Clone, Default)]
pub struct Threads {
    /// Their ids and names.
    pub members: Vec<(u32, String)>,
}

impl Threads {
    /// The threads in `after` that were not in `before`, but for the loopback fabric's
    /// clock thread (the transport's, started by whoever first needs a timer).
    pub fn new_since(before: &BTreeSet<u32>, after: &BTreeSet<u32>) -> Threads {
        let members = after
            .difference(before)
            .map(|&tid| (tid, name(tid)))
            .filter(|(_, name)| name != "loopback-clock")
            .collect();
        Threads { members }
    }

    /// Their CPU time so far, summed, in nanoseconds (threads gone count for nothing).
    pub fn cpu_ns(&self) -> u64 {
        self.members
            .iter()
            .filter_map(|(tid, _)| thread_ns(*tid))
            .sum()
    }

    /// Their names now, for the report (a thread names itself once it runs, so the
    /// name seen when it was found may still be its parent's).
    pub fn names(&self) -> String {
        let names: Vec<String> = self.members.iter().map(|(tid, _)| name(*tid)).collect();
        names.join(", ")
    }
}

/// What the scheduler did with a thread (`schedstat`'s three fields): time on a CPU,
/// time runnable but waiting for one, and how many times it got one. The wait is the
/// evidence the fairness figures need: a round trip that is slow because its threads
/// queue for a CPU behind busy ones shows there, not in any code of ours.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sched {
    /// Nanoseconds on a CPU.
    pub run_ns: u64,
    /// Nanoseconds runnable on a run queue, waiting for a CPU.
    pub wait_ns: u64,
    /// Times it was given a CPU.
    pub slices: u64,
}

impl Sched {
    fn parse(s: &str) -> Option<Sched> {
        let mut f = s.split_whitespace().map(|f| f.parse::<u64>().ok());
        Some(Sched {
            run_ns: f.next()??,
            wait_ns: f.next()??,
            slices: f.next()??,
        })
    }

    /// What happened between `before` and this.
    pub fn since(&self, before: &Sched) -> Sched {
        Sched {
            run_ns: self.run_ns.saturating_sub(before.run_ns),
            wait_ns: self.wait_ns.saturating_sub(before.wait_ns),
            slices: self.slices.saturating_sub(before.slices),
        }
    }

    /// Both summed.
    pub fn plus(&self, other: &Sched) -> Sched {
        Sched {
            run_ns: self.run_ns + other.run_ns,
            wait_ns: self.wait_ns + other.wait_ns,
            slices: self.slices + other.slices,
        }
    }
}

/// Thread `tid`'s [`Sched`]; `None` once it is gone or without schedstats.
pub fn sched(tid: u32) -> Option<Sched> {
    Sched::parse(&std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?)
}

/// The calling thread's [`Sched`].
pub fn sched_self() -> Option<Sched> {
    Sched::parse(&std::fs::read_to_string("/proc/thread-self/schedstat").ok()?)
}

/// Every thread of this process's [`Sched`] now, by id.
pub fn sched_all() -> std::collections::BTreeMap<u32, Sched> {
    tids()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|tid| Some((tid, sched(tid)?)))
        .collect()
}

impl Threads {
    /// What the scheduler did with these threads between `before` and `after` (from
    /// [`sched_all`]), summed.
    pub fn sched_between(
        &self,
        before: &std::collections::BTreeMap<u32, Sched>,
        after: &std::collections::BTreeMap<u32, Sched>,
    ) -> Sched {
        self.members
            .iter()
            .filter_map(|(tid, _)| Some(after.get(tid)?.since(before.get(tid)?)))
            .fold(Sched::default(), |a, b| a.plus(&b))
    }
}
