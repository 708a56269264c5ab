//! Safe RAII wrappers over libibverbs and librdmacm (raw bindings in `sys/`, generated
//! from the system's rdma-core headers by `framework/build.rs`).
//!
//! This module is the only place in rdmactor with `unsafe`; every block says why it is
//! sound. Each object holds an `Arc` to what it depends on, so the destroy order the
//! verbs API demands follows from ownership:
//!
//! ```text
//! Context ◄── ProtectionDomain ◄── MemoryRegion, SharedRegion ◄── (windows over it)
//!    ▲              ▲
//!    ├── CompletionChannel ◄── CompletionQueue ◄──┐
//!    │                                            │
//! EventChannel ◄── CmId ◄───────────────────── QueuePair ──► ProtectionDomain
//!                  (none for QPs from Bringup)       │
//!                          SharedReceiveQueue, AddressHandle (UD peer) ◄─┘
//! ```
//!
//! QPs without an rdma_cm id (the out-of-band exchange of the `ibv_*_pingpong` tools) are
//! walked RESET → INIT → RTR → RTS by the typed [`Bringup`]; port and GID queries,
//! address handles, shared receive queues and the UD GRH are here for them.
//!
//! Errors are [`VerbsError`]: they name the failing verb and carry its errno, or the
//! failing completion's status.

mod ah;
mod async_event;
mod bringup;
mod cm;
mod cq;
mod device;
mod error;
mod event_channel;
mod kinds;
mod mr;
mod mw;
mod os;
mod pd;
mod port;
mod qp;
mod rlimit;
mod shared;
mod srq;
mod sys;
mod wr;

pub use ah::{AddressHandle, AddressVector, GlobalRoute};
pub use async_event::{AsyncElement, AsyncEvent, AsyncEventKind};
pub use bringup::{
    Bringup, ConnectedInit, Init, Psn, QpKind, Rc, RcRtr, RcRts, Reset, Rtr, Uc, UcRtr, Ud, UdInit,
};
pub use cm::{
    transport_reject, CmId, ConnParam, MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA,
    MAX_REJECT_PRIVATE_DATA,
};
pub use cq::{ChannelFd, CompletionChannel, CompletionQueue, CqKey, WorkCompletion, POLL_BATCH};
pub use device::{release_removed_devices, Context, DeviceAttr, ListedDevice};
pub use error::{Result, Verb, VerbsError};
pub use event_channel::{CmEvent, CmIdKey, EventChannel};
pub use kinds::{CmEventKind, WcOpcode, WcStatus};
pub use mr::{Access, MemoryRegion, RemoteRegion, Sge};
pub use mw::MemoryWindow;
pub use pd::ProtectionDomain;
pub use port::{Gid, Grh, LinkLayer, Mtu, PortAttr, GRH_LEN};
pub use qp::{QpCaps, QpState, QueuePair, UdPeer};
pub use rlimit::memlock_limit;
pub use shared::{accepts, copy_of, SharedRegion, VERSION_LEN};
pub use srq::{SharedReceiveQueue, SrqAttr};
pub use wr::{RecvWr, SendOp, SendWr};
