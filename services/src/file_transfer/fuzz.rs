//! Seeded, bounded randomized message sequences against the state machines: arbitrary
//! and mutated wire messages, chunk arrivals and completions fed to a [`Sender`], a
//! [`Receiver`] and a [`Server`], whose only allowed reactions are outputs and errors.
//! A panic fails the test. The driver below answers every output the way a session
//! would (with bounded buffers), so what is exercised is the protocol logic, not the
//! harness. The same entry point serves the cargo-fuzz target in `fuzz/`.

use std::io::Cursor;
use std::sync::Arc;

use super::endpoint::Endpoint;
use super::hash::hash_bytes;
use super::output::{ChunkWrite, Output};
use super::receiver::Receiver;
use super::sender::Sender;
use super::server::Server;
use super::wire::{
    BadReason, Digest, FileOffer, HashAlg, Msg, RejectReason, RemoteWindow, SecretKey, WindowGrant,
    DIGEST_LEN,
};
use super::Config;

pub use rdmactor::fuzz::{Bytes, Entropy, SplitMix};

/// Interesting integers: the edges where arithmetic overflows, and small values.
fn int(e: &mut impl Entropy) -> u64 {
    match e.below(6) {
        0 => u64::MAX - e.below(2),
        1 => e.below(5),
        2 => 1 << e.below(64),
        3 => e.below(100),
        _ => e.next_u64(),
    }
}

fn small_u32(e: &mut impl Entropy) -> u32 {
    if e.one_in(8) {
        int(e) as u32
    } else {
        e.below(5) as u32
    }
}

fn name(e: &mut impl Entropy) -> String {
    [
        "f",
        "g",
        "",
        "../x",
        ".hidden",
        "a/b",
        ".f.rdmactor-tmp-0",
        "alice",
    ][e.below(8) as usize]
        .to_owned()
}

fn alg(e: &mut impl Entropy) -> HashAlg {
    if e.one_in(2) {
        HashAlg::Sha256
    } else {
        HashAlg::Blake3
    }
}

fn digest(e: &mut impl Entropy) -> Digest {
    let mut bytes = [0u8; DIGEST_LEN];
    bytes[0] = e.below(256) as u8;
    Digest { alg: alg(e), bytes }
}

/// A grant whose region often has the consistent length, at addresses that often sit
/// at the top of the address space (item 1 of the security issue).
fn grant(e: &mut impl Entropy) -> Option<WindowGrant> {
    if e.one_in(4) {
        return None;
    }
    let slots = small_u32(e);
    let slot_len = small_u32(e);
    let len = if e.one_in(3) {
        int(e)
    } else {
        u64::from(slots) * u64::from(slot_len)
    };
    Some(WindowGrant {
        region: RemoteWindow {
            addr: int(e),
            len,
            rkey: e.next_u64() as u32,
        },
        slots,
        slot_len,
    })
}

/// Any message, with field values near the edges.
pub fn message(e: &mut impl Entropy) -> Msg {
    match e.below(14) {
        0 => Msg::Offer(FileOffer {
            name: name(e),
            len: if e.one_in(2) { e.below(12) } else { int(e) },
            digest: digest(e),
            overwrite: e.one_in(2),
        }),
        1 => Msg::Fetch {
            name: name(e),
            alg: alg(e),
        },
        2 => Msg::Reject {
            reason: [
                RejectReason::Exists,
                RejectReason::NotFound,
                RejectReason::TooLarge { max: int(e) },
            ][e.below(3) as usize]
                .clone(),
        },
        3 | 4 => Msg::Grant { window: grant(e) },
        5 => Msg::Ack { next: small_u32(e) },
        6 => Msg::Done,
        7 => Msg::Good,
        8 => Msg::Bad {
            reason: BadReason::Mismatch { got: digest(e) },
        },
        9 => Msg::Identify { id: name(e) },
        10 => {
            if e.one_in(2) {
                Msg::Secret {
                    key: SecretKey("k".into()),
                }
            } else {
                Msg::Refused
            }
        }
        12 => Msg::Stat {
            name: name(e),
            alg: alg(e),
        },
        13 => Msg::Held {
            len: int(e),
            digest: digest(e),
        },
        _ => Msg::Grant { window: grant(e) },
    }
}

/// A message as bytes: valid, mutated (a byte flipped, truncated) or random; what
/// does not decode is dropped, as `Msg::decode` is the only way in.
fn wire_message(e: &mut impl Entropy) -> Option<Msg> {
    let mut bytes = message(e).encode();
    match e.below(4) {
        0 if !bytes.is_empty() => {
            let i = e.below(bytes.len() as u64) as usize;
            bytes[i] ^= 1 << e.below(8);
        }
        1 => bytes.truncate(e.below(bytes.len() as u64 + 1) as usize),
        2 => bytes = (0..e.below(24)).map(|_| e.next_u64() as u8).collect(),
        _ => {}
    }
    Msg::decode(&bytes).ok()
}

/// The largest buffer the driver hands out; grants above it are refused by the state
/// machines' own limits long before (the test config's window is 64 bytes).
const MAX_BUF: u64 = 1 << 20;

