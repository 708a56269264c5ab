//! Two connection cores joined by a pair of loopback QPs, with the caller as their
//! driver: the native tests' and the fuzz target's. It does what the actor does
//! (`lifecycle.rs`) and nothing more: tell the core the time, hand it its completions,
//! take its deliveries, pump. What runs here is rdmactor's protocol on a transport that
//! keeps RDMA's rules (RC order, RNR, rkeys and bounds, flushes), with no device and no
//! actor.

use std::time::{Duration, Instant};

use super::{
    ring, CloseReason, Core, CoreParts, CreditWindow, Framing, Incoming, MrPool, OpId, Outgoing, Wr,
};
use crate::fuzz::Entropy;
use crate::memory::PoolConfig;
use crate::proto::credits::Advert;
use crate::proto::frame::{FrameKind, Header, HEADER_LEN};
use crate::runtime::ConnectionConfig;
use crate::transport::loopback::{connect_pair, Config, Cq, Device, Fabric, Loopback, Mr};
use crate::transport::SendWr;
use crate::verbs::{Access, ConnParam, QpCaps, SendOp};

/// Receives per connection (and the credits each side starts with).
pub(super) const DEPTH: u32 = 8;
/// Receive buffer size: messages above 240 bytes go by rendezvous.
const RECV_SIZE: usize = 256;

/// One side: its core, its CQ, and what reached its session.
pub(crate) struct End {
    pub(crate) core: Core<Loopback>,
    cq: Cq,
    pub(crate) device: Device,
    pub(crate) got: Vec<Incoming>,
    /// How the session's one-sided operations ended.
    pub(crate) ops: Vec<(OpId, crate::verbs::Result<()>)>,
    /// Why the core closed, once it did.
    pub(crate) closed: Option<CloseReason>,
    /// Completions polled, kept for the next turn (no allocation per turn).
    wcs: Vec<crate::verbs::WorkCompletion>,
}

pub(crate) struct Pair {
    _fabric: Fabric,
    pub(crate) a: End,
    pub(crate) b: End,
}

pub(crate) fn config() -> ConnectionConfig {
    ConnectionConfig {
        send_depth: 16,
        rendezvous_chunk: 4096,
        rendezvous_chunks: 2,
        ..ConnectionConfig::default()
    }
}

fn end(fabric: &Fabric, name: &str, depth: u32, peer: u32, config: ConnectionConfig) -> End {
    let device = fabric.device(name);
    let cq = device.create_cq(256, None).unwrap();
    let caps = QpCaps {
        max_send_wr: config.send_depth,
        max_recv_wr: depth,
        ..QpCaps::default()
    };
    let qp = device.create_qp(&cq, &cq, caps, None).unwrap();
    let pool = MrPool::<Loopback>::registered(
        &device,
        PoolConfig {
            classes: vec![RECV_SIZE, 4096],
            arena_bytes: 64 << 10,
            max_bytes: 4 << 20,
            reserved_smallest: 0,
            keep_bytes: 0,
            heap_bytes: 4 << 20,
        },
    );
    let recv = (0..depth).map(|_| pool.lease(RECV_SIZE).unwrap()).collect();
    let core = Core::new(CoreParts {
        qp,
        id: None,
        shared_recv: None,
        membership: None,
        cq: None,
        framing: Framing::Framed,
        recv,
        recv_size: RECV_SIZE,
        credits: Some(CreditWindow::new(Advert::fixed(depth), Advert::fixed(peer))),
        pd: device.clone(),
        pool,
        config,
    });
    End {
        core,
        cq,
        device,
        got: Vec::new(),
        ops: Vec::new(),
        closed: None,
        wcs: Vec::with_capacity(64),
    }
}

/// Two framed cores of [`DEPTH`] receives each, connected.
#[cfg(test)]
pub(crate) fn pair_with(config: ConnectionConfig) -> Pair {
    pair_shaped(DEPTH, DEPTH, config.clone(), config)
}

