//! Shared regions: memory registered once on a PD and served to many connections, each
//! through a memory window bound to its own QP.
//!
//! A per-connection copy of data every client reads wastes memory and makes updates
//! visible only when each copy is refreshed. A [`SharedRegion`] is registered once, with
//! `LOCAL_WRITE | MW_BIND` (or `MW_BIND` alone for a read-only file mapping) and **no**
//! remote access on the MR itself: its rkey reaches nothing. Remote access exists only
//! through type 2 windows ([`super::QueuePair::bind_shared_window`]), each bound to one QP
//! over one range with the least access, so a client cannot use another client's rkey.
//! Whether it can reach past its range but inside the MR depends on the provider: rxe
//! checks window accesses against the MR's range only, so grant whole regions where the
//! range matters.
//!
//! The application updates the bytes in place while the NIC reads them. Rust code
//! touches them only under the region's writer lock (so there is never a data race
//! between threads of this process); the NIC reads without any lock, which is why
//! versioned regions exist.
//!
//! See [`SharedRegion`] for the layout of versioned regions and why readers never tear.

use std::alloc::Layout;
use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::sys::*;

use super::error::{Result, Verb, VerbsError};
use super::mr::Access;
use super::pd::ProtectionDomain;

/// Bytes before the data of a versioned region: one little-endian `u64` version word.
pub const VERSION_LEN: usize = 8;

/// The copy of a versioned region with `copies` copies that holds version `version`.
pub fn copy_of(version: u64, copies: usize) -> usize {
    ((version / 2) % copies.max(1) as u64) as usize
}

/// True when a reader of a region with `copies` copies may accept data it read from the
/// copy of `before` (an even version) between reading `before` and `after`.
pub fn accepts(before: u64, after: u64, copies: usize) -> bool {
    let slack = 2 * (copies.max(1) as u64 - 1);
    before % 2 == 0 && after >= before && after - before <= slack
}

/// Where a region's bytes come from; freed (or unmapped) after deregistration.
enum Backing {
    /// `alloc_zeroed` with this layout.
    Heap(Layout),
    /// A read-only `mmap` of a file, `len` bytes.
    Mapped,
}

/// The bytes, without the registration: what the writer and the unit tests use.
struct Bytes {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

impl Bytes {
    /// `len` zeroed, page-aligned bytes.
    fn heap(len: usize) -> Result<Bytes> {
        let (ptr, layout) = super::mr::alloc_pages(len, "share")?;
        Ok(Bytes {
            ptr,
            len,
            backing: Backing::Heap(layout),
        })
    }

    /// The whole of `file`, mapped read-only.
    fn map(file: &File) -> Result<Bytes> {
        let len = file
            .metadata()
            .map_err(|e| VerbsError::InvalidArgument(format!("file metadata: {e}")))?
            .len();
        let len = usize::try_from(len)
            .map_err(|_| VerbsError::InvalidArgument(format!("file of {len} bytes")))?;
        if len == 0 {
            return Err(VerbsError::InvalidArgument(
                "cannot share an empty file".into(),
            ));
        }
        // Writable and private (copy-on-write), not PROT_READ: the kernel pins every
        // MW_BIND registration for writing (`ib_access_writable` counts MW_BIND), which a
        // PROT_READ mapping refuses with EFAULT. Private means the file itself can never
        // be written through it; `seal` makes it PROT_READ once registered.
        // SAFETY: a fresh private mapping of an open fd; nothing else refers to the address
        // range the kernel picks. The fd may be closed afterwards (the mapping keeps the
        // file). Truncating the file while it is mapped would make reads of the lost pages
        // fault (SIGBUS): served files must not shrink (documented on
        // `SharedRegion::map_file`).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(VerbsError::last_os(Verb::Mmap));
        }
        let ptr = NonNull::new(ptr.cast()).ok_or_else(|| VerbsError::last_os(Verb::Mmap))?;
        Ok(Bytes {
            ptr,
            len,
            backing: Backing::Mapped,
        })
    }

