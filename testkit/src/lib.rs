//! Test kit for rdmactor: what the tests, the services' unit tests and the tools share.
//!
//! - [`pattern`]: the one definition of the deterministic payload bytes. Whoever makes
//!   bytes to send and whoever checks the bytes that came back call it with the same
//!   length and seed, so a payload is named by its `(len, seed)`.
//! - [`device`]: where the real-verbs tests find their RDMA device and addresses, and
//!   when a missing device means "skip" rather than "fail".
//! - [`server`]: a server on the test address with a client beside it, a capped pool,
//!   waiting for connections to close and checking every lease came back, a service
//!   wrapper that records close reasons, a deliberately slow service.
//! - [`client`]: an actix System to run in, opening connections, polling until a
//!   condition holds, a blocking client on its own thread.
//! - [`pair`]: a client/server pair of blocking endpoints over rdma_cm.
//! - [`etcd`]: a real etcd on free loopback ports, for the cluster's tests.
//! - [`rng`]: a seeded generator; [`versioned`]: telling a consistent read of a
//!   versioned shared region from a torn one; [`remote_region`]: a grant in 24 bytes.
//!
//! [`pattern`], [`rng`], [`versioned`], [`remote_region`] and [`etcd`] need no RDMA
//! device; the rest needs one (the Soft-RoCE VM of `scripts/test`).
//!
//! This crate is never published and never a dependency of the framework or of the
//! services' library.

#![deny(missing_docs)]

pub mod client;
pub mod device;
pub mod etcd;
pub mod pair;
mod pattern;
pub mod proc_status;
pub mod remote_region;
pub mod rng;
pub mod server;
pub mod versioned;

pub use client::{actix_run, connect_n, dropped_connections_close, eventually, off_thread};
pub use device::{rdma_context, second_peer_ip, test_addr};
pub use pair::{connect_pair, Pair};
pub use pattern::pattern;
pub use server::{
    assert_leases_returned, capped_pool, close_all, first_close_reason, serve, serve_with,
    wait_idle, Reasons, Recorded, Slow, SlowSink,
};
