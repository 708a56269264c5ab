//! End-to-end tests of the state machines through a deterministic in-memory harness:
//! two endpoints, a queue each way standing for the RC queue pair (messages and
//! WRITE_WITH_IMMs in posting order), the receiver's window and the sender's staging
//! buffer as byte arrays. A WRITE copies the staging bytes when it is delivered, as a
//! NIC may read them any time before the local completion, so a sender that reused a
//! staging slot too early would corrupt the file and fail the digest.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;

use rdmactor_testkit::pattern;
use sha2::Digest as _;

use super::store::tests::entries;
use super::*;

const SLOTS: u32 = 2;
const SLOT_LEN: u32 = 64 << 10;

/// What travels on the queue pair towards one side.
#[derive(Debug)]
enum Wire {
    Msg(Vec<u8>),
    Write(ChunkWrite),
}

struct Side {
    ep: Option<Box<dyn Endpoint>>,
    window: Option<(RemoteWindow, Vec<u8>)>,
    staging: Vec<u8>,
    inbox: VecDeque<Wire>,
    /// Local completions of this side's WRITEs, not yet reported.
    completions: VecDeque<u32>,
    outcomes: Vec<Outcome>,
    /// Flip a byte of this chunk in the window before handing it over.
    corrupt: Option<u32>,
    rkey: u32,
}

impl Side {
    fn new(ep: Box<dyn Endpoint>, rkey: u32) -> Side {
        Side {
            ep: Some(ep),
            window: None,
            staging: Vec::new(),
            inbox: VecDeque::new(),
            completions: VecDeque::new(),
            outcomes: Vec::new(),
            corrupt: None,
            rkey,
        }
    }
}

/// A client (side 0) and a server (side 1).
struct Pair {
    sides: [Side; 2],
    /// WRITEs and messages carried, for the pipelining checks.
    writes: usize,
    acks: usize,
    max_queued_writes: usize,
}

/// Which side failed, and how.
#[derive(Debug)]
#[allow(dead_code)] // read through Debug when a test fails
struct Failure {
    side: usize,
    error: TransferError,
}

impl Pair {
    fn new(client: Box<dyn Endpoint>, server: Box<dyn Endpoint>) -> Pair {
        Pair {
            sides: [Side::new(client, 0x100), Side::new(server, 0x200)],
            writes: 0,
            acks: 0,
            max_queued_writes: 0,
        }
    }

    fn client(&self) -> &Side {
        &self.sides[0]
    }

    fn server(&self) -> &Side {
        &self.sides[1]
    }

    /// Carries out every output of side `i`.
    fn drain(&mut self, i: usize) -> Result<(), Failure> {
        let fail = |error| Failure { side: i, error };
        let (a, b) = self.sides.split_at_mut(1);
        let (me, peer) = if i == 0 {
            (&mut a[0], &mut b[0])
        } else {
            (&mut b[0], &mut a[0])
        };
        let Some(ep) = me.ep.as_deref_mut() else {
            return Ok(());
        };
        while let Some(out) = ep.poll_output() {
            match out {
                Output::Send(m) => {
                    if matches!(m, Msg::Ack { .. }) {
                        self.acks += 1;
                    }
                    peer.inbox.push_back(Wire::Msg(m.encode()));
                }
                Output::GrantWindow { len } => {
                    assert!(me.window.is_none(), "one window at a time");
                    me.rkey += 1;
                    let region = RemoteWindow {
                        addr: 0x7f00_0000_0000 + u64::from(me.rkey) * 0x1000,
                        len,
                        rkey: me.rkey,
                    };
                    me.window = Some((region, vec![0; len as usize]));
                    ep.handle_window(region).map_err(fail)?;
                }
                Output::Revoke => {
                    assert!(me.window.take().is_some(), "revoke without a window");
                }
                Output::Stage { len } => me.staging = vec![0; len as usize],
                Output::WriteChunk(c) => {
                    // Both ways a driver may fill a chunk: a read job (as the server
                    // does, off its poller) for odd chunks, in place for even ones.
                    if c.index % 2 == 1 {
                        let job = ep.take_read(&c).map_err(fail)?;
                        assert_eq!(job.index(), c.index);
                        let bytes = ep.handle_read(job.run()).map_err(fail)?;
                        if ep.stopped_sending() {
                            continue; // the read failed: aborted, nothing to post
                        }
                        me.staging[c.range()].copy_from_slice(&bytes);
                    } else {
                        ep.fill_chunk(&c, &mut me.staging[c.range()])
                            .map_err(fail)?;
                        if ep.stopped_sending() {
                            continue;
                        }
                    }
                    peer.inbox.push_back(Wire::Write(c));
                    self.writes += 1;
                    let queued = peer
                        .inbox
                        .iter()
                        .filter(|w| matches!(w, Wire::Write(_)))
                        .count();
                    self.max_queued_writes = self.max_queued_writes.max(queued);
                }
                Output::Consume => {
                    // A real driver consumes on another thread; here, at once.
                    let job = ep.take_consume().expect("chunks to consume");
                    ep.handle_consumed(job.run()).map_err(fail)?;
                }
                Output::Prepare => {
                    // A real driver hashes on another thread; here, at once.
                    let job = ep.take_prepare().expect("a fetch to prepare");
                    assert!(ep.take_prepare().is_none(), "taken once");
                    ep.handle_prepared(job.run()).map_err(fail)?;
                }
                Output::Commit => {
                    // A real driver commits on another thread; here, at once.
                    let temp = ep.take_commit().expect("a file to commit");
                    assert!(ep.take_commit().is_none(), "taken once");
                    ep.handle_committed(temp.commit()).map_err(fail)?;
                }
                Output::Delete => {
                    let job = ep.take_delete().expect("a file to delete");
                    ep.handle_deleted(job.run()).map_err(fail)?;
                }
                Output::Finished(o) => me.outcomes.push(o),
                Output::Admit { .. } => panic!("the harness keeps no quotas"),
            }
        }
        Ok(())
    }

