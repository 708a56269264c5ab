//! The polling loop of one poller thread: drain the CQs, hand completions to their
//! connections, let the arbiter's other tasks run, and, in event and adaptive modes,
//! sleep on the completion channel once the spin window has passed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::host::HostSampler;
use super::inboxes::{end_pass, inbox, return_orphans};
use super::mode::PollMode;
use super::spin::SpinPolicy;
use crate::runtime::turns::{
    Backlog, LetOthersRun, DRAIN_ROUNDS, PASSES_PER_TURN, POLLS_PER_ROUND,
};
use crate::runtime::wake_route::WakeQueue;
use crate::transport::{CompletionChannel as _, CompletionQueue as _, Transport};
use crate::verbs::WorkCompletion;

/// A CQ of a poller, and the entries connections have reserved on it.
pub(super) struct CqSlot<T: Transport> {
    pub(super) cq: T::Cq,
    pub(super) reserved: u32,
}

/// What a poller thread shares with the [`Pollers`](super::Pollers) that reserve on it:
/// its CQs (a new generation each time one is added), and the stop flag.
pub(super) struct PollerShared<T: Transport> {
    pub(super) cqs: Mutex<Vec<CqSlot<T>>>,
    pub(super) generation: AtomicU64,
    pub(super) stop: AtomicBool,
}

/// The polling loop of one poller thread. Completions go straight to their connections;
/// every few passes it lets the arbiter run the actors' mailboxes on the same thread.
pub(super) async fn poll_task<T: Transport>(
    shared: Arc<PollerShared<T>>,
    channel: Option<T::Channel>,
    mode: PollMode,
) {
    let fd = match &channel {
        Some(ch) => match ch.waiter() {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::error!(error = %e, "registering the completion channel failed; spinning");
                None
            }
        },
        None => None,
    };
    let mut cqs: Vec<T::Cq> = Vec::new();
    let mut seen = u64::MAX;
    let mut wcs = Vec::with_capacity(crate::verbs::POLL_BATCH);
    let mut last_activity = Instant::now();
    let mut idle_passes = 0u32;
    let mut since_yield = 0u32;
    let mut adaptive = match mode {
        PollMode::Adaptive { max_spin } => Some((SpinPolicy::new(max_spin), HostSampler::new())),
        PollMode::Event { .. } | PollMode::Busy => None,
    };
    let wakes = WakeQueue::install();
    let mut backlog = Backlog::default();
    while !shared.stop.load(Ordering::Acquire) {
        let generation = shared.generation.load(Ordering::Acquire);
        if generation != seen {
            seen = generation;
            cqs = shared
                .cqs
                .lock()
                .expect("poller lock")
                .iter()
                .map(|s| s.cq.clone())
                .collect();
        }
        let mut found = wakes.deliver();
        found += drain::<T>(&cqs, &mut wcs, &mut last_activity, &mut backlog);
        end_pass();
        if found > 0 {
            idle_passes = 0;
        } else {
            idle_passes = idle_passes.wrapping_add(1);
        }
        // The clock is read every 64th idle pass only: a pass is a few microseconds, and
        // reading the clock on each one was a visible share of a spinning poller's time.
        // Without a spin window there is nothing to time: the first empty pass sleeps.
        let spin = match (mode, &mut adaptive) {
            (PollMode::Event { spin }, _) => Some(spin),
            (PollMode::Adaptive { .. }, Some((policy, host))) => {
                if idle_passes % 64 == 63 {
                    sample_host(policy, host);
                }
                Some(policy.window())
            }
            _ => None,
        };
        let sleep = match (spin, &fd, &channel) {
            (Some(spin), Some(fd), Some(ch))
                if (spin.is_zero() && idle_passes > 0)
                    || (idle_passes % 64 == 63 && last_activity.elapsed() > spin) =>
            {
                Some((fd, ch))
            }
            _ => None,
        };
        let Some((fd, ch)) = sleep else {
            since_yield += 1;
            if since_yield >= PASSES_PER_TURN {
                since_yield = 0;
                LetOthersRun::default().await;
            }
            continue;
        };
        // Arm, then poll once more to catch completions that raced the arm, then sleep
        // until the channel fires (or a short timeout, to notice new CQs and stop).
        for cq in &cqs {
            if let Err(e) = cq.req_notify(false) {
                tracing::error!(error = %e, "arming a CQ failed");
            }
        }
        found += drain::<T>(&cqs, &mut wcs, &mut last_activity, &mut backlog);
        if found > 0 || !backlog.is_empty() {
            continue;
        }
        // About to sleep: what this thread counted goes to the shared metrics now.
        crate::metrics::flush_thread();
        // Consumes the channel's events, so that it is not ready again until a CQ fires.
        // A wake-up queued since this pass's delivery has rung the bell (its permit is
        // kept if nobody waited yet), so it is not slept through.
        tokio::select! {
            waited = tokio::time::timeout(Duration::from_millis(50), ch.ready(fd)) => {
                if let Ok(Err(e)) = waited {
                    tracing::warn!(error = %e, "waiting on the completion channel failed");
                }
            }
            () = wakes.rung() => {}
        }
        let woke = Instant::now();
        if let Some((policy, host)) = &mut adaptive {
            policy.woke(woke.saturating_duration_since(last_activity));
            sample_host(policy, host);
        }
        last_activity = woke;
    }
}

