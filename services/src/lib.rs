//! Services for rdmactor, each a protocol state machine (no I/O, unit-tested) driven by a
//! [`rdmactor::runtime::Session`]. The `server` example serves all of them from one
//! process; each one's protocol, limits and flags are in the repository's
//! `docs/services.md`.
//!
//! | name | module | what it does |
//! |---|---|---|
//! | `echo` | [`echo`] | typed request/response: answers an [`echo::EchoRequest`] with its payload |
//! | `discard` | [`echo`] | one-way messages counted and dropped; a request returns the count |
//! | `raw-echo` | [`echo`] | plain verbs clients: every SEND comes back byte for byte |
//! | `pingpong` | [`pingpong`] | numbered pings answered with pongs; gaps or repeats end the connection |
//! | `stock-rc`, `stock-ud`, `stock-srq` | [`pingpong::stock`] | rdma-core's unmodified `ibv_*_pingpong` clients on the out-of-band ports |
//! | `rping` | [`rping`] | serves rdma-core's unmodified `rping -c` client |
//! | `files` | [`file_transfer`] | file upload and download through a granted window, hash-checked |
//! | `read` | [`read`] | named regions read with one-sided RDMA READs, seqlock-versioned |
//! | `ingest` | [`ingest`] | records RDMA-written into a per-connection slot ring with immediates |
//! | `lambda` | [`lambda`] | WebAssembly or native lambdas run on client-granted regions |
//! | `members` | [`members`] | a cluster's servers of a service, asked of any one of them (a [`RequestHandler`](rdmactor::runtime::RequestHandler)) |
//!
//! # Start here
//!
//! - [`echo`]: the smallest services, a page each: a typed request/response session
//!   ([`echo::Echo`]), a one-way counter ([`echo::Discard`]) and a raw one for plain verbs
//!   clients ([`echo::RawEcho`]).
//! - [`rping`]: a protocol of someone else's as a pure state machine
//!   ([`rping::RpingSession`]: `handle_*` in, `poll_action` out) and the thin driver that
//!   carries its actions out over one-sided READ and WRITE (through
//!   [`MachineSession`](rdmactor::runtime::MachineSession)).
//! - [`file_transfer`]: everything at full size: state machines for both sides with a
//!   deterministic in-memory harness and randomized message sequences, a session that only
//!   turns their outputs into verbs work, work on the blocking pool, a per-service owner
//!   actor for quotas ([`file_transfer::QuotaOwner`], asked with `SessionCx::ask`), typed
//!   refusals, and a client ([`file_transfer::send_file`], [`file_transfer::fetch_file`]).
//! - [`read`] and [`ingest`]: one-sided data paths, with a quick start each: memory
//!   granted per connection through windows, and rings written with WRITE_WITH_IMM.
//! - [`lambda`]: a sandbox (wasmtime) behind a service, its module cache owned by an actor
//!   ([`lambda::LambdaOwner`]) and jobs on threads of their own.
//!
//! The repository's `docs/writing-a-service.md` walks the same path for a service of
//! your own.

/// The largest message a service whose client messages are only small control
/// messages takes (bulk data moves by one-sided operations): `files`, `read` and
/// `ingest`. A larger offer is refused before any of it moves (`Service::max_message`).
pub const CONTROL_MESSAGE_MAX: usize = 64 << 10;

pub mod echo;
pub mod file_transfer;
#[doc(hidden)]
pub mod fuzz;
pub mod ingest;
pub mod lambda;
pub mod members;
pub mod pingpong;
pub mod read;
pub mod rping;
