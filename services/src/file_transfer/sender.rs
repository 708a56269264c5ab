//! The sending side: offers a file, then pushes it through the receiver's window with
//! up to `slots` chunk WRITEs in flight, says DONE, takes the verdict and, if it has an
//! ID, identifies itself. Plays the client for uploads ([`Sender::new`],
//! [`Sender::from_file`]) and the server for downloads ([`Sender::for_fetch`]).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Seek};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::endpoint::{unexpected, Auth, ChunkWrite, Endpoint, Outcome, Output};
use super::error::{Result, TransferError};
use super::hash::hash_reader;
use super::name::validate_name;
use super::store::{open_source, StoreError};
use super::wire::{
    chunk_count, chunk_len, FileOffer, HashAlg, Msg, RejectReason, WindowGrant, MAX_CHUNKS,
    MAX_GRANT_SLOTS, MIN_GRANT_SLOT_LEN,
};
use super::Config;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// `Offer` sent; waiting for `Grant` or `Reject`.
    Offered,
    /// Writing chunks.
    Sending,
    /// `Done` sent; waiting for `Good` or `Bad`.
    AwaitVerdict,
    /// `Identify` sent; waiting for `Secret` or `Refused`.
    Identifying,
    /// Reading the file failed and `Abort` went out: waiting for the receiver's
    /// `Abort` in answer (the Acks it sent meanwhile are dropped), so that nothing of
    /// this transfer reaches the next one.
    Aborting,
    /// Over.
    Finished,
    /// An error ended the transfer.
    Failed,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Offered => "waiting for the grant",
            State::Sending => "sending chunks",
            State::AwaitVerdict => "waiting for the verdict",
            State::Identifying => "waiting for the answer to Identify",
            State::Aborting => "aborted, waiting for the receiver's answer",
            State::Finished => "finished",
            State::Failed => "failed",
        }
    }
}

/// The chunk currently using a slot.
#[derive(Debug, Clone, Copy)]
struct SlotUse {
    index: u64,
    /// Its WRITE completed locally, so the staging bytes may be overwritten.
    written: bool,
}

/// Chunks through the granted window. A slot can take chunk `n` once chunk `n - slots`
/// is both acknowledged by the receiver (remote slot consumed) and completed locally
/// (staging slot no longer read by the NIC).
#[derive(Debug)]
struct Pipeline {
    grant: WindowGrant,
    chunks: u64,
    /// Chunks handed out as `WriteChunk`.
    issued: u64,
    /// Chunks filled by the driver (so possibly posted).
    filled: u64,
    /// Every chunk below this is consumed by the receiver.
    acked: u64,
    slots: Vec<Option<SlotUse>>,
}

impl Pipeline {
    fn slot_free_for(&self, n: u64) -> bool {
        match self.slots[(n % u64::from(self.grant.slots)) as usize] {
            None => true,
            Some(u) => u.written && u.index < self.acked,
        }
    }
}

/// The sending state machine (see [`Endpoint`] for how to drive it).
///
/// Message flow, one transfer:
///
/// ```text
/// Offer → · Grant ← · [WRITE_WITH_IMM(i) → · Ack ←]* · Done → · Good|Bad ← · (Identify → · Secret|Refused ←)
/// ```
///
/// The grant is checked against the offer and against the largest window the sender
/// stages (`max_window`); the receiver's acknowledgements must be cumulative and cover
/// only chunks that were written.
pub struct Sender {
    offer: FileOffer,
    /// `None` while a [`ReadJob`] has it.
    source: Option<Box<dyn Read + Send>>,
    identity: Option<String>,
    max_window: u64,
    /// Smallest slot accepted (unless the file is smaller).
    min_slot_len: u32,
    state: State,
    pipe: Option<Pipeline>,
    out: VecDeque<Output>,
    /// Why this sender aborted (while [`State::Aborting`]).
    aborting: Option<RejectReason>,
    /// See [`Sender::fetched_key`].
    fetched_key: Option<super::digests::FileKey>,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("offer", &self.offer)
            .field("identity", &self.identity)
            .field("state", &self.state)
            .field("pipe", &self.pipe)
            .finish_non_exhaustive()
    }
}

impl Sender {
    /// A sender of `offer`, reading its bytes in order from `source` (exactly
    /// `offer.len` of them). Its first output is the `Offer` message.
    ///
    /// # Errors
    ///
    /// The offered name is not a plain file name.
    pub fn new(offer: FileOffer, source: Box<dyn Read + Send>) -> Result<Sender> {
        validate_name(&offer.name)?;
        let mut out = VecDeque::new();
        out.push_back(Output::Send(Msg::Offer(offer.clone())));
        Ok(Sender {
            offer,
            source: Some(source),
            identity: None,
            max_window: Config::DEFAULT_MAX_WINDOW,
            min_slot_len: MIN_GRANT_SLOT_LEN,
            state: State::Offered,
            pipe: None,
            out,
            aborting: None,
            fetched_key: None,
        })
    }

    /// A sender of the file at `path`, offered as `name`: hashes it with `alg` first
    /// (reading it whole), then sends it.
    ///
    /// # Errors
    ///
    /// A bad name, or the file cannot be read.
    pub fn from_file(path: &Path, name: &str, alg: HashAlg, overwrite: bool) -> Result<Sender> {
        validate_name(name)?;
        let file = File::open(path).map_err(TransferError::Source)?;
        let (file, offer) = hashed(file, name, alg, overwrite, &AtomicBool::new(false))
            .map_err(TransferError::Source)?;
        Sender::new(offer, Box::new(file))
    }

    /// The server's side of a download: the file `name` in `dir`, hashed with `alg`.
    /// Hashing reads the whole file before returning.
    ///
    /// # Errors
    ///
    /// The reason to send back in a `Reject`: a bad name, no such regular file, or a
    /// file that cannot be read.
    pub fn for_fetch(
        dir: &Path,
        name: &str,
        alg: HashAlg,
    ) -> std::result::Result<Sender, RejectReason> {
        Sender::for_fetch_cancellable(dir, name, alg, &AtomicBool::new(false))
    }

