//! What a poller thread calls a connection with: its completions, and wake-ups that
//! other threads queued for it (see `wake_route.rs`).

use std::time::Instant;

use crate::verbs::WorkCompletion;

/// Where a poller delivers one connection's completions, on the poller's own thread.
pub(crate) trait Inbox {
    /// A batch of the connection's completions, in CQ order, polled at `now` (read once
    /// per polled batch, shared by every connection in it: a clock read per connection
    /// and per pass was a visible share of the poller's time under load).
    ///
    /// `hold_posts`: more of this connection's completions follow in this drain (the
    /// poller's bulk steps, see `turns.rs`), so it may leave its posts to the last of them
    /// and ring one doorbell for all.
    fn completions(&self, wcs: &[WorkCompletion], now: Instant, hold_posts: bool);

    /// A wake-up from another thread for the connection's session (see `wake_route.rs`).
    fn wake(&self, token: u64);
}
