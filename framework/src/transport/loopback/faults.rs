//! Fault hooks: what a test does to the loopback fabric to see how rdmactor copes.
//!
//! | hook | what the rest of the fabric sees |
//! |---|---|
//! | [`Device::vanish`] | a host that died: its QPs answer nothing and say nothing; peers' requests fail with `RetryExceeded` after their ACK timeout × (retry count + 1), connects to it are UNREACHABLE after the CM timeout |
//! | [`Device::remove`] | a removed NIC: DEVICE_REMOVAL on every cm_id of the device, its QPs in the error state (flushed), nothing new created on it |
//! | [`Device::refuse_registrations`] | `ibv_reg_mr` failing (memory lock limit, pinned memory exhausted) |
//! | [`Qp::stall`] / [`Qp::resume`] | a QP that stops making progress (a hung host or a congested link): its requests wait, requests to it go unanswered and time out if the stall outlasts the peer's retries |
//! | [`Cq::delay_completions`] | a slow NIC or a busy PCIe link: completions become visible to `poll` (and raise the channel) only after the delay, in order |
//! | [`Device::delay_completions`] | the same for every CQ the device makes from then on (the runtime's own): completions lag the CM's events |

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::cq::Cq;
use super::fabric::Device;
use super::qp::Qp;

impl Device {
    /// Drops this host off the fabric without a word: nothing on it answers again,
    /// and no peer is told. Its own posted work stays queued for ever.
    pub fn vanish(&self) {
        self.core.vanished.store(true, Relaxed);
    }

    /// Removes the device: every cm_id on it gets DEVICE_REMOVAL, every QP goes to the
    /// error state (its work flushed), and registrations and new objects are refused.
    pub fn remove(&self) {
        self.core.removed.store(true, Relaxed);
        self.core.lose();
        self.registry.device_removed(&self.core);
    }

    /// While `refuse` holds, registrations fail with `RegistrationRefused`.
    pub fn refuse_registrations(&self, refuse: bool) {
        self.core.refuse_registrations.store(refuse, Relaxed);
    }

    /// Every CQ created on this device from now on shows its completions `delay` late
    /// (see [`Cq::delay_completions`]): a host whose completions lag its CM events, as a
    /// busy one's can, when the runtime makes the CQs itself.
    pub fn delay_completions(&self, delay: Duration) {
        self.core
            .completion_delay_ns
            .store(delay.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }
}

impl Qp {
    /// Stops the QP: its requests wait, and requests reaching it get no answer.
    pub fn stall(&self) {
        self.inner.resp.stalled.store(true, Relaxed);
    }

    /// Lets a stalled QP go on where it stopped.
    pub fn resume(&self) {
        self.inner.resp.stalled.store(false, Relaxed);
        self.inner.restart();
    }
}

impl Cq {
    /// Makes each completion pushed from now on visible only `delay` later (zero: at
    /// once again).
    pub fn delay_completions(&self, delay: Duration) {
        self.inner
            .delay_ns
            .store(delay.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }
}
