//! The client side of the `files` service: [`send_file`] (upload, the client is the
//! [`Sender`]) and [`fetch_file`] (download, the client is the [`Receiver`]), driving
//! the state machines over a [`ClientConnection`].
//!
//! Chunks of an upload are read from the file straight into a registered buffer per
//! slot of the window and written from there ([`ClientConnection::write_from`], which
//! hands the buffer back when the WRITE completed): no copy between the file and the
//! NIC but the read itself. The window of a download is registered with
//! [`Client::register`] and dropped (deregistered) as soon as the last chunk is in.
//!
//! A connection carries one transfer at a time, and nothing else meanwhile: the driver
//! takes every message of [`ClientConnection::recv`] as part of the transfer. On any
//! error the driver closes the connection, which makes the server drop its side of the
//! transfer (and any partial file) instead of waiting for chunks that never come.

pub(super) mod delete;
mod error;
mod question;
pub(super) mod stat;

pub use error::ClientError;
use std::collections::{HashMap, VecDeque};
use std::future::{poll_fn, Future};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

use rdmactor::runtime::{Client, ClientConnection, Incoming, RequestError};
use rdmactor::transport::{Region, Transport, Verbs};
use rdmactor::verbs::{Access, RemoteRegion};

use crate::file_transfer::config::Config;
use crate::file_transfer::endpoint::Endpoint;
use crate::file_transfer::error::TransferError;
use crate::file_transfer::output::{Outcome, Output};
use crate::file_transfer::receiver::{Consumed, Receiver};
use crate::file_transfer::sender::Sender;
use crate::file_transfer::store::StoreError;
use crate::file_transfer::wire::{FileOffer, HashAlg, Msg, RemoteWindow, WindowGrant};

/// How [`send_file`] sends.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// The digest the server verifies.
    pub alg: HashAlg,
    /// Replace a file of the same name on the server.
    pub overwrite: bool,
    /// Send `Identify` with this ID after GOOD (the outcome carries the answer).
    pub identity: Option<String>,
    /// Largest window the client accepts from the server.
    pub max_window: u64,
    /// Test hook: flip the first byte of this chunk after reading it, so that the
    /// server receives other bytes than the digest covers and must answer BAD.
    pub corrupt_chunk: Option<u32>,
    /// Offer the file as a copy of this identity's file ([`Msg::OfferFor`]): a
    /// replicator's upload, stored as the owner's (see
    /// [`Config::replicators`]). `overwrite` is then ignored.
    pub copy_for: Option<String>,
}

impl Default for SendOptions {
    fn default() -> Self {
        SendOptions {
            alg: HashAlg::Sha256,
            overwrite: false,
            identity: None,
            max_window: Config::DEFAULT_MAX_WINDOW,
            corrupt_chunk: None,
            copy_for: None,
        }
    }
}

/// How [`fetch_file`] receives.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// The digest the client asks for and verifies.
    pub alg: HashAlg,
    /// Replace a local file of the same name.
    pub overwrite: bool,
    /// Slots of the window the client grants.
    pub slots: u32,
    /// Bytes per slot (the chunk size).
    pub slot_len: u32,
    /// Largest file the client accepts.
    pub max_size: u64,
    /// Store the fetched file as this identity's (its owner attribute, see
    /// `ownership.rs`): a replicator fetching into a store keeps the owner of the
    /// file it copies.
    pub copy_for: Option<String>,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            alg: HashAlg::Sha256,
            overwrite: false,
            slots: Config::DEFAULT_SLOTS,
            slot_len: Config::DEFAULT_SLOT_LEN,
            max_size: Config::DEFAULT_MAX_SIZE,
            copy_for: None,
        }
    }
}

