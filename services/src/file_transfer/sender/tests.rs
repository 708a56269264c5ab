use std::io::Cursor;

use super::*;
use crate::file_transfer::endpoint::Endpoint;
use crate::file_transfer::hash::hash_bytes;
use crate::file_transfer::output::{Auth, ChunkWrite};
use crate::file_transfer::wire::{BadReason, RemoteWindow, WindowGrant, MAX_GRANT_SLOTS};

fn sender(data: &[u8]) -> Sender {
    let offer = FileOffer {
        name: "f".into(),
        len: data.len() as u64,
        digest: hash_bytes(HashAlg::Sha256, data),
        overwrite: false,
    };
    // Chunks of a few bytes keep these tests readable.
    Sender::new(offer, Box::new(Cursor::new(data.to_vec())))
        .unwrap()
        .with_min_slot_len(1)
}

fn drain(s: &mut Sender) -> Vec<Output> {
    std::iter::from_fn(|| s.poll_output()).collect()
}

fn grant(slots: u32, slot_len: u32) -> Msg {
    Msg::Grant {
        window: Some(WindowGrant {
            region: RemoteWindow {
                addr: 1000,
                len: u64::from(slots) * u64::from(slot_len),
                rkey: 5,
            },
            slots,
            slot_len,
        }),
    }
}

fn writes(out: &[Output]) -> Vec<u32> {
    out.iter()
        .filter_map(|o| match o {
            Output::WriteChunk(c) => Some(c.index),
            _ => None,
        })
        .collect()
}

fn fill(s: &mut Sender, out: &[Output]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for o in out {
        if let Output::WriteChunk(c) = o {
            let mut buf = vec![0; c.len as usize];
            s.fill_chunk(c, &mut buf).unwrap();
            bytes.extend(buf);
        }
    }
    bytes
}

#[test]
fn a_slot_is_reused_only_after_ack_and_local_completion() {
    let data = b"abcdefghij"; // 3 chunks of 4 through 2 slots
    let mut s = sender(data);
    assert!(matches!(
        drain(&mut s).as_slice(),
        [Output::Send(Msg::Offer(_))]
    ));
    s.handle_msg(grant(2, 4)).unwrap();
    let out = drain(&mut s);
    assert_eq!(out[0], Output::Stage { len: 8 });
    assert_eq!(writes(&out), vec![0, 1]);
    let Output::WriteChunk(c1) = out[2] else {
        panic!()
    };
    assert_eq!(
        (c1.slot, c1.offset, c1.len, c1.remote.addr, c1.remote.len),
        (1, 4, 4, 1004, 4)
    );
    assert_eq!(fill(&mut s, &out), b"abcdefgh");
    assert_eq!(s.chunks_in_flight(), 2);
    // Acked, not completed: slot 0 still busy locally.
    s.handle_msg(Msg::Ack { next: 1 }).unwrap();
    assert_eq!(drain(&mut s), vec![]);
    s.handle_write_done(0).unwrap();
    let out = drain(&mut s);
    assert_eq!(writes(&out), vec![2]);
    assert_eq!(out.last(), Some(&Output::Send(Msg::Done)));
    let Output::WriteChunk(c2) = out[0] else {
        panic!()
    };
    assert_eq!((c2.slot, c2.offset, c2.len), (0, 0, 2));
    assert_eq!(fill(&mut s, &out), b"ij");
    s.handle_write_done(1).unwrap();
    s.handle_write_done(2).unwrap();
    s.handle_msg(Msg::Good).unwrap();
    assert_eq!(
        drain(&mut s),
        vec![Output::Finished(Outcome::Delivered { auth: None })]
    );
    assert!(s.is_finished());
}

#[test]
fn completion_before_ack_also_waits() {
    let mut s = sender(b"abcdefghij");
    drain(&mut s);
    s.handle_msg(grant(2, 4)).unwrap();
    let out = drain(&mut s);
    fill(&mut s, &out);
    s.handle_write_done(0).unwrap();
    assert_eq!(drain(&mut s), vec![]);
    s.handle_msg(Msg::Ack { next: 1 }).unwrap();
    assert_eq!(writes(&drain(&mut s)), vec![2]);
}

#[test]
fn empty_files_go_straight_to_done() {
    let mut s = sender(b"");
    drain(&mut s);
    s.handle_msg(Msg::Grant { window: None }).unwrap();
    assert_eq!(drain(&mut s), vec![Output::Send(Msg::Done)]);
}

