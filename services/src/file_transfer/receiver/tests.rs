use super::*;
use crate::file_transfer::endpoint::Endpoint;
use crate::file_transfer::hash::hash_bytes;
use crate::file_transfer::store::tests::entries;
use crate::file_transfer::store::{free_space, StoreError};
use crate::file_transfer::wire::{BadReason, FileOffer, RemoteWindow};

const WINDOW: RemoteWindow = RemoteWindow {
    addr: 0x10_0000,
    len: 0,
    rkey: 9,
};

fn config(dir: &std::path::Path) -> Arc<Config> {
    Arc::new(
        Config::new(dir)
            .with_window(2, 4)
            .with_max_size(100)
            .with_secret("alice", "a-key"),
    )
}

fn offer(name: &str, data: &[u8]) -> Msg {
    Msg::Offer(FileOffer {
        name: name.into(),
        len: data.len() as u64,
        digest: hash_bytes(HashAlg::Sha256, data),
        overwrite: false,
    })
}

/// Every output; consuming and committing are carried out at once (a driver would
/// do them elsewhere) and not listed.
fn drain(r: &mut Receiver) -> Vec<Output> {
    let mut all = Vec::new();
    while let Some(out) = r.poll_output() {
        if out == Output::Consume {
            let job = r.take_consume().expect("chunks to consume");
            r.handle_consumed(job.run()).unwrap();
            continue;
        }
        if out == Output::Commit {
            let temp = r.take_commit().expect("a file to commit");
            r.handle_committed(temp.commit()).unwrap();
        }
        all.push(out);
    }
    all
}

#[test]
fn slots_are_released_early_while_few_copies_wait_and_jobs_run_one_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let data = b"abcdefghijklmnopqrst"; // 5 chunks of 4 through 2 slots
    let ack = |next| Some(Output::Send(Msg::Ack { next }));
    let mut r = Receiver::new(config(dir.path()));
    r.handle_msg(offer("c", data)).unwrap();
    granted(&mut r, 8);
    r.handle_chunk(0, &data[0..4]).unwrap();
    // Copied out: its slot is free for chunk 2 at once, before any hashing.
    assert_eq!(r.poll_output(), ack(1));
    assert_eq!(r.poll_output(), Some(Output::Consume));
    let job = r.take_consume().unwrap();
    assert_eq!(job.len(), 1);
    assert!(r.take_consume().is_none(), "one job out at a time");
    r.handle_chunk(1, &data[4..8]).unwrap();
    assert_eq!(r.poll_output(), ack(2), "a second early release");
    r.handle_chunk(2, &data[8..12]).unwrap();
    assert_eq!(r.poll_output(), None, "two released copies wait: no third");
    r.handle_consumed(job.run()).unwrap();
    // Chunk 0 is consumed: one copy fewer waits, so chunk 2's slot goes now.
    assert_eq!(r.poll_output(), ack(3));
    assert_eq!(r.poll_output(), Some(Output::Consume));
    let job = r.take_consume().unwrap();
    assert_eq!(job.len(), 2, "chunks 1 and 2");
    r.handle_chunk(3, &data[12..16]).unwrap();
    r.handle_chunk(4, &data[16..]).unwrap();
    // Done while chunks are still out: the verdict waits.
    r.handle_msg(Msg::Done).unwrap();
    assert_eq!(
        r.poll_output(),
        None,
        "no slot needed any more, no verdict yet"
    );
    r.handle_consumed(job.run()).unwrap();
    let out = drain(&mut r);
    assert!(out.contains(&Output::Send(Msg::Good)), "{out:?}");
    assert_eq!(std::fs::read(dir.path().join("c")).unwrap(), data);
}

