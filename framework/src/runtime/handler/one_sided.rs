//! A handler's RDMA READs and WRITEs of the client's memory: [`RequestCx::read`] and
//! [`RequestCx::write`](super::RequestCx::write) queue a transfer on the call's
//! [`Link`] and wake the session, which posts it in chunks of pool buffers on the
//! connection's QP and answers the future when the last chunk completed.
//!
//! The future cannot post itself: posting needs the session's [`SessionCx`], which only
//! a session callback holds. So the transfer crosses once to the session (a queue and a
//! wake-up, both on the same thread) and its answer comes back through a oneshot.
//!
//! [`RequestCx::read`]: super::RequestCx::read

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use slab::Slab;
use tokio::sync::oneshot;

use crate::runtime::chunk_line::{ChunkRoom, ChunkWaiter, ServiceChunks};
use crate::runtime::connection::{BlockingHandle, BufId, Op, SessionCx, SessionWaker};
use crate::runtime::heap::{HeapBudget, HeapError, Held};
use crate::runtime::service::{OpId, SessionError};
use crate::transport::Transport;
use crate::verbs::RemoteRegion;

/// The wake-up token of a queued transfer (the finished-call token is 1).
pub(super) const TRANSFERS: u64 = 2;

/// Most chunks of one connection's transfers in flight at once: with the pool's largest
/// class of 1 MiB, a connection pins at most this many MiB of pool memory for them,
/// whatever its handlers ask for at once.
const MAX_CHUNKS: usize = 8;

/// Why a handler's [`read`](super::RequestCx::read) or
/// [`write`](super::RequestCx::write) of the client's memory failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OneSidedError {
    /// More bytes than one transfer may move
    /// ([`HandlerService::max_transfer`](super::HandlerService::max_transfer)).
    #[error("a transfer of {len} bytes is larger than the {max} bytes one may move")]
    TooLarge {
        /// Bytes asked for.
        len: u64,
        /// The service's limit.
        max: u64,
    },
    /// A WRITE of more bytes than the client's region says it holds. Checked here, so a
    /// client's short region costs the call an error and not the connection.
    #[error("{len} bytes do not fit the client's region of {granted}")]
    OutsideRegion {
        /// Bytes to write.
        len: u64,
        /// The region's length.
        granted: u64,
    },
    /// No pool buffer for a chunk: the server's registered memory is used up for now.
    #[error("no buffer for the transfer: {0}")]
    NoBuffer(String),
    /// The server's heap budget had no room for the transfer's bytes: a READ waited
    /// its turn for [`HandlerService::budget_wait`](super::HandlerService::budget_wait)
    /// in vain, or a WRITE's bytes (already made by the handler) found it full, so they
    /// were dropped rather than held uncounted while waiting.
    #[error("no room for the transfer: {0}")]
    NoRoom(#[from] HeapError),
    /// The READ or WRITE completed with an error (a remote access error for an rkey
    /// that is not the client's to give, say). The QP is in the error state then, and
    /// the connection closes with this reason.
    #[error("the transfer failed: {0}")]
    Failed(String),
    /// The connection closed before the transfer finished.
    #[error("the connection closed before the transfer finished")]
    Closed,
}

type Reply = oneshot::Sender<Result<Vec<u8>, OneSidedError>>;

/// What a connection's calls and its session share: transfers asked for and not yet
/// seen by the session, the way to wake it, and what bounds the memory and threads the
/// calls take.
#[derive(Debug)]
pub(super) struct Link {
    queue: Mutex<VecDeque<Asked>>,
    pub(super) waker: SessionWaker,
    max_transfer: u64,
    pub(super) budget: HeapBudget,
    /// How long a READ waits for its bytes' room in the heap budget.
    budget_wait: Duration,
    pub(super) blocking: BlockingHandle,
}

/// The bytes of a WRITE: made for it (counted against the heap budget), or shared with
/// whoever keeps them (a store's value: no copy, nothing new held).
#[derive(Debug)]
pub(super) enum Out {
    Owned(Vec<u8>),
    Shared(Arc<[u8]>),
}

impl Out {
    fn bytes(&self) -> &[u8] {
        match self {
            Out::Owned(v) => v,
            Out::Shared(a) => a,
        }
    }
}