    /// Delivers the next item of side `i`'s inbox. Returns whether there was one.
    fn deliver(&mut self, i: usize) -> Result<bool, Failure> {
        let fail = |error| Failure { side: i, error };
        let (a, b) = self.sides.split_at_mut(1);
        let (me, peer) = if i == 0 {
            (&mut a[0], &mut b[0])
        } else {
            (&mut b[0], &mut a[0])
        };
        let Some(item) = me.inbox.pop_front() else {
            return Ok(false);
        };
        let Some(ep) = me.ep.as_deref_mut() else {
            return Ok(true); // the endpoint is gone (connection dropped)
        };
        match item {
            Wire::Msg(bytes) => ep
                .handle_msg(Msg::decode(&bytes).map_err(fail)?)
                .map_err(fail)?,
            Wire::Write(c) => {
                // What the NIC checks: a live window, its rkey, the bounds.
                let (region, window) = me.window.as_mut().expect("WRITE into a live window");
                assert_eq!(c.remote.rkey, region.rkey, "rkey");
                let offset = c.remote.addr - region.addr;
                assert!(
                    offset + c.remote.len <= region.len,
                    "WRITE inside the window"
                );
                let (off, len) = (offset as usize, c.remote.len as usize);
                window[off..off + len].copy_from_slice(&peer.staging[c.range()]);
                peer.completions.push_back(c.index);
                let range = ep.chunk_range(c.imm()).map_err(fail)?;
                assert_eq!(range, off..off + len, "both sides agree on the slot");
                if me.corrupt == Some(c.index) {
                    window[range.start] ^= 0x01;
                }
                ep.handle_chunk(c.imm(), &window[range]).map_err(fail)?;
            }
        }
        Ok(true)
    }

    /// One round: each side in turn acts on its outputs, gets one item, and (every
    /// other round, so that Acks often overtake them) one local completion.
    fn round(&mut self, n: usize) -> Result<bool, Failure> {
        let mut busy = false;
        for i in 0..2 {
            self.drain(i)?;
            busy |= self.deliver(i)?;
            self.drain(i)?;
            if n % 2 == 1 || self.sides[i].inbox.is_empty() {
                if let Some(index) = self.sides[i].completions.pop_front() {
                    busy = true;
                    if let Some(ep) = self.sides[i].ep.as_deref_mut() {
                        ep.handle_write_done(index)
                            .map_err(|error| Failure { side: i, error })?;
                    }
                }
            }
        }
        Ok(busy)
    }

    /// Runs until nothing moves.
    fn run(&mut self) -> Result<(), Failure> {
        self.run_for(usize::MAX).map(|_| ())
    }

