//! Memory regions: registered bytes, and the keys that let the local NIC and remote peers
//! reach them.
//!
//! Registered memory is treated as bytes shared with the NIC, never as typed values: a
//! remote peer with the rkey can write any bit pattern into it (rust-ibverbs #58), so
//! callers decode it explicitly. A region is deregistered before its memory is freed, so
//! a work request still queued when the region is dropped fails with a protection error
//! instead of touching freed memory.

use std::alloc::Layout;
use std::ops::{BitOr, BitOrAssign, Range};
use std::ptr::NonNull;
use std::sync::Arc;

use super::sys::*;

use super::error::{Result, VerbsError};
use super::pd::ProtectionDomain;

/// Which operations a region allows. Grant the least: a region that only serves RDMA
/// READs gets `REMOTE_READ` and nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Access(u32);

impl Access {
    /// Local access only (the NIC can read it for SEND/WRITE sources).
    pub const NONE: Access = Access(0);
    /// The local NIC may write into it (RECV targets, READ and atomic result buffers).
    pub const LOCAL_WRITE: Access = Access(ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0);
    /// Remote peers may RDMA WRITE into it.
    pub const REMOTE_WRITE: Access = Access(ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0);
    /// Remote peers may RDMA READ from it.
    pub const REMOTE_READ: Access = Access(ibv_access_flags::IBV_ACCESS_REMOTE_READ.0);
    /// Remote peers may run atomics on it.
    pub const REMOTE_ATOMIC: Access = Access(ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0);
    /// Memory windows may be bound to it (which is how remote access is granted to one
    /// QP only).
    pub const MW_BIND: Access = Access(ibv_access_flags::IBV_ACCESS_MW_BIND.0);

    /// Only the remote-access flags of `self`.
    pub const fn remote_part(self) -> Access {
        Access(self.0 & (Self::REMOTE_WRITE.0 | Self::REMOTE_READ.0 | Self::REMOTE_ATOMIC.0))
    }

    /// True when every flag of `other` is set in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// The raw `ibv_access_flags` bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}

/// Where a remote peer's bytes are: what an RDMA WRITE, READ or atomic needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct RemoteRegion {
    /// Virtual address in the peer's registration.
    pub addr: u64,
    /// Length in bytes the peer granted.
    pub len: u64,
    /// The peer's rkey.
    pub rkey: u32,
}

impl RemoteRegion {
    /// A sub-range of this remote region, checked against the granted length.
    pub fn slice(&self, offset: u64, len: u64) -> Result<RemoteRegion> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(VerbsError::InvalidArgument(format!(
                "remote range {offset}+{len} outside granted {} bytes",
                self.len
            )));
        }
        // The region is the peer's word: its end may lie past the address space.
        let Some(addr) = self
            .addr
            .checked_add(offset)
            .filter(|a| a.checked_add(len).is_some())
        else {
            return Err(VerbsError::InvalidArgument(format!(
                "remote range {offset}+{len} of a region at {:#x} wraps around the address space",
                self.addr
            )));
        };
        Ok(RemoteRegion {
            addr,
            len,
            rkey: self.rkey,
        })
    }

    /// The address `offset` bytes in, without a length (for atomics and raw targets).
    pub fn at(&self, offset: u64) -> RemoteRegion {
        RemoteRegion {
            addr: self.addr.wrapping_add(offset),
            len: self.len.saturating_sub(offset),
            rkey: self.rkey,
        }
    }
}

/// A scatter/gather entry: a checked range of a registered region, borrowed for the
/// duration of the post call.
#[derive(Debug, Clone, Copy)]
pub struct Sge<'a> {
    pub(crate) addr: u64,
    pub(crate) len: u32,
    pub(crate) lkey: u32,
    _region: std::marker::PhantomData<&'a MemoryRegion>,
}

impl Sge<'_> {
    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True for a zero-length entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn raw(&self) -> ibv_sge {
        ibv_sge {
            addr: self.addr,
            length: self.len,
            lkey: self.lkey,
        }
    }
}

struct Registration {
    pd: ProtectionDomain,
    mr: NonNull<ibv_mr>,
    buf: NonNull<u8>,
    memory: Memory,
    access: Access,
}

/// Who owns the registered bytes, and so how they are freed after deregistration.
enum Memory {
    /// Page-aligned, zeroed pages from [`alloc_pages`].
    Pages(Layout),
    /// A message's own buffer, registered where it lies instead of copied into pages
    /// (see [`MemoryRegion::register_vec`]). Never touched through the `Vec` while
    /// registered: its heap buffer does not move when the `Vec` value does.
    Vec(#[allow(dead_code)] Vec<u8>),
}

// SAFETY: the registration is only read through its immutable fields and freed once in
// Drop; ibv_dereg_mr is thread-safe.
unsafe impl Send for Registration {}
// SAFETY: as above; byte access goes through `MemoryRegion`, whose ranges are disjoint.
unsafe impl Sync for Registration {}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: `mr` is registered and deregistered exactly once, before the memory is
        // freed, so the NIC can no longer reach `buf` once it is released below.
        let ret = unsafe { ibv_dereg_mr(self.mr.as_ptr()) };
        if ret != 0 {
            // Leak the memory rather than free bytes the NIC may still write.
            tracing::error!(errno = ret, "ibv_dereg_mr failed; leaking the buffer");
            return;
        }
        if let Memory::Pages(layout) = self.memory {
            // SAFETY: `buf` was allocated with `layout` in `MemoryRegion::register`.
            unsafe { std::alloc::dealloc(self.buf.as_ptr(), layout) };
        }
        // A `Memory::Vec` frees its buffer when the field drops, after this.
    }
}

