//! Every decoder of peer bytes, as fuzz targets: one function per target that takes
//! arbitrary bytes, decodes them the way the server (or client) would, and checks what
//! the decoder promises (a decoded value encodes back to the same bytes where the
//! format is canonical; a state machine fails with an error, never a panic). A panic
//! here is a finding: a peer must never be able to panic a poller thread.
//!
//! Used by the cargo-fuzz targets in `fuzz/` (libFuzzer, nightly) and by the bounded
//! stable runner `services/tests/fuzz_decoders.rs`, which replays the committed corpus
//! in `fuzz/corpus/<target>/` and mutates it for a few seconds in every `cargo test`.

use rdmactor::proto::budget::BudgetError;
use rdmactor::proto::frame::{FrameKind, Header, RendezvousOffer, HEADER_LEN, OFFER_LEN};
use rdmactor::proto::hello::{Hello, Reject, Welcome};
use rdmactor::proto::oob::{decode_records, Dest, RECORD_LEN};

use crate::file_transfer::Msg;
use crate::ingest::ring::ServerRing;
use crate::ingest::{unseal, Credits, ImmCodec, IngestRequest, IngestResponse};
use crate::lambda::{LambdaRequest, LambdaResponse};
use crate::pingpong::{PingPong, PingPongState};
use crate::read::{ReadRequest, ReadResponse};
use crate::rping::{RpingAction, RpingConfig, RpingSession};

/// One decoder (or machine) fed with peer bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The rdmactor frame header and the rendezvous offer body.
    Frame,
    /// Connect private data: hello (server side), welcome and reject (client side).
    Hello,
    /// The `ibv_*_pingpong` TCP exchange records.
    Oob,
    /// One file-transfer control message.
    FileTransfer,
    /// Ingest requests and answers, the record immediates into a ring, the checksum.
    Ingest,
    /// Read-service requests and answers.
    Read,
    /// Lambda requests and answers (the wire types only).
    Lambda,
    /// The rping server machine, driven by received messages and completions.
    Rping,
    /// The ping-pong sequence check.
    PingPong,
}

impl Target {
    /// Every target, in the order the runner reports them.
    pub const ALL: [Target; 9] = [
        Target::Frame,
        Target::Hello,
        Target::Oob,
        Target::FileTransfer,
        Target::Ingest,
        Target::Read,
        Target::Lambda,
        Target::Rping,
        Target::PingPong,
    ];