    /// Runs at most `rounds` rounds; returns whether it went quiet.
    fn run_for(&mut self, rounds: usize) -> Result<bool, Failure> {
        for n in 0..rounds {
            if !self.round(n)? {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// An open server: any client fetches and overwrites any file, as the transfer tests
/// below assume; the authorization tests use [`owner_config`].
fn server_config(dir: &Path) -> Arc<Config> {
    Arc::new(
        Config::new(dir)
            .with_window(SLOTS, SLOT_LEN)
            .with_max_size(16 << 20)
            .with_secret("alice", "alice-key")
            .with_public_fetch(true)
            .with_overwrite_others(true),
    )
}

/// The default authorization: fetch and overwrite only one's own files.
fn owner_config(dir: &Path) -> Arc<Config> {
    Arc::new(Config::new(dir).with_window(SLOTS, SLOT_LEN))
}

/// SHA-256 hex straight from the sha2 crate, and from `sha256sum` when installed.
fn independent_sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    let ours = hex::encode(sha2::Sha256::digest(&bytes));
    if let Ok(out) = std::process::Command::new("sha256sum").arg(path).output() {
        if out.status.success() {
            let text = String::from_utf8(out.stdout).unwrap();
            assert_eq!(text.split_whitespace().next(), Some(ours.as_str()));
        }
    }
    ours
}

fn upload(src: &Path, name: &str, alg: HashAlg, overwrite: bool) -> Box<dyn Endpoint> {
    Box::new(Sender::from_file(src, name, alg, overwrite).unwrap())
}

fn server(dir: &Path) -> Box<dyn Endpoint> {
    Box::new(Server::new(server_config(dir)))
}

#[test]
fn state_machines_can_live_in_a_session() {
    fn session_safe<T: Send + Unpin + 'static>() {}
    session_safe::<Server>();
    session_safe::<Sender>();
    session_safe::<Receiver>();
}

#[test]
fn uploads_of_every_size_with_both_hashes() {
    let src_dir = tempfile::tempdir().unwrap();
    for (n, len) in [0usize, 1, 1024, (4 << 20) + 123].into_iter().enumerate() {
        for alg in [HashAlg::Sha256, HashAlg::Blake3] {
            let dst = tempfile::tempdir().unwrap();
            let bytes = pattern(len, n as u64);
            let src = src_dir.path().join(format!("src-{len}"));
            std::fs::write(&src, &bytes).unwrap();
            let mut pair = Pair::new(upload(&src, "out.bin", alg, false), server(dst.path()));
            pair.run().unwrap();

            let stored = dst.path().join("out.bin");
            assert_eq!(std::fs::read(&stored).unwrap(), bytes, "{len} {alg}");
            assert_eq!(
                entries(dst.path()),
                vec!["out.bin"],
                "no temporary file left"
            );
            assert_eq!(
                pair.client().outcomes,
                vec![Outcome::Delivered { auth: None }]
            );
            let digest = hash_bytes(alg, &bytes);
            assert_eq!(
                pair.server().outcomes,
                vec![Outcome::Stored {
                    path: stored.clone(),
                    len: len as u64,
                    digest
                }]
            );
            let sha = independent_sha256(&stored);
            assert_eq!(sha, hash_bytes(HashAlg::Sha256, &bytes).to_hex());
            if alg == HashAlg::Sha256 {
                assert_eq!(digest.to_hex(), sha);
            }
            assert!(pair.server().window.is_none(), "window revoked");

            let chunks = len.div_ceil(SLOT_LEN as usize);
            assert_eq!(pair.writes, chunks);
            assert_eq!(pair.acks, chunks.saturating_sub(SLOTS as usize));
            if chunks >= 2 {
                assert_eq!(pair.max_queued_writes, SLOTS as usize, "pipelined");
            }
        }
    }
}

#[test]
fn a_corrupted_chunk_is_bad_and_leaves_nothing() {
    let src_dir = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let src = src_dir.path().join("src");
    std::fs::write(&src, pattern(300_000, 7)).unwrap();
    let mut pair = Pair::new(
        upload(&src, "f", HashAlg::Sha256, false),
        server(dst.path()),
    );
    pair.sides[1].corrupt = Some(3);
    pair.run().unwrap();
    assert!(matches!(
        pair.client().outcomes.as_slice(),
        [Outcome::Bad(BadReason::Mismatch { .. })]
    ));
    assert!(matches!(
        pair.server().outcomes.as_slice(),
        [Outcome::Bad(BadReason::Mismatch { .. })]
    ));
    assert!(entries(dst.path()).is_empty());
}

#[test]
fn dropping_the_receiver_mid_transfer_leaves_nothing() {
    let src_dir = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let src = src_dir.path().join("src");
    std::fs::write(&src, pattern(1 << 20, 9)).unwrap();
    let mut pair = Pair::new(
        upload(&src, "f", HashAlg::Blake3, false),
        server(dst.path()),
    );
    assert!(!pair.run_for(10).unwrap(), "still transferring");
    assert_eq!(entries(dst.path()).len(), 1, "the temporary file exists");
    assert!(entries(dst.path())[0].starts_with(".f.rdmactor-tmp-"));
    pair.sides[1].ep = None; // the connection died
    assert!(entries(dst.path()).is_empty());
}

#[test]
fn existing_files_are_kept_unless_overwrite() {
    let src_dir = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let src = src_dir.path().join("src");
    std::fs::write(&src, b"new contents").unwrap();
    std::fs::write(dst.path().join("f"), b"old").unwrap();

    let mut pair = Pair::new(
        upload(&src, "f", HashAlg::Sha256, false),
        server(dst.path()),
    );
    pair.run().unwrap();
    assert_eq!(
        pair.client().outcomes,
        vec![Outcome::Rejected(RejectReason::Exists)]
    );
    assert_eq!(std::fs::read(dst.path().join("f")).unwrap(), b"old");

    let mut pair = Pair::new(upload(&src, "f", HashAlg::Sha256, true), server(dst.path()));
    pair.run().unwrap();
    assert_eq!(
        pair.client().outcomes,
        vec![Outcome::Delivered { auth: None }]
    );
    assert_eq!(
        std::fs::read(dst.path().join("f")).unwrap(),
        b"new contents"
    );
    assert_eq!(entries(dst.path()), vec!["f"]);
}

#[test]
fn path_tricks_are_refused_by_the_server() {
    let dst = tempfile::tempdir().unwrap();
    let long = "n".repeat(MAX_NAME_LEN + 1);
    for name in [
        "../escape",
        "/etc/passwd",
        "a/b",
        "a\\b",
        "..",
        "",
        "a\0b",
        &long,
    ] {
        // A hostile client bypasses Sender's own check and sends the raw offer.
        let mut s = Server::new(server_config(dst.path()));
        s.handle_msg(Msg::Offer(FileOffer {
            name: name.to_owned(),
            len: 1,
            digest: hash_bytes(HashAlg::Sha256, b"x"),
            overwrite: true,
        }))
        .unwrap();
        assert!(
            matches!(
                s.poll_output(),
                Some(Output::Send(Msg::Reject {
                    reason: RejectReason::BadName { .. }
                }))
            ),
            "{name:?}"
        );
        s.handle_msg(Msg::Fetch {
            name: name.to_owned(),
            alg: HashAlg::Sha256,
        })
        .unwrap();
        // Opening and hashing happen in a job the driver runs elsewhere (after what the
        // rejected offer still had to say).
        assert!(std::iter::from_fn(|| s.poll_output()).any(|o| o == Output::Prepare));
        assert!(!s.is_finished(), "preparing");
        let job = s.take_prepare().unwrap();
        s.handle_prepared(job.run()).unwrap();
        let out: Vec<Output> = std::iter::from_fn(|| s.poll_output()).collect();
        assert!(
            out.iter().any(|o| matches!(
                o,
                Output::Send(Msg::Reject {
                    reason: RejectReason::BadName { .. }
                })
            )),
            "{name:?}"
        );
    }
    assert!(entries(dst.path()).is_empty());
    // The sender refuses them locally, too.
    let offer = FileOffer {
        name: "..".into(),
        len: 0,
        digest: hash_bytes(HashAlg::Sha256, b""),
        overwrite: false,
    };
    assert!(matches!(
        Sender::new(offer, Box::new(std::io::empty())),
        Err(TransferError::Name(NameError::Dots))
    ));
}

#[test]
fn oversize_offers_are_refused() {
    let dst = tempfile::tempdir().unwrap();
    let offer = FileOffer {
        name: "huge".into(),
        len: (16 << 20) + 1,
        digest: hash_bytes(HashAlg::Sha256, b""),
        overwrite: false,
    };
    let sender = Sender::new(offer, Box::new(std::io::empty())).unwrap();
    let mut pair = Pair::new(Box::new(sender), server(dst.path()));
    pair.run().unwrap();
    let reason = RejectReason::TooLarge { max: 16 << 20 };
    assert_eq!(
        pair.client().outcomes,
        vec![Outcome::Rejected(reason.clone())]
    );
    assert_eq!(pair.server().outcomes, vec![Outcome::Rejected(reason)]);
    assert!(entries(dst.path()).is_empty());
}

#[test]
fn out_of_order_messages_are_errors_naming_the_state() {
    let dst = tempfile::tempdir().unwrap();
    let cases: [(&[Msg], &str); 4] = [
        (
            &[Msg::Done],
            "unexpected Done while waiting for an offer or a fetch",
        ),
        (
            &[Msg::Good],
            "unexpected Good while waiting for an offer or a fetch",
        ),
        (
            &[
                Msg::Offer(FileOffer {
                    name: "f".into(),
                    len: 10,
                    digest: hash_bytes(HashAlg::Sha256, b""),
                    overwrite: false,
                }),
                Msg::Done,
            ],
            "unexpected Done while registering the window",
        ),
        (
            &[
                Msg::Offer(FileOffer {
                    name: "g".into(),
                    len: 0,
                    digest: hash_bytes(HashAlg::Sha256, b""),
                    overwrite: false,
                }),
                Msg::Identify { id: "alice".into() },
            ],
            "unexpected Identify while receiving chunks",
        ),
    ];
    for (msgs, expected) in cases {
        let mut s = Server::new(server_config(dst.path()));
        let mut last = Ok(());
        for m in msgs {
            last = s.handle_msg(m.clone());
            while s.poll_output().is_some() {}
        }
        assert_eq!(last.unwrap_err().to_string(), expected);
    }
    assert!(entries(dst.path()).is_empty());

    // A chunk the server never granted a window for.
    let mut s = Server::new(server_config(dst.path()));
    assert!(s.handle_chunk(0, b"x").is_err());
}

#[test]
fn downloads_of_every_size() {
    let served = tempfile::tempdir().unwrap();
    for (n, len) in [0usize, 1, 1024, (4 << 20) + 123].into_iter().enumerate() {
        for alg in [HashAlg::Sha256, HashAlg::Blake3] {
            let local = tempfile::tempdir().unwrap();
            let bytes = pattern(len, 40 + n as u64);
            std::fs::write(served.path().join("file"), &bytes).unwrap();
            let client_config = Arc::new(Config::new(local.path()).with_window(3, 50_000));
            let client = Receiver::fetch(client_config, "file", alg, false).unwrap();
            let mut pair = Pair::new(Box::new(client), server(served.path()));
            pair.run().unwrap();
            let stored = local.path().join("file");
            assert_eq!(std::fs::read(&stored).unwrap(), bytes, "{len} {alg}");
            assert_eq!(entries(local.path()), vec!["file"]);
            assert!(matches!(
                pair.client().outcomes.as_slice(),
                [Outcome::Stored { digest, .. }] if *digest == hash_bytes(alg, &bytes)
            ));
            assert_eq!(
                pair.server().outcomes,
                vec![Outcome::Delivered { auth: None }]
            );
            assert_eq!(
                independent_sha256(&stored),
                hash_bytes(HashAlg::Sha256, &bytes).to_hex()
            );
            assert_eq!(pair.writes, len.div_ceil(50_000));
        }
    }
}

#[test]
fn downloads_of_missing_files_are_rejected() {
    let served = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    std::fs::create_dir(served.path().join("dir")).unwrap();
    for name in ["missing", "dir"] {
        let client = Receiver::fetch(
            Arc::new(Config::new(local.path())),
            name,
            HashAlg::Sha256,
            false,
        )
        .unwrap();
        let mut pair = Pair::new(Box::new(client), server(served.path()));
        pair.run().unwrap();
        assert_eq!(
            pair.client().outcomes,
            vec![Outcome::Rejected(RejectReason::NotFound)]
        );
    }
    assert!(entries(local.path()).is_empty());
}

#[test]
fn identify_with_known_and_unknown_ids() {
    let src_dir = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let src = src_dir.path().join("src");
    std::fs::write(&src, b"payload").unwrap();
    for (id, auth) in [
        ("alice", Auth::Secret("alice-key".into())),
        ("eve", Auth::Refused),
    ] {
        let sender = Sender::from_file(&src, id, HashAlg::Sha256, false)
            .unwrap()
            .with_identity(id);
        let mut pair = Pair::new(Box::new(sender), server(dst.path()));
        pair.run().unwrap();
        assert_eq!(
            pair.client().outcomes,
            vec![Outcome::Delivered { auth: Some(auth) }]
        );
    }
    // Identify without a GOOD first is an error.
    let mut s = Server::new(server_config(dst.path()));
    assert!(s.handle_msg(Msg::Identify { id: "alice".into() }).is_err());
}

#[test]
fn one_connection_carries_several_transfers() {
    let src_dir = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let src = src_dir.path().join("src");
    let bytes = pattern(200_000, 3);
    std::fs::write(&src, &bytes).unwrap();

    let mut pair = Pair::new(
        Box::new(
            Sender::from_file(&src, "alice", HashAlg::Blake3, false)
                .unwrap()
                .with_identity("alice"),
        ),
        server(dst.path()),
    );
    pair.run().unwrap();
    // Then a download of what was uploaded, then another upload, on the same server.
    let fetch = Receiver::fetch(
        Arc::new(Config::new(local.path())),
        "alice",
        HashAlg::Sha256,
        false,
    )
    .unwrap();
    pair.sides[0].ep = Some(Box::new(fetch));
    pair.run().unwrap();
    pair.sides[0].ep = Some(upload(&src, "b", HashAlg::Sha256, false));
    pair.run().unwrap();

    assert_eq!(std::fs::read(local.path().join("alice")).unwrap(), bytes);
    assert_eq!(std::fs::read(dst.path().join("b")).unwrap(), bytes);
    assert_eq!(entries(dst.path()), vec!["alice", "b"]);
    assert_eq!(pair.server().outcomes.len(), 3);
    assert!(matches!(
        pair.client().outcomes.as_slice(),
        [
            Outcome::Delivered {
                auth: Some(Auth::Secret(_))
            },
            Outcome::Stored { .. },
            Outcome::Delivered { auth: None },
        ]
    ));
}

#[test]
fn a_source_that_shrank_aborts_with_the_reason_and_leaves_nothing() {
    let dst = tempfile::tempdir().unwrap();
    let bytes = pattern(150_000, 5);
    let offer = FileOffer {
        name: "f".into(),
        len: bytes.len() as u64,
        digest: hash_bytes(HashAlg::Sha256, &bytes),
        overwrite: false,
    };
    // The file lost its tail between hashing and sending.
    let source = std::io::Cursor::new(bytes[..100_000].to_vec());
    let sender = Sender::new(offer, Box::new(source)).unwrap();
    let mut pair = Pair::new(Box::new(sender), server(dst.path()));
    pair.run().unwrap();
    // Both sides end with the reason; the connection stays (no error).
    for side in [pair.client(), pair.server()] {
        match side.outcomes.as_slice() {
            [Outcome::Aborted(RejectReason::Unavailable { reason })] => {
                assert!(reason.contains("ended at byte 65536 of 150000"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(entries(dst.path()).is_empty());
    // The same connection carries the next transfer.
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("g"), b"next").unwrap();
    pair.sides[0].ep = Some(upload(&src.path().join("g"), "g", HashAlg::Sha256, false));
    pair.run().unwrap();
    assert!(matches!(
        pair.client().outcomes[1],
        Outcome::Delivered { .. }
    ));
    assert_eq!(entries(dst.path()), vec!["g".to_owned()]);
}

#[test]
fn a_fetch_waits_for_its_preparation_and_nothing_else_is_taken_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"fetched").unwrap();
    let mut s = Server::new(server_config(dir.path()));
    s.handle_msg(Msg::Fetch {
        name: "f".into(),
        alg: HashAlg::Blake3,
    })
    .unwrap();
    assert_eq!(s.poll_output(), Some(Output::Prepare));
    assert_eq!(s.poll_output(), None, "no offer before the hash");
    assert_eq!(s.state_name(), "hashing the file asked for");
    let job = s.take_prepare().unwrap();
    assert!(s.take_prepare().is_none(), "taken once");
    // A second request while the first is being prepared is out of order.
    let mut busy = Server::new(server_config(dir.path()));
    busy.handle_msg(Msg::Fetch {
        name: "f".into(),
        alg: HashAlg::Blake3,
    })
    .unwrap();
    assert!(busy.handle_msg(Msg::Done).is_err());
    s.handle_prepared(job.run()).unwrap();
    match s.poll_output() {
        Some(Output::Send(Msg::Offer(offer))) => {
            assert_eq!(offer.len, 7);
            assert_eq!(offer.digest, hash_bytes(HashAlg::Blake3, b"fetched"));
        }
        other => panic!("expected the offer, got {other:?}"),
    }
    assert!(
        s.handle_prepared(Err(RejectReason::NotFound)).is_err(),
        "one result per fetch"
    );
}

/// Asks `s` for `name` and runs the preparation: the offer, or the refusal.
fn fetch_offer(
    s: &mut Server,
    name: &str,
    alg: HashAlg,
) -> std::result::Result<FileOffer, RejectReason> {
    s.handle_msg(Msg::Fetch {
        name: name.into(),
        alg,
    })
    .unwrap();
    assert_eq!(s.poll_output(), Some(Output::Prepare));
    let job = s.take_prepare().unwrap();
    s.handle_prepared(job.run()).unwrap();
    match s.poll_output() {
        Some(Output::Send(Msg::Offer(offer))) => Ok(offer),
        Some(Output::Send(Msg::Reject { reason })) => {
            assert_eq!(
                s.poll_output(),
                Some(Output::Finished(Outcome::Rejected(reason.clone())))
            );
            Err(reason)
        }
        other => panic!("expected an offer or a refusal, got {other:?}"),
    }
}

/// Issue 26, item 10: every fetch read and hashed its whole file.
#[test]
fn a_fetch_of_a_known_unchanged_file_is_not_hashed_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    std::fs::write(&path, b"fetched").unwrap();
    let cache = Arc::new(DigestCache::new(8));
    let server = || Server::new(server_config(dir.path())).with_digests(Arc::clone(&cache));
    let first = fetch_offer(&mut server(), "f", HashAlg::Sha256).unwrap();
    assert_eq!(first.digest, hash_bytes(HashAlg::Sha256, b"fetched"));
    assert_eq!((cache.stats().hashed, cache.stats().entries), (1, 1));
    // Another connection, the same file: the digest is known.
    let again = fetch_offer(&mut server(), "f", HashAlg::Sha256).unwrap();
    assert_eq!(again, first);
    assert_eq!((cache.stats().hashed, cache.stats().hits), (1, 1));
    // The other algorithm is another digest.
    fetch_offer(&mut server(), "f", HashAlg::Blake3).unwrap();
    assert_eq!(cache.stats().hashed, 2);
    // Rewritten in place with the same length: its mtime moved, so it is hashed again.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    std::io::Write::write_all(&mut &f, b"FETCHED").unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    drop(f);
    let changed = fetch_offer(&mut server(), "f", HashAlg::Sha256).unwrap();
    assert_eq!(changed.digest, hash_bytes(HashAlg::Sha256, b"FETCHED"));
    assert_eq!(cache.stats().hashed, 3);
    // Replaced by a file of the same length (another inode): hashed again.
    std::fs::write(dir.path().join("g"), b"fetcheD").unwrap();
    std::fs::rename(dir.path().join("g"), &path).unwrap();
    let replaced = fetch_offer(&mut server(), "f", HashAlg::Sha256).unwrap();
    assert_eq!(replaced.digest, hash_bytes(HashAlg::Sha256, b"fetcheD"));
    assert_eq!(cache.stats().hashed, 4);
    fetch_offer(&mut server(), "f", HashAlg::Sha256).unwrap();
    assert_eq!(cache.stats().hashed, 4);
}

#[test]
fn a_fetch_the_client_found_bad_is_hashed_again_next_time() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("e"), b"").unwrap();
    let cache = Arc::new(DigestCache::new(8));
    let mut s = Server::new(server_config(dir.path())).with_digests(Arc::clone(&cache));
    let offer = fetch_offer(&mut s, "e", HashAlg::Sha256).unwrap();
    assert_eq!(cache.stats().entries, 1);
    // An empty file: no window, the sender says Done at once.
    s.handle_msg(Msg::Grant { window: None }).unwrap();
    assert_eq!(s.poll_output(), Some(Output::Send(Msg::Done)));
    let bad = BadReason::Mismatch { got: offer.digest };
    s.handle_msg(Msg::Bad {
        reason: bad.clone(),
    })
    .unwrap();
    assert_eq!(s.poll_output(), Some(Output::Finished(Outcome::Bad(bad))));
    assert_eq!(cache.stats().entries, 0, "the digest is forgotten");
    fetch_offer(&mut s, "e", HashAlg::Sha256).unwrap();
    assert_eq!(cache.stats().hashed, 2);
}

#[test]
fn a_client_at_its_limit_of_preparations_is_refused_but_known_files_are_served() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("known"), b"k").unwrap();
    std::fs::write(dir.path().join("new"), b"n").unwrap();
    let cache = Arc::new(DigestCache::new(8));
    let limit = PreparationLimit::new(1);
    let server = |client: &str| {
        Server::new(server_config(dir.path()))
            .with_quota(client.into())
            .with_digests(Arc::clone(&cache))
            .with_preparation_limit(Arc::clone(&limit))
    };
    fetch_offer(&mut server("b"), "known", HashAlg::Sha256).unwrap();
    // Client a has one file being hashed on another connection.
    let held = limit.try_acquire("a").unwrap();
    assert_eq!(
        fetch_offer(&mut server("a"), "new", HashAlg::Sha256),
        Err(RejectReason::Quota {
            what: "fetches being prepared at once".into(),
            limit: 1,
            would_use: 2,
        })
    );
    // A known file needs no hashing, and other clients are not affected.
    fetch_offer(&mut server("a"), "known", HashAlg::Sha256).unwrap();
    fetch_offer(&mut server("b"), "new", HashAlg::Sha256).unwrap();
    drop(held);
    fetch_offer(&mut server("a"), "new", HashAlg::Blake3).unwrap();
    assert_eq!(
        limit.running("a"),
        0,
        "a finished preparation gives its permit back"
    );
}

