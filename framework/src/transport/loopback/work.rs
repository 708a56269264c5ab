//! A posted send-queue request as the queue keeps it: the operation, the local bytes
//! held by `Arc` (so the request cannot outlive them), inline bytes copied at post time
//! into the ring's slot, and the flags.

use super::error::{LoopbackError, Result};
use super::memory::Slice;
use super::mr::Sge;
use super::responder::{Atomic, Payload};
use crate::transport::SendWr;
use crate::verbs::{Access, RemoteRegion, SendOp, WcOpcode};

/// The largest inline payload loopback copies at post time (the runtime's QPs ask for
/// 64 bytes; larger caps are clamped to this).
pub const MAX_INLINE: usize = 64;

/// An operation that reaches the peer.
#[derive(Clone, Copy)]
pub(super) enum Op {
    Send(Option<u32>),
    Write(RemoteRegion, Option<u32>),
    Read(RemoteRegion),
    Atomic(RemoteRegion, Atomic),
}

/// What the executor does with a request: an operation for the peer, or a window bind
/// that only touches this device's key table (ordered with the rest all the same).
pub(super) enum Work {
    Op(Op),
    Bind {
        key: u32,
        new_key: u32,
        region: Slice,
        access: Access,
    },
}

/// One slot of the send ring.
pub(super) struct Pending {
    pub(super) wr_id: u64,
    pub(super) work: Work,
    pub(super) local: Option<Slice>,
    pub(super) inline: Option<(usize, [u8; MAX_INLINE])>,
    pub(super) signaled: bool,
    pub(super) solicited: bool,
}

impl Pending {
    /// What the queue keeps of `wr`; refuses what a NIC refuses at post time.
    pub(super) fn new(wr: &SendWr<Sge<'_>>, max_inline: usize) -> Result<Pending> {
        let op = match wr.op {
            SendOp::Send => Op::Send(None),
            SendOp::SendWithImm(imm) => Op::Send(Some(imm)),
            SendOp::Write(r) => Op::Write(r, None),
            SendOp::WriteWithImm(r, imm) => Op::Write(r, Some(imm)),
            SendOp::Read(r) => Op::Read(r),
            SendOp::CompareSwap {
                remote,
                compare,
                swap,
            } => Op::Atomic(remote, Atomic::CompareSwap { compare, swap }),
            SendOp::FetchAdd { remote, add } => Op::Atomic(remote, Atomic::FetchAdd(add)),
        };
        if matches!(op, Op::Atomic(..)) && wr.local.is_none_or(|l| l.len() != 8) {
            return Err(LoopbackError::InvalidArgument(
                "an atomic needs an 8-byte local buffer".into(),
            ));
        }
        let mut inline = None;
        let mut local = wr.local.map(|l| l.slice());
        if wr.inline && matches!(op, Op::Send(_) | Op::Write(..)) {
            let len = wr.local.map_or(0, |l| l.len());
            if len > max_inline {
                return Err(LoopbackError::InvalidArgument(format!(
                    "inline payload of {len} bytes over the QP's {} bytes",
                    max_inline
                )));
            }
            let mut bytes = [0u8; MAX_INLINE];
            if let Some(l) = wr.local {
                l.read_into(&mut bytes);
            }
            inline = Some((len, bytes));
            local = None;
        }
        Ok(Pending {
            wr_id: wr.wr_id,
            work: Work::Op(op),
            local,
            inline,
            signaled: wr.signaled,
            solicited: wr.solicited,
        })
    }

    pub(super) fn opcode(&self) -> WcOpcode {
        match self.work {
            Work::Op(Op::Send(_)) => WcOpcode::Send,
            Work::Op(Op::Write(..)) => WcOpcode::RdmaWrite,
            Work::Op(Op::Read(_)) => WcOpcode::RdmaRead,
            Work::Op(Op::Atomic(_, Atomic::CompareSwap { .. })) => WcOpcode::CompareSwap,
            Work::Op(Op::Atomic(_, Atomic::FetchAdd(_))) => WcOpcode::FetchAdd,
            Work::Bind { .. } => WcOpcode::BindMw,
        }
    }

    pub(super) fn payload(&self) -> Payload<'_> {
        match (&self.inline, &self.local) {
            (Some((len, bytes)), _) => Payload::Inline(&bytes[..*len]),
            (None, Some(slice)) => Payload::Bytes(slice),
            (None, None) => Payload::Empty,
        }
    }
}
