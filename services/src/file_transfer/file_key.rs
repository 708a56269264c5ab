//! A file's identity and state as `fstat` sees it. The store names the file it just
//! committed by it, and the digest cache keys what it remembers by it; it sits below
//! both.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;

/// The identity and state of a file as `fstat` sees it: what must be unchanged for a
/// remembered digest to describe the file's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileKey {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
    /// `st_size`.
    pub len: u64,
    /// `st_mtime` in nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// `st_ctime` in nanoseconds since the epoch.
    pub ctime_ns: i128,
}

impl FileKey {
    /// The key of the file `meta` describes (take it with `File::metadata`, on the
    /// open file, not by path: the name may point elsewhere by then).
    pub fn of(meta: &Metadata) -> FileKey {
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        FileKey {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.size(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
        }
    }
}