/// Security issue item 1: a `Grant` whose region ends beyond `u64::MAX` used to panic
/// the server's sender (`RemoteWindow::slice(..).expect(..)`) on the poller thread. It
/// is now a `BadGrant` error that ends only this transfer.
#[test]
fn a_grant_at_the_top_of_the_address_space_is_refused_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"hi").unwrap();
    let mut s = Sender::for_fetch(dir.path(), "f", HashAlg::Sha256).unwrap();
    assert!(matches!(s.poll_output(), Some(Output::Send(Msg::Offer(_)))));
    let hostile = Msg::Grant {
        window: Some(WindowGrant {
            region: RemoteWindow {
                addr: u64::MAX,
                len: 2,
                rkey: 1,
            },
            slots: 1,
            slot_len: 2,
        }),
    };
    let e = s.handle_msg(hostile).unwrap_err();
    assert!(
        matches!(&e, TransferError::BadGrant(why) if why.contains("wraps")),
        "{e}"
    );
    assert_eq!(s.poll_output(), None, "no WRITE was handed out");
}

/// Security issue item 5: without the server saying otherwise, a connection fetches and
/// overwrites only files it uploaded itself, and hidden files are never served.
#[test]
fn fetch_and_overwrite_only_ones_own_files_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let src_dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("theirs"), b"someone else's").unwrap();
    std::fs::write(dir.path().join(".hidden"), b"hidden").unwrap();
    let src = src_dir.path().join("src");
    std::fs::write(&src, b"mine").unwrap();
    let fetch = |name: &str| {
        Box::new(
            Receiver::fetch(
                Arc::new(Config::new(local.path())),
                name,
                HashAlg::Sha256,
                true,
            )
            .unwrap(),
        )
    };

    let mut pair = Pair::new(
        fetch("theirs"),
        Box::new(Server::new(owner_config(dir.path()))),
    );
    pair.run().unwrap();
    assert_eq!(
        pair.client().outcomes,
        vec![Outcome::Rejected(RejectReason::NotFound)]
    );
    // Overwriting someone else's file is refused as if overwrite had not been asked.
    pair.sides[0].ep = Some(upload(&src, "theirs", HashAlg::Sha256, true));
    pair.run().unwrap();
    assert_eq!(
        pair.client().outcomes[1],
        Outcome::Rejected(RejectReason::Exists)
    );
    assert_eq!(
        std::fs::read(dir.path().join("theirs")).unwrap(),
        b"someone else's"
    );
    // One's own upload: fetched and overwritten.
    pair.sides[0].ep = Some(upload(&src, "mine", HashAlg::Sha256, false));
    pair.run().unwrap();
    pair.sides[0].ep = Some(upload(&src, "mine", HashAlg::Sha256, true));
    pair.run().unwrap();
    pair.sides[0].ep = Some(fetch("mine"));
    pair.run().unwrap();
    assert!(matches!(
        pair.client().outcomes[2..],
        [
            Outcome::Delivered { .. },
            Outcome::Delivered { .. },
            Outcome::Stored { .. }
        ]
    ));
    assert_eq!(std::fs::read(local.path().join("mine")).unwrap(), b"mine");
    // A new connection does not own "mine".
    let mut other = Pair::new(
        fetch("mine"),
        Box::new(Server::new(owner_config(dir.path()))),
    );
    other.run().unwrap();
    assert_eq!(
        other.client().outcomes,
        vec![Outcome::Rejected(RejectReason::NotFound)]
    );
    // Hidden names are not names a transfer may use: not even asked for.
    assert!(matches!(
        Receiver::fetch(
            Arc::new(Config::new(local.path())),
            ".hidden",
            HashAlg::Sha256,
            true
        ),
        Err(TransferError::Name(crate::file_transfer::NameError::Hidden))
    ));
}