#[test]
fn identity_is_sent_after_good() {
    for (answer, auth) in [
        (Msg::Secret { key: "k".into() }, Auth::Secret("k".into())),
        (Msg::Refused, Auth::Refused),
    ] {
        let mut s = sender(b"").with_identity("bob");
        drain(&mut s);
        s.handle_msg(Msg::Grant { window: None }).unwrap();
        s.handle_msg(Msg::Good).unwrap();
        assert_eq!(
            drain(&mut s),
            vec![
                Output::Send(Msg::Done),
                Output::Send(Msg::Identify { id: "bob".into() })
            ]
        );
        s.handle_msg(answer).unwrap();
        assert_eq!(
            drain(&mut s),
            vec![Output::Finished(Outcome::Delivered { auth: Some(auth) })]
        );
    }
}

#[test]
fn rejections_and_bad_verdicts_finish() {
    let mut s = sender(b"x");
    s.handle_msg(Msg::Reject {
        reason: RejectReason::Exists,
    })
    .unwrap();
    assert!(s.is_finished());
    let mut s = sender(b"");
    s.handle_msg(Msg::Grant { window: None }).unwrap();
    let reason = BadReason::NotStored {
        reason: "disk".into(),
    };
    s.handle_msg(Msg::Bad {
        reason: reason.clone(),
    })
    .unwrap();
    assert_eq!(
        drain(&mut s).last(),
        Some(&Output::Finished(Outcome::Bad(reason)))
    );
}

#[test]
fn bad_grants_are_refused() {
    let cases = [
        (b"x".as_slice(), Msg::Grant { window: None }),
        (b"".as_slice(), grant(1, 1)),
        (b"x".as_slice(), grant(0, 4)),
        (b"x".as_slice(), grant(2, 0)),
        (b"x".as_slice(), grant(1024, 1 << 20)), // 1 GiB > 64 MiB staging
    ];
    for (data, g) in cases {
        let mut s = sender(data);
        assert!(matches!(s.handle_msg(g), Err(TransferError::BadGrant(_))));
    }
    let mut s = sender(b"x");
    let Msg::Grant {
        window: Some(mut w),
    } = grant(1, 4)
    else {
        panic!()
    };
    w.region.len = 3;
    assert!(s.handle_msg(Msg::Grant { window: Some(w) }).is_err());
}

#[test]
fn bad_acks_and_out_of_order_messages_are_errors() {
    let mut s = sender(b"abcdefghij");
    drain(&mut s);
    s.handle_msg(grant(2, 4)).unwrap();
    let out = drain(&mut s);
    // Ack of a chunk not yet written.
    let e = s.handle_msg(Msg::Ack { next: 1 }).unwrap_err();
    assert!(matches!(e, TransferError::BadAck { next: 1, .. }), "{e}");

    let mut s = sender(b"abcdefghij");
    s.handle_msg(grant(2, 4)).unwrap();
    fill(&mut s, &out);
    s.handle_msg(Msg::Ack { next: 1 }).unwrap();
    assert!(s.handle_msg(Msg::Ack { next: 1 }).is_err(), "repeated ack");

    let mut s = sender(b"x");
    let e = s.handle_msg(Msg::Good).unwrap_err();
    assert_eq!(e.to_string(), "unexpected Good while waiting for the grant");
    assert!(s.handle_msg(grant(1, 1)).is_err(), "failed for good");

    let mut s = sender(b"abcdefghij");
    s.handle_msg(grant(2, 4)).unwrap();
    let e = s.handle_msg(Msg::Good).unwrap_err();
    assert_eq!(e.to_string(), "unexpected Good while sending chunks");
}

#[test]
fn driver_mistakes_are_caught() {
    let mut s = sender(b"abcdefghij");
    drain(&mut s);
    s.handle_msg(grant(2, 4)).unwrap();
    let out = drain(&mut s);
    let Output::WriteChunk(c1) = out[2] else {
        panic!()
    };
    assert!(s.fill_chunk(&c1, &mut [0; 4]).is_err(), "chunk 1 before 0");

    let mut s = sender(b"abcdefghij");
    s.handle_msg(grant(2, 4)).unwrap();
    assert!(s.handle_write_done(0).is_err(), "completion before fill");
}

