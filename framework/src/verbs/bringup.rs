//! Bringing a QP up without rdma_cm: RESET → INIT → RTR → RTS with `ibv_modify_qp`, as
//! the `ibv_*_pingpong` tools and other out-of-band programs do.
//!
//! The state is a type parameter and the transport another, so a transition that skips a
//! state or gives the wrong attributes does not compile: each transport names the
//! attributes each step needs (an RC QP's RTR needs a path, MTU, the peer's QPN and PSN,
//! the RNR timer and READ depth; a UC QP's the same without the last two; a UD QP's
//! nothing), and only `Bringup<_, Rtr>` has `ready_to_send`, which hands out the usable
//! [`QueuePair`]:
//!
//! ```compile_fail
//! use rdmactor::verbs::{Bringup, Psn, Rc, Reset};
//! fn skip(qp: Bringup<Rc, Reset>) {
//!     let _ = qp.ready_to_send(&Psn { sq_psn: 0 }); // RESET cannot go to RTS
//! }
//! ```
//!
//! Receives can be posted (through [`Bringup::qp`]) from INIT on; post them before RTR,
//! so the peer's first SEND finds one.

use std::marker::PhantomData;

use super::sys::*;

use super::ah::AddressVector;
use super::cq::CompletionQueue;
use super::error::{check, Result, Verb};
use super::mr::Access;
use super::pd::ProtectionDomain;
use super::port::Mtu;
use super::qp::{QpCaps, QueuePair, UdPeer};
use super::srq::SharedReceiveQueue;

/// Reliable connected: acknowledged, retransmitted, in order.
#[derive(Debug)]
pub enum Rc {}
/// Unreliable connected: one peer, no acknowledgements (a lost packet loses its message).
#[derive(Debug)]
pub enum Uc {}
/// Unreliable datagram: any peer per send, messages up to the path MTU, 40-byte GRH in
/// front of every receive.
#[derive(Debug)]
pub enum Ud {}

/// State marker: just created.
#[derive(Debug)]
pub enum Reset {}
/// State marker: bound to a port; receives may be posted.
#[derive(Debug)]
pub enum Init {}
/// State marker: ready to receive.
#[derive(Debug)]
pub enum Rtr {}

/// INIT attributes of a connected QP (RC, UC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectedInit {
    /// Local port, 1-based.
    pub port_num: u8,
    /// P_Key table index.
    pub pkey_index: u16,
    /// Remote access the QP allows (the pingpong tools allow none).
    pub access: Access,
}

/// INIT attributes of a UD QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdInit {
    /// Local port, 1-based.
    pub port_num: u8,
    /// P_Key table index.
    pub pkey_index: u16,
    /// The Q_Key datagrams to this QP must carry (`ibv_ud_pingpong` uses 0x11111111).
    pub qkey: u32,
}

/// RTR attributes of an RC QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcRtr {
    /// The path to the peer's port.
    pub path: AddressVector,
    /// Path MTU (at most the port's active MTU).
    pub mtu: Mtu,
    /// The peer's QP number.
    pub dest_qp_num: u32,
    /// The first PSN expected from the peer (its send PSN).
    pub rq_psn: u32,
    /// RDMA READs / atomics the peer may have outstanding at this responder.
    pub max_dest_rd_atomic: u8,
    /// The RNR NAK timer this QP advertises (12 is about 0.64 ms).
    pub min_rnr_timer: u8,
}

/// RTR attributes of a UC QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UcRtr {
    /// The path to the peer's port.
    pub path: AddressVector,
    /// Path MTU.
    pub mtu: Mtu,
    /// The peer's QP number.
    pub dest_qp_num: u32,
    /// The first PSN expected from the peer.
    pub rq_psn: u32,
}

/// RTS attributes of an RC QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcRts {
    /// This side's first send PSN.
    pub sq_psn: u32,
    /// Local ACK timeout (4.096 us × 2^timeout; the tools use 14, about 67 ms).
    pub timeout: u8,
    /// Transport retries (7 at most).
    pub retry_cnt: u8,
    /// RNR retries (7: forever).
    pub rnr_retry: u8,
    /// RDMA READs / atomics this side may have outstanding.
    pub max_rd_atomic: u8,
}

