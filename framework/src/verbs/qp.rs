//! Queue pairs and work-request posting (the work requests themselves are in `wr.rs`).
//!
//! Most QPs are created on an rdma_cm id (`CmId::create_qp`), which drives their state
//! through INIT/RTR/RTS during connect/accept. Others are created without one and walked
//! through those states by the typed bring-up in `bringup.rs` (RC, UC, UD; optionally on
//! a shared receive queue). Either way the result is a [`QueuePair`]: it holds its cm_id
//! (if any), PD, both CQs, its SRQ and a UD peer's address handle, so none of them can be
//! destroyed while it exists.

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

use super::sys::*;

use super::ah::AddressHandle;
use super::cm::CmIdInner;
use super::cq::CompletionQueue;
use super::error::{check, check_ptr, Result, Verb, VerbsError};
use super::mr::{Access, MemoryRegion, RemoteRegion};
use super::mw::{next_rkey, MemoryWindow};
use super::pd::ProtectionDomain;
use super::shared::SharedRegion;
use super::srq::SharedReceiveQueue;
use super::wr::{link, raw_sge, with_recv_chain, RecvWr, SendWr};

/// Queue sizes for a new QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send-queue work requests.
    pub max_send_wr: u32,
    /// Outstanding receive-queue work requests.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive request.
    pub max_recv_sge: u32,
    /// Bytes a send may carry inline (copied into the WQE, no lkey needed).
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        }
    }
}

/// QP state (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum QpState {
    Reset,
    Init,
    ReadyToReceive,
    ReadyToSend,
    SendQueueDrained,
    SendQueueError,
    Error,
    Unknown,
}

impl QpState {
    fn from_raw(raw: u32) -> Self {
        use ibv_qp_state::*;
        match raw {
            IBV_QPS_RESET => QpState::Reset,
            IBV_QPS_INIT => QpState::Init,
            IBV_QPS_RTR => QpState::ReadyToReceive,
            IBV_QPS_RTS => QpState::ReadyToSend,
            IBV_QPS_SQD => QpState::SendQueueDrained,
            IBV_QPS_SQE => QpState::SendQueueError,
            IBV_QPS_ERR => QpState::Error,
            _ => QpState::Unknown,
        }
    }
}

/// A queue pair. Cheap to clone; destroyed after the last clone is dropped.
#[derive(Clone)]
pub struct QueuePair {
    pub(crate) inner: Arc<QpInner>,
}

/// Who destroys the QP: rdma_cm (it created it on its id) or libibverbs directly.
pub(crate) enum QpOwner {
    Cm(Arc<CmIdInner>),
    Plain,
}

/// The one peer a UD QP sends to (its sends carry no address of their own).
#[derive(Debug, Clone)]
pub struct UdPeer {
    /// Where the datagrams go.
    pub ah: AddressHandle,
    /// The peer's QP number.
    pub qpn: u32,
    /// The Q_Key the peer's QP accepts.
    pub qkey: u32,
}

pub(crate) struct QpInner {
    owner: QpOwner,
    pub(crate) qp: NonNull<ibv_qp>,
    qp_num: u32,
    /// Fills the UD part of every send (UD QPs bound to one peer).
    ud_peer: Option<UdPeer>,
    _pd: ProtectionDomain,
    send_cq: CompletionQueue,
    recv_cq: CompletionQueue,
    srq: Option<SharedReceiveQueue>,
}

// SAFETY: posting and modifying a QP are thread-safe verbs; destroyed once in Drop.
unsafe impl Send for QpInner {}
// SAFETY: as above.
unsafe impl Sync for QpInner {}

impl Drop for QpInner {
    fn drop(&mut self) {
        match &self.owner {
            // SAFETY: the cm_id is kept alive by the owner; rdma_destroy_qp destroys
            // id->qp, which is this QP, and nothing else refers to it once the last clone
            // is gone.
            QpOwner::Cm(id) => unsafe { rdma_destroy_qp(id.as_ptr()) },
            QpOwner::Plain => {
                // SAFETY: created by ibv_create_qp and destroyed once, here; its CQs, SRQ
                // and address handle are fields dropped after this.
                let ret = unsafe { ibv_destroy_qp(self.qp.as_ptr()) };
                if ret != 0 {
                    tracing::error!(errno = ret, qp = self.qp_num, "ibv_destroy_qp failed");
                }
            }
        }
    }
}

