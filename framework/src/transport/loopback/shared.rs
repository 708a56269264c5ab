//! Shared regions of the loopback transport: one registration granted to many QPs
//! through windows over ranges of it, updated in place by the application while peers
//! READ it.
//!
//! The bytes are a registration's atomic words (`memory.rs`), so the application's
//! writer and a peer's READ (executed by whichever thread posted it) really race, word
//! by word, with no lock between them: a READ that overlaps an update can return a
//! mixture of old and new words, as from a NIC, and only the versioned layout keeps a
//! reader from accepting one. The writer keeps the seqlock's order (odd marker, fence,
//! data, fence, even version) and every READ ends with an acquire fence
//! (`responder.rs`), which is what makes that order visible to the reader in Rust's
//! memory model; a NIC gets the same from coherent memory and the CPU's fences.
//!
//! A slice cannot point into atomic words, so `update` hands its caller a copy (kept
//! between updates, under the writer lock) and stores it back word by word.
//!
//! Unlike rxe, the key table checks an access through a window against the window's
//! own range, not the whole registration's.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::error::{LoopbackError, Result};
use super::fabric::Device;
use super::memory::Storage;
use super::mr::{Mr, Mw};
use super::qp::Qp;
use crate::transport::{copy_of, SharedRegion, VERSION_LEN};
use crate::verbs::{Access, RemoteRegion};

/// A loopback shared region (see [`SharedRegion`]). Cheap to clone.
#[derive(Clone)]
pub struct Shared {
    inner: Arc<Inner>,
}

struct Inner {
    mr: Mr,
    /// Copies of the data of a versioned region (0: not versioned).
    copies: usize,
    /// Writers take turns here; it holds the copy their change is made on.
    writer: Mutex<Vec<u8>>,
}

fn invalid(why: impl Into<String>) -> LoopbackError {
    LoopbackError::InvalidArgument(why.into())
}

impl Shared {
    fn register(device: &Device, len: usize, access: Access, copies: usize) -> Result<Shared> {
        // No remote access on the registration: peers reach it through windows only.
        let mr = Mr::register(&device.core, len, access | Access::MW_BIND)?;
        Ok(Shared {
            inner: Arc::new(Inner {
                mr,
                copies,
                writer: Mutex::new(Vec::new()),
            }),
        })
    }

    fn storage(&self) -> &Storage {
        &self.inner.mr.reg.storage
    }

    fn version_word(&self) -> &AtomicU64 {
        self.storage().word(0)
    }

    fn writer(&self) -> MutexGuard<'_, Vec<u8>> {
        self.inner
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn writable_or_refuse(&self) -> Result<()> {
        if self.is_writable() {
            return Ok(());
        }
        Err(invalid("the shared region is a read-only file mapping"))
    }