/// RTS attributes of UC and UD QPs: only the first send PSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Psn {
    /// This side's first send PSN.
    pub sq_psn: u32,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Rc {}
    impl Sealed for super::Uc {}
    impl Sealed for super::Ud {}
}

/// A QP type (the verbs call it a transport: RC, UC, UD) and the attributes each state
/// transition needs. Sealed. Not [`crate::transport::Transport`], which is what the
/// runtime runs over (verbs or loopback).
pub trait QpKind: sealed::Sealed {
    /// What INIT needs.
    type InitAttr;
    /// What RTR needs.
    type RtrAttr;
    /// What RTS needs.
    type RtsAttr;
    /// `ibv_qp_type` of this transport.
    #[doc(hidden)]
    const QP_TYPE: ibv_qp_type::Type;
    /// The attribute struct and mask of RESET → INIT.
    #[doc(hidden)]
    fn init_attr(a: &Self::InitAttr) -> (ibv_qp_attr, ibv_qp_attr_mask);
    /// The attribute struct and mask of INIT → RTR.
    #[doc(hidden)]
    fn rtr_attr(a: &Self::RtrAttr) -> (ibv_qp_attr, ibv_qp_attr_mask);
    /// The attribute struct and mask of RTR → RTS.
    #[doc(hidden)]
    fn rts_attr(a: &Self::RtsAttr) -> (ibv_qp_attr, ibv_qp_attr_mask);
}

fn zeroed(state: ibv_qp_state::Type) -> ibv_qp_attr {
    // SAFETY: ibv_qp_attr is plain old data; all-zero is valid.
    let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
    attr.qp_state = state;
    attr
}

use ibv_qp_attr_mask as M;

fn connected_init(a: &ConnectedInit) -> (ibv_qp_attr, ibv_qp_attr_mask) {
    let mut attr = zeroed(ibv_qp_state::IBV_QPS_INIT);
    attr.port_num = a.port_num;
    attr.pkey_index = a.pkey_index;
    attr.qp_access_flags = a.access.remote_part().bits();
    (
        attr,
        M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
    )
}

fn connected_rtr(
    path: &AddressVector,
    mtu: Mtu,
    dest_qp_num: u32,
    rq_psn: u32,
) -> (ibv_qp_attr, ibv_qp_attr_mask) {
    let mut attr = zeroed(ibv_qp_state::IBV_QPS_RTR);
    attr.ah_attr = path.raw();
    attr.path_mtu = mtu.raw();
    attr.dest_qp_num = dest_qp_num;
    attr.rq_psn = rq_psn & 0xff_ffff;
    (
        attr,
        M::IBV_QP_STATE | M::IBV_QP_AV | M::IBV_QP_PATH_MTU | M::IBV_QP_DEST_QPN | M::IBV_QP_RQ_PSN,
    )
}

fn psn_rts(a: &Psn) -> (ibv_qp_attr, ibv_qp_attr_mask) {
    let mut attr = zeroed(ibv_qp_state::IBV_QPS_RTS);
    attr.sq_psn = a.sq_psn & 0xff_ffff;
    (attr, M::IBV_QP_STATE | M::IBV_QP_SQ_PSN)
}

impl QpKind for Rc {
    type InitAttr = ConnectedInit;
    type RtrAttr = RcRtr;
    type RtsAttr = RcRts;
    const QP_TYPE: ibv_qp_type::Type = ibv_qp_type::IBV_QPT_RC;

    fn init_attr(a: &ConnectedInit) -> (ibv_qp_attr, ibv_qp_attr_mask) {
        connected_init(a)
    }

    fn rtr_attr(a: &RcRtr) -> (ibv_qp_attr, ibv_qp_attr_mask) {
        let (mut attr, mask) = connected_rtr(&a.path, a.mtu, a.dest_qp_num, a.rq_psn);
        attr.max_dest_rd_atomic = a.max_dest_rd_atomic;
        attr.min_rnr_timer = a.min_rnr_timer;
        (
            attr,
            mask | M::IBV_QP_MAX_DEST_RD_ATOMIC | M::IBV_QP_MIN_RNR_TIMER,
        )
    }

