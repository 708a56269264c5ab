//! The responder half of a QP: what happens at the peer when a request arrives. It
//! consumes receives, checks rkeys, bounds and access, moves the bytes and completes
//! receives; what it cannot do it answers with a NAK, which the requester (`qp.rs`)
//! turns into a retry, a wait or an error completion.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use super::core::DeviceCore;
use super::cq::Cq;
use super::memory::{Slice, Storage};
use super::srq::{RecvQueue, Srq};
use crate::verbs::{Access, RemoteRegion, WcOpcode, WcStatus, WorkCompletion};

/// QP states, as the responder and requester read them without a lock.
pub(super) const RESET: u8 = 0;
/// Connected: sends and answers.
pub(super) const RTS: u8 = 1;
/// In error: flushes, answers nothing.
pub(super) const ERROR: u8 = 2;

/// Where a QP's receives come from.
pub(super) enum RecvSource {
    Own(RecvQueue),
    Shared(Srq),
}

impl RecvSource {
    pub(super) fn queue(&self) -> &RecvQueue {
        match self {
            RecvSource::Own(q) => q,
            RecvSource::Shared(s) => &s.queue,
        }
    }
}

/// The bytes a request carries.
pub(super) enum Payload<'a> {
    Empty,
    Bytes(&'a Slice),
    Inline(&'a [u8]),
}

impl Payload<'_> {
    pub(super) fn len(&self) -> usize {
        match self {
            Payload::Empty => 0,
            Payload::Bytes(s) => s.len,
            Payload::Inline(b) => b.len(),
        }
    }

    fn copy_into(&self, dst: &Storage, offset: usize) {
        match self {
            Payload::Empty => {}
            Payload::Bytes(s) => s.copy_into(dst, offset),
            Payload::Inline(b) => dst.write(offset, b),
        }
    }
}

/// An atomic operation on one 8-byte word.
#[derive(Clone, Copy)]
pub(super) enum Atomic {
    CompareSwap { compare: u64, swap: u64 },
    FetchAdd(u64),
}

/// Why a request did not complete at the responder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Nak {
    /// Nothing answered (stalled, in error, gone, vanished): the requester retransmits
    /// after its ACK timeout, and fails after its retry count.
    NoAnswer,
    /// Receiver not ready: no receive posted; retry after this long.
    Rnr(Duration),
    /// Refused for good: the requester completes with this status, and the responder
    /// QP goes to the error state.
    Fatal(WcStatus),
}

/// The responder state of one QP.
pub(super) struct Responder {
    pub(super) num: u32,
    pub(super) device: Arc<DeviceCore>,
    pub(super) recv: RecvSource,
    pub(super) recv_cq: Cq,
    pub(super) state: AtomicU8,
    /// Fault hook: the QP neither sends nor answers.
    pub(super) stalled: AtomicBool,
    /// The RNR timer it advertises, in nanoseconds.
    pub(super) rnr_timer_ns: AtomicU64,
}

impl Responder {
    /// True when a request reaching this QP gets an answer.
    pub(super) fn answers(&self) -> bool {
        self.state.load(Relaxed) == RTS && !self.stalled.load(Relaxed) && self.device.answers()
    }

    fn complete(
        &self,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        len: usize,
        imm: Option<u32>,
        solicited: bool,
    ) {
        let wc = WorkCompletion {
            wr_id,
            status,
            opcode,
            // What landed in a receive or was READ: within a registration's u32 SGE.
            byte_len: u32::try_from(len).unwrap_or(u32::MAX),
            imm_data: imm,
            qp_num: self.num,
            vendor_err: 0,
        };
        self.recv_cq.inner.push(wc, solicited);
    }

    fn rnr(&self) -> Nak {
        Nak::Rnr(Duration::from_nanos(self.rnr_timer_ns.load(Relaxed)))
    }

