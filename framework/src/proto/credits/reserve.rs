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
//! This is plain arithmetic on counters (the shared queue itself lives in the runtime);
//! the window calls [`CreditWindow::settle`] after each frame that used a shared receive,
//! whose buffer was reposted at once.
//!
//! [`MIN_DEPTH`]: super::MIN_DEPTH

use std::sync::atomic::{AtomicU32, Ordering};

use super::CreditWindow;

/// Credits of a shared receive queue not assigned to any connection's share, lent to
/// busy connections. Shared by the connections of one queue (on any poller thread).
#[derive(Debug)]
pub struct CreditReserve {
    free: AtomicU32,
}

impl CreditReserve {
    /// A reserve of `credits` (receives posted beyond the members' shares).
    pub fn new(credits: u32) -> Self {
        CreditReserve {
            free: AtomicU32::new(credits),
        }
    }

    /// Takes up to `want` credits; returns how many it got.
    pub fn take(&self, want: u32) -> u32 {
        let mut got = 0;
        let _ = self
            .free
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |free| {
                got = free.min(want);
                Some(free - got)
            });
        got
    }

    /// Gives `n` credits back.
    pub fn give(&self, n: u32) {
        if n > 0 {
            self.free.fetch_add(n, Ordering::AcqRel);
        }
    }

    /// Credits free now.
    pub fn available(&self) -> u32 {
        self.free.load(Ordering::Acquire)
    }
}

impl CreditWindow {
    /// Returns credits for the frames just received on shared receives (already
    /// reposted): the connection's share always, borrowed ones only while the peer runs
    /// low; borrows more from `reserve` when it does (see the module comment).
    pub fn settle(&mut self, reserve: &CreditReserve) {
        // The peer sends faster than our grants come back: it has used half its window
        // (share plus what it borrowed). A steady stream settles where the window just
        // covers a round trip: borrowed credits go back one per frame while the peer
        // holds more than half, and come again when it drops to half.
        let running_low = self.peer_credits <= (self.share + self.borrowed) / 2;
        let committed = self.peer_credits + self.owed;
        // Lent credits the peer used and that are not owed again go back.
        let extra = committed.saturating_sub(self.share);
        if self.borrowed > extra {
            if running_low {
                // Keep them: re-grant what it used of them.
                self.owed += self.borrowed - extra;
            } else {
                reserve.give(self.borrowed - extra);
                self.borrowed = extra;
            }
        }
        // The share is always given back.
        let committed = self.peer_credits + self.owed;
        if committed < self.share {
            self.owed += self.share - committed;
        }
        if running_low {
            let committed = self.peer_credits + self.owed;
            let room = self.max.saturating_sub(committed).min(self.share);
            let got = reserve.take(room);
            self.owed += got;
            self.borrowed += got;
        }
    }

    /// Gives every borrowed credit back (the connection is gone; its peer's credits
    /// died with the QP).
    pub fn release_borrowed(&mut self, reserve: &CreditReserve) {
        reserve.give(std::mem::take(&mut self.borrowed));
    }

    /// Credits lent to this connection by the reserve.
    pub fn borrowed(&self) -> u32 {
        self.borrowed
    }
}

#[cfg(test)]
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
        posted: u32,
    }

    impl Shared {
        fn new(n: usize, reserve: u32) -> Shared {
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
            w.settle(&self.reserve);
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
        w.release_borrowed(&s.reserve);
        assert_eq!(s.reserve.available(), 8);
    }
}
