//! Credit-based flow control: a sender never SENDs into a receive queue that has no
//! buffer posted, so RNR NAKs (and their retry stalls) never happen between rdmactor
//! peers.
//!
//! Each side starts with as many send credits as the peer pre-posted receives. Every
//! frame (data or credit-only) uses one credit, because it consumes one receive at the
//! peer. When a side reposts a receive buffer it owes the peer one credit; owed credits
//! ride in the header of the next outgoing frame.
//!
//! Two rules keep this deadlock-free and quiet:
//! - **The last credit is reserved for frames that grant credits.** A side that has one
//!   credit left may only send if the frame returns credits, so whenever a side runs
//!   out, its last frame gave the peer something to answer with.
//! - **Credit-only frames are sent sparingly:** only when owed credits reach half the
//!   receive depth (at least two), or when the peer is (by our count) out of credits. A
//!   credit-only frame makes its receiver owe one credit, which is below the first
//!   trigger, so credit frames do not ping-pong (the harness below checks both rules).
//!
//! The window also polices the peer, since the receiving side cannot trust it: a frame
//! that arrives while the peer holds no credit by our count, or a grant that would give
//! us more credits than the peer has receives, is a protocol violation
//! ([`CreditError`]). Without the first check a peer that ignores credits keeps the
//! receive queue busy (every repost is used at once) while our answers, held back for
//! lack of credits, pile up in memory; without the second, a hostile grant overflows
//! the counter.
//!
//! The window performs no I/O; the connection actor drives it (`handle_*` on input,
//! `poll_*`/`take_*` for output).
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

/// The smallest receive depth the window works with: one credit is reserved, and the
/// credit-only trigger needs two owed credits to stay quiet.
pub const MIN_DEPTH: u32 = 4;

mod reserve;

pub use reserve::{CreditReserve, PeerLoan};

/// How a peer broke the credit rules; the connection closes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CreditError {
    /// A frame (or WRITE_WITH_IMM) consumed a receive the peer held no credit for.
    #[error("peer sent a frame without a credit (it had used every credit we granted)")]
    FrameWithoutCredit,
    /// The peer returned more credits than it has receives to back them.
    #[error("peer returned {returned} credits while we held {held}; it has only {depth} receives")]
    ExcessCredits {
        /// Credits we held before the grant.
        held: u32,
        /// Credits the grant returned.
        returned: u32,
        /// The peer's receive depth (the most credits we can ever hold).
        depth: u32,
    },
}

/// What one side tells the other about its receives at connect time: the peer may hold
/// `initial` credits at once and never more than `max` (more are granted only while the
/// connection is busy, from a shared reserve; see `reserve.rs`). A connection with
/// receives of its own advertises its depth as both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advert {
    /// Credits the peer starts with (receives guaranteed to this connection).
    pub initial: u32,
    /// Most credits the peer can ever hold.
    pub max: u32,
}

impl Advert {
    /// `depth` receives of the connection's own: `initial` and `max` alike.
    pub fn fixed(depth: u32) -> Advert {
        Advert {
            initial: depth,
            max: depth,
        }
    }

    /// Whether a window can be built on it (see [`MIN_DEPTH`]).
    pub fn is_valid(&self) -> bool {
        self.initial >= MIN_DEPTH && self.max >= self.initial
    }
}

/// Flow-control state of one connection.
#[derive(Debug, Clone)]
pub struct CreditWindow {
    /// Frames we may still send; never above `peer_depth`.
    send_credits: u32,
    /// The most credits the peer may give us; `None` until the accept tells the active
    /// side.
    peer_depth: Option<u32>,
    /// Receives we reposted but have not told the peer about.
    owed: u32,
    /// Credits the peer holds by our count: granted to it minus frames received.
    peer_credits: u32,
    /// Credits always returned to the peer (our guaranteed receives); the credit-only
    /// trigger is half of it.
    share: u32,
    /// Most credits the peer may hold (`share` plus what the reserve can lend).
    max: u32,
    /// Credits beyond `share` the peer holds or we owe, lent by a shared reserve.
    borrowed: u32,
}