#[test]
fn the_verdict_waits_for_the_commit_and_a_failed_commit_is_bad() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Receiver::new(config(dir.path()));
    r.handle_msg(offer("late", b"")).unwrap();
    drain(&mut r);
    r.handle_msg(Msg::Done).unwrap();
    assert_eq!(r.poll_output(), Some(Output::Commit));
    assert_eq!(r.poll_output(), None, "no verdict before the commit");
    assert!(!r.is_finished());
    let temp = r.take_commit().unwrap();
    assert!(r.take_commit().is_none(), "taken once");
    drop(temp);
    let failed = StoreError::Io {
        op: "fsync",
        path: dir.path().join("late"),
        source: std::io::Error::other("disk on fire"),
    };
    r.handle_committed(Err(failed)).unwrap();
    let out = drain(&mut r);
    assert!(
        matches!(&out[0], Output::Send(Msg::Bad { reason: BadReason::NotStored { reason } }) if reason.contains("disk on fire")),
        "{out:?}"
    );
    assert!(!dir.path().join("late").exists());
    assert!(
        r.handle_committed(Ok(dir.path().join("x"))).is_err(),
        "one result"
    );
}

fn rejected(r: &mut Receiver) -> RejectReason {
    match drain(r).as_slice() {
        [Output::Send(Msg::Reject { reason }), Output::Finished(Outcome::Rejected(r2))] => {
            assert_eq!(reason, r2);
            reason.clone()
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// Offer accepted and the window granted, with the geometry checked.
fn granted(r: &mut Receiver, window_len: u64) {
    assert_eq!(drain(r), vec![Output::GrantWindow { len: window_len }]);
    let region = RemoteWindow {
        len: window_len,
        ..WINDOW
    };
    r.handle_window(region).unwrap();
    assert!(matches!(
        drain(r).as_slice(),
        [Output::Send(Msg::Grant { window: Some(w) })] if w.region == region
    ));
}

#[test]
fn a_window_that_cannot_be_registered_rejects_the_offer_and_keeps_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Receiver::new(config(dir.path()));
    r.handle_msg(offer("f", b"0123456789")).unwrap();
    assert_eq!(drain(&mut r), vec![Output::GrantWindow { len: 8 }]);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "the offer's temporary file exists while the window is asked for"
    );
    r.window_refused("registering 8 B would pass the pool's cap".into())
        .unwrap();
    match rejected(&mut r) {
        RejectReason::Unavailable { reason } => {
            assert!(
                reason.contains("window") && reason.contains("pool's cap"),
                "{reason}"
            )
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the temporary file went with the offer"
    );
    assert!(r.is_finished());
    assert!(
        r.window_refused("again".into()).is_err(),
        "a refusal nobody asked for is a driver error"
    );
}

#[test]
fn chunks_are_hashed_stored_and_acked_only_when_a_slot_is_needed() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Receiver::new(config(dir.path()));
    let data = b"0123456789"; // 3 chunks of 4, 4, 2 through 2 slots
    r.handle_msg(offer("f", data)).unwrap();
    granted(&mut r, 8);
    assert_eq!(r.chunk_range(0).unwrap(), 0..4);
    assert_eq!(r.chunk_range(1).unwrap(), 4..8);
    assert_eq!(r.chunk_range(2).unwrap(), 0..2);
    r.handle_chunk(0, &data[0..4]).unwrap();
    assert_eq!(drain(&mut r), vec![Output::Send(Msg::Ack { next: 1 })]);
    r.handle_chunk(1, &data[4..8]).unwrap();
    r.handle_chunk(2, &data[8..]).unwrap();
    assert_eq!(drain(&mut r), vec![]);
    r.handle_msg(Msg::Done).unwrap();
    let out = drain(&mut r);
    assert_eq!(out[0], Output::Revoke);
    assert_eq!(out[1], Output::Commit);
    assert_eq!(out[2], Output::Send(Msg::Good));
    assert!(matches!(
        &out[3],
        Output::Finished(Outcome::Stored { len: 10, .. })
    ));
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), data);
    assert!(r.is_finished());
}

#[test]
fn small_files_get_a_small_window_and_empty_files_none() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Receiver::new(config(dir.path()));
    r.handle_msg(offer("one", b"x")).unwrap();
    granted(&mut r, 1);

    let mut r = Receiver::new(config(dir.path()));
    r.handle_msg(offer("empty", b"")).unwrap();
    assert_eq!(
        drain(&mut r),
        vec![Output::Send(Msg::Grant { window: None })]
    );
    r.handle_msg(Msg::Done).unwrap();
    let out = drain(&mut r);
    assert_eq!(out[..2], [Output::Commit, Output::Send(Msg::Good)]);
    assert_eq!(std::fs::read(dir.path().join("empty")).unwrap(), b"");
}

