//! rdmactor's C client library: C programs call rdmactor services through the Rust
//! client (`rdmactor::runtime::Client`) and the services' own clients, so there is one
//! implementation of the protocol, not a second one in C.
//!
//! The C interface is `include/rdmactor.h`, generated from `ffi/` by cbindgen (the
//! `header` test fails when the committed header is not current); docs/clients.md is
//! the guide. How it is put together:
//!
//! - a context (`runtime.rs`) owns a thread running an actix System, where the Rust
//!   clients live; blocking calls that only wait for a connection's answer park the
//!   caller's thread instead of going through it (`block.rs`);
//! - handles are ids in generational tables (`handles.rs`, `tables.rs`), so a NULL,
//!   stale, freed or made-up handle is an error code, never a dereference;
//! - statuses fold the framework's errors by what a caller can do (`status.rs`), with
//!   the full text in a thread-local last error (`last_error.rs`);
//! - `link.rs` hides the transport, so the cdylib runs on verbs and the tests the same
//!   code on loopback;
//! - `ffi/` is the only module with `unsafe`: reading the pointers C passes.
//!
//! The layer under the entry points (`api`, `runtime`, `link`, `status`) is public for
//! the Python package (`python/`, crate rdmactor-py), which calls the same operations
//! on the same handles instead of driving the Rust client a second way. It is not an
//! API for Rust programs: they use `rdmactor::runtime::Client` itself.

pub mod api;
mod block;
pub mod ffi;
mod handles;
mod last_error;
pub mod link;
pub mod runtime;
pub mod status;
mod tables;

pub use status::rdmactor_status;
