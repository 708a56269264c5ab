//! Address vectors and address handles: how a QP without rdma_cm names its peer. An RC or
//! UC QP takes the vector in its RTR transition; a UD QP names the peer per send through
//! an address handle created from it.

use std::ptr::NonNull;
use std::sync::Arc;

use super::sys::*;

use super::error::{check_ptr, Result, Verb};
use super::pd::ProtectionDomain;
use super::port::Gid;

/// The global route part of a path: needed on RoCE (every packet carries a GRH) and
/// across InfiniBand subnets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GlobalRoute {
    /// The peer's GID.
    pub dgid: Gid,
    /// Which entry of the local port's GID table is the source (the tools' `-g`).
    pub sgid_index: u8,
    /// Router hops allowed (the tools use 1).
    pub hop_limit: u8,
    /// IPv6 flow label.
    pub flow_label: u32,
    /// IPv6 traffic class.
    pub traffic_class: u8,
}

impl GlobalRoute {
    /// A route to `dgid` from local GID `sgid_index`, one hop, as the pingpong tools set it.
    pub fn to(dgid: Gid, sgid_index: u8) -> GlobalRoute {
        GlobalRoute {
            dgid,
            sgid_index,
            hop_limit: 1,
            flow_label: 0,
            traffic_class: 0,
        }
    }
}

/// A path to a peer port (`struct ibv_ah_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressVector {
    /// The peer's LID (0 on RoCE).
    pub dlid: u16,
    /// Service level (the tools' `-l`).
    pub sl: u8,
    /// The local port (1-based, the tools' `-i`).
    pub port_num: u8,
    /// With a GRH (RoCE needs one) or without.
    pub grh: Option<GlobalRoute>,
}

impl AddressVector {
    pub(crate) fn raw(&self) -> ibv_ah_attr {
        let grh = self.grh.unwrap_or(GlobalRoute::to(Gid::ZERO, 0));
        ibv_ah_attr {
            grh: ibv_global_route {
                dgid: grh.dgid.raw(),
                flow_label: grh.flow_label,
                sgid_index: grh.sgid_index,
                hop_limit: grh.hop_limit,
                traffic_class: grh.traffic_class,
            },
            dlid: self.dlid,
            sl: self.sl,
            src_path_bits: 0,
            static_rate: 0,
            is_global: self.grh.is_some() as u8,
            port_num: self.port_num,
        }
    }
}

/// An address handle on a PD: the destination of UD sends. Cheap to clone; destroyed
/// after the last clone (and before its PD).
#[derive(Clone)]
pub struct AddressHandle {
    inner: Arc<AhInner>,
}

struct AhInner {
    _pd: ProtectionDomain,
    ah: NonNull<ibv_ah>,
    av: AddressVector,
}

// SAFETY: an address handle is immutable after creation and only read by posts, which
// are thread-safe; it is destroyed once in Drop.
unsafe impl Send for AhInner {}
// SAFETY: as above.
unsafe impl Sync for AhInner {}

impl Drop for AhInner {
    fn drop(&mut self) {
        // SAFETY: every UD QP sending through this handle holds a clone, so no post can
        // name it any more.
        let ret = unsafe { ibv_destroy_ah(self.ah.as_ptr()) };
        if ret != 0 {
            tracing::error!(errno = ret, "ibv_destroy_ah failed");
        }
    }
}

impl AddressHandle {
    /// Creates a handle for `av` on `pd`. On RoCE this resolves the peer's MAC address
    /// from its GID, so an unreachable GID fails here, naming the errno.
    pub fn new(pd: &ProtectionDomain, av: &AddressVector) -> Result<AddressHandle> {
        let mut raw = av.raw();
        // SAFETY: the PD is alive (a clone is kept) and `raw` is a valid attribute struct.
        let ah = check_ptr(Verb::CreateAh, unsafe {
            ibv_create_ah(pd.as_ptr(), &mut raw)
        })?;
        Ok(AddressHandle {
            inner: Arc::new(AhInner {
                _pd: pd.clone(),
                ah,
                av: *av,
            }),
        })
    }

    /// The vector it was created from.
    pub fn vector(&self) -> &AddressVector {
        &self.inner.av
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_ah {
        self.inner.ah.as_ptr()
    }
}

impl std::fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddressHandle")
            .field("av", &self.inner.av)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_with_and_without_grh() {
        let plain = AddressVector {
            dlid: 7,
            sl: 3,
            port_num: 1,
            grh: None,
        }
        .raw();
        assert_eq!(
            (plain.dlid, plain.sl, plain.port_num, plain.is_global),
            (7, 3, 1, 0)
        );
        let gid = Gid([1; 16]);
        let global = AddressVector {
            dlid: 0,
            sl: 0,
            port_num: 1,
            grh: Some(GlobalRoute::to(gid, 1)),
        }
        .raw();
        assert_eq!(global.is_global, 1);
        assert_eq!(global.grh.sgid_index, 1);
        assert_eq!(global.grh.hop_limit, 1);
        // SAFETY: reading the byte view of a GID union is always valid.
        assert_eq!(unsafe { global.grh.dgid.raw }, [1; 16]);
    }
}
