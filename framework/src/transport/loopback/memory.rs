//! "Registered memory" the transport owns: bytes kept in 64-bit atomic words, so that
//! the in-memory NIC (whichever thread executes a work request) and the application can
//! touch the same bytes at once without `unsafe` and without a data race.
//!
//! This is what a NIC does to registered memory, too: it reads and writes it while the
//! application may be reading it, and a reader can see a torn mixture of old and new
//! bytes. Loopback keeps that property (copies are word by word, relaxed), so a seqlock
//! or a checksum that guards against torn reads is exercised rather than hidden. The
//! ordering that RDMA does promise (the bytes of a request are in place before its
//! completion is seen) comes from the completion queue's lock: every copy finishes
//! before the completion is pushed, and a poller sees it after taking the same lock.
//!
//! No lock is held while bytes move, and nothing is allocated per copy: copies between
//! regions go through a buffer on the stack.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::verbs::Access;

/// Bytes moved per step of a region-to-region copy (a stack buffer).
const STEP: usize = 1024;

/// The bytes of one registration and what the key table knows of it.
pub(super) struct Storage {
    words: Box<[AtomicU64]>,
    len: usize,
    /// The address of byte 0, as work requests name it.
    pub(super) base: u64,
    /// What the registration allows.
    pub(super) access: Access,
    /// Its lkey, which is also its rkey.
    pub(super) key: u32,
    /// Cleared when the registration is dropped: a request still queued with these
    /// bytes fails as on a NIC (the bytes themselves stay alive for it, so nothing
    /// dangles).
    live: AtomicBool,
}

impl Storage {
    /// `len` zeroed bytes at address `base` (allocated here, once per registration).
    pub(super) fn new(len: usize, base: u64, access: Access, key: u32) -> Storage {
        let words = (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect();
        Storage {
            words,
            len,
            base,
            access,
            key,
            live: AtomicBool::new(true),
        }
    }

    /// A copy of `bytes` at address `base`, made word by word in one pass.
    pub(super) fn from_bytes(bytes: &[u8], base: u64, access: Access, key: u32) -> Storage {
        let mut words = Vec::with_capacity(bytes.len().div_ceil(8));
        let mut chunks = bytes.chunks_exact(8);
        words.extend(
            (&mut chunks)
                .map(|c| AtomicU64::new(u64::from_le_bytes(c.try_into().expect("8 bytes")))),
        );
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            words.push(AtomicU64::new(u64::from_le_bytes(last)));
        }
        Storage {
            words: words.into_boxed_slice(),
            len: bytes.len(),
            base,
            access,
            key,
            live: AtomicBool::new(true),
        }
    }

    /// Length in bytes.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// False once the registration was dropped.
    pub(super) fn is_live(&self) -> bool {
        self.live.load(Relaxed)
    }

    /// Marks the registration gone.
    pub(super) fn retire(&self) {
        self.live.store(false, Relaxed);
    }

    /// Copies bytes from `offset` into `out`; the caller checked the range.
    pub(super) fn read(&self, offset: usize, out: &mut [u8]) {
        // The partial word before the first whole one, then whole words, then the rest.
        let head = ((8 - offset % 8) % 8).min(out.len());
        let (first, rest) = out.split_at_mut(head);
        self.read_partial(offset, first);
        let start = (offset + head) / 8;
        let mut chunks = rest.chunks_exact_mut(8);
        let words = &self.words[start..start + chunks.len()];
        for (chunk, word) in (&mut chunks).zip(words) {
            chunk.copy_from_slice(&word.load(Relaxed).to_le_bytes());
        }
        self.read_partial((start + words.len()) * 8, chunks.into_remainder());
    }

    /// Bytes within one word.
    fn read_partial(&self, offset: usize, out: &mut [u8]) {
        if out.is_empty() {
            return;
        }
        let at = offset % 8;
        let bytes = self.words[offset / 8].load(Relaxed).to_le_bytes();
        out.copy_from_slice(&bytes[at..at + out.len()]);
    }

    /// Copies `data` in at `offset`; the caller checked the range. A word shared with
    /// bytes outside the range is changed with two atomic operations that leave those
    /// bytes alone (neighbouring pool chunks share words).
    pub(super) fn write(&self, offset: usize, data: &[u8]) {
        let head = ((8 - offset % 8) % 8).min(data.len());
        let (first, rest) = data.split_at(head);
        self.write_partial(offset, first);
        let start = (offset + head) / 8;
        let mut chunks = rest.chunks_exact(8);
        let words = &self.words[start..start + chunks.len()];
        for (chunk, word) in (&mut chunks).zip(words) {
            word.store(
                u64::from_le_bytes(chunk.try_into().expect("8 bytes")),
                Relaxed,
            );
        }
        self.write_partial((start + words.len()) * 8, chunks.remainder());
    }

