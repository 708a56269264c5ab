//! The seqlock layout of a served region and the client's versioned read, with no I/O.
//!
//! ```text
//! registered memory:  | version: u64 LE | copy 0: len bytes | ... | copy k-1 |
//!                     0                 8                   8+len      8+k*len
//! ```
//!
//! Version `v` (even) lives in copy `(v / 2) % k`. The writer (`SharedRegion::update` of
//! the transport, which owns the registered memory) stores an odd marker, writes
//! the next copy, then stores the new (even, larger) version, with a full fence between
//! the steps. A reader ([`VersionedRead`]) reads the version, then the data of its copy,
//! then the version again, each with its own RDMA READ issued after the previous one
//! completed; it accepts the data when the first version was even and the second is at
//! most `2 (k - 1)` larger (equal, for `k = 1`). Bytes within one READ may be fetched in
//! any order, which is why the version is never read in the same READ as the data.
//!
//! Why that is enough: the copy of `v` is rewritten only by the update to `v + 2k`,
//! whose marker `v + 2k - 1` is visible before any of its data stores. If the data READ
//! saw any byte of that update, the second version READ (issued later) sees the marker
//! or a later version, and the reader retries. More copies let a read succeed while
//! other copies are being written, so readers do not starve when updates come faster
//! than a read's three round trips.

/// Bytes before the data: one little-endian `u64` version word.
pub const HEADER_LEN: usize = rdmactor::transport::VERSION_LEN;

use rdmactor::transport::accepts;

/// The version a region's first content gets; every update adds 2 (even = stable).
pub const FIRST_VERSION: u64 = 2;

/// True for a version no writer is in the middle of.
pub fn is_stable(version: u64) -> bool {
    version.is_multiple_of(2)
}

/// Decodes a version word.
///
/// # Panics
/// When `word` is shorter than [`HEADER_LEN`].
pub fn decode_version(word: &[u8]) -> u64 {
    u64::from_le_bytes(word[..HEADER_LEN].try_into().expect("8 bytes"))
}

/// What a [`VersionedRead`] wants done next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadStep {
    /// READ the version word ([`HEADER_LEN`] bytes at the start of the registration),
    /// then call [`VersionedRead::handle_version`].
    Version,
    /// READ the requested data range, then call [`VersionedRead::handle_data`].
    Data,
    /// Finished: take the outcome with [`VersionedRead::take_outcome`].
    Finished,
}

/// Data read between two equal, even versions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionedData {
    /// The bytes.
    pub data: Vec<u8>,
    /// The version they belong to.
    pub version: u64,
    /// Attempts thrown away because a writer was busy or finished in between.
    pub retries: u32,
}

/// The versioned read gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the region changed during each of {attempts} read attempts")]
pub struct Contended {
    /// Attempts made.
    pub attempts: u32,
}

#[derive(Debug)]
enum State {
    /// Waiting for a first, even version.
    NeedVersion,
    /// An even version was read; the data comes next.
    NeedData {
        version: u64,
    },
    /// Data read after `version`; the version again decides.
    NeedCheck {
        version: u64,
        data: Vec<u8>,
    },
    Done(Option<Result<VersionedData, Contended>>),
}

/// The client side of the seqlock: says which READ to issue next and decides, from what
/// they returned, whether the data is consistent. Drive it by calling
/// [`poll_step`](Self::poll_step), doing the READ it names and handing the bytes back
/// with the matching `handle_*`, until the step is [`ReadStep::Finished`].
///
/// A retry reuses the last version it read when that one is even, so an attempt after
/// the first costs two READs instead of three.
#[derive(Debug)]
pub struct VersionedRead {
    state: State,
    attempts: u32,
    max_attempts: u32,
    copies: usize,
}

impl VersionedRead {
    /// A read that gives up with [`Contended`] after `max_attempts` inconsistent attempts.
    pub fn new(max_attempts: u32) -> Self {
        Self::with_copies(max_attempts, 1)
    }

    /// A read of a region that keeps `copies` copies of its data (see
    /// `rdmactor::transport::SharedRegion`): data read from the copy of version `v` is
    /// accepted while the version stays within `v + 2 (copies - 1)`.
    pub fn with_copies(max_attempts: u32, copies: usize) -> Self {
        VersionedRead {
            copies: copies.max(1),
            state: State::NeedVersion,
            attempts: 0,
            max_attempts: max_attempts.max(1),
        }
    }

    /// The READ to issue next.
    #[must_use]
    pub fn poll_step(&self) -> ReadStep {
        match self.state {
            State::NeedVersion | State::NeedCheck { .. } => ReadStep::Version,
            State::NeedData { .. } => ReadStep::Data,
            State::Done(_) => ReadStep::Finished,
        }
    }

    /// The version whose copy the next data READ must read ([`ReadStep::Data`]).
    pub fn data_version(&self) -> Option<u64> {
        match self.state {
            State::NeedData { version } => Some(version),
            _ => None,
        }
    }

    /// The version word was read.
    pub fn handle_version(&mut self, version: u64) {
        let state = std::mem::replace(&mut self.state, State::NeedVersion);
        self.state = match state {
            State::NeedVersion if is_stable(version) => State::NeedData { version },
            State::NeedVersion => self.retry(None),
            State::NeedCheck {
                version: before,
                data,
            } if accepts(before, version, self.copies) => State::Done(Some(Ok(VersionedData {
                data,
                version: before,
                retries: self.attempts,
            }))),
            State::NeedCheck { .. } => self.retry(is_stable(version).then_some(version)),
            other => {
                debug_assert!(false, "version handed to a read in {other:?}");
                other
            }
        };
    }

    /// The data range was read.
    pub fn handle_data(&mut self, data: Vec<u8>) {
        let state = std::mem::replace(&mut self.state, State::NeedVersion);
        self.state = match state {
            State::NeedData { version } => State::NeedCheck { version, data },
            other => {
                debug_assert!(false, "data handed to a read in {other:?}");
                other
            }
        };
    }

    /// The outcome, once [`ReadStep::Finished`]; `None` before, or when taken already.
    pub fn take_outcome(&mut self) -> Option<Result<VersionedData, Contended>> {
        match &mut self.state {
            State::Done(outcome) => outcome.take(),
            _ => None,
        }
    }

    /// One attempt failed; start the next one from `version` when it is usable.
    fn retry(&mut self, version: Option<u64>) -> State {
        // Our own count, stopped at `max_attempts` below.
        self.attempts = self.attempts.saturating_add(1);
        if self.attempts >= self.max_attempts {
            return State::Done(Some(Err(Contended {
                attempts: self.attempts,
            })));
        }
        match version {
            Some(version) => State::NeedData { version },
            None => State::NeedVersion,
        }
    }
}
