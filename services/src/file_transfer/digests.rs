//! Digests the service already knows, so that a `Fetch` does not read a whole file to
//! hash it again: one client asking for the same large file over and over would
//! otherwise make the server read it in full each time, on the blocking pool, for the
//! price of a few bytes of request.
//!
//! A digest is remembered when an upload is stored (the receiver verified it against
//! the bytes it wrote) and when a fetch had to hash. It is looked up under the
//! [`FileKey`] of the file the fetch opened: device and inode, length, and the
//! modification and status-change times in nanoseconds, as `fstat` reports them on the
//! open file. Replacing the file (a new inode, or a reused inode number, which gets a
//! new ctime), truncating or growing it, or writing to it (mtime) makes a miss and a
//! fresh hash. The ctime is there because mtime can be set back by anyone who may
//! write the file (`touch -d`, `cp -p`, `rsync -t`), while ctime cannot be set from
//! user space.
//!
//! **What a hit can get wrong.** A rewrite in place that keeps the length and lands
//! within the same timestamp tick as the write the digest was taken after leaves every
//! field of the key as it was. Timestamps have nanosecond fields, but Linux stamps
//! files from a clock that advances once per scheduler tick (1 to 10 ms) on most file
//! systems, so two writes a few milliseconds apart can carry the same times. The fetch
//! then offers the old digest with the new bytes, and the client's check of every
//! byte it received against the offered digest answers BAD: nothing wrong is stored.
//! A BAD verdict on a fetch drops the entry, so the next fetch hashes again. This is
//! the same trust the design already gives a file between hashing and reading: a
//! change there is caught by the sender's length checks (a short file aborts) or by
//! the client's verdict.
//!
//! **Memory only.** The store lives as long as the service: after a restart, the first
//! fetch of each file hashes it again. Persisting digests beside the files (an
//! extended attribute) was left out: setting one changes the file's ctime, so the key
//! would have to be taken after it; user xattrs are missing on some of the file
//! systems a store is kept on (9p mounts as in the test VM, older tmpfs, some network
//! and FUSE file systems); and a digest read back from disk is only as trustworthy as
//! whoever could write the attribute, while device and inode numbers need not survive
//! a remount. One hash per file per restart is a small price for none of that.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::file_key::FileKey;
use super::wire::{Digest, HashAlg};

/// What the store did so far (see [`DigestCache::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DigestStats {
    /// Fetches served with a remembered digest, without reading the file.
    pub hits: u64,
    /// Whole files hashed to serve a fetch (misses, and every fetch when the store
    /// holds nothing).
    pub hashed: u64,
    /// Digests held now.
    pub entries: usize,
}

#[derive(Debug)]
struct Entry {
    digest: Digest,
    /// When it was last stored or used: the smallest goes first when the store is full.
    used: u64,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<(FileKey, HashAlg), Entry>,
    clock: u64,
}

/// The service's bounded store of known digests, shared by its connections (a mutex
/// around a map: it is touched once per fetch and once per stored upload, never per
/// chunk). When full, storing evicts the least recently used entry; finding it scans
/// the map, which costs little next to the hash that made the new entry.
#[derive(Debug)]
pub struct DigestCache {
    capacity: usize,
    inner: Mutex<Inner>,
    hits: AtomicU64,
    hashed: AtomicU64,
}

impl DigestCache {
    /// 4096 files: a few hundred kilobytes, more distinct files than a lab store
    /// serves at a time.
    pub const DEFAULT_CAPACITY: usize = 4096;

