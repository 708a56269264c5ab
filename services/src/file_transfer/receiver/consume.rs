//! The work handed off the connection's thread: hashing and writing chunks blocks, so
//! it runs as a job that owns the sink while it runs and gives it back with what it did.

use crate::file_transfer::hash::Hasher;
use crate::file_transfer::store::{StoreError, TempFile};

/// Where received chunks go, in order: the running hash and the temporary file. It
/// travels to the thread that consumes chunks ([`ConsumeJob`]) and back.
#[derive(Debug)]
pub struct Sink {
    pub(super) hasher: Hasher,
    pub(super) temp: TempFile,
}

/// Chunks to hash and append, in order, off the connection's thread (see
/// [`Output::Consume`](crate::file_transfer::Output::Consume)).
#[derive(Debug)]
pub struct ConsumeJob {
    pub(super) sink: Box<Sink>,
    pub(super) chunks: Vec<(u32, Vec<u8>)>,
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

/// What a [`ConsumeJob`] did: hand it to [`Endpoint::handle_consumed`](crate::file_transfer::Endpoint::handle_consumed).
#[derive(Debug)]
pub struct Consumed {
    pub(super) sink: Box<Sink>,
    pub(super) done: Vec<u32>,
    pub(super) result: std::result::Result<(), StoreError>,
}
