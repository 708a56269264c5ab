//! Memory windows (type 2): remote access to a range of a registered region, bound to
//! one QP. A peer on any other QP gets a remote access error with the same rkey, which is
//! what makes a grant a per-connection capability on a PD shared by every connection.
//! Deallocating the window revokes the rkey.

use std::ptr::NonNull;

use super::sys::*;

use super::error::{Result, Verb, VerbsError};
use super::pd::ProtectionDomain;

/// A type 2 memory window. Bind it with [`super::QueuePair::bind_window`].
pub struct MemoryWindow {
    _pd: ProtectionDomain,
    mw: NonNull<ibv_mw>,
}

// SAFETY: the window is only handed to thread-safe verbs (post_send, dealloc) and is
// deallocated once in Drop.
unsafe impl Send for MemoryWindow {}
// SAFETY: as above.
unsafe impl Sync for MemoryWindow {}

impl MemoryWindow {
    /// Allocates a type 2 window on `pd`.
    pub fn alloc(pd: &ProtectionDomain) -> Result<MemoryWindow> {
        // SAFETY: the PD is alive (and kept alive by the clone stored below).
        let mw = unsafe { ibv_alloc_mw(pd.as_ptr(), ibv_mw_type::IBV_MW_TYPE_2) };
        let mw = NonNull::new(mw).ok_or_else(|| VerbsError::last_os(Verb::AllocMw))?;
        Ok(MemoryWindow {
            _pd: pd.clone(),
            mw,
        })
    }

    /// The rkey the window currently has (the next bind picks a new one).
    pub fn rkey(&self) -> u32 {
        // SAFETY: the window is alive; `rkey` is a plain field.
        unsafe { self.mw.as_ref().rkey }
    }

    /// The rkey the next bind gives the window.
    pub fn next_rkey(&self) -> u32 {
        next_rkey(self.rkey())
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_mw {
        self.mw.as_ptr()
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_mw and deallocated exactly once; this also
        // invalidates any rkey bound through it.
        let ret = unsafe { ibv_dealloc_mw(self.mw.as_ptr()) };
        if ret != 0 {
            tracing::error!(errno = ret, "ibv_dealloc_mw failed");
        }
    }
}

impl std::fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("rkey", &self.rkey())
            .finish()
    }
}

/// The rkey a bind should give the window: its current key with the low byte bumped, so
/// rkeys from earlier binds stop working.
pub(crate) fn next_rkey(current: u32) -> u32 {
    (current & !0xff) | (current.wrapping_add(1) & 0xff)
}

#[cfg(test)]
mod tests {
    #[test]
    fn bumping_keeps_the_index_and_changes_the_key() {
        assert_eq!(super::next_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(super::next_rkey(0x1234_5601), 0x1234_5602);
    }
}
