//! CQ-polling threads. Each poller is a dedicated thread that owns a set of CQs shared by
//! many QPs, polls them in batches and routes each completion to the connection that owns
//! its QP (looked up by `qp_num`), one call per run of a connection's completions.
//!
//! Two measured changes from the first design, both for round-trip latency. Each poller
//! thread is also the actix arbiter that runs the connection actors whose QPs use its
//! CQs: handing completions to actors on other threads cost a thread wake-up per hop
//! (about 1.4 ms per echo under Soft-RoCE, against 12 us for `ib_send_lat`). And the
//! hand-off is a direct call, not a mailbox message: each connection registers an
//! [`Inbox`] with the thread it runs on, and the poller calls it with the batch from its
//! own stack (a message cost an allocation, a queue push and a scheduler turn per batch).
//!
//! Busy mode spins (lowest latency, one core per poller). Event mode spins for a short
//! window after the last completion, then arms the CQs and sleeps on the completion
//! channel's fd until one fires. Adaptive mode is event mode whose window follows what
//! the poller sees: the traffic, and the cores the host can spare
//! (`spin.rs`, `host.rs`). A poller grows a new CQ when the existing ones cannot
//! hold another connection's worst case, so a CQ never overflows (an overflow would put
//! every QP on it in the error state).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use actix::prelude::*;

use crate::transport::{CompletionQueue as _, Domain as _, Transport, Verbs};

mod host;
mod inboxes;
mod mode;
mod spin;
mod task;

pub(crate) use self::inboxes::{adopt_orphan, register, return_orphans, unregister};
pub use self::mode::PollMode;
#[cfg(test)]
use self::task::{drain, route};
use self::task::{poll_task, CqSlot, PollerShared};

pub(crate) use crate::runtime::inbox::Inbox;

/// The entries of a CQ the poller creates (rxe allows up to 32767). Providers round a
/// ring up to a power of two slots including one spare: 16,384 entries took 32,768
/// slots, 16,383 take 16,384. rxe's slot is 128 bytes (its `ib_wc` outgrew 64 in
/// Linux 5.14), so such a CQ maps 2 MiB and 4 KiB (`/proc/PID/smaps`, 2026-11-29).
const CQ_ENTRIES: u32 = 16383;

struct Poller<T: Transport> {
    shared: Arc<PollerShared<T>>,
    channel: Option<T::Channel>,
    arbiter: Option<Arbiter>,
}

/// Why CQ capacity could not be reserved.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReserveError {
    /// The pollers created as many CQs as they may.
    #[error("{0} CQs, the most the pollers create (TransportConfig::max_cqs)")]
    Limit(usize),
    /// Creating a CQ failed.
    #[error("creating a CQ: {0}")]
    Create(String),
}

/// The set of poller threads of one device.
pub struct Pollers<T: Transport = Verbs> {
    pd: T::Domain,
    pollers: Vec<Poller<T>>,
    next: AtomicU64,
    /// CQs created (they live as long as the pollers), and the cap on them.
    created: AtomicUsize,
    max_cqs: usize,
}

/// A connection's claim on CQ capacity; returned when dropped. Its actor must run on
/// [`CqReservation::arbiter`], the thread polling that CQ.
pub struct CqReservation<T: Transport = Verbs> {
    shared: Arc<PollerShared<T>>,
    cq: T::Cq,
    entries: u32,
    arbiter: ArbiterHandle,
}

impl<T: Transport> CqReservation<T> {
    /// The CQ to create the QP with.
    pub fn cq(&self) -> &T::Cq {
        &self.cq
    }

    /// The poller thread that polls this CQ (and runs the connection's actor).
    pub fn arbiter(&self) -> ArbiterHandle {
        self.arbiter.clone()
    }
}

impl<T: Transport> CqReservation<T> {
    /// A handle on the same CQ and poller that reserves nothing of its own: for a
    /// connection whose entries a larger reservation already covers (the members of a
    /// shared receive queue, see `recv_groups.rs`).
    pub(crate) fn covered(&self) -> CqReservation<T> {
        CqReservation {
            shared: self.shared.clone(),
            cq: self.cq.clone(),
            entries: 0,
            arbiter: self.arbiter.clone(),
        }
    }
}