    fn writable(&self) -> bool {
        matches!(self.backing, Backing::Heap(_))
    }

    /// Makes a file mapping read-only for this process (the pinned pages stay reachable
    /// by the NIC, which only ever READs them through windows).
    fn seal(&self) -> Result<()> {
        if self.writable() {
            return Ok(());
        }
        // SAFETY: `ptr..ptr+len` is exactly the mapping made in `Bytes::map`; removing write
        // permission cannot invalidate any reference (this process never writes it).
        let ret = unsafe { libc::mprotect(self.ptr.as_ptr().cast(), self.len, libc::PROT_READ) };
        if ret != 0 {
            return Err(VerbsError::last_os(Verb::Mmap));
        }
        Ok(())
    }

    fn check(&self, range: &Range<usize>) -> Result<()> {
        if range.start > range.end || range.end > self.len {
            return Err(VerbsError::InvalidArgument(format!(
                "range {range:?} outside a shared region of {} bytes",
                self.len
            )));
        }
        Ok(())
    }

    /// Copies `range` out. Callers hold the writer lock (no Rust writer runs meanwhile).
    fn copy_out(&self, range: Range<usize>) -> Result<Vec<u8>> {
        self.check(&range)?;
        // SAFETY: the range lies inside the live allocation or mapping (checked above);
        // the writer lock held by the caller excludes writes from this process; every bit
        // pattern is a valid u8.
        let slice =
            unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(range.start), range.len()) };
        Ok(slice.to_vec())
    }

    /// Runs `f` on the bytes of `range`, mutably. Callers hold the writer lock.
    fn with_mut<R>(&self, range: Range<usize>, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        self.check(&range)?;
        if !self.writable() {
            return Err(VerbsError::InvalidArgument(
                "the shared region is a read-only file mapping".into(),
            ));
        }
        // SAFETY: the range lies inside the live heap allocation (checked above, and
        // mapped regions were refused); the caller's writer lock makes this the only Rust
        // reference to the bytes while `f` runs. The NIC may read them concurrently, which
        // is outside Rust's memory model and why versioned regions use a seqlock.
        let slice = unsafe {
            std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(range.start), range.len())
        };
        Ok(f(slice))
    }

    /// The version word (bytes 0..8) of a versioned region.
    fn version_word(&self) -> &AtomicU64 {
        debug_assert!(self.len >= VERSION_LEN);
        // SAFETY: the allocation is page-aligned (so 8-aligned) and at least 8 bytes long
        // for versioned regions; the word is only ever accessed atomically by this process
        // (the NIC reads it with 8-byte granularity from coherent memory) and lives as
        // long as `self`.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().cast::<u64>()) }
    }

    /// The seqlock writer over `copies` copies of `data_len` bytes (see [`SharedRegion`]):
    /// stores the marker `version - 1`, copies the current copy into the copy of
    /// `version`, runs `f` on it, then stores `version` (even, larger than the current
    /// one). Callers hold the writer lock.
    ///
    /// The fences keep the compiler and the CPU from moving data stores across the
    /// version stores (the NIC, or rxe's kernel thread, reads the same coherent memory).
    fn publish<R>(
        &self,
        copies: usize,
        data_len: usize,
        version: u64,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R> {
        let old = self.version_word().load(Ordering::Relaxed);
        if version % 2 != 0 || version <= old {
            return Err(VerbsError::InvalidArgument(format!(
                "version {version} after {old}: versions must be even and grow"
            )));
        }
        let area = VERSION_LEN..VERSION_LEN + copies * data_len;
        // Checked before the marker goes in, so a refused write leaves the region stable.
        self.check(&area)?;
        if !self.writable() {
            return Err(VerbsError::InvalidArgument(
                "the shared region is a read-only file mapping".into(),
            ));
        }
        let (from, to) = (copy_of(old, copies), copy_of(version, copies));
        // `version - 1` (not `old + 1`) so that a jump of many versions still marks every
        // reader of the copy about to be rewritten.
        self.version_word().store(version - 1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let out = self.with_mut(area, |data| {
            if from != to {
                data.copy_within(from * data_len..(from + 1) * data_len, to * data_len);
            }
            f(&mut data[to * data_len..(to + 1) * data_len])
        })?;
        fence(Ordering::SeqCst);
        self.version_word().store(version, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        Ok(out)
    }
}

impl Drop for Bytes {
    fn drop(&mut self) {
        match self.backing {
            // SAFETY: allocated with this layout in `Bytes::heap`, freed once.
            Backing::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) },
            Backing::Mapped => {
                // SAFETY: mapped with this length in `Bytes::map`, unmapped once.
                let ret = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
                if ret != 0 {
                    tracing::error!(error = %std::io::Error::last_os_error(), "munmap failed");
                }
            }
        }
    }
}

