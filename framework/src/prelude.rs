//! The names a service and its client use, in one import: `use rdmactor::prelude::*;`.
//!
//! None of them clashes with `actix::prelude`, which a service with an owner actor
//! imports too (hence [`Incoming`], not `Message`, and [`RequestHandler`], not
//! `Handler`).

pub use crate::runtime::{
    CallError, Client, ClientConnection, CloseReason, HandlerService, Incoming, NodeConfig,
    OneSidedError, PeerInfo, PoolConfig, Refusal, RequestCx, RequestError, RequestHandler, Server,
    ServerBuilder, ServerError, Service, Session, SessionCx, SessionError,
};
pub use crate::shared::Owner;
pub use crate::verbs::{Access, RemoteRegion};