/// A session's answers to outputs, with bounded buffers. Returns false once the
/// endpoint returned an error (it is then dropped, as a session would).
fn drive(ep: &mut dyn Endpoint, e: &mut impl Entropy, window: &mut Vec<u8>) -> bool {
    while let Some(out) = ep.poll_output() {
        let r = match out {
            Output::GrantWindow { len } => {
                assert!(len <= MAX_BUF, "a window of {len} bytes asked for");
                *window = vec![0; len as usize];
                let len = if e.one_in(16) { int(e) } else { len };
                ep.handle_window(RemoteWindow {
                    addr: int(e),
                    len,
                    rkey: 1,
                })
            }
            Output::Stage { len } => {
                assert!(len <= 64 << 20, "staging of {len} bytes");
                Ok(())
            }
            Output::WriteChunk(c) => {
                let mut dst = vec![0; c.len as usize];
                ep.fill_chunk(&c, &mut dst)
            }
            Output::Consume => match ep.take_consume() {
                Some(job) => ep.handle_consumed(job.run()),
                None => Ok(()),
            },
            Output::Prepare => match ep.take_prepare() {
                Some(job) => ep.handle_prepared(job.run()),
                None => Ok(()),
            },
            Output::Delete => match ep.take_delete() {
                Some(job) => ep.handle_deleted(job.run()),
                None => Ok(()),
            },
            Output::Commit => match ep.take_commit() {
                Some(t) => ep.handle_committed(t.commit()),
                None => Ok(()),
            },
            Output::Send(_) | Output::Revoke | Output::Finished(_) => Ok(()),
            Output::Admit { .. } => unreachable!("the fuzzed endpoints keep no quotas"),
        };
        if r.is_err() {
            return false;
        }
    }
    true
}

/// One input to an endpoint, chosen by `e`.
fn poke(ep: &mut dyn Endpoint, e: &mut impl Entropy, window: &[u8]) -> bool {
    let r = match e.below(8) {
        0..=4 => match wire_message(e) {
            Some(m) => ep.handle_msg(m),
            None => Ok(()),
        },
        5 => {
            let index = small_u32(e);
            match ep.chunk_range(index) {
                Ok(range) => match window.get(range) {
                    Some(bytes) => ep.handle_chunk(index, bytes),
                    None => Ok(()),
                },
                Err(_) if e.one_in(2) => ep.handle_chunk(index, &window[..window.len().min(3)]),
                Err(_) => Ok(()),
            }
        }
        6 => ep.handle_write_done(small_u32(e)),
        _ => {
            let c = ChunkWrite {
                index: small_u32(e),
                slot: small_u32(e),
                offset: int(e),
                len: small_u32(e),
                remote: RemoteWindow {
                    addr: int(e),
                    len: int(e),
                    rkey: 0,
                },
            };
            let mut dst = vec![0; (c.len as usize).min(16)];
            ep.fill_chunk(&c, &mut dst)
        }
    };
    r.is_ok()
}

/// One randomized sequence of at most `steps` inputs against one of the state machines
/// (chosen by `e`), in a scratch directory. Panics only if a state machine does.
pub fn run_sequence(e: &mut impl Entropy, dir: &std::path::Path, steps: usize) {
    let config = Arc::new(
        Config::new(dir)
            .with_window(2, 32)
            .with_max_size(4096)
            .with_secret("alice", "a-key"),
    );
    let data: Vec<u8> = (0..e.below(12)).map(|i| i as u8).collect();
    std::fs::write(dir.join("f"), &data).ok();
    let offer = FileOffer {
        name: "f".into(),
        len: data.len() as u64,
        digest: hash_bytes(HashAlg::Sha256, &data),
        overwrite: false,
    };
    let mut ep: Box<dyn Endpoint> = match e.below(3) {
        0 => match Sender::new(offer, Box::new(Cursor::new(data))) {
            Ok(s) => Box::new(s.with_identity("alice").with_max_window(4096)),
            Err(_) => return,
        },
        1 => match Receiver::fetch(Arc::clone(&config), "f", alg(e), e.one_in(2)) {
            Ok(r) => Box::new(r),
            Err(_) => return,
        },
        _ => Box::new(Server::new(config)),
    };
    let mut window = Vec::new();
    for _ in 0..steps {
        if !drive(&mut *ep, e, &mut window) || !poke(&mut *ep, e, &window) {
            // An error ends the transfer; the session drops the state machine.
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 3000 seeded sequences of up to 24 inputs each: no input order or value may
    /// panic a state machine (a `Grant` at the top of the address space once did).
    #[test]
    fn random_message_sequences_never_panic() {
        let dir = tempfile::tempdir().unwrap();
        for seed in 0..3000u64 {
            let sub = dir.path().join(seed.to_string());
            std::fs::create_dir(&sub).unwrap();
            let mut e = SplitMix(seed);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_sequence(&mut e, &sub, 24)
            }));
            assert!(r.is_ok(), "seed {seed} panicked");
            std::fs::remove_dir_all(&sub).unwrap();
        }
    }
}
