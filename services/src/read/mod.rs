//! The `read` service: named regions that clients read with one-sided RDMA READs, no
//! server CPU per read.
//!
//! The application fills a [`ReadRegions`] catalogue: in-memory buffers it keeps updating
//! through a [`RegionWriter`], static buffers, and files served read-only. A client looks a
//! name up once ([`lookup`], a typed request) and gets an address, length and rkey; from
//! then on it reads any offset and length itself, with no server CPU per read.
//!
//! # One shared copy, one window per connection
//!
//! Each region is registered **once**, on the server's protection domain, when a
//! connection first looks it up (a [`SharedRegion`](rdmactor::transport::SharedRegion)
//! of the server's transport: `LOCAL_WRITE | MW_BIND`, no remote access on the MR itself;
//! files are mapped read-only and registered with `MW_BIND` alone). Every lookup binds a type 2 memory window to the
//! asking connection's QP over exactly the region's bytes with `REMOTE_READ` only
//! (`SessionCx::grant`): a READ past the end is a remote access error, another
//! connection's QP cannot use the rkey, and the window goes when the connection closes.
//! The writer updates the registered memory in place, so clients see updates without
//! asking.
//!
//! # Consistency
//!
//! A mutable region starts with a version word, followed by a ring of copies of its data
//! ([`ReadRegions::add_buffer_with_copies`]); each update writes the next copy under an
//! odd marker and then stores the new even version, fenced (a seqlock over copies).
//! [`read_consistent`] reads version, data of that version's copy, version with three
//! READs in sequence, retrying until no update touched the copy it read (the [layout]
//! module explains why that suffices), so it never returns a torn value. Plain [`read`] is one READ and is consistent only for regions
//! that never change ([`RegionHandle::is_mutable`]); static regions have no version word
//! (their grant is exactly the data) and `read_consistent` reads them with one READ.
//!
//! # Quick start
//!
//! ```no_run
//! # async fn demo(client: rdmactor::runtime::Client, addr: std::net::SocketAddr)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use rdmactor::runtime::Server;
//! use rdmactor_services::read::{self, ReadRegions, ReadService};
//!
//! let regions = ReadRegions::new();
//! let prices = regions.add_buffer("prices", vec![0; 4096])?;
//! regions.add_file("motd", "/etc/motd")?;
//! let server = Server::builder()
//!     .listen(addr, None)
//!     .service("read", ReadService::new(regions))
//!     .start()?;
//! prices.write(0, &42u64.to_le_bytes())?;
//!
//! let conn = client.connect(server.local_addrs()[0], "read").await?;
//! let handle = read::lookup(&conn, "prices").await?;
//! let (bytes, version) = read::read_consistent(&conn, &handle, 0, 8).await?;
//! # let _ = (bytes, version);
//! # Ok(()) }
//! ```
//!
//! # Transports
//!
//! The service, its catalogue and the client functions are generic over the transport
//! with verbs by default: `ReadRegions::new()` and `ReadService::new` serve a verbs
//! server as before; `ReadRegions::<Loopback>::default()` serves
//! `Server::over(Loopback)`, and the client functions take a `ClientConnection<T>` of
//! any transport (`services/tests/read_over_loopback.rs`).
//!
//! # Thread safety
//!
//! [`ReadRegions`] and [`RegionWriter`] are `Send + Sync` and cheap to clone; update from
//! any thread while sessions serve. Updates of one region take turns; sessions take the
//! region's lock only to register it on first lookup. A catalogue serves one server (its
//! regions are registered on that server's protection domain).
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

mod client;
pub mod layout;
mod regions;
mod session;
// The tests' own numbers, not a peer's.
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests;
mod wire;

pub use client::{
    list, lookup, read, read_consistent, read_version, read_versioned, ReadError, RegionHandle,
    MAX_ATTEMPTS,
};
pub use layout::{Contended, VersionedData};
pub use regions::{ReadRegions, RegionError, RegionWriter, DEFAULT_COPIES};
pub use session::{ReadService, DEFAULT_MAX_GRANTS_PER_CONNECTION};
pub use wire::{ReadRequest, ReadResponse, RegionInfo};