    /// [`for_fetch`](Self::for_fetch) that gives up, with `Unavailable`, as soon as
    /// `cancel` is set: hashing a file of up to [`Config::max_size`] takes long, and a
    /// client that left should not keep a blocking-pool thread reading for it.
    ///
    /// # Errors
    ///
    /// As [`for_fetch`](Self::for_fetch), and `Unavailable` once cancelled.
    pub fn for_fetch_cancellable(
        dir: &Path,
        name: &str,
        alg: HashAlg,
        cancel: &AtomicBool,
    ) -> std::result::Result<Sender, RejectReason> {
        let file = open_fetched(dir, name)?;
        let (file, offer) = hashed(file, name, alg, false, cancel).map_err(unavailable)?;
        Sender::for_fetched(offer, file)
    }

    /// The sender of a fetched file already opened (by [`open_fetched`]) and whose
    /// digest is known: `offer.len` bytes of `file` are sent from its start.
    pub(crate) fn for_fetched(
        offer: FileOffer,
        file: File,
    ) -> std::result::Result<Sender, RejectReason> {
        Sender::new(offer, Box::new(file)).map_err(|e| RejectReason::BadName {
            reason: e.to_string(),
        })
    }

    /// Remembers where the offered digest came from, so that the service can forget
    /// it if the receiver finds it wrong ([`fetched_key`](Self::fetched_key)).
    pub(crate) fn with_fetched_key(mut self, key: super::digests::FileKey) -> Sender {
        self.fetched_key = Some(key);
        self
    }

    /// The key, in the service's digest store, of the file this sender serves (set
    /// for fetches served by a `FileTransfer`).
    pub fn fetched_key(&self) -> Option<&super::digests::FileKey> {
        self.fetched_key.as_ref()
    }

    /// Sends `Identify { id }` after GOOD.
    pub fn with_identity(mut self, id: impl Into<String>) -> Sender {
        self.identity = Some(id.into());
        self
    }

    /// Accepts grants of at most `max` bytes (default [`Config::DEFAULT_MAX_WINDOW`]);
    /// the staging buffer has the size of the slots the file can use at once.
    pub fn with_max_window(mut self, max: u64) -> Sender {
        self.max_window = max;
        self
    }

    /// Accepts slots as small as `len` bytes (default [`MIN_GRANT_SLOT_LEN`]). Tiny
    /// chunks cost a WRITE and an acknowledgement each: for tests and experiments.
    pub fn with_min_slot_len(mut self, len: u32) -> Sender {
        self.min_slot_len = len;
        self
    }

    /// What is being offered.
    pub fn offer(&self) -> &FileOffer {
        &self.offer
    }

    /// Chunks written but not yet known to be consumed (at most `slots`).
    pub fn chunks_in_flight(&self) -> u64 {
        self.pipe.as_ref().map_or(0, |p| p.issued - p.acked)
    }

    fn fail<T>(&mut self, e: TransferError) -> Result<T> {
        self.state = State::Failed;
        Err(e)
    }

    fn finish(&mut self, outcome: Outcome) {
        self.out.push_back(Output::Finished(outcome));
        self.state = State::Finished;
    }

    fn check_grant(
        &self,
        window: Option<WindowGrant>,
    ) -> std::result::Result<Option<Pipeline>, String> {
        let len = self.offer.len;
        let Some(grant) = window else {
            return if len == 0 {
                Ok(None)
            } else {
                Err(format!("no window for a file of {len} bytes"))
            };
        };
        if len == 0 {
            return Err("a window for an empty file".into());
        }
        if grant.slots == 0 || grant.slot_len == 0 {
            return Err(format!("{} slots of {} bytes", grant.slots, grant.slot_len));
        }
        if grant.slots > MAX_GRANT_SLOTS {
            return Err(format!(
                "{} slots, more than the {MAX_GRANT_SLOTS} accepted",
                grant.slots
            ));
        }
        let floor = u64::from(self.min_slot_len).min(len);
        if u64::from(grant.slot_len) < floor {
            return Err(format!(
                "slots of {} bytes, fewer than the {floor} required",
                grant.slot_len
            ));
        }
        let window_len = u64::from(grant.slots) * u64::from(grant.slot_len);
        if grant.region.len != window_len {
            return Err(format!(
                "region of {} bytes for {} slots of {} bytes",
                grant.region.len, grant.slots, grant.slot_len
            ));
        }
        // The last byte of the window must be addressable: a peer-chosen address near
        // u64::MAX would make every slot's address overflow.
        if grant.region.addr.checked_add(window_len).is_none() {
            return Err(format!(
                "window of {window_len} bytes at {:#x} wraps around the address space",
                grant.region.addr
            ));
        }
        if window_len > self.max_window || usize::try_from(window_len).is_err() {
            return Err(format!(
                "window of {window_len} bytes, more than the {} accepted",
                self.max_window
            ));
        }
        let chunks = chunk_count(len, grant.slot_len);
        if chunks > MAX_CHUNKS {
            return Err(format!("{chunks} chunks do not fit 32-bit indices"));
        }
        // Only this many slots ever hold a chunk (chunk `n` uses slot `n % slots`, and
        // with fewer chunks than slots that is `n` itself): the slot state and the
        // staging buffer are sized by it, not by the grant.
        let in_flight = u64::from(grant.slots).min(chunks) as usize;
        Ok(Some(Pipeline {
            grant,
            chunks,
            issued: 0,
            filled: 0,
            acked: 0,
            slots: vec![None; in_flight],
        }))
    }

