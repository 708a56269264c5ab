//! Incremental hashing over both algorithms, fed chunk by chunk in file order.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use sha2::Digest as _;

use super::wire::{Digest, HashAlg};

/// Buffer size for hashing files and readers.
const READ_BUF: usize = 1 << 20;

/// A hash in progress.
#[derive(Clone)]
pub struct Hasher {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Sha256(sha2::Sha256),
    // Boxed: the BLAKE3 state is about 2 KB.
    Blake3(Box<blake3::Hasher>),
}

impl std::fmt::Debug for Hasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hasher").field("alg", &self.alg()).finish()
    }
}

impl Hasher {
    /// An empty hash with `alg`.
    pub fn new(alg: HashAlg) -> Hasher {
        let inner = match alg {
            HashAlg::Sha256 => Inner::Sha256(sha2::Sha256::new()),
            HashAlg::Blake3 => Inner::Blake3(Box::new(blake3::Hasher::new())),
        };
        Hasher { inner }
    }

    /// The algorithm.
    pub fn alg(&self) -> HashAlg {
        match self.inner {
            Inner::Sha256(_) => HashAlg::Sha256,
            Inner::Blake3(_) => HashAlg::Blake3,
        }
    }

    /// Adds the next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        match &mut self.inner {
            Inner::Sha256(h) => h.update(bytes),
            Inner::Blake3(h) => {
                h.update(bytes);
            }
        }
    }

    /// The digest of everything added.
    pub fn finalize(self) -> Digest {
        match self.inner {
            Inner::Sha256(h) => Digest {
                alg: HashAlg::Sha256,
                bytes: h.finalize().into(),
            },
            Inner::Blake3(h) => Digest {
                alg: HashAlg::Blake3,
                bytes: *h.finalize().as_bytes(),
            },
        }
    }
}

/// The digest of a byte string.
pub fn hash_bytes(alg: HashAlg, bytes: &[u8]) -> Digest {
    let mut h = Hasher::new(alg);
    h.update(bytes);
    h.finalize()
}

/// Hashes everything `reader` yields; returns the digest and the byte count.
///
/// # Errors
///
/// The reader's error (interrupted reads are retried).
pub fn hash_reader(alg: HashAlg, mut reader: impl Read) -> io::Result<(Digest, u64)> {
    let mut h = Hasher::new(alg);
    let mut buf = vec![0u8; READ_BUF];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
        total += n as u64;
    }
    Ok((h.finalize(), total))
}

/// Hashes a file (what the sender offers); returns the digest and the file's length.
///
/// # Errors
///
/// Opening or reading the file failed.
pub fn hash_file(alg: HashAlg, path: &Path) -> io::Result<(Digest, u64)> {
    hash_reader(alg, File::open(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Known answers: `printf abc | sha256sum` and `printf abc | b3sum`.
    const ABC_SHA256: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    const ABC_BLAKE3: &str = "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85";
    const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn known_answers() {
        assert_eq!(hash_bytes(HashAlg::Sha256, b"abc").to_hex(), ABC_SHA256);
        assert_eq!(hash_bytes(HashAlg::Blake3, b"abc").to_hex(), ABC_BLAKE3);
        assert_eq!(hash_bytes(HashAlg::Sha256, b"").to_hex(), EMPTY_SHA256);
    }

    #[test]
    fn incremental_equals_one_shot() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 31 % 251) as u8).collect();
        for alg in [HashAlg::Sha256, HashAlg::Blake3] {
            let mut h = Hasher::new(alg);
            for piece in data.chunks(777) {
                h.update(piece);
            }
            assert_eq!(h.finalize(), hash_bytes(alg, &data));
            let (d, n) = hash_reader(alg, &data[..]).unwrap();
            assert_eq!((d, n), (hash_bytes(alg, &data), data.len() as u64));
        }
    }

    #[test]
    fn hashes_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"abc").unwrap();
        let (d, n) = hash_file(HashAlg::Sha256, &p).unwrap();
        assert_eq!((d.to_hex().as_str(), n), (ABC_SHA256, 3));
    }
}