/// A range of registered, page-aligned memory that this value owns exclusively.
///
/// One registration can be split into disjoint regions (for pools): each keeps the
/// registration alive, and it is deregistered when the last one is dropped.
pub struct MemoryRegion {
    reg: Arc<Registration>,
    offset: usize,
    len: usize,
}

/// `len` zeroed, page-aligned bytes (pages are what the NIC pins), and their layout for
/// freeing them. `what` names the caller in the error for an empty region; an
/// allocation the system refuses is [`VerbsError::OutOfMemory`].
pub(super) fn alloc_pages(len: usize, what: &str) -> Result<(NonNull<u8>, Layout)> {
    if len == 0 {
        return Err(VerbsError::InvalidArgument(format!(
            "cannot {what} an empty region"
        )));
    }
    let layout = Layout::from_size_align(len, 4096)
        .map_err(|e| VerbsError::InvalidArgument(format!("region of {len} bytes: {e}")))?;
    // SAFETY: `layout` has non-zero size.
    let buf = unsafe { std::alloc::alloc_zeroed(layout) };
    // A failed allocation is reported, never `handle_alloc_error`'s abort: the length
    // may have come from a peer.
    let buf = NonNull::new(buf).ok_or(VerbsError::OutOfMemory { len })?;
    Ok((buf, layout))
}