/// What the driver reports while a transfer runs (for progress bars, timing, and tests
/// that need the granted window).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Progress<'a> {
    /// The offer: sent (upload, after hashing the file) or received (download).
    Offer(&'a FileOffer),
    /// The window the chunks go through: granted by the server (upload) or by this
    /// client (download).
    Window(&'a WindowGrant),
    /// File bytes moved so far: chunks whose WRITE completed (upload) or that arrived
    /// (download).
    Bytes {
        /// Bytes so far.
        done: u64,
        /// The file's length.
        total: u64,
    },
}

/// Sends the file at `path` as `name`: hashes it (on a thread of its own, so the
/// caller's executor keeps running), offers it, writes it through the server's window,
/// and returns the outcome ([`Outcome::Delivered`] for GOOD, [`Outcome::Bad`],
/// [`Outcome::Rejected`]).
///
/// # Errors
///
/// The file cannot be read, a bad name, a protocol error, a failed WRITE or a closed
/// connection; the connection is closed then.
pub async fn send_file<T: Transport>(
    conn: &ClientConnection<T>,
    path: &Path,
    name: &str,
    opts: &SendOptions,
    progress: impl FnMut(Progress<'_>),
) -> Result<Outcome, ClientError> {
    let (path_owned, name_owned, alg, overwrite) =
        (path.to_owned(), name.to_owned(), opts.alg, opts.overwrite);
    let hashed = off_thread(move || Sender::from_file(&path_owned, &name_owned, alg, overwrite))
        .await
        .unwrap_or_else(|_| Err(TransferError::Invalid("hashing the file panicked".into())))?;
    let mut sender = hashed.with_max_window(opts.max_window);
    if let Some(id) = &opts.identity {
        sender = sender.with_identity(id.clone());
    }
    if let Some(owner) = &opts.copy_for {
        sender = sender.for_owner(owner.clone());
    }
    let mut drive = Drive::new(conn, None, progress);
    drive.corrupt = opts.corrupt_chunk;
    (drive.progress)(Progress::Offer(sender.offer()));
    drive.total = sender.offer().len;
    finish(conn, drive.run(&mut sender).await).await
}

/// Fetches the file `name` from the server into `dir` (same name), verified with
/// `opts.alg`, through a window this client registers; returns the outcome
/// ([`Outcome::Stored`], [`Outcome::Bad`], [`Outcome::Rejected`]). Like an upload on
/// the server, the file appears under its name only once verified.
///
/// # Errors
///
/// A bad name, a protocol error, a local file-system error, a failed registration or
/// a closed connection; the connection is closed then and no partial file is left.
pub async fn fetch_file<T: Transport>(
    conn: &ClientConnection<T>,
    client: &Client<T>,
    name: &str,
    dir: &Path,
    opts: &FetchOptions,
    progress: impl FnMut(Progress<'_>),
) -> Result<Outcome, ClientError> {
    let config = Config::new(PathBuf::from(dir))
        .with_window(opts.slots, opts.slot_len)
        .with_max_size(opts.max_size);
    let mut receiver = Receiver::fetch(Arc::new(config), name, opts.alg, opts.overwrite)?;
    if let Some(owner) = &opts.copy_for {
        receiver.set_copy_owner(owner.clone());
    }
    let drive = Drive::new(conn, Some(client), progress);
    finish(conn, drive.run(&mut receiver).await).await
}

/// Closes the connection after an error (see the module docs).
pub(super) async fn finish<T: Transport>(
    conn: &ClientConnection<T>,
    res: Result<Outcome, ClientError>,
) -> Result<Outcome, ClientError> {
    if res.is_err() {
        conn.clone().close().await;
    }
    res
}

type Pending<'c, T> = Pin<Box<dyn Future<Output = T> + Send + 'c>>;

/// One chunk WRITE on its way.
struct InFlight<'c, T: Transport> {
    index: u32,
    slot: u32,
    len: u32,
    /// Hands the slot's staging buffer back when the WRITE completed.
    reply: Pending<'c, Result<T::Region, RequestError>>,
}

/// What the driver waits for.
enum Event<T: Transport> {
    Written {
        index: u32,
        slot: u32,
        len: u32,
        result: Result<T::Region, RequestError>,
    },
    Received(Option<Incoming>),
    /// The chunks handed to a consume job were hashed and stored (`Err`: it panicked).
    Consumed(std::thread::Result<Consumed>),
}

/// The loop shared by both directions: carry out outputs, wait for the next event,
/// feed it in.
struct Drive<'c, P, T: Transport = Verbs> {
    conn: &'c ClientConnection<T>,
    /// Registers the download window.
    client: Option<&'c Client<T>>,
    progress: P,
    writes: Vec<InFlight<'c, T>>,
    /// WRITEs that completed on their first poll.
    ready: VecDeque<Event<T>>,
    /// Kept across waits, so no message is ever lost between two of them.
    recv: Option<Pending<'c, Option<Incoming>>>,
    window: Option<T::Region>,
    /// An upload's staging buffers, by slot, while no WRITE uses them: each chunk is
    /// read from the file straight into its slot's buffer and written from there.
    staging: HashMap<u32, T::Region>,
    /// Received chunks being hashed and stored on a thread of their own (downloads).
    consume: Option<Pending<'c, std::thread::Result<Consumed>>>,
    corrupt: Option<u32>,
    done: u64,
    total: u64,
}

impl<'c, P: FnMut(Progress<'_>), T: Transport> Drive<'c, P, T> {
    fn new(conn: &'c ClientConnection<T>, client: Option<&'c Client<T>>, progress: P) -> Self {
        Drive {
            conn,
            client,
            progress,
            writes: Vec::new(),
            ready: VecDeque::new(),
            recv: None,
            window: None,
            staging: HashMap::new(),
            consume: None,
            corrupt: None,
            done: 0,
            total: 0,
        }
    }

    async fn run(mut self, ep: &mut dyn Endpoint) -> Result<Outcome, ClientError> {
        loop {
            if let Some(outcome) = self.carry_out(ep).await? {
                // WRITEs of the last chunks may complete after the verdict; wait for
                // them so that nothing of this transfer is left on the connection.
                // Their results no longer matter. Messages are not taken meanwhile:
                // they would belong to the caller's next transfer.
                while !self.writes.is_empty() || !self.ready.is_empty() {
                    let _ = self.next_event(false).await;
                }
                return Ok(outcome);
            }
            match self.next_event(true).await {
                Event::Written {
                    index,
                    slot,
                    len,
                    result,
                } => {
                    let buffer = result.map_err(|source| ClientError::Write { index, source })?;
                    self.staging.insert(slot, buffer);
                    ep.handle_write_done(index)?;
                    self.moved(u64::from(len));
                }
                Event::Consumed(consumed) => {
                    let consumed = consumed.map_err(|_| {
                        TransferError::Driver("hashing and storing chunks panicked".into())
                    })?;
                    ep.handle_consumed(consumed)?;
                }
                Event::Received(None) => return Err(ClientError::Closed),
                Event::Received(Some(msg)) => match msg.imm {
                    Some(index) => {
                        let window =
                            self.window
                                .as_ref()
                                .ok_or_else(|| TransferError::Unexpected {
                                    what: format!("chunk {index}"),
                                    state: "without a window",
                                })?;
                        let range = ep.chunk_range(index)?;
                        let len = range.len() as u64;
                        window
                            .with_bytes(range, |bytes| ep.handle_chunk(index, bytes))
                            .ok_or_else(|| {
                                TransferError::Driver(format!("chunk {index} outside the window"))
                            })??;
                        self.moved(len);
                    }
                    None => {
                        let m = Msg::decode(&msg.data)?;
                        match &m {
                            Msg::Offer(offer) => {
                                self.total = offer.len;
                                (self.progress)(Progress::Offer(offer));
                            }
                            Msg::Grant {
                                window: Some(grant),
                            } => (self.progress)(Progress::Window(grant)),
                            _ => {}
                        }
                        ep.handle_msg(m)?;
                    }
                },
            }
        }
    }

    fn moved(&mut self, len: u64) {
        self.done += len;
        (self.progress)(Progress::Bytes {
            done: self.done,
            total: self.total,
        });
    }

    /// Carries out the endpoint's outputs in order; returns the outcome once finished.
    async fn carry_out(&mut self, ep: &mut dyn Endpoint) -> Result<Option<Outcome>, ClientError> {
        let mut finished = None;
        while let Some(out) = ep.poll_output() {
            match out {
                Output::Send(msg) => {
                    if let Msg::Grant {
                        window: Some(grant),
                    } = &msg
                    {
                        (self.progress)(Progress::Window(grant));
                    }
                    let what = msg.kind();
                    self.conn
                        .send(msg.encode())
                        .await
                        .map_err(|source| ClientError::Send { what, source })?;
                }
                Output::GrantWindow { len } => {
                    let client = self.client.ok_or_else(|| {
                        TransferError::Driver("a window asked for while sending".into())
                    })?;
                    let bytes = usize::try_from(len)
                        .map_err(|_| TransferError::Invalid(format!("window of {len} bytes")))?;
                    let mr = client.register(bytes, Access::REMOTE_WRITE).map_err(|e| {
                        ClientError::Register {
                            len,
                            source: Box::new(e),
                        }
                    })?;
                    let r = mr.remote();
                    self.window = Some(mr);
                    ep.handle_window(RemoteWindow {
                        addr: r.addr,
                        len: r.len,
                        rkey: r.rkey,
                    })?;
                }
                // Dropping the region deregisters it: the rkey is dead from here on.
                Output::Revoke => self.window = None,
                // Each slot's buffer is registered when the slot is first used.
                Output::Stage { .. } => self.staging.clear(),
                Output::WriteChunk(chunk) => {
                    let len = chunk.len as usize;
                    // The state machine reuses a slot only after its WRITE completed, so
                    // its buffer is back (the first chunk of a slot is never the short
                    // last one unless there are no more).
                    let mut buffer = match self.staging.remove(&chunk.slot) {
                        Some(b) if b.len() >= len => b,
                        _ => self.conn.register(len.max(1), Access::NONE).map_err(|e| {
                            ClientError::Register {
                                len: chunk.len.into(),
                                source: Box::new(e),
                            }
                        })?,
                    };
                    let corrupt = self.corrupt == Some(chunk.index);
                    buffer
                        .with_bytes_mut(0..len, |data| {
                            ep.fill_chunk(&chunk, data)?;
                            if corrupt && !ep.stopped_sending() {
                                data[0] ^= 0xff;
                            }
                            Ok::<_, TransferError>(())
                        })
                        .ok_or_else(|| {
                            TransferError::Driver("chunk outside its buffer".into())
                        })??;
                    if ep.stopped_sending() {
                        // Reading the file failed and the transfer was aborted (the
                        // receiver is told why): this chunk is not sent.
                        self.staging.insert(chunk.slot, buffer);
                        continue;
                    }
                    let dst = RemoteRegion {
                        addr: chunk.remote.addr,
                        len: chunk.remote.len,
                        rkey: chunk.remote.rkey,
                    };
                    let mut reply: Pending<'c, _> =
                        Box::pin(self.conn.write_from(buffer, 0..len, dst, Some(chunk.imm())));
                    // The WRITE is queued on the connection when its future is first
                    // polled. Poll it now, so chunks and the Done after them reach the
                    // queue pair in the order the state machine emitted them.
                    match poll_fn(|cx| Poll::Ready(reply.as_mut().poll(cx))).await {
                        Poll::Ready(result) => self.ready.push_back(Event::Written {
                            index: chunk.index,
                            slot: chunk.slot,
                            len: chunk.len,
                            result,
                        }),
                        Poll::Pending => self.writes.push(InFlight {
                            index: chunk.index,
                            slot: chunk.slot,
                            len: chunk.len,
                            reply,
                        }),
                    }
                }
                // Hashing and writing run on a thread of their own while this loop
                // keeps taking chunks (and releasing their slots), so the server keeps
                // writing and the executor that runs the connections is never blocked.
                Output::Consume => {
                    if let Some(job) = ep.take_consume() {
                        self.consume = Some(Box::pin(off_thread(move || job.run())));
                    }
                }
                Output::Prepare | Output::Delete => {
                    return Err(TransferError::Driver(
                        "a client never serves a fetch or a delete".into(),
                    )
                    .into());
                }
                Output::Admit { .. } => {
                    return Err(
                        TransferError::Driver("a client keeps no upload quotas".into()).into(),
                    );
                }
                Output::Commit => {
                    let temp = ep.take_commit().ok_or_else(|| {
                        TransferError::Driver("a commit asked for without a file".into())
                    })?;
                    let target = temp.target().to_owned();
                    // fsync and rename block: not on the thread that runs the actors.
                    let result = off_thread(move || temp.commit()).await.unwrap_or_else(|_| {
                        Err(StoreError::Io {
                            op: "commit",
                            path: target,
                            source: std::io::Error::other("the commit panicked"),
                        })
                    });
                    ep.handle_committed(result)?;
                }
                Output::Finished(outcome) => {
                    self.window = None;
                    self.staging.clear();
                    finished = Some(outcome);
                }
            }
        }
        Ok(finished)
    }

    /// The next completed WRITE or (with `messages`) received message, whichever comes
    /// first.
    async fn next_event(&mut self, messages: bool) -> Event<T> {
        if let Some(e) = self.ready.pop_front() {
            return e;
        }
        let conn = self.conn;
        let mut recv = messages.then(|| self.recv.get_or_insert_with(|| Box::pin(conn.recv())));
        let writes = &mut self.writes;
        let consume = &mut self.consume;
        let event = poll_fn(|cx| {
            if let Some(job) = consume.as_mut() {
                if let Poll::Ready(consumed) = job.as_mut().poll(cx) {
                    *consume = None;
                    return Poll::Ready(Event::Consumed(consumed));
                }
            }
            for i in 0..writes.len() {
                if let Poll::Ready(result) = writes[i].reply.as_mut().poll(cx) {
                    let w = writes.remove(i);
                    return Poll::Ready(Event::Written {
                        index: w.index,
                        slot: w.slot,
                        len: w.len,
                        result,
                    });
                }
            }
            match recv.as_mut() {
                Some(r) => r.as_mut().poll(cx).map(Event::Received),
                None => Poll::Pending,
            }
        })
        .await;
        if matches!(event, Event::Received(_)) {
            self.recv = None;
        }
        event
    }
}