/// The `ibv_qp_init_attr` both creation paths share.
fn init_attr(
    send_cq: &CompletionQueue,
    recv_cq: &CompletionQueue,
    caps: QpCaps,
    qp_type: ibv_qp_type::Type,
    srq: Option<&SharedReceiveQueue>,
) -> ibv_qp_init_attr {
    // SAFETY: ibv_qp_init_attr is plain old data; all-zero is valid.
    let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    attr.send_cq = send_cq.as_ptr();
    attr.recv_cq = recv_cq.as_ptr();
    attr.srq = srq.map_or(std::ptr::null_mut(), |s| s.as_ptr());
    attr.qp_type = qp_type;
    attr.sq_sig_all = 0;
    attr.cap = ibv_qp_cap {
        max_send_wr: caps.max_send_wr,
        // A QP on an SRQ has no receive queue of its own.
        max_recv_wr: if srq.is_some() { 0 } else { caps.max_recv_wr },
        max_send_sge: caps.max_send_sge,
        max_recv_sge: if srq.is_some() { 0 } else { caps.max_recv_sge },
        max_inline_data: caps.max_inline_data,
    };
    attr
}

impl QueuePair {
    pub(crate) fn create(
        id: Arc<CmIdInner>,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
        srq: Option<&SharedReceiveQueue>,
    ) -> Result<QueuePair> {
        let mut attr = init_attr(send_cq, recv_cq, caps, ibv_qp_type::IBV_QPT_RC, srq);
        // SAFETY: the id, PD, CQs and SRQ are alive and kept alive by the QP built below.
        let ret = unsafe { rdma_create_qp(id.as_ptr(), pd.as_ptr(), &mut attr) };
        check(Verb::CreateQp, ret)?;
        // SAFETY: rdma_create_qp succeeded, so id->qp points to the new QP.
        let qp = unsafe { (*id.as_ptr()).qp };
        let qp = NonNull::new(qp).ok_or_else(|| VerbsError::last_os(Verb::CreateQp))?;
        // SAFETY: the QP is alive.
        let qp_num = unsafe { qp.as_ref().qp_num };
        Ok(QueuePair {
            inner: Arc::new(QpInner {
                owner: QpOwner::Cm(id),
                qp,
                qp_num,
                ud_peer: None,
                _pd: pd.clone(),
                send_cq: send_cq.clone(),
                recv_cq: recv_cq.clone(),
                srq: srq.cloned(),
            }),
        })
    }

    /// Creates a QP without an rdma_cm id (`ibv_create_qp`), in the RESET state; the
    /// typed bring-up in `bringup.rs` is the only caller, so it cannot skip a state.
    pub(crate) fn create_plain(
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
        qp_type: ibv_qp_type::Type,
        srq: Option<&SharedReceiveQueue>,
        ud_peer: Option<UdPeer>,
    ) -> Result<QueuePair> {
        let mut attr = init_attr(send_cq, recv_cq, caps, qp_type, srq);
        // SAFETY: the PD, CQs and SRQ are alive and kept alive by the QP built below.
        let qp = unsafe { ibv_create_qp(pd.as_ptr(), &mut attr) };
        let qp = check_ptr(Verb::CreatePlainQp, qp)?;
        // SAFETY: the QP was just created.
        let qp_num = unsafe { qp.as_ref().qp_num };
        Ok(QueuePair {
            inner: Arc::new(QpInner {
                owner: QpOwner::Plain,
                qp,
                qp_num,
                ud_peer,
                _pd: pd.clone(),
                send_cq: send_cq.clone(),
                recv_cq: recv_cq.clone(),
                srq: srq.cloned(),
            }),
        })
    }

    /// The shared receive queue its receives come from, if any.
    pub fn srq(&self) -> Option<&SharedReceiveQueue> {
        self.inner.srq.as_ref()
    }

    /// The peer a UD QP is bound to.
    pub fn ud_peer(&self) -> Option<&UdPeer> {
        self.inner.ud_peer.as_ref()
    }

    /// Fills the UD addressing of a send for a QP bound to one peer.
    fn address(&self, wr: &mut ibv_send_wr) {
        if let Some(peer) = &self.inner.ud_peer {
            wr.wr.ud.ah = peer.ah.as_ptr();
            wr.wr.ud.remote_qpn = peer.qpn;
            wr.wr.ud.remote_qkey = peer.qkey;
        }
    }

