//! [`HandlerService`]: a [`RequestHandler`] as a [`Service`] whose sessions run each
//! request's call as a local future on the connection's poller thread.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::task::AbortHandle;

use super::api::{RequestCx, RequestHandler};
use super::one_sided::{Link, LinkParts, Transfers, TRANSFERS};
use super::wire::{encode_refusal, Answer, Refusal};
use crate::proto::budget::BudgetError;
use crate::runtime::chunk_line::ServiceChunks;
use crate::runtime::close::CloseReason;
use crate::runtime::connection::{panic_message, SessionCx, SessionWaker};
use crate::runtime::heap::Held;
use crate::runtime::service::{Incoming, OpId, PeerInfo, Service, Session, SessionError};
use crate::transport::Transport;

/// A [`RequestHandler`] served as a [`Service`]: register it with
/// [`ServerBuilder::handler`](crate::runtime::ServerBuilder::handler), or with
/// `ServerBuilder::service` after setting its limits here.
pub struct HandlerService<H> {
    handler: Arc<H>,
    max_in_flight: usize,
    max_waiting: usize,
    max_waiting_bytes: usize,
    max_message: Option<usize>,
    max_transfer: u64,
    budget_wait: Duration,
    calls: Arc<Calls>,
    chunks: Arc<ServiceChunks>,
}

/// Most READ and WRITE chunks of a service's calls in flight at once, by default (4 MiB
/// with the pool's 1 MiB class). Far more than a link's bandwidth-delay product (200
/// Gb/s × 5 µs is 125 KB), so bulk transfers still fill it; and every small answer of
/// the service waits behind at most this much at the NIC. Under Soft-RoCE in the VM, 16
/// made a polite request wait up to 1 s behind a flood of 16 MiB `GetInto`s, 4 about
/// a quarter of that (tests/verbs/memory_adversary.rs).
const MAX_SERVICE_CHUNKS: usize = 4;

/// Most calls of one service running at once across all its connections, by default.
const MAX_CALLS: usize = 1024;

impl<H: RequestHandler> HandlerService<H> {
    /// `handler`, with at most 64 calls running per connection and 1024 across the
    /// service, 1024 requests or 4 MiB of them waiting per connection, transfers of
    /// the client's memory of at most 16 MiB, and READs waiting up to 30 s for room in
    /// the server's heap budget.
    pub fn new(handler: H) -> Self {
        HandlerService {
            handler: Arc::new(handler),
            max_in_flight: 64,
            max_waiting: 1024,
            max_waiting_bytes: 4 << 20,
            max_message: None,
            max_transfer: 16 << 20,
            budget_wait: Duration::from_secs(30),
            calls: Arc::new(Calls::new(MAX_CALLS)),
            chunks: ServiceChunks::new(MAX_SERVICE_CHUNKS),
        }
    }

    /// How many chunks of the calls' READs and WRITEs of client memory may be in flight
    /// across every connection of the service (at least 1; 4 by default, each at most
    /// the pool's largest class). Each connection has 8 at most; this bounds what all
    /// of them queue at the NIC together, ahead of everyone's small messages. More
    /// moves bulk data faster and makes small requests wait longer behind it.
    pub fn max_chunks_in_flight(mut self, n: usize) -> Self {
        self.chunks = ServiceChunks::new(n);
        self
    }

    /// How many calls beyond each connection's first may run at once across every
    /// connection of the service (at least 1). Each connection's own bound
    /// ([`max_in_flight`](Self::max_in_flight)) keeps one client from taking them all
    /// from a single connection; this one keeps many connections together from making
    /// the server hold more futures than planned. A connection's first call always
    /// runs, so that clients holding many calls cannot lock out one that asks one at a
    /// time; a further request that finds the service's calls all taken waits in its
    /// connection's line until one of that connection's calls finishes.
    pub fn max_calls(mut self, n: usize) -> Self {
        self.calls = Arc::new(Calls::new(n.max(1)));
        self
    }

    /// How long a [`RequestCx::read`] waits, in line, for room for its bytes in the
    /// server's heap budget (`PoolConfig::heap_bytes`) before it fails with
    /// [`OneSidedError::NoRoom`](super::OneSidedError::NoRoom).
    pub fn budget_wait(mut self, wait: Duration) -> Self {
        self.budget_wait = wait;
        self
    }

    /// The most bytes one [`RequestCx::read`] or [`RequestCx::write`] of the client's
    /// memory may move; a larger one fails with
    /// [`OneSidedError::TooLarge`](super::OneSidedError::TooLarge) before anything is
    /// posted. The READ's bytes are held in the call until it returns them, so this
    /// bounds what one call can make the server hold.
    pub fn max_transfer(mut self, bytes: u64) -> Self {
        self.max_transfer = bytes;
        self
    }