/// Gives `policy` what the host could spare, once a sampling period has passed.
fn sample_host(policy: &mut SpinPolicy, host: &mut HostSampler) {
    let Some(sample) = host.sample(Instant::now()) else {
        return;
    };
    let changed = policy.host(sample);
    tracing::trace!(
        crowded = policy.crowded(),
        idle_cores = sample.idle_cores,
        pollers_cores = sample.pollers_cores,
        waited = sample.waited,
        window = ?policy.window(),
        "poller: host sample"
    );
    if changed {
        tracing::debug!(
            crowded = policy.crowded(),
            idle_cores = sample.idle_cores,
            waited = sample.waited,
            "poller: the host's spare cores changed its spin"
        );
    }
}

/// Polls `cqs` empty, routing completions; returns how many there were. Reads the
/// clock once per batch that is not empty, and leaves the time of the last one in
/// `polled_at`: the poller's spin window counts from it. Bulk work goes through
/// `backlog` a step at a time, with every CQ polled again between steps, so that the
/// small messages behind it, on any of this thread's CQs, do not wait for all of it (see
/// `turns.rs`); it returns once all are empty, or after [`DRAIN_ROUNDS`] rounds, so that
/// a flood that never lets the CQs empty cannot keep the thread's other tasks from
/// their turn (the handlers' calls, the service actors living here).
pub(super) fn drain<T: Transport>(
    cqs: &[T::Cq],
    wcs: &mut Vec<WorkCompletion>,
    polled_at: &mut Instant,
    backlog: &mut Backlog,
) -> usize {
    let mut total = 0;
    for _ in 0..DRAIN_ROUNDS {
        let mut polled = 0;
        for cq in cqs {
            polled += poll_cq::<T>(cq, wcs, polled_at, backlog);
        }
        total += polled;
        let now = *polled_at;
        let stepped = backlog.step(|run, more| {
            route(run, now, more && !T::POSTS_MOVE_BYTES);
        });
        if polled == 0 && !stepped {
            break;
        }
    }
    total
}

/// Polls `cq` empty (or [`POLLS_PER_ROUND`] batches of it), routing what goes at once and
/// leaving bulk work in `backlog`.
fn poll_cq<T: Transport>(
    cq: &T::Cq,
    wcs: &mut Vec<WorkCompletion>,
    polled_at: &mut Instant,
    backlog: &mut Backlog,
) -> usize {
    let mut total = 0;
    for _ in 0..POLLS_PER_ROUND {
        wcs.clear();
        match cq.poll(wcs) {
            Ok(0) => return total,
            Ok(n) => {
                total += n;
                crate::metrics::cq_batch(wcs);
                *polled_at = Instant::now();
                let now = *polled_at;
                backlog.admit(wcs, |run| {
                    route(run, now, false);
                });
            }
            Err(e) => {
                tracing::error!(error = %e, "ibv_poll_cq failed");
                return total;
            }
        }
    }
    total
}

/// Hands each run of one connection's completions in this batch to that connection in
/// one call (under light load the whole batch is one run), in CQ order. Returns how many
/// completions had nowhere to go.
///
/// A completion whose QP has no registered connection is counted
/// (`rdmactor_completions_unrouted_total`), logged and dropped. Connections register
/// before their QP can complete anything, so it is one of: a flush that arrived after
/// its connection released everything (the drain timer gave up on it, or the actor
/// is already gone), or a completion of a QP this process never handed to a connection
/// (a framework bug, which is why it is counted). Neither has anyone to tell; nothing
/// else on the CQ is affected.
pub(super) fn route(wcs: &[WorkCompletion], now: Instant, hold_posts: bool) -> usize {
    let mut unrouted = 0;
    let mut rest = wcs;
    while let Some(first) = rest.first() {
        let run = rest
            .iter()
            .position(|wc| wc.qp_num != first.qp_num)
            .unwrap_or(rest.len());
        let (batch, tail) = rest.split_at(run);
        match inbox(first.qp_num) {
            Some(inbox) => inbox.completions(batch, now, hold_posts),
            None => {
                let dropped = return_orphans(batch);
                unrouted += dropped;
                if dropped > 0 {
                    crate::metrics::completions_unrouted(dropped);
                    tracing::debug!(
                        qp = first.qp_num,
                        n = dropped,
                        first_status = ?first.status,
                        "completions for a QP with no connection dropped"
                    );
                }
            }
        }
        rest = tail;
    }
    unrouted
}
