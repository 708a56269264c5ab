//! What every object of a fabric or a device shares: the configuration, the clock, the
//! key table, and the fault flags that the hooks in `faults.rs` set.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::clock::Clock;
use super::keys::KeyTable;

/// The fabric's timing. Real NICs take these from the QP attributes (ACK timeout, RNR
/// timer); loopback starts every QP with these values, and the calls that set the
/// attributes (`CmId::set_ack_timeout`, `Qp::set_min_rnr_timer`) change them per QP as
/// on a NIC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// How long a requester waits for an answer before it retransmits; after the QP's
    /// retry count of retransmissions (7 at most) the request fails with
    /// `RetryExceeded`. Short by default, so that tests of vanished peers are quick.
    pub ack_timeout: Duration,
    /// How long a responder without a receive tells the requester to wait before the
    /// next RNR retry (the IB default that rdmactor sets, code 12, is 0.64 ms).
    pub rnr_timer: Duration,
    /// How long a connect to an address whose device does not answer waits before
    /// UNREACHABLE.
    pub cm_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            ack_timeout: Duration::from_millis(2),
            rnr_timer: Duration::from_micros(640),
            cm_timeout: Duration::from_millis(100),
        }
    }
}

/// The RNR NAK timer of IB code `code` (the `min_rnr_timer` attribute), in
/// hundredths of a millisecond: the table of the InfiniBand specification.
const RNR_TIMER_10US: [u32; 32] = [
    65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
];

/// The duration of RNR timer code `code` (codes above 31 are taken as 31).
pub(super) fn rnr_timer(code: u8) -> Duration {
    Duration::from_micros(u64::from(RNR_TIMER_10US[usize::from(code.min(31))]) * 10)
}

/// The ACK timeout of IB exponent `exponent`: 4.096 us × 2^exponent (0: none; taken as
/// the fabric's default).
pub(super) fn ack_timeout(exponent: u8) -> Option<Duration> {
    (exponent != 0).then(|| Duration::from_nanos(4096u64 << exponent.min(31)))
}

/// What a fabric's objects share.
pub(super) struct FabricCore {
    pub(super) config: Config,
    pub(super) clock: Clock,
    next_qp_num: AtomicU32,
}

impl FabricCore {
    pub(super) fn new(config: Config) -> FabricCore {
        FabricCore {
            config,
            clock: Clock::default(),
            next_qp_num: AtomicU32::new(0x100),
        }
    }

    /// A QP number unique in the fabric (pollers route by it).
    pub(super) fn qp_num(&self) -> u32 {
        self.next_qp_num.fetch_add(1, Relaxed)
    }
}

/// An object that must hear of its device's removal (QPs: they go to the error state).
pub(super) trait Member: Send + Sync {
    /// The device was removed.
    fn device_lost(&self);
}

/// What a device's objects share.
pub(super) struct DeviceCore {
    pub(super) fabric: Arc<FabricCore>,
    pub(super) name: String,
    pub(super) keys: KeyTable,
    next_addr: AtomicU64,
    /// The peer process is gone (fault hook): nothing on it answers, nothing is said.
    pub(super) vanished: AtomicBool,
    /// The device was removed (fault hook).
    pub(super) removed: AtomicBool,
    /// Registrations fail (fault hook).
    pub(super) refuse_registrations: AtomicBool,
    /// Nanoseconds before a completion of a CQ created from now on becomes visible
    /// (fault hook).
    pub(super) completion_delay_ns: AtomicU64,
    members: Mutex<Vec<Weak<dyn Member>>>,
}

impl DeviceCore {
    pub(super) fn new(fabric: Arc<FabricCore>, name: String) -> DeviceCore {
        DeviceCore {
            fabric,
            name,
            keys: KeyTable::default(),
            next_addr: AtomicU64::new(0x10_0000),
            vanished: AtomicBool::new(false),
            removed: AtomicBool::new(false),
            refuse_registrations: AtomicBool::new(false),
            completion_delay_ns: AtomicU64::new(0),
            members: Mutex::new(Vec::new()),
        }
    }

    /// True while the device answers requests (not vanished, not removed).
    pub(super) fn answers(&self) -> bool {
        !self.vanished.load(Relaxed) && !self.removed.load(Relaxed)
    }

    /// The address of a new registration of `len` bytes: page-aligned, with an unmapped
    /// page after it, so that an address one past a region belongs to no other region.
    pub(super) fn next_addr(&self, len: usize) -> u64 {
        let span = (len as u64).div_ceil(4096) * 4096 + 4096;
        self.next_addr.fetch_add(span, Relaxed)
    }

    /// Remembers `member` for [`DeviceCore::lose`].
    pub(super) fn join(&self, member: Weak<dyn Member>) {
        let mut members = self.members.lock().expect("device members");
        members.retain(|m| m.strong_count() > 0);
        members.push(member);
    }

    /// Tells every member that the device is gone.
    pub(super) fn lose(&self) {
        let members = std::mem::take(&mut *self.members.lock().expect("device members"));
        for m in members.iter().filter_map(Weak::upgrade) {
            m.device_lost();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timer_codes_follow_the_specification() {
        assert_eq!(rnr_timer(12), Duration::from_micros(640));
        assert_eq!(rnr_timer(0), Duration::from_micros(655_360));
        assert_eq!(ack_timeout(14), Some(Duration::from_nanos(4096 << 14)));
        assert_eq!(ack_timeout(0), None);
    }
}