impl CreditWindow {
    /// A window for a connection where we advertised `ours` and the peer `peer`.
    ///
    /// # Panics
    /// When either advert is not [`Advert::is_valid`]; connection setup refuses such
    /// peers.
    pub fn new(ours: Advert, peer: Advert) -> Self {
        assert!(peer.is_valid(), "peer's receive depth below {MIN_DEPTH}");
        let mut w = Self::awaiting_peer(ours);
        w.send_credits = peer.initial;
        w.peer_depth = Some(peer.max);
        w
    }

    /// A window for the active side, which learns the peer's advert only when the accept
    /// arrives: no send credits until [`CreditWindow::handle_peer_depth`].
    pub fn awaiting_peer(ours: Advert) -> Self {
        assert!(ours.is_valid(), "receive depth below {MIN_DEPTH}");
        CreditWindow {
            send_credits: 0,
            peer_depth: None,
            owed: 0,
            peer_credits: ours.initial,
            share: ours.initial,
            max: ours.max,
            borrowed: 0,
        }
    }

    /// The peer's advert became known (accept private data). Credits granted before it
    /// (none, from a peer that keeps the rules: it owes nothing before we sent) must
    /// still fit within it.
    pub fn handle_peer_depth(&mut self, peer: Advert) -> Result<(), CreditError> {
        let excess = CreditError::ExcessCredits {
            held: self.send_credits,
            returned: peer.initial,
            depth: peer.max,
        };
        if !peer.is_valid() {
            return Err(excess);
        }
        self.peer_depth = Some(peer.max);
        match self.send_credits.checked_add(peer.initial) {
            Some(total) if total <= peer.max => {
                self.send_credits = total;
                Ok(())
            }
            _ => Err(excess),
        }
    }

    /// Takes one credit for an RDMA WRITE_WITH_IMM: it consumes a peer receive but has no
    /// header to carry a grant, so owed credits stay owed.
    pub fn take_for_imm(&mut self) {
        debug_assert!(self.send_credits > 0, "sending without a credit");
        self.send_credits = self.send_credits.saturating_sub(1);
    }

    /// Credits we hold.
    pub fn send_credits(&self) -> u32 {
        self.send_credits
    }

    /// Credits we owe the peer.
    pub fn owed(&self) -> u32 {
        self.owed
    }

    /// True when a data frame may go now.
    pub fn can_send_data(&self) -> bool {
        self.send_credits >= 2 || (self.send_credits == 1 && self.owed > 0)
    }

    /// Takes one credit for an outgoing frame and returns the grant to put in its header
    /// (everything owed). Call only after `can_send_data` or `poll_credit_frame`.
    pub fn take_for_send(&mut self) -> u32 {
        debug_assert!(self.send_credits > 0, "sending without a credit");
        self.send_credits = self.send_credits.saturating_sub(1);
        let grant = std::mem::take(&mut self.owed);
        // Both count our own receives, at most our depth.
        self.peer_credits = self.peer_credits.saturating_add(grant);
        grant
    }

    /// A frame from the peer consumed one of our receives and granted us `credits`.
    ///
    /// # Errors
    /// [`CreditError::FrameWithoutCredit`] when the peer held no credit for it, and
    /// [`CreditError::ExcessCredits`] when the grant would leave us more credits than
    /// the peer has receives (before its depth is known: more than any depth the
    /// connect private data can carry). The window is unchanged then.
    pub fn handle_received(&mut self, credits: u32) -> Result<(), CreditError> {
        let Some(peer_credits) = self.peer_credits.checked_sub(1) else {
            return Err(CreditError::FrameWithoutCredit);
        };
        let depth = self.peer_depth.unwrap_or(u16::MAX as u32);
        match self.send_credits.checked_add(credits) {
            Some(total) if total <= depth => {
                self.send_credits = total;
                self.peer_credits = peer_credits;
                Ok(())
            }
            _ => Err(CreditError::ExcessCredits {
                held: self.send_credits,
                returned: credits,
                depth,
            }),
        }
    }