    /// A store of at most `capacity` digests; 0 remembers nothing (every fetch hashes).
    pub fn new(capacity: usize) -> DigestCache {
        DigestCache {
            capacity,
            inner: Mutex::new(Inner::default()),
            hits: AtomicU64::new(0),
            hashed: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere cannot leave the map inconsistent: every change is one call.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `alg` digest of the file with `key`, if known; counts a hit.
    pub fn get(&self, key: &FileKey, alg: HashAlg) -> Option<Digest> {
        let mut inner = self.lock();
        inner.clock += 1;
        let now = inner.clock;
        let entry = inner.entries.get_mut(&(*key, alg))?;
        entry.used = now;
        let digest = entry.digest;
        drop(inner);
        self.hits.fetch_add(1, Ordering::Relaxed);
        Some(digest)
    }

    /// Remembers that the file with `key` hashes to `digest`.
    pub fn insert(&self, key: FileKey, digest: Digest) {
        if self.capacity == 0 {
            return;
        }
        let mut inner = self.lock();
        inner.clock += 1;
        let used = inner.clock;
        let slot = (key, digest.alg);
        if !inner.entries.contains_key(&slot) && inner.entries.len() >= self.capacity {
            let oldest = inner
                .entries
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                inner.entries.remove(&oldest);
            }
        }
        inner.entries.insert(slot, Entry { digest, used });
    }

    /// Forgets the `alg` digest of `key` (a client found it wrong).
    pub fn forget(&self, key: &FileKey, alg: HashAlg) {
        self.lock().entries.remove(&(*key, alg));
    }

    /// Counts a whole file hashed to serve a fetch.
    pub fn note_hashed(&self) {
        self.hashed.fetch_add(1, Ordering::Relaxed);
    }

    /// Hits, files hashed, and entries held.
    pub fn stats(&self) -> DigestStats {
        DigestStats {
            hits: self.hits.load(Ordering::Relaxed),
            hashed: self.hashed.load(Ordering::Relaxed),
            entries: self.lock().entries.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::file_transfer::hash::hash_bytes;

    fn key(ino: u64) -> FileKey {
        FileKey {
            dev: 1,
            ino,
            len: 10,
            mtime_ns: 5,
            ctime_ns: 6,
        }
    }

    #[test]
    fn a_digest_is_found_under_its_key_and_algorithm_only() {
        let cache = DigestCache::new(8);
        let d = hash_bytes(HashAlg::Sha256, b"abc");
        cache.insert(key(1), d);
        assert_eq!(cache.get(&key(1), HashAlg::Sha256), Some(d));
        assert_eq!(cache.get(&key(1), HashAlg::Blake3), None);
        for changed in [
            FileKey { len: 11, ..key(1) },
            FileKey {
                mtime_ns: 7,
                ..key(1)
            },
            FileKey {
                ctime_ns: 7,
                ..key(1)
            },
            FileKey { dev: 2, ..key(1) },
            key(2),
        ] {
            assert_eq!(cache.get(&changed, HashAlg::Sha256), None, "{changed:?}");
        }
        cache.forget(&key(1), HashAlg::Sha256);
        assert_eq!(cache.get(&key(1), HashAlg::Sha256), None);
        assert_eq!(cache.stats().hits, 1);
    }

    #[test]
    fn the_store_is_bounded_and_evicts_the_least_recently_used() {
        let cache = DigestCache::new(3);
        let d = hash_bytes(HashAlg::Blake3, b"x");
        for ino in 1..=3 {
            cache.insert(key(ino), d);
        }
        // 1 was used last, so 2 is the oldest when 4 comes.
        assert!(cache.get(&key(1), HashAlg::Blake3).is_some());
        cache.insert(key(4), d);
        assert_eq!(cache.stats().entries, 3);
        assert!(cache.get(&key(2), HashAlg::Blake3).is_none());
        for ino in [1, 3, 4] {
            assert!(cache.get(&key(ino), HashAlg::Blake3).is_some(), "{ino}");
        }
        // Storing a known key again evicts nothing.
        cache.insert(key(4), d);
        assert_eq!(cache.stats().entries, 3);
        let off = DigestCache::new(0);
        off.insert(key(1), d);
        assert_eq!(off.stats().entries, 0, "capacity 0 remembers nothing");
    }

    #[test]
    fn a_rewritten_or_replaced_file_has_another_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        let of =
            |p: &std::path::Path| FileKey::of(&std::fs::File::open(p).unwrap().metadata().unwrap());
        let first = of(&path);
        assert_eq!(first, of(&path), "reading changes nothing");
        assert_eq!(first.len, 10);
        // Past the timestamp clock's tick, so that the ctime of the changes below
        // differs from the creation's.
        std::thread::sleep(Duration::from_millis(25));
        // Same length, written later: the mtime moves.
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all(b"9876543210").unwrap();
        f.set_modified(SystemTime::now() + Duration::from_secs(1))
            .unwrap();
        drop(f);
        let rewritten = of(&path);
        assert_eq!(rewritten.len, 10);
        assert_ne!(rewritten, first);
        // Its mtime set back: the ctime still moved.
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_nanos(first.mtime_ns as u64))
            .unwrap();
        drop(f);
        let restored = of(&path);
        assert_eq!(restored.mtime_ns, first.mtime_ns);
        assert_ne!(restored, first, "the ctime tells it apart");
        // Replaced by another file of the same length: another inode.
        let other = dir.path().join("g");
        std::fs::write(&other, b"abcdefghij").unwrap();
        let before = of(&other);
        std::fs::rename(&other, &path).unwrap();
        assert_ne!(of(&path).ino, first.ino);
        assert_eq!(of(&path).ino, before.ino);
    }
}
