//! Shared regions as a transport trait: memory registered once on a domain, updated in
//! place by the application, and granted to each connection through a memory window
//! bound to that connection's QP ([`super::QueuePair::bind_shared_window`]).
//!
//! A separate kind of registration rather than a [`super::Region`] because its
//! contract differs: nothing but windows reaches it remotely (the registration itself
//! grants no remote access), every connection sees the same bytes, and the application
//! writes them while peers READ them, so the versioned layout ([`VERSION_LEN`],
//! [`copy_of`], [`accepts`]; see [`crate::verbs::SharedRegion`]) is part of the
//! contract: a transport's `update` must be a seqlock writer whose stores a concurrent
//! READ can observe half done, exactly as a NIC can.

use std::fmt;
use std::fs::File;

use super::{Access, Transport};

pub use crate::verbs::{accepts, copy_of, VERSION_LEN};

/// Memory registered once and granted per connection. Cheap to clone (clones are the
/// same registration); deregistered when the last clone and the last window over it
/// are gone.
///
/// # Versioned regions
///
/// `| version: u64 LE | copy 0 | ... | copy k-1 |`: version `v` (even) lives in copy
/// [`copy_of`]`(v, k)`. [`update`](Self::update) stores the odd marker `next - 1`,
/// writes the next copy, then stores `next`; a one-sided reader READs the version, the
/// data of its copy and the version again, and keeps the data only if [`accepts`] says
/// no update reached that copy meanwhile. Peers' READs take no lock: the protection
/// comes from the layout alone.
pub trait SharedRegion<T: Transport>:
    Clone + Send + Sync + Unpin + fmt::Debug + Sized + 'static
{
    /// `len` zeroed bytes on `domain`, writable by the application, grantable for any
    /// remote access.
    fn alloc(domain: &T::Domain, len: usize) -> Result<Self, T::Error>;
    /// A versioned region: the version word (0 until the first update), then `copies`
    /// copies of `data_len` zeroed bytes.
    fn alloc_versioned(
        domain: &T::Domain,
        data_len: usize,
        copies: usize,
    ) -> Result<Self, T::Error>;
    /// The whole of `file`, read-only for the application and grantable for
    /// `REMOTE_READ` only. Whether later changes to the file show depends on the
    /// transport (they do not on either: verbs pins a private mapping, loopback copies
    /// the bytes in).
    fn map_file(domain: &T::Domain, file: &File) -> Result<Self, T::Error>;

    /// Registered bytes (the version word included).
    fn len(&self) -> usize;
    /// True for an empty region (never produced by the constructors).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies of the data a versioned region keeps (0: not versioned).
    fn copies(&self) -> usize;
    /// True for a region with a version word.
    fn is_versioned(&self) -> bool {
        self.copies() > 0
    }
    /// Bytes of data (of one copy, for a versioned region).
    fn data_len(&self) -> usize {
        match self.copies() {
            0 => self.len(),
            k => (self.len() - VERSION_LEN) / k,
        }
    }
    /// Where the data of `version` starts (0 for a region without versions).
    fn data_offset(&self, version: u64) -> usize {
        match self.copies() {
            0 => 0,
            k => VERSION_LEN + copy_of(version, k) * self.data_len(),
        }
    }
    /// False for a file: windows over it can grant `REMOTE_READ` only.
    fn is_writable(&self) -> bool;
    /// The registration's own access (never a remote one).
    fn access(&self) -> Access;
    /// The address of the first byte, as peers name it.
    fn addr(&self) -> u64;
    /// Whether it was registered on `domain` (only that domain's QPs may grant it).
    fn is_on(&self, domain: &T::Domain) -> bool;
    /// True when both are the same registration.
    fn same_as(&self, other: &Self) -> bool;

    /// The version word (`None` without one); odd while an update is under way.
    fn version(&self) -> Option<u64>;
    /// A copy of `len` data bytes at `offset` of the current version.
    fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>, T::Error>;
    /// Runs `f` on the data with the version it will have, and returns that version (0
    /// without versions). On a versioned region this is the seqlock writer: `f` gets the
    /// next copy holding the current content. Writers from several threads take turns.
    fn update(&self, f: impl FnOnce(u64, &mut [u8])) -> Result<u64, T::Error>;
    /// [`update`](Self::update) to `version` (even, larger than the current one), for
    /// an application that carries versions of its own.
    fn publish(&self, version: u64, f: impl FnOnce(&mut [u8])) -> Result<(), T::Error>;
    /// Overwrites `data.len()` data bytes at `offset` (nothing outside the data); the
    /// version afterwards.
    fn write(&self, offset: usize, data: &[u8]) -> Result<u64, T::Error>;
}
