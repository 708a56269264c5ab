//! The stall deadline of a transfer waiting on a silent peer: apart from carrying out
//! outputs because it is one timer with its own rule (the server's own jobs do not count
//! against the peer), armed after every drain.

use std::time::Duration;

use rdmactor::runtime::{SessionCx, SessionError};
use rdmactor::transport::Transport;

use super::{FileSession, STALL_CHECK};
use crate::file_transfer::endpoint::Endpoint;
use crate::file_transfer::server::Server;
use crate::file_transfer::wire::RejectReason;

impl FileSession {
    /// True while one of this session's own jobs runs (a fetch being hashed, chunks
    /// being appended, a chunk being read, a commit, the quota owner's answer): the
    /// transfer waits on the server then, not on the peer.
    pub(super) fn busy(&self) -> bool {
        self.reading.is_some()
            || self.consume.is_some()
            || self.commit.is_some()
            || self.prepare.is_some()
            || self.deleting.is_some()
            || self.admitting.is_some()
    }

    /// Arms the stall deadline for `after` when a transfer waits on the peer and none
    /// is armed. Called after every drain, so the one timer follows the transfer.
    pub(super) fn arm_stall<T: Transport>(
        &mut self,
        server: &Server,
        cx: &mut SessionCx<'_, T>,
        after: Duration,
    ) {
        if self.stall_armed || self.stall.is_none() {
            return;
        }
        if server.waits_on_peer() {
            self.stall_armed = true;
            cx.wake_after(STALL_CHECK, after);
        }
    }

    /// The stall deadline came: ends the transfer if it has waited on a silent peer
    /// for the whole limit, or arms the deadline again for what is left of it.
    pub(super) fn check_stall<T: Transport>(
        &mut self,
        server: &mut Server,
        cx: &mut SessionCx<'_, T>,
    ) -> std::result::Result<(), SessionError> {
        self.stall_armed = false;
        let Some(limit) = self.stall else {
            return Ok(());
        };
        if !server.waits_on_peer() {
            return Ok(());
        }
        // While the server's own job runs the peer owes nothing: a whole limit again.
        let busy = self.busy();
        let silent = self.heard.elapsed();
        if busy || silent < limit {
            self.arm_stall(server, cx, if busy { limit } else { limit - silent });
            return Ok(());
        }
        let reason = RejectReason::Stalled {
            secs: limit.as_secs(),
        };
        let state = server.state_name();
        tracing::warn!(peer = %self.peer, state, %reason,
            "ending a transfer whose peer went silent; its window, staging and share are freed");
        server.give_up(reason);
        Ok(())
    }
}