    /// How many calls one connection may have running at once (at least 1). Bounds what
    /// one client can make the server hold in futures and owner mailboxes.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// How many further requests of one connection wait, in order, for a running call to
    /// finish; past that a request is refused at once with [`Refusal::Busy`]. 0 refuses
    /// whatever finds every slot taken. Each waiting request holds its bytes.
    pub fn max_waiting(mut self, n: usize) -> Self {
        self.max_waiting = n;
        self
    }

    /// How many bytes of requests one connection may have waiting. A delivered message
    /// no longer counts against the server's budget for incoming messages, so the
    /// waiting line bounds its own; past it a request is refused with [`Refusal::Busy`].
    /// A request that finds a slot free runs whatever its size.
    pub fn max_waiting_bytes(mut self, bytes: usize) -> Self {
        self.max_waiting_bytes = bytes;
        self
    }

    /// The largest request a client may send ([`Service::max_message`]); larger ones are
    /// refused when offered, before any of their bytes move.
    pub fn max_message(mut self, bytes: usize) -> Self {
        self.max_message = Some(bytes);
        self
    }
}

impl<H: RequestHandler, T: Transport> Service<T> for HandlerService<H> {
    fn max_message(&self) -> Option<usize> {
        self.max_message
    }

    fn session(&self, peer: &PeerInfo) -> Box<dyn Session<T>> {
        self.calls.name_once(&peer.service);
        Box::new(HandlerSession {
            handler: Arc::clone(&self.handler),
            peer: Arc::new(peer.clone()),
            max_in_flight: self.max_in_flight,
            max_waiting: self.max_waiting,
            max_waiting_bytes: self.max_waiting_bytes,
            waiting_bytes: 0,
            running: HashMap::new(),
            waiting: VecDeque::new(),
            finished: Arc::default(),
            next_call: 0,
            waker: None,
            link: None,
            transfers: Transfers::new(Arc::clone(&self.chunks)),
            max_transfer: self.max_transfer,
            budget_wait: self.budget_wait,
            calls: Arc::clone(&self.calls),
        })
    }
}

/// The calls running across one service's connections, against its bound.
#[derive(Debug)]
struct Calls {
    running: AtomicUsize,
    max: usize,
    /// The service's name, for the gauge (known once its first session is made).
    name: std::sync::OnceLock<String>,
}

impl Calls {
    fn new(max: usize) -> Calls {
        Calls {
            running: AtomicUsize::new(0),
            max,
            name: std::sync::OnceLock::new(),
        }
    }

    fn name_once(&self, service: &str) {
        let _ = self.name.set(service.to_owned());
    }

    /// A slot for one more call, if the service has one.
    fn take(self: &Arc<Self>) -> Option<CallSlot> {
        let taken = self
            .running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n.saturating_add(1))
            })
            .ok()?;
        self.gauge(taken.saturating_add(1));
        Some(CallSlot {
            calls: Arc::clone(self),
        })
    }

    /// A slot for the only call of a connection that has none running: always given,
    /// past the bound if need be. The bound is on calls beyond each connection's first,
    /// so that many connections each holding many calls cannot lock a polite client
    /// (one call at a time) out of the service: calls then number at most `max` plus
    /// one per connection, and what each holds is on the heap budget anyway.
    fn take_first(self: &Arc<Self>) -> CallSlot {
        let before = self.running.fetch_add(1, Ordering::AcqRel);
        self.gauge(before.saturating_add(1));
        CallSlot {
            calls: Arc::clone(self),
        }
    }

    fn gauge(&self, now: usize) {
        if let Some(name) = self.name.get() {
            crate::metrics::handler_calls(name, now);
        }
    }
}

/// One running call's place among its service's; given back when dropped.
struct CallSlot {
    calls: Arc<Calls>,
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        let before = self.calls.running.fetch_sub(1, Ordering::AcqRel);
        // This slot was counted in `before`, so it is at least 1.
        self.calls.gauge(before.saturating_sub(1));
    }
}

/// A call running on its task: dropped (aborted) when the connection closes, and the
/// service slot and heap its request holds with it.
struct Running {
    task: AbortHandle,
    _slot: CallSlot,
    _request: Held,
}

/// A request waiting for a running slot, its bytes counted.
struct Waiting {
    msg: Incoming,
    held: Held,
}

/// The wake-up token of a finished call: the session drains every finished call on it.
const FINISHED: u64 = 1;

/// A call's answer, encoded, waiting for the session to send it.
struct Finished {
    call: u64,
    tag: u32,
    answer: Vec<u8>,
}

