//! Which connection a completion goes to, on each poller thread: the connections by QP
//! number, and the QPs of connections that left a shared receive queue, whose late
//! receive completions give their buffers back.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};

use crate::runtime::inbox::Inbox;
use crate::runtime::srq::{OrphanedRecv, SharedRecv};
use crate::verbs::WorkCompletion;

thread_local! {
    /// The connections this poller thread serves, by QP number. Weak: the connection's
    /// actor owns it, and a connection whose actor is gone simply stops receiving.
    static INBOXES: RefCell<HashMap<u32, Weak<dyn Inbox>>> = RefCell::new(HashMap::new());
}

/// Registers `inbox` for the completions of QP `qp_num`. Must run on the poller thread
/// that polls the QP's CQ (where [`CqReservation::arbiter`] runs the connection's actor),
/// and before the QP can complete anything: the connection's actor registers before it
/// makes the `rdma_accept` or `rdma_connect` call that takes the QP to RTR (see
/// `connection::Handshake`), so no completion ever arrives for a QP not registered yet.
pub(crate) fn register(qp_num: u32, inbox: Weak<dyn Inbox>) {
    INBOXES.with(|m| m.borrow_mut().insert(qp_num, inbox));
    ORPHANS.with(|o| o.borrow_mut().remove(&qp_num));
}

thread_local! {
    /// QPs of connections that left a shared receive queue, with the pass they left in:
    /// receives their QP consumed may still complete, and each such buffer must go back
    /// to the queue, or the other members run out of receives and their peers' SENDs meet
    /// RNR for ever. Kept until every CQ of this thread has been polled empty once after
    /// that pass (the QP is destroyed by then, so nothing more of it can arrive).
    static ORPHANS: RefCell<HashMap<u32, (OrphanedRecv, u64)>> = RefCell::new(HashMap::new());
    /// Full passes over this thread's CQs so far.
    static PASSES: Cell<u64> = const { Cell::new(0) };
}

/// A connection on a shared receive queue is leaving: completions of QP `qp_num` that
/// reach no connection from now on give their shared receives back to `queue`. Call it
/// on the poller thread, before the QP is destroyed.
pub(crate) fn adopt_orphan(qp_num: u32, queue: OrphanedRecv) {
    let pass = PASSES.with(Cell::get);
    ORPHANS.with(|o| o.borrow_mut().insert(qp_num, (queue, pass)));
}

/// Gives back the shared receives among `wcs`, completions of a QP whose connection is
/// gone; returns how many were neither (nobody is told about those).
pub(crate) fn return_orphans(wcs: &[WorkCompletion]) -> usize {
    let Some(first) = wcs.first() else {
        return 0;
    };
    let queue = ORPHANS.with(|o| o.borrow().get(&first.qp_num).map(|(q, _)| q.clone()));
    let mut dropped = 0;
    for wc in wcs {
        match (SharedRecv::slot_of(wc.wr_id), &queue) {
            (Some(slot), Some(queue)) if wc.qp_num == first.qp_num => {
                if let Err(e) = queue.repost(slot) {
                    tracing::error!(qp = wc.qp_num, slot, error = %e, "reposting an orphaned shared receive failed");
                }
            }
            _ => dropped += 1,
        }
    }
    dropped
}

/// Every CQ of this thread has just been polled empty: forget the orphans whose QP is
/// surely drained. Runs on every pass of a spinning poller, so the usual case (no
/// orphan) touches nothing but the counter.
pub(super) fn end_pass() {
    let pass = PASSES.with(|p| {
        p.set(p.get() + 1);
        p.get()
    });
    ORPHANS.with(|o| {
        let mut o = o.borrow_mut();
        if !o.is_empty() {
            o.retain(|_, (_, left)| *left + 2 > pass);
        }
    });
}

/// Stops delivering `qp_num`'s completions (on the same thread as [`register`]).
pub(crate) fn unregister(qp_num: u32) {
    INBOXES.with(|m| m.borrow_mut().remove(&qp_num));
}

pub(super) fn inbox(qp_num: u32) -> Option<Rc<dyn Inbox>> {
    INBOXES.with(|m| m.borrow().get(&qp_num)?.upgrade())
}
