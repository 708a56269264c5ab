//! Time in the core: one deadline out, one call in, as in quinn-proto.
//!
//! The core reads no clock and arms no timer. Each turn the driver tells it the time
//! ([`Core::set_now`]), asks for the earliest instant anything is due
//! ([`Core::poll_timeout`]) and keeps one timer armed for it; when that fires it calls
//! [`Core::handle_timeout`], which runs whichever checks are due. A check called early
//! does nothing, so a timer that fires late, early or twice is harmless.
//!
//! What is timed, while the connection is open:
//! - keepalive probes and the idle limit (`liveness.rs`);
//! - rendezvous offers the peer has not released (`rendezvous.rs`);
//! - messages waiting for the pool (`pool_wait.rs`).
//!
//! While it closes, only the close's own wait: for the `Close` frame to reach the peer
//! ([`GOODBYE_TIMEOUT`]), then for the flushed completions to come back
//! ([`DRAIN_TIMEOUT`]).

use std::time::Instant;

use std::time::Duration;

use super::liveness::Verdict;
use super::{Core, Wr, DRAIN_TIMEOUT, GOODBYE_TIMEOUT};
use crate::runtime::close::CloseReason;
use crate::transport::Transport;
use crate::verbs::{RemoteRegion, SendOp};

/// What a timeout asks of the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::runtime) enum Timeout {
    /// Checks ran (or nothing was due): deliver what is ready and pump.
    Checked,
    /// The close's wait ran out: tear down now (after the goodbye) or release now
    /// (after the drain), whatever did not arrive.
    CloseOverdue,
}

impl<T: Transport> Core<T> {
    /// The time of the turn about to be handled.
    pub(in crate::runtime) fn set_now(&mut self, now: Instant) {
        self.now = now;
    }

    /// The earliest instant [`handle_timeout`](Self::handle_timeout) has something to
    /// do; `None` when nothing is timed.
    pub(in crate::runtime) fn poll_timeout(&self) -> Option<Instant> {
        // Closing, or draining the flush after the peer hung up (not yet closing then):
        // only the drain's bound is timed.
        if self.closing.is_some() || self.close_deadline.is_some() {
            return self.close_deadline;
        }
        let liveness = if self.established {
            self.liveness_deadline()
        } else {
            None
        };
        [liveness, self.offers_deadline(), self.pool_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Runs the checks due at `now`. An error is the reason the connection must close.
    pub(in crate::runtime) fn handle_timeout(
        &mut self,
        now: Instant,
    ) -> Result<Timeout, CloseReason> {
        self.now = now;
        // The timer fires at least once per keepalive period: counts reach the shared
        // counters that late at most (see `metrics::ConnectionMetrics`).
        self.metrics.iter_mut().for_each(|m| m.flush());
        if self.closing.is_some() || self.close_deadline.is_some() {
            return Ok(match self.close_deadline {
                Some(at) if at <= now => {
                    self.close_deadline = None;
                    Timeout::CloseOverdue
                }
                _ => Timeout::Checked,
            });
        }
        self.check_liveness(now)?;
        self.expire_offers(now)?;
        self.expire_pool_waits(now);
        Ok(Timeout::Checked)
    }

    /// The closing connection waits for its `Close` frame (or a raw connection's last
    /// SENDs) to reach the peer, but not past [`GOODBYE_TIMEOUT`] from now.
    pub(in crate::runtime) fn wait_for_goodbye(&mut self) {
        self.close_deadline = Some(self.now + GOODBYE_TIMEOUT);
    }

    /// The torn-down connection waits for its flushed completions, but not past
    /// [`DRAIN_TIMEOUT`] from now.
    pub(in crate::runtime) fn wait_for_drain(&mut self) {
        self.close_deadline = Some(self.now + DRAIN_TIMEOUT);
    }
}

/// The idle limit is checked four times per limit (at least every 100 ms), so a
/// connection closes within a quarter of the limit after it is reached.
fn idle_check_period(idle: Duration) -> Duration {
    (idle / 4).max(Duration::from_millis(100))
}

/// The connection's side of keepalive and the idle limit: deadlines folded into
/// [`Core::poll_timeout`], checked by [`Core::handle_timeout`].
impl<T: Transport> Core<T> {
    /// The connection is established at `now`: silence and idleness count from here.
    pub(super) fn establish(&mut self, now: Instant) {
        self.established = true;
        self.last_message = now;
        self.keepalive_at = self.liveness.period().map(|p| now + p);
        self.idle_at = self.idle_timeout.map(|idle| now + idle_check_period(idle));
    }

    /// When keepalive or the idle limit next needs a look (see [`Core::poll_timeout`]).
    pub(super) fn liveness_deadline(&self) -> Option<Instant> {
        match (self.keepalive_at, self.idle_at) {
            (Some(k), Some(i)) => Some(k.min(i)),
            (k, i) => k.or(i),
        }
    }

    /// The keepalive check (a probe, or the verdict that the peer is unreachable) and the
    /// idle check, whichever are due at `now`.
    pub(super) fn check_liveness(&mut self, now: Instant) -> Result<(), CloseReason> {
        if !self.established || self.closing.is_some() {
            return Ok(());
        }
        if let (Some(at), Some(period)) = (self.keepalive_at, self.liveness.period()) {
            if at <= now {
                self.keepalive_at = Some(now + period);
                self.keepalive_check()?;
            }
        }
        if let (Some(at), Some(idle)) = (self.idle_at, self.idle_timeout) {
            if at <= now {
                if now.duration_since(self.last_message) >= idle {
                    return Err(CloseReason::IdleTimeout(idle));
                }
                self.idle_at = Some(now + idle_check_period(idle));
            }
        }
        Ok(())
    }

    /// The keepalive check, once per period: probes the peer if the connection has been
    /// silent since the last check.
    fn keepalive_check(&mut self) -> Result<(), CloseReason> {
        match self.liveness.check() {
            Verdict::Fine => return Ok(()),
            Verdict::Probe => {}
            Verdict::Unreachable => {
                return Err(CloseReason::PeerUnreachable(format!(
                    "a keepalive probe went unanswered for {:?} and nothing else was heard",
                    self.liveness.unanswered_for()
                )))
            }
        }
        if self.send_outstanding >= self.send_depth {
            // A full send queue with nothing completing: its own requests will fail if
            // the peer is gone.
            return Ok(());
        }
        let nothing = RemoteRegion {
            addr: 0,
            len: 0,
            rkey: 0,
        };
        let wr_id = self.inflight.insert(Wr::Probe {
            after: self.send_seq,
        });
        self.liveness.probe_posted();
        self.queue_send(wr_id, SendOp::Write(nothing), None);
        tracing::debug!(
            qp = self.qp_num(),
            "silent connection: keepalive probe queued"
        );
        Ok(())
    }
}
