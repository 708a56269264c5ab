//! Async typed request handlers on top of sessions: implement [`RequestHandler`] (one
//! `async fn call` from a request type to a result), register it with
//! [`ServerBuilder::handler`](super::ServerBuilder::handler), and call it from a client
//! with [`ClientConnection::call_typed`](super::ClientConnection::call_typed).
//!
//! `api.rs` is what the application implements and is handed, `adapter.rs` the
//! [`Session`](super::Session) that runs the futures, `one_sided.rs` the futures' READs
//! and WRITEs of the client's memory, `wire.rs` the answer's envelope and the client's
//! error.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

mod adapter;
mod api;
mod one_sided;
mod wire;

pub use adapter::HandlerService;
pub use api::{RequestCx, RequestHandler};
pub use one_sided::OneSidedError;
pub use wire::{Answer, CallError, Refusal};
