//! How a poller thread shares its time: with the arbiter's other tasks (the connection
//! actors' mailboxes, [`LetOthersRun`] every [`PASSES_PER_TURN`] passes), and between
//! bulk work and small messages (the [`Backlog`]).
//!
//! A completion of an RDMA READ is the expensive kind for the connection that gets it:
//! a rendezvous chunk is copied out of its pool buffer into the message, and the next
//! chunk's READ is posted (over loopback the posting thread moves its bytes, too). A CQ
//! is first in, first out, so a small message that lands behind the chunks of a few
//! large ones waits for all of them: measured natively (bench/notes/2026-11-27-fairness.md),
//! a 64 B echo next to two 8 MiB echoes had a p99 of about 65 us in round trips that
//! never waited for a CPU, against 3 us alone.
//!
//! So a poller routes what it polls in two classes. Connections with no READ completion
//! in the batch get theirs at once. The READ completions, and everything after them of
//! the same connection (its order must hold), wait in a [`Backlog`] that is handed out a
//! step of at most [`STEP_BYTES`] at a time, with the CQ polled again between steps: a
//! small message waits behind one step of bulk work, not behind every chunk polled
//! before it. Bulk keeps its rate: every step is work that was due anyway, and the
//! rendezvous window (`ConnectionConfig::rendezvous_chunks`) still bounds what is in
//! flight.
//!
//! Where a post costs a doorbell (verbs; under Soft-RoCE a system call and a run of the
//! kernel's requester per post), a connection whose completions are split into steps
//! holds its posts until its last step of the drain, so that the next chunks' READs
//! share one doorbell as they did when the whole batch went at once: posting one per
//! step made the VM's verified upload 10% slower. Loopback posts at every step, since
//! there a post costs its bytes, which one step should not gather
//! (`Transport::POSTS_MOVE_BYTES`).

use std::collections::{HashMap, VecDeque};

use crate::verbs::{WcOpcode, WorkCompletion};

/// Poller passes between turns for the arbiter's other tasks: the connection actors'
/// mailboxes (CM notices, client calls, wake-ups) and tasks spawned on this thread. A pass
/// is about a microsecond under emulation.
pub(crate) const PASSES_PER_TURN: u32 = 4;

/// Rounds of one pass: each polls every CQ and steps the backlog once. A pass ends
/// sooner when all is empty; this bound is for the flood that never lets them empty, so
/// that the thread's other tasks still get their turn every [`PASSES_PER_TURN`] passes.
/// (Without it, a `GetInto` flood starved the service actor living on a poller thread:
/// a polite client's request waited seconds for a turn, issue 45.)
pub(crate) const DRAIN_ROUNDS: u32 = 16;

/// Batches one round polls from one CQ at most (each up to `POLL_BATCH` completions).
pub(crate) const POLLS_PER_ROUND: u32 = 4;

/// Lets the arbiter's other ready tasks run, then resumes the poller.
///
/// Not `tokio::task::yield_now`: that defers the task until the runtime has polled its I/O
/// driver, an `epoll_wait` system call per turn. Waking itself puts the poller at the back
/// of the arbiter's ready queue instead, so the actors run in between and the driver is
/// polled only every few dozen turns (tokio's event interval). Measured under Soft-RoCE:
/// the echo round trip went from 70-100 us to 60-70 us.
#[derive(Default)]
pub(crate) struct LetOthersRun {
    yielded: bool,
}

impl std::future::Future for LetOthersRun {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.yielded {
            return std::task::Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// READ bytes a step hands out (at least one completion, whatever its size): one default
/// rendezvous chunk, a few microseconds of copying.
pub(crate) const STEP_BYTES: u64 = 64 * 1024;

/// The deferred bulk completions of one poller thread.
#[derive(Default)]
pub(crate) struct Backlog {
    deferred: VecDeque<WorkCompletion>,
    /// How many completions of each QP wait in `deferred`: a QP listed here has every new
    /// completion deferred behind them.
    held: HashMap<u32, usize>,
    /// The completions of a batch that go at once (kept to reuse its allocation).
    light: Vec<WorkCompletion>,
    /// QPs with a READ completion in the batch being admitted (idem).
    heavy: Vec<u32>,
}

impl Backlog {
    /// True when nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.deferred.is_empty()
    }

    /// Takes a polled batch: hands `route` the completions of connections with no READ
    /// completion in it and nothing deferred (in CQ order), and defers the rest.
    pub(crate) fn admit(
        &mut self,
        wcs: &[WorkCompletion],
        mut route: impl FnMut(&[WorkCompletion]),
    ) {
        self.heavy.clear();
        for wc in wcs.iter().filter(|wc| wc.opcode == WcOpcode::RdmaRead) {
            if !self.heavy.contains(&wc.qp_num) {
                self.heavy.push(wc.qp_num);
            }
        }
        if self.heavy.is_empty() && self.held.is_empty() {
            route(wcs);
            return;
        }
        self.light.clear();
        for wc in wcs {
            if self.heavy.contains(&wc.qp_num) || self.held.contains_key(&wc.qp_num) {
                self.deferred.push_back(*wc);
                *self.held.entry(wc.qp_num).or_default() += 1;
            } else {
                self.light.push(*wc);
            }
        }
        if !self.light.is_empty() {
            route(&self.light);
        }
    }

