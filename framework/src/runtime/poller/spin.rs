//! How long an adaptive poller ([`PollMode::Adaptive`](super::PollMode::Adaptive)) spins
//! after its last completion before it sleeps on the completion channel. A plain policy:
//! the poller tells it what it saw, and asks for the window.
//!
//! Two questions, answered apart, as the kernel answers them for KVM's halt polling and
//! for NAPI's busy polling:
//! - **Does spinning pay?** Each time the poller sleeps and something wakes it, it knows
//!   how long it was idle, its spin included. Idle for no longer than the longest window
//!   allowed: a longer spin would have caught that work without a sleep and a wake-up,
//!   so the window doubles (from [`GROW_FROM`]). Idle for longer: the spin was wasted,
//!   so the window halves, and below `GROW_FROM` it is none. Work found while spinning
//!   teaches nothing: the window stays. So a request/response exchange keeps its poller
//!   spinning between messages, and traffic sparser than the longest window stops
//!   costing a spin per message.
//! - **Can the host spare a core?** A spinning poller holds a CPU. On a small, busy
//!   machine, the threads it would serve then wait for that CPU, and a spinning poller
//!   that loses its CPU waits out a time slice at each hop: issue 48 measured 13 to 65
//!   times fewer key-value operations on a busy two-core host with a 1 ms spin than
//!   with none. From [`HostSample`](super::host::HostSample)s: a poller allowed to spin
//!   that waited for a CPU more than [`WAITED_ABOVE`] of the time is fighting something
//!   busy for it (threads that wake, work briefly and sleep, as the ones it serves
//!   usually do, preempt it without such waits); and the process's pollers are
//!   *squeezed* when their own time and the idle time of the CPUs the process may run
//!   on come to more than [`SQUEEZED`] of a core less than one each. Either makes the
//!   host *crowded*, and the window none. A crowded poller tries spinning again after
//!   a hold, one sample at first, doubling (up to [`HOLD_MAX`] samples, 8 s) each time
//!   a try ends within [`SHORT_TRY`] samples, and only while its pollers are not
//!   squeezed: a busy host costs at most a quarter second of spinning every 8 s.

use std::time::Duration;

use super::host::HostSample;

/// The shortest window the policy grows to from none, and below which it shrinks to
/// none: about one round trip over a loopback or a fast NIC.
pub(crate) const GROW_FROM: Duration = Duration::from_micros(16);
/// The share of the time waiting for a CPU above which a spinning poller is crowded.
pub(crate) const WAITED_ABOVE: f64 = 0.2;
/// How far short of a core each the pollers' cores (their own time and the idle time)
/// may fall before they are squeezed.
pub(crate) const SQUEEZED: f64 = 0.5;
/// A try at spinning that ends within this many samples was too soon.
pub(crate) const SHORT_TRY: u32 = 4;
/// The longest hold between tries, in samples.
pub(crate) const HOLD_MAX: u32 = 32;

/// The spin window of one adaptive poller.
#[derive(Debug, Clone)]
pub(crate) struct SpinPolicy {
    max: Duration,
    window: Duration,
    crowded: bool,
    /// Samples still to wait, crowded, before the next try.
    hold: u32,
    /// The hold after the next short try.
    backoff: u32,
    /// Samples since the last try began.
    tried_for: u32,
}

impl SpinPolicy {
    /// A policy that spins at most `max`. It starts with the longest window, but as if
    /// the host were crowded: no spin until a sample shows room (the first comes two
    /// sampling periods in), so that a busy machine never pays for the optimism, and an
    /// idle one pays half a second of wake-ups.
    pub(crate) fn new(max: Duration) -> SpinPolicy {
        SpinPolicy {
            max,
            window: max,
            crowded: true,
            hold: 0,
            backoff: 1,
            tried_for: 0,
        }
    }

    /// How long to spin after the last completion before sleeping now.
    pub(crate) fn window(&self) -> Duration {
        if self.crowded {
            Duration::ZERO
        } else {
            self.window
        }
    }

    /// Whether the host was crowded at the last sample.
    pub(crate) fn crowded(&self) -> bool {
        self.crowded
    }

    /// The poller slept, and was woken `idle` after its last work (its spin included).
    pub(crate) fn woke(&mut self, idle: Duration) {
        if idle <= self.max {
            if idle > self.window {
                self.window = (self.window * 2).max(GROW_FROM).min(self.max);
            }
        } else {
            let half = self.window / 2;
            self.window = if half < GROW_FROM {
                Duration::ZERO
            } else {
                half
            };
        }
    }

    /// What the host could spare over the last sampling period. Returns true when the
    /// verdict changed (for a log line).
    pub(crate) fn host(&mut self, sample: HostSample) -> bool {
        if self.crowded {
            if self.hold > 0 {
                self.hold -= 1;
                return false;
            }
            if squeezed(&sample) {
                return false;
            }
            self.crowded = false;
            self.tried_for = 0;
            return true;
        }
        self.tried_for = self.tried_for.saturating_add(1);
        if sample.waited <= WAITED_ABOVE && !squeezed(&sample) {
            if self.tried_for > SHORT_TRY {
                self.backoff = 1;
            }
            return false;
        }
        self.crowded = true;
        self.hold = self.backoff;
        if self.tried_for <= SHORT_TRY {
            self.backoff = (self.backoff * 2).min(HOLD_MAX);
        }
        true
    }
}