/// Issues 46/47: a cluster's repair copies a file for its owner. A replicator fetches
/// any file and offers a copy stored as the owner's, so the owner (and only the
/// owner) fetches it from the new node; nobody else may offer a copy for another.
#[test]
fn a_replicator_copies_a_file_for_its_owner_and_nobody_else_may() {
    let dir = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let src_dir = tempfile::tempdir().unwrap();
    let src = src_dir.path().join("src");
    std::fs::write(&src, pattern(150_000, 9)).unwrap();
    let config = Arc::new(
        Config::new(dir.path())
            .with_window(SLOTS, SLOT_LEN)
            .with_secret("alice", "alice-key")
            .with_replicator("node-b"),
    );
    let conn = |who: &str| Box::new(Server::new(Arc::clone(&config)).with_identity(who.into()));
    let fetch = |name: &str| {
        Receiver::fetch(
            Arc::new(Config::new(local.path())),
            name,
            HashAlg::Sha256,
            false,
        )
        .unwrap()
    };
    let owner = |path: &Path| ownership::owner_at(path).unwrap();

    // alice's file: bob may not read it, the replicator may, and its fetched copy
    // keeps alice as its owner.
    let mut pair = Pair::new(upload(&src, "f", HashAlg::Sha256, false), conn("alice"));
    pair.run().unwrap();
    assert_eq!(owner(&dir.path().join("f")).as_deref(), Some("alice"));
    let mut bob = Pair::new(Box::new(fetch("f")), conn("bob"));
    bob.run().unwrap();
    assert_eq!(
        bob.client().outcomes,
        vec![Outcome::Rejected(RejectReason::NotFound)]
    );
    let mut copying = fetch("f");
    copying.set_copy_owner("alice".into());
    let mut node = Pair::new(Box::new(copying), conn("node-b"));
    node.run().unwrap();
    assert!(matches!(
        node.client().outcomes[..],
        [Outcome::Stored { .. }]
    ));
    assert_eq!(owner(&local.path().join("f")).as_deref(), Some("alice"));

    // A copy offered for alice: refused to bob with the reason, nothing stored ...
    let copy = |name: &str, who: &str| {
        Box::new(
            Sender::from_file(&src, name, HashAlg::Sha256, true)
                .unwrap()
                .for_owner(who)
                .with_identity("alice"),
        )
    };
    let mut bob = Pair::new(copy("g", "alice"), conn("bob"));
    bob.run().unwrap();
    assert!(
        matches!(
            &bob.client().outcomes[..],
            [Outcome::Rejected(RejectReason::Forbidden { .. })]
        ),
        "{:?}",
        bob.client().outcomes
    );
    assert!(!dir.path().join("g").exists());
    // ... and an owner that is no identity is refused to the replicator too.
    let mut odd = Pair::new(copy("g", "a b"), conn("node-b"));
    odd.run().unwrap();
    assert!(matches!(
        &odd.client().outcomes[..],
        [Outcome::Rejected(RejectReason::Forbidden { .. })]
    ));
    // The replicator's copy is alice's; its `Identify` for alice proves nothing.
    let mut node = Pair::new(copy("g", "alice"), conn("node-b"));
    node.run().unwrap();
    assert_eq!(
        node.client().outcomes,
        vec![Outcome::Delivered {
            auth: Some(Auth::Refused)
        }]
    );
    assert_eq!(owner(&dir.path().join("g")).as_deref(), Some("alice"));
    // A copy never replaces: `overwrite` was asked and is ignored.
    let mut again = Pair::new(copy("f", "alice"), conn("node-b"));
    again.run().unwrap();
    assert_eq!(
        again.client().outcomes,
        vec![Outcome::Rejected(RejectReason::Exists)]
    );
    // alice fetches the copy on another connection; bob still does not.
    let local2 = tempfile::tempdir().unwrap();
    let fetch2 = Receiver::fetch(
        Arc::new(Config::new(local2.path())),
        "g",
        HashAlg::Sha256,
        false,
    )
    .unwrap();
    let mut mine = Pair::new(Box::new(fetch2), conn("alice"));
    mine.run().unwrap();
    assert!(matches!(
        mine.client().outcomes[..],
        [Outcome::Stored { .. }]
    ));
    assert_eq!(
        std::fs::read(local2.path().join("g")).unwrap(),
        std::fs::read(&src).unwrap()
    );
}

