//! Shared regions granted to one connection: a memory window bound to its QP over a
//! range of a shared region ([`SharedRegion`](crate::transport::SharedRegion)) registered
//! once for every connection.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::ops::Range;

use super::buf::GrantEntry;
use super::{ring, SessionCx, Wr};
use crate::runtime::SessionError;
use crate::transport::{Domain as _, QueuePair as _, SharedRegion as _, Transport};
use crate::verbs::{Access, RemoteRegion};

/// Names a grant of this connection (see [`SessionCx::grant`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GrantId(usize);

/// Remote access to a range of a shared region, for one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Revoke it with [`SessionCx::revoke`].
    pub id: GrantId,
    /// What the peer needs: the range's address and length, and an rkey that works on
    /// this connection's QP only.
    pub remote: RemoteRegion,
}

impl<T: Transport> SessionCx<'_, T> {
    /// The domain (device and protection domain) every connection of this server (or
    /// client) shares: register shared regions on it, then [`grant`](Self::grant) them
    /// per connection.
    pub fn domain(&self) -> &T::Domain {
        &self.core.pd
    }

    /// [`domain`](Self::domain) under its verbs name: on verbs, the protection domain.
    pub fn protection_domain(&self) -> &T::Domain {
        self.domain()
    }

    /// Grants this connection's peer `access` (remote flags only, e.g.
    /// `Access::REMOTE_READ`) to exactly `range` (bytes from the start of the
    /// registration) of `region`, which must be registered on this connection's domain.
    ///
    /// A type 2 memory window is bound to this connection's QP over the range: the rkey
    /// works for this peer only (another connection's QP gets a remote access error with
    /// it), an access beyond `access` or outside the range is a remote access error, and
    /// the bind is posted here, ahead of any message carrying the rkey.
    ///
    /// Provider caveat: rxe (Soft-RoCE) checks an access through a window against the
    /// range of the region underneath, not the window's (observed on Linux 6.1, see
    /// `tests/verbs/shared_grants.rs`); loopback checks the window's own range. Where the
    /// exact range matters on rxe, grant whole regions (register one shared region per
    /// thing to expose, as the read service does).
    ///
    /// The window is deallocated (the rkey revoked) by [`revoke`](Self::revoke) or when
    /// the connection closes. Grants are owned by the connection rather than handed to
    /// the session as values because windows hold a reference on the QP and must go
    /// before it, while the session outlives the QP.
    pub fn grant(
        &mut self,
        region: &T::Shared,
        range: Range<usize>,
        access: Access,
    ) -> Result<Grant, SessionError> {
        if !region.is_on(&self.core.pd) {
            return Err(SessionError::new(
                "the shared region is registered on another protection domain",
            ));
        }
        if self.core.send_outstanding >= self.core.send_depth {
            return Err(SessionError::new(
                "send queue full; cannot bind a window now",
            ));
        }
        let err = |e: T::Error| SessionError::new(e.to_string());
        let window = self.core.pd.alloc_window().map_err(err)?;
        // The region stays alive with the grant, not with a buffer of the session, so
        // this bind is posted here rather than queued for the driver (see `post.rs`):
        // what was decided before it goes first.
        ring(self.core).map_err(|e| SessionError::new(e.to_string()))?;
        let wr_id = self.core.inflight.vacant_key();
        let remote = self
            .core
            .qp()
            .bind_shared_window(wr_id as u64, &window, region, range, access)
            .map_err(err)?;
        self.core.inflight.insert(Wr::Bind);
        // At most the send queue's depth (a u32).
        self.core.send_outstanding = self.core.send_outstanding.saturating_add(1);
        let id = GrantId(self.core.grants.insert(GrantEntry {
            _window: window,
            _region: region.clone(),
            remote,
        }));
        Ok(Grant { id, remote })
    }

    /// Revokes a grant at once (the window is deallocated; the peer's next access with
    /// its rkey is a remote access error). Unknown ids are ignored.
    pub fn revoke(&mut self, id: GrantId) {
        if let Some(entry) = self.core.grants.try_remove(id.0) {
            tracing::trace!(rkey = entry.remote.rkey, "grant revoked");
        }
    }

    /// What the peer needs for a live grant.
    pub fn granted(&self, id: GrantId) -> Option<RemoteRegion> {
        self.core.grants.get(id.0).map(|g| g.remote)
    }
}
