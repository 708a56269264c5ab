//! Shared receive queues: one queue of receive buffers that several QPs consume from, so
//! receive memory scales with traffic rather than with the number of QPs.
//!
//! A QP created with an SRQ takes every incoming SEND from it; the completion names the
//! QP that consumed it (`qp_num`) and the wr_id the receive was posted with. Moving such
//! a QP to the error state does not flush the SRQ's receives: they stay for the other
//! QPs, and go when the SRQ is destroyed (after its last QP: each QP holds a clone).

use std::ptr::NonNull;
use std::sync::Arc;

use super::sys::*;

use super::error::{check, check_ptr, Result, Verb, VerbsError};
use super::pd::ProtectionDomain;
use super::wr::{with_recv_chain, RecvWr};

/// What an SRQ holds and when it warns (`struct ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// Receives it can hold (at least what was asked for).
    pub max_wr: u32,
    /// Scatter/gather entries per receive.
    pub max_sge: u32,
    /// The armed low-water mark (0: not armed).
    pub limit: u32,
}

/// A shared receive queue on a PD. Cheap to clone; destroyed after the last clone and
/// the last QP using it.
#[derive(Clone)]
pub struct SharedReceiveQueue {
    inner: Arc<SrqInner>,
}

struct SrqInner {
    _pd: ProtectionDomain,
    srq: NonNull<ibv_srq>,
}

// SAFETY: posting to and modifying an SRQ are thread-safe verbs; destroyed once in Drop.
unsafe impl Send for SrqInner {}
// SAFETY: as above.
unsafe impl Sync for SrqInner {}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: every QP attached to the SRQ holds a clone, so none is left; receives
        // still posted are discarded with it (their buffers are the caller's, which must
        // outlive this handle: the runtime keeps them in the same owner, dropped after).
        let ret = unsafe { ibv_destroy_srq(self.srq.as_ptr()) };
        if ret != 0 {
            tracing::error!(errno = ret, "ibv_destroy_srq failed");
        }
    }
}

impl SharedReceiveQueue {
    /// Creates an SRQ for up to `max_wr` receives of `max_sge` entries each.
    pub fn new(pd: &ProtectionDomain, max_wr: u32, max_sge: u32) -> Result<Self> {
        if max_wr == 0 || max_sge == 0 {
            return Err(VerbsError::InvalidArgument(
                "an SRQ needs room for at least one receive of one entry".into(),
            ));
        }
        let mut attr = ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ibv_srq_attr {
                max_wr,
                max_sge,
                srq_limit: 0,
            },
        };
        // SAFETY: the PD is alive (a clone is kept) and `attr` is a valid init struct.
        let srq = check_ptr(Verb::CreateSrq, unsafe {
            ibv_create_srq(pd.as_ptr(), &mut attr)
        })?;
        Ok(SharedReceiveQueue {
            inner: Arc::new(SrqInner {
                _pd: pd.clone(),
                srq,
            }),
        })
    }

    /// Posts receives with one doorbell. The buffers must stay registered until they
    /// complete or the SRQ is destroyed.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        with_recv_chain(wrs, |base| {
            let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
            // SAFETY: the chain and its SGEs live across the call; the SRQ is alive. The
            // local bytes are bounds-checked ranges of registrations their owner keeps
            // until the receive completes or the SRQ is gone.
            let ret = unsafe { ibv_post_srq_recv(self.inner.srq.as_ptr(), base, &mut bad) };
            check(Verb::PostSrqRecv, ret)
        })
    }

    /// Arms the low-water mark: when fewer than `limit` receives remain, the device
    /// raises `IBV_EVENT_SRQ_LIMIT_REACHED` once (and the mark disarms).
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        let mut attr = ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: the SRQ is alive and `attr` is valid for the LIMIT mask.
        let ret = unsafe {
            ibv_modify_srq(
                self.inner.srq.as_ptr(),
                &mut attr,
                ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as i32,
            )
        };
        check(Verb::ModifySrq, ret)
    }

    /// Current attributes.
    pub fn query(&self) -> Result<SrqAttr> {
        let mut attr = ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: 0,
        };
        // SAFETY: the SRQ is alive and `attr` is a valid out-pointer.
        let ret = unsafe { ibv_query_srq(self.inner.srq.as_ptr(), &mut attr) };
        check(Verb::QuerySrq, ret)?;
        Ok(SrqAttr {
            max_wr: attr.max_wr,
            max_sge: attr.max_sge,
            limit: attr.srq_limit,
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_srq {
        self.inner.srq.as_ptr()
    }
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReceiveQueue").finish_non_exhaustive()
    }
}
