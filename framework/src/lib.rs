//! rdmactor: an actor-based, multi-connection RDMA server framework over libibverbs and
//! librdmacm.
//!
//! One process serves many RDMA clients at once. A CM actor accepts connections and
//! spawns a connection actor per connection; all connections share one protection
//! domain and a pool of registered memory; CQ-polling threads deliver completions
//! straight to the connections they poll for. The application plugs in as a
//! [`Service`](runtime::Service): a factory of per-connection
//! [`Session`](runtime::Session)s that see whole messages and the completions of the
//! one-sided operations they started. Buffers, credits, framing, large messages,
//! teardown and shutdown are the framework's.
//!
//! # Start here
//!
//! - [`runtime::Server`]: `Server::builder()` ([`runtime::ServerBuilder`]) registers
//!   services by name, listens, and [`shutdown`](runtime::Server::shutdown) releases
//!   everything. [`runtime::NodeConfig`] sizes everything (pool, queues, timeouts,
//!   limits).
//! - [`prelude`]: the names a service and its client use, in one import.
//! - [`runtime::RequestHandler`]: a service as one async function from a typed request
//!   to a typed result; [`runtime::HandlerService`] runs it and bounds its calls.
//! - [`shared::Owner`]: the actor that owns what a service's connections share, started
//!   with the first one.
//! - [`runtime::Service`] and [`runtime::Session`]: what you implement for everything
//!   else (one-sided operations, windows, streams, plain verbs clients).
//!   [`runtime::SessionCx`] is what a session may do (send, reply, register memory,
//!   post one-sided operations, grant windows, work off the poller thread, close).
//! - [`runtime::Client`] and [`runtime::ClientConnection`]: the client side, on the same
//!   machinery (`request`, `request_typed`, `send`, `recv`, READ/WRITE/atomics, or your
//!   own `Session` with [`Client::connect_session`](runtime::Client::connect_session)).
//! - [`runtime::CloseReason`]: why a connection ended, which the peer is told when it
//!   can be.
//! - The `rdmactor-services` crate: complete services (echo, file transfer, one-sided
//!   reads, ingest, WebAssembly lambdas, rping) to read and to copy from.
//!
//! In the repository: `docs/writing-a-service.md` walks from a session to a service
//! with shared state, a client and tests; `ARCHITECTURE.md` is the map of the code;
//! `docs/operations.md` lists flags, limits and metrics.
//!
//! # A complete server
//!
//! The service below answers each request with its text in upper case. It is a
//! [`RequestHandler`](runtime::RequestHandler): one async function from a typed request
//! to a typed result, run on the connection's poller thread, its answer sent back under
//! the request's tag and its error given to the client typed
//! ([`ClientConnection::call_typed`](runtime::ClientConnection::call_typed)).
//! [`ServerBuilder::run`](runtime::ServerBuilder::run) builds an actix `System`, serves
//! until SIGINT or SIGTERM and shuts down cleanly; inside a `System` of your own,
//! [`start`](runtime::ServerBuilder::start) and [`Server::shutdown`](runtime::Server::shutdown)
//! do the same in steps. The framework logs through `tracing`, so nothing is printed
//! until the application installs a subscriber. It needs an RDMA device (the
//! repository's `scripts/softroce` runs a program inside a Soft-RoCE VM).
//!
//! ```no_run
//! use rdmactor::prelude::*;
//!
//! struct Upper; // the service: one per server, shared by every connection
//! impl RequestHandler for Upper {
//!     type Req = String; // typed with serde, postcard on the wire
//!     type Resp = String;
//!     type Error = String; // reaches the client typed, as CallError::Handler
//!     async fn call(&self, text: String, _cx: &RequestCx) -> Result<String, String> {
//!         Ok(text.to_uppercase()) // runs on the connection's poller thread: await, never block
//!     }
//! }
//!
//! fn main() -> Result<(), ServerError> {
//!     // Logs: install a `tracing` subscriber first, e.g. `tracing_subscriber::fmt::init();`
//!     Server::builder()
//!         .listen("192.0.2.1:7471".parse().expect("an IP address and port"), None)
//!         .handler("upper", Upper)
//!         .run() // its own actix System: serves until SIGINT or SIGTERM, then shuts down
//! }
//! ```
//!
//! A client calls it with `Client::start(NodeConfig::default())?.connect(addr,
//! "upper").await?.call_typed::<_, String, String>(&"hi").await?` (inside a `System`).
//! Below handlers, a [`Session`](runtime::Session) is the connection's protocol as
//! callbacks: whole messages ([`Incoming`](runtime::Incoming); tag 0 is a one-way
//! message that wants no reply), one-sided operations, windows granted to the peer.
//!
//! # The layers
//!
//! Bottom up; each may use the ones before it.
//!
//! | module | what | `unsafe` | I/O |
//! |---|---|---|---|
//! | [`verbs`] | safe RAII over libibverbs and librdmacm: contexts, PDs, MRs, windows, CQs, QPs, SRQs, cm_ids, the typed out-of-band bring-up | all of the project's | verbs calls |
//! | [`proto`] | the wire: frames, connect hello, credit windows, rendezvous budgets, the `ibv_*_pingpong` records | none | none: plain state machines, tested natively |
//! | [`memory`] | the registered-memory pool: size classes, leases, charges, the waiting line of each limit | none | registration, through `verbs` |
//! | [`transport`] | what the runtime asks of an RDMA stack, as traits; the verbs implementation, and `loopback`, an in-memory one with fault hooks (not wired to the runtime yet) | none | none (loopback: threads and memory) |
//! | [`runtime`] | the actors: CM actor, connection actors, pollers, server, client, out-of-band ports, device recovery | none | drives everything |
//! | [`shared`] | [`Owner`](shared::Owner): the actor that owns what a service's connections share | none | none |
//! | [`blocking`] | one connection at a time with blocking calls, for small tools and tests | none | verbs calls |
//! | [`metrics`] | every metric's name and labels, and a bounded `/metrics` endpoint | none | a TCP listener, if asked |
//!
//! # Threads
//!
//! A server or client runs one CM actor (on the actix `System` it was started in) with
//! a thread of its own reading rdma_cm events, and `TransportConfig::pollers` polling threads,
//! each of which also runs the actors of the connections whose CQs it polls. A session's
//! callbacks run one at a time on its connection's poller thread, next to many other
//! connections: never block there. Work that takes time goes to the blocking pool
//! ([`SessionCx::spawn_blocking`](runtime::SessionCx::spawn_blocking)), to another actor
//! ([`SessionCx::ask`](runtime::SessionCx::ask)), or to any thread holding a
//! [`SessionWaker`](runtime::SessionWaker); each comes back as `Session::on_wake`.
//!
//! # Resource cleanup
//!
//! Every verbs object holds an `Arc` to what it depends on, so nothing is destroyed
//! before what uses it. A connection that ends, on any path, disconnects, moves its QP to
//! the error state, waits for every outstanding work request to complete (flushes
//! included) and only then destroys the QP and returns its buffers.
//! [`Server::shutdown`](runtime::Server::shutdown) and
//! [`Client::shutdown`](runtime::Client::shutdown) wait until every connection has.
//! A session that panics closes its own connection only
//! ([`CloseReason::SessionPanicked`](runtime::CloseReason::SessionPanicked)).
//!
//! # Requirements
//!
//! Linux with rdma-core (libibverbs, librdmacm; the bindings are generated from the
//! system's headers at build time, so `libibverbs-dev`, `librdmacm-dev` and libclang
//! are needed to build), and an RDMA device to run: real hardware or Soft-RoCE (`rxe`).
//! Registered memory counts against `RLIMIT_MEMLOCK` unless the process holds
//! `CAP_IPC_LOCK`; a limit too small stops a server at start with
//! [`VerbsError::Memlock`](verbs::VerbsError::Memlock) naming it.
#![deny(missing_docs)]
#![forbid(unsafe_op_in_unsafe_fn)]

pub mod blocking;
#[doc(hidden)]
pub mod fuzz;
pub mod memory;
pub mod metrics;
pub mod prelude;
pub mod proto;
pub mod runtime;
pub mod shared;
pub mod transport;
pub mod verbs;

// The Rust blocks of docs/writing-a-service.md, compiled (and run: they define items
// only) by `cargo test --doc`, so that the guide cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../docs/writing-a-service.md")]
mod writing_a_service {}