/// A transfer a future asked for.
#[derive(Debug)]
struct Asked {
    remote: RemoteRegion,
    /// The bytes to WRITE, or `None` for a READ of all of `remote`.
    write: Option<Out>,
    /// The WRITE's bytes, counted until the transfer is done with them.
    held: Option<Held>,
    reply: Reply,
}

/// What a [`Link`] is made of (the session's, taken on its first call).
pub(super) struct LinkParts {
    pub waker: SessionWaker,
    pub max_transfer: u64,
    pub budget: HeapBudget,
    pub budget_wait: Duration,
    pub blocking: BlockingHandle,
}

impl Link {
    pub(super) fn new(p: LinkParts) -> Link {
        Link {
            queue: Mutex::default(),
            waker: p.waker,
            max_transfer: p.max_transfer,
            budget: p.budget,
            budget_wait: p.budget_wait,
            blocking: p.blocking,
        }
    }

    /// READs all of `remote`: its length is counted against the heap budget first
    /// (waiting in line up to `budget_wait`), and the count is handed back with the
    /// bytes, for the call to hold as long as it may hold them.
    pub(super) async fn read(
        &self,
        remote: RemoteRegion,
    ) -> Result<(Vec<u8>, Held), OneSidedError> {
        let len = self.check(remote.len, &remote)?;
        let held = self.budget.hold(len, self.budget_wait).await?;
        let data = self.transfer(remote, None, None).await?;
        Ok((data, held))
    }

    /// WRITEs `data` to `remote`. Its bytes exist already: counted now or refused, never
    /// held uncounted while waiting.
    pub(super) async fn write(
        &self,
        remote: RemoteRegion,
        data: Vec<u8>,
    ) -> Result<(), OneSidedError> {
        let len = u64::try_from(data.len()).unwrap_or(u64::MAX);
        let len = self.check(len, &remote)?;
        let held = self.budget.count(len)?;
        self.transfer(remote, Some(Out::Owned(data)), Some(held))
            .await
            .map(drop)
    }

    /// WRITEs bytes someone else keeps (and counts), shared: no copy is made and
    /// nothing new is held, so nothing is counted; the service's chunks in flight bound
    /// how fast they go.
    pub(super) async fn write_shared(
        &self,
        remote: RemoteRegion,
        data: Arc<[u8]>,
    ) -> Result<(), OneSidedError> {
        let len = u64::try_from(data.len()).unwrap_or(u64::MAX);
        self.check(len, &remote)?;
        self.transfer(remote, Some(Out::Shared(data)), None)
            .await
            .map(drop)
    }

    /// Errors the session would only find later (too large, outside the region),
    /// found at once; the length as a `usize` otherwise.
    fn check(&self, len: u64, remote: &RemoteRegion) -> Result<usize, OneSidedError> {
        if len > self.max_transfer {
            return Err(OneSidedError::TooLarge {
                len,
                max: self.max_transfer,
            });
        }
        if len > remote.len {
            return Err(OneSidedError::OutsideRegion {
                len,
                granted: remote.len,
            });
        }
        usize::try_from(len).map_err(|_| OneSidedError::TooLarge {
            len,
            max: self.max_transfer,
        })
    }

