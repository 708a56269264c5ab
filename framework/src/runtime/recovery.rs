//! Surviving the loss of the RDMA device (`rdma link delete`, a hot-unplugged NIC, a
//! device that failed): what the CM actor holds about the device ([`Recovery`]), how it
//! lets go of it, the decision of when it has come back, and how it serves again. The
//! CM actor (`cm.rs`) drives it and does the parts that touch its own state (closing its
//! connections, dropping its listening ids, telling the services).
//!
//! The order of events:
//!
//! 1. **Present**: the node (context, PD, pool, pollers, shared receive queues) serves.
//! 2. The CM reports `RDMA_CM_EVENT_DEVICE_REMOVAL`, or the device's async events
//!    `IBV_EVENT_DEVICE_FATAL`: every connection closes with [`CloseReason::DeviceLost`],
//!    the listening ids are destroyed, services drop what they registered
//!    (`Service::on_device_down`), the out-of-band listeners close their connections.
//!    **Releasing**: the node waits for the last connection to release its QP, buffers
//!    and CQ share (its poller threads run those connections, so it cannot go first).
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

use actix::prelude::*;

use super::close::CloseReason;
use super::config::NodeConfig;
use super::device_watch::{DeviceNotice, DeviceWatch};
use super::node::Node;
use crate::transport::{CmId, Domain, ListedDevice, Transport, Verbs};

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
pub(crate) struct Relisten<T: Transport = Verbs> {
    pub config: NodeConfig,
    /// The bound addresses (a port 0 given to the builder resolved) and their default
    /// services, in the builder's order.
    pub listeners: Vec<(SocketAddr, Option<String>)>,
    pub oob: Vec<OobLink<T>>,
}

/// How the CM actor reaches an out-of-band listener when the device goes and comes back.
pub(crate) struct OobLink<T: Transport = Verbs> {
    pub gone: Recipient<OobDeviceGone>,
    pub back: Recipient<OobDeviceBack<T>>,
}

/// To an out-of-band listener: the device went (`reason`); close every connection,
/// refuse clients, let the node go once they released, then tell `released`.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct OobDeviceGone {
    pub reason: CloseReason,
    pub released: Recipient<OobReleased>,
}

/// To an out-of-band listener: the device is back; serve on this node.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct OobDeviceBack<T: Transport = Verbs>(pub Arc<Node<T>>);

/// To the CM actor: an out-of-band listener has closed its connections after the device
/// went and let go of the node (`OobDeviceGone`).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct OobReleased;

