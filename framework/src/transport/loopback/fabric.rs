//! The fabric and its devices: where loopback objects are created.
//!
//! A [`Fabric`] is the network: its devices reach each other, its listeners are found by
//! address, and its clock runs what must happen later. A [`Device`] is one node's NIC
//! with one protection domain (rdmactor shares one PD per device): memory registered on
//! it is reachable by the peers of its QPs, with its keys, and by nothing else.

use std::sync::Arc;

use super::cm::{CmId, EventChannel, Registry};
use super::core::{Config, DeviceCore, FabricCore};
use super::cq::{Channel, Cq};
use super::error::{LoopbackError, Result};
use super::mr::{Mr, Mw};
use super::qp::Qp;
use super::srq::Srq;
use crate::verbs::{Access, QpCaps};

/// An in-memory network of loopback devices. Cheap to clone.
#[derive(Clone)]
pub struct Fabric {
    core: Arc<FabricCore>,
    registry: Arc<Registry>,
}

impl Default for Fabric {
    fn default() -> Self {
        Fabric::new(Config::default())
    }
}

impl Fabric {
    /// A fabric with `config`'s timing.
    pub fn new(config: Config) -> Fabric {
        Fabric {
            core: Arc::new(FabricCore::new(config)),
            registry: Arc::default(),
        }
    }

    /// The process's shared fabric, with the default timing: where
    /// [`Transport::open`](crate::transport::Transport::open) opens loopback devices, so
    /// that a server and a client of one process started without a fabric of their own
    /// reach each other.
    pub fn shared() -> &'static Fabric {
        static SHARED: std::sync::OnceLock<Fabric> = std::sync::OnceLock::new();
        SHARED.get_or_init(Fabric::default)
    }

    /// The fabric's timing.
    pub fn config(&self) -> Config {
        self.core.config
    }

    /// A new device (a node's NIC and protection domain); `name` shows in errors.
    pub fn device(&self, name: &str) -> Device {
        Device {
            core: Arc::new(DeviceCore::new(self.core.clone(), name.to_owned())),
            registry: self.registry.clone(),
        }
    }
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric")
            .field("config", &self.core.config)
            .finish()
    }
}

/// A loopback device with its protection domain. Cheap to clone.
#[derive(Clone)]
pub struct Device {
    pub(super) core: Arc<DeviceCore>,
    pub(super) registry: Arc<Registry>,
}

impl Device {
    /// The name it was created with.
    pub fn name(&self) -> &str {
        &self.core.name
    }

    fn usable(&self) -> Result<()> {
        if self.core.removed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(LoopbackError::DeviceRemoved(self.core.name.clone()));
        }
        Ok(())
    }

    /// Registers `len` zeroed bytes with `access`.
    pub fn register(&self, len: usize, access: Access) -> Result<Mr> {
        Mr::register(&self.core, len, access)
    }

    /// Allocates an unbound memory window.
    pub fn alloc_window(&self) -> Result<Mw> {
        Mw::alloc(&self.core)
    }

    /// Creates a completion channel.
    pub fn create_channel(&self) -> Result<Channel> {
        self.usable()?;
        Ok(Channel::default())
    }

    /// Creates a CQ of `capacity` entries, attached to `channel` if given.
    pub fn create_cq(&self, capacity: u32, channel: Option<&Channel>) -> Result<Cq> {
        self.usable()?;
        let cq = Cq::new(&self.core.fabric, capacity, channel);
        let delay = self
            .core
            .completion_delay_ns
            .load(std::sync::atomic::Ordering::Relaxed);
        if delay > 0 {
            cq.delay_completions(std::time::Duration::from_nanos(delay));
        }
        Ok(cq)
    }

    /// Creates a shared receive queue of `max_wr` receives.
    pub fn create_srq(&self, max_wr: u32) -> Result<Srq> {
        self.usable()?;
        Ok(Srq::new(max_wr))
    }

    /// Creates a QP without a cm_id, to be connected with
    /// [`connect_pair`](super::connect_pair) (the out-of-band bring-up).
    pub fn create_qp(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCaps,
        srq: Option<&Srq>,
    ) -> Result<Qp> {
        Qp::create(&self.core, send_cq, recv_cq, caps, srq)
    }

    /// Creates a connection-manager event channel.
    pub fn create_event_channel(&self) -> Result<EventChannel> {
        self.usable()?;
        Ok(EventChannel::default())
    }

    /// Creates a cm_id whose events arrive on `channel`.
    pub fn create_id(&self, channel: &EventChannel) -> Result<CmId> {
        self.usable()?;
        Ok(CmId::new(&self.core, &self.registry, channel))
    }
}

impl CmId {
    /// Creates this id's RC QP on `device` (the id's own), receiving from `srq` if
    /// given.
    pub fn create_qp(
        &self,
        device: &Device,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCaps,
        srq: Option<&Srq>,
    ) -> Result<Qp> {
        self.create_qp_on(&device.core, send_cq, recv_cq, caps, srq)
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.core.name)
            .finish()
    }
}