/// Two framed cores with `depth_a` and `depth_b` receives, connected (no RNR retries: a
/// credit rule broken shows as an error rather than a wait), receives posted,
/// established.
pub(crate) fn pair_shaped(
    depth_a: u32,
    depth_b: u32,
    config_a: ConnectionConfig,
    config_b: ConnectionConfig,
) -> Pair {
    let fabric = Fabric::new(Config::default());
    let mut a = end(&fabric, "a", depth_a, depth_b, config_a);
    let mut b = end(&fabric, "b", depth_b, depth_a, config_b);
    let param = ConnParam {
        rnr_retry_count: 0,
        ..ConnParam::default()
    };
    connect_pair(a.core.qp(), b.core.qp(), &param).unwrap();
    let now = Instant::now();
    for e in [&mut a, &mut b] {
        e.core.set_now(now);
        e.core.queue_all_receives();
        ring(&mut e.core).unwrap();
        e.core.establish(now);
    }
    Pair {
        _fabric: fabric,
        a,
        b,
    }
}

#[cfg(test)]
pub(crate) fn pair() -> Pair {
    pair_with(config())
}

impl Pair {
    /// A side that closed disconnects, and the other hears of it as the CM's
    /// DISCONNECTED (what `lifecycle.rs` does with the notice): it closes too.
    fn disconnects(&mut self) {
        match (&self.a.closed, &self.b.closed) {
            (Some(_), None) => self.b.closed = Some(CloseReason::PeerDisconnected),
            (None, Some(_)) => self.a.closed = Some(CloseReason::PeerDisconnected),
            _ => {}
        }
    }

    /// One turn of each side, then what a close tells the other; true when anything
    /// completed.
    pub(crate) fn turn(&mut self) -> bool {
        let moved = self.a.turn() | self.b.turn();
        self.disconnects();
        moved
    }
}

impl End {
    /// One turn of the driver: completions in, deliveries out, then everything the
    /// core decided posted. False when nothing completed.
    pub(crate) fn turn(&mut self) -> bool {
        if self.closed.is_some() {
            return false;
        }
        self.core.set_now(Instant::now());
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        self.cq.poll(&mut wcs).unwrap();
        if !wcs.is_empty() {
            self.core.liveness.heard();
        }
        for wc in &wcs {
            match self.core.handle_completion(wc) {
                Ok(Some(op)) => self.ops.push(op),
                Ok(None) => {}
                Err(reason) => {
                    self.closed = Some(reason);
                    self.wcs = wcs;
                    return true;
                }
            }
        }
        while let Some(m) = self.core.next_delivery() {
            self.got.push(m);
        }
        if let Err(reason) = self.pump() {
            self.closed = Some(reason);
        }
        let moved = !wcs.is_empty();
        self.wcs = wcs;
        moved
    }

    /// What the driver does after the core decided: pump, then post what came out.
    pub(crate) fn pump(&mut self) -> Result<(), CloseReason> {
        self.core.pump()?;
        ring(&mut self.core)
    }

    pub(crate) fn send(&mut self, tag: u32, bytes: Vec<u8>) {
        self.core.queue(Outgoing::Data { tag, bytes });
    }

    /// A frame made by hand, sent from memory of this side's device on its QP: what a
    /// hostile or broken peer can put on the wire.
    pub(crate) fn send_raw(&self, frame: &[u8]) {
        let mut mr: Mr = self
            .device
            .register(frame.len(), Access::LOCAL_WRITE)
            .unwrap();
        mr.write(0, frame).unwrap();
        let wr = SendWr::new(u64::MAX - 1, SendOp::Send, Some(mr.sge_all()));
        // A full send queue refuses it, as it would the hostile peer's own post. The slot
        // it takes is one the core does not know of: its own post may then be refused,
        // which closes it with the reason, as a real QP would.
        let _ = self.core.qp().post_send(&wr);
    }
}