impl<T: Transport> Drop for CqReservation<T> {
    fn drop(&mut self) {
        let mut cqs = self.shared.cqs.lock().expect("poller lock");
        if let Some(slot) = cqs.iter_mut().find(|s| s.cq.key() == self.cq.key()) {
            slot.reserved -= self.entries;
        }
    }
}

impl<T: Transport> std::fmt::Debug for CqReservation<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqReservation")
            .field("entries", &self.entries)
            .finish()
    }
}

impl<T: Transport> Pollers<T> {
    /// Starts `count` poller threads for the device of `pd`. Must run inside an actix
    /// System.
    pub(crate) fn start(
        pd: &T::Domain,
        count: usize,
        mode: PollMode,
        max_cqs: usize,
    ) -> Result<Self, T::Error> {
        let mut pollers = Vec::with_capacity(count.max(1));
        for _ in 0..count.max(1) {
            let shared = Arc::new(PollerShared {
                cqs: Mutex::new(Vec::new()),
                generation: AtomicU64::new(0),
                stop: AtomicBool::new(false),
            });
            let channel = match mode {
                PollMode::Event { .. } | PollMode::Adaptive { .. } => Some(pd.create_channel()?),
                PollMode::Busy => None,
            };
            let arbiter = Arbiter::new();
            let task = poll_task::<T>(shared.clone(), channel.clone(), mode);
            arbiter.spawn(abort_if_it_panics("CQ poller", task));
            pollers.push(Poller {
                shared,
                channel,
                arbiter: Some(arbiter),
            });
        }
        Ok(Pollers {
            pd: pd.clone(),
            pollers,
            next: AtomicU64::new(0),
            created: AtomicUsize::new(0),
            max_cqs,
        })
    }

    /// Reserves `entries` CQ slots for one connection on the next poller (round robin),
    /// creating a CQ when none has room.
    pub(crate) fn reserve(&self, entries: u32) -> Result<CqReservation<T>, ReserveError> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) as usize % self.pollers.len();
        let poller = &self.pollers[i];
        let mut cqs = poller.shared.cqs.lock().expect("poller lock");
        let slot = match cqs
            .iter_mut()
            .position(|s| s.cq.capacity() - s.reserved >= entries)
        {
            Some(at) => at,
            None => {
                // Counted apart from the per-poller locks: taking another poller's
                // lock under this one could deadlock with a reservation there.
                let max = self.max_cqs;
                if self
                    .created
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                        (n < max).then_some(n + 1)
                    })
                    .is_err()
                {
                    return Err(ReserveError::Limit(max));
                }
                let cq = self
                    .pd
                    .create_cq(CQ_ENTRIES.max(entries), poller.channel.as_ref())
                    .map_err(|e| {
                        self.created.fetch_sub(1, Ordering::AcqRel);
                        ReserveError::Create(e.to_string())
                    })?;
                cqs.push(CqSlot { cq, reserved: 0 });
                poller.shared.generation.fetch_add(1, Ordering::Release);
                cqs.len() - 1
            }
        };
        cqs[slot].reserved += entries;
        Ok(CqReservation {
            shared: poller.shared.clone(),
            cq: cqs[slot].cq.clone(),
            entries,
            arbiter: poller.arbiter.as_ref().expect("running").handle(),
        })
    }

    /// The first poller's thread (for running client code next to its connections).
    pub(crate) fn first_arbiter(&self) -> ArbiterHandle {
        self.pollers[0].arbiter.as_ref().expect("running").handle()
    }

    /// Number of CQs the pollers own (for metrics).
    pub fn cq_count(&self) -> usize {
        self.pollers
            .iter()
            .map(|p| p.shared.cqs.lock().expect("poller lock").len())
            .sum()
    }
}

impl<T: Transport> Drop for Pollers<T> {
    fn drop(&mut self) {
        for p in &self.pollers {
            p.shared.stop.store(true, Ordering::Release);
            if let Some(a) = &p.arbiter {
                a.stop();
            }
        }
        for p in &mut self.pollers {
            if let Some(a) = p.arbiter.take() {
                let _ = a.join();
            }
        }
    }
}

