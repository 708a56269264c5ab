//! The receiving side: checks an offer, asks the driver for a window, consumes chunks
//! in order (hash and temporary file), verifies on DONE, answers GOOD or BAD, and then
//! one `Identify`. Plays the server for uploads ([`Receiver::new`]) and the client for
//! downloads ([`Receiver::fetch`]).

use std::collections::VecDeque;
use std::mem;
use std::ops::Range;
use std::sync::Arc;

use super::config::Config;
use super::endpoint::{unexpected, Endpoint, Outcome, Output};
use super::error::{Result, TransferError};
use super::hash::Hasher;
use super::name::validate_name;
use super::owner::Admission;
use super::store::{free_space, Reaper, StoreError, TempFile};
use super::wire::{
    chunk_count, chunk_len, BadReason, FileOffer, HashAlg, Msg, RejectReason, RemoteWindow,
    WindowGrant, MAX_CHUNKS,
};

/// An offer that passed the connection's own checks, waiting for the service's quota
/// owner to admit it.
#[derive(Debug)]
struct Admitting {
    offer: FileOffer,
    overwrite: bool,
    slots: u32,
    slot_len: u32,
    chunks: u64,
}

/// A verified file waiting for its commit.
#[derive(Debug)]
struct Committing {
    /// The offered name, and whether the offer asked to overwrite: a new file of at
    /// least one byte proves the ID of the same name (see [`Config::secrets`]).
    name: String,
    overwrite: bool,
    len: u64,
    digest: super::wire::Digest,
    /// Taken by the driver (`take_commit`); dropping it unused removes the temporary file.
    temp: Option<TempFile>,
    /// The hash did not match: the temporary file is [abandoned](TempFile::abandon), its
    /// commit removes it, and the verdict is BAD with this digest whatever the commit did.
    mismatch: Option<super::wire::Digest>,
    /// The client's share, given back once the commit is over.
    _admission: Option<Admission>,
}

/// Where received chunks go, in order: the running hash and the temporary file. It
/// travels to the thread that consumes chunks ([`ConsumeJob`]) and back.
#[derive(Debug)]
pub struct Sink {
    hasher: Hasher,
    temp: TempFile,
}

/// Chunks to hash and append, in order, off the connection's thread (see
/// [`Output::Consume`]).
#[derive(Debug)]
pub struct ConsumeJob {
    sink: Box<Sink>,
    chunks: Vec<(u32, Vec<u8>)>,
}

impl ConsumeJob {
    /// Hashes and appends every chunk, in order; stops at the first write error. Blocks.
    pub fn run(self) -> Consumed {
        let ConsumeJob { mut sink, chunks } = self;
        let mut done = Vec::with_capacity(chunks.len());
        let mut result = Ok(());
        for (index, bytes) in chunks {
            sink.hasher.update(&bytes);
            if let Err(e) = sink.temp.write_all(&bytes) {
                result = Err(e);
                break;
            }
            done.push(index);
        }
        Consumed { sink, done, result }
    }

    /// Chunks in this job.
    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    /// True for a job without chunks (never emitted).
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
}

/// What a [`ConsumeJob`] did: hand it to [`Endpoint::handle_consumed`].
#[derive(Debug)]
pub struct Consumed {
    sink: Box<Sink>,
    done: Vec<u32>,
    result: std::result::Result<(), StoreError>,
}

/// One accepted offer being received.
#[derive(Debug)]
struct Incoming {
    offer: FileOffer,
    /// Home unless a [`ConsumeJob`] has it.
    sink: Option<Box<Sink>>,
    /// Chunks copied out of the window, not yet handed to a job.
    queued: Vec<(u32, Vec<u8>)>,
    /// Chunks below this index have had their slots released (acked when needed).
    released: u64,
    /// Released chunks not consumed yet. A chunk's slot is released as soon as it is
    /// copied out while fewer than `slots` such copies wait, so the sender keeps
    /// writing while the job hashes; beyond that, slots are released as chunks are
    /// consumed. At most two windows' worth of bytes are ever held.
    early: u32,
    /// `Done` arrived; the verdict waits for the last chunks to be consumed.
    done_pending: bool,
    slots: u32,
    slot_len: u32,
    chunks: u64,
    /// Index of the next chunk expected.
    next: u64,
    window: Option<RemoteWindow>,
    /// This upload's share of its client's quota (server side).
    admission: Option<Admission>,
}

/// Releases chunk `index`'s slot: the sender may reuse it. Acks go out only when a later
/// chunk needs the slot (Ack is cumulative, so releases happen in chunk order).
fn release(inc: &mut Incoming, index: u32, out: &mut VecDeque<Output>) {
    debug_assert_eq!(
        u64::from(index),
        inc.released,
        "slots are released in order"
    );
    inc.released = u64::from(index) + 1;
    if u64::from(index) + u64::from(inc.slots) < inc.chunks {
        out.push_back(Output::Send(Msg::Ack { next: index + 1 }));
    }
}

/// Releases the slots of copied-out chunks waiting for the job, oldest first, while
/// fewer than `slots` released copies wait.
fn release_early(inc: &mut Incoming, out: &mut VecDeque<Output>) {
    while inc.early < inc.slots && inc.released < inc.next {
        let index = inc.released as u32;
        release(inc, index, out);
        inc.early += 1;
    }
}

impl Incoming {
    fn window_len(&self) -> u64 {
        u64::from(self.slots) * u64::from(self.slot_len)
    }
}

#[derive(Debug)]
enum State {
    /// Waiting for an `Offer` (upload, server side).
    AwaitOffer,
    /// A `Fetch` was sent; waiting for the server's `Offer` or `Reject`.
    AwaitFetched {
        name: String,
        alg: HashAlg,
        overwrite: bool,
    },
    /// `Admit` was emitted; waiting for `handle_admitted`.
    Admitting(Box<Admitting>),
    /// `GrantWindow` was emitted; waiting for `handle_window`.
    Granting(Box<Incoming>),
    /// Chunks and then `Done`.
    Receiving(Box<Incoming>),
    /// The hash matched; `Output::Commit` was emitted and the driver commits the file
    /// (off its connection's thread) and reports with `handle_committed`.
    Committing(Box<Committing>),
    /// The verdict was sent (or the offer rejected); `Identify` is still answered when
    /// the verdict was GOOD.
    Finished { may_identify: bool },
    /// The transfer was aborted ([`Msg::Abort`] sent) before the sender's `Done`: the
    /// window stays registered, and chunks still landing in it are ignored, until
    /// `Done` says no more come.
    Aborted { reason: RejectReason, window: bool },
    /// An error ended the transfer.
    Failed,
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::AwaitOffer => "waiting for an offer",
            State::AwaitFetched { .. } => "waiting for the offer of the fetched file",
            State::Admitting(_) => "waiting for the service to admit the offer",
            State::Granting(_) => "registering the window",
            State::Receiving(_) => "receiving chunks",
            State::Committing(_) => "storing the verified file",
            State::Finished { may_identify: true } => "finished with GOOD (Identify allowed)",
            State::Finished {
                may_identify: false,
            } => "finished",
            State::Aborted { .. } => "aborted, waiting for the sender's Done",
            State::Failed => "failed",
        }
    }
}