/// A sender whose source holds 4 of the 8 bytes it offered, with its one chunk due.
fn short_source() -> (Sender, ChunkWrite) {
    let offer = FileOffer {
        name: "f".into(),
        len: 8,
        digest: hash_bytes(HashAlg::Sha256, b"abcdefgh"),
        overwrite: false,
    };
    let mut s = Sender::new(offer, Box::new(Cursor::new(b"abcd".to_vec()))).unwrap();
    drain(&mut s);
    s.handle_msg(grant(1, 8)).unwrap();
    let out = drain(&mut s);
    let Output::WriteChunk(c) = out[1] else {
        panic!()
    };
    (s, c)
}

#[test]
fn a_short_source_aborts_with_the_reason() {
    let (mut s, c) = short_source();
    s.fill_chunk(&c, &mut [0; 8]).unwrap();
    assert!(s.stopped_sending(), "the driver must not post the chunk");
    assert_short_source_abort(&mut s);
}

/// `Abort` with the reason goes out; Acks already on their way are dropped; the
/// receiver's answering `Abort` ends the transfer.
fn assert_short_source_abort(s: &mut Sender) {
    let out = drain(s);
    let reason = match out.as_slice() {
        [Output::Send(Msg::Abort { reason })] => reason.clone(),
        other => panic!("{other:?}"),
    };
    assert!(
        matches!(&reason, RejectReason::Unavailable { reason } if reason.contains("ended at byte 0 of 8")),
        "{reason}"
    );
    assert!(!s.is_finished());
    s.handle_msg(Msg::Ack { next: 1 }).unwrap();
    s.handle_msg(Msg::Abort {
        reason: reason.clone(),
    })
    .unwrap();
    assert_eq!(drain(s), vec![Output::Finished(Outcome::Aborted(reason))]);
    assert!(s.is_finished());
}

#[test]
fn read_jobs_fill_chunks_in_order_off_the_state_machine() {
    let data = b"abcdefghij"; // 3 chunks of 4 through 2 slots
    let mut s = sender(data);
    drain(&mut s);
    s.handle_msg(grant(2, 4)).unwrap();
    let out = drain(&mut s);
    let chunks: Vec<ChunkWrite> = out
        .iter()
        .filter_map(|o| match o {
            Output::WriteChunk(c) => Some(*c),
            _ => None,
        })
        .collect();
    assert_eq!(chunks.len(), 2);
    let job = s.take_read(&chunks[0]).unwrap();
    assert_eq!(job.index(), 0);
    // The job owns what it needs: it runs with the state machine borrowed elsewhere.
    let read = std::thread::spawn(move || job.run()).join().unwrap();
    assert_eq!(s.handle_read(read).unwrap(), b"abcd");
    let read = s.take_read(&chunks[1]).unwrap().run();
    assert_eq!(s.handle_read(read).unwrap(), b"efgh");
    s.handle_msg(Msg::Ack { next: 2 }).unwrap();
    s.handle_write_done(0).unwrap();
    let out = drain(&mut s);
    let Some(Output::WriteChunk(c2)) = out.first().cloned() else {
        panic!("{out:?}")
    };
    assert_eq!((c2.index, c2.len), (2, 2));
    // Done follows the last WriteChunk: a driver holds it back until the read.
    assert_eq!(out.get(1), Some(&Output::Send(Msg::Done)));
    let read = s.take_read(&c2).unwrap().run();
    assert_eq!(s.handle_read(read).unwrap(), b"ij");
}

#[test]
fn a_chunk_not_yet_read_cannot_be_acked_or_read_twice() {
    let mut s = sender(b"abcdefgh");
    drain(&mut s);
    s.handle_msg(grant(2, 4)).unwrap();
    let out = drain(&mut s);
    let [_, Output::WriteChunk(c0), Output::WriteChunk(c1), _] = out.as_slice() else {
        panic!("{out:?}")
    };
    let (c0, c1) = (*c0, *c1);
    let _job = s.take_read(&c0).unwrap();
    // Its read is out: the peer cannot have it yet.
    assert!(matches!(
        s.handle_msg(Msg::Ack { next: 1 }),
        Err(TransferError::BadAck { .. })
    ));

    let mut s = sender(b"abcdefgh");
    drain(&mut s);
    s.handle_msg(grant(2, 4)).unwrap();
    drain(&mut s);
    let _job = s.take_read(&c0).unwrap();
    assert!(matches!(s.take_read(&c1), Err(TransferError::Driver(_))));
    let mut s = sender(b"abcdefgh");
    drain(&mut s);
    s.handle_msg(grant(2, 4)).unwrap();
    drain(&mut s);
    assert!(s.take_read(&c1).is_err(), "chunk 1 before chunk 0");
}

