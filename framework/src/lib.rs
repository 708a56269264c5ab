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
//! - [`runtime::Service`] and [`runtime::Session`]: what you implement.
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
//! The service below answers each request with its bytes in upper case. A message with
//! tag 0 is one-way (the client's `send`): nobody waits for an answer, so the session
//! gives none; any other tag is a request, and `reply` answers it under the same tag.
//! Servers and clients start inside an actix `System`, and the framework logs through
//! `tracing`, so nothing is printed until the application installs a subscriber. It
//! needs an RDMA device (the repository's `scripts/softroce` runs a program inside a
//! Soft-RoCE VM).
//!
//! ```no_run
//! use rdmactor::runtime::{Incoming, PeerInfo, Server, Service, Session, SessionCx, SessionError};
//!
//! struct Upper; // the service: one per server, a session per connection
//! impl Service for Upper {
//!     fn session(&self, _peer: &PeerInfo) -> Box<dyn Session> { Box::new(UpperSession) }
//! }
//! struct UpperSession; // runs on the thread that polls its connection's completions
//! impl Session for UpperSession {
//!     fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Incoming) -> Result<(), SessionError> {
//!         if msg.tag == 0 { return Ok(()); } // tag 0: one-way message, no reply wanted
//!         cx.reply(&msg, msg.data.to_ascii_uppercase()) // same tag: the client's request() returns it
//!     }
//! }
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // Logs: install a `tracing` subscriber first, e.g. `tracing_subscriber::fmt::init();`
//!     actix::System::new().block_on(async {
//!         let server = Server::builder() // must start inside an actix System
//!             .listen("192.0.2.1:7471".parse()?, None)
//!             .service("upper", Upper)
//!             .start()?;
//!         tokio::signal::ctrl_c().await?; // serve until SIGINT
//!         server.shutdown().await; // disconnect every client, release everything
//!         Ok(())
//!     })
//! }
//! ```
//!
//! A client asks it with `Client::start(NodeConfig::default())?.connect(addr,
//! "upper").await?.request(b"hi".to_vec()).await?` (inside a `System` too).
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
//! | [`runtime`] | the actors: CM actor, connection actors, pollers, server, client, out-of-band ports, device recovery | none | drives everything |
//! | [`blocking`] | one connection at a time with blocking calls, for small tools and tests | none | verbs calls |
//! | [`metrics`] | every metric's name and labels, and a bounded `/metrics` endpoint | none | a TCP listener, if asked |
//!
//! # Threads
//!
//! A server or client runs one CM actor (on the actix `System` it was started in) with
//! a thread of its own reading rdma_cm events, and `NodeConfig::pollers` polling threads,
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
pub mod memory;
pub mod metrics;
pub mod prelude;
pub mod proto;
pub mod runtime;
pub mod shared;
pub mod verbs;

// The Rust blocks of docs/writing-a-service.md, compiled (and run: they define items
// only) by `cargo test --doc`, so that the guide cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../docs/writing-a-service.md")]
mod writing_a_service {}