#[test]
fn bad_names_oversize_and_existing_files_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("exists"), b"keep").unwrap();
    for name in ["../x", "/etc/passwd", "a\\b", "", "a\0b", &"n".repeat(256)] {
        let mut r = Receiver::new(config(dir.path()));
        r.handle_msg(offer(name, b"abc")).unwrap();
        assert!(
            matches!(rejected(&mut r), RejectReason::BadName { .. }),
            "{name:?}"
        );
    }
    let mut r = Receiver::new(config(dir.path()));
    r.handle_msg(offer("big", &[0; 101])).unwrap();
    assert_eq!(rejected(&mut r), RejectReason::TooLarge { max: 100 });
    let mut r = Receiver::new(config(dir.path()));
    r.handle_msg(offer("exists", b"new")).unwrap();
    assert_eq!(rejected(&mut r), RejectReason::Exists);
    assert_eq!(entries(dir.path()), vec!["exists"]);
    assert_eq!(std::fs::read(dir.path().join("exists")).unwrap(), b"keep");
}

#[test]
fn out_of_order_messages_name_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Receiver::new(config(dir.path()));
    let e = r.handle_msg(Msg::Done).unwrap_err();
    assert_eq!(e.to_string(), "unexpected Done while waiting for an offer");
    // Failed for good.
    assert!(r.handle_msg(offer("f", b"x")).is_err());

    let mut r = Receiver::new(config(dir.path()));
    r.handle_msg(offer("f", b"abcdefgh")).unwrap();
    granted(&mut r, 8);
    let e = r
        .handle_msg(Msg::Identify { id: "alice".into() })
        .unwrap_err();
    assert_eq!(e.to_string(), "unexpected Identify while receiving chunks");
    assert!(
        entries(dir.path()).is_empty(),
        "temp file removed on failure"
    );
}

#[test]
fn chunk_errors_are_fatal_and_clean_up() {
    let dir = tempfile::tempdir().unwrap();
    let start = |r: &mut Receiver| {
        r.handle_msg(offer("f", b"abcdefghij")).unwrap();
        granted(r, 8);
    };
    let mut r = Receiver::new(config(dir.path()));
    start(&mut r);
    assert!(matches!(
        r.handle_chunk(1, b"efgh"),
        Err(TransferError::ChunkOrder {
            got: 1,
            expected: 0
        })
    ));
    assert!(entries(dir.path()).is_empty());

    let mut r = Receiver::new(config(dir.path()));
    start(&mut r);
    assert!(matches!(
        r.handle_chunk(0, b"abc"),
        Err(TransferError::ChunkLength { .. })
    ));

    let mut r = Receiver::new(config(dir.path()));
    start(&mut r);
    r.handle_chunk(0, b"abcd").unwrap();
    assert!(matches!(
        r.handle_msg(Msg::Done),
        Err(TransferError::EarlyDone {
            received: 1,
            expected: 3
        })
    ));
    assert!(entries(dir.path()).is_empty());

    let mut r = Receiver::new(config(dir.path()));
    start(&mut r);
    r.handle_chunk(0, b"abcd").unwrap();
    r.handle_chunk(1, b"efgh").unwrap();
    r.handle_chunk(2, b"ij").unwrap();
    assert!(r.handle_chunk(3, b"").is_err(), "no chunk past the end");
}