    /// The seqlock writer, under the writer lock: the current copy is carried into
    /// `scratch`, the marker `version - 1` stored, `f` run, the copy of `version`
    /// stored word by word, then `version`.
    fn publish_locked<R>(
        &self,
        scratch: &mut Vec<u8>,
        version: u64,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R> {
        let old = self.version_word().load(Ordering::Relaxed);
        if version % 2 != 0 || version <= old {
            return Err(invalid(format!(
                "version {version} after {old}: versions must be even and grow"
            )));
        }
        self.writable_or_refuse()?;
        let (k, len) = (self.inner.copies, self.data_len());
        let (from, to) = (copy_of(old, k), copy_of(version, k));
        scratch.clear();
        scratch.resize(len, 0);
        self.storage().read(VERSION_LEN + from * len, scratch);
        // `version - 1` rather than `old + 1`, so that a jump of many versions still
        // marks every reader of the copy about to be rewritten.
        self.version_word().store(version - 1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let out = f(scratch);
        self.storage().write(VERSION_LEN + to * len, scratch);
        fence(Ordering::SeqCst);
        self.version_word().store(version, Ordering::Release);
        Ok(out)
    }

    fn data_range(&self, offset: usize, len: usize, what: &str) -> Result<usize> {
        offset
            .checked_add(len)
            .filter(|&end| end <= self.data_len())
            .ok_or_else(|| {
                invalid(format!(
                    "{what} of {len} bytes at {offset} outside {} bytes of data",
                    self.data_len()
                ))
            })
    }
}

/// What the transport trait's `SharedRegion` methods do here (`api.rs` implements the
/// trait with these).
impl Shared {
    pub(super) fn alloc(domain: &Device, len: usize) -> Result<Self> {
        Self::register(domain, len, Access::LOCAL_WRITE, 0)
    }

    pub(super) fn alloc_versioned(domain: &Device, data_len: usize, copies: usize) -> Result<Self> {
        if copies == 0 {
            return Err(invalid("a versioned region needs at least one copy"));
        }
        let len = data_len
            .checked_mul(copies)
            .and_then(|n| n.checked_add(VERSION_LEN))
            .ok_or_else(|| invalid(format!("{copies} copies of {data_len} bytes")))?;
        Self::register(domain, len, Access::LOCAL_WRITE, copies)
    }

    /// Copies the file's bytes in (there is no mapping to pin): later changes to the
    /// file do not show, as with verbs' private mapping.
    pub(super) fn map_file(domain: &Device, file: &File) -> Result<Self> {
        let file_err = |e: std::io::Error| invalid(format!("file: {e}"));
        let len = file.metadata().map_err(file_err)?.len();
        let len = usize::try_from(len).map_err(|_| invalid(format!("file of {len} bytes")))?;
        if len == 0 {
            return Err(invalid("cannot share an empty file"));
        }
        let shared = Self::register(domain, len, Access::NONE, 0)?;
        let mut buf = vec![0u8; len.min(1 << 16)];
        let mut at = 0;
        while at < len {
            let n = buf.len().min(len - at);
            file.read_exact_at(&mut buf[..n], at as u64)
                .map_err(file_err)?;
            shared.storage().write(at, &buf[..n]);
            at += n;
        }
        Ok(shared)
    }

    pub(super) fn len(&self) -> usize {
        self.inner.mr.len()
    }
    pub(super) fn copies(&self) -> usize {
        self.inner.copies
    }
    pub(super) fn is_writable(&self) -> bool {
        self.access().contains(Access::LOCAL_WRITE)
    }
    pub(super) fn access(&self) -> Access {
        self.inner.mr.access()
    }
    pub(super) fn addr(&self) -> u64 {
        self.inner.mr.addr()
    }
    pub(super) fn is_on(&self, domain: &Device) -> bool {
        Arc::ptr_eq(self.inner.mr.device_core(), &domain.core)
    }
    pub(super) fn same_as(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub(super) fn version(&self) -> Option<u64> {
        self.is_versioned()
            .then(|| self.version_word().load(Ordering::Acquire))
    }

    pub(super) fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        self.data_range(offset, len, "read")?;
        // The writer lock: a read by the application sees no update half done (peers'
        // READs never take it).
        let _writer = self.writer();
        let base = self.data_offset(self.version().unwrap_or(0));
        let mut out = vec![0u8; len];
        self.storage().read(base + offset, &mut out);
        Ok(out)
    }

    pub(super) fn update(&self, f: impl FnOnce(u64, &mut [u8])) -> Result<u64> {
        let mut scratch = self.writer();
        if self.is_versioned() {
            let next = (self.version_word().load(Ordering::Relaxed) & !1) + 2;
            self.publish_locked(&mut scratch, next, |data| f(next, data))?;
            return Ok(next);
        }
        self.writable_or_refuse()?;
        scratch.clear();
        scratch.resize(self.len(), 0);
        self.storage().read(0, &mut scratch);
        f(0, &mut scratch);
        self.storage().write(0, &scratch);
        Ok(0)
    }

    pub(super) fn publish(&self, version: u64, f: impl FnOnce(&mut [u8])) -> Result<()> {
        if !self.is_versioned() {
            return Err(invalid("publish needs a versioned region"));
        }
        let mut scratch = self.writer();
        self.publish_locked(&mut scratch, version, f)
    }

    pub(super) fn write(&self, offset: usize, data: &[u8]) -> Result<u64> {
        let end = self.data_range(offset, data.len(), "write")?;
        self.update(|_, bytes| bytes[offset..end].copy_from_slice(data))
    }
}

impl Qp {
    /// Binds `window` to this QP over `range` of `region` (see
    /// [`QueuePair::bind_shared_window`](crate::transport::QueuePair::bind_shared_window)):
    /// the key table then refuses any access outside exactly that range.
    pub fn bind_shared_window(
        &self,
        wr_id: u64,
        window: &Mw,
        region: &Shared,
        range: Range<usize>,
        access: Access,
    ) -> Result<RemoteRegion> {
        if range.start >= range.end || range.end > region.len() {
            return Err(invalid(format!(
                "grant of {range:?} outside a shared region of {} bytes (or empty)",
                region.len()
            )));
        }
        let remote = access.remote_part();
        if remote != access || remote == Access::NONE {
            return Err(invalid(format!(
                "a grant gives remote access only, and some: {access:?}"
            )));
        }
        let writes = Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        if remote.bits() & writes.bits() != 0 && !region.is_writable() {
            return Err(invalid(
                "remote write or atomic access to a read-only region",
            ));
        }
        if !Arc::ptr_eq(region.inner.mr.device_core(), &self.inner.resp.device) {
            return Err(invalid("the shared region belongs to another device"));
        }
        let slice = region.inner.mr.sge(range)?.slice();
        self.bind_slice(wr_id, window, slice, access)
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("copies", &self.inner.copies)
            .field("writable", &self.is_writable())
            .finish()
    }
}