/// The receiving state machine (see [`Endpoint`] for how to drive it).
///
/// Message flow, one transfer:
///
/// ```text
/// (Fetch →)  Offer ← · Grant → · [chunks ← · Ack →]* · Done ← · Good|Bad → · (Identify ← · Secret|Refused →)
/// ```
///
/// Refusals (`Reject`) are answers, not errors: a bad name, a file larger than
/// [`Config::max_size`], an existing file without `overwrite`, or a temporary file that
/// cannot be created. Messages out of order, chunks out of order or of the wrong
/// length, and a `Done` before the last chunk are errors.
#[derive(Debug)]
pub struct Receiver {
    config: Arc<Config>,
    state: State,
    out: VecDeque<Output>,
    /// The ID the last GOOD upload proved: its file name, if the file was new and not
    /// empty. Taken by the one `Identify` that may follow.
    proved_id: Option<String>,
    /// Given to each temporary file (see [`TempFile::set_reaper`]).
    reaper: Option<Reaper>,
    /// This connection's client, whose share the service's quota owner keeps (server
    /// side): offers are admitted by asking it ([`Output::Admit`]).
    quota: Option<String>,
}

impl Receiver {
    /// A receiver waiting for an offer (the server of an upload).
    pub fn new(config: Arc<Config>) -> Receiver {
        Receiver {
            config,
            state: State::AwaitOffer,
            out: VecDeque::new(),
            proved_id: None,
            reaper: None,
            quota: None,
        }
    }

    /// Has every offer admitted by the service's quota owner ([`Output::Admit`]),
    /// charged to `client`'s share (see [`Config::client_quota`]). Without it (the
    /// client side of a download) the receiver checks the free space alone.
    pub fn set_quota(&mut self, client: String) {
        self.quota = Some(client);
    }

    /// Hands the temporary files this receiver abandons (a failure, a dropped receiver)
    /// to `reaper` to remove instead of removing them on the thread that drops them.
    pub fn set_reaper(&mut self, reaper: Reaper) {
        self.reaper = Some(reaper);
    }

    /// A receiver that asks for `name` hashed with `alg` (the client of a download) and
    /// stores it in `config.dir`, replacing an existing file only with `overwrite`. Its
    /// first output is the `Fetch` message.
    ///
    /// # Errors
    ///
    /// `name` is not a plain file name.
    pub fn fetch(
        config: Arc<Config>,
        name: &str,
        alg: HashAlg,
        overwrite: bool,
    ) -> Result<Receiver> {
        validate_name(name)?;
        let mut r = Receiver::new(config);
        r.out.push_back(Output::Send(Msg::Fetch {
            name: name.to_owned(),
            alg,
        }));
        r.state = State::AwaitFetched {
            name: name.to_owned(),
            alg,
            overwrite,
        };
        Ok(r)
    }

    /// Chunks consumed so far in the current transfer.
    pub fn chunks_received(&self) -> u64 {
        match &self.state {
            State::Receiving(inc) => inc.next,
            _ => 0,
        }
    }

    fn fail<T>(&mut self, e: TransferError) -> Result<T> {
        // Dropping the state drops the temporary file, which removes it.
        self.state = State::Failed;
        Err(e)
    }

    fn reject(&mut self, reason: RejectReason) {
        self.out.push_back(Output::Send(Msg::Reject {
            reason: reason.clone(),
        }));
        self.out
            .push_back(Output::Finished(Outcome::Rejected(reason)));
        self.state = State::Finished {
            may_identify: false,
        };
    }

    fn offer(&mut self, offer: FileOffer, overwrite: bool) {
        let config = Arc::clone(&self.config);
        if let Err(e) = validate_name(&offer.name) {
            return self.reject(RejectReason::BadName {
                reason: e.to_string(),
            });
        }
        if offer.len > config.max_size {
            return self.reject(RejectReason::TooLarge {
                max: config.max_size,
            });
        }
        // Small files get one slot of their own size; larger ones the configured slots.
        let slot_len = u64::from(config.slot_len.max(1)).min(offer.len.max(1)) as u32;
        let chunks = chunk_count(offer.len, slot_len);
        if chunks > MAX_CHUNKS {
            return self.reject(RejectReason::TooLarge {
                max: MAX_CHUNKS * u64::from(slot_len),
            });
        }
        let slots = u64::from(config.slots.max(1)).min(chunks.max(1)) as u32;
        // Room first (cheap, and no file is created for an offer that cannot fit).
        let free = match free_space(&config.dir) {
            Ok(free) => free,
            Err(e) => {
                return self.reject(RejectReason::Unavailable {
                    reason: e.to_string(),
                })
            }
        };
        let pending = Box::new(Admitting {
            offer,
            overwrite,
            slots,
            slot_len,
            chunks,
        });
        match &self.quota {
            // The service's owner decides, with what other offers were promised.
            Some(client) => {
                self.out.push_back(Output::Admit {
                    client: client.clone(),
                    len: pending.offer.len,
                    free,
                });
                self.state = State::Admitting(pending);
            }
            None if free < pending.offer.len => self.reject(RejectReason::NoSpace {
                needed: pending.offer.len,
                available: free,
            }),
            None => self.admitted(*pending, None),
        }
    }

    /// Creates the temporary file of an admitted offer, reserves its bytes, and asks for
    /// the window.
    fn admitted(&mut self, pending: Admitting, mut admission: Option<Admission>) {
        let config = Arc::clone(&self.config);
        let Admitting {
            offer,
            overwrite,
            slots,
            slot_len,
            chunks,
        } = pending;
        let mut temp = match TempFile::create(&config.dir, &offer.name, overwrite) {
            Ok(t) => t,
            Err(StoreError::Exists(_)) => return self.reject(RejectReason::Exists),
            Err(e) => {
                return self.reject(RejectReason::Unavailable {
                    reason: e.to_string(),
                })
            }
        };
        if let Some(reaper) = &self.reaper {
            temp.set_reaper(reaper.clone());
        }
        match temp.reserve(offer.len) {
            Ok(true) => {
                if let Some(a) = admission.as_mut() {
                    a.mark_backed();
                }
            }
            // No fallocate: the bytes stay promised until the upload ends.
            Ok(false) => {}
            Err(e) => return self.reject(store_reason(&e, offer.len)),
        }
        let inc = Box::new(Incoming {
            admission,
            sink: Some(Box::new(Sink {
                hasher: Hasher::new(offer.digest.alg),
                temp,
            })),
            queued: Vec::new(),
            released: 0,
            early: 0,
            done_pending: false,
            offer,
            slots,
            slot_len,
            chunks,
            next: 0,
            window: None,
        });
        if chunks == 0 {
            self.out
                .push_back(Output::Send(Msg::Grant { window: None }));
            self.state = State::Receiving(inc);
        } else {
            self.out.push_back(Output::GrantWindow {
                len: inc.window_len(),
            });
            self.state = State::Granting(inc);
        }
    }