/// The CM actor's hold on the device. The only long-lived owner of the node: connections
/// hold clones of its parts (PD, pool, CQ share) only while they live.
pub(crate) enum DeviceSlot<T: Transport = Verbs> {
    /// Serving; `watch` reads the device's async events (servers only).
    Present {
        node: Arc<Node<T>>,
        watch: Option<DeviceWatch>,
    },
    /// Lost since `since`; the node is kept until every connection has released
    /// (`oob_pending`: out-of-band listeners that have not yet said so).
    Releasing {
        node: Arc<Node<T>>,
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

impl<T: Transport> DeviceSlot<T> {
    /// The node, while the device serves.
    pub fn node(&self) -> Option<&Arc<Node<T>>> {
        match self {
            DeviceSlot::Present { node, .. } => Some(node),
            _ => None,
        }
    }

    /// The node, present or releasing (its counters stay meaningful until it is dropped).
    pub fn any_node(&self) -> Option<&Arc<Node<T>>> {
        match self {
            DeviceSlot::Present { node, .. } | DeviceSlot::Releasing { node, .. } => Some(node),
            DeviceSlot::Absent { .. } => None,
        }
    }
}

/// The device as the CM actor holds it, and how it gets back a lost one.
pub(crate) struct Recovery<T: Transport = Verbs> {
    device: DeviceSlot<T>,
    /// How a server serves again once its device is back (`None`: a client's actor,
    /// which closes its connections when the device goes and serves no more).
    relisten: Option<Relisten<T>>,
    /// Times the device was lost (removed or failed).
    losses: u64,
}

/// A server's device that came back: what the CM actor listens on, and the new PD for
/// its services.
pub(crate) struct Back<T: Transport = Verbs> {
    pub listening: Vec<(T::CmId, Option<String>)>,
    pub pd: T::Domain,
    /// Since when the device was absent.
    pub since: Instant,
}

impl<T: Transport> Recovery<T> {
    /// The device serves `node`.
    pub fn new(node: Arc<Node<T>>) -> Recovery<T> {
        Recovery {
            device: DeviceSlot::Present { node, watch: None },
            relisten: None,
            losses: 0,
        }
    }

    /// Makes this a server's: it watches the device's async events and, when the device
    /// goes, serves again on `relisten` once it is back.
    pub fn serve_again(&mut self, relisten: Relisten<T>) {
        self.relisten = Some(relisten);
    }

    /// Whether this is a server's (see [`serve_again`](Self::serve_again)).
    pub fn is_server(&self) -> bool {
        self.relisten.is_some()
    }

    /// The node, while the device serves.
    pub fn node(&self) -> Option<&Arc<Node<T>>> {
        self.device.node()
    }

    /// The node, present or releasing.
    pub fn any_node(&self) -> Option<&Arc<Node<T>>> {
        self.device.any_node()
    }

    /// Times the device was lost.
    pub fn losses(&self) -> u64 {
        self.losses
    }

    /// Starts reading the present device's async events (servers), told to `to`.
    pub fn start_watch(&mut self, to: Recipient<DeviceNotice>) {
        if let DeviceSlot::Present { node, watch } = &mut self.device {
            match super::device_watch::start::<T>(&node.pd, to) {
                Ok(w) => *watch = w,
                Err(e) => {
                    tracing::error!(device = %node.pd.device_name(), error = %e, "cannot watch the device's events")
                }
            }
        }
    }

    /// The device was removed or failed (`how`), with `connections` open: takes it out
    /// of service (releasing until they have let go) and says why they close. `None`
    /// when it is not serving: every id on the device reports the removal, and only the
    /// first one acts (taking a releasing node out of its slot would drop it under its
    /// connections).
    pub fn lose(&mut self, how: &str, connections: usize) -> Option<CloseReason> {
        self.device.node()?;
        let DeviceSlot::Present { node, watch } = std::mem::replace(
            &mut self.device,
            DeviceSlot::Absent {
                gone: GoneDevice::default(),
                since: Instant::now(),
                said_empty: false,
            },
        ) else {
            return None;
        };
        drop(watch);
        self.losses += 1;
        let gone = GoneDevice {
            name: node.pd.device_name().to_owned(),
            index: node.pd.device_index(),
        };
        let reason = CloseReason::DeviceLost(format!("RDMA device {} {how}", gone.name));
        let oob = self.relisten.as_ref().map_or(0, |r| r.oob.len());
        tracing::error!(
            device = %gone.name,
            connections,
            out_of_band_listeners = oob,
            "RDMA device {how}: closing every connection and listener; its resources are \
             released once the connections have let go"
        );
        self.device = DeviceSlot::Releasing {
            node,
            gone,
            since: Instant::now(),
            oob_pending: oob,
        };
        Some(reason)
    }

    /// Tells every out-of-band listener that the device went; each answers `released`
    /// once its connections have let go of the node.
    pub fn tell_oob_gone(&self, reason: &CloseReason, released: Recipient<OobReleased>) {
        for l in self.relisten.iter().flat_map(|r| &r.oob) {
            l.gone.do_send(OobDeviceGone {
                reason: reason.clone(),
                released: released.clone(),
            });
        }
    }

    /// An out-of-band listener has let go of the node.
    pub fn oob_released(&mut self) {
        if let DeviceSlot::Releasing { oob_pending, .. } = &mut self.device {
            *oob_pending = oob_pending.saturating_sub(1);
        }
    }

    /// Drops a releasing node once nothing uses it any more (`connections_open`: the CM
    /// actor's own connections).
    pub fn try_release(&mut self, connections_open: bool) {
        let DeviceSlot::Releasing {
            oob_pending: 0,
            since,
            ..
        } = &self.device
        else {
            return;
        };
        if connections_open {
            return;
        }
        let since = *since;
        let DeviceSlot::Releasing { node, gone, .. } = std::mem::replace(
            &mut self.device,
            DeviceSlot::Absent {
                gone: GoneDevice::default(),
                since,
                said_empty: false,
            },
        ) else {
            return;
        };
        // The pollers' threads are joined here; every connection they ran has ended.
        drop(node);
        let waits = match &self.relisten {
            Some(r) => format!(
                "waiting for {} to return (looking every {:?})",
                r.config
                    .transport
                    .device
                    .as_deref()
                    .unwrap_or("an RDMA device"),
                POLL
            ),
            None => "this client's connections are closed; it serves no more".into(),
        };
        tracing::warn!(
            device = %gone.name,
            released_in = ?since.elapsed(),
            "every connection released; the device's resources are closed; {waits}"
        );
        self.device = DeviceSlot::Absent {
            gone,
            since,
            said_empty: false,
        };
    }

    /// Every [`POLL`] while absent (servers): lists the devices (which also lets
    /// librdmacm close its handle of the removed one); the name of a returned one.
    pub fn look(&mut self) -> Option<String> {
        let (
            DeviceSlot::Absent {
                gone, said_empty, ..
            },
            Some(relisten),
        ) = (&mut self.device, &self.relisten)
        else {
            return None;
        };
        let listed = match T::listed() {
            Ok(listed) => listed,
            Err(e) => {
                // librdmacm compares its list with the kernel's only when the kernel lists
                // some device; until then it keeps the removed one open, and the kernel's
                // removal waits for it. Tried on every look: a PD an application still
                // held may have gone since.
                let released = T::release_removed_devices();
                match released {
                    Ok(n) if n > 0 => tracing::warn!(
                        device = %gone.name,
                        handles = n,
                        "no RDMA device is listed: released the handles librdmacm kept of \
                         the removed device, so the kernel's removal can finish"
                    ),
                    Ok(_) if !*said_empty => tracing::warn!(
                        device = %gone.name,
                        error = %e,
                        "no RDMA device is listed"
                    ),
                    Ok(_) => {}
                    Err(release) if !*said_empty => tracing::warn!(
                        device = %gone.name,
                        error = %e,
                        %release,
                        "no RDMA device is listed, and releasing librdmacm's handles of the \
                         removed device failed: the kernel's removal waits for this process \
                         to exit"
                    ),
                    Err(_) => {}
                }
                *said_empty = true;
                return None;
            }
        };
        let want = relisten.config.transport.device.as_deref();
        returned(want, gone, &listed).map(|found| found.name.clone())
    }

    /// Rebuilds the node on `device` with the server's configuration, binds and listens
    /// on its addresses again (ids on `channel`) and hands the out-of-band listeners the
    /// new node. `None` when there is nothing to serve again (a client, or a device not
    /// absent).
    pub fn serve_on(
        &mut self,
        device: &str,
        channel: &T::EventChannel,
    ) -> Result<Option<Back<T>>, String> {
        let Some(relisten) = &self.relisten else {
            return Ok(None);
        };
        let since = match &self.device {
            DeviceSlot::Absent { since, .. } => *since,
            _ => return Ok(None),
        };
        let mut config = relisten.config.clone();
        config.transport.device = Some(device.to_owned());
        let node = Node::<T>::start(config).map_err(|e| format!("opening the device: {e}"))?;
        let mut listening = Vec::new();
        for (addr, default) in &relisten.listeners {
            let id = node.pd.create_id(channel).map_err(|e| e.to_string())?;
            id.bind(*addr).map_err(|e| format!("binding {addr}: {e}"))?;
            id.listen(1024)
                .map_err(|e| format!("listening on {addr}: {e}"))?;
            listening.push((id, default.clone()));
        }
        for l in &relisten.oob {
            l.back.do_send(OobDeviceBack(node.clone()));
        }
        let pd = node.pd.clone();
        self.device = DeviceSlot::Present { node, watch: None };
        Ok(Some(Back {
            listening,
            pd,
            since,
        }))
    }

    /// Logs that the device is back (after [`serve_on`](Self::serve_on) and the CM
    /// actor's part).
    pub fn say_back(&self, device: &str, since: Instant) {
        tracing::warn!(
            device,
            absent_for = ?since.elapsed(),
            listeners = ?self.relisten.as_ref().map(|r| r.listeners.iter().map(|(a, _)| *a).collect::<Vec<_>>()),
            "RDMA device is back: serving again"
        );
    }

    /// Lets the node go at the end of the actor's life (every connection released
    /// already), so that its device resources are released when the shutdown is
    /// answered.
    pub fn let_go(&mut self) {
        self.device = DeviceSlot::Absent {
            gone: GoneDevice::default(),
            since: Instant::now(),
            said_empty: true,
        };
    }
}

/// Destroys the listening and connecting ids of a lost device. Destroying an id waits
/// until its events are acknowledged, and events of these ids may be queued behind the
/// removal for the CM actor that calls this: destroyed on a thread of their own, which
/// waits for that actor to read them.
pub(crate) fn destroy_ids<I: Send + 'static>(ids: Vec<I>) {
    if ids.is_empty() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("rdmactor-cm-drop".into())
        .spawn(move || drop(ids));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the thread destroying the lost device's cm ids");
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
