//! How poller threads wait for completions (the modes; the loop that honours them is
//! `task.rs`, the adaptive policy `spin.rs`).

use std::time::Duration;

/// How poller threads wait for completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// Spin on the CQs (and the actors' mailboxes) forever.
    Busy,
    /// Spin for `spin` after the last completion, then sleep on a completion channel.
    Event {
        /// How long to keep spinning after activity before sleeping. Zero sleeps as soon
        /// as a pass finds the CQs empty: a thread that sleeps is woken ahead of busy
        /// ones by the kernel's scheduler, where a spinning one that loses its CPU waits
        /// out a time slice (see the README's fairness rows).
        spin: Duration,
    },
    /// Event mode whose spin window adapts, up to `max_spin`: it grows while wake-ups
    /// come soon enough that a spin would have caught them, shrinks when spins are
    /// wasted, and is none while the host has no core to spare (the idle time of the
    /// CPUs the process may run on, and how long the poller waits for one). See
    /// `poller/spin.rs` and docs/operations.md, "Polling".
    Adaptive {
        /// The longest spin window.
        max_spin: Duration,
    },
}

impl PollMode {
    /// Event mode with a fixed 1 ms spin window: a connection in a request/response
    /// exchange keeps its poller awake between messages, an idle server sleeps.
    pub const EVENT: PollMode = PollMode::Event {
        spin: Duration::from_millis(1),
    };
    /// Adaptive, spinning 1 ms at most (not yet the default: see docs/operations.md,
    /// "Polling").
    pub const ADAPTIVE: PollMode = PollMode::Adaptive {
        max_spin: Duration::from_millis(1),
    };
}