    /// Hands out every chunk that has a free slot; `Done` after the last one.
    ///
    /// # Errors
    ///
    /// [`TransferError::BadGrant`] if a slot falls outside the granted window (which
    /// `check_grant` rules out; checked again because the window is the peer's word).
    fn issue(&mut self) -> Result<()> {
        if self.state != State::Sending {
            return Ok(());
        }
        if let Some(p) = &mut self.pipe {
            while p.issued < p.chunks && p.slot_free_for(p.issued) {
                let index = p.issued;
                let slot = (index % u64::from(p.grant.slots)) as u32;
                let offset = u64::from(slot) * u64::from(p.grant.slot_len);
                let len = chunk_len(self.offer.len, p.grant.slot_len, index);
                let Some(remote) = p.grant.region.slice(offset, u64::from(len)) else {
                    let e = TransferError::BadGrant(format!(
                        "chunk {index} ({len} bytes at offset {offset}) outside the window"
                    ));
                    return self.fail(e);
                };
                p.slots[slot as usize] = Some(SlotUse {
                    index,
                    written: false,
                });
                p.issued += 1;
                self.out.push_back(Output::WriteChunk(ChunkWrite {
                    index: index as u32,
                    slot,
                    offset,
                    len,
                    remote,
                }));
            }
            if p.issued < p.chunks {
                return Ok(());
            }
        }
        self.out.push_back(Output::Send(Msg::Done));
        self.state = State::AwaitVerdict;
        Ok(())
    }

    /// Checks that `chunk` is the next one to fill and `len` its length; returns its
    /// offset in the file.
    fn check_fill(&mut self, chunk: &ChunkWrite, len: usize) -> Result<u64> {
        let ok_state = !matches!(self.state, State::Offered | State::Failed);
        let Some(p) = self.pipe.as_mut().filter(|_| ok_state) else {
            let e = unexpected(self, format!("fill of chunk {}", chunk.index));
            return self.fail(e);
        };
        let index = u64::from(chunk.index);
        if index != p.filled || index >= p.issued {
            let e = TransferError::Driver(format!(
                "fill of chunk {}, expected chunk {} (issued {})",
                chunk.index, p.filled, p.issued
            ));
            return self.fail(e);
        }
        let expected = chunk_len(self.offer.len, p.grant.slot_len, index);
        if len != expected as usize || chunk.len != expected {
            let e = TransferError::Driver(format!(
                "chunk {} is {expected} bytes, given {len} to fill",
                chunk.index,
            ));
            return self.fail(e);
        }
        Ok(index * u64::from(p.grant.slot_len))
    }

    /// Counts the next chunk as filled (so it may be acknowledged), or fails with the
    /// source's error.
    fn filled(&mut self, at: u64, result: io::Result<()>) -> Result<()> {
        if let Some(p) = self.pipe.as_mut() {
            p.filled += 1;
        }
        if let Err(e) = result {
            let e = match e.kind() {
                io::ErrorKind::UnexpectedEof => TransferError::SourceTruncated {
                    at,
                    len: self.offer.len,
                },
                _ => TransferError::Source(e),
            };
            // The receiver hears why ([`Msg::Abort`], after the WRITEs already posted)
            // instead of seeing the connection close; the chunk just read is not sent
            // (the driver checks `is_finished` before posting it).
            tracing::warn!(error = %e, "reading the file being sent failed; aborting the transfer");
            self.abort(RejectReason::Unavailable {
                reason: e.to_string(),
            });
        }
        Ok(())
    }

    /// Ends the transfer midway for `reason`: no more chunks, `Abort` to the receiver
    /// (it follows the WRITEs already posted, so the receiver may revoke its window on
    /// it), then wait for the receiver's `Abort` in answer.
    fn abort(&mut self, reason: RejectReason) {
        self.out.retain(|o| !matches!(o, Output::WriteChunk(_)));
        self.out.push_back(Output::Send(Msg::Abort {
            reason: reason.clone(),
        }));
        self.aborting = Some(reason);
        self.state = State::Aborting;
    }

    fn ack(&mut self, next: u32) -> Result<()> {
        let bad = |why: String| TransferError::BadAck { next, why };
        let Some(p) = &mut self.pipe else {
            return self.fail(bad("no chunks were written".into()));
        };
        let n = u64::from(next);
        if n <= p.acked {
            let e = bad(format!(
                "chunks below {} were acknowledged already",
                p.acked
            ));
            return self.fail(e);
        }
        if n > p.filled {
            let e = bad(format!("only {} chunks were written", p.filled));
            return self.fail(e);
        }
        p.acked = n;
        self.issue()
    }
}

/// One chunk to read from the file, off the thread that serves the connection: it owns
/// the sender's source while it runs. Get it with [`Endpoint::take_read`] for an
/// [`Output::WriteChunk`], run it, and hand the result to [`Endpoint::handle_read`],
/// which gives back the bytes to copy into the chunk's range of the staging buffer.
pub struct ReadJob {
    source: Box<dyn Read + Send>,
    index: u32,
    at: u64,
    len: u32,
}

impl std::fmt::Debug for ReadJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadJob")
            .field("index", &self.index)
            .field("at", &self.at)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl ReadJob {
    /// Reads the chunk (blocks on the file).
    pub fn run(mut self) -> ChunkRead {
        let mut bytes = vec![0; self.len as usize];
        let result = self.source.read_exact(&mut bytes).map(|()| bytes);
        ChunkRead {
            source: self.source,
            index: self.index,
            at: self.at,
            result,
        }
    }

    /// The chunk it reads.
    pub fn index(&self) -> u32 {
        self.index
    }
}

/// What a [`ReadJob`] read: hand it to [`Endpoint::handle_read`].
pub struct ChunkRead {
    source: Box<dyn Read + Send>,
    index: u32,
    at: u64,
    result: io::Result<Vec<u8>>,
}

impl std::fmt::Debug for ChunkRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkRead")
            .field("index", &self.index)
            .field("at", &self.at)
            .field("result", &self.result.as_ref().map(Vec::len))
            .finish_non_exhaustive()
    }
}

