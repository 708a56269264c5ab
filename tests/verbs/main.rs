//! The real-verbs tests that run inside one Soft-RoCE VM (scripts/test, stage 2), one
//! binary with a module per subject: `scripts/softroce scripts/lib/run-test-binaries`
//! runs each test in a process of its own, so `rdma resource` counts stay exact and one
//! test's leftovers never reach the next. One binary rather than one per file: the
//! framework's generic code they all drive is compiled and linked once, which took
//! most of the suite's build (tests/wire*.rs, steered from the host, stay apart).
//!
//! `cargo test --release -p rdmactor-tests --test verbs file_transfer::` picks a module.

// The verbs layer and the data path.
mod access_errors;
mod data_path;
mod oob_verbs;
mod verbs_objects;

// The device's and the host's faults and limits.
mod device_faults;
mod device_removal;
mod host_limits;

// Who may connect, and what a client is told.
mod admission;
mod auth;
mod told_why;

// Hostile and broken peers, and the memory they must not make the server hold.
mod backpressure;
mod fault_tolerance;
mod hostile_frames;
mod memory_adversary;
mod memory_limits;
mod session_panics;

// Scale and observability.
mod metrics;
mod scale;

// Clients other than rdmactor's: rdma-core's tools, plain verbs, C through rdmactor-c
// and Python through rdmactor-py.
mod c_client;
mod oob_pingpong;
mod plain_clients;
mod python_client;

// The services, the README's first service, and the cluster.
mod cluster;
mod echo_service;
mod file_transfer;
mod hello_service;
mod ingest;
mod kv;
mod lambda;
mod read_service;
mod shared_grants;