/// Runs `f` on a new thread and waits for it without blocking the executor (the
/// services crate has no runtime of its own to offload to). `Err` if `f` panicked.
async fn off_thread<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::Result<T> {
    struct Slot<T> {
        result: Option<std::thread::Result<T>>,
        waker: Option<Waker>,
    }
    let slot = Arc::new(Mutex::new(Slot {
        result: None,
        waker: None,
    }));
    let theirs = Arc::clone(&slot);
    let spawned = std::thread::Builder::new()
        .name("ft-hash".into())
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let mut s = theirs.lock().unwrap_or_else(|p| p.into_inner());
            s.result = Some(r);
            if let Some(w) = s.waker.take() {
                w.wake();
            }
        });
    if let Err(e) = spawned {
        return Err(Box::new(e));
    }
    poll_fn(|cx| {
        let mut s = slot.lock().unwrap_or_else(|p| p.into_inner());
        match s.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Context, Wake};

    use super::*;

    /// A minimal executor: polls on wake-ups until ready.
    fn block_on<F: Future>(fut: F) -> F::Output {
        struct Flag(AtomicBool, std::thread::Thread);
        impl Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::SeqCst);
                self.1.unpark();
            }
        }
        let flag = Arc::new(Flag(AtomicBool::new(false), std::thread::current()));
        let waker = Waker::from(Arc::clone(&flag));
        let mut cx = Context::from_waker(&waker);
        let mut fut = std::pin::pin!(fut);
        loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
            while !flag.0.swap(false, Ordering::SeqCst) {
                std::thread::park();
            }
        }
    }

    #[test]
    fn off_thread_returns_results_and_reports_panics() {
        let v = block_on(off_thread(|| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            7
        }));
        assert_eq!(v.unwrap(), 7);
        let r = block_on(off_thread(|| -> u32 { panic!("boom") }));
        assert!(r.is_err());
    }
}