    /// `Done`: every chunk must be in. Once all are consumed, verify, then commit or
    /// discard.
    fn done(&mut self, mut inc: Box<Incoming>) -> Result<()> {
        if inc.next < inc.chunks {
            return self.fail(TransferError::EarlyDone {
                received: inc.next,
                expected: inc.chunks,
            });
        }
        if inc.sink.is_none() || !inc.queued.is_empty() {
            inc.done_pending = true;
            self.state = State::Receiving(inc);
            return Ok(());
        }
        if inc.window.is_some() {
            self.out.push_back(Output::Revoke);
        }
        let Incoming {
            offer,
            sink,
            admission,
            ..
        } = *inc;
        let Sink { hasher, mut temp } = *sink.expect("checked above");
        let got = hasher.finalize();
        // A mismatch goes the way of a commit too, so that the temporary file is
        // removed off this thread and before BAD tells the peer it is gone.
        let mismatch = (got != offer.digest).then(|| {
            temp.abandon();
            got
        });
        // fsync and rename (or removal) block: the driver runs them elsewhere and
        // reports back.
        self.out.push_back(Output::Commit);
        self.state = State::Committing(Box::new(Committing {
            name: offer.name,
            overwrite: offer.overwrite,
            len: offer.len,
            digest: got,
            temp: Some(temp),
            mismatch,
            _admission: admission,
        }));
        Ok(())
    }

    /// Ends the transfer midway for `reason`, which the sender is told ([`Msg::Abort`]):
    /// the temporary file goes (dropped with the sink), the client's share is given
    /// back, and the window is revoked once the sender's `Done` says nothing more is
    /// written into it (at once if it came already).
    fn abort(&mut self, inc: Box<Incoming>, reason: RejectReason) {
        self.out.push_back(Output::Send(Msg::Abort {
            reason: reason.clone(),
        }));
        let window = inc.window.is_some();
        if inc.done_pending {
            self.aborted(window, reason);
        } else {
            self.state = State::Aborted { reason, window };
        }
    }

    /// The aborted transfer is over: revoke and finish.
    fn aborted(&mut self, window: bool, reason: RejectReason) {
        if window {
            self.out.push_back(Output::Revoke);
        }
        self.out
            .push_back(Output::Finished(Outcome::Aborted(reason)));
        self.state = State::Finished {
            may_identify: false,
        };
    }

    /// Sends the verdict and finishes: GOOD with what was stored, or BAD.
    fn verdict(&mut self, verdict: std::result::Result<Outcome, BadReason>) {
        match verdict {
            Ok(stored) => {
                self.out.push_back(Output::Send(Msg::Good));
                self.out.push_back(Output::Finished(stored));
                self.state = State::Finished { may_identify: true };
            }
            Err(reason) => {
                self.out.push_back(Output::Send(Msg::Bad {
                    reason: reason.clone(),
                }));
                self.out.push_back(Output::Finished(Outcome::Bad(reason)));
                self.state = State::Finished {
                    may_identify: false,
                };
            }
        }
    }
}

/// What the peer is told when storing failed: the lack of space as such, anything
/// else as unavailable with the error.
fn store_reason(e: &StoreError, len: u64) -> RejectReason {
    match e {
        StoreError::NoSpace {
            needed, available, ..
        } => RejectReason::NoSpace {
            needed: *needed,
            available: *available,
        },
        e if e.is_no_space() => RejectReason::NoSpace {
            needed: len,
            available: 0,
        },
        e => RejectReason::Unavailable {
            reason: e.to_string(),
        },
    }
}