    /// The name of its cargo-fuzz target and corpus directory.
    pub fn name(self) -> &'static str {
        match self {
            Target::Frame => "frame",
            Target::Hello => "hello",
            Target::Oob => "oob",
            Target::FileTransfer => "file_transfer_msg",
            Target::Ingest => "ingest",
            Target::Read => "read",
            Target::Lambda => "lambda",
            Target::Rping => "rping",
            Target::PingPong => "pingpong",
        }
    }

    /// Feeds `data` to the target. Panics only on a broken promise (a finding).
    pub fn run(self, data: &[u8]) {
        match self {
            Target::Frame => frame(data),
            Target::Hello => hello(data),
            Target::Oob => oob(data),
            Target::FileTransfer => file_transfer(data),
            Target::Ingest => ingest(data),
            Target::Read => postcard_pair::<ReadRequest, ReadResponse>(data),
            Target::Lambda => postcard_pair::<LambdaRequest, LambdaResponse>(data),
            Target::Rping => rping(data),
            Target::PingPong => pingpong(data),
        }
    }

    /// Valid inputs to start from (the committed corpus holds these and more).
    pub fn seeds(self) -> Vec<Vec<u8>> {
        match self {
            Target::Frame => {
                let mut data = vec![0; HEADER_LEN + 3];
                Header {
                    kind: FrameKind::Data,
                    credits: 4,
                    len: 3,
                    tag: 7,
                }
                .encode(&mut data);
                data[HEADER_LEN..].copy_from_slice(b"abc");
                let mut offer = vec![0; HEADER_LEN + OFFER_LEN];
                Header {
                    kind: FrameKind::RendezvousOffer,
                    credits: 1,
                    len: 1 << 20,
                    tag: 9,
                }
                .encode(&mut offer);
                RendezvousOffer {
                    addr: 0x7f00_0000_1000,
                    rkey: 0x1234,
                    key: 2,
                }
                .encode(&mut offer[HEADER_LEN..]);
                vec![data, offer]
            }
            Target::Hello => {
                let hello = Hello {
                    version: rdmactor::proto::hello::PROTOCOL_VERSION,
                    service: "echo".into(),
                    recv_depth: 4,
                    recv_size: 4096,
                    max_credits: 16,
                }
                .encode()
                .expect("a short name encodes");
                let reject = Reject::new(
                    rdmactor::proto::hello::RejectCode::UnknownService,
                    "unknown service \"x\"",
                )
                .encode();
                vec![hello, reject]
            }
            Target::Oob => {
                let rec = b"0000:000123:abcdef:fe800000000000000000000000000001";
                let mut one = vec![1u8];
                one.extend_from_slice(rec);
                vec![one]
            }
            Target::FileTransfer => vec![
                Msg::Done.encode(),
                Msg::Ack { next: 3 }.encode(),
                Msg::Fetch {
                    name: "a.bin".into(),
                    alg: crate::file_transfer::HashAlg::Sha256,
                }
                .encode(),
            ],
            Target::Ingest => vec![
                [
                    &[0u8][..],
                    &postcard::to_allocvec(&IngestRequest::Open).unwrap(),
                ]
                .concat(),
                [
                    &[1u8][..],
                    &postcard::to_allocvec(&Credits { slots: vec![1, 2] }).unwrap(),
                ]
                .concat(),
                vec![2, 0, 0, 0, 1, 0, 0, 0, 4],
            ],
            Target::Read => vec![[
                &[0u8][..],
                &postcard::to_allocvec(&ReadRequest::Lookup { name: "r".into() }).unwrap(),
            ]
            .concat()],
            Target::Lambda => vec![[
                &[0u8][..],
                &postcard::to_allocvec(&LambdaRequest::Upload {
                    module: b"\0asm\x01\0\0\0".to_vec(),
                })
                .unwrap(),
            ]
            .concat()],
            Target::Rping => {
                // A client's buffer advertisement (16 bytes, big-endian), then steps.
                let mut v = vec![0, 16];
                v.extend_from_slice(&0x1000u64.to_be_bytes());
                v.extend_from_slice(&7u32.to_be_bytes());
                v.extend_from_slice(&64u32.to_be_bytes());
                v.extend_from_slice(&[1, 2, 3]);
                vec![v]
            }
            Target::PingPong => {
                let ping = postcard::to_allocvec(&PingPong::Ping {
                    seq: 0,
                    payload: b"x".to_vec(),
                })
                .unwrap();
                vec![[&[ping.len() as u8][..], &ping].concat()]
            }
        }
    }
}

fn frame(data: &[u8]) {
    if let Ok((header, body)) = Header::decode(data) {
        // A header that decodes re-encodes to the bytes it came from (the reserved
        // bytes are not checked on decode, so compare the rest).
        let mut again = [0u8; HEADER_LEN];
        header.encode(&mut again);
        assert_eq!(again[..2], data[..2]);
        assert_eq!(again[4..], data[4..HEADER_LEN]);
        if header.kind == FrameKind::RendezvousOffer {
            let offer = RendezvousOffer::decode(body);
            let mut out = [0u8; OFFER_LEN];
            offer.encode(&mut out);
            assert_eq!(&out[..], body);
        }
        if header.kind == FrameKind::Refuse {
            // A refusal that decodes names a reason and re-encodes to its bytes, as
            // long as its numbers fit this machine's usize.
            if let Some(why) = BudgetError::decode(body) {
                let _ = why.to_string();
                assert_eq!(BudgetError::decode(&why.encode()), Some(why));
            }
        }
        if header.kind == FrameKind::Close {
            let _ = String::from_utf8_lossy(body);
        }
    }
}

fn hello(data: &[u8]) {
    if let Ok(Some(h)) = Hello::decode(data) {
        let again = h.encode().expect("a decoded hello encodes");
        assert_eq!(Hello::decode(&again).ok().flatten(), Some(h));
    }
    if let Some(w) = Welcome::decode(data) {
        assert_eq!(Welcome::decode(&w.encode()), Some(w));
    }
    if let Some(r) = Reject::decode(data) {
        let _ = r.to_string();
        let _ = Reject::decode(&r.encode());
    }
}