/// Aborts the process if dropped while its thread unwinds from a panic.
///
/// A poller thread runs its polling loop and its connections' actors as tasks of one
/// actix arbiter, and a task that panics is dropped silently (tokio catches the panic):
/// the thread would live on with nobody polling its CQs, and the process would keep
/// accepting connections it never serves. Panics inside sessions are caught where the
/// framework calls them and close that connection only; a panic that still gets here is
/// the framework's own, and the state it leaves (connections half torn down, CQ slots
/// reserved forever) cannot be trusted. So: say so loudly and end the process, for a
/// supervisor to restart, rather than stay half alive.
pub(crate) struct AbortOnUnwind {
    what: &'static str,
}

impl AbortOnUnwind {
    /// A guard naming what it protects, for the message.
    pub(crate) fn new(what: &'static str) -> AbortOnUnwind {
        AbortOnUnwind { what }
    }
}

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let thread = std::thread::current();
            let name = thread.name().unwrap_or("unnamed");
            tracing::error!(
                what = self.what,
                thread = name,
                "panic outside any session; aborting"
            );
            eprintln!(
                "rdmactor: {} panicked on thread {name} outside any session (the panic is \
                 printed above); aborting the process instead of leaving its connections \
                 unpolled",
                self.what
            );
            std::process::abort();
        }
    }
}

