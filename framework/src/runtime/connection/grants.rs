//! Shared regions granted to one connection: a memory window bound to its QP over a
//! range of a [`SharedRegion`] registered once for every connection.

use std::ops::Range;

use super::buf::GrantEntry;
use super::{ring, SessionCx, Wr};
use crate::runtime::SessionError;
use crate::verbs::{
    Access, MemoryWindow, ProtectionDomain, RemoteRegion, SharedRegion, VerbsError,
};

/// Names a grant of this connection (see [`SessionCx::grant`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GrantId(usize);

/// Remote access to a range of a [`SharedRegion`], for one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Revoke it with [`SessionCx::revoke`].
    pub id: GrantId,
    /// What the peer needs: the range's address and length, and an rkey that works on
    /// this connection's QP only.
    pub remote: RemoteRegion,
}

impl SessionCx<'_> {
    /// The protection domain every connection of this server (or client) shares: register
    /// [`SharedRegion`]s on it, then [`grant`](Self::grant) them per connection.
    pub fn protection_domain(&self) -> &ProtectionDomain {
        &self.core.pd
    }

    /// Grants this connection's peer `access` (remote flags only, e.g.
    /// `Access::REMOTE_READ`) to exactly `range` (bytes from the start of the
    /// registration) of `region`, which must be registered on this connection's PD.
    ///
    /// A type 2 memory window is bound to this connection's QP over the range: the rkey
    /// works for this peer only (another connection's QP gets a remote access error with
    /// it), an access beyond `access` or outside the range is a remote access error, and
    /// the bind is posted here, ahead of any message carrying the rkey.
    ///
    /// Provider caveat: rxe (Soft-RoCE) checks an access through a window against the
    /// range of the region underneath, not the window's (observed on Linux 6.1, see
    /// `tests/shared_grants.rs`). Where the exact range matters on rxe, grant whole
    /// regions (register one `SharedRegion` per thing to expose, as the read service
    /// does).
    ///
    /// The window is deallocated (the rkey revoked) by [`revoke`](Self::revoke) or when
    /// the connection closes. Grants are owned by the connection rather than handed to
    /// the session as values because windows hold a reference on the QP and must go
    /// before it, while the session outlives the QP.
    pub fn grant(
        &mut self,
        region: &SharedRegion,
        range: Range<usize>,
        access: Access,
    ) -> Result<Grant, SessionError> {
        if !region.pd().same_as(&self.core.pd) {
            return Err(SessionError::new(
                "the shared region is registered on another protection domain",
            ));
        }
        if self.core.send_outstanding >= self.core.send_depth {
            return Err(SessionError::new(
                "send queue full; cannot bind a window now",
            ));
        }
        let err = |e: VerbsError| SessionError::new(e.to_string());
        let window = MemoryWindow::alloc(&self.core.pd).map_err(err)?;
        // A window over a shared region is verbs' alone, so this bind is posted here
        // rather than queued for the driver (see `post.rs`): what was decided before it
        // goes first.
        ring(self.core).map_err(|e| SessionError::new(e.to_string()))?;
        let wr_id = self.core.inflight.vacant_key();
        let remote = self
            .core
            .qp()
            .bind_shared_window(wr_id as u64, &window, region, range, access)
            .map_err(err)?;
        self.core.inflight.insert(Wr::Bind);
        self.core.send_outstanding += 1;
        let id = GrantId(self.core.grants.insert(GrantEntry {
            window,
            _region: region.clone(),
            remote,
        }));
        Ok(Grant { id, remote })
    }

    /// Revokes a grant at once (the window is deallocated; the peer's next access with
    /// its rkey is a remote access error). Unknown ids are ignored.
    pub fn revoke(&mut self, id: GrantId) {
        if let Some(entry) = self.core.grants.try_remove(id.0) {
            tracing::trace!(rkey = entry.window.rkey(), "grant revoked");
        }
    }

    /// What the peer needs for a live grant.
    pub fn granted(&self, id: GrantId) -> Option<RemoteRegion> {
        self.core.grants.get(id.0).map(|g| g.remote)
    }
}