fn oob(data: &[u8]) {
    let Some((&count, rest)) = data.split_first() else {
        return;
    };
    if let Ok(dests) = decode_records(rest, usize::from(count)) {
        assert!(dests.len() <= usize::from(count).max(1));
    }
    if let Ok(record) = <&[u8; RECORD_LEN]>::try_from(rest) {
        if let Ok(d) = Dest::decode(0, record) {
            assert_eq!(Dest::decode(0, &d.encode()).ok(), Some(d));
        }
    }
}

fn file_transfer(data: &[u8]) {
    if let Ok(msg) = Msg::decode(data) {
        let _ = format!("{msg:?}");
        assert_eq!(Msg::decode(&msg.encode()).ok(), Some(msg));
    }
}

/// First byte: which of the two message types the rest is (as the server or as the
/// client would receive it); the decoded value must round-trip.
fn postcard_pair<A, B>(data: &[u8])
where
    A: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
    B: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
{
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    if which % 2 == 0 {
        round_trip::<A>(rest);
    } else {
        round_trip::<B>(rest);
    }
}

fn round_trip<T>(bytes: &[u8])
where
    T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
{
    if let Ok(v) = postcard::from_bytes::<T>(bytes) {
        let again = postcard::to_allocvec(&v).expect("encoding into a Vec cannot fail");
        assert_eq!(postcard::from_bytes::<T>(&again).ok(), Some(v));
    }
}

fn ingest(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 4 {
        0 => postcard_pair::<IngestRequest, IngestResponse>(rest),
        1 => round_trip::<Credits>(rest),
        2 => {
            // A ring of 1..=16 slots of a few sizes, then immediates as a client writes
            // them: the ring refuses what does not fit, never panics.
            let Some((&shape, imms)) = rest.split_first() else {
                return;
            };
            let slots = u32::from(shape % 16) + 1;
            let slot_len = [16u32, 64, 4096][usize::from(shape / 16) % 3];
            let Ok(mut ring) = ServerRing::new(slots, slot_len, 1) else {
                return;
            };
            let codec = ImmCodec::new(slots, slot_len).expect("the ring accepted it");
            for imm in imms.chunks_exact(4) {
                let imm = u32::from_le_bytes(imm.try_into().expect("4 bytes"));
                let _ = codec.decode(imm);
                match ring.handle_write(imm) {
                    Ok(arrival) => {
                        assert!(arrival.range.end <= ring.ring_len());
                        ring.handle_processed(arrival.slot);
                        let _ = ring.poll_credits();
                    }
                    Err(_) => return,
                }
            }
        }
        _ => {
            if let Some(payload) = unseal(rest) {
                assert!(payload.len() + crate::ingest::CHECKSUM_LEN == rest.len());
            }
        }
    }
}

fn rping(data: &[u8]) {
    // Steps: 0 = a received message of the next byte's length, 1 = READ done,
    // 2 = WRITE done, 3 = SEND done; actions are drained after each.
    let mut s = RpingSession::new(RpingConfig::default());
    let mut rest = data;
    while let Some((&step, tail)) = rest.split_first() {
        rest = tail;
        let result = match step % 4 {
            0 => {
                let Some((&len, tail)) = rest.split_first() else {
                    return;
                };
                let len = usize::from(len).min(tail.len());
                let (msg, tail) = tail.split_at(len);
                rest = tail;
                s.handle_recv(msg)
            }
            1 => s.handle_read_done(),
            2 => s.handle_write_done(),
            _ => s.handle_send_done(),
        };
        while let Some(action) = s.poll_action() {
            match action {
                RpingAction::Read { remote } => assert!(remote.len <= s.buffer_len()),
                RpingAction::Write { remote, len } => assert!(len <= remote.len),
                RpingAction::Send { .. } => {}
            }
        }
        if result.is_err() {
            return;
        }
    }
}

fn pingpong(data: &[u8]) {
    // Length-prefixed postcard messages, as the connection delivers them.
    let mut state = PingPongState::default();
    let mut rest = data;
    while let Some((&len, tail)) = rest.split_first() {
        let len = usize::from(len).min(tail.len());
        let (msg, tail) = tail.split_at(len);
        rest = tail;
        let Ok(msg) = postcard::from_bytes::<PingPong>(msg) else {
            return;
        };
        if state.handle_ping(msg).is_err() {
            return;
        }
    }
}
