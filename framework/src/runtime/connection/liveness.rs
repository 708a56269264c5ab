//! Noticing a peer that died without a word.
//!
//! A host that crashes, or whose cable is cut, sends no DISCONNECT, and RC tells this side
//! only when one of its own requests goes unacknowledged. A connection on which both
//! sides wait (a server waiting for the next chunk of an upload, a client between
//! requests) has no request in flight, so without help it would stay open, holding its QP,
//! buffers and slot, for as long as the process runs.
//!
//! So a connection that has been silent (no completion of any kind) for a whole
//! `ConnectionConfig::keepalive` period sends a probe: a zero-length RDMA WRITE. A zero-length
//! WRITE carries no address to check (IBTA C9-88), touches no memory and consumes no
//! receive, so any RC peer, an rdmactor one or rping or a plain verbs program, ACKs it in
//! its transport without its application seeing anything. A dead peer ACKs nothing: the
//! probe fails with `RetryExceeded` after the retry span and the connection closes with
//! [`CloseReason::PeerUnreachable`](crate::runtime::CloseReason::PeerUnreachable).
//!
//! Silence is checked once per period, so a peer is probed between one and two periods
//! after it was last heard from; a busy connection never is.
//!
//! The transport's verdict is not always enough: Soft-RoCE was seen keeping a probe to a
//! killed host in flight for 30 s and more, neither ACKed nor failed. So a probe still
//! outstanding, with nothing heard, once the retry span and one more period have passed
//! is itself the verdict: the connection closes as unreachable.

use std::time::Duration;

/// What the periodic check asks the connection to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Heard from recently, or a probe is out and still has time.
    Fine,
    /// Silent for a whole period: post a probe.
    Probe,
    /// The probe has been out, unanswered, past the retry span and a period: give up.
    Unreachable,
}

/// The keepalive bookkeeping of one connection (no I/O: the connection posts the probe).
#[derive(Debug)]
pub(crate) struct Liveness {
    period: Option<Duration>,
    /// Checks a probe may stay outstanding before the peer is declared unreachable.
    patience: u32,
    /// Checks since the probe was posted, with nothing heard.
    probe_checks: u32,
    /// Completion batches seen since the connection started.
    heard: u64,
    /// `heard` at the previous check.
    heard_at_check: u64,
    /// A probe is in flight.
    probing: bool,
}

impl Liveness {
    /// `plan`: the check period and how many checks a probe may stay unanswered, from
    /// [`ConnectionConfig::keepalive_patience`](crate::runtime::ConnectionConfig) (the
    /// one place the dead-peer bound is derived); `None`: keepalive off.
    pub(crate) fn new(plan: Option<(Duration, u32)>) -> Liveness {
        let (period, patience) = plan.unzip();
        let patience = patience.unwrap_or(0);
        Liveness {
            period,
            patience,
            probe_checks: 0,
            heard: 0,
            heard_at_check: 0,
            probing: false,
        }
    }

    /// How often silence is checked (`None`: keepalive is off).
    pub(crate) fn period(&self) -> Option<Duration> {
        self.period
    }

    /// Something completed on the connection: the peer (or at least the local side of
    /// the transport) is alive.
    pub(crate) fn heard(&mut self) {
        self.heard = self.heard.wrapping_add(1);
    }

    /// The periodic check.
    pub(crate) fn check(&mut self) -> Verdict {
        let silent = self.heard == self.heard_at_check;
        self.heard_at_check = self.heard;
        if !silent {
            self.probe_checks = 0;
            return Verdict::Fine;
        }
        if !self.probing {
            return Verdict::Probe;
        }
        self.probe_checks += 1;
        if self.probe_checks >= self.patience {
            Verdict::Unreachable
        } else {
            Verdict::Fine
        }
    }

    /// How long the probe has gone unanswered, as of the last check.
    pub(crate) fn unanswered_for(&self) -> Duration {
        self.period.unwrap_or_default() * self.probe_checks
    }

    pub(crate) fn probe_posted(&mut self) {
        self.probing = true;
        self.probe_checks = 0;
    }

    pub(crate) fn probe_completed(&mut self) {
        self.probing = false;
    }

    /// A probe is in flight.
    #[cfg(test)]
    pub(crate) fn probing(&self) -> bool {
        self.probing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD: Duration = Duration::from_secs(5);
    /// The defaults: 7.5 s of retries fit in two periods, plus one.
    const PLAN: Option<(Duration, u32)> = Some((PERIOD, 3));

    #[test]
    fn only_a_connection_silent_for_a_whole_period_is_probed() {
        let mut l = Liveness::new(PLAN);
        // Silent since the start: probe at the first check.
        assert_eq!(l.check(), Verdict::Probe);
        l.probe_posted();
        // The probe is out: no second one while it has time.
        assert_eq!(l.check(), Verdict::Fine);
        l.heard();
        l.probe_completed();
        // Heard during the last period: no probe.
        assert_eq!(l.check(), Verdict::Fine);
        // Silent again for a whole period: probe.
        assert_eq!(l.check(), Verdict::Probe);
        l.probe_posted();
        l.probe_completed();
        l.heard();
        l.heard();
        assert_eq!(l.check(), Verdict::Fine);
    }

    #[test]
    fn a_probe_unanswered_past_the_retry_span_and_a_period_means_unreachable() {
        let mut l = Liveness::new(PLAN);
        assert_eq!(l.check(), Verdict::Probe);
        l.probe_posted();
        // 7.5 s of retries fit in two periods; the third check without an answer gives up.
        assert_eq!(l.check(), Verdict::Fine);
        assert_eq!(l.check(), Verdict::Fine);
        assert_eq!(l.check(), Verdict::Unreachable);
        assert_eq!(l.unanswered_for(), 3 * PERIOD);
        // Anything heard in between starts the count again.
        let mut l = Liveness::new(PLAN);
        assert_eq!(l.check(), Verdict::Probe);
        l.probe_posted();
        assert_eq!(l.check(), Verdict::Fine);
        l.heard();
        assert_eq!(l.check(), Verdict::Fine);
        assert_eq!(l.check(), Verdict::Fine);
        assert_eq!(l.check(), Verdict::Fine);
        assert_eq!(l.check(), Verdict::Unreachable);
    }

    #[test]
    fn keepalive_off_has_no_period() {
        assert_eq!(Liveness::new(None).period(), None);
    }
}
