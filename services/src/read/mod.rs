//! The `read` service: named regions that clients read with one-sided RDMA READs, no
//! server CPU per read.
//!
//! The application fills a [`ReadRegions`] catalogue: in-memory buffers it keeps updating
//! through a [`RegionWriter`], static buffers, and files loaded read-only. A client looks a
//! name up once ([`lookup`], a typed request) and gets the region's address, length, rkey
//! and version; from then on it reads any offset and length itself. Each region is
//! registered with `REMOTE_READ` only and exactly as long as its data (plus the version
//! word before it), so a READ past the end fails at the client with a remote access error.
//!
//! # Consistency
//!
//! A region being updated while clients read it never hands a client a torn value through
//! [`read_consistent`]: the registration starts with a version word that a writer makes
//! odd while it copies and even (and larger) afterwards, and the client reads version,
//! data, version with three READs in sequence, retrying until both versions are equal
//! and even (the [layout] module explains why that suffices). Plain [`read`] is one READ
//! and is consistent only for regions that never change ([`RegionHandle::is_mutable`]).
//!
//! # Where the bytes live (a workaround)
//!
//! The natural design registers each region once, on the server's protection domain, at
//! build time, and has [`RegionWriter`] update that registered memory in place under the
//! seqlock. The framework exposes neither the server's PD nor a way to register memory
//! before the server starts, so for now each **session registers its own copy on first
//! lookup** (with `SessionCx::register`) and copies newer versions into it, seqlock-style,
//! whenever the connection's actor runs for that session, i.e. whenever the client sends a
//! message. A reader of a changing region therefore calls [`sync`] now and then (every few
//! milliseconds, from a task of its own); reads stay one-sided. The costs: registered
//! memory is per connection (capped by [`ReadService::with_limit`]), and updates become
//! visible only at the client's next message. Wire format and client API stay as they are
//! once the framework offers `ServerBuilder::register(len, Access) -> MemoryRegion` (or a
//! `pd()`): only the session and the writer change, and [`sync`] becomes a no-op.
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
//! read::sync(&conn).await?;
//! let (bytes, version) = read::read_consistent(&conn, &handle, 0, 8).await?;
//! # let _ = (bytes, version);
//! # Ok(()) }
//! ```
//!
//! # Thread safety
//!
//! [`ReadRegions`] and [`RegionWriter`] are `Send + Sync` and cheap to clone; update from
//! any thread while sessions serve. A session holds a region's read lock while it copies
//! it, so a writer waits for at most one copy.

mod client;
pub mod layout;
mod regions;
mod session;
#[cfg(test)]
mod tests;
mod wire;

pub use client::{
    list, lookup, read, read_consistent, read_version, read_versioned, sync, ReadError,
    RegionHandle, MAX_ATTEMPTS,
};
pub use layout::{Contended, VersionedData};
pub use regions::{ReadRegions, RegionError, RegionWriter};
pub use session::{ReadService, DEFAULT_MAX_BYTES_PER_CONNECTION};
pub use wire::{ReadRequest, ReadResponse, RegionInfo};