#[test]
fn a_mismatch_is_bad_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Receiver::new(config(dir.path()));
    r.handle_msg(offer("f", b"abcd")).unwrap();
    granted(&mut r, 4);
    r.handle_chunk(0, b"abcX").unwrap();
    r.handle_msg(Msg::Done).unwrap();
    // The removal goes the way of a commit, before the verdict.
    let mut before = Vec::new();
    while let Some(out) = r.poll_output() {
        if out == Output::Consume {
            let job = r.take_consume().expect("chunks to consume");
            r.handle_consumed(job.run()).unwrap();
        } else {
            before.push(out);
        }
    }
    assert_eq!(
        before,
        vec![Output::Revoke, Output::Commit],
        "BAD waits for the removal"
    );
    let temp = r.take_commit().expect("the abandoned file");
    assert!(temp.is_abandoned());
    assert_eq!(
        entries(dir.path()).len(),
        1,
        "still there until the job runs"
    );
    assert!(matches!(temp.commit(), Err(StoreError::Abandoned(_))));
    assert!(entries(dir.path()).is_empty(), "removed by the job");
    r.handle_committed(Err(StoreError::NotFound("x".into())))
        .unwrap();
    let out = drain(&mut r);
    let got = hash_bytes(HashAlg::Sha256, b"abcX");
    let reason = BadReason::Mismatch { got };
    assert_eq!(
        out,
        vec![
            Output::Send(Msg::Bad {
                reason: reason.clone()
            }),
            Output::Finished(Outcome::Bad(reason)),
        ]
    );
    assert!(entries(dir.path()).is_empty());
    // No Identify after BAD.
    assert!(r.handle_msg(Msg::Identify { id: "alice".into() }).is_err());
}

#[test]
fn identify_after_good_answers_once() {
    let dir = tempfile::tempdir().unwrap();
    // Proved: a new, non-empty file named after the ID.
    let mut r = Receiver::new(config(dir.path()));
    r.handle_msg(offer("alice", b"x")).unwrap();
    granted(&mut r, 1);
    r.handle_chunk(0, b"x").unwrap();
    r.handle_msg(Msg::Done).unwrap();
    drain(&mut r);
    r.handle_msg(Msg::Identify { id: "alice".into() }).unwrap();
    let secret = Msg::Secret {
        key: "a-key".into(),
    };
    assert_eq!(drain(&mut r), vec![Output::Send(secret)]);
    assert!(r.handle_msg(Msg::Identify { id: "alice".into() }).is_err());
}

/// Security issue item 5: a 0-byte upload used to get the secret of any configured
/// ID, and Refused vs Secret told which IDs exist. An empty upload proves nothing,
/// and an unproved known ID gets the same `Refused` as an unknown one.
#[test]
fn an_empty_upload_proves_no_id() {
    let dir = tempfile::tempdir().unwrap();
    for id in ["alice", "mallory"] {
        let mut r = Receiver::new(config(dir.path()));
        r.handle_msg(offer(id, b"")).unwrap();
        r.handle_msg(Msg::Done).unwrap();
        drain(&mut r);
        r.handle_msg(Msg::Identify { id: id.into() }).unwrap();
        assert_eq!(drain(&mut r), vec![Output::Send(Msg::Refused)], "{id}");
        assert!(r.handle_msg(Msg::Identify { id: id.into() }).is_err());
    }
}

/// The ID must be the uploaded file's name: uploading `f` proves nothing about
/// `alice`.
#[test]
fn an_upload_proves_only_the_id_it_is_named_after() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Receiver::new(config(dir.path()));
    r.handle_msg(offer("f", b"x")).unwrap();
    granted(&mut r, 1);
    r.handle_chunk(0, b"x").unwrap();
    r.handle_msg(Msg::Done).unwrap();
    drain(&mut r);
    r.handle_msg(Msg::Identify { id: "alice".into() }).unwrap();
    assert_eq!(drain(&mut r), vec![Output::Send(Msg::Refused)]);
}

#[test]
fn a_fetch_refuses_an_offer_larger_than_it_allows_before_any_window() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Receiver::fetch(config(dir.path()), "f", HashAlg::Sha256, false).unwrap();
    drain(&mut r);
    r.handle_msg(offer("f", &[7; 101])).unwrap();
    let reason = RejectReason::TooLarge { max: 100 };
    assert_eq!(
        drain(&mut r),
        vec![
            Output::Send(Msg::Reject {
                reason: reason.clone()
            }),
            Output::Finished(Outcome::Rejected(reason)),
        ],
        "refused on the offer: no window granted, no byte moved"
    );
    assert!(entries(dir.path()).is_empty(), "no temporary file");
}