    fn rts_attr(a: &RcRts) -> (ibv_qp_attr, ibv_qp_attr_mask) {
        let (mut attr, mask) = psn_rts(&Psn { sq_psn: a.sq_psn });
        attr.timeout = a.timeout;
        attr.retry_cnt = a.retry_cnt;
        attr.rnr_retry = a.rnr_retry;
        attr.max_rd_atomic = a.max_rd_atomic;
        (
            attr,
            mask | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
        )
    }
}

impl QpKind for Uc {
    type InitAttr = ConnectedInit;
    type RtrAttr = UcRtr;
    type RtsAttr = Psn;
    const QP_TYPE: ibv_qp_type::Type = ibv_qp_type::IBV_QPT_UC;

    fn init_attr(a: &ConnectedInit) -> (ibv_qp_attr, ibv_qp_attr_mask) {
        connected_init(a)
    }

    fn rtr_attr(a: &UcRtr) -> (ibv_qp_attr, ibv_qp_attr_mask) {
        connected_rtr(&a.path, a.mtu, a.dest_qp_num, a.rq_psn)
    }

    fn rts_attr(a: &Psn) -> (ibv_qp_attr, ibv_qp_attr_mask) {
        psn_rts(a)
    }
}

impl QpKind for Ud {
    type InitAttr = UdInit;
    type RtrAttr = ();
    type RtsAttr = Psn;
    const QP_TYPE: ibv_qp_type::Type = ibv_qp_type::IBV_QPT_UD;

    fn init_attr(a: &UdInit) -> (ibv_qp_attr, ibv_qp_attr_mask) {
        let mut attr = zeroed(ibv_qp_state::IBV_QPS_INIT);
        attr.port_num = a.port_num;
        attr.pkey_index = a.pkey_index;
        attr.qkey = a.qkey;
        (
            attr,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_QKEY,
        )
    }

    fn rtr_attr(_: &()) -> (ibv_qp_attr, ibv_qp_attr_mask) {
        (zeroed(ibv_qp_state::IBV_QPS_RTR), M::IBV_QP_STATE)
    }

    fn rts_attr(a: &Psn) -> (ibv_qp_attr, ibv_qp_attr_mask) {
        psn_rts(a)
    }
}

/// A QP of transport `T` on its way to RTS, in state `S`. Dropping it destroys the QP.
pub struct Bringup<T, S> {
    qp: QueuePair,
    _marker: PhantomData<(T, S)>,
}

impl<T, S> std::fmt::Debug for Bringup<T, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bringup")
            .field("qp_num", &self.qp.qp_num())
            .field("state", &std::any::type_name::<S>())
            .finish()
    }
}

impl<T: QpKind, S> Bringup<T, S> {
    /// The QP, to post receives before RTR or to record its number. Posting sends before
    /// RTS fails (the provider refuses them).
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    fn modify(
        self,
        verb: Verb,
        (mut attr, mask): (ibv_qp_attr, ibv_qp_attr_mask),
    ) -> Result<QueuePair> {
        // SAFETY: the QP is alive; `attr` is valid for `mask` (built by the transport's
        // attribute function for exactly this transition).
        let ret = unsafe { ibv_modify_qp(self.qp.inner.qp.as_ptr(), &mut attr, mask.0 as i32) };
        check(verb, ret)?;
        Ok(self.qp)
    }

    fn next<N>(qp: QueuePair) -> Bringup<T, N> {
        Bringup {
            qp,
            _marker: PhantomData,
        }
    }
}

impl<T: QpKind> Bringup<T, Reset> {
    /// Creates a QP of transport `T` (RESET) on `pd` with its completions on the given
    /// CQs, taking its receives from `srq` when given.
    pub fn create(
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
        srq: Option<&SharedReceiveQueue>,
    ) -> Result<Self> {
        let qp = QueuePair::create_plain(pd, send_cq, recv_cq, caps, T::QP_TYPE, srq, None)?;
        Ok(Self::next(qp))
    }

    /// RESET → INIT.
    pub fn init(self, attr: &T::InitAttr) -> Result<Bringup<T, Init>> {
        let qp = self.modify(Verb::ModifyQpToInit, T::init_attr(attr))?;
        Ok(Self::next(qp))
    }
}