/// A reader that fails once `cancel` is set, checked before every read.
struct Cancellable<'a, R> {
    inner: R,
    cancel: &'a AtomicBool,
}

impl<R: Read> Read for Cancellable<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(io::Error::other("cancelled: the client left"));
        }
        self.inner.read(buf)
    }
}

/// Hashes `file` whole (until `cancel` is set), rewinds it, and builds the offer.
/// Opens the file a `Fetch` asks for, or says why not in the words of a `Reject`.
pub(crate) fn open_fetched(dir: &Path, name: &str) -> std::result::Result<File, RejectReason> {
    let (file, _) = open_source(dir, name).map_err(|e| match e {
        StoreError::Name(e) => RejectReason::BadName {
            reason: e.to_string(),
        },
        StoreError::NotFound(_) => RejectReason::NotFound,
        e => RejectReason::Unavailable {
            reason: e.to_string(),
        },
    })?;
    Ok(file)
}

pub(crate) fn unavailable(e: io::Error) -> RejectReason {
    RejectReason::Unavailable {
        reason: e.to_string(),
    }
}

/// Hashes `file` from where it is to its end, then rewinds it: the offer of its bytes.
pub(crate) fn hashed(
    mut file: File,
    name: &str,
    alg: HashAlg,
    overwrite: bool,
    cancel: &AtomicBool,
) -> io::Result<(File, FileOffer)> {
    let (digest, len) = hash_reader(
        alg,
        Cancellable {
            inner: &mut file,
            cancel,
        },
    )?;
    file.rewind()?;
    let offer = FileOffer {
        name: name.to_owned(),
        len,
        digest,
        overwrite,
    };
    Ok((file, offer))
}