#[test]
fn a_fetch_only_takes_the_file_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Receiver::fetch(config(dir.path()), "f", HashAlg::Blake3, false).unwrap();
    assert_eq!(
        drain(&mut r),
        vec![Output::Send(Msg::Fetch {
            name: "f".into(),
            alg: HashAlg::Blake3
        })]
    );
    assert!(matches!(
        r.handle_msg(offer("g", b"x")),
        Err(TransferError::FetchMismatch(_))
    ));
    let mut r = Receiver::fetch(config(dir.path()), "f", HashAlg::Blake3, false).unwrap();
    drain(&mut r);
    r.handle_msg(Msg::Reject {
        reason: RejectReason::NotFound,
    })
    .unwrap();
    assert_eq!(
        drain(&mut r),
        vec![Output::Finished(Outcome::Rejected(RejectReason::NotFound))]
    );
    assert!(Receiver::fetch(config(dir.path()), "../f", HashAlg::Sha256, false).is_err());
}

#[test]
fn the_window_must_have_the_asked_length() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Receiver::new(config(dir.path()));
    assert!(r.handle_window(WINDOW).is_err());
    let mut r = Receiver::new(config(dir.path()));
    r.handle_msg(offer("f", b"abcdefgh")).unwrap();
    drain(&mut r);
    assert!(r.handle_window(RemoteWindow { len: 7, ..WINDOW }).is_err());
}

#[test]
fn an_offer_larger_than_the_free_space_is_refused_before_any_file_exists() {
    let dir = tempfile::tempdir().unwrap();
    let free = free_space(dir.path()).unwrap();
    let config = Arc::new(Config::new(dir.path()).with_max_size(u64::MAX));
    let mut r = Receiver::new(config);
    let len = free + (1 << 30);
    r.handle_msg(Msg::Offer(FileOffer {
        name: "big".into(),
        len,
        digest: hash_bytes(HashAlg::Sha256, b""),
        overwrite: false,
    }))
    .unwrap();
    let out = drain(&mut r);
    match out.as_slice() {
        [Output::Send(Msg::Reject {
            reason: RejectReason::NoSpace { needed, available },
        }), Output::Finished(Outcome::Rejected(_))] => {
            assert_eq!(*needed, len);
            // Others write to the same file system meanwhile: roughly `free`.
            assert!(*available < len, "{available}");
        }
        other => panic!("{other:?}"),
    }
    assert!(entries(dir.path()).is_empty(), "no temporary file");
    let text = RejectReason::NoSpace {
        needed: len,
        available: free,
    }
    .to_string();
    assert!(text.contains("no space left"), "{text}");
}

/// Answers the receiver's `Admit` by asking `owner`, as the session does.
async fn admit(
    r: &mut Receiver,
    owner: &actix::Addr<crate::file_transfer::QuotaOwner>,
) -> Vec<Output> {
    let out = drain(r);
    let [Output::Admit { client, len, free }] = &out[..] else {
        return out;
    };
    let admit = crate::file_transfer::Admit {
        client: client.clone(),
        len: *len,
        free: *free,
    };
    r.handle_admitted(owner.send(admit).await.unwrap()).unwrap();
    drain(r)
}

