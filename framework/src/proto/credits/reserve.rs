//! Credits for receives shared by many connections (one shared receive queue).
//!
//! With a receive queue per connection, every connection keeps `depth` buffers posted
//! whether it uses them or not: 16 × 4 KiB = 64 KiB per idle client. With a shared
//! receive queue the buffers are pooled, and the credit rule that no sender ever meets
//! an empty queue becomes a sum: the credits all peers of the queue hold (or are owed)
//! never exceed the buffers posted to it. The queue's buffers are split in two:
//!
//! - **A share per connection** (`Advert::initial`, at least [`MIN_DEPTH`]): always
//!   given back as the peer uses it, so every connection can make progress whatever
//!   the others do. The queue holds `members × share` for them.
//! - **A reserve** ([`CreditReserve`]) lent on demand: when a peer is running out of
//!   credits (it holds half its window or less by our count, so it sends faster than
//!   our grants come back), the window borrows up to one more share at a time, until
//!   the peer holds `Advert::max`. Borrowed credits go back to the reserve as the peer
//!   uses them, unless it is still running low.
//!
//! Worst case: every member drains its share while the reserve is lent out: each
//! connection still has its share (4 frames in flight), so it runs at a lower rate but
//! never stalls and never meets an empty queue. A connection that borrowed and then
//! went quiet keeps what it was lent until its peer uses it (credits cannot be taken
//! back); the reserve bounds how much that can be in all.
//!
//! **A cap per peer** ([`PeerLoan`]): without one, a single client host that opens many
//! connections on one queue and floods them all borrows the whole reserve, and every
//! other host's connections run on their shares alone. The connections of one peer
//! address on a queue share one loan account, and the reserve lends to it only up to its
//! cap (by default half the reserve, so a second busy host always finds room). The cap
//! is on what the peer holds now, not on its rate: credits it used come back as usual.
//!
//! This is plain arithmetic on counters (the shared queue itself lives in the runtime);
//! the window calls [`CreditWindow::settle`] after each frame that used a shared receive,
//! whose buffer was reposted at once.
//!
//! [`MIN_DEPTH`]: super::MIN_DEPTH
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::sync::atomic::{AtomicU32, Ordering};

use super::CreditWindow;

/// Credits of a shared receive queue not assigned to any connection's share, lent to
/// busy connections. Shared by the connections of one queue (on any poller thread).
#[derive(Debug)]
pub struct CreditReserve {
    free: AtomicU32,
    /// The fewest credits that were ever free: how close the reserve came to running
    /// out, for stats (a reserve that hits zero often is too small, or lent to few).
    lowest: AtomicU32,
}

impl CreditReserve {
    /// A reserve of `credits` (receives posted beyond the members' shares).
    pub fn new(credits: u32) -> Self {
        CreditReserve {
            free: AtomicU32::new(credits),
            lowest: AtomicU32::new(credits),
        }
    }

    /// Takes up to `want` credits; returns how many it got. Private: every loan goes
    /// through a peer's account (`lend`), so the per-peer cap cannot be bypassed.
    fn take(&self, want: u32) -> u32 {
        let mut got = 0;
        let mut left = 0;
        let _ = self
            .free
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |free| {
                got = free.min(want);
                left = free.saturating_sub(got); // got <= free
                Some(left)
            });
        if got > 0 {
            self.lowest.fetch_min(left, Ordering::AcqRel);
        }
        got
    }

    /// Gives `n` credits back.
    fn give(&self, n: u32) {
        if n > 0 {
            self.free.fetch_add(n, Ordering::AcqRel);
        }
    }

    /// Lends up to `want` credits to `peer`, within its cap; returns how many.
    pub fn lend(&self, peer: &PeerLoan, want: u32) -> u32 {
        let allowed = peer.claim(want);
        let got = self.take(allowed);
        peer.repay(allowed.saturating_sub(got)); // got <= allowed
        got
    }

    /// Takes back `n` credits `peer` was lent.
    pub fn repay(&self, peer: &PeerLoan, n: u32) {
        peer.repay(n);
        self.give(n);
    }

    /// Credits free now.
    pub fn available(&self) -> u32 {
        self.free.load(Ordering::Acquire)
    }

    /// The fewest credits that were free at any time since the reserve was made.
    pub fn lowest(&self) -> u32 {
        self.lowest.load(Ordering::Acquire)
    }
}