impl Endpoint for Sender {
    fn state_name(&self) -> &'static str {
        self.state.name()
    }

    fn handle_msg(&mut self, msg: Msg) -> Result<()> {
        match (self.state, msg) {
            (State::Offered, Msg::Grant { window }) => match self.check_grant(window) {
                Ok(pipe) => {
                    if let Some(p) = &pipe {
                        // Slot `s` stages at `s * slot_len`; with fewer chunks than
                        // slots the last one ends at the file's end.
                        let slots = p.slots.len() as u64 * u64::from(p.grant.slot_len);
                        self.out.push_back(Output::Stage {
                            len: slots.min(self.offer.len),
                        });
                    }
                    self.pipe = pipe;
                    self.state = State::Sending;
                    self.issue()
                }
                Err(why) => self.fail(TransferError::BadGrant(why)),
            },
            (State::Offered, Msg::Reject { reason }) => {
                self.finish(Outcome::Rejected(reason));
                Ok(())
            }
            (State::Sending | State::AwaitVerdict, Msg::Ack { next }) => self.ack(next),
            (State::AwaitVerdict, Msg::Good) => {
                match self.identity.clone() {
                    Some(id) => {
                        self.out.push_back(Output::Send(Msg::Identify { id }));
                        self.state = State::Identifying;
                    }
                    None => self.finish(Outcome::Delivered { auth: None }),
                }
                Ok(())
            }
            (State::AwaitVerdict, Msg::Bad { reason }) => {
                self.finish(Outcome::Bad(reason));
                Ok(())
            }
            // The receiver gave up midway (no space, an I/O error): stop writing. `Done`
            // follows the WRITEs already posted on the queue pair, so it tells the
            // receiver that nothing more lands in its window.
            (State::Sending, Msg::Abort { reason }) => {
                self.out.retain(|o| !matches!(o, Output::WriteChunk(_)));
                self.out.push_back(Output::Send(Msg::Done));
                self.finish(Outcome::Aborted(reason));
                Ok(())
            }
            (State::Offered | State::AwaitVerdict, Msg::Abort { reason }) => {
                self.finish(Outcome::Aborted(reason));
                Ok(())
            }
            // Acks the receiver sent before it saw our Abort: the slots no longer matter.
            (State::Aborting, Msg::Ack { .. }) => Ok(()),
            // The receiver's answer (or its own abort, crossing ours): over.
            (State::Aborting, Msg::Abort { .. }) => {
                let reason = self.aborting.take().expect("set with Aborting");
                self.finish(Outcome::Aborted(reason));
                Ok(())
            }
            (State::Identifying, Msg::Secret { key }) => {
                self.finish(Outcome::Delivered {
                    auth: Some(Auth::Secret(key)),
                });
                Ok(())
            }
            (State::Identifying, Msg::Refused) => {
                self.finish(Outcome::Delivered {
                    auth: Some(Auth::Refused),
                });
                Ok(())
            }
            (state, msg) => self.fail(TransferError::Unexpected {
                what: msg.kind().to_owned(),
                state: state.name(),
            }),
        }
    }

    fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    fn is_finished(&self) -> bool {
        self.state == State::Finished
    }

    fn waits_on_peer(&self) -> bool {
        matches!(
            self.state,
            State::Offered
                | State::Sending
                | State::AwaitVerdict
                | State::Identifying
                | State::Aborting
        )
    }

    fn give_up(&mut self, reason: RejectReason) {
        if !self.waits_on_peer() {
            return;
        }
        self.out.retain(|o| !matches!(o, Output::WriteChunk(_)));
        if self.state != State::Aborting {
            self.out.push_back(Output::Send(Msg::Abort {
                reason: reason.clone(),
            }));
        }
        self.finish(Outcome::Aborted(reason));
    }

    fn stopped_sending(&self) -> bool {
        matches!(
            self.state,
            State::Aborting | State::Finished | State::Failed
        )
    }

    fn fill_chunk(&mut self, chunk: &ChunkWrite, dst: &mut [u8]) -> Result<()> {
        let at = self.check_fill(chunk, dst.len())?;
        let Some(source) = self.source.as_mut() else {
            let e = TransferError::Driver(format!(
                "fill of chunk {} while a read job has the source",
                chunk.index
            ));
            return self.fail(e);
        };
        let result = source.read_exact(dst);
        self.filled(at, result)
    }

    fn take_read(&mut self, chunk: &ChunkWrite) -> Result<ReadJob> {
        let at = self.check_fill(chunk, chunk.len as usize)?;
        let Some(source) = self.source.take() else {
            let e = TransferError::Driver(format!(
                "read of chunk {} while another read job has the source",
                chunk.index
            ));
            return self.fail(e);
        };
        Ok(ReadJob {
            source,
            index: chunk.index,
            at,
            len: chunk.len,
        })
    }

    fn handle_read(&mut self, read: ChunkRead) -> Result<Vec<u8>> {
        let ChunkRead {
            source,
            index,
            at,
            result,
        } = read;
        if self.source.is_some() {
            let e =
                TransferError::Driver(format!("a read of chunk {index} that was never handed out"));
            return self.fail(e);
        }
        self.source = Some(source);
        let chunk = self.pipe.as_ref().map(|p| {
            let len = chunk_len(self.offer.len, p.grant.slot_len, u64::from(index));
            ChunkWrite {
                index,
                slot: 0,
                offset: 0,
                len,
                remote: p.grant.region,
            }
        });
        // The same checks as when it was handed out: still the next chunk to fill.
        let Some(chunk) = chunk else {
            let e = unexpected(self, format!("read of chunk {index}"));
            return self.fail(e);
        };
        let checked = self.check_fill(&chunk, chunk.len as usize)?;
        if checked != at {
            let e =
                TransferError::Driver(format!("read of chunk {index} at the wrong offset {at}"));
            return self.fail(e);
        }
        match result {
            Ok(bytes) if bytes.len() == chunk.len as usize => {
                self.filled(at, Ok(()))?;
                Ok(bytes)
            }
            Ok(bytes) => {
                let e = TransferError::Driver(format!(
                    "read of chunk {index} gave {} bytes, not {}",
                    bytes.len(),
                    chunk.len
                ));
                self.fail(e)
            }
            Err(e) => self.filled(at, Err(e)).map(|()| Vec::new()),
        }
    }

    fn handle_write_done(&mut self, index: u32) -> Result<()> {
        let ok_state = !matches!(self.state, State::Offered | State::Failed);
        let slot = self.pipe.as_mut().filter(|_| ok_state).and_then(|p| {
            let i = u64::from(index);
            let slot = (i % u64::from(p.grant.slots)) as usize;
            // The index is the driver's word: with fewer chunks than granted slots, a
            // slot past the file's chunks has no state at all.
            p.slots
                .get_mut(slot)?
                .as_mut()
                .filter(|u| u.index == i && !u.written && i < p.filled)
        });
        match slot {
            Some(u) => {
                u.written = true;
                self.issue()
            }
            None => {
                let e = TransferError::Driver(format!(
                    "completion of chunk {index}, which is not in flight"
                ));
                self.fail(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;
    use crate::file_transfer::hash::hash_bytes;
    use crate::file_transfer::wire::{BadReason, RemoteWindow};

    fn sender(data: &[u8]) -> Sender {
        let offer = FileOffer {
            name: "f".into(),
            len: data.len() as u64,
            digest: hash_bytes(HashAlg::Sha256, data),
            overwrite: false,
        };
        // Chunks of a few bytes keep these tests readable.
        Sender::new(offer, Box::new(Cursor::new(data.to_vec())))
            .unwrap()
            .with_min_slot_len(1)
    }

    fn drain(s: &mut Sender) -> Vec<Output> {
        std::iter::from_fn(|| s.poll_output()).collect()
    }

    fn grant(slots: u32, slot_len: u32) -> Msg {
        Msg::Grant {
            window: Some(WindowGrant {
                region: RemoteWindow {
                    addr: 1000,
                    len: u64::from(slots) * u64::from(slot_len),
                    rkey: 5,
                },
                slots,
                slot_len,
            }),
        }
    }

    fn writes(out: &[Output]) -> Vec<u32> {
        out.iter()
            .filter_map(|o| match o {
                Output::WriteChunk(c) => Some(c.index),
                _ => None,
            })
            .collect()
    }

    fn fill(s: &mut Sender, out: &[Output]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for o in out {
            if let Output::WriteChunk(c) = o {
                let mut buf = vec![0; c.len as usize];
                s.fill_chunk(c, &mut buf).unwrap();
                bytes.extend(buf);
            }
        }
        bytes
    }

    #[test]
    fn a_slot_is_reused_only_after_ack_and_local_completion() {
        let data = b"abcdefghij"; // 3 chunks of 4 through 2 slots
        let mut s = sender(data);
        assert!(matches!(
            drain(&mut s).as_slice(),
            [Output::Send(Msg::Offer(_))]
        ));
        s.handle_msg(grant(2, 4)).unwrap();
        let out = drain(&mut s);
        assert_eq!(out[0], Output::Stage { len: 8 });
        assert_eq!(writes(&out), vec![0, 1]);
        let Output::WriteChunk(c1) = out[2] else {
            panic!()
        };
        assert_eq!(
            (c1.slot, c1.offset, c1.len, c1.remote.addr, c1.remote.len),
            (1, 4, 4, 1004, 4)
        );
        assert_eq!(fill(&mut s, &out), b"abcdefgh");
        assert_eq!(s.chunks_in_flight(), 2);
        // Acked, not completed: slot 0 still busy locally.
        s.handle_msg(Msg::Ack { next: 1 }).unwrap();
        assert_eq!(drain(&mut s), vec![]);
        s.handle_write_done(0).unwrap();
        let out = drain(&mut s);
        assert_eq!(writes(&out), vec![2]);
        assert_eq!(out.last(), Some(&Output::Send(Msg::Done)));
        let Output::WriteChunk(c2) = out[0] else {
            panic!()
        };
        assert_eq!((c2.slot, c2.offset, c2.len), (0, 0, 2));
        assert_eq!(fill(&mut s, &out), b"ij");
        s.handle_write_done(1).unwrap();
        s.handle_write_done(2).unwrap();
        s.handle_msg(Msg::Good).unwrap();
        assert_eq!(
            drain(&mut s),
            vec![Output::Finished(Outcome::Delivered { auth: None })]
        );
        assert!(s.is_finished());
    }

    #[test]
    fn completion_before_ack_also_waits() {
        let mut s = sender(b"abcdefghij");
        drain(&mut s);
        s.handle_msg(grant(2, 4)).unwrap();
        let out = drain(&mut s);
        fill(&mut s, &out);
        s.handle_write_done(0).unwrap();
        assert_eq!(drain(&mut s), vec![]);
        s.handle_msg(Msg::Ack { next: 1 }).unwrap();
        assert_eq!(writes(&drain(&mut s)), vec![2]);
    }

    #[test]
    fn empty_files_go_straight_to_done() {
        let mut s = sender(b"");
        drain(&mut s);
        s.handle_msg(Msg::Grant { window: None }).unwrap();
        assert_eq!(drain(&mut s), vec![Output::Send(Msg::Done)]);
    }

    #[test]
    fn identity_is_sent_after_good() {
        for (answer, auth) in [
            (Msg::Secret { key: "k".into() }, Auth::Secret("k".into())),
            (Msg::Refused, Auth::Refused),
        ] {
            let mut s = sender(b"").with_identity("bob");
            drain(&mut s);
            s.handle_msg(Msg::Grant { window: None }).unwrap();
            s.handle_msg(Msg::Good).unwrap();
            assert_eq!(
                drain(&mut s),
                vec![
                    Output::Send(Msg::Done),
                    Output::Send(Msg::Identify { id: "bob".into() })
                ]
            );
            s.handle_msg(answer).unwrap();
            assert_eq!(
                drain(&mut s),
                vec![Output::Finished(Outcome::Delivered { auth: Some(auth) })]
            );
        }
    }

    #[test]
    fn rejections_and_bad_verdicts_finish() {
        let mut s = sender(b"x");
        s.handle_msg(Msg::Reject {
            reason: RejectReason::Exists,
        })
        .unwrap();
        assert!(s.is_finished());
        let mut s = sender(b"");
        s.handle_msg(Msg::Grant { window: None }).unwrap();
        let reason = BadReason::NotStored {
            reason: "disk".into(),
        };
        s.handle_msg(Msg::Bad {
            reason: reason.clone(),
        })
        .unwrap();
        assert_eq!(
            drain(&mut s).last(),
            Some(&Output::Finished(Outcome::Bad(reason)))
        );
    }

    #[test]
    fn bad_grants_are_refused() {
        let cases = [
            (b"x".as_slice(), Msg::Grant { window: None }),
            (b"".as_slice(), grant(1, 1)),
            (b"x".as_slice(), grant(0, 4)),
            (b"x".as_slice(), grant(2, 0)),
            (b"x".as_slice(), grant(1024, 1 << 20)), // 1 GiB > 64 MiB staging
        ];
        for (data, g) in cases {
            let mut s = sender(data);
            assert!(matches!(s.handle_msg(g), Err(TransferError::BadGrant(_))));
        }
        let mut s = sender(b"x");
        let Msg::Grant {
            window: Some(mut w),
        } = grant(1, 4)
        else {
            panic!()
        };
        w.region.len = 3;
        assert!(s.handle_msg(Msg::Grant { window: Some(w) }).is_err());
    }

    #[test]
    fn bad_acks_and_out_of_order_messages_are_errors() {
        let mut s = sender(b"abcdefghij");
        drain(&mut s);
        s.handle_msg(grant(2, 4)).unwrap();
        let out = drain(&mut s);
        // Ack of a chunk not yet written.
        let e = s.handle_msg(Msg::Ack { next: 1 }).unwrap_err();
        assert!(matches!(e, TransferError::BadAck { next: 1, .. }), "{e}");

        let mut s = sender(b"abcdefghij");
        s.handle_msg(grant(2, 4)).unwrap();
        fill(&mut s, &out);
        s.handle_msg(Msg::Ack { next: 1 }).unwrap();
        assert!(s.handle_msg(Msg::Ack { next: 1 }).is_err(), "repeated ack");

        let mut s = sender(b"x");
        let e = s.handle_msg(Msg::Good).unwrap_err();
        assert_eq!(e.to_string(), "unexpected Good while waiting for the grant");
        assert!(s.handle_msg(grant(1, 1)).is_err(), "failed for good");

        let mut s = sender(b"abcdefghij");
        s.handle_msg(grant(2, 4)).unwrap();
        let e = s.handle_msg(Msg::Good).unwrap_err();
        assert_eq!(e.to_string(), "unexpected Good while sending chunks");
    }

    #[test]
    fn driver_mistakes_are_caught() {
        let mut s = sender(b"abcdefghij");
        drain(&mut s);
        s.handle_msg(grant(2, 4)).unwrap();
        let out = drain(&mut s);
        let Output::WriteChunk(c1) = out[2] else {
            panic!()
        };
        assert!(s.fill_chunk(&c1, &mut [0; 4]).is_err(), "chunk 1 before 0");

        let mut s = sender(b"abcdefghij");
        s.handle_msg(grant(2, 4)).unwrap();
        assert!(s.handle_write_done(0).is_err(), "completion before fill");
    }

    /// A sender whose source holds 4 of the 8 bytes it offered, with its one chunk due.
    fn short_source() -> (Sender, ChunkWrite) {
        let offer = FileOffer {
            name: "f".into(),
            len: 8,
            digest: hash_bytes(HashAlg::Sha256, b"abcdefgh"),
            overwrite: false,
        };
        let mut s = Sender::new(offer, Box::new(Cursor::new(b"abcd".to_vec()))).unwrap();
        drain(&mut s);
        s.handle_msg(grant(1, 8)).unwrap();
        let out = drain(&mut s);
        let Output::WriteChunk(c) = out[1] else {
            panic!()
        };
        (s, c)
    }

    #[test]
    fn a_short_source_aborts_with_the_reason() {
        let (mut s, c) = short_source();
        s.fill_chunk(&c, &mut [0; 8]).unwrap();
        assert!(s.stopped_sending(), "the driver must not post the chunk");
        assert_short_source_abort(&mut s);
    }

    /// `Abort` with the reason goes out; Acks already on their way are dropped; the
    /// receiver's answering `Abort` ends the transfer.
    fn assert_short_source_abort(s: &mut Sender) {
        let out = drain(s);
        let reason = match out.as_slice() {
            [Output::Send(Msg::Abort { reason })] => reason.clone(),
            other => panic!("{other:?}"),
        };
        assert!(
            matches!(&reason, RejectReason::Unavailable { reason } if reason.contains("ended at byte 0 of 8")),
            "{reason}"
        );
        assert!(!s.is_finished());
        s.handle_msg(Msg::Ack { next: 1 }).unwrap();
        s.handle_msg(Msg::Abort {
            reason: reason.clone(),
        })
        .unwrap();
        assert_eq!(drain(s), vec![Output::Finished(Outcome::Aborted(reason))]);
        assert!(s.is_finished());
    }

    #[test]
    fn read_jobs_fill_chunks_in_order_off_the_state_machine() {
        let data = b"abcdefghij"; // 3 chunks of 4 through 2 slots
        let mut s = sender(data);
        drain(&mut s);
        s.handle_msg(grant(2, 4)).unwrap();
        let out = drain(&mut s);
        let chunks: Vec<ChunkWrite> = out
            .iter()
            .filter_map(|o| match o {
                Output::WriteChunk(c) => Some(*c),
                _ => None,
            })
            .collect();
        assert_eq!(chunks.len(), 2);
        let job = s.take_read(&chunks[0]).unwrap();
        assert_eq!(job.index(), 0);
        // The job owns what it needs: it runs with the state machine borrowed elsewhere.
        let read = std::thread::spawn(move || job.run()).join().unwrap();
        assert_eq!(s.handle_read(read).unwrap(), b"abcd");
        let read = s.take_read(&chunks[1]).unwrap().run();
        assert_eq!(s.handle_read(read).unwrap(), b"efgh");
        s.handle_msg(Msg::Ack { next: 2 }).unwrap();
        s.handle_write_done(0).unwrap();
        let out = drain(&mut s);
        let Some(Output::WriteChunk(c2)) = out.first().cloned() else {
            panic!("{out:?}")
        };
        assert_eq!((c2.index, c2.len), (2, 2));
        // Done follows the last WriteChunk: a driver holds it back until the read.
        assert_eq!(out.get(1), Some(&Output::Send(Msg::Done)));
        let read = s.take_read(&c2).unwrap().run();
        assert_eq!(s.handle_read(read).unwrap(), b"ij");
    }

    #[test]
    fn a_chunk_not_yet_read_cannot_be_acked_or_read_twice() {
        let mut s = sender(b"abcdefgh");
        drain(&mut s);
        s.handle_msg(grant(2, 4)).unwrap();
        let out = drain(&mut s);
        let [_, Output::WriteChunk(c0), Output::WriteChunk(c1), _] = out.as_slice() else {
            panic!("{out:?}")
        };
        let (c0, c1) = (*c0, *c1);
        let _job = s.take_read(&c0).unwrap();
        // Its read is out: the peer cannot have it yet.
        assert!(matches!(
            s.handle_msg(Msg::Ack { next: 1 }),
            Err(TransferError::BadAck { .. })
        ));

        let mut s = sender(b"abcdefgh");
        drain(&mut s);
        s.handle_msg(grant(2, 4)).unwrap();
        drain(&mut s);
        let _job = s.take_read(&c0).unwrap();
        assert!(matches!(s.take_read(&c1), Err(TransferError::Driver(_))));
        let mut s = sender(b"abcdefgh");
        drain(&mut s);
        s.handle_msg(grant(2, 4)).unwrap();
        drain(&mut s);
        assert!(s.take_read(&c1).is_err(), "chunk 1 before chunk 0");
    }

    #[test]
    fn a_short_source_aborts_in_a_read_job_too() {
        let (mut s, c) = short_source();
        let read = s.take_read(&c).unwrap().run();
        s.handle_read(read).unwrap();
        assert!(s.stopped_sending());
        assert_short_source_abort(&mut s);
    }

    /// Security issue item 7: a fetch kept hashing (up to 1 TiB) after its client left.
    /// A cancelled preparation stops at its next read.
    #[test]
    fn a_cancelled_fetch_stops_hashing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), vec![7u8; 1 << 20]).unwrap();
        let cancel = AtomicBool::new(true);
        let e =
            Sender::for_fetch_cancellable(dir.path(), "f", HashAlg::Sha256, &cancel).unwrap_err();
        assert!(
            matches!(&e, RejectReason::Unavailable { reason } if reason.contains("cancelled")),
            "{e}"
        );
    }

    #[test]
    fn files_are_hashed_for_the_offer_and_fetches_checked() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"abc").unwrap();
        let s = Sender::from_file(&dir.path().join("f"), "g", HashAlg::Blake3, true).unwrap();
        assert_eq!(s.offer().len, 3);
        assert_eq!(s.offer().name, "g");
        assert_eq!(s.offer().digest, hash_bytes(HashAlg::Blake3, b"abc"));
        assert!(s.offer().overwrite);

        let s = Sender::for_fetch(dir.path(), "f", HashAlg::Sha256).unwrap();
        assert_eq!(s.offer().digest, hash_bytes(HashAlg::Sha256, b"abc"));
        assert_eq!(
            Sender::for_fetch(dir.path(), "missing", HashAlg::Sha256).unwrap_err(),
            RejectReason::NotFound
        );
        assert!(matches!(
            Sender::for_fetch(dir.path(), "../f", HashAlg::Sha256).unwrap_err(),
            RejectReason::BadName { .. }
        ));
        assert!(Sender::from_file(&dir.path().join("f"), "a/b", HashAlg::Sha256, false).is_err());
    }

    #[test]
    fn an_abort_stops_the_writes_and_done_marks_the_last_one() {
        let data = b"abcdefghijklmnopqrst";
        let mut s = sender(data);
        drain(&mut s);
        s.handle_msg(grant(2, 4)).unwrap();
        let out = drain(&mut s);
        assert_eq!(writes(&out), vec![0, 1]);
        fill(&mut s, &out);
        // Acked, so chunks 2 and 3 are issued but not yet taken by the driver.
        s.handle_write_done(0).unwrap();
        s.handle_write_done(1).unwrap();
        s.handle_msg(Msg::Ack { next: 2 }).unwrap();
        let reason = RejectReason::NoSpace {
            needed: 20,
            available: 0,
        };
        s.handle_msg(Msg::Abort {
            reason: reason.clone(),
        })
        .unwrap();
        assert_eq!(
            drain(&mut s),
            vec![
                Output::Send(Msg::Done),
                Output::Finished(Outcome::Aborted(reason.clone()))
            ],
            "no more chunks; Done after those already posted"
        );
        assert!(s.is_finished());
        // After Done was sent, an abort only ends the transfer.
        let mut s = sender(b"ab");
        drain(&mut s);
        s.handle_msg(grant(1, 4)).unwrap();
        let out = drain(&mut s);
        fill(&mut s, &out);
        s.handle_write_done(0).unwrap();
        assert_eq!(drain(&mut s), vec![]);
        s.handle_msg(Msg::Abort {
            reason: reason.clone(),
        })
        .unwrap();
        assert_eq!(
            drain(&mut s),
            vec![Output::Finished(Outcome::Aborted(reason))]
        );
    }

    /// Issue 26 (1): the grant a hostile fetching client sends. The slot state was
    /// `vec![None; slots]` (about a gigabyte for 64 Mi slots) and the staging buffer the
    /// whole window, for every Fetch.
    #[test]
    fn grants_of_too_many_or_too_small_slots_are_refused() {
        let data = vec![7u8; 1 << 20];
        for (slots, slot_len, why) in [
            (64 << 20, 1, "more than the 1024 accepted"),
            (MAX_GRANT_SLOTS + 1, 4096, "more than the 1024 accepted"),
            (16, 1, "fewer than the 4096 required"),
            (16, 4095, "fewer than the 4096 required"),
        ] {
            let mut s = sender(&data).with_min_slot_len(MIN_GRANT_SLOT_LEN);
            drain(&mut s);
            let err = s.handle_msg(grant(slots, slot_len)).unwrap_err();
            assert!(
                matches!(err, TransferError::BadGrant(_)) && err.to_string().contains(why),
                "{slots} x {slot_len}: {err}"
            );
            assert!(drain(&mut s).is_empty(), "nothing staged");
        }
    }

    /// A file smaller than the granted window stages only its own bytes, and keeps
    /// state only for the slots it can fill.
    #[test]
    fn staging_and_slot_state_follow_the_chunks_not_the_grant() {
        let data = vec![7u8; 10_000];
        let mut s = sender(&data).with_min_slot_len(MIN_GRANT_SLOT_LEN);
        drain(&mut s);
        s.handle_msg(grant(1024, 1 << 16)).unwrap();
        let out = drain(&mut s);
        assert_eq!(out[0], Output::Stage { len: 10_000 });
        assert_eq!(writes(&out), vec![0]);
        assert_eq!(s.pipe.as_ref().unwrap().slots.len(), 1);

        let mut s = sender(&data).with_min_slot_len(MIN_GRANT_SLOT_LEN);
        drain(&mut s);
        s.handle_msg(grant(1024, 4096)).unwrap();
        let out = drain(&mut s);
        assert_eq!(out[0], Output::Stage { len: 10_000 });
        assert_eq!(writes(&out), vec![0, 1, 2]);
        assert_eq!(s.pipe.as_ref().unwrap().slots.len(), 3);
    }

    #[test]
    fn a_receiver_that_stops_acknowledging_is_given_up_on() {
        let data = b"abcdefghij"; // 3 chunks of 4 through 2 slots
        let mut s = sender(data);
        drain(&mut s);
        assert!(s.waits_on_peer(), "the offer waits for a grant");
        s.handle_msg(grant(2, 4)).unwrap();
        let out = drain(&mut s);
        assert!(
            out.iter().any(|o| matches!(o, Output::WriteChunk(_))),
            "{out:?}"
        );
        let reason = RejectReason::Stalled { secs: 60 };
        s.give_up(reason.clone());
        assert_eq!(
            drain(&mut s),
            vec![
                Output::Send(Msg::Abort {
                    reason: reason.clone()
                }),
                Output::Finished(Outcome::Aborted(reason.clone())),
            ]
        );
        assert!(s.is_finished() && s.stopped_sending() && !s.waits_on_peer());
        s.give_up(reason);
        assert_eq!(drain(&mut s), vec![]);
    }

    #[test]
    fn a_sender_waiting_for_the_answer_to_its_abort_stops_waiting() {
        let (mut s, c) = short_source();
        s.fill_chunk(&c, &mut [0; 8]).unwrap();
        let out = drain(&mut s);
        assert!(
            matches!(out.as_slice(), [Output::Send(Msg::Abort { .. })]),
            "{out:?}"
        );
        assert!(s.waits_on_peer());
        let reason = RejectReason::Stalled { secs: 5 };
        s.give_up(reason.clone());
        // Our Abort went out already: no second one.
        assert_eq!(
            drain(&mut s),
            vec![Output::Finished(Outcome::Aborted(reason))]
        );
    }
}