    /// An incoming SEND (with or without immediate data): lands in the oldest receive.
    pub(super) fn send(
        &self,
        payload: Payload<'_>,
        imm: Option<u32>,
        solicited: bool,
    ) -> Result<(), Nak> {
        if !self.answers() {
            return Err(Nak::NoAnswer);
        }
        let Some(recv) = self.recv.queue().take() else {
            return Err(self.rnr());
        };
        let len = payload.len();
        let room = recv.buf.as_ref().map_or(0, |b| b.len);
        if len > room {
            self.complete(
                recv.wr_id,
                WcStatus::LocalLengthError,
                WcOpcode::Recv,
                len,
                None,
                true,
            );
            return Err(Nak::Fatal(WcStatus::RemoteInvalidRequestError));
        }
        if let Some(buf) = &recv.buf {
            if !buf.storage.is_live() || !buf.storage.access.contains(Access::LOCAL_WRITE) {
                self.complete(
                    recv.wr_id,
                    WcStatus::LocalProtectionError,
                    WcOpcode::Recv,
                    len,
                    None,
                    true,
                );
                return Err(Nak::Fatal(WcStatus::RemoteOperationError));
            }
            payload.copy_into(&buf.storage, buf.offset);
        }
        self.complete(
            recv.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            len,
            imm,
            solicited,
        );
        Ok(())
    }

    /// An incoming RDMA WRITE, with immediate data when `imm` is given (then it also
    /// consumes a receive, whose buffer it leaves alone).
    pub(super) fn write(
        &self,
        payload: Payload<'_>,
        remote: RemoteRegion,
        imm: Option<u32>,
        solicited: bool,
    ) -> Result<(), Nak> {
        if !self.answers() {
            return Err(Nak::NoAnswer);
        }
        let len = payload.len();
        // A zero-length WRITE touches no memory, so NICs check no key for it.
        let target = if len == 0 {
            None
        } else {
            let found = self.device.keys.resolve(
                remote.rkey,
                remote.addr,
                len,
                Access::REMOTE_WRITE,
                self.num,
            );
            Some(found.map_err(|_| Nak::Fatal(WcStatus::RemoteAccessError))?)
        };
        let recv = match imm {
            Some(_) => Some(self.recv.queue().take().ok_or_else(|| self.rnr())?),
            None => None,
        };
        if let Some((storage, offset)) = target {
            payload.copy_into(&storage, offset);
        }
        if let Some(recv) = recv {
            self.complete(
                recv.wr_id,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                len,
                imm,
                solicited,
            );
        }
        Ok(())
    }

    /// An incoming RDMA READ at `remote` into `dst` (the requester's; none reads
    /// nothing, as a zero-length READ).
    pub(super) fn read(&self, remote: RemoteRegion, dst: Option<&Slice>) -> Result<(), Nak> {
        if !self.answers() {
            return Err(Nak::NoAnswer);
        }
        let Some(dst) = dst.filter(|d| d.len > 0) else {
            return Ok(());
        };
        let (storage, offset) = self
            .device
            .keys
            .resolve(
                remote.rkey,
                remote.addr,
                dst.len,
                Access::REMOTE_READ,
                self.num,
            )
            .map_err(|_| Nak::Fatal(WcStatus::RemoteAccessError))?;
        super::memory::copy(&storage, offset, &dst.storage, dst.offset, dst.len);
        // Pairs with a seqlock writer's fences (`shared.rs`): if this READ saw any store
        // made after a version marker, a later READ sees that marker or a later one, as
        // a NIC reading coherent memory does. Free on x86.
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        Ok(())
    }

    /// An incoming atomic on the 8-byte word at `remote`; returns the old value.
    pub(super) fn atomic(&self, remote: RemoteRegion, op: Atomic) -> Result<u64, Nak> {
        if !self.answers() {
            return Err(Nak::NoAnswer);
        }
        if remote.addr % 8 != 0 {
            return Err(Nak::Fatal(WcStatus::RemoteInvalidRequestError));
        }
        let (storage, offset) = self
            .device
            .keys
            .resolve(remote.rkey, remote.addr, 8, Access::REMOTE_ATOMIC, self.num)
            .map_err(|_| Nak::Fatal(WcStatus::RemoteAccessError))?;
        let word = storage.word(offset);
        Ok(match op {
            Atomic::CompareSwap { compare, swap } => {
                match word.compare_exchange(
                    compare,
                    swap,
                    std::sync::atomic::Ordering::AcqRel,
                    std::sync::atomic::Ordering::Acquire,
                ) {
                    Ok(old) | Err(old) => old,
                }
            }
            Atomic::FetchAdd(add) => word.fetch_add(add, std::sync::atomic::Ordering::AcqRel),
        })
    }
}