    /// Bytes within one word, its other bytes left alone.
    fn write_partial(&self, offset: usize, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let at = offset % 8;
        let mut bytes = [0u8; 8];
        bytes[at..at + data.len()].copy_from_slice(data);
        let mut mask = [0u8; 8];
        mask[at..at + data.len()].fill(0xff);
        let word = &self.words[offset / 8];
        word.fetch_and(!u64::from_le_bytes(mask), Relaxed);
        word.fetch_or(u64::from_le_bytes(bytes), Relaxed);
    }

    /// The 8-byte word at `offset` (8-aligned, inside; the caller checked), for atomics.
    pub(super) fn word(&self, offset: usize) -> &AtomicU64 {
        &self.words[offset / 8]
    }
}

/// A range of a registration, held by a queued work request: the `Arc` keeps the bytes
/// alive however long the request waits.
#[derive(Clone)]
pub(super) struct Slice {
    pub(super) storage: Arc<Storage>,
    pub(super) offset: usize,
    pub(super) len: usize,
}

impl Slice {
    /// Copies all of `src` into `dst` at `dst_offset` (the caller checked both ranges).
    pub(super) fn copy_into(&self, dst: &Storage, dst_offset: usize) {
        copy(&self.storage, self.offset, dst, dst_offset, self.len);
    }
}

/// Copies `len` bytes between two registrations (or within one): word to word when
/// both ranges start at the same offset within a word (pool chunks and messages do),
/// through a stack buffer otherwise.
pub(super) fn copy(src: &Storage, src_offset: usize, dst: &Storage, dst_offset: usize, len: usize) {
    if src_offset % 8 == dst_offset % 8 {
        let head = ((8 - src_offset % 8) % 8).min(len);
        let mut buf = [0u8; 8];
        src.read_partial(src_offset, &mut buf[..head]);
        dst.write_partial(dst_offset, &buf[..head]);
        let (s, d) = ((src_offset + head) / 8, (dst_offset + head) / 8);
        let words = (len - head) / 8;
        for (from, to) in src.words[s..s + words].iter().zip(&dst.words[d..d + words]) {
            to.store(from.load(Relaxed), Relaxed);
        }
        let done = head + words * 8;
        let tail = len - done;
        src.read_partial(src_offset + done, &mut buf[..tail]);
        dst.write_partial(dst_offset + done, &buf[..tail]);
        return;
    }
    let mut buf = [0u8; STEP];
    let mut done = 0;
    while done < len {
        let n = STEP.min(len - done);
        src.read(src_offset + done, &mut buf[..n]);
        dst.write(dst_offset + done, &buf[..n]);
        done += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_made_in_one_pass_reads_back_whole_with_its_tail() {
        for len in [1, 7, 8, 9, 64, 1021] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
            let s = Storage::from_bytes(&bytes, 0x1000, Access::LOCAL_WRITE, 1);
            assert_eq!(s.len(), len);
            let mut out = vec![0u8; len];
            s.read(0, &mut out);
            assert_eq!(out, bytes, "{len} bytes");
        }
    }

    #[test]
    fn unaligned_writes_leave_their_neighbours_alone() {
        let s = Storage::new(40, 0x1000, Access::LOCAL_WRITE, 1);
        s.write(0, &[0xaa; 40]);
        s.write(3, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
        let mut out = [0u8; 40];
        s.read(0, &mut out);
        assert_eq!(&out[..3], &[0xaa; 3]);
        assert_eq!(&out[3..14], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
        assert_eq!(&out[14..], &[0xaa; 26]);
        let d = Storage::new(5000, 0, Access::LOCAL_WRITE, 2);
        // Same offset within a word: the word-to-word path, with a head and a tail.
        copy(&s, 3, &d, 11, 11);
        let mut got = [0u8; 13];
        d.read(10, &mut got);
        assert_eq!(got, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0]);
        let pattern: Vec<u8> = (0..4000u32).map(|i| (i * 7 + 1) as u8).collect();
        let big = Storage::new(4000, 0, Access::LOCAL_WRITE, 3);
        big.write(0, &pattern);
        for (from, to, len) in [(0, 8, 4000 - 8), (5, 13, 3000), (1, 2, 3990), (0, 0, 4000)] {
            let d = Storage::new(5000, 0, Access::LOCAL_WRITE, 4);
            copy(&big, from, &d, to, len);
            let mut out = vec![0u8; len];
            d.read(to, &mut out);
            assert_eq!(out, pattern[from..from + len], "{from} -> {to}, {len}");
        }
        copy(&s, 3, &d, 4093, 11);
        let mut got = [0u8; 11];
        d.read(4093, &mut got);
        assert_eq!(got, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
    }
}