#[actix::test]
async fn a_client_past_its_quota_is_refused_and_served_again_once_under_it() {
    use actix::Actor;
    let dir = tempfile::tempdir().unwrap();
    let config = Arc::new(Config::new(dir.path()).with_client_quota(1, 1 << 20));
    let uploads = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let owner = crate::file_transfer::QuotaOwner::new(config.client_quota, uploads).start();
    let usage = |client: &str| owner.send(crate::file_transfer::Usage(client.into()));
    let receiver = |client: &str| {
        let mut r = Receiver::new(Arc::clone(&config));
        r.set_quota(client.into());
        r
    };
    let mut first = receiver("10.0.0.1");
    first.handle_msg(offer("a", b"12345678")).unwrap();
    assert_eq!(
        first.state_name(),
        "waiting for the service to admit the offer"
    );
    assert!(matches!(
        admit(&mut first, &owner).await[..],
        [Output::GrantWindow { .. }]
    ));
    assert_eq!(usage("10.0.0.1").await.unwrap(), (1, 8));
    // The same client on another connection: one upload at once.
    let mut second = receiver("10.0.0.1");
    second.handle_msg(offer("b", b"x")).unwrap();
    assert!(matches!(
        admit(&mut second, &owner).await[..],
        [
            Output::Send(Msg::Reject {
                reason: RejectReason::Quota {
                    limit: 1,
                    would_use: 2,
                    ..
                }
            }),
            _
        ]
    ));
    // Another client is served meanwhile; its bytes are limited too.
    let mut other = receiver("10.0.0.2");
    other
        .handle_msg(Msg::Offer(FileOffer {
            name: "huge".into(),
            len: (1 << 20) + 1,
            digest: hash_bytes(HashAlg::Sha256, b""),
            overwrite: false,
        }))
        .unwrap();
    let out = admit(&mut other, &owner).await;
    assert!(
        matches!(&out[0], Output::Send(Msg::Reject { reason: RejectReason::Quota { what, .. } }) if what.contains("bytes")),
        "{out:?}"
    );
    // The first upload ends (its connection drops it): the share comes back.
    drop(first);
    assert_eq!(usage("10.0.0.1").await.unwrap(), (0, 0));
    let mut third = receiver("10.0.0.1");
    third.handle_msg(offer("c", b"x")).unwrap();
    assert!(matches!(
        admit(&mut third, &owner).await[..],
        [Output::GrantWindow { .. }]
    ));
    // An admission answered twice, or out of turn, is a protocol error.
    assert!(third.handle_admitted(Err(RejectReason::Exists)).is_err());
}

#[test]
fn a_write_that_runs_out_of_space_aborts_with_the_reason_and_the_connection_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let data = b"abcdefghijklmnopqrst"; // 5 chunks of 4 through 2 slots
    let mut r = Receiver::new(config(dir.path()));
    r.handle_msg(offer("f", data)).unwrap();
    granted(&mut r, 8);
    r.handle_chunk(0, &data[0..4]).unwrap();
    let out: Vec<Output> = std::iter::from_fn(|| r.poll_output()).collect();
    assert!(out.contains(&Output::Consume), "{out:?}");
    let job = r.take_consume().unwrap();
    // The job's write fails as a full disk would make it.
    let Consumed { sink, .. } = job.run();
    let failed = Consumed {
        sink,
        done: Vec::new(),
        result: Err(StoreError::Io {
            op: "write",
            path: dir.path().join("f"),
            source: std::io::Error::from_raw_os_error(28), // ENOSPC
        }),
    };
    r.handle_consumed(failed).unwrap();
    let reason = RejectReason::NoSpace {
        needed: data.len() as u64,
        available: 0,
    };
    assert_eq!(
        drain(&mut r),
        vec![Output::Send(Msg::Abort {
            reason: reason.clone()
        })]
    );
    assert!(!r.is_finished(), "the window stays until the sender's Done");
    // A chunk still in flight lands and is ignored.
    assert_eq!(r.chunk_range(1).unwrap(), 0..0);
    r.handle_chunk(1, &[]).unwrap();
    r.handle_msg(Msg::Done).unwrap();
    assert_eq!(
        drain(&mut r),
        vec![Output::Revoke, Output::Finished(Outcome::Aborted(reason))]
    );
    assert!(r.is_finished());
    assert!(entries(dir.path()).is_empty(), "the temporary file is gone");
}

