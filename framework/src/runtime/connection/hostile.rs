//! Named frame sequences a hostile peer could send, aimed at the arithmetic on what it
//! controls (lengths, credits, offsets, addresses at the edges where sums wrap), and
//! their replay over the harness's pair: the native test's and the embedder check's
//! (`scripts/lib/embedder-check`), which proves the refusals do not depend on the build
//! profile's overflow-checks.

use super::harness::{config, frame, pair_shaped, settle, Checked, Outcome, DEPTH, HOSTILE_TAGS};
use crate::proto::frame::{FrameKind, HEADER_LEN};
use crate::verbs::Access;

/// In [`replay_frames`], an offer's rkey that stands for the region `a` exposes: the
/// offer gets that region's rkey, and its address is taken as an offset from the
/// region's start (wrapping), so a case can aim at the region's edges.
pub const EXPOSED_RKEY: u32 = 0xE0E0_E0E0;
/// The size of that region.
pub const EXPOSED_LEN: usize = 4096;

/// Sends `frames` as they are from `a` to `b` over the pair the native tests use, one
/// SEND each (an offer whose rkey is [`EXPOSED_RKEY`] aimed at a region of `a`), then
/// turns both sides until quiet: how the two cores took them.
pub fn replay_frames(frames: &[Vec<u8>]) -> Outcome {
    use crate::proto::frame::OFFER_LEN;
    let mut p = pair_shaped(DEPTH, DEPTH, config(), config());
    let exposed =
        p.a.device
            .register(EXPOSED_LEN, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
    for frame in frames {
        let mut frame = frame.clone();
        let offer = frame.len() == HEADER_LEN + OFFER_LEN
            && frame[1] == FrameKind::RendezvousOffer as u8
            && frame[HEADER_LEN + 8..HEADER_LEN + 12] == EXPOSED_RKEY.to_le_bytes();
        if offer {
            let at = HEADER_LEN;
            let offset = u64::from_le_bytes(frame[at..at + 8].try_into().expect("8 bytes"));
            let addr = exposed.addr().wrapping_add(offset);
            frame[at..at + 8].copy_from_slice(&addr.to_le_bytes());
            frame[at + 8..at + 12].copy_from_slice(&exposed.rkey().to_le_bytes());
        }
        p.a.send_raw(&frame);
        for _ in 0..4 {
            p.turn();
        }
    }
    let quiet = settle(&mut p);
    let checked = if quiet {
        Checked::Closed
    } else {
        Checked::NotQuiet
    };
    let outcome = Outcome::of(&p, checked);
    drop(p);
    drop(exposed);
    outcome
}

/// Frame sequences a hostile peer could send, aimed at the sums and casts of lengths,
/// offsets, counts and addresses it controls (lengths and credits near `u32::MAX`,
/// refusals near `u64::MAX`, offers whose `addr + len` wraps or ends past the exposed
/// region). Each is named; [`replay_frames`] plays one.
pub fn adversarial() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    use crate::proto::frame::{RendezvousOffer, OFFER_LEN, REFUSAL_LEN};
    let with = |kind, credits, len, tag, body: &[u8]| {
        let mut f = frame(kind, credits, len, tag);
        f.extend_from_slice(body);
        f
    };
    let offer = |credits, len, addr: u64, rkey| {
        let mut body = [0u8; OFFER_LEN];
        RendezvousOffer { addr, rkey, key: 1 }.encode(&mut body);
        with(
            FrameKind::RendezvousOffer,
            credits,
            len,
            HOSTILE_TAGS,
            &body,
        )
    };
    let refusal = |code: u8, len: u64, limit: u64| {
        let mut body = [0u8; REFUSAL_LEN];
        body[0] = code;
        body[1..9].copy_from_slice(&len.to_le_bytes());
        body[9..17].copy_from_slice(&limit.to_le_bytes());
        with(FrameKind::Refuse, 0, 0, 1, &body)
    };
    let x = EXPOSED_RKEY;
    let n = EXPOSED_LEN as u64;
    vec![
        (
            "data, length u32::MAX, 3 bytes",
            vec![with(FrameKind::Data, 0, u32::MAX, 1, b"abc")],
        ),
        (
            "data, length 2^31, no body",
            vec![with(FrameKind::Data, 0, 1 << 31, 1, &[])],
        ),
        (
            "credits u32::MAX",
            vec![with(FrameKind::Credit, u32::MAX, 0, 0, &[])],
        ),
        (
            "credits that sum past u32::MAX",
            vec![
                with(FrameKind::Credit, 1, 0, 0, &[]),
                with(FrameKind::Credit, u32::MAX, 0, 0, &[]),
            ],
        ),
        (
            "close, length u32::MAX",
            vec![with(FrameKind::Close, 0, u32::MAX, 0, b"x")],
        ),
        (
            "refusal of u64::MAX bytes",
            vec![refusal(1, u64::MAX, u64::MAX)],
        ),
        (
            "refusal with an unknown code",
            vec![refusal(9, u64::MAX, 0)],
        ),
        (
            "done for a key never offered",
            vec![with(FrameKind::RendezvousDone, 0, 0, u32::MAX, &[])],
        ),
        (
            "offer, length u32::MAX at 0",
            vec![offer(0, u32::MAX, 0, 1)],
        ),
        ("offer at u64::MAX", vec![offer(0, 1, u64::MAX, 1)]),
        (
            "offer whose addr + len wraps",
            vec![offer(0, 4096, u64::MAX - 100, 1)],
        ),
        (
            "offer that ends at u64::MAX",
            vec![offer(0, 4096, u64::MAX - 4096, 1)],
        ),
        ("offer of 0 bytes", vec![offer(0, 0, 0, 1)]),
        ("offer, credits u32::MAX", vec![offer(u32::MAX, 64, 0, 1)]),
        (
            "offer of the exposed region, whole",
            vec![offer(0, EXPOSED_LEN as u32, 0, x)],
        ),
        (
            "offer past the exposed region's end",
            vec![offer(0, 300, n - 200, x)],
        ),
        (
            "offer before the exposed region",
            vec![offer(0, 300, 0u64.wrapping_sub(100), x)],
        ),
        (
            "offer from the exposed region past u64::MAX",
            vec![offer(0, 4096, u64::MAX - 10, x)],
        ),
        (
            "offer with an rkey never granted",
            vec![offer(0, 300, 0, 0x0bad_0000)],
        ),
        (
            "two offers whose lengths sum past the budget",
            vec![offer(0, 200 << 10, 0, 1), offer(0, 200 << 10, 0, 1)],
        ),
    ]
}