struct SharedInner {
    pd: ProtectionDomain,
    mr: NonNull<ibv_mr>,
    /// Serialises this process's access to the bytes (the NIC does not take it).
    lock: Mutex<()>,
    /// Copies of the data of a versioned region (0: not versioned).
    copies: usize,
    access: Access,
    /// Freed in `Drop`, only after the MR was deregistered.
    bytes: std::mem::ManuallyDrop<Bytes>,
}

// SAFETY: the raw pointers are only handed to thread-safe verbs (bind, dereg) and the
// bytes are only touched by this process under `lock`; freed once in Drop.
unsafe impl Send for SharedInner {}
// SAFETY: as above.
unsafe impl Sync for SharedInner {}

impl Drop for SharedInner {
    fn drop(&mut self) {
        // SAFETY: registered once and deregistered once, before `bytes` is freed. Every
        // window bound over it holds a clone of the region, so none is bound any more.
        let ret = unsafe { ibv_dereg_mr(self.mr.as_ptr()) };
        if ret != 0 {
            // Leak the bytes rather than free memory the NIC may still reach.
            tracing::error!(
                errno = ret,
                "ibv_dereg_mr of a shared region failed; leaking it"
            );
            return;
        }
        // SAFETY: dropped exactly once, here, and never used again.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.bytes) };
    }
}

/// Memory registered once on a PD and granted to connections through memory windows
/// bound to their QPs (`SessionCx::grant`); the MR itself grants no remote access. Cheap
/// to clone; deregistered when the last clone and the last window over it are gone.
///
/// # Versioned regions: a seqlock over a ring of copies
///
/// ```text
/// | version: u64 LE | copy 0: data_len bytes | copy 1 | ... | copy k-1 |
/// ```
///
/// Version `v` (even) lives in copy `(v / 2) % k`. [`SharedRegion::update`] to version
/// `n`: store the odd marker `n - 1`, copy the current copy into copy `(n / 2) % k`, run
/// the caller's change on it, store `n`; full fences between the steps. A one-sided reader
/// READs the version `v`, then the data of copy `(v / 2) % k`, then the version `v2` (each
/// READ after the previous completed) and accepts iff `v` is even and
/// `v <= v2 <= v + 2 (k - 1)` ([`accepts`]): the copy it read is only rewritten by the
/// update to `v + 2k`, whose marker `v + 2k - 1` is stored (and fenced) before any of its
/// data stores, so if the data READ saw any of those stores the second version READ
/// sees that marker or later. With `k = 1` this is the classic seqlock (`v2 == v`); more
/// copies let a reader finish while up to `k - 1` updates happen, which is what keeps
/// one-sided readers from starving when READs are slow and updates frequent. Memory is
/// `k` copies once per server, not per connection.
#[derive(Clone)]
pub struct SharedRegion {
    inner: Arc<SharedInner>,
}