    /// Hands `route` one step of the deferred completions, oldest first: the front
    /// connection's consecutive completions up to [`STEP_BYTES`] of READs, and whether
    /// more of that connection's stay deferred after them (the poller then lets it hold
    /// its posts for its last step where a post costs a doorbell: see
    /// `Transport::POSTS_MOVE_BYTES`). False when nothing waited.
    pub(crate) fn step(&mut self, mut route: impl FnMut(&[WorkCompletion], bool)) -> bool {
        let Some(first) = self.deferred.front() else {
            return false;
        };
        let qp = first.qp_num;
        let (mut n, mut bytes) = (0, 0u64);
        for wc in self.deferred.iter().take_while(|wc| wc.qp_num == qp) {
            if wc.opcode == WcOpcode::RdmaRead {
                if n > 0 && bytes + u64::from(wc.byte_len) > STEP_BYTES {
                    break;
                }
                bytes += u64::from(wc.byte_len);
            }
            n += 1;
        }
        let more = self.held.get(&qp).is_some_and(|&left| left > n);
        let step = self.deferred.make_contiguous();
        route(&step[..n], more);
        self.deferred.drain(..n);
        match self.held.get_mut(&qp) {
            Some(left) if *left > n => *left -= n,
            _ => {
                self.held.remove(&qp);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::WcStatus;

    fn wc(qp_num: u32, wr_id: u64, opcode: WcOpcode, byte_len: u32) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status: WcStatus::Success,
            opcode,
            byte_len,
            imm_data: None,
            qp_num,
            vendor_err: 0,
        }
    }

    fn recv(qp: u32, id: u64) -> WorkCompletion {
        wc(qp, id, WcOpcode::Recv, 64)
    }

    fn read(qp: u32, id: u64) -> WorkCompletion {
        wc(qp, id, WcOpcode::RdmaRead, 64 * 1024)
    }

    /// Routes into a list of (qp, wr_id), one inner list per call.
    fn recorder(calls: &mut Vec<Vec<(u32, u64)>>) -> impl FnMut(&[WorkCompletion]) + '_ {
        |wcs| calls.push(wcs.iter().map(|w| (w.qp_num, w.wr_id)).collect())
    }

    /// The same, for `step`.
    fn stepper(calls: &mut Vec<Vec<(u32, u64)>>) -> impl FnMut(&[WorkCompletion], bool) + '_ {
        let mut record = recorder(calls);
        move |wcs, _more| record(wcs)
    }

    #[test]
    fn a_step_says_whether_its_connection_has_more_deferred() {
        let mut b = Backlog::default();
        b.admit(&[read(1, 10), read(1, 11), read(2, 20)], |_| {});
        let mut seen = Vec::new();
        while b.step(|wcs, more| seen.push((wcs[0].qp_num, wcs.len(), more))) {}
        assert_eq!(seen, vec![(1, 1, true), (1, 1, false), (2, 1, false)]);
    }

    #[test]
    fn a_batch_without_reads_goes_whole_and_at_once() {
        let mut b = Backlog::default();
        let mut calls = Vec::new();
        b.admit(&[recv(1, 1), recv(2, 2), recv(1, 3)], recorder(&mut calls));
        assert_eq!(calls, [vec![(1, 1), (2, 2), (1, 3)]]);
        assert!(b.is_empty());
        assert!(!b.step(stepper(&mut calls)));
    }

    #[test]
    fn small_messages_pass_the_reads_polled_before_them() {
        let mut b = Backlog::default();
        let mut calls = Vec::new();
        // Two bulk connections' chunks, then a small message.
        let batch = [read(1, 1), read(1, 2), read(2, 3), read(2, 4), recv(3, 5)];
        b.admit(&batch, recorder(&mut calls));
        assert_eq!(calls, [vec![(3, 5)]]);
        // Then one chunk per step, oldest first.
        calls.clear();
        while b.step(stepper(&mut calls)) {}
        assert_eq!(
            calls,
            [vec![(1, 1)], vec![(1, 2)], vec![(2, 3)], vec![(2, 4)]]
        );
        assert!(b.is_empty());
    }

    #[test]
    fn a_connection_with_deferred_work_keeps_its_order() {
        let mut b = Backlog::default();
        let mut calls = Vec::new();
        b.admit(&[read(1, 1), recv(1, 2), recv(2, 3)], recorder(&mut calls));
        // QP 1's receive came after its READ: it waits behind it; QP 2's does not.
        assert_eq!(calls, [vec![(2, 3)]]);
        // A later batch with only a receive of QP 1: still behind the READ.
        calls.clear();
        b.admit(&[recv(1, 4), recv(2, 5)], recorder(&mut calls));
        assert_eq!(calls, [vec![(2, 5)]]);
        calls.clear();
        while b.step(stepper(&mut calls)) {}
        // The READ, with the completions behind it up to the next READ.
        assert_eq!(calls, [vec![(1, 1), (1, 2), (1, 4)]]);
        // Released: QP 1 goes at once again.
        calls.clear();
        b.admit(&[recv(1, 6)], recorder(&mut calls));
        assert_eq!(calls, [vec![(1, 6)]]);
    }

    #[test]
    fn a_step_holds_at_most_its_bytes_of_reads_but_always_one() {
        let mut b = Backlog::default();
        let mut calls = Vec::new();
        let small_reads = [
            wc(1, 1, WcOpcode::RdmaRead, 16 * 1024),
            wc(1, 2, WcOpcode::RdmaRead, 16 * 1024),
            wc(1, 3, WcOpcode::RdmaRead, 32 * 1024),
            wc(1, 4, WcOpcode::RdmaRead, 1024),
            wc(1, 5, WcOpcode::RdmaRead, 1 << 20),
        ];
        b.admit(&small_reads, recorder(&mut calls));
        assert!(calls.is_empty());
        while b.step(stepper(&mut calls)) {}
        assert_eq!(
            calls,
            [vec![(1, 1), (1, 2), (1, 3)], vec![(1, 4)], vec![(1, 5)]]
        );
    }
}