/// Asks `s` to delete `name` and runs the job: `Ok` for `Deleted`, or the refusal.
fn delete(s: &mut Server, name: &str) -> std::result::Result<(), RejectReason> {
    s.handle_msg(Msg::Delete { name: name.into() }).unwrap();
    let mut answer = s.poll_output();
    if answer == Some(Output::Delete) {
        let job = s.take_delete().expect("the job");
        assert!(s.take_delete().is_none(), "taken once");
        s.handle_deleted(job.run()).unwrap();
        answer = s.poll_output();
    }
    let finished = s.poll_output();
    match (answer, finished) {
        (Some(Output::Send(Msg::Deleted)), Some(Output::Finished(Outcome::Deleted))) => Ok(()),
        (
            Some(Output::Send(Msg::Reject { reason })),
            Some(Output::Finished(Outcome::Rejected(r))),
        ) if r == reason => Err(reason),
        other => panic!("expected Deleted or a refusal, got {other:?}"),
    }
}

/// Remembers what it was asked to forget; refuses names starting with `keep`.
#[derive(Debug, Default)]
struct Forgetful(std::sync::Mutex<Vec<(String, Option<String>)>>);

impl Recorder for Forgetful {
    fn record(&self, _: &StoredCopy) -> std::result::Result<(), String> {
        Ok(())
    }
    fn forget(&self, name: &str, owner: Option<&str>) -> std::result::Result<(), String> {
        if name.starts_with("keep") {
            return Err("the catalog is unreachable".into());
        }
        let asked = (name.to_owned(), owner.map(str::to_owned));
        self.0.lock().unwrap().push(asked);
        Ok(())
    }
}

