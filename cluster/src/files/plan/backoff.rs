//! How long a file's repair waits after a failure: exponentially longer after each
//! failure of the same kind, up to a cap, and forgotten once the file is repaired. A
//! record that cannot be repaired (its only source holds other bytes, every spare node
//! is full) would otherwise be tried again every round, each time moving data; kinds
//! back off apart so that, say, a lock held by another repairer for a moment does not
//! lengthen the wait after a source that failed once.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What went wrong with a copy, as far as waiting is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureKind {
    /// Another repairer holds the file's lock.
    Locked,
    /// The record changed under the copy, or the fenced update was refused.
    Changed,
    /// The node copied from failed, or holds other bytes than the record.
    Source,
    /// The node copied to failed, refused, or holds other bytes under the name.
    Target,
    /// A node before this one in rendezvous order may make the copy: it was not asked
    /// to step aside (it holds no other bytes), so this node waits.
    Ahead,
    /// etcd could not be read or written.
    Registry,
    /// The local directory a copy goes through could not be made or written.
    Staging,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    until: Instant,
}

/// Waits per (file, [`FailureKind`]). Plain: the caller passes `now`.
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    files: HashMap<String, HashMap<FailureKind, Failures>>,
}

impl Backoff {
    /// Waits `base` after a first failure, twice as long after each next one of the
    /// same kind, never longer than `cap`.
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap: cap.max(base),
            files: HashMap::new(),
        }
    }

    /// `file` failed with `kind` at `now`; returns how long it waits.
    pub fn handle_failure(&mut self, now: Instant, file: &str, kind: FailureKind) -> Duration {
        let kinds = self.files.entry(file.to_owned()).or_default();
        let count = kinds.get(&kind).map_or(1, |f| f.count.saturating_add(1));
        let wait = delay(self.base, self.cap, count);
        let until = now.checked_add(wait).unwrap_or(now);
        kinds.insert(kind, Failures { count, until });
        wait
    }

    /// `file` was repaired (or needs no repair): its next failure waits `base` again.
    pub fn handle_success(&mut self, file: &str) {
        self.files.remove(file);
    }

    /// Whether `file` may be tried at `now`: no failure of any kind still waits.
    pub fn ready(&self, now: Instant, file: &str) -> bool {
        self.files
            .get(file)
            .is_none_or(|kinds| kinds.values().all(|f| f.until <= now))
    }

    /// Forgets the files `keep` says no (gone from the catalog).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.files.retain(|file, _| keep(file));
    }
}

/// `base · 2^(count-1)`, at most `cap`; no overflow whatever `count` is.
fn delay(base: Duration, cap: Duration, count: u32) -> Duration {
    let doublings = count.saturating_sub(1);
    2u32.checked_pow(doublings)
        .and_then(|factor| base.checked_mul(factor))
        .map_or(cap, |d| d.min(cap))
}