/// What the connections of one peer (one client address) on one shared queue have
/// borrowed from its reserve, and the most they may (see the module comment).
#[derive(Debug)]
pub struct PeerLoan {
    lent: AtomicU32,
    cap: u32,
    /// The most this peer ever held at once, for stats and tests.
    most: AtomicU32,
}

impl PeerLoan {
    /// An account that may hold at most `cap` credits; `None` for no cap.
    pub fn new(cap: Option<u32>) -> Self {
        PeerLoan {
            lent: AtomicU32::new(0),
            cap: cap.unwrap_or(u32::MAX),
            most: AtomicU32::new(0),
        }
    }

    /// Reserves up to `want` credits of the cap; returns how many.
    fn claim(&self, want: u32) -> u32 {
        let mut got = 0;
        let mut now = 0;
        let _ = self
            .lent
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |lent| {
                got = self.cap.saturating_sub(lent).min(want);
                now = lent.saturating_add(got); // got <= cap - lent
                Some(now)
            });
        self.most.fetch_max(now, Ordering::AcqRel);
        got
    }

    fn repay(&self, n: u32) {
        if n > 0 {
            self.lent.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Credits this peer holds borrowed now.
    pub fn lent(&self) -> u32 {
        self.lent.load(Ordering::Acquire)
    }

    /// The most this peer held borrowed at once.
    pub fn most(&self) -> u32 {
        self.most.load(Ordering::Acquire)
    }
}

impl CreditWindow {
    /// Returns credits for the frames just received on shared receives (already
    /// reposted): the connection's share always, borrowed ones only while the peer runs
    /// low; borrows more from `reserve` when it does (see the module comment).
    pub fn settle(&mut self, reserve: &CreditReserve, peer: &PeerLoan) {
        // Every count here is of our own posted receives (at most `max`, a u16 depth):
        // saturating operations say so, and cannot wrap whatever the build's profile.
        // The peer sends faster than our grants come back: it has used half its window
        // (share plus what it borrowed). A steady stream settles where the window just
        // covers a round trip: borrowed credits go back one per frame while the peer
        // holds more than half, and come again when it drops to half.
        let running_low = self.peer_credits <= self.share.saturating_add(self.borrowed) / 2;
        let committed = self.peer_credits.saturating_add(self.owed);
        // Lent credits the peer used and that are not owed again go back.
        let extra = committed.saturating_sub(self.share);
        if self.borrowed > extra {
            if running_low {
                // Keep them: re-grant what it used of them.
                self.owed = self
                    .owed
                    .saturating_add(self.borrowed.saturating_sub(extra));
            } else {
                reserve.repay(peer, self.borrowed.saturating_sub(extra));
                self.borrowed = extra;
            }
        }
        // The share is always given back.
        let committed = self.peer_credits.saturating_add(self.owed);
        if committed < self.share {
            self.owed = self
                .owed
                .saturating_add(self.share.saturating_sub(committed));
        }
        if running_low {
            let committed = self.peer_credits.saturating_add(self.owed);
            let room = self.max.saturating_sub(committed).min(self.share);
            let got = reserve.lend(peer, room);
            self.owed = self.owed.saturating_add(got);
            self.borrowed = self.borrowed.saturating_add(got);
        }
    }

    /// Gives every borrowed credit back (the connection is gone; its peer's credits
    /// died with the QP).
    pub fn release_borrowed(&mut self, reserve: &CreditReserve, peer: &PeerLoan) {
        reserve.repay(peer, std::mem::take(&mut self.borrowed));
    }

    /// Credits lent to this connection by the reserve.
    pub fn borrowed(&self) -> u32 {
        self.borrowed
    }
}

// The tests' own numbers, not a peer's.
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::super::Advert;
    use super::*;

    const SHARE: u32 = 4;
    const MAX: u32 = 16;

    /// `n` connections on one shared queue of `n × SHARE + reserve` receives, each
    /// peer flooding or idle; checks the sum rule after every step.
    struct Shared {
        windows: Vec<CreditWindow>,
        /// Credits each peer holds (its send credits towards us).
        peer_send: Vec<u32>,
        reserve: CreditReserve,
        /// The loan account of each connection's peer (index into `loans`).
        peer_of: Vec<usize>,
        loans: Vec<PeerLoan>,
        posted: u32,
    }

    impl Shared {
        /// `n` connections, each from a peer of its own, no cap.
        fn new(n: usize, reserve: u32) -> Shared {
            Self::with_peers(n, reserve, (0..n).collect(), None)
        }

        /// `n` connections whose peers are `peer_of`, each peer capped at `cap`.
        fn with_peers(n: usize, reserve: u32, peer_of: Vec<usize>, cap: Option<u32>) -> Shared {
            let peers = peer_of.iter().max().map_or(0, |m| m + 1);
            let ours = Advert {
                initial: SHARE,
                max: MAX,
            };
            Shared {
                windows: (0..n)
                    .map(|_| CreditWindow::new(ours, Advert::fixed(64)))
                    .collect(),
                peer_send: vec![SHARE; n],
                reserve: CreditReserve::new(reserve),
                peer_of,
                loans: (0..peers).map(|_| PeerLoan::new(cap)).collect(),
                posted: n as u32 * SHARE + reserve,
            }
        }

        /// Peer `i` sends a frame if it holds a credit; we settle and send the owed
        /// grant right away (every few frames, as a credit frame or an answer would).
        fn frame(&mut self, i: usize, grant_now: bool) -> bool {
            if self.peer_send[i] == 0 {
                return false;
            }
            self.peer_send[i] -= 1;
            let w = &mut self.windows[i];
            // The peer returns every credit we used (it reposts at once).
            let back = 64 - w.send_credits();
            w.handle_received(back).expect("within credits");
            w.settle(&self.reserve, &self.loans[self.peer_of[i]]);
            if grant_now && w.owed() > 0 {
                let g = w.take_for_send();
                self.peer_send[i] += g;
            }
            self.check();
            true
        }

        /// We send a frame to peer `i` carrying everything we owe it.
        fn grant(&mut self, i: usize) {
            let w = &mut self.windows[i];
            let g = w.take_for_send();
            self.peer_send[i] += g;
            self.check();
        }

        /// The sum rule: what peers hold plus what we owe never exceeds what is posted.
        fn check(&self) {
            let committed: u32 = self.windows.iter().map(|w| w.peer_credits + w.owed).sum();
            assert!(
                committed + self.reserve.available() <= self.posted,
                "committed {committed} + free {} > posted {}",
                self.reserve.available(),
                self.posted
            );
            for (w, held) in self.windows.iter().zip(&self.peer_send) {
                assert!(w.peer_credits + w.owed <= MAX);
                assert!(*held <= w.peer_credits, "peer holds more than we granted");
            }
            // Each peer's account is what its connections borrowed, within its cap.
            for (p, loan) in self.loans.iter().enumerate() {
                let borrowed: u32 = (0..self.windows.len())
                    .filter(|i| self.peer_of[*i] == p)
                    .map(|i| self.windows[i].borrowed())
                    .sum();
                assert_eq!(loan.lent(), borrowed, "peer {p}'s account");
                assert!(loan.lent() <= loan.cap);
            }
        }
    }

    #[test]
    fn a_flooding_peer_borrows_up_to_its_max_and_the_sum_holds() {
        let mut s = Shared::new(4, 16);
        let mut most = 0;
        for _ in 0..50 {
            // The peer sends everything it may before our grant comes back.
            let mut burst = 0;
            while s.frame(0, false) {
                burst += 1;
            }
            most = most.max(burst);
            s.grant(0);
        }
        assert!(s.windows[0].borrowed() > 0, "a flood borrows");
        assert_eq!(most, MAX, "the window grew to its max");
        assert!(s.windows[0].peer_credits + s.windows[0].owed <= MAX);
        // The others still have their share.
        for i in 1..4 {
            assert_eq!(s.peer_send[i], SHARE);
        }
    }

    #[test]
    fn every_connection_keeps_its_share_when_the_reserve_is_lent_out() {
        let mut s = Shared::new(8, 8);
        // Two flooders take the whole reserve.
        for _ in 0..20 {
            for i in 0..2 {
                while s.frame(i, false) {}
                s.grant(i);
            }
        }
        assert_eq!(s.reserve.available(), 0);
        // Everyone else can still send a share's worth, again and again.
        for round in 0..10 {
            for i in 2..8 {
                for _ in 0..SHARE {
                    assert!(s.frame(i, false), "conn {i} starved in round {round}");
                }
                s.grant(i);
            }
        }
    }

    #[test]
    fn borrowed_credits_return_when_the_peer_slows_down() {
        let mut s = Shared::new(2, 12);
        for _ in 0..20 {
            while s.frame(0, false) {}
            s.grant(0);
        }
        let lent = s.windows[0].borrowed();
        assert!(lent > 0);
        // Now one frame at a time, each answered at once: the peer never runs low.
        for _ in 0..50 {
            s.frame(0, true);
        }
        assert_eq!(s.windows[0].borrowed(), 0, "all given back");
        assert_eq!(s.reserve.available(), 12);
    }

    #[test]
    fn releasing_gives_every_borrowed_credit_back() {
        let mut s = Shared::new(1, 8);
        for _ in 0..20 {
            while s.frame(0, false) {}
            s.grant(0);
        }
        let mut w = s.windows.pop().expect("one");
        w.release_borrowed(&s.reserve, &s.loans[0]);
        assert_eq!(s.reserve.available(), 8);
        assert_eq!(s.loans[0].lent(), 0);
        assert!(s.reserve.lowest() < 8, "the low-water mark saw the loan");
    }

    /// Issue 26 (5): one host with many connections on a queue, all flooding, took the
    /// whole reserve, and a second host's connections ran on their shares alone. With a
    /// cap per peer the first host holds at most its cap, and the second still borrows.
    #[test]
    fn one_peer_with_many_connections_borrows_at_most_its_cap() {
        // Six connections of peer 0, two of peer 1; a reserve of 32, half per peer.
        let peer_of = vec![0, 0, 0, 0, 0, 0, 1, 1];
        let mut s = Shared::with_peers(8, 32, peer_of, Some(16));
        for _ in 0..20 {
            for i in 0..6 {
                while s.frame(i, false) {}
                s.grant(i);
            }
        }
        assert_eq!(s.loans[0].most(), 16, "the flooding host reached its cap");
        assert_eq!(s.reserve.available(), 16, "and no more");
        assert_eq!(s.reserve.lowest(), 16);
        // The second host floods as well: it borrows from what is left.
        for _ in 0..20 {
            for i in 6..8 {
                while s.frame(i, false) {}
                s.grant(i);
            }
        }
        assert!(s.loans[1].most() > 0, "the second host borrowed");
        assert!(s.loans[1].most() <= 16);

        // Without a cap the same flood takes everything.
        let peer_of = vec![0, 0, 0, 0, 0, 0, 1, 1];
        let mut s = Shared::with_peers(8, 32, peer_of, None);
        for _ in 0..20 {
            for i in 0..6 {
                while s.frame(i, false) {}
                s.grant(i);
            }
        }
        assert_eq!(
            s.reserve.lowest(),
            0,
            "an uncapped host empties the reserve"
        );
    }
}