    /// The QP number: completions carry it, so pollers route by it.
    pub fn qp_num(&self) -> u32 {
        self.inner.qp_num
    }

    /// The CQ its send completions go to.
    pub fn send_cq(&self) -> &CompletionQueue {
        &self.inner.send_cq
    }

    /// The CQ its receive completions go to.
    pub fn recv_cq(&self) -> &CompletionQueue {
        &self.inner.recv_cq
    }

    /// Current state, from `ibv_query_qp`.
    pub fn state(&self) -> Result<QpState> {
        // SAFETY: both structs are plain old data; all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the QP is alive; the out-pointers are valid.
        let ret = unsafe {
            ibv_query_qp(
                self.inner.qp.as_ptr(),
                &mut attr,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &mut init,
            )
        };
        check(Verb::QueryQp, ret)?;
        Ok(QpState::from_raw(attr.qp_state))
    }

    /// Moves the QP to the error state: every outstanding request completes with
    /// `WrFlushError`, which is how teardown drains a QP before destroying it.
    pub fn to_error(&self) -> Result<()> {
        // SAFETY: plain old data; all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        // SAFETY: the QP is alive and `attr` is valid for the STATE mask.
        let ret = unsafe {
            ibv_modify_qp(
                self.inner.qp.as_ptr(),
                &mut attr,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
            )
        };
        check(Verb::ModifyQp, ret)
    }

    /// Sets the RNR NAK timer this QP advertises as a responder (RTS to RTS). rdma_cm
    /// leaves it at 0, which means about 655 ms per RNR retry; 12 is about 0.64 ms.
    pub fn set_min_rnr_timer(&self, timer: u8) -> Result<()> {
        // SAFETY: plain old data; all-zero is valid.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.min_rnr_timer = timer;
        // SAFETY: the QP is alive and `attr` is valid for the MIN_RNR_TIMER mask.
        let ret = unsafe {
            ibv_modify_qp(
                self.inner.qp.as_ptr(),
                &mut attr,
                ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0 as i32,
            )
        };
        check(Verb::ModifyQp, ret)
    }

    /// Binds `window` to this QP over all of `region` with `access` (remote flags), as a
    /// signaled send-queue request with `wr_id`. Returns what the peer needs: the rkey is
    /// only good on this QP, and only until the window is rebound or deallocated. The
    /// bind executes before any request posted after it on this QP, so a SEND that
    /// carries the rkey can follow at once. `region` needs `Access::MW_BIND`.
    pub fn bind_window(
        &self,
        wr_id: u64,
        window: &MemoryWindow,
        region: &MemoryRegion,
        access: Access,
    ) -> Result<RemoteRegion> {
        if !region.access().contains(Access::MW_BIND) {
            return Err(VerbsError::InvalidArgument(
                "the region was registered without MW_BIND".into(),
            ));
        }
        // The caller keeps `region` registered while the window is bound, as `bind_raw`
        // requires (deallocating the window first revokes access).
        self.bind_raw(
            wr_id,
            window,
            region.raw_mr(),
            region.addr(),
            region.len() as u64,
            access,
        )
    }

    /// Binds `window` to this QP over `range` (bytes from the start of the registration)
    /// of a [`SharedRegion`] with exactly `access`, as a signaled send-queue request with
    /// `wr_id`; see [`bind_window`](Self::bind_window). Remote write or atomic access
    /// needs a writable region (not a read-only file mapping).
    ///
    /// The caller must keep a clone of `region` for as long as the window is bound: the
    /// MR cannot be deregistered under a bound window.
    pub fn bind_shared_window(
        &self,
        wr_id: u64,
        window: &MemoryWindow,
        region: &SharedRegion,
        range: Range<usize>,
        access: Access,
    ) -> Result<RemoteRegion> {
        if range.start >= range.end || range.end > region.len() {
            return Err(VerbsError::InvalidArgument(format!(
                "grant of {range:?} outside a shared region of {} bytes (or empty)",
                region.len()
            )));
        }
        let remote = access.remote_part();
        if remote != access || remote == Access::NONE {
            return Err(VerbsError::InvalidArgument(format!(
                "a grant gives remote access only, and some: {access:?}"
            )));
        }
        let writes = Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        if remote.bits() & writes.bits() != 0 && !region.access().contains(Access::LOCAL_WRITE) {
            return Err(VerbsError::InvalidArgument(
                "remote write or atomic access to a read-only region".into(),
            ));
        }
        self.bind_raw(
            wr_id,
            window,
            region.raw_mr(),
            region.addr() + range.start as u64,
            range.len() as u64,
            remote,
        )
    }

