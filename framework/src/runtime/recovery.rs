//! Surviving the loss of the RDMA device (`rdma link delete`, a hot-unplugged NIC, a
//! device that failed): what the CM actor holds about the device, and the decision of
//! when it has come back.
//!
//! The order of events, driven by the CM actor (`cm.rs`):
//!
//! 1. **Present**: the node (context, PD, pool, pollers, shared receive queues) serves.
//! 2. The CM reports `RDMA_CM_EVENT_DEVICE_REMOVAL`, or the device's async events
//!    `IBV_EVENT_DEVICE_FATAL`: every connection closes with
//!    [`CloseReason::DeviceLost`](super::CloseReason::DeviceLost), the listening ids are
//!    destroyed, services drop what they registered (`Service::on_device_down`), the
//!    out-of-band listeners close their connections. **Releasing**: the node waits for
//!    the last connection to release its QP, buffers and CQ share (its poller threads run
//!    those connections, so it cannot go first).
//! 3. The node is dropped. **Absent**: every half second the actor lists the
//!    devices. Listing is itself what lets the kernel finish: rxe cannot revoke a
//!    process's handles, so `rdma link delete` waits until the process closed the device,
//!    and librdmacm closes its own handle of a removed device only when a listing shows
//!    it gone ([`Context::listed`](crate::verbs::Context::listed)).
//! 4. The device is listed again (a new kernel index under the wanted name, see
//!    [`returned`]): the node is rebuilt with the same configuration, the listeners bound
//!    again to the same addresses, the out-of-band listeners handed the new node, the
//!    device watch restarted, services told (`Service::on_device_up`). **Present** again.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::NodeConfig;
use super::device_watch::DeviceWatch;
use super::node::Node;
use crate::verbs::ListedDevice;

/// How often an absent device is looked for.
pub(crate) const POLL: Duration = Duration::from_millis(500);

/// The device that went: its name and the kernel's index of it. A device listed under
/// the same name with the same index is the old one, still on its way out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct GoneDevice {
    pub name: String,
    pub index: Option<u32>,
}

/// The device to serve on again, if `listed` has one: the configured name (`want`), or
/// any device when none was configured; never the one that went (`gone`, same name and
/// kernel index), which can stay listed for a moment after its removal began.
pub(crate) fn returned<'a>(
    want: Option<&str>,
    gone: &GoneDevice,
    listed: &'a [ListedDevice],
) -> Option<&'a ListedDevice> {
    listed.iter().find(|d| {
        let wanted = want.is_none_or(|w| d.name == w);
        let old = d.name == gone.name && (d.index == gone.index || d.index.is_none());
        wanted && !old
    })
}

/// What a server needs to serve again on a device that came back.
pub(crate) struct Relisten {
    pub config: NodeConfig,
    /// The bound addresses (a port 0 given to the builder resolved) and their default
    /// services, in the builder's order.
    pub listeners: Vec<(SocketAddr, Option<String>)>,
    pub oob: Vec<actix::Addr<super::oob::OobListener>>,
}

/// The CM actor's hold on the device. The only long-lived owner of the node: connections
/// hold clones of its parts (PD, pool, CQ share) only while they live.
pub(crate) enum DeviceSlot {
    /// Serving; `watch` reads the device's async events (servers only).
    Present {
        node: Arc<Node>,
        watch: Option<DeviceWatch>,
    },
    /// Lost since `since`; the node is kept until every connection has released
    /// (`oob_pending`: out-of-band listeners that have not yet said so).
    Releasing {
        node: Arc<Node>,
        gone: GoneDevice,
        since: Instant,
        oob_pending: usize,
    },
    /// Released; looked for every [`POLL`].
    Absent {
        gone: GoneDevice,
        since: Instant,
        /// Whether "no device listed" was logged already (logged once per absence).
        said_empty: bool,
    },
}

impl DeviceSlot {
    /// The node, while the device serves.
    pub fn node(&self) -> Option<&Arc<Node>> {
        match self {
            DeviceSlot::Present { node, .. } => Some(node),
            _ => None,
        }
    }

    /// The node, present or releasing (its counters stay meaningful until it is dropped).
    pub fn any_node(&self) -> Option<&Arc<Node>> {
        match self {
            DeviceSlot::Present { node, .. } | DeviceSlot::Releasing { node, .. } => Some(node),
            DeviceSlot::Absent { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(name: &str, index: Option<u32>) -> ListedDevice {
        ListedDevice {
            name: name.into(),
            index,
        }
    }

    #[test]
    fn the_old_device_still_listed_is_not_a_return() {
        let gone = GoneDevice {
            name: "rxe0".into(),
            index: Some(3),
        };
        assert_eq!(returned(Some("rxe0"), &gone, &[dev("rxe0", Some(3))]), None);
        assert_eq!(returned(None, &gone, &[dev("rxe0", Some(3))]), None);
        // Without kernel indexes a listed device of that name cannot be told apart.
        assert_eq!(returned(Some("rxe0"), &gone, &[dev("rxe0", None)]), None);
        assert_eq!(returned(Some("rxe0"), &gone, &[]), None);
    }

    #[test]
    fn the_named_device_with_a_new_index_is_a_return_and_others_only_when_unnamed() {
        let gone = GoneDevice {
            name: "rxe0".into(),
            index: Some(3),
        };
        let listed = [dev("rxe1", Some(4)), dev("rxe0", Some(5))];
        assert_eq!(
            returned(Some("rxe0"), &gone, &listed),
            Some(&dev("rxe0", Some(5)))
        );
        assert_eq!(returned(None, &gone, &listed), Some(&dev("rxe1", Some(4))));
        assert_eq!(returned(Some("rxe0"), &gone, &listed[..1]), None);
        assert_eq!(
            returned(None, &gone, &[dev("rxe0", Some(3)), dev("rxe1", None)]),
            Some(&dev("rxe1", None))
        );
    }
}