    /// Queues a checked transfer and waits for its result.
    async fn transfer(
        &self,
        remote: RemoteRegion,
        write: Option<Out>,
        held: Option<Held>,
    ) -> Result<Vec<u8>, OneSidedError> {
        let len = write.as_ref().map_or(remote.len, |w| {
            u64::try_from(w.bytes().len()).unwrap_or(u64::MAX)
        });
        if len == 0 {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        let first = {
            let mut queue = lock(&self.queue);
            queue.push_back(Asked {
                remote,
                write,
                held,
                reply,
            });
            queue.len() == 1
        };
        // One wake-up per batch: the session takes the whole queue on it.
        if first && !self.waker.wake(TRANSFERS) {
            return Err(OneSidedError::Closed);
        }
        answer.await.unwrap_or(Err(OneSidedError::Closed))
    }

    fn take(&self) -> VecDeque<Asked> {
        std::mem::take(&mut *lock(&self.queue))
    }
}

/// One transfer being posted and completed chunk by chunk.
struct Transfer {
    remote: RemoteRegion,
    /// READ: where the chunks land; an owned WRITE: the bytes to send.
    data: Vec<u8>,
    /// A shared WRITE's bytes (`data` is empty then).
    shared: Option<Arc<[u8]>>,
    /// Bytes to move (`data` goes with the answer, so its length cannot say).
    len: usize,
    is_write: bool,
    /// Bytes not yet posted start here.
    next: usize,
    /// Chunks posted and not yet completed.
    outstanding: usize,
    reply: Option<Reply>,
    /// A WRITE's bytes counted against the heap budget; they go with the transfer.
    _held: Option<Held>,
}

impl Transfer {
    fn finish(&mut self, result: Result<(), OneSidedError>) {
        if let Some(reply) = self.reply.take() {
            let data = std::mem::take(&mut self.data);
            let _ = reply.send(result.map(|()| if self.is_write { Vec::new() } else { data }));
        }
    }
}

/// A chunk in flight: which transfer, which pool buffer, and where in the transfer.
struct Chunk {
    transfer: usize,
    buf: BufId,
    at: usize,
    len: usize,
    /// Its place among the service's chunks in flight, given back with it.
    _room: ChunkRoom,
}

/// One connection's transfers, kept by its session.
pub(super) struct Transfers {
    transfers: Slab<Transfer>,
    /// Transfers with bytes left to post, oldest first.
    unposted: VecDeque<usize>,
    chunks: HashMap<OpId, Chunk>,
    service: Arc<ServiceChunks>,
    /// This connection in the service's line (set with the first transfer).
    waiter: Option<ChunkWaiter>,
}

impl Transfers {
    pub(super) fn new(service: Arc<ServiceChunks>) -> Transfers {
        Transfers {
            transfers: Slab::new(),
            unposted: VecDeque::new(),
            chunks: HashMap::new(),
            service,
            waiter: None,
        }
    }

    /// Takes what the futures queued on `link` and posts as many chunks as the bound
    /// allows.
    pub(super) fn take_from<T: Transport>(&mut self, link: &Link, cx: &mut SessionCx<'_, T>) {
        if self.waiter.is_none() {
            self.waiter = Some(ChunkWaiter::new(link.waker.clone(), TRANSFERS));
        }
        for asked in link.take() {
            let is_write = asked.write.is_some();
            // A READ's length was checked against `max_transfer` and counted against the
            // heap budget by `Link::read` before it was queued.
            let (data, shared) = match asked.write {
                Some(Out::Owned(data)) => (data, None),
                Some(Out::Shared(bytes)) => (Vec::new(), Some(bytes)),
                None => match usize::try_from(asked.remote.len) {
                    Ok(len) => (vec![0; len], None),
                    Err(_) => continue,
                },
            };
            let id = self.transfers.insert(Transfer {
                remote: asked.remote,
                len: shared.as_ref().map_or(data.len(), |b| b.len()),
                data,
                shared,
                is_write,
                next: 0,
                outstanding: 0,
                reply: Some(asked.reply),
                _held: asked.held,
            });
            self.unposted.push_back(id);
        }
        self.post(cx);
    }

    /// Posts chunks, oldest transfer first, while fewer than [`MAX_CHUNKS`] are in
    /// flight. A transfer whose chunk finds no buffer fails; the others go on.
    fn post<T: Transport>(&mut self, cx: &mut SessionCx<'_, T>) {
        self.post_chunks(cx);
        if let Some(waiter) = &self.waiter {
            self.service.return_grants(waiter);
        }
    }