/// Issue 47: owners delete their files. Only the owner (or the connection that stored
/// an unowned file) may; anyone else hears what a missing file would tell them; the
/// recorder forgets the file before its name goes, and a refusal keeps it.
#[test]
fn an_owner_deletes_its_file_others_cannot_and_the_recorder_forgets_it_first() {
    let dir = tempfile::tempdir().unwrap();
    let src_dir = tempfile::tempdir().unwrap();
    let src = src_dir.path().join("src");
    std::fs::write(&src, b"to be deleted").unwrap();
    let recorder = Arc::new(Forgetful::default());
    let config = Arc::new(
        Config::new(dir.path())
            .with_window(SLOTS, SLOT_LEN)
            .with_recorder(recorder.clone()),
    );
    let conn = |who: Option<&str>| {
        let s = Server::new(Arc::clone(&config));
        match who {
            Some(who) => s.with_identity(who.into()),
            None => s,
        }
    };
    for name in ["mine", "keep-mine"] {
        let mut pair = Pair::new(
            upload(&src, name, HashAlg::Sha256, false),
            Box::new(conn(Some("alice"))),
        );
        pair.run().unwrap();
    }
    let path = |name: &str| dir.path().join(name);

    // bob, and an anonymous connection, are told "no such file"; the file stays.
    for mut other in [conn(Some("bob")), conn(None)] {
        assert_eq!(delete(&mut other, "mine"), Err(RejectReason::NotFound));
    }
    assert!(path("mine").exists());
    // alice deletes it from a connection of her own; the catalog was told first.
    let mut alice = conn(Some("alice"));
    assert_eq!(delete(&mut alice, "mine"), Ok(()));
    assert!(!path("mine").exists());
    assert_eq!(
        *recorder.0.lock().unwrap(),
        [("mine".to_owned(), Some("alice".to_owned()))]
    );
    assert_eq!(delete(&mut alice, "mine"), Err(RejectReason::NotFound));
    // A catalog that cannot forget keeps the file, and says why.
    match delete(&mut alice, "keep-mine") {
        Err(RejectReason::Unavailable { reason }) => {
            assert!(reason.contains("unreachable"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(path("keep-mine").exists());
    // Hidden and bad names.
    std::fs::write(path(".hidden"), b"h").unwrap();
    assert!(matches!(
        delete(&mut alice, ".hidden"),
        Err(RejectReason::BadName { .. })
    ));
    assert!(path(".hidden").exists());
    assert!(matches!(
        delete(&mut alice, "../x"),
        Err(RejectReason::BadName { .. })
    ));

    // An anonymous connection deletes what it stored, and only on that connection.
    let mut pair = Pair::new(
        upload(&src, "anon", HashAlg::Sha256, false),
        Box::new(conn(None)),
    );
    pair.run().unwrap();
    assert_eq!(delete(&mut conn(None), "anon"), Err(RejectReason::NotFound));
    let server = pair.sides[1].ep.as_mut().unwrap();
    server
        .handle_msg(Msg::Delete {
            name: "anon".into(),
        })
        .unwrap();
    pair.run().unwrap();
    assert_eq!(pair.server().outcomes.last(), Some(&Outcome::Deleted));
    assert!(!path("anon").exists());
}
