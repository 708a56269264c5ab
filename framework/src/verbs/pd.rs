//! Protection domains.

use std::ptr::NonNull;
use std::sync::Arc;

use super::sys::*;

use super::device::Context;
use super::error::{check_ptr, Result, Verb};

/// A protection domain allocated from a device context, shared by every connection on
/// that device. Cheap to clone; it is deallocated after the last MR, QP and clone is gone.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) inner: Arc<PdInner>,
}

pub(crate) struct PdInner {
    pub(crate) ctx: Context,
    pd: NonNull<ibv_pd>,
}

// SAFETY: ibv_pd is only passed to thread-safe verbs; it is deallocated once in Drop.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: every MR and QP using this PD holds an Arc to it, so none is left.
        let ret = unsafe { ibv_dealloc_pd(self.pd.as_ptr()) };
        if ret != 0 {
            tracing::error!(errno = ret, "ibv_dealloc_pd failed");
        }
    }
}

impl ProtectionDomain {
    /// Allocates a PD on `ctx`.
    pub fn new(ctx: &Context) -> Result<Self> {
        // SAFETY: the context is open for as long as `ctx` lives, and we keep a clone.
        let pd = check_ptr(Verb::AllocPd, unsafe { ibv_alloc_pd(ctx.as_ptr()) })?;
        Ok(ProtectionDomain {
            inner: Arc::new(PdInner {
                ctx: ctx.clone(),
                pd,
            }),
        })
    }

    /// The device this PD belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// True when both are the same PD.
    pub fn same_as(&self, other: &ProtectionDomain) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_pd {
        self.inner.pd.as_ptr()
    }
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.inner.ctx.name())
            .finish()
    }
}