    /// We reposted `n` receive buffers.
    pub fn handle_reposted(&mut self, n: u32) {
        // Our own receives, at most our depth.
        self.owed = self.owed.saturating_add(n);
    }

    /// True when a credit-only frame should go now (and can: we hold a credit).
    #[must_use]
    pub fn poll_credit_frame(&self) -> bool {
        let worth_it =
            self.owed >= (self.share / 2).max(1) || (self.owed > 0 && self.peer_credits <= 1);
        worth_it && self.send_credits >= 1
    }
}

// The tests' own numbers, not a peer's.
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Two windows joined by queues: a deterministic harness with no RDMA.
    struct Link {
        side: [CreditWindow; 2],
        wire: [VecDeque<(bool, u32)>; 2], // frames in flight towards side i: (is_data, grant)
        posted: [u32; 2],                 // receives posted at side i
        delivered: [u32; 2],              // data frames delivered to side i
    }

    impl Link {
        fn new(depth: u32) -> Link {
            Link {
                side: [
                    CreditWindow::new(Advert::fixed(depth), Advert::fixed(depth)),
                    CreditWindow::new(Advert::fixed(depth), Advert::fixed(depth)),
                ],
                wire: [VecDeque::new(), VecDeque::new()],
                posted: [depth, depth],
                delivered: [0, 0],
            }
        }

        fn send_data(&mut self, from: usize) -> bool {
            if !self.side[from].can_send_data() {
                return false;
            }
            let grant = self.side[from].take_for_send();
            self.wire[1 - from].push_back((true, grant));
            true
        }

        /// Delivers one frame to `to`; false when nothing was in flight.
        fn deliver(&mut self, to: usize, repost: bool) -> bool {
            let Some((is_data, grant)) = self.wire[to].pop_front() else {
                return false;
            };
            assert!(
                self.posted[to] > 0,
                "RNR: frame arrived with no receive posted"
            );
            self.posted[to] -= 1;
            self.side[to]
                .handle_received(grant)
                .expect("peers keeping the rules");
            if is_data {
                self.delivered[to] += 1;
            }
            if repost {
                self.posted[to] += 1;
                self.side[to].handle_reposted(1);
            }
            if self.side[to].poll_credit_frame() {
                let grant = self.side[to].take_for_send();
                self.wire[1 - to].push_back((false, grant));
            }
            true
        }

        fn quiesce(&mut self) -> u32 {
            let mut frames = 0;
            while self.deliver(0, true) || self.deliver(1, true) {
                frames += 1;
                assert!(frames < 10_000, "credit frames ping-pong");
            }
            frames
        }
    }

    #[test]
    fn one_way_flood_never_overruns_and_never_stalls() {
        let mut l = Link::new(8);
        let mut sent = 0;
        for _ in 0..100_000 {
            if sent == 10_000 {
                break;
            }
            if l.send_data(0) {
                sent += 1;
            } else {
                // Out of credits: the receiver must have something to say.
                assert!(
                    l.deliver(1, true) || l.deliver(0, true),
                    "sender stalled with nothing in flight"
                );
            }
        }
        l.quiesce();
        assert_eq!(l.delivered[1], sent);
        assert_eq!(sent, 10_000);
    }

    #[test]
    fn slow_receiver_holds_the_sender_back() {
        let mut l = Link::new(4);
        let mut sent = 0;
        while l.send_data(0) {
            sent += 1;
        }
        // 4 receives posted: 3 data frames, the last credit stays reserved.
        assert_eq!(sent, 3);
        // The receiver processes without reposting: still no overrun possible.
        while l.deliver(1, false) {}
        assert!(!l.send_data(0));
        // Reposting lets the flow resume.
        for _ in 0..2 {
            l.posted[1] += 1;
            l.side[1].handle_reposted(1);
        }
        assert!(l.side[1].poll_credit_frame());
        let g = l.side[1].take_for_send();
        l.wire[0].push_back((false, g));
        l.deliver(0, true);
        assert!(l.send_data(0));
    }

    #[test]
    fn ping_pong_traffic_needs_no_credit_frames() {
        let mut l = Link::new(8);
        for _ in 0..1000 {
            assert!(l.send_data(0));
            assert!(l.deliver(1, true));
            assert!(l.send_data(1));
            assert!(l.deliver(0, true));
        }
        assert_eq!(l.quiesce(), 0, "grants rode on the replies");
        assert_eq!(l.delivered, [1000, 1000]);
    }

    #[test]
    fn bidirectional_floods_do_not_deadlock() {
        for depth in [4, 5, 8, 16] {
            let mut l = Link::new(depth);
            let mut sent = [0u32; 2];
            for round in 0..5000 {
                for (side, count) in sent.iter_mut().enumerate() {
                    if l.send_data(side) {
                        *count += 1;
                    }
                }
                let to = round % 2;
                if !l.deliver(to, true) {
                    l.deliver(1 - to, true);
                }
                let progress = l.side[0].can_send_data()
                    || l.side[1].can_send_data()
                    || !l.wire[0].is_empty()
                    || !l.wire[1].is_empty();
                assert!(progress, "deadlock at depth {depth}, round {round}");
            }
            l.quiesce();
            assert_eq!(l.delivered[1], sent[0]);
            assert_eq!(l.delivered[0], sent[1]);
        }
    }

    #[test]
    fn a_frame_beyond_the_granted_credits_is_a_violation() {
        let mut w = CreditWindow::new(Advert::fixed(4), Advert::fixed(4));
        for _ in 0..4 {
            w.handle_received(0)
                .expect("within the 4 credits we granted");
        }
        assert_eq!(w.handle_received(0), Err(CreditError::FrameWithoutCredit));
        // Reposting is not granting: until a frame carries the grant, the peer has none.
        w.handle_reposted(4);
        assert_eq!(w.handle_received(0), Err(CreditError::FrameWithoutCredit));
        assert!(w.poll_credit_frame());
        assert_eq!(w.take_for_send(), 4);
        for _ in 0..4 {
            w.handle_received(0).expect("granted");
        }
        assert_eq!(w.handle_received(0), Err(CreditError::FrameWithoutCredit));
    }

    #[test]
    fn an_overflowing_grant_is_a_violation_not_a_panic() {
        let mut w = CreditWindow::new(Advert::fixed(8), Advert::fixed(8));
        w.take_for_send();
        w.handle_received(1).expect("the one we used comes back");
        let err = w.handle_received(u32::MAX).unwrap_err();
        assert_eq!(
            err,
            CreditError::ExcessCredits {
                held: 8,
                returned: u32::MAX,
                depth: 8
            }
        );
        assert_eq!(w.send_credits(), 8, "unchanged by the refused grant");
    }

    #[test]
    fn more_credits_than_the_peer_has_receives_is_a_violation() {
        let mut w = CreditWindow::new(Advert::fixed(8), Advert::fixed(8));
        w.take_for_send();
        w.take_for_send();
        // Two used: the peer can return at most two.
        assert!(matches!(
            w.handle_received(3),
            Err(CreditError::ExcessCredits { returned: 3, .. })
        ));
        w.handle_received(2).expect("exactly what we used");
    }

    #[test]
    fn the_active_side_checks_grants_against_the_depth_it_learns() {
        let mut w = CreditWindow::awaiting_peer(Advert::fixed(8));
        assert!(w.handle_received(u32::MAX).is_err());
        w.handle_peer_depth(Advert::fixed(16)).expect("first depth");
        assert_eq!(w.send_credits(), 16);
        assert!(w.handle_received(1).is_err(), "already holds all 16");
        let mut early = CreditWindow::awaiting_peer(Advert::fixed(8));
        early.handle_received(5).expect("below any depth");
        assert!(
            early.handle_peer_depth(Advert::fixed(4)).is_err(),
            "5 granted, 4 receives"
        );
    }

    #[test]
    #[should_panic(expected = "receive depth below 4")]
    fn tiny_depths_are_refused() {
        let _ = CreditWindow::new(Advert::fixed(3), Advert::fixed(8));
    }
}