impl Bringup<Ud, Reset> {
    /// Creates a UD QP whose every send goes to `peer`: the connection-like shape the
    /// runtime's connections need (their sends name no address).
    pub fn create_bound(
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
        srq: Option<&SharedReceiveQueue>,
        peer: UdPeer,
    ) -> Result<Self> {
        let qp = QueuePair::create_plain(pd, send_cq, recv_cq, caps, Ud::QP_TYPE, srq, Some(peer))?;
        Ok(Self::next(qp))
    }
}

impl<T: QpKind> Bringup<T, Init> {
    /// INIT → RTR. On RoCE this resolves the peer's GID to a MAC address, so an
    /// unreachable GID fails here.
    pub fn ready_to_receive(self, attr: &T::RtrAttr) -> Result<Bringup<T, Rtr>> {
        let qp = self.modify(Verb::ModifyQpToRtr, T::rtr_attr(attr))?;
        Ok(Self::next(qp))
    }
}

impl<T: QpKind> Bringup<T, Rtr> {
    /// RTR → RTS: the QP is ready; it is handed out as a plain [`QueuePair`].
    pub fn ready_to_send(self, attr: &T::RtsAttr) -> Result<QueuePair> {
        self.modify(Verb::ModifyQpToRts, T::rts_attr(attr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{Gid, GlobalRoute};

    fn path() -> AddressVector {
        AddressVector {
            dlid: 0,
            sl: 2,
            port_num: 1,
            grh: Some(GlobalRoute::to(Gid([9; 16]), 1)),
        }
    }

    #[test]
    fn rc_steps_use_the_masks_the_verbs_spec_requires() {
        let (a, m) = Rc::init_attr(&ConnectedInit {
            port_num: 1,
            pkey_index: 0,
            access: Access::REMOTE_WRITE | Access::LOCAL_WRITE,
        });
        assert_eq!(a.qp_state, ibv_qp_state::IBV_QPS_INIT);
        assert_eq!(
            m,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS
        );
        // Only the remote part of the access flags belongs in a QP.
        assert_eq!(a.qp_access_flags, Access::REMOTE_WRITE.bits());
        let (a, m) = Rc::rtr_attr(&RcRtr {
            path: path(),
            mtu: Mtu::M1024,
            dest_qp_num: 0x12,
            rq_psn: 0x1ab_cdef,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
        });
        assert_eq!(a.qp_state, ibv_qp_state::IBV_QPS_RTR);
        assert_eq!(a.rq_psn, 0xab_cdef, "PSNs are 24 bits");
        assert_eq!(
            (a.dest_qp_num, a.min_rnr_timer, a.ah_attr.is_global),
            (0x12, 12, 1)
        );
        assert_eq!(a.ah_attr.sl, 2);
        assert_eq!(
            m,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER
        );
        let (a, m) = Rc::rts_attr(&RcRts {
            sq_psn: 5,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        });
        assert_eq!(
            (a.qp_state, a.sq_psn, a.timeout),
            (ibv_qp_state::IBV_QPS_RTS, 5, 14)
        );
        assert_eq!(
            m,
            M::IBV_QP_STATE
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_MAX_QP_RD_ATOMIC
        );
    }

    #[test]
    fn uc_has_no_rdma_read_or_retry_attributes() {
        let (_, m) = Uc::rtr_attr(&UcRtr {
            path: path(),
            mtu: Mtu::M2048,
            dest_qp_num: 1,
            rq_psn: 1,
        });
        assert_eq!(
            m,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
        );
        let (_, m) = Uc::rts_attr(&Psn { sq_psn: 1 });
        assert_eq!(m, M::IBV_QP_STATE | M::IBV_QP_SQ_PSN);
    }

    #[test]
    fn ud_takes_a_qkey_and_nothing_at_rtr() {
        let (a, m) = Ud::init_attr(&UdInit {
            port_num: 1,
            pkey_index: 0,
            qkey: 0x1111_1111,
        });
        assert_eq!(a.qkey, 0x1111_1111);
        assert_eq!(
            m,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_QKEY
        );
        let (a, m) = Ud::rtr_attr(&());
        assert_eq!(
            (a.qp_state, m),
            (ibv_qp_state::IBV_QPS_RTR, M::IBV_QP_STATE)
        );
    }
}