impl SharedRegion {
    fn register(pd: &ProtectionDomain, bytes: Bytes, copies: usize) -> Result<SharedRegion> {
        // No remote access on the MR: peers reach it only through windows.
        let access = if bytes.writable() {
            Access::LOCAL_WRITE | Access::MW_BIND
        } else {
            Access::MW_BIND
        };
        // SAFETY: `bytes` stays allocated (or mapped) until SharedInner's Drop, which
        // deregisters first; the PD is kept alive by the clone stored below.
        let mr = unsafe {
            ibv_reg_mr(
                pd.as_ptr(),
                bytes.ptr.as_ptr().cast(),
                bytes.len,
                access.bits() as i32,
            )
        };
        let mr = NonNull::new(mr).ok_or_else(|| super::rlimit::registration_failed(bytes.len))?;
        let region = SharedRegion {
            inner: Arc::new(SharedInner {
                pd: pd.clone(),
                mr,
                lock: Mutex::new(()),
                copies,
                access,
                bytes: std::mem::ManuallyDrop::new(bytes),
            }),
        };
        region.inner.bytes.seal()?;
        Ok(region)
    }

    /// `len` zeroed bytes registered on `pd` with `LOCAL_WRITE | MW_BIND`.
    pub fn alloc(pd: &ProtectionDomain, len: usize) -> Result<SharedRegion> {
        Self::register(pd, Bytes::heap(len)?, 0)
    }

    /// A versioned region: a [`VERSION_LEN`]-byte version word (0 until the first
    /// [`update`](Self::update)) followed by `copies` copies of `data_len` zeroed bytes,
    /// registered with `LOCAL_WRITE | MW_BIND`. Updates are seqlock writes into the next
    /// copy (see [`SharedRegion`] for how many copies to ask for).
    pub fn alloc_versioned(
        pd: &ProtectionDomain,
        data_len: usize,
        copies: usize,
    ) -> Result<SharedRegion> {
        if copies == 0 {
            return Err(VerbsError::InvalidArgument(
                "a versioned region needs at least one copy".into(),
            ));
        }
        let len = data_len
            .checked_mul(copies)
            .and_then(|n| n.checked_add(VERSION_LEN))
            .ok_or_else(|| {
                VerbsError::InvalidArgument(format!("{copies} copies of {data_len} bytes"))
            })?;
        Self::register(pd, Bytes::heap(len)?, copies)
    }

    /// The whole of `file`, mapped privately and registered with `MW_BIND` only (no
    /// `LOCAL_WRITE`), then made `PROT_READ`: windows over it can only grant
    /// `REMOTE_READ`, and this API never writes it.
    ///
    /// Why not a plain `PROT_READ` mapping: the kernel pins every `MW_BIND` registration
    /// for writing (rxe included), which fails on read-only pages, and a `MW_BIND`-less
    /// registration could not be granted per connection. Pinning a private writable
    /// mapping breaks copy-on-write, so the region costs its size in anonymous memory
    /// (once per server) and later changes to the file do not show. The file must not be
    /// truncated while it is being registered.
    pub fn map_file(pd: &ProtectionDomain, file: &File) -> Result<SharedRegion> {
        Self::register(pd, Bytes::map(file)?, 0)
    }

    /// Registered bytes (the version word included).
    pub fn len(&self) -> usize {
        self.inner.bytes.len
    }

    /// True for an empty region (never produced by the constructors).
    pub fn is_empty(&self) -> bool {
        self.inner.bytes.len == 0
    }

    /// Bytes of data (of one copy, for a versioned region).
    pub fn data_len(&self) -> usize {
        match self.inner.copies {
            0 => self.len(),
            k => (self.len() - VERSION_LEN) / k,
        }
    }

    /// Where the data of version `version` starts: after the version word, in the copy
    /// that holds it, for a versioned region; 0 otherwise.
    pub fn data_offset(&self, version: u64) -> usize {
        match self.inner.copies {
            0 => 0,
            k => VERSION_LEN + copy_of(version, k) * self.data_len(),
        }
    }

    /// Copies of the data a versioned region keeps (0 for an unversioned one).
    pub fn copies(&self) -> usize {
        self.inner.copies
    }

    /// True for a region with a version word.
    pub fn is_versioned(&self) -> bool {
        self.inner.copies > 0
    }