/// Whether the pollers have, in their own time and the idle time, clearly less than a
/// core each: someone else wants the CPUs they would spin on.
fn squeezed(sample: &HostSample) -> bool {
    sample.cores_for_pollers() < sample.pollers as f64 - SQUEEZED
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: Duration = Duration::from_millis(1);

    /// One poller, with `cores` idle beside its own 0.2.
    fn idle(cores: f64) -> HostSample {
        HostSample {
            idle_cores: cores,
            pollers_cores: 0.2,
            pollers: 1,
            waited: 0.0,
        }
    }

    /// One poller that spun and waited `share` of the time for its CPU.
    fn waited(share: f64) -> HostSample {
        HostSample {
            idle_cores: 0.0,
            pollers_cores: 1.0 - share,
            pollers: 1,
            waited: share,
        }
    }

    #[test]
    fn work_sparser_than_the_longest_window_stops_the_spin_and_denser_work_brings_it_back() {
        let mut p = SpinPolicy::new(MAX);
        assert_eq!(
            p.window(),
            Duration::ZERO,
            "no spin before the host is sampled"
        );
        assert!(p.host(idle(1.5)));
        assert_eq!(
            p.window(),
            MAX,
            "then the longest, until it learns otherwise"
        );
        // A message every 10 ms: each spin is wasted, and the window halves to none.
        let mut steps = 0;
        while p.window() > Duration::ZERO {
            p.woke(Duration::from_millis(10));
            steps += 1;
        }
        assert_eq!(steps, 6, "1 ms halves to 31 us, then to below 16 us: none");
        // Then a request every 50 us: a spin would have caught each; it doubles up to the
        // first window that does, and stays there (work found while spinning teaches
        // nothing, so it is not fed here).
        for _ in 0..3 {
            p.woke(Duration::from_micros(50));
        }
        assert_eq!(p.window(), Duration::from_micros(64));
        p.woke(Duration::from_micros(50));
        assert_eq!(
            p.window(),
            Duration::from_micros(64),
            "50 us is within 64 us"
        );
        // Never past the longest allowed.
        for _ in 0..20 {
            p.woke(MAX);
        }
        assert_eq!(p.window(), MAX);
    }

    #[test]
    fn a_poller_that_waits_for_its_cpu_stops_spinning_and_tries_again_when_there_is_room() {
        let mut p = SpinPolicy::new(MAX);
        // Sleeping, it sees less than half a core for it: it does not try.
        assert!(!p.host(idle(0.2)));
        assert_eq!(p.window(), Duration::ZERO);
        assert!(
            p.host(idle(0.6)),
            "0.6 idle and its own 0.2: near enough a core"
        );
        assert_eq!(p.window(), MAX);
        // Preempted now and then by threads that wake and sleep: it hardly waits.
        for _ in 0..10 {
            assert!(!p.host(waited(0.02)));
        }
        // A hog arrives on its core: it waits out the hog's time slices.
        assert!(p.host(waited(0.5)));
        assert!(p.crowded());
        assert_eq!(p.window(), Duration::ZERO);
        // What it learnt about the traffic meanwhile is kept for when it spins again.
        p.woke(Duration::from_millis(5));
        // The hog leaves: after a hold of one sample, room brings the spin back.
        assert!(!p.host(idle(1.5)), "held one sample");
        assert!(p.host(idle(1.5)));
        assert_eq!(p.window(), MAX / 2);
    }

    #[test]
    fn tries_that_fail_at_once_are_made_less_and_less_often() {
        let mut p = SpinPolicy::new(MAX);
        // A host that looks roomy while the poller sleeps and makes it wait when it spins.
        let mut holds = Vec::new();
        for _ in 0..7 {
            assert!(p.host(idle(1.5)), "a try");
            assert!(p.host(waited(0.45)), "crowded at once");
            let mut held = 0;
            while !p.host(idle(1.5)) {
                held += 1;
            }
            holds.push(held);
            assert!(!p.crowded());
            // Undo the try made by the loop's last call, for the next round's first.
            p.crowded = true;
        }
        assert_eq!(holds, [1, 2, 4, 8, 16, 32, 32]);
        // A try that lasts resets the hold.
        assert!(p.host(idle(1.5)));
        for _ in 0..=SHORT_TRY {
            assert!(!p.host(waited(0.03)));
        }
        assert!(p.host(waited(0.45)));
        assert_eq!(p.hold, 1);
    }

    #[test]
    fn pollers_that_between_them_have_a_core_each_spin_and_a_hog_beside_them_stops_them() {
        let mut p = SpinPolicy::new(MAX);
        // Two pollers in a ping-pong on two CPUs, sleeping, with the client's thread:
        // 0.8 idle, 0.85 theirs. Waits for a CPU after each wake-up do not count while
        // it sleeps.
        let two = |idle_cores, pollers_cores, waited| HostSample {
            idle_cores,
            pollers_cores,
            pollers: 2,
            waited,
        };
        assert!(p.host(two(0.8, 0.85, 0.15)));
        assert!(
            !p.host(two(0.0, 1.7, 0.05)),
            "both spinning, the client preempting them briefly"
        );
        // A hog takes one CPU: the pollers have one core between them.
        assert!(p.host(two(0.0, 1.0, 0.1)));
        assert!(p.crowded());
        // Sleeping beside the hog: 0.3 idle and 0.5 theirs is not near a core each.
        assert!(!p.host(two(0.3, 0.5, 0.3)));
        assert!(!p.host(two(0.3, 0.5, 0.3)));
        assert!(p.crowded());
    }
}