impl MemoryRegion {
    /// Allocates `len` zeroed, page-aligned bytes and registers them on `pd` with `access`.
    pub fn register(pd: &ProtectionDomain, len: usize, access: Access) -> Result<MemoryRegion> {
        let (buf, layout) = alloc_pages(len, "register")?;
        // Remote write and atomics require local write (verbs spec); add it rather than
        // failing with EINVAL.
        let mut flags = access;
        if access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC) {
            flags |= Access::LOCAL_WRITE;
        }
        // SAFETY: `buf` points to `len` bytes that stay allocated until Registration's
        // Drop, which deregisters first; the PD is kept alive by the clone stored below.
        let mr = unsafe { ibv_reg_mr(pd.as_ptr(), buf.as_ptr().cast(), len, flags.bits() as i32) };
        let Some(mr) = NonNull::new(mr) else {
            let err = super::rlimit::registration_failed(len);
            // SAFETY: registration failed, so nothing else refers to `buf`.
            unsafe { std::alloc::dealloc(buf.as_ptr(), layout) };
            return Err(err);
        };
        Ok(MemoryRegion {
            reg: Arc::new(Registration {
                pd: pd.clone(),
                mr,
                buf,
                memory: Memory::Pages(layout),
                access: flags,
            }),
            offset: 0,
            len,
        })
    }

    /// Registers the bytes of `bytes` where they lie, taking ownership of the vector:
    /// a large outgoing message is exposed without being copied into fresh pages (one
    /// pass over it fewer on the thread that also serves other connections). The region
    /// covers exactly `bytes.len()` bytes; the pages it pins may hold other heap data,
    /// which is why remote access to it is only ever granted through a window bound over
    /// exactly this range, and why a provider that checks the MR's range (rxe) sees only
    /// the message. Read-only use: [`MemoryRegion::as_mut_slice`] still works but the
    /// caller should not need it.
    pub fn register_vec(
        pd: &ProtectionDomain,
        mut bytes: Vec<u8>,
        access: Access,
    ) -> Result<MemoryRegion> {
        let len = bytes.len();
        if len == 0 {
            return Err(VerbsError::InvalidArgument(
                "cannot register an empty region".into(),
            ));
        }
        let mut flags = access;
        if access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC) {
            flags |= Access::LOCAL_WRITE;
        }
        let buf = NonNull::new(bytes.as_mut_ptr()).expect("a non-empty Vec's pointer");
        // SAFETY: `buf` points to `len` initialized bytes of the vector's heap buffer,
        // which `Registration` owns (moving the `Vec` does not move that buffer) and
        // frees only after Drop has deregistered; the PD is kept alive by the clone
        // stored below.
        let mr = unsafe { ibv_reg_mr(pd.as_ptr(), buf.as_ptr().cast(), len, flags.bits() as i32) };
        let Some(mr) = NonNull::new(mr) else {
            return Err(super::rlimit::registration_failed(len));
        };
        Ok(MemoryRegion {
            reg: Arc::new(Registration {
                pd: pd.clone(),
                mr,
                buf,
                memory: Memory::Vec(bytes),
                access: flags,
            }),
            offset: 0,
            len,
        })
    }

    /// Splits this region into consecutive disjoint regions of `chunk` bytes (the last one
    /// may be shorter). Each piece shares the registration and its keys.
    pub fn split(self, chunk: usize) -> Vec<MemoryRegion> {
        let chunk = chunk.max(1);
        (0..self.len)
            .step_by(chunk)
            .map(|start| MemoryRegion {
                reg: self.reg.clone(),
                offset: self.offset + start,
                len: chunk.min(self.len - start),
            })
            .collect()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty region (never produced by `register`).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The access this registration grants.
    pub fn access(&self) -> Access {
        self.reg.access
    }

    /// The PD the memory is registered on.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.reg.pd
    }

    /// Local key, for scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        // SAFETY: `mr` stays registered while `reg` is alive.
        unsafe { self.reg.mr.as_ref().lkey }
    }

    /// Remote key, for peers' one-sided operations (only useful with remote access).
    pub fn rkey(&self) -> u32 {
        // SAFETY: `mr` stays registered while `reg` is alive.
        unsafe { self.reg.mr.as_ref().rkey }
    }

    pub(crate) fn raw_mr(&self) -> *mut ibv_mr {
        self.reg.mr.as_ptr()
    }

    /// Virtual address of the first byte of this range.
    pub fn addr(&self) -> u64 {
        self.reg.buf.as_ptr() as u64 + self.offset as u64
    }

    /// The bytes. They may change underneath when the region was granted remote write
    /// access or handed to a RECV/READ; read them after the completion that filled them.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: [offset, offset+len) lies inside the allocation and is owned by this
        // value alone (split produces disjoint ranges); every bit pattern is a valid u8.
        unsafe { std::slice::from_raw_parts(self.reg.buf.as_ptr().add(self.offset), self.len) }
    }

    /// The bytes, mutably (for filling send buffers).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` guarantees no other Rust reference to this
        // range exists.
        unsafe { std::slice::from_raw_parts_mut(self.reg.buf.as_ptr().add(self.offset), self.len) }
    }

    /// A scatter/gather entry for `range` of this region.
    pub fn sge(&self, range: Range<usize>) -> Result<Sge<'_>> {
        if range.start > range.end || range.end > self.len {
            return Err(VerbsError::InvalidArgument(format!(
                "local range {range:?} outside region of {} bytes",
                self.len
            )));
        }
        let len = u32::try_from(range.end - range.start).map_err(|_| {
            VerbsError::InvalidArgument("a scatter/gather entry is at most 4 GiB".into())
        })?;
        Ok(Sge {
            addr: self.addr() + range.start as u64,
            len,
            lkey: self.lkey(),
            _region: std::marker::PhantomData,
        })
    }

    /// A scatter/gather entry covering the whole region.
    pub fn sge_all(&self) -> Sge<'_> {
        Sge {
            addr: self.addr(),
            len: self.len.min(u32::MAX as usize) as u32,
            lkey: self.lkey(),
            _region: std::marker::PhantomData,
        }
    }

    /// What a peer needs to reach this whole region (addr, len, rkey).
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.addr(),
            len: self.len as u64,
            rkey: self.rkey(),
        }
    }
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .field("access", &self.reg.access)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_slices_stay_inside_the_grant() {
        let r = RemoteRegion {
            addr: 0x1000,
            len: 100,
            rkey: 7,
        };
        let s = r.slice(10, 90).unwrap();
        assert_eq!((s.addr, s.len, s.rkey), (0x1000 + 10, 90, 7));
        assert!(r.slice(10, 91).is_err());
        assert!(
            r.slice(u64::MAX, 2).is_err(),
            "overflow is refused, not wrapped"
        );
        assert_eq!(r.slice(100, 0).unwrap().len, 0);
    }

    /// Issue 26 (7): a peer's region near the top of the address space. `addr + offset`
    /// overflowed here, a panic (and so an abort) in a build with overflow checks.
    #[test]
    fn a_region_that_wraps_the_address_space_is_refused_not_wrapped() {
        let r = RemoteRegion {
            addr: u64::MAX - 10,
            len: 1 << 20,
            rkey: 7,
        };
        let err = r.slice(64, 4096).unwrap_err();
        assert!(err.to_string().contains("wraps around"), "{err}");
        // The end (one past the last byte) must itself be a u64.
        assert!(r.slice(0, 10).is_ok());
        assert!(r.slice(0, 11).is_err());
    }

    /// Issue 16: a size the allocator cannot serve is an error, not `handle_alloc_error`'s
    /// abort of the whole process.
    #[test]
    fn a_failed_allocation_is_an_error() {
        let len = isize::MAX as usize - 8191;
        let err = alloc_pages(len, "register").unwrap_err();
        assert!(
            matches!(err, VerbsError::OutOfMemory { len: l } if l == len),
            "{err}"
        );
    }

    #[test]
    fn access_flags_combine() {
        let a = Access::REMOTE_READ | Access::REMOTE_WRITE;
        assert!(a.contains(Access::REMOTE_READ));
        assert!(!a.contains(Access::REMOTE_ATOMIC));
        assert!(a.contains(Access::NONE));
        assert_eq!(a.bits(), 0b110);
    }
}
