//! The tools' library: what rdmactor's example binaries share, so that none of them
//! includes another's source.
//!
//! - [`transport`]: the transport options of `server`, `client`, `ft` and `demo`
//!   (`--retry-count`, `--keepalive`, ...), applied to a `NodeConfig`.
//! - [`report`]: the `RESULT kind=.. p50_us=.. p99_us=..` latency line `scripts/bench`
//!   reads, one definition of a percentile for every binary it compares.
//! - [`logs`]: logs to stderr with a default filter, so stdout carries only the lines
//!   scripts and tests parse.
//! - [`lambdas`]: the example lambda modules the binaries upload.
//! - `cluster` (with the `cluster` feature, on by default): `--cluster` and `--etcd`,
//!   the way into a cluster of servers registered in etcd, and `Dial`, where a client
//!   tool's connections go (`--addr`, or nodes found in the registry).
//! - [`bench_native`]: the figures of `bench_native` (`scripts/bench --native`): rdmactor's
//!   own cost over the loopback transport, each beside its floor.
//! - [`prometheus`]: the Prometheus recorder of `server --metrics` and
//!   `bench_native --metrics`.
//! - [`identity`]: `--key FILE`, the credential a client tool proves its identity with.
//! - [`pinger`]: the client-side echo session `client latency --session` times.
//! - [`kv`]: the key-value service written as a request handler, and its client;
//!   [`kv_session`]: the same service as a raw session, for comparison.
//!
//! The binaries are in `src/bin/` (their names are what `scripts/` and `tests/` run:
//! `target/release/server`, `client`, `demo`, ...); the demo, the largest, is split into
//! scenarios under `src/bin/demo/`. The byte pattern payloads are made and checked with
//! is `rdmactor_testkit::pattern`, the one the tests use.

#![deny(missing_docs)]

pub mod bench_native;
#[cfg(feature = "cluster")]
pub mod cluster;
#[cfg(feature = "cluster")]
pub mod files_args;
pub mod identity;
pub mod kv;
pub mod kv_session;
pub mod lambdas;
pub mod logs;
pub mod pinger;
pub mod prometheus;
pub mod report;
pub mod signals;
pub mod transport;