/// The calls of one connection: what runs, what waits, and what finished.
struct HandlerSession<H> {
    handler: Arc<H>,
    peer: Arc<PeerInfo>,
    max_in_flight: usize,
    max_waiting: usize,
    max_waiting_bytes: usize,
    /// Bytes of the requests in `waiting`.
    waiting_bytes: usize,
    /// Calls running as local tasks, by call number, to drop them when the connection
    /// closes.
    running: HashMap<u64, Running>,
    /// Requests that found every running slot taken, in arrival order.
    waiting: VecDeque<Waiting>,
    /// Answers of calls that finished on their task, for the next `on_wake`.
    finished: Arc<Mutex<Vec<Finished>>>,
    next_call: u64,
    waker: Option<SessionWaker>,
    /// Where the calls' futures queue their READs and WRITEs of the client's memory.
    link: Option<Arc<Link>>,
    /// Those transfers, being posted and completed.
    transfers: Transfers,
    max_transfer: u64,
    budget_wait: Duration,
    calls: Arc<Calls>,
}

impl<H: RequestHandler> HandlerSession<H> {
    /// Starts the call for `msg`: polls it once here, and if it is not done, spawns it
    /// on this thread to be finished by an `on_wake`.
    fn start<T: Transport>(
        &mut self,
        cx: &mut SessionCx<'_, T>,
        msg: Incoming,
        slot: CallSlot,
        request: Held,
    ) -> Result<(), SessionError> {
        let tag = msg.tag;
        let req = match msg.decode::<H::Req>() {
            Ok(req) => req,
            Err(e) => return answer(cx, tag, encode_refusal(Refusal::BadRequest(e.why))),
        };
        let handler = Arc::clone(&self.handler);
        let waker = self.waker.get_or_insert_with(|| cx.waker()).clone();
        let link = match &self.link {
            Some(link) => Arc::clone(link),
            None => {
                let link = Arc::new(Link::new(LinkParts {
                    waker: waker.clone(),
                    max_transfer: self.max_transfer,
                    budget: cx.heap_budget(),
                    budget_wait: self.budget_wait,
                    blocking: cx.blocking_gate(),
                }));
                self.link = Some(Arc::clone(&link));
                link
            }
        };
        let rcx = RequestCx {
            peer: Arc::clone(&self.peer),
            tag,
            link,
            holds: Arc::default(),
        };
        let mut call = CatchPanic(Box::pin(async move {
            let result = handler.call(req, &rcx).await;
            encode_answer(result)
        }));
        // Most calls that wait for nothing are done on the first poll: answer in this
        // turn, without a task or a wake-up. A future polled here with a no-op waker
        // registers the task's own waker when the task polls it again.
        if let Poll::Ready(done) = Pin::new(&mut call).poll(&mut Context::from_waker(Waker::noop()))
        {
            return answer(cx, tag, done);
        }
        // A transfer the first poll asked for is posted now, not a wake-up later.
        self.post_transfers(cx);
        let id = self.next_call;
        // Our own call ids: 2^64 calls on one connection do not happen.
        self.next_call = self.next_call.wrapping_add(1);
        let finished = Arc::clone(&self.finished);
        let task = actix::spawn(async move {
            let answer = call.await;
            lock(&finished).push(Finished {
                call: id,
                tag,
                answer,
            });
            // The connection may be gone: the answer is then dropped with `finished`.
            waker.wake(FINISHED);
        });
        self.running.insert(
            id,
            Running {
                task: task.abort_handle(),
                _slot: slot,
                _request: request,
            },
        );
        Ok(())
    }

    /// Posts the READs and WRITEs the calls' futures queued.
    fn post_transfers<T: Transport>(&mut self, cx: &mut SessionCx<'_, T>) {
        if let Some(link) = &self.link {
            self.transfers.take_from(link, cx);
        }
    }
}

impl<H: RequestHandler, T: Transport> Session<T> for HandlerSession<H> {
    fn on_message(&mut self, cx: &mut SessionCx<'_, T>, msg: Incoming) -> Result<(), SessionError> {
        // A delivered request no longer counts against the budget for incoming
        // messages; it counts again here, for as long as this session holds it.
        let held = match cx.heap_budget().count(msg.data.len()) {
            Ok(held) => held,
            Err(e) => {
                let why = Refusal::Overloaded(format!("the request's {} B: {e}", msg.data.len()));
                return answer(cx, msg.tag, encode_refusal(why));
            }
        };
        if self.running.len() < self.max_in_flight && self.waiting.is_empty() {
            if let Some(slot) = self.call_slot() {
                return self.start(cx, msg, slot, held);
            }
        }
        let bytes = self.waiting_bytes.saturating_add(msg.data.len());
        if self.waiting.len() < self.max_waiting && bytes <= self.max_waiting_bytes {
            self.waiting_bytes = bytes;
            self.waiting.push_back(Waiting { msg, held });
            return Ok(());
        }
        let busy = Refusal::Busy {
            running: u32::try_from(self.running.len()).unwrap_or(u32::MAX),
            waiting: u32::try_from(self.waiting.len()).unwrap_or(u32::MAX),
        };
        answer(cx, msg.tag, encode_refusal(busy))
    }