#[cfg(test)]
impl Pair {
    /// Turns both sides until `done` holds; panics when it does not within 10 s.
    pub(crate) fn run_until(&mut self, done: impl FnMut(&Pair) -> bool) {
        assert!(
            self.run_for(Duration::from_secs(10), done),
            "no progress: stuck"
        );
    }

    /// Turns both sides until `done` holds (true) or `limit` has passed (false).
    pub(crate) fn run_for(&mut self, limit: Duration, mut done: impl FnMut(&Pair) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        while !done(self) {
            if Instant::now() >= deadline {
                return false;
            }
            let moved = self.a.turn() | self.b.turn();
            if !moved {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        true
    }
}

/// Tags of the honest side's messages stay below this; the hostile frames' are above.
pub(super) const HOSTILE_TAGS: u32 = 1 << 30;

/// One entropy-driven sequence against a pair of cores (see [`crate::fuzz`]), also the
/// model test of issue 29: the two cores' receive depths, send queues, READ chunking and
/// message limits are drawn, then `a` sends honest messages to `b` and also, on the
/// same QP, whatever a hostile peer would; `b` answers; either side may close, have its
/// timers run early or late, or lose its device. Panics on a finding:
/// - an honest message delivered twice, out of order or altered;
/// - a side open once quiet with a receive not posted again;
/// - while both sides stay open without hostile input, once quiet: an honest message
///   neither delivered nor refused, a rendezvous budget not back to zero;
/// - a pool chunk not back once the cores are gone.
pub fn fuzz_connection(e: &mut impl Entropy) -> Checked {
    fuzz_connection_outcome(e).checked
}

/// [`fuzz_connection`], and how the sequence ended: what a replay prints (the embedder
/// check, `scripts/lib/embedder-check`, compares it between two builds).
pub fn fuzz_connection_outcome(e: &mut impl Entropy) -> Outcome {
    let depths = [4 + e.below(13) as u32, 4 + e.below(13) as u32];
    let shape = |e: &mut dyn FnMut(u64) -> u64| ConnectionConfig {
        send_depth: 4 + e(29) as u32,
        rendezvous_chunk: 256 << e(5),
        rendezvous_chunks: 1 + e(4) as u32,
        max_message: 64 << 10,
        rendezvous_budget: 256 << 10,
        max_queued_sends: 64,
        ..config()
    };
    let config_a = shape(&mut |n| e.below(n));
    let config_b = shape(&mut |n| e.below(n));
    let mut p = pair_shaped(depths[0], depths[1], config_a, config_b);
    if e.one_in(4) {
        p.b.core.limit_message(e.below(8000) as usize);
    }
    let pools = [p.a.core.pool.clone(), p.b.core.pool.clone()];
    let mut sent: Vec<(u32, Vec<u8>)> = Vec::new();
    let mut hostile = false;
    for _ in 0..1 + e.below(48) {
        match e.below(11) {
            0..=2 => {
                let len = if e.one_in(6) {
                    e.below(70_000)
                } else {
                    e.below(300)
                };
                let tag = sent.len() as u32 + 1;
                let bytes = pattern(e.next_u64(), len as usize);
                if p.a.closed.is_none() && p.a.core.closing.is_none() {
                    sent.push((tag, bytes.clone()));
                    p.a.send(tag, bytes);
                }
            }
            3 => {
                let len = e.below(300) as usize;
                if p.b.closed.is_none() && p.b.core.closing.is_none() {
                    p.b.send(1, pattern(e.next_u64(), len));
                }
            }
            4 if e.one_in(2) => {
                hostile = true;
                p.a.send_raw(&hostile_frame(e));
            }
            5 if e.one_in(2) => {
                // A real frame, one byte of it changed.
                hostile = true;
                let mut frame = frame(FrameKind::Data, 0, e.below(64) as u32, HOSTILE_TAGS);
                frame.extend(pattern(e.next_u64(), frame_len(&frame)));
                let at = e.below(frame.len() as u64) as usize;
                frame[at] ^= 1 << e.below(8);
                p.a.send_raw(&frame);
            }
            6 if e.one_in(3) && p.a.core.closing.is_none() => {
                let why = CloseReason::Local("fuzz".into());
                p.a.core.closing = Some(why.clone());
                p.a.core.clear_queue();
                p.a.core.post_goodbye(&why);
            }
            7 => {
                // The timers, early or late.
                let end = if e.one_in(2) { &mut p.a } else { &mut p.b };
                let at = Instant::now() + Duration::from_millis(e.below(10_000));
                if end.closed.is_none() {
                    if let Err(reason) = end.core.handle_timeout(at) {
                        end.closed = Some(reason);
                    }
                }
            }
            8 if e.one_in(12) => {
                // A host dies without a word.
                hostile = true;
                if e.one_in(2) { &p.a } else { &p.b }.device.vanish();
            }
            9 => {
                // Completions arrive late, several turns' worth in one batch, or on
                // time again.
                let delay = Duration::from_micros(e.below(4) * 100);
                if e.one_in(2) { &p.a } else { &p.b }
                    .cq
                    .delay_completions(delay);
            }
            _ => {}
        }
        for _ in 0..e.below(4) {
            p.turn();
        }
    }
    let quiet = settle(&mut p);
    // What b delivered of a's honest messages came in the order a sent them, once each,
    // intact. Some may be missing: refused by b (its refusal may not reach a before a
    // close), or cut off by a close or a broken QP, which tells a's session they failed.
    let refused: Vec<u32> = p.a.core.refusals.iter().map(|(tag, _)| *tag).collect();
    let honest: Vec<&Incoming> =
        p.b.got
            .iter()
            .filter(|m| m.tag < HOSTILE_TAGS && m.tag > 0)
            .collect();
    let mut last = 0;
    for m in &honest {
        assert!(
            m.tag > last,
            "honest messages in order, once each: {} after {last}",
            m.tag
        );
        last = m.tag;
        let (_, bytes) = sent.get(m.tag as usize - 1).expect("a tag a sent");
        assert_eq!(&m.data, bytes, "message {} intact", m.tag);
        assert!(
            !refused.contains(&m.tag),
            "message {} both refused and delivered",
            m.tag
        );
    }
    let open = |end: &End| end.closed.is_none() && end.core.closing.is_none();
    let checked = match (quiet, hostile || !open(&p.a) || !open(&p.b)) {
        (false, _) => Checked::NotQuiet,
        (true, true) => Checked::Closed,
        (true, false) => Checked::All,
    };
    // A side still open once quiet has every receive posted again, whatever it was
    // sent: a hostile frame that did not close it did not cost it a receive either.
    for end in [&p.a, &p.b] {
        if quiet && open(end) {
            let posted = end
                .core
                .inflight
                .iter()
                .filter(|(_, wr)| matches!(wr, Wr::Recv(_)))
                .count();
            assert_eq!(posted, end.core.recv.len(), "every receive posted again");
        }
    }
    let outcome = Outcome::of(&p, checked);
    if checked == Checked::All {
        // Every message is accounted for: delivered, or refused back to its sender.
        for (tag, _) in &sent {
            assert!(
                honest.iter().any(|m| m.tag == *tag) || refused.contains(tag),
                "message {tag} neither delivered nor refused"
            );
        }
        for end in [&p.a, &p.b] {
            assert_eq!(end.core.budget_in.in_use(), 0, "incoming budget back");
            assert_eq!(end.core.budget_out.in_use(), 0, "outgoing budget back");
        }
    }
    drop(p);
    for pool in pools {
        let leased: usize = pool.stats().leased.iter().sum();
        assert_eq!(
            leased, 0,
            "every chunk back in the pool once the cores are gone"
        );
    }
    outcome
}

/// How a sequence ended: each side's close reason (`None`: still open), how many of
/// `b`'s deliveries reached its session, and how many of `a`'s messages `b` refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Which invariants the sequence could check.
    pub checked: Checked,
    /// Why `a` (the side that sends the hostile frames) closed.
    pub a: Option<String>,
    /// Why `b` (the side that receives them) closed.
    pub b: Option<String>,
    /// Messages delivered to `b`'s session.
    pub delivered: usize,
    /// Of `a`'s messages, those `b` refused (with the reasons, as `a` heard them).
    pub refused: Vec<String>,
}

impl Outcome {
    pub(super) fn of(p: &Pair, checked: Checked) -> Outcome {
        let why = |end: &End| {
            end.closed
                .as_ref()
                .or(end.core.closing.as_ref())
                .map(ToString::to_string)
        };
        Outcome {
            checked,
            a: why(&p.a),
            b: why(&p.b),
            delivered: p.b.got.len(),
            refused: p
                .a
                .core
                .refusals
                .iter()
                .map(|(_, why)| why.to_string())
                .collect(),
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = |s: &Option<String>| s.clone().unwrap_or_else(|| "open".into());
        write!(
            f,
            "a: {} | b: {} | delivered {} | refused [{}]",
            side(&self.a),
            side(&self.b),
            self.delivered,
            self.refused.join("; ")
        )
    }
}

/// Which invariants a sequence could check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// Every one: both sides stayed open, had no hostile input, and went quiet.
    All,
    /// Order, integrity and the pool: a side closed, or hostile input made the
    /// accounting of the other side's credits meaningless.
    Closed,
    /// Order, integrity and the pool: it did not go quiet within the bound.
    NotQuiet,
}

/// Turns both sides until neither has anything queued or being READ, nor an offer
/// out, nor a completion coming for a while (or it closed), up to a bound; true when
/// that was reached. (Unsignalled SENDs that completed silently still count as
/// outstanding until a signalled one follows, so the send queue's count is no sign.)
pub(super) fn settle(p: &mut Pair) -> bool {
    let idle = |end: &End| {
        end.closed.is_some()
            || end.core.closing.is_some()
            || (end.core.pending.is_empty()
                && end.core.rendezvous_in.is_empty()
                && end.core.rendezvous_out.is_empty())
    };
    let deadline = Instant::now() + Duration::from_millis(300);
    let mut still = 0;
    loop {
        if p.turn() {
            still = 0;
        } else {
            still += 1;
            std::thread::sleep(Duration::from_micros(20));
        }
        if still >= 30 && idle(&p.a) && idle(&p.b) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
    }
}

/// `len` bytes from `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut e = crate::fuzz::SplitMix(seed);
    (0..len).map(|_| e.next_u64() as u8).collect()
}