#[test]
fn a_short_source_aborts_in_a_read_job_too() {
    let (mut s, c) = short_source();
    let read = s.take_read(&c).unwrap().run();
    s.handle_read(read).unwrap();
    assert!(s.stopped_sending());
    assert_short_source_abort(&mut s);
}

/// Security issue item 7: a fetch kept hashing (up to 1 TiB) after its client left.
/// A cancelled preparation stops at its next read.
#[test]
fn a_cancelled_fetch_stops_hashing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), vec![7u8; 1 << 20]).unwrap();
    let cancel = AtomicBool::new(true);
    let e = Sender::for_fetch_cancellable(dir.path(), "f", HashAlg::Sha256, &cancel).unwrap_err();
    assert!(
        matches!(&e, RejectReason::Unavailable { reason } if reason.contains("cancelled")),
        "{e}"
    );
}

#[test]
fn files_are_hashed_for_the_offer_and_fetches_checked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f"), b"abc").unwrap();
    let s = Sender::from_file(&dir.path().join("f"), "g", HashAlg::Blake3, true).unwrap();
    assert_eq!(s.offer().len, 3);
    assert_eq!(s.offer().name, "g");
    assert_eq!(s.offer().digest, hash_bytes(HashAlg::Blake3, b"abc"));
    assert!(s.offer().overwrite);

    let s = Sender::for_fetch(dir.path(), "f", HashAlg::Sha256).unwrap();
    assert_eq!(s.offer().digest, hash_bytes(HashAlg::Sha256, b"abc"));
    assert_eq!(
        Sender::for_fetch(dir.path(), "missing", HashAlg::Sha256).unwrap_err(),
        RejectReason::NotFound
    );
    assert!(matches!(
        Sender::for_fetch(dir.path(), "../f", HashAlg::Sha256).unwrap_err(),
        RejectReason::BadName { .. }
    ));
    assert!(Sender::from_file(&dir.path().join("f"), "a/b", HashAlg::Sha256, false).is_err());
}

#[test]
fn an_abort_stops_the_writes_and_done_marks_the_last_one() {
    let data = b"abcdefghijklmnopqrst";
    let mut s = sender(data);
    drain(&mut s);
    s.handle_msg(grant(2, 4)).unwrap();
    let out = drain(&mut s);
    assert_eq!(writes(&out), vec![0, 1]);
    fill(&mut s, &out);
    // Acked, so chunks 2 and 3 are issued but not yet taken by the driver.
    s.handle_write_done(0).unwrap();
    s.handle_write_done(1).unwrap();
    s.handle_msg(Msg::Ack { next: 2 }).unwrap();
    let reason = RejectReason::NoSpace {
        needed: 20,
        available: 0,
    };
    s.handle_msg(Msg::Abort {
        reason: reason.clone(),
    })
    .unwrap();
    assert_eq!(
        drain(&mut s),
        vec![
            Output::Send(Msg::Done),
            Output::Finished(Outcome::Aborted(reason.clone()))
        ],
        "no more chunks; Done after those already posted"
    );
    assert!(s.is_finished());
    // After Done was sent, an abort only ends the transfer.
    let mut s = sender(b"ab");
    drain(&mut s);
    s.handle_msg(grant(1, 4)).unwrap();
    let out = drain(&mut s);
    fill(&mut s, &out);
    s.handle_write_done(0).unwrap();
    assert_eq!(drain(&mut s), vec![]);
    s.handle_msg(Msg::Abort {
        reason: reason.clone(),
    })
    .unwrap();
    assert_eq!(
        drain(&mut s),
        vec![Output::Finished(Outcome::Aborted(reason))]
    );
}

/// Issue 26 (1): the grant a hostile fetching client sends. The slot state was
/// `vec![None; slots]` (about a gigabyte for 64 Mi slots) and the staging buffer the
/// whole window, for every Fetch.
#[test]
fn grants_of_too_many_or_too_small_slots_are_refused() {
    let data = vec![7u8; 1 << 20];
    for (slots, slot_len, why) in [
        (64 << 20, 1, "more than the 1024 accepted"),
        (MAX_GRANT_SLOTS + 1, 4096, "more than the 1024 accepted"),
        (16, 1, "fewer than the 4096 required"),
        (16, 4095, "fewer than the 4096 required"),
    ] {
        let mut s = sender(&data).with_min_slot_len(MIN_GRANT_SLOT_LEN);
        drain(&mut s);
        let err = s.handle_msg(grant(slots, slot_len)).unwrap_err();
        assert!(
            matches!(err, TransferError::BadGrant(_)) && err.to_string().contains(why),
            "{slots} x {slot_len}: {err}"
        );
        assert!(drain(&mut s).is_empty(), "nothing staged");
    }
}

