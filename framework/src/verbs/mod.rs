//! Safe RAII wrappers over libibverbs and librdmacm (through `rdma-sys`).
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
//! ```
//!
//! Errors are [`VerbsError`]: they name the failing verb and carry its errno, or the
//! failing completion's status.

mod cm;
mod cq;
mod device;
mod error;
mod mr;
mod mw;
mod pd;
mod qp;
mod shared;
mod sys;

pub use cm::{
    CmEvent, CmEventKind, CmId, CmIdKey, ConnParam, EventChannel, MAX_ACCEPT_PRIVATE_DATA,
    MAX_CONNECT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA,
};
pub use cq::{
    CompletionChannel, CompletionQueue, CqKey, WcOpcode, WcStatus, WorkCompletion, POLL_BATCH,
};
pub use device::{Context, DeviceAttr};
pub use error::{Result, Verb, VerbsError};
pub use mr::{Access, MemoryRegion, RemoteRegion, Sge};
pub use mw::MemoryWindow;
pub use pd::ProtectionDomain;
pub use qp::{QpCaps, QpState, QueuePair, RecvWr, SendOp, SendWr};
pub use shared::{accepts, copy_of, SharedRegion, VERSION_LEN};