/// Runs `fut` with an [`AbortOnUnwind`] guard held across every poll.
pub(crate) async fn abort_if_it_panics<F: std::future::Future>(
    what: &'static str,
    fut: F,
) -> F::Output {
    let _guard = AbortOnUnwind::new(what);
    fut.await
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::{Rc, Weak};
    use std::time::{Duration, Instant};

    use super::*;
    use crate::runtime::turns::Backlog;
    use crate::runtime::turns::STEP_BYTES;
    use crate::verbs::WorkCompletion;
    use crate::verbs::{WcOpcode, WcStatus};

    /// Records the wr_ids it is handed.
    #[derive(Default)]
    struct Recorder(RefCell<Vec<u64>>);

    impl Inbox for Recorder {
        fn completions(&self, wcs: &[WorkCompletion], _now: Instant, _hold: bool) {
            self.0.borrow_mut().extend(wcs.iter().map(|wc| wc.wr_id));
        }
        fn wake(&self, _token: u64) {}
    }

    fn wc(qp_num: u32, wr_id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: 0,
            imm_data: None,
            qp_num,
            vendor_err: 0,
        }
    }

    fn registered(qp: u32) -> Rc<Recorder> {
        let rec = Rc::new(Recorder::default());
        let weak: Weak<dyn Inbox> = Rc::downgrade(&rec) as Weak<Recorder>;
        register(qp, weak);
        rec
    }

    #[test]
    fn a_batch_is_split_per_connection_in_order() {
        let (a, b) = (registered(7), registered(8));
        assert_eq!(
            route(
                &[wc(7, 1), wc(7, 2), wc(8, 3), wc(7, 4)],
                Instant::now(),
                false
            ),
            0
        );
        assert_eq!(*a.0.borrow(), [1, 2, 4]);
        assert_eq!(*b.0.borrow(), [3]);
        unregister(7);
        unregister(8);
    }

    #[test]
    fn completions_of_an_unknown_qp_are_counted_and_dropped_and_the_rest_delivered() {
        let a = registered(12);
        // 99 never registered: its run is dropped, the runs around it still arrive.
        assert_eq!(
            route(
                &[wc(12, 1), wc(99, 2), wc(99, 3), wc(12, 4)],
                Instant::now(),
                false
            ),
            2
        );
        assert_eq!(*a.0.borrow(), [1, 4]);
        unregister(12);
        // Unregistered (the connection released everything): dropped too.
        assert_eq!(route(&[wc(12, 5)], Instant::now(), false), 1);
        assert_eq!(*a.0.borrow(), [1, 4]);
    }

    #[test]
    fn a_qp_number_registered_again_reaches_its_new_connection_only() {
        // rxe reuses QP numbers: the new connection's registration replaces the old one.
        let old = registered(13);
        unregister(13);
        let new = registered(13);
        assert_eq!(route(&[wc(13, 1)], Instant::now(), false), 0);
        assert!(old.0.borrow().is_empty());
        assert_eq!(*new.0.borrow(), [1]);
        unregister(13);
    }

    /// Re-runs this test binary with only `test` selected and `RDMACTOR_TEST_CHILD` set.
    fn run_child(test: &str) -> std::process::Output {
        std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env("RDMACTOR_TEST_CHILD", "1")
            .output()
            .expect("run the child test")
    }

    #[test]
    fn a_panic_on_a_poller_thread_takes_the_process_down_loudly() {
        if std::env::var_os("RDMACTOR_TEST_CHILD").is_some() {
            // As `Pollers::start` does: a task on an arbiter thread, guarded. Without
            // the guard the panic ends the task only, and this child would exit 0.
            let sys = actix::System::new();
            sys.block_on(async {
                let arbiter = Arbiter::new();
                arbiter.spawn(abort_if_it_panics("CQ poller", async {
                    panic!("a framework bug on the poller thread");
                }));
                actix::clock::sleep(Duration::from_secs(5)).await;
            });
            return;
        }
        let out = run_child(
            "runtime::poller::tests::a_panic_on_a_poller_thread_takes_the_process_down_loudly",
        );
        use std::os::unix::process::ExitStatusExt;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.signal(),
            Some(6),
            "SIGABRT; {:?}\n{stderr}",
            out.status
        );
        assert!(
            stderr.contains("a framework bug on the poller thread"),
            "{stderr}"
        );
        assert!(stderr.contains("CQ poller panicked on thread"), "{stderr}");
    }

    #[test]
    fn a_dropped_connection_gets_nothing_and_nothing_breaks() {
        let rec = registered(11);
        drop(rec);
        assert_eq!(route(&[wc(11, 1)], Instant::now(), false), 1);
        unregister(11);
    }

    /// A poller with two CQs: bulk READ completions on one, a small message on the
    /// other. The small message is routed before the READs' steps, not after the first
    /// CQ's whole backlog, and the READs arrive in order, one step each.
    #[test]
    fn a_small_message_on_another_cq_goes_before_the_bulk_steps() {
        use crate::transport::loopback::{connect_pair, Config, Fabric, Loopback};
        use crate::transport::{RecvWr, SendWr};
        use crate::verbs::{Access, ConnParam, QpCaps, SendOp};

        /// Logs (qp, wr_id) of everything routed to it, in one log shared by all.
        struct Log(Rc<RefCell<Vec<(u32, u64)>>>);
        impl Inbox for Log {
            fn completions(&self, wcs: &[WorkCompletion], _now: Instant, _hold: bool) {
                self.0
                    .borrow_mut()
                    .extend(wcs.iter().map(|wc| (wc.qp_num, wc.wr_id)));
            }
            fn wake(&self, _token: u64) {}
        }

        let fabric = Fabric::new(Config::default());
        let (server, client) = (fabric.device("s2"), fabric.device("c2"));
        let caps = QpCaps::default();
        let (bulk_cq, small_cq) = (
            server.create_cq(64, None).unwrap(),
            server.create_cq(64, None).unwrap(),
        );
        let ccq = client.create_cq(64, None).unwrap();
        let bulk = server.create_qp(&bulk_cq, &bulk_cq, caps, None).unwrap();
        let small = server.create_qp(&small_cq, &small_cq, caps, None).unwrap();
        let (bulk_peer, small_peer) = (
            client.create_qp(&ccq, &ccq, caps, None).unwrap(),
            client.create_qp(&ccq, &ccq, caps, None).unwrap(),
        );
        connect_pair(&bulk, &bulk_peer, &ConnParam::default()).unwrap();
        connect_pair(&small, &small_peer, &ConnParam::default()).unwrap();
        let log = Rc::new(RefCell::new(Vec::new()));
        let inboxes: Vec<Rc<dyn Inbox>> =
            vec![Rc::new(Log(log.clone())), Rc::new(Log(log.clone()))];
        register(bulk.qp_num(), Rc::downgrade(&inboxes[0]));
        register(small.qp_num(), Rc::downgrade(&inboxes[1]));

        // Three READs of 64 KiB (a step each): loopback executes them as they are posted.
        let chunk = STEP_BYTES as usize;
        let source = client.register(3 * chunk, Access::REMOTE_READ).unwrap();
        let into = server.register(3 * chunk, Access::LOCAL_WRITE).unwrap();
        for i in 0..3 {
            let mut remote = source.remote();
            remote.addr += (i * chunk) as u64;
            remote.len = chunk as u64;
            let sge = into.sge(i * chunk..(i + 1) * chunk).unwrap();
            let read = SendWr::new(10 + i as u64, SendOp::Read(remote), Some(sge));
            bulk.post_send(&read).unwrap();
        }
        // Then one small message lands on the other CQ.
        let inbox = server.register(64, Access::LOCAL_WRITE).unwrap();
        small
            .post_recv(&[RecvWr {
                wr_id: 7,
                local: Some(inbox.sge_all()),
            }])
            .unwrap();
        let mut hello = client.register(5, Access::LOCAL_WRITE).unwrap();
        hello.write(0, b"hello").unwrap();
        small_peer
            .post_send(&SendWr::new(1, SendOp::Send, Some(hello.sge_all())))
            .unwrap();

        let (mut wcs, mut polled_at, mut backlog) =
            (Vec::new(), Instant::now(), Backlog::default());
        let n = drain::<Loopback>(&[bulk_cq, small_cq], &mut wcs, &mut polled_at, &mut backlog);
        assert_eq!(n, 4);
        let (b, s) = (bulk.qp_num(), small.qp_num());
        assert_eq!(*log.borrow(), [(s, 7), (b, 10), (b, 11), (b, 12)]);
        assert!(backlog.is_empty());
        unregister(b);
        unregister(s);
    }

    /// The pollers are the transport's: over loopback, an event-mode poller sleeps on
    /// the completion channel and wakes when a SEND lands, and hands the completions to
    /// the connection registered for the QP, on its own thread.
    #[test]
    fn an_event_mode_poller_over_loopback_wakes_and_routes() {
        use crate::transport::loopback::{connect_pair, Config, Fabric, Loopback};
        use crate::transport::{RecvWr, SendWr};
        use crate::verbs::{Access, ConnParam, QpCaps, SendOp};

        /// Sends what it is handed to the test's thread.
        struct Forward(std::sync::mpsc::Sender<(u64, WcOpcode, u32)>);
        impl Inbox for Forward {
            fn completions(&self, wcs: &[WorkCompletion], _now: Instant, _hold: bool) {
                for wc in wcs {
                    let _ = self.0.send((wc.wr_id, wc.opcode, wc.byte_len));
                }
            }
            fn wake(&self, _token: u64) {}
        }

        let fabric = Fabric::new(Config::default());
        let (server, client) = (fabric.device("s"), fabric.device("c"));
        let (tx, rx) = std::sync::mpsc::channel();
        actix::System::new().block_on(async move {
            let spin = PollMode::Event {
                spin: Duration::ZERO,
            };
            let pollers = Pollers::<Loopback>::start(&server, 1, spin, 2).unwrap();
            let reserved = pollers.reserve(64).unwrap();
            let caps = QpCaps::default();
            let qp = server
                .create_qp(reserved.cq(), reserved.cq(), caps, None)
                .unwrap();
            let ccq = client.create_cq(64, None).unwrap();
            let peer = client
                .create_qp(&ccq, &ccq, QpCaps::default(), None)
                .unwrap();
            connect_pair(&qp, &peer, &ConnParam::default()).unwrap();
            let mut into = server.register(64, Access::LOCAL_WRITE).unwrap();
            into.write(0, &[0; 64]).unwrap();
            let qp_num = qp.qp_num();
            // Registered on the poller's own thread, as a connection's actor does.
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            reserved.arbiter().spawn_fn(move || {
                let inbox: Rc<dyn Inbox> = Rc::new(Forward(tx));
                register(qp_num, Rc::downgrade(&inbox));
                // Kept alive on the poller's thread for the rest of the test process.
                std::mem::forget(inbox);
                let _ = ready_tx.send(());
            });
            ready_rx.await.unwrap();
            let recv = RecvWr {
                wr_id: 7,
                local: Some(into.sge_all()),
            };
            qp.post_recv(&[recv]).unwrap();
            // Let the poller go to sleep on the channel before anything arrives.
            actix::clock::sleep(Duration::from_millis(20)).await;
            let mut from = client.register(5, Access::LOCAL_WRITE).unwrap();
            from.write(0, b"hello").unwrap();
            let send = SendWr::new(1, SendOp::Send, Some(from.sge_all()));
            peer.post_send(&send).unwrap();
            let got = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(5)))
                .await
                .unwrap();
            assert_eq!(got, Ok((7, WcOpcode::Recv, 5)));
            let mut bytes = [0u8; 5];
            into.read(0, &mut bytes).unwrap();
            assert_eq!(&bytes, b"hello");
            drop(reserved);
            drop(pollers);
        });
    }
}
