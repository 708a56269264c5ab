//! rdmactor: an actor-based, multi-connection RDMA server framework.
//!
//! The [`verbs`] module is a safe layer over libibverbs and librdmacm; it holds every
//! `unsafe` block of the project.
#![deny(missing_docs)]
#![forbid(unsafe_op_in_unsafe_fn)]

pub mod blocking;
pub mod memory;
pub mod metrics;
pub mod proto;
pub mod runtime;
pub mod verbs;