impl Endpoint for Receiver {
    fn state_name(&self) -> &'static str {
        self.state.name()
    }

    fn handle_admitted(
        &mut self,
        answer: std::result::Result<Admission, RejectReason>,
    ) -> Result<()> {
        match (mem::replace(&mut self.state, State::Failed), answer) {
            (State::Admitting(pending), Ok(admission)) => {
                self.admitted(*pending, Some(admission));
                Ok(())
            }
            (State::Admitting(_), Err(reason)) => {
                self.reject(reason);
                Ok(())
            }
            (state, _) => {
                self.state = state;
                Err(super::endpoint::unexpected(self, "an admission".into()))
            }
        }
    }

    fn handle_msg(&mut self, msg: Msg) -> Result<()> {
        match (mem::replace(&mut self.state, State::Failed), msg) {
            (State::AwaitOffer, Msg::Offer(offer)) => {
                let overwrite = offer.overwrite;
                self.offer(offer, overwrite);
                Ok(())
            }
            (
                State::AwaitFetched {
                    name,
                    alg,
                    overwrite,
                },
                Msg::Offer(offer),
            ) => {
                if offer.name != name || offer.digest.alg != alg {
                    return self.fail(TransferError::FetchMismatch(format!(
                        "asked for {name:?} with {alg}, offered {:?} with {}",
                        offer.name, offer.digest.alg
                    )));
                }
                self.offer(offer, overwrite);
                Ok(())
            }
            (State::AwaitFetched { .. }, Msg::Reject { reason }) => {
                self.out
                    .push_back(Output::Finished(Outcome::Rejected(reason)));
                self.state = State::Finished {
                    may_identify: false,
                };
                Ok(())
            }
            (State::Receiving(inc), Msg::Done) => self.done(inc),
            (State::Aborted { reason, window }, Msg::Done) => {
                self.aborted(window, reason);
                Ok(())
            }
            // The sender gave up (its Abort follows its last WRITE): whatever was
            // received goes; the echo tells it that no Ack of this transfer follows.
            (State::Receiving(inc), Msg::Abort { reason }) => {
                self.out.push_back(Output::Send(Msg::Abort {
                    reason: reason.clone(),
                }));
                self.aborted(inc.window.is_some(), reason);
                Ok(())
            }
            // Both gave up at once: the sender's Abort stands for its Done.
            (State::Aborted { reason, window }, Msg::Abort { .. }) => {
                self.aborted(window, reason);
                Ok(())
            }
            (State::Finished { may_identify: true }, Msg::Identify { id }) => {
                // Only the ID this upload proved, and the same `Refused` for an unknown
                // ID as for an unproved one.
                let proved = self.proved_id.take().filter(|p| *p == id);
                let answer = match proved.and_then(|id| self.config.secrets.get(&id)) {
                    Some(key) => Msg::Secret { key: key.clone() },
                    None => Msg::Refused,
                };
                self.out.push_back(Output::Send(answer));
                self.state = State::Finished {
                    may_identify: false,
                };
                Ok(())
            }
            (state, msg) => {
                let e = TransferError::Unexpected {
                    what: msg.kind().to_owned(),
                    state: state.name(),
                };
                self.fail(e)
            }
        }
    }

    fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    fn is_finished(&self) -> bool {
        matches!(self.state, State::Finished { .. })
    }

    fn waits_on_peer(&self) -> bool {
        matches!(self.state, State::Receiving(_) | State::Aborted { .. })
    }

    fn give_up(&mut self, reason: RejectReason) {
        match mem::replace(&mut self.state, State::Failed) {
            State::Receiving(inc) => {
                self.out.push_back(Output::Send(Msg::Abort {
                    reason: reason.clone(),
                }));
                // Chunks received and not yet consumed are dropped with the transfer.
                self.out.retain(|o| !matches!(o, Output::Consume));
                self.aborted(inc.window.is_some(), reason);
            }
            // Our Abort went out already; the sender's `Done` is not waited for.
            State::Aborted { window, .. } => self.aborted(window, reason),
            state => self.state = state,
        }
    }

    fn chunk_range(&self, index: u32) -> Result<Range<usize>> {
        if matches!(self.state, State::Aborted { .. }) {
            // Chunks in flight when the abort went out: nothing to read.
            return Ok(0..0);
        }
        let State::Receiving(inc) = &self.state else {
            return Err(unexpected(self, format!("chunk {index}")));
        };
        let i = u64::from(index);
        if i >= inc.chunks {
            return Err(TransferError::ChunkOrder {
                got: index,
                expected: inc.next,
            });
        }
        let start = (index % inc.slots) as usize * inc.slot_len as usize;
        Ok(start..start + chunk_len(inc.offer.len, inc.slot_len, i) as usize)
    }

    fn handle_chunk(&mut self, index: u32, bytes: &[u8]) -> Result<()> {
        if matches!(self.state, State::Aborted { .. }) {
            return Ok(());
        }
        let State::Receiving(inc) = &mut self.state else {
            let e = unexpected(self, format!("chunk {index}"));
            return self.fail(e);
        };
        if u64::from(index) != inc.next || inc.next >= inc.chunks {
            let e = TransferError::ChunkOrder {
                got: index,
                expected: inc.next,
            };
            return self.fail(e);
        }
        let expected = chunk_len(inc.offer.len, inc.slot_len, inc.next);
        if bytes.len() != expected as usize {
            let e = TransferError::ChunkLength {
                index,
                got: bytes.len(),
                expected,
            };
            return self.fail(e);
        }
        // Copied out (cheap next to hashing), so the job owns its bytes and a peer
        // writing into the window meanwhile cannot change what is hashed.
        inc.queued.push((index, bytes.to_vec()));
        inc.next += 1;
        release_early(inc, &mut self.out);
        if inc.sink.is_some() && inc.queued.len() == 1 {
            self.out.push_back(Output::Consume);
        }
        Ok(())
    }

    fn take_consume(&mut self) -> Option<ConsumeJob> {
        let State::Receiving(inc) = &mut self.state else {
            return None;
        };
        if inc.queued.is_empty() {
            return None;
        }
        let sink = inc.sink.take()?;
        Some(ConsumeJob {
            sink,
            chunks: mem::take(&mut inc.queued),
        })
    }

    fn handle_consumed(&mut self, consumed: Consumed) -> Result<()> {
        if matches!(self.state, State::Finished { .. }) {
            // The sender aborted while this job ran: its chunks (and the temporary
            // file, dropped with the sink) belong to a transfer that is over.
            return Ok(());
        }
        let State::Receiving(inc) = &mut self.state else {
            let e = unexpected(self, "consumed chunks".into());
            return self.fail(e);
        };
        if inc.sink.is_some() {
            let e = TransferError::Driver("consumed chunks that were never handed out".into());
            return self.fail(e);
        }
        let Consumed { sink, done, result } = consumed;
        inc.sink = Some(sink);
        if let Err(e) = result {
            // The sender hears why (no space, an I/O error) instead of seeing its
            // connection close under it.
            let reason = store_reason(&e, inc.offer.len);
            tracing::warn!(error = %e, "writing a received file failed; aborting the transfer");
            let State::Receiving(inc) = mem::replace(&mut self.state, State::Failed) else {
                unreachable!("matched above");
            };
            self.abort(inc, reason);
            return Ok(());
        }
        // Chunks released early are simply done; the others release their slots now
        // (in order: consumption follows arrival), and queued ones may go early again.
        for index in done {
            if u64::from(index) < inc.released {
                inc.early -= 1;
            } else {
                release(inc, index, &mut self.out);
            }
        }
        release_early(inc, &mut self.out);
        if !inc.queued.is_empty() {
            self.out.push_back(Output::Consume);
            return Ok(());
        }
        if inc.done_pending {
            let State::Receiving(inc) = mem::replace(&mut self.state, State::Failed) else {
                unreachable!("matched above");
            };
            return self.done(inc);
        }
        Ok(())
    }

    fn take_commit(&mut self) -> Option<TempFile> {
        match &mut self.state {
            State::Committing(c) => c.temp.take(),
            _ => None,
        }
    }

    fn handle_committed(
        &mut self,
        result: std::result::Result<std::path::PathBuf, StoreError>,
    ) -> Result<()> {
        match mem::replace(&mut self.state, State::Failed) {
            State::Committing(c) => {
                if let Some(got) = c.mismatch {
                    if let Some(e) = result
                        .as_ref()
                        .err()
                        .filter(|e| !matches!(e, StoreError::Abandoned(_)))
                    {
                        tracing::warn!(error = %e, "cannot remove the temporary file of a mismatch");
                    }
                    self.verdict(Err(BadReason::Mismatch { got }));
                    return Ok(());
                }
                if result.is_ok() && c.len > 0 && !c.overwrite {
                    self.proved_id = Some(c.name.clone());
                }
                self.verdict(
                    result
                        .map(|path| Outcome::Stored {
                            path,
                            len: c.len,
                            digest: c.digest,
                        })
                        .map_err(|e| BadReason::NotStored {
                            reason: e.to_string(),
                        }),
                );
                Ok(())
            }
            state => {
                self.state = state;
                let e = unexpected(self, "a commit result".into());
                self.fail(e)
            }
        }
    }

    fn handle_window(&mut self, region: RemoteWindow) -> Result<()> {
        match mem::replace(&mut self.state, State::Failed) {
            State::Granting(mut inc) => {
                if region.len != inc.window_len() {
                    return self.fail(TransferError::Driver(format!(
                        "window of {} bytes registered, {} asked for",
                        region.len,
                        inc.window_len()
                    )));
                }
                inc.window = Some(region);
                self.out.push_back(Output::Send(Msg::Grant {
                    window: Some(WindowGrant {
                        region,
                        slots: inc.slots,
                        slot_len: inc.slot_len,
                    }),
                }));
                self.state = State::Receiving(inc);
                Ok(())
            }
            state => {
                self.state = state;
                let e = unexpected(self, "window registration".into());
                self.fail(e)
            }
        }
    }

    fn window_refused(&mut self, reason: String) -> Result<()> {
        match mem::replace(&mut self.state, State::Failed) {
            // Dropping the transfer removes its temporary file and gives back its
            // reservation and its admission.
            State::Granting(_) => {
                self.reject(RejectReason::Unavailable {
                    reason: format!("no memory for the transfer's window: {reason}"),
                });
                Ok(())
            }
            state => {
                self.state = state;
                let e = unexpected(self, "window refusal".into());
                self.fail(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_transfer::hash::hash_bytes;
    use crate::file_transfer::store::tests::entries;

    const WINDOW: RemoteWindow = RemoteWindow {
        addr: 0x10_0000,
        len: 0,
        rkey: 9,
    };

    fn config(dir: &std::path::Path) -> Arc<Config> {
        Arc::new(
            Config::new(dir)
                .with_window(2, 4)
                .with_max_size(100)
                .with_secret("alice", "a-key"),
        )
    }

    fn offer(name: &str, data: &[u8]) -> Msg {
        Msg::Offer(FileOffer {
            name: name.into(),
            len: data.len() as u64,
            digest: hash_bytes(HashAlg::Sha256, data),
            overwrite: false,
        })
    }

    /// Every output; consuming and committing are carried out at once (a driver would
    /// do them elsewhere) and not listed.
    fn drain(r: &mut Receiver) -> Vec<Output> {
        let mut all = Vec::new();
        while let Some(out) = r.poll_output() {
            if out == Output::Consume {
                let job = r.take_consume().expect("chunks to consume");
                r.handle_consumed(job.run()).unwrap();
                continue;
            }
            if out == Output::Commit {
                let temp = r.take_commit().expect("a file to commit");
                r.handle_committed(temp.commit()).unwrap();
            }
            all.push(out);
        }
        all
    }

    #[test]
    fn slots_are_released_early_while_few_copies_wait_and_jobs_run_one_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let data = b"abcdefghijklmnopqrst"; // 5 chunks of 4 through 2 slots
        let ack = |next| Some(Output::Send(Msg::Ack { next }));
        let mut r = Receiver::new(config(dir.path()));
        r.handle_msg(offer("c", data)).unwrap();
        granted(&mut r, 8);
        r.handle_chunk(0, &data[0..4]).unwrap();
        // Copied out: its slot is free for chunk 2 at once, before any hashing.
        assert_eq!(r.poll_output(), ack(1));
        assert_eq!(r.poll_output(), Some(Output::Consume));
        let job = r.take_consume().unwrap();
        assert_eq!(job.len(), 1);
        assert!(r.take_consume().is_none(), "one job out at a time");
        r.handle_chunk(1, &data[4..8]).unwrap();
        assert_eq!(r.poll_output(), ack(2), "a second early release");
        r.handle_chunk(2, &data[8..12]).unwrap();
        assert_eq!(r.poll_output(), None, "two released copies wait: no third");
        r.handle_consumed(job.run()).unwrap();
        // Chunk 0 is consumed: one copy fewer waits, so chunk 2's slot goes now.
        assert_eq!(r.poll_output(), ack(3));
        assert_eq!(r.poll_output(), Some(Output::Consume));
        let job = r.take_consume().unwrap();
        assert_eq!(job.len(), 2, "chunks 1 and 2");
        r.handle_chunk(3, &data[12..16]).unwrap();
        r.handle_chunk(4, &data[16..]).unwrap();
        // Done while chunks are still out: the verdict waits.
        r.handle_msg(Msg::Done).unwrap();
        assert_eq!(
            r.poll_output(),
            None,
            "no slot needed any more, no verdict yet"
        );
        r.handle_consumed(job.run()).unwrap();
        let out = drain(&mut r);
        assert!(out.contains(&Output::Send(Msg::Good)), "{out:?}");
        assert_eq!(std::fs::read(dir.path().join("c")).unwrap(), data);
    }

    #[test]
    fn the_verdict_waits_for_the_commit_and_a_failed_commit_is_bad() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Receiver::new(config(dir.path()));
        r.handle_msg(offer("late", b"")).unwrap();
        drain(&mut r);
        r.handle_msg(Msg::Done).unwrap();
        assert_eq!(r.poll_output(), Some(Output::Commit));
        assert_eq!(r.poll_output(), None, "no verdict before the commit");
        assert!(!r.is_finished());
        let temp = r.take_commit().unwrap();
        assert!(r.take_commit().is_none(), "taken once");
        drop(temp);
        let failed = StoreError::Io {
            op: "fsync",
            path: dir.path().join("late"),
            source: std::io::Error::other("disk on fire"),
        };
        r.handle_committed(Err(failed)).unwrap();
        let out = drain(&mut r);
        assert!(
            matches!(&out[0], Output::Send(Msg::Bad { reason: BadReason::NotStored { reason } }) if reason.contains("disk on fire")),
            "{out:?}"
        );
        assert!(!dir.path().join("late").exists());
        assert!(
            r.handle_committed(Ok(dir.path().join("x"))).is_err(),
            "one result"
        );
    }

    fn rejected(r: &mut Receiver) -> RejectReason {
        match drain(r).as_slice() {
            [Output::Send(Msg::Reject { reason }), Output::Finished(Outcome::Rejected(r2))] => {
                assert_eq!(reason, r2);
                reason.clone()
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    /// Offer accepted and the window granted, with the geometry checked.
    fn granted(r: &mut Receiver, window_len: u64) {
        assert_eq!(drain(r), vec![Output::GrantWindow { len: window_len }]);
        let region = RemoteWindow {
            len: window_len,
            ..WINDOW
        };
        r.handle_window(region).unwrap();
        assert!(matches!(
            drain(r).as_slice(),
            [Output::Send(Msg::Grant { window: Some(w) })] if w.region == region
        ));
    }

    #[test]
    fn a_window_that_cannot_be_registered_rejects_the_offer_and_keeps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Receiver::new(config(dir.path()));
        r.handle_msg(offer("f", b"0123456789")).unwrap();
        assert_eq!(drain(&mut r), vec![Output::GrantWindow { len: 8 }]);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "the offer's temporary file exists while the window is asked for"
        );
        r.window_refused("registering 8 B would pass the pool's cap".into())
            .unwrap();
        match rejected(&mut r) {
            RejectReason::Unavailable { reason } => {
                assert!(
                    reason.contains("window") && reason.contains("pool's cap"),
                    "{reason}"
                )
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "the temporary file went with the offer"
        );
        assert!(r.is_finished());
        assert!(
            r.window_refused("again".into()).is_err(),
            "a refusal nobody asked for is a driver error"
        );
    }

    #[test]
    fn chunks_are_hashed_stored_and_acked_only_when_a_slot_is_needed() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Receiver::new(config(dir.path()));
        let data = b"0123456789"; // 3 chunks of 4, 4, 2 through 2 slots
        r.handle_msg(offer("f", data)).unwrap();
        granted(&mut r, 8);
        assert_eq!(r.chunk_range(0).unwrap(), 0..4);
        assert_eq!(r.chunk_range(1).unwrap(), 4..8);
        assert_eq!(r.chunk_range(2).unwrap(), 0..2);
        r.handle_chunk(0, &data[0..4]).unwrap();
        assert_eq!(drain(&mut r), vec![Output::Send(Msg::Ack { next: 1 })]);
        r.handle_chunk(1, &data[4..8]).unwrap();
        r.handle_chunk(2, &data[8..]).unwrap();
        assert_eq!(drain(&mut r), vec![]);
        r.handle_msg(Msg::Done).unwrap();
        let out = drain(&mut r);
        assert_eq!(out[0], Output::Revoke);
        assert_eq!(out[1], Output::Commit);
        assert_eq!(out[2], Output::Send(Msg::Good));
        assert!(matches!(
            &out[3],
            Output::Finished(Outcome::Stored { len: 10, .. })
        ));
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), data);
        assert!(r.is_finished());
    }

    #[test]
    fn small_files_get_a_small_window_and_empty_files_none() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Receiver::new(config(dir.path()));
        r.handle_msg(offer("one", b"x")).unwrap();
        granted(&mut r, 1);

        let mut r = Receiver::new(config(dir.path()));
        r.handle_msg(offer("empty", b"")).unwrap();
        assert_eq!(
            drain(&mut r),
            vec![Output::Send(Msg::Grant { window: None })]
        );
        r.handle_msg(Msg::Done).unwrap();
        let out = drain(&mut r);
        assert_eq!(out[..2], [Output::Commit, Output::Send(Msg::Good)]);
        assert_eq!(std::fs::read(dir.path().join("empty")).unwrap(), b"");
    }

    #[test]
    fn bad_names_oversize_and_existing_files_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("exists"), b"keep").unwrap();
        for name in ["../x", "/etc/passwd", "a\\b", "", "a\0b", &"n".repeat(256)] {
            let mut r = Receiver::new(config(dir.path()));
            r.handle_msg(offer(name, b"abc")).unwrap();
            assert!(
                matches!(rejected(&mut r), RejectReason::BadName { .. }),
                "{name:?}"
            );
        }
        let mut r = Receiver::new(config(dir.path()));
        r.handle_msg(offer("big", &[0; 101])).unwrap();
        assert_eq!(rejected(&mut r), RejectReason::TooLarge { max: 100 });
        let mut r = Receiver::new(config(dir.path()));
        r.handle_msg(offer("exists", b"new")).unwrap();
        assert_eq!(rejected(&mut r), RejectReason::Exists);
        assert_eq!(entries(dir.path()), vec!["exists"]);
        assert_eq!(std::fs::read(dir.path().join("exists")).unwrap(), b"keep");
    }

    #[test]
    fn out_of_order_messages_name_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Receiver::new(config(dir.path()));
        let e = r.handle_msg(Msg::Done).unwrap_err();
        assert_eq!(e.to_string(), "unexpected Done while waiting for an offer");
        // Failed for good.
        assert!(r.handle_msg(offer("f", b"x")).is_err());

        let mut r = Receiver::new(config(dir.path()));
        r.handle_msg(offer("f", b"abcdefgh")).unwrap();
        granted(&mut r, 8);
        let e = r
            .handle_msg(Msg::Identify { id: "alice".into() })
            .unwrap_err();
        assert_eq!(e.to_string(), "unexpected Identify while receiving chunks");
        assert!(
            entries(dir.path()).is_empty(),
            "temp file removed on failure"
        );
    }

    #[test]
    fn chunk_errors_are_fatal_and_clean_up() {
        let dir = tempfile::tempdir().unwrap();
        let start = |r: &mut Receiver| {
            r.handle_msg(offer("f", b"abcdefghij")).unwrap();
            granted(r, 8);
        };
        let mut r = Receiver::new(config(dir.path()));
        start(&mut r);
        assert!(matches!(
            r.handle_chunk(1, b"efgh"),
            Err(TransferError::ChunkOrder {
                got: 1,
                expected: 0
            })
        ));
        assert!(entries(dir.path()).is_empty());

        let mut r = Receiver::new(config(dir.path()));
        start(&mut r);
        assert!(matches!(
            r.handle_chunk(0, b"abc"),
            Err(TransferError::ChunkLength { .. })
        ));

        let mut r = Receiver::new(config(dir.path()));
        start(&mut r);
        r.handle_chunk(0, b"abcd").unwrap();
        assert!(matches!(
            r.handle_msg(Msg::Done),
            Err(TransferError::EarlyDone {
                received: 1,
                expected: 3
            })
        ));
        assert!(entries(dir.path()).is_empty());

        let mut r = Receiver::new(config(dir.path()));
        start(&mut r);
        r.handle_chunk(0, b"abcd").unwrap();
        r.handle_chunk(1, b"efgh").unwrap();
        r.handle_chunk(2, b"ij").unwrap();
        assert!(r.handle_chunk(3, b"").is_err(), "no chunk past the end");
    }

    #[test]
    fn a_mismatch_is_bad_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Receiver::new(config(dir.path()));
        r.handle_msg(offer("f", b"abcd")).unwrap();
        granted(&mut r, 4);
        r.handle_chunk(0, b"abcX").unwrap();
        r.handle_msg(Msg::Done).unwrap();
        // The removal goes the way of a commit, before the verdict.
        let mut before = Vec::new();
        while let Some(out) = r.poll_output() {
            if out == Output::Consume {
                let job = r.take_consume().expect("chunks to consume");
                r.handle_consumed(job.run()).unwrap();
            } else {
                before.push(out);
            }
        }
        assert_eq!(
            before,
            vec![Output::Revoke, Output::Commit],
            "BAD waits for the removal"
        );
        let temp = r.take_commit().expect("the abandoned file");
        assert!(temp.is_abandoned());
        assert_eq!(
            entries(dir.path()).len(),
            1,
            "still there until the job runs"
        );
        assert!(matches!(temp.commit(), Err(StoreError::Abandoned(_))));
        assert!(entries(dir.path()).is_empty(), "removed by the job");
        r.handle_committed(Err(StoreError::NotFound("x".into())))
            .unwrap();
        let out = drain(&mut r);
        let got = hash_bytes(HashAlg::Sha256, b"abcX");
        let reason = BadReason::Mismatch { got };
        assert_eq!(
            out,
            vec![
                Output::Send(Msg::Bad {
                    reason: reason.clone()
                }),
                Output::Finished(Outcome::Bad(reason)),
            ]
        );
        assert!(entries(dir.path()).is_empty());
        // No Identify after BAD.
        assert!(r.handle_msg(Msg::Identify { id: "alice".into() }).is_err());
    }

    #[test]
    fn identify_after_good_answers_once() {
        let dir = tempfile::tempdir().unwrap();
        // Proved: a new, non-empty file named after the ID.
        let mut r = Receiver::new(config(dir.path()));
        r.handle_msg(offer("alice", b"x")).unwrap();
        granted(&mut r, 1);
        r.handle_chunk(0, b"x").unwrap();
        r.handle_msg(Msg::Done).unwrap();
        drain(&mut r);
        r.handle_msg(Msg::Identify { id: "alice".into() }).unwrap();
        let secret = Msg::Secret {
            key: "a-key".into(),
        };
        assert_eq!(drain(&mut r), vec![Output::Send(secret)]);
        assert!(r.handle_msg(Msg::Identify { id: "alice".into() }).is_err());
    }

    /// Security issue item 5: a 0-byte upload used to get the secret of any configured
    /// ID, and Refused vs Secret told which IDs exist. An empty upload proves nothing,
    /// and an unproved known ID gets the same `Refused` as an unknown one.
    #[test]
    fn an_empty_upload_proves_no_id() {
        let dir = tempfile::tempdir().unwrap();
        for id in ["alice", "mallory"] {
            let mut r = Receiver::new(config(dir.path()));
            r.handle_msg(offer(id, b"")).unwrap();
            r.handle_msg(Msg::Done).unwrap();
            drain(&mut r);
            r.handle_msg(Msg::Identify { id: id.into() }).unwrap();
            assert_eq!(drain(&mut r), vec![Output::Send(Msg::Refused)], "{id}");
            assert!(r.handle_msg(Msg::Identify { id: id.into() }).is_err());
        }
    }

    /// The ID must be the uploaded file's name: uploading `f` proves nothing about
    /// `alice`.
    #[test]
    fn an_upload_proves_only_the_id_it_is_named_after() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Receiver::new(config(dir.path()));
        r.handle_msg(offer("f", b"x")).unwrap();
        granted(&mut r, 1);
        r.handle_chunk(0, b"x").unwrap();
        r.handle_msg(Msg::Done).unwrap();
        drain(&mut r);
        r.handle_msg(Msg::Identify { id: "alice".into() }).unwrap();
        assert_eq!(drain(&mut r), vec![Output::Send(Msg::Refused)]);
    }

    #[test]
    fn a_fetch_only_takes_the_file_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Receiver::fetch(config(dir.path()), "f", HashAlg::Blake3, false).unwrap();
        assert_eq!(
            drain(&mut r),
            vec![Output::Send(Msg::Fetch {
                name: "f".into(),
                alg: HashAlg::Blake3
            })]
        );
        assert!(matches!(
            r.handle_msg(offer("g", b"x")),
            Err(TransferError::FetchMismatch(_))
        ));
        let mut r = Receiver::fetch(config(dir.path()), "f", HashAlg::Blake3, false).unwrap();
        drain(&mut r);
        r.handle_msg(Msg::Reject {
            reason: RejectReason::NotFound,
        })
        .unwrap();
        assert_eq!(
            drain(&mut r),
            vec![Output::Finished(Outcome::Rejected(RejectReason::NotFound))]
        );
        assert!(Receiver::fetch(config(dir.path()), "../f", HashAlg::Sha256, false).is_err());
    }

    #[test]
    fn the_window_must_have_the_asked_length() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = Receiver::new(config(dir.path()));
        assert!(r.handle_window(WINDOW).is_err());
        let mut r = Receiver::new(config(dir.path()));
        r.handle_msg(offer("f", b"abcdefgh")).unwrap();
        drain(&mut r);
        assert!(r.handle_window(RemoteWindow { len: 7, ..WINDOW }).is_err());
    }

    #[test]
    fn an_offer_larger_than_the_free_space_is_refused_before_any_file_exists() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_space(dir.path()).unwrap();
        let config = Arc::new(Config::new(dir.path()).with_max_size(u64::MAX));
        let mut r = Receiver::new(config);
        let len = free + (1 << 30);
        r.handle_msg(Msg::Offer(FileOffer {
            name: "big".into(),
            len,
            digest: hash_bytes(HashAlg::Sha256, b""),
            overwrite: false,
        }))
        .unwrap();
        let out = drain(&mut r);
        match out.as_slice() {
            [Output::Send(Msg::Reject {
                reason: RejectReason::NoSpace { needed, available },
            }), Output::Finished(Outcome::Rejected(_))] => {
                assert_eq!(*needed, len);
                // Others write to the same file system meanwhile: roughly `free`.
                assert!(*available < len, "{available}");
            }
            other => panic!("{other:?}"),
        }
        assert!(entries(dir.path()).is_empty(), "no temporary file");
        let text = RejectReason::NoSpace {
            needed: len,
            available: free,
        }
        .to_string();
        assert!(text.contains("no space left"), "{text}");
    }

    /// Answers the receiver's `Admit` by asking `owner`, as the session does.
    async fn admit(
        r: &mut Receiver,
        owner: &actix::Addr<crate::file_transfer::QuotaOwner>,
    ) -> Vec<Output> {
        let out = drain(r);
        let [Output::Admit { client, len, free }] = &out[..] else {
            return out;
        };
        let admit = crate::file_transfer::Admit {
            client: client.clone(),
            len: *len,
            free: *free,
        };
        r.handle_admitted(owner.send(admit).await.unwrap()).unwrap();
        drain(r)
    }

    #[actix::test]
    async fn a_client_past_its_quota_is_refused_and_served_again_once_under_it() {
        use actix::Actor;
        let dir = tempfile::tempdir().unwrap();
        let config = Arc::new(Config::new(dir.path()).with_client_quota(1, 1 << 20));
        let uploads = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let owner = crate::file_transfer::QuotaOwner::new(config.client_quota, uploads).start();
        let usage = |client: &str| owner.send(crate::file_transfer::Usage(client.into()));
        let receiver = |client: &str| {
            let mut r = Receiver::new(Arc::clone(&config));
            r.set_quota(client.into());
            r
        };
        let mut first = receiver("10.0.0.1");
        first.handle_msg(offer("a", b"12345678")).unwrap();
        assert_eq!(
            first.state_name(),
            "waiting for the service to admit the offer"
        );
        assert!(matches!(
            admit(&mut first, &owner).await[..],
            [Output::GrantWindow { .. }]
        ));
        assert_eq!(usage("10.0.0.1").await.unwrap(), (1, 8));
        // The same client on another connection: one upload at once.
        let mut second = receiver("10.0.0.1");
        second.handle_msg(offer("b", b"x")).unwrap();
        assert!(matches!(
            admit(&mut second, &owner).await[..],
            [
                Output::Send(Msg::Reject {
                    reason: RejectReason::Quota {
                        limit: 1,
                        would_use: 2,
                        ..
                    }
                }),
                _
            ]
        ));
        // Another client is served meanwhile; its bytes are limited too.
        let mut other = receiver("10.0.0.2");
        other
            .handle_msg(Msg::Offer(FileOffer {
                name: "huge".into(),
                len: (1 << 20) + 1,
                digest: hash_bytes(HashAlg::Sha256, b""),
                overwrite: false,
            }))
            .unwrap();
        let out = admit(&mut other, &owner).await;
        assert!(
            matches!(&out[0], Output::Send(Msg::Reject { reason: RejectReason::Quota { what, .. } }) if what.contains("bytes")),
            "{out:?}"
        );
        // The first upload ends (its connection drops it): the share comes back.
        drop(first);
        assert_eq!(usage("10.0.0.1").await.unwrap(), (0, 0));
        let mut third = receiver("10.0.0.1");
        third.handle_msg(offer("c", b"x")).unwrap();
        assert!(matches!(
            admit(&mut third, &owner).await[..],
            [Output::GrantWindow { .. }]
        ));
        // An admission answered twice, or out of turn, is a protocol error.
        assert!(third.handle_admitted(Err(RejectReason::Exists)).is_err());
    }

    #[test]
    fn a_write_that_runs_out_of_space_aborts_with_the_reason_and_the_connection_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let data = b"abcdefghijklmnopqrst"; // 5 chunks of 4 through 2 slots
        let mut r = Receiver::new(config(dir.path()));
        r.handle_msg(offer("f", data)).unwrap();
        granted(&mut r, 8);
        r.handle_chunk(0, &data[0..4]).unwrap();
        let out: Vec<Output> = std::iter::from_fn(|| r.poll_output()).collect();
        assert!(out.contains(&Output::Consume), "{out:?}");
        let job = r.take_consume().unwrap();
        // The job's write fails as a full disk would make it.
        let Consumed { sink, .. } = job.run();
        let failed = Consumed {
            sink,
            done: Vec::new(),
            result: Err(StoreError::Io {
                op: "write",
                path: dir.path().join("f"),
                source: std::io::Error::from_raw_os_error(28), // ENOSPC
            }),
        };
        r.handle_consumed(failed).unwrap();
        let reason = RejectReason::NoSpace {
            needed: data.len() as u64,
            available: 0,
        };
        assert_eq!(
            drain(&mut r),
            vec![Output::Send(Msg::Abort {
                reason: reason.clone()
            })]
        );
        assert!(!r.is_finished(), "the window stays until the sender's Done");
        // A chunk still in flight lands and is ignored.
        assert_eq!(r.chunk_range(1).unwrap(), 0..0);
        r.handle_chunk(1, &[]).unwrap();
        r.handle_msg(Msg::Done).unwrap();
        assert_eq!(
            drain(&mut r),
            vec![Output::Revoke, Output::Finished(Outcome::Aborted(reason))]
        );
        assert!(r.is_finished());
        assert!(entries(dir.path()).is_empty(), "the temporary file is gone");
    }

    #[test]
    fn a_silent_sender_is_given_up_on_and_everything_the_upload_held_goes() {
        let dir = tempfile::tempdir().unwrap();
        let data = b"abcdefghijklmnopqrst";
        let mut r = Receiver::new(config(dir.path()));
        assert!(!r.waits_on_peer(), "no transfer yet");
        r.handle_msg(offer("f", data)).unwrap();
        assert!(!r.waits_on_peer(), "the window is the server's own work");
        granted(&mut r, 8);
        assert!(r.waits_on_peer());
        r.handle_chunk(0, &data[0..4]).unwrap();
        drain(&mut r);
        assert_eq!(entries(dir.path()).len(), 1, "the temporary file");
        let reason = RejectReason::Stalled { secs: 60 };
        r.give_up(reason.clone());
        assert_eq!(
            drain(&mut r),
            vec![
                Output::Send(Msg::Abort {
                    reason: reason.clone()
                }),
                Output::Revoke,
                Output::Finished(Outcome::Aborted(reason.clone())),
            ],
            "the window goes at once, not after the sender's Done"
        );
        assert!(r.is_finished() && !r.waits_on_peer());
        assert!(entries(dir.path()).is_empty(), "the temporary file is gone");
        // Once finished there is nothing to give up.
        r.give_up(reason);
        assert_eq!(drain(&mut r), vec![]);
        // A sender that wakes up and carries on meets an unexpected-message error.
        assert!(r.handle_msg(Msg::Done).is_err());
    }

    #[test]
    fn an_abort_waiting_for_the_senders_done_is_given_up_on_too() {
        let dir = tempfile::tempdir().unwrap();
        let data = b"abcdefghijklmnopqrst";
        let mut r = Receiver::new(config(dir.path()));
        r.handle_msg(offer("g", data)).unwrap();
        granted(&mut r, 8);
        // A write failure made the receiver abort; the sender never says Done.
        r.handle_chunk(0, &data[0..4]).unwrap();
        let out: Vec<Output> = std::iter::from_fn(|| r.poll_output()).collect();
        assert!(out.contains(&Output::Consume), "{out:?}");
        let job = r.take_consume().expect("chunks to consume");
        let Consumed { sink, .. } = job.run();
        r.handle_consumed(Consumed {
            sink,
            done: Vec::new(),
            result: Err(StoreError::Io {
                op: "write",
                path: dir.path().join("g"),
                source: std::io::Error::from_raw_os_error(5),
            }),
        })
        .unwrap();
        assert!(matches!(
            drain(&mut r).as_slice(),
            [Output::Send(Msg::Abort { .. })]
        ));
        assert!(r.waits_on_peer(), "waiting for the sender's Done");
        let reason = RejectReason::Stalled { secs: 1 };
        r.give_up(reason.clone());
        assert_eq!(
            drain(&mut r),
            vec![Output::Revoke, Output::Finished(Outcome::Aborted(reason))]
        );
    }
}