    /// Posts the bind work request. `mr` must stay registered while the window is bound
    /// and `[addr, addr + len)` must lie inside it (the callers check).
    fn bind_raw(
        &self,
        wr_id: u64,
        window: &MemoryWindow,
        mr: *mut ibv_mr,
        addr: u64,
        length: u64,
        access: Access,
    ) -> Result<RemoteRegion> {
        let rkey = next_rkey(window.rkey());
        // SAFETY: plain old data; all-zero is valid, the fields that matter are set below.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.__bindgen_anon_2.bind_mw.mw = window.as_ptr();
        wr.__bindgen_anon_2.bind_mw.rkey = rkey;
        wr.__bindgen_anon_2.bind_mw.bind_info = ibv_mw_bind_info {
            mr,
            addr,
            length,
            mw_access_flags: access.remote_part().bits(),
        };
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP, window and MR are alive across the call; the MR stays
        // registered while the window is bound (the callers keep both, and deallocating
        // the window first revokes access).
        let ret = unsafe { ibv_post_send(self.inner.qp.as_ptr(), &mut wr, &mut bad) };
        check(Verb::PostSend, ret)?;
        Ok(RemoteRegion {
            addr,
            len: length,
            rkey,
        })
    }

    /// Posts one send-queue request.
    pub fn post_send(&self, wr: &SendWr<'_>) -> Result<()> {
        let mut sge = raw_sge(wr.local);
        let mut raw = wr.raw(&mut sge);
        self.address(&mut raw);
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: `raw` and `sge` live across the call; the QP is alive. The local bytes
        // are a bounds-checked range of a registration that is deregistered before its
        // memory is freed, so the NIC never touches freed memory.
        let ret = unsafe { ibv_post_send(self.inner.qp.as_ptr(), &mut raw, &mut bad) };
        check(Verb::PostSend, ret)
    }

    /// Posts a chain of send-queue requests with one doorbell.
    pub fn post_send_list(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut sges: Vec<ibv_sge> = wrs.iter().map(|w| raw_sge(w.local)).collect();
        let mut raws: Vec<ibv_send_wr> = wrs
            .iter()
            .zip(sges.iter_mut())
            .map(|(w, s)| {
                let mut raw = w.raw(s);
                self.address(&mut raw);
                raw
            })
            .collect();
        let base = link(&mut raws, |w: &mut ibv_send_wr| &mut w.next);
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the chain and its SGEs live in `raws`/`sges` across the call; see
        // `post_send` for why the local bytes are safe to hand to the NIC.
        let ret = unsafe { ibv_post_send(self.inner.qp.as_ptr(), base, &mut bad) };
        check(Verb::PostSend, ret)
    }

    /// Posts receive requests with one doorbell.
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        if self.inner.srq.is_some() {
            return Err(VerbsError::InvalidArgument(
                "this QP receives from a shared receive queue; post there".into(),
            ));
        }
        if let [wr] = wrs {
            // One receive (the reposting path, once per message): no allocation.
            let mut sge = raw_sge(wr.local);
            let mut raw = ibv_recv_wr {
                wr_id: wr.wr_id,
                next: std::ptr::null_mut(),
                sg_list: &mut sge,
                num_sge: wr.local.is_some() as i32,
            };
            let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
            // SAFETY: `raw` and `sge` live across the call; see `post_send`.
            let ret = unsafe { ibv_post_recv(self.inner.qp.as_ptr(), &mut raw, &mut bad) };
            return check(Verb::PostRecv, ret);
        }
        with_recv_chain(wrs, |base| {
            let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
            // SAFETY: the chain and its SGEs live across the call; see `post_send`.
            let ret = unsafe { ibv_post_recv(self.inner.qp.as_ptr(), base, &mut bad) };
            check(Verb::PostRecv, ret)
        })
    }
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.inner.qp_num)
            .finish()
    }
}