#[test]
fn a_silent_sender_is_given_up_on_and_everything_the_upload_held_goes() {
    let dir = tempfile::tempdir().unwrap();
    let data = b"abcdefghijklmnopqrst";
    let mut r = Receiver::new(config(dir.path()));
    assert!(!r.waits_on_peer(), "no transfer yet");
    r.handle_msg(offer("f", data)).unwrap();
    assert!(!r.waits_on_peer(), "the window is the server's own work");
    granted(&mut r, 8);
    assert!(r.waits_on_peer());
    r.handle_chunk(0, &data[0..4]).unwrap();
    drain(&mut r);
    assert_eq!(entries(dir.path()).len(), 1, "the temporary file");
    let reason = RejectReason::Stalled { secs: 60 };
    r.give_up(reason.clone());
    assert_eq!(
        drain(&mut r),
        vec![
            Output::Send(Msg::Abort {
                reason: reason.clone()
            }),
            Output::Revoke,
            Output::Finished(Outcome::Aborted(reason.clone())),
        ],
        "the window goes at once, not after the sender's Done"
    );
    assert!(r.is_finished() && !r.waits_on_peer());
    assert!(entries(dir.path()).is_empty(), "the temporary file is gone");
    // Once finished there is nothing to give up.
    r.give_up(reason);
    assert_eq!(drain(&mut r), vec![]);
    // A sender that wakes up and carries on meets an unexpected-message error.
    assert!(r.handle_msg(Msg::Done).is_err());
}

#[test]
fn an_abort_waiting_for_the_senders_done_is_given_up_on_too() {
    let dir = tempfile::tempdir().unwrap();
    let data = b"abcdefghijklmnopqrst";
    let mut r = Receiver::new(config(dir.path()));
    r.handle_msg(offer("g", data)).unwrap();
    granted(&mut r, 8);
    // A write failure made the receiver abort; the sender never says Done.
    r.handle_chunk(0, &data[0..4]).unwrap();
    let out: Vec<Output> = std::iter::from_fn(|| r.poll_output()).collect();
    assert!(out.contains(&Output::Consume), "{out:?}");
    let job = r.take_consume().expect("chunks to consume");
    let Consumed { sink, .. } = job.run();
    r.handle_consumed(Consumed {
        sink,
        done: Vec::new(),
        result: Err(StoreError::Io {
            op: "write",
            path: dir.path().join("g"),
            source: std::io::Error::from_raw_os_error(5),
        }),
    })
    .unwrap();
    assert!(matches!(
        drain(&mut r).as_slice(),
        [Output::Send(Msg::Abort { .. })]
    ));
    assert!(r.waits_on_peer(), "waiting for the sender's Done");
    let reason = RejectReason::Stalled { secs: 1 };
    r.give_up(reason.clone());
    assert_eq!(
        drain(&mut r),
        vec![Output::Revoke, Output::Finished(Outcome::Aborted(reason))]
    );
}

/// Issue 45: the service admits at most `Config::max_uploads` uploads at once over every
/// client. One more is refused with `ServerFull` on the wire before anything is staged,
/// and served once another upload ended.
#[actix::test]
async fn past_the_service_wide_upload_cap_an_offer_is_refused_as_server_full() {
    use actix::Actor;
    let dir = tempfile::tempdir().unwrap();
    let config = Arc::new(Config::new(dir.path()).with_max_uploads(1));
    let uploads = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let owner = crate::file_transfer::QuotaOwner::new(config.client_quota, uploads)
        .with_max_uploads(u64::from(config.max_uploads))
        .start();
    let receiver = |client: &str| {
        let mut r = Receiver::new(Arc::clone(&config));
        r.set_quota(client.into());
        r
    };
    let mut first = receiver("10.0.0.1");
    first.handle_msg(offer("a", b"12345678")).unwrap();
    assert!(matches!(
        admit(&mut first, &owner).await[..],
        [Output::GrantWindow { .. }]
    ));
    // Another client, well within its own share.
    let mut second = receiver("10.0.0.2");
    second.handle_msg(offer("b", b"x")).unwrap();
    let out = admit(&mut second, &owner).await;
    assert!(
        matches!(
            &out[..],
            [Output::Send(Msg::Reject { reason: RejectReason::ServerFull { limit: 1, what } }), _]
                if what.contains("on this server")
        ),
        "{out:?}"
    );
    assert!(
        std::fs::read_dir(dir.path()).unwrap().count() <= 1,
        "nothing staged for the refused offer"
    );
    // The first upload ends: its admission is released, and a new offer is served.
    drop(first);
    let mut third = receiver("10.0.0.2");
    third.handle_msg(offer("c", b"x")).unwrap();
    let out = admit(&mut third, &owner).await;
    assert!(matches!(out[..], [Output::GrantWindow { .. }]), "{out:?}");
}