    fn post_chunks<T: Transport>(&mut self, cx: &mut SessionCx<'_, T>) {
        while self.chunks.len() < MAX_CHUNKS {
            let Some(&id) = self.unposted.front() else {
                return;
            };
            let Some(waiter) = &self.waiter else {
                return;
            };
            // Woken (TRANSFERS) when another chunk of the service completes.
            let Some(room) = self.service.take(waiter) else {
                return;
            };
            let t = &mut self.transfers[id];
            // At least a byte a chunk: a pool without classes fails the lease, not the loop.
            // `next` never passes `len`, the length of our own buffer (checked against
            // the client's region before it was queued).
            let len = t.len.saturating_sub(t.next).min(cx.largest_buffer().max(1));
            match post_chunk(cx, t, len) {
                Ok((op, buf)) => {
                    self.chunks.insert(
                        op,
                        Chunk {
                            transfer: id,
                            buf,
                            at: t.next,
                            len,
                            _room: room,
                        },
                    );
                    // Within `t.len` (`len` is at most what is left); at most
                    // MAX_CHUNKS outstanding.
                    t.next = t.next.saturating_add(len);
                    t.outstanding = t.outstanding.saturating_add(1);
                    if t.next == t.len {
                        self.unposted.pop_front();
                    }
                }
                Err(why) => {
                    self.unposted.pop_front();
                    t.finish(Err(why));
                    t.next = t.len;
                    if t.outstanding == 0 {
                        self.transfers.remove(id);
                    }
                }
            }
        }
    }

    /// A completion of op `op`: false when it is not a chunk of a transfer, else the
    /// chunk is accounted for, and the transfer answered once its last chunk is in.
    pub(super) fn complete<T: Transport>(
        &mut self,
        cx: &mut SessionCx<'_, T>,
        op: OpId,
        result: &crate::verbs::Result<()>,
    ) -> bool {
        let Some(chunk) = self.chunks.remove(&op) else {
            return false;
        };
        let t = &mut self.transfers[chunk.transfer];
        // This chunk was counted when posted.
        t.outstanding = t.outstanding.saturating_sub(1);
        match result {
            // A READ chunk lands in the transfer, unless it failed already (its bytes
            // went with the answer).
            Ok(()) if !t.is_write && t.reply.is_some() => {
                // A chunk lies within the transfer's own buffer (`post`).
                let into = &mut t.data[chunk.at..chunk.at.saturating_add(chunk.len)];
                if let Err(e) = cx.copy_out(chunk.buf, 0, into) {
                    t.finish(Err(OneSidedError::Failed(e.to_string())));
                }
            }
            Ok(()) => {}
            Err(e) => t.finish(Err(OneSidedError::Failed(e.to_string()))),
        }
        cx.free(chunk.buf);
        if t.outstanding == 0 && t.next == t.len {
            t.finish(Ok(()));
            self.transfers.remove(chunk.transfer);
        }
        self.post(cx);
        true
    }

    /// The connection is closing: every transfer's future learns it (their tasks are
    /// being dropped too, but a future polled from elsewhere is told, not left waiting).
    pub(super) fn close(&mut self) {
        for mut t in self.transfers.drain() {
            t.finish(Err(OneSidedError::Closed));
        }
        self.unposted.clear();
        if let Some(waiter) = &self.waiter {
            waiter.leave();
        }
        // Their rooms go back, waking whoever is next in line, and so do the rooms
        // granted to us and not used.
        self.chunks.clear();
        if let Some(waiter) = &self.waiter {
            self.service.return_grants(waiter);
        }
    }
}

/// A session dropped without [`Transfers::close`] still gives back what it was granted.
impl Drop for Transfers {
    fn drop(&mut self) {
        self.close();
    }
}

/// Leases a buffer for `len` bytes at `t.next`, fills it for a WRITE, and posts it.
fn post_chunk<T: Transport>(
    cx: &mut SessionCx<'_, T>,
    t: &Transfer,
    len: usize,
) -> Result<(OpId, BufId), OneSidedError> {
    let no_buffer = |e: SessionError| OneSidedError::NoBuffer(e.to_string());
    let buf = cx.alloc(len).map_err(no_buffer)?;
    let remote = t.remote.at(t.next as u64);
    let remote = RemoteRegion {
        len: len as u64,
        ..remote
    };
    let op = if t.is_write {
        // `len` is at most what is left of our own buffer after `next` (`post`).
        let out = t.shared.as_deref().unwrap_or(&t.data);
        cx.copy_in(buf, 0, &out[t.next..t.next.saturating_add(len)])
            .map_err(no_buffer)?;
        Op::Write {
            buf,
            range: 0..len,
            dst: remote,
            imm: None,
        }
    } else {
        Op::Read {
            buf,
            range: 0..len,
            src: remote,
        }
    };
    match cx.post(op) {
        Ok(op) => Ok((op, buf)),
        Err(e) => {
            cx.free(buf);
            Err(OneSidedError::Failed(e.to_string()))
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