    /// False for a read-only file mapping.
    pub fn is_writable(&self) -> bool {
        self.inner.bytes.writable()
    }

    /// The MR's access flags (never remote ones).
    pub fn access(&self) -> Access {
        self.inner.access
    }

    /// The PD it is registered on.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// Virtual address of the first registered byte.
    pub fn addr(&self) -> u64 {
        self.inner.bytes.ptr.as_ptr() as u64
    }

    pub(crate) fn raw_mr(&self) -> *mut ibv_mr {
        self.inner.mr.as_ptr()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.inner
            .lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The current version of a versioned region (`None` otherwise); odd while an
    /// update is under way.
    pub fn version(&self) -> Option<u64> {
        self.is_versioned()
            .then(|| self.inner.bytes.version_word().load(Ordering::Acquire))
    }

    /// A copy of `len` data bytes at `offset` of the current version.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] outside the data.
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= self.data_len())
            .ok_or_else(|| {
                VerbsError::InvalidArgument(format!(
                    "read of {len} bytes at {offset} outside {} bytes of data",
                    self.data_len()
                ))
            })?;
        let _g = self.lock();
        let base = self.data_offset(self.version().unwrap_or(0));
        self.inner.bytes.copy_out(base + offset..base + end)
    }

    /// Runs `f` on the data, mutably, and returns the version the region has afterwards
    /// (0 for an unversioned region). On a versioned region this is the seqlock writer
    /// (see [`SharedRegion`]): `f` gets the next copy, holding the current content, and the new
    /// version (the old one plus 2). Concurrent updates from several threads take turns.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for a read-only file mapping.
    pub fn update(&self, f: impl FnOnce(u64, &mut [u8])) -> Result<u64> {
        let _g = self.lock();
        let bytes = &self.inner.bytes;
        if self.is_versioned() {
            let next = (bytes.version_word().load(Ordering::Relaxed) & !1) + 2;
            bytes.publish(self.inner.copies, self.data_len(), next, |data| {
                f(next, data)
            })?;
            Ok(next)
        } else {
            bytes.with_mut(0..bytes.len, |data| f(0, data))?;
            Ok(0)
        }
    }

    /// Like [`update`](Self::update) on a versioned region, but the version becomes
    /// `version` (even, larger than the current one): for an application that carries
    /// versions of its own.
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] for an odd or non-increasing version, or a region
    /// that is not versioned or not writable.
    pub fn publish(&self, version: u64, f: impl FnOnce(&mut [u8])) -> Result<()> {
        if !self.is_versioned() {
            return Err(VerbsError::InvalidArgument(
                "publish needs a versioned region".into(),
            ));
        }
        let _g = self.lock();
        self.inner
            .bytes
            .publish(self.inner.copies, self.data_len(), version, f)
    }

    /// Overwrites `data.len()` data bytes at `offset`; returns the version afterwards
    /// (0 for an unversioned region).
    ///
    /// # Errors
    /// [`VerbsError::InvalidArgument`] outside the data (nothing is written) or for a
    /// read-only file mapping.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<u64> {
        let end = offset
            .checked_add(data.len())
            .filter(|&end| end <= self.data_len())
            .ok_or_else(|| {
                VerbsError::InvalidArgument(format!(
                    "write of {} bytes at {offset} outside {} bytes of data",
                    data.len(),
                    self.data_len()
                ))
            })?;
        self.update(|_, bytes| bytes[offset..end].copy_from_slice(data))
    }

    /// True when both are the same registration.
    pub fn same_as(&self, other: &SharedRegion) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl std::fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("copies", &self.inner.copies)
            .field("writable", &self.is_writable())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seqlock_writer_moves_the_version_by_even_steps() {
        let bytes = Bytes::heap(VERSION_LEN + 16).unwrap();
        assert_eq!(bytes.version_word().load(Ordering::Relaxed), 0);
        bytes
            .publish(1, 16, 2, |data| {
                assert_eq!(data.len(), 16);
                data.fill(7);
            })
            .unwrap();
        assert_eq!(bytes.version_word().load(Ordering::Relaxed), 2);
        let mut seen = None;
        bytes
            .publish(1, 16, 4, |_| {
                seen = Some(bytes.version_word().load(Ordering::Relaxed))
            })
            .unwrap();
        assert_eq!(seen, Some(3), "odd while the writer runs");
        assert_eq!(bytes.copy_out(0..8).unwrap(), 4u64.to_le_bytes());
        assert_eq!(bytes.copy_out(8..24).unwrap(), [7; 16]);
    }

    #[test]
    fn updates_rotate_through_the_copies_carrying_the_content_forward() {
        let (copies, len) = (3, 4);
        let bytes = Bytes::heap(VERSION_LEN + copies * len).unwrap();
        bytes
            .publish(copies, len, 2, |d| d.copy_from_slice(b"aaaa"))
            .unwrap();
        bytes.publish(copies, len, 4, |d| d[0] = b'b').unwrap();
        bytes.publish(copies, len, 6, |d| d[1] = b'c').unwrap();
        // Version v lives in copy (v / 2) % 3: 2 -> 1, 4 -> 2, 6 -> 0.
        let copy = |i: usize| bytes.copy_out(8 + i * len..8 + (i + 1) * len).unwrap();
        assert_eq!(copy(1), b"aaaa");
        assert_eq!(copy(2), b"baaa");
        assert_eq!(copy(0), b"bcaa");
        // A jump: the marker is version - 1, the content still carried over.
        let mut marker = 0;
        bytes
            .publish(copies, len, 20, |_| {
                marker = bytes.version_word().load(Ordering::Relaxed)
            })
            .unwrap();
        assert_eq!(marker, 19);
        assert_eq!(copy(copy_of(20, copies)), b"bcaa");
    }

    #[test]
    fn readers_accept_only_while_their_copy_is_untouched() {
        // One copy: the classic seqlock.
        assert!(accepts(4, 4, 1));
        assert!(!accepts(4, 5, 1));
        assert!(!accepts(5, 5, 1), "odd before");
        // Three copies: the copy of 4 is rewritten by the update to 10, marker 9.
        assert!(accepts(4, 8, 3));
        assert!(!accepts(4, 9, 3));
        assert!(!accepts(4, 2, 3), "a version never goes back");
        assert_eq!(copy_of(4, 3), copy_of(10, 3));
    }

    #[test]
    fn bad_versions_and_ranges_leave_the_region_stable() {
        let bytes = Bytes::heap(VERSION_LEN + 4).unwrap();
        bytes.publish(1, 4, 2, |_| ()).unwrap();
        assert!(bytes.publish(1, 4, 2, |_| ()).is_err(), "not larger");
        assert!(bytes.publish(1, 4, 5, |_| ()).is_err(), "odd");
        assert!(
            bytes.publish(2, 4, 6, |_| ()).is_err(),
            "more copies than fit"
        );
        assert_eq!(bytes.version_word().load(Ordering::Relaxed), 2);
        assert!(bytes.copy_out(0..13).is_err());
        assert!(bytes.with_mut(10..13, |_| ()).is_err());
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = 3..2;
        assert!(bytes.copy_out(backwards).is_err());
    }

    #[test]
    fn file_mappings_are_read_only() {
        let dir = std::env::temp_dir().join(format!("rdmactor-shared-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, b"mapped bytes").unwrap();
        let file = File::open(&path).unwrap();
        let bytes = Bytes::map(&file).unwrap();
        bytes.seal().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(!bytes.writable());
        assert_eq!(bytes.copy_out(0..12).unwrap(), b"mapped bytes");
        assert!(bytes.with_mut(0..1, |_| ()).is_err());
        let empty = tempfile_empty();
        assert!(Bytes::map(&empty).is_err());
    }

    fn tempfile_empty() -> File {
        let path = std::env::temp_dir().join(format!("rdmactor-empty-{}", std::process::id()));
        let f = File::create(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }
}