    fn on_wake(&mut self, cx: &mut SessionCx<'_, T>, token: u64) -> Result<(), SessionError> {
        if token == TRANSFERS {
            self.post_transfers(cx);
            return Ok(());
        }
        if token != FINISHED {
            return Ok(());
        }
        let done = std::mem::take(&mut *lock(&self.finished));
        for Finished {
            call,
            tag,
            answer: bytes,
        } in done
        {
            if self.running.remove(&call).is_some() {
                answer(cx, tag, bytes)?;
            }
        }
        while self.running.len() < self.max_in_flight && !self.waiting.is_empty() {
            let Some(slot) = self.call_slot() else {
                break;
            };
            let Some(Waiting { msg, held }) = self.waiting.pop_front() else {
                break;
            };
            self.waiting_bytes = self.waiting_bytes.saturating_sub(msg.data.len());
            self.start(cx, msg, slot, held)?;
        }
        Ok(())
    }

    fn on_op(
        &mut self,
        cx: &mut SessionCx<'_, T>,
        op: OpId,
        result: crate::verbs::Result<()>,
    ) -> Result<(), SessionError> {
        // A failed chunk has told its call; the connection closes on its own (the QP is
        // in error), naming the operation.
        if self.transfers.complete(cx, op, &result) {
            return Ok(());
        }
        Err(SessionError::new(format!(
            "a completion of {op:?}, which no call posted"
        )))
    }

    fn on_refused(
        &mut self,
        cx: &mut SessionCx<'_, T>,
        tag: u32,
        why: BudgetError,
    ) -> Result<(), SessionError> {
        // The client would otherwise wait for an answer that never comes: tell it, in a
        // few bytes it takes.
        answer(
            cx,
            tag,
            encode_refusal(Refusal::Undeliverable(why.to_string())),
        )
    }

    fn on_close(&mut self, _reason: &CloseReason) {
        self.drop_calls();
    }
}

impl<H> HandlerSession<H> {
    /// A slot among the service's calls for the next call of this connection: its
    /// first always, the others while the service has room.
    fn call_slot(&self) -> Option<CallSlot> {
        match self.running.is_empty() {
            true => Some(self.calls.take_first()),
            false => self.calls.take(),
        }
    }

    /// Nobody can be answered any more: drops the running futures (what they hold is
    /// given back at once, not when they would have finished) and the requests that
    /// waited for them.
    fn drop_calls(&mut self) {
        for (_, call) in self.running.drain() {
            call.task.abort();
        }
        self.waiting.clear();
        self.waiting_bytes = 0;
        self.transfers.close();
        lock(&self.finished).clear();
    }
}

impl<H> Drop for HandlerSession<H> {
    // A session can go without `on_close` (its actor stopped with the thread): its calls
    // go with it rather than run on for nobody.
    fn drop(&mut self) {
        self.drop_calls();
    }
}

/// Sends `bytes` under `tag`, unless nobody asked (tag 0). An answer the connection
/// cannot take is replaced by a refusal that says why, so the client is not left
/// waiting.
fn answer<T: Transport>(
    cx: &mut SessionCx<'_, T>,
    tag: u32,
    bytes: Vec<u8>,
) -> Result<(), SessionError> {
    if tag == 0 {
        return Ok(());
    }
    match cx.send(tag, bytes) {
        Ok(()) => Ok(()),
        Err(e) => cx.send(tag, encode_refusal(Refusal::Undeliverable(e.0))),
    }
}

fn encode_answer<R: serde::Serialize, E: serde::Serialize>(result: Result<R, E>) -> Vec<u8> {
    let reply = match result {
        Ok(r) => Answer::Ok(r),
        Err(e) => Answer::Err(e),
    };
    postcard::to_allocvec(&reply)
        .unwrap_or_else(|e| encode_refusal(Refusal::Undeliverable(format!("not encoded: {e}"))))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A call whose panic becomes a [`Refusal::Panicked`] answer: the client learns why, and
/// neither the connection nor the poller thread goes down with it.
struct CatchPanic(Pin<Box<dyn Future<Output = Vec<u8>>>>);

impl Future for CatchPanic {
    type Output = Vec<u8>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Vec<u8>> {
        match catch_unwind(AssertUnwindSafe(|| self.0.as_mut().poll(cx))) {
            Ok(poll) => poll,
            Err(payload) => {
                Poll::Ready(encode_refusal(Refusal::Panicked(panic_message(&*payload))))
            }
        }
    }
}