/// A file smaller than the granted window stages only its own bytes, and keeps
/// state only for the slots it can fill.
#[test]
fn staging_and_slot_state_follow_the_chunks_not_the_grant() {
    let data = vec![7u8; 10_000];
    let mut s = sender(&data).with_min_slot_len(MIN_GRANT_SLOT_LEN);
    drain(&mut s);
    s.handle_msg(grant(1024, 1 << 16)).unwrap();
    let out = drain(&mut s);
    assert_eq!(out[0], Output::Stage { len: 10_000 });
    assert_eq!(writes(&out), vec![0]);
    assert_eq!(s.pipe.as_ref().unwrap().slots.len(), 1);

    let mut s = sender(&data).with_min_slot_len(MIN_GRANT_SLOT_LEN);
    drain(&mut s);
    s.handle_msg(grant(1024, 4096)).unwrap();
    let out = drain(&mut s);
    assert_eq!(out[0], Output::Stage { len: 10_000 });
    assert_eq!(writes(&out), vec![0, 1, 2]);
    assert_eq!(s.pipe.as_ref().unwrap().slots.len(), 3);
}

#[test]
fn a_receiver_that_stops_acknowledging_is_given_up_on() {
    let data = b"abcdefghij"; // 3 chunks of 4 through 2 slots
    let mut s = sender(data);
    drain(&mut s);
    assert!(s.waits_on_peer(), "the offer waits for a grant");
    s.handle_msg(grant(2, 4)).unwrap();
    let out = drain(&mut s);
    assert!(
        out.iter().any(|o| matches!(o, Output::WriteChunk(_))),
        "{out:?}"
    );
    let reason = RejectReason::Stalled { secs: 60 };
    s.give_up(reason.clone());
    assert_eq!(
        drain(&mut s),
        vec![
            Output::Send(Msg::Abort {
                reason: reason.clone()
            }),
            Output::Finished(Outcome::Aborted(reason.clone())),
        ]
    );
    assert!(s.is_finished() && s.stopped_sending() && !s.waits_on_peer());
    s.give_up(reason);
    assert_eq!(drain(&mut s), vec![]);
}

#[test]
fn a_sender_waiting_for_the_answer_to_its_abort_stops_waiting() {
    let (mut s, c) = short_source();
    s.fill_chunk(&c, &mut [0; 8]).unwrap();
    let out = drain(&mut s);
    assert!(
        matches!(out.as_slice(), [Output::Send(Msg::Abort { .. })]),
        "{out:?}"
    );
    assert!(s.waits_on_peer());
    let reason = RejectReason::Stalled { secs: 5 };
    s.give_up(reason.clone());
    // Our Abort went out already: no second one.
    assert_eq!(
        drain(&mut s),
        vec![Output::Finished(Outcome::Aborted(reason))]
    );
}

/// A chunk's read job refused by the connection's bound on blocking work
/// (`BlockingError::Busy`): the transfer ends with the reason told to the peer, though
/// the sender waits on its own read rather than on the peer.
#[test]
fn a_refused_read_job_ends_the_transfer_with_the_reason() {
    let mut s = sender(b"abcdefgh");
    drain(&mut s);
    s.handle_msg(grant(2, 4)).unwrap();
    let out = drain(&mut s);
    let [_, Output::WriteChunk(c0), ..] = out.as_slice() else {
        panic!("{out:?}")
    };
    let job = s.take_read(c0).unwrap();
    drop(job);
    let reason = RejectReason::Unavailable {
        reason: "the server is busy: blocking task refused".into(),
    };
    s.handle_job_refused(reason.clone());
    assert_eq!(
        drain(&mut s),
        vec![
            Output::Send(Msg::Abort {
                reason: reason.clone()
            }),
            Output::Finished(Outcome::Aborted(reason.clone()))
        ]
    );
    assert!(s.is_finished());
    s.handle_job_refused(reason);
    assert!(drain(&mut s).is_empty(), "once only");
}
