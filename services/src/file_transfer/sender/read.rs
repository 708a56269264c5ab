//! The work handed off the connection's thread: reading a chunk blocks on the file,
//! so it runs as a job that owns the sender's source while it runs and gives it back
//! with what it read.

use std::io::{self, Read};

/// One chunk to read from the file, off the thread that serves the connection: it owns
/// the sender's source while it runs. Get it with [`Endpoint::take_read`](crate::file_transfer::Endpoint::take_read) for an
/// [`Output::WriteChunk`](crate::file_transfer::Output::WriteChunk), run it, and hand the result to [`Endpoint::handle_read`](crate::file_transfer::Endpoint::handle_read),
/// which gives back the bytes to copy into the chunk's range of the staging buffer.
pub struct ReadJob {
    pub(super) source: Box<dyn Read + Send>,
    pub(super) index: u32,
    pub(super) at: u64,
    pub(super) len: u32,
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

/// What a [`ReadJob`] read: hand it to [`Endpoint::handle_read`](crate::file_transfer::Endpoint::handle_read).
pub struct ChunkRead {
    pub(super) source: Box<dyn Read + Send>,
    pub(super) index: u32,
    pub(super) at: u64,
    pub(super) result: io::Result<Vec<u8>>,
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
