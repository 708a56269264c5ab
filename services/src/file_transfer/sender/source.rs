//! Opening and hashing the file to send: the offer names its digest, so the whole file
//! is read before the first message, and a client that leaves meanwhile must be able
//! to stop that read.

use std::fs::File;
use std::io::{self, Read, Seek};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::file_transfer::hash::hash_reader;
use crate::file_transfer::store::{open_source, StoreError};
use crate::file_transfer::wire::{FileOffer, HashAlg, RejectReason};

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
