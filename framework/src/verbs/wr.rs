//! Work requests, as callers build them and as libibverbs takes them (raw `ibv_*_wr`
//! structs chained through `next`): apart from `qp.rs` because an SRQ posts receives
//! through the same chain, and the QP's own file is about its lifetime and states.

use super::sys::*;

use super::error::Result;
use super::mr::{RemoteRegion, Sge};

/// The operation of a send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// Two-sided SEND; consumes a RECV at the peer.
    Send,
    /// SEND carrying a 32-bit immediate value to the peer's completion.
    SendWithImm(u32),
    /// One-sided RDMA WRITE of the local bytes into `remote`.
    Write(RemoteRegion),
    /// RDMA WRITE that also consumes a peer RECV and delivers `imm` in its completion.
    WriteWithImm(RemoteRegion, u32),
    /// One-sided RDMA READ of `remote` into the local bytes.
    Read(RemoteRegion),
    /// 64-bit compare-and-swap at `remote` (8-byte aligned); the old value lands locally.
    CompareSwap {
        /// Target word.
        remote: RemoteRegion,
        /// Value expected.
        compare: u64,
        /// Value written when it matches.
        swap: u64,
    },
    /// 64-bit fetch-and-add at `remote` (8-byte aligned); the old value lands locally.
    FetchAdd {
        /// Target word.
        remote: RemoteRegion,
        /// Amount added.
        add: u64,
    },
}

/// A send-queue work request.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned in the completion; the framework stores a slab index here.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local bytes (source for SEND/WRITE, destination for READ/atomics).
    pub local: Option<Sge<'a>>,
    /// Produce a completion on success (errors always complete).
    pub signaled: bool,
    /// Copy the bytes into the WQE (small SEND/WRITE only).
    pub inline: bool,
    /// Set the solicited-event bit (wakes a peer armed with solicited_only).
    pub solicited: bool,
}

impl<'a> SendWr<'a> {
    /// A signaled request of `op` with `local` bytes.
    pub fn new(wr_id: u64, op: SendOp, local: Option<Sge<'a>>) -> Self {
        SendWr {
            wr_id,
            op,
            local,
            signaled: true,
            inline: false,
            solicited: false,
        }
    }

    pub(super) fn raw(&self, sge: *mut ibv_sge) -> ibv_send_wr {
        use ibv_wr_opcode::*;
        // SAFETY: ibv_send_wr is plain old data; all-zero is valid (null pointers, no
        // flags), and every field that matters is set below.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = self.wr_id;
        if self.local.is_some() {
            wr.sg_list = sge;
            wr.num_sge = 1;
        }
        let mut flags = 0;
        if self.signaled {
            flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if self.inline {
            flags |= ibv_send_flags::IBV_SEND_INLINE.0;
        }
        if self.solicited {
            flags |= ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        wr.send_flags = flags;
        let rdma = |wr: &mut ibv_send_wr, r: &RemoteRegion| {
            wr.wr.rdma.remote_addr = r.addr;
            wr.wr.rdma.rkey = r.rkey;
        };
        match self.op {
            SendOp::Send => wr.opcode = IBV_WR_SEND,
            SendOp::SendWithImm(imm) => {
                wr.opcode = IBV_WR_SEND_WITH_IMM;
                wr.__bindgen_anon_1.imm_data = imm.to_be();
            }
            SendOp::Write(r) => {
                wr.opcode = IBV_WR_RDMA_WRITE;
                rdma(&mut wr, &r);
            }
            SendOp::WriteWithImm(r, imm) => {
                wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
                rdma(&mut wr, &r);
                wr.__bindgen_anon_1.imm_data = imm.to_be();
            }
            SendOp::Read(r) => {
                wr.opcode = IBV_WR_RDMA_READ;
                rdma(&mut wr, &r);
            }
            SendOp::CompareSwap {
                remote,
                compare,
                swap,
            } => {
                wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
                wr.wr.atomic.remote_addr = remote.addr;
                wr.wr.atomic.compare_add = compare;
                wr.wr.atomic.swap = swap;
                wr.wr.atomic.rkey = remote.rkey;
            }
            SendOp::FetchAdd { remote, add } => {
                wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
                wr.wr.atomic.remote_addr = remote.addr;
                wr.wr.atomic.compare_add = add;
                wr.wr.atomic.swap = 0;
                wr.wr.atomic.rkey = remote.rkey;
            }
        }
        wr
    }
}

/// A receive-queue work request.
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where the incoming SEND lands (None: only WRITE_WITH_IMM without payload).
    pub local: Option<Sge<'a>>,
}

/// Builds the linked `ibv_recv_wr` chain of `wrs` (with their SGEs) and hands its head
/// to `post`, for a QP's or an SRQ's receive queue; an empty list posts nothing. The
/// chain lives until `post` returns.
pub(crate) fn with_recv_chain(
    wrs: &[RecvWr<'_>],
    post: impl FnOnce(*mut ibv_recv_wr) -> Result<()>,
) -> Result<()> {
    if wrs.is_empty() {
        return Ok(());
    }
    let mut sges: Vec<ibv_sge> = wrs.iter().map(|w| raw_sge(w.local)).collect();
    let mut raws: Vec<ibv_recv_wr> = wrs
        .iter()
        .zip(sges.iter_mut())
        .map(|(w, s)| ibv_recv_wr {
            wr_id: w.wr_id,
            next: std::ptr::null_mut(),
            sg_list: s,
            num_sge: w.local.is_some() as i32,
        })
        .collect();
    post(link(&mut raws, |w: &mut ibv_recv_wr| &mut w.next))
}

/// The raw SGE of an optional local range (a zero-length one when there is none).
pub(crate) fn raw_sge(local: Option<Sge<'_>>) -> ibv_sge {
    local.map(|s| s.raw()).unwrap_or(ibv_sge {
        addr: 0,
        length: 0,
        lkey: 0,
    })
}

/// Chains `items` through their `next` pointers (as ibv_post_send/recv expect) and
/// returns the head. The chain points into `items`, so it must not move until posted.
pub(crate) fn link<T>(items: &mut [T], next: impl Fn(&mut T) -> &mut *mut T) -> *mut T {
    let base = items.as_mut_ptr();
    for i in 1..items.len() {
        // SAFETY: i-1 and i are in bounds; `base` stays valid while `items` is borrowed.
        unsafe { *next(&mut *base.add(i - 1)) = base.add(i) };
    }
    base
}