/// A frame header of `kind`, as a peer could send it.
pub(crate) fn frame(kind: FrameKind, credits: u32, len: u32, tag: u32) -> Vec<u8> {
    let mut out = vec![0u8; HEADER_LEN];
    Header {
        kind,
        credits,
        len,
        tag,
    }
    .encode(&mut out);
    out
}

/// The body length a frame's header claims, within a receive buffer.
fn frame_len(frame: &[u8]) -> usize {
    (u32::from_le_bytes(frame[8..12].try_into().expect("a header")) as usize)
        .min(RECV_SIZE - HEADER_LEN)
}

/// Anything a hostile peer can put in one SEND: a header of any kind byte, credits and
/// lengths that may lie, and a body of any length up to the receive buffer.
fn hostile_frame(e: &mut impl Entropy) -> Vec<u8> {
    let mut out = frame(
        FrameKind::Data,
        lying(e),
        lying(e),
        HOSTILE_TAGS + e.below(1 << 20) as u32,
    );
    out[1] = e.below(9) as u8;
    if e.one_in(16) {
        out[0] ^= 1;
    }
    let body = e.below((RECV_SIZE - HEADER_LEN + 1) as u64) as usize;
    out.extend(pattern(e.next_u64(), body));
    out
}

/// Small values, or the edges where counts overflow.
fn lying(e: &mut impl Entropy) -> u32 {
    match e.below(4) {
        0 => u32::MAX - e.below(2) as u32,
        1 => 1 << e.below(32),
        _ => e.below(DEPTH as u64 + 2) as u32,
    }
}
