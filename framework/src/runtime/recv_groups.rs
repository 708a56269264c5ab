//! The shared receive queues of framed connections, and who belongs to which.
//!
//! A queue serves up to `members` connections and holds `members × share + reserve`
//! receives (the credit rules are in `proto/credits/reserve.rs`). A new connection joins
//! the fullest queue that has room, so connections pack into few queues and a queue
//! empties as load falls; once more than `keep_empty` queues are empty, the last member
//! to leave one takes it down and its buffers go back to the pool, which deregisters
//! idle arenas above its floor (`PoolConfig::keep_bytes`).
//!
//! Every member of a queue uses one CQ, reserved by the queue for `depth` receive
//! completions plus each member's send queue. Receive completions of an SRQ can never
//! outnumber its posted receives, so the CQ cannot overflow even when a peer that breaks
//! the credit rules consumes receives beyond its credits (a CQ overflow would put every
//! QP on it in the error state); a reservation per connection for its credits could.
//!
//! Ownership: a connection holds a [`SharedRecv`] clone (the queue and its buffers) and a
//! [`Membership`]; its QP drops before both (field order in `Core`), so a queue outlives
//! every QP created on it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use super::config::SharedRecvConfig;
use super::poller::{CqReservation, Pollers};
use super::srq::SharedRecv;
use crate::memory::MrPool;
use crate::proto::credits::{Advert, CreditReserve, PeerLoan};
use crate::transport::{Domain, Transport, Verbs};

/// Every shared queue of a node's framed connections.
pub(crate) struct RecvGroups<T: Transport = Verbs> {
    inner: Arc<Mutex<Queues<T>>>,
    pd: T::Domain,
    pool: MrPool<T>,
    cfg: SharedRecvConfig,
    size: usize,
}

struct Queues<T: Transport> {
    queues: Vec<Queue<T>>,
    next_id: u64,
}

impl<T: Transport> Default for Queues<T> {
    fn default() -> Self {
        Queues {
            queues: Vec::new(),
            next_id: 0,
        }
    }
}

struct Queue<T: Transport> {
    id: u64,
    /// The members' CQ (after `recv` would do as well: nothing here uses the other).
    cq: CqReservation<T>,
    recv: SharedRecv<T>,
    reserve: Arc<CreditReserve>,
    members: u32,
    /// The loan account of each peer address with members here, and how many.
    peers: HashMap<Option<IpAddr>, (Arc<PeerLoan>, u32)>,
}

/// What joining gives: the queue, the place in it, and the CQ to create the QP with.
pub(crate) type Joined<T> = (SharedRecv<T>, Membership<T>, CqReservation<T>);

/// A connection's place in a shared queue: its share stays posted while it lives.
pub(crate) struct Membership<T: Transport = Verbs> {
    id: u64,
    reserve: Arc<CreditReserve>,
    peer: Option<IpAddr>,
    loan: Arc<PeerLoan>,
    queues: Arc<Mutex<Queues<T>>>,
    keep_empty: usize,
}

impl<T: Transport> RecvGroups<T> {
    pub fn new(pd: &T::Domain, pool: &MrPool<T>, cfg: SharedRecvConfig, size: usize) -> Self {
        RecvGroups {
            inner: Arc::default(),
            pd: pd.clone(),
            pool: pool.clone(),
            cfg,
            size,
        }
    }

    /// What a member connection advertises to its peer.
    pub fn advert(&self) -> Advert {
        Advert {
            initial: self.cfg.share.into(),
            max: self.cfg.max_credits.max(self.cfg.share).into(),
        }
    }

    /// Joins the fullest queue with room, creating one (reserving its CQ, posting its
    /// receives) when none has. Returns the queue, the membership and the CQ to create
    /// the QP with (its entries are the queue's, for `send_depth` sends per member).
    /// `peer` is the client's address: its connections on a queue borrow from one
    /// account, capped by `SharedRecvConfig::reserve_per_peer`.
    pub fn join(
        &self,
        pollers: &Pollers<T>,
        send_depth: u32,
        peer: Option<IpAddr>,
    ) -> Result<Joined<T>, String> {
        let mut q = self.inner.lock().expect("recv groups lock");
        let room = q
            .queues
            .iter_mut()
            .filter(|g| g.members < self.cfg.members)
            .max_by_key(|g| g.members);
        let queue = match room {
            Some(g) => g,
            None => {
                let depth = self.cfg.depth();
                let cq = pollers
                    .reserve(depth + self.cfg.members * send_depth)
                    .map_err(|e| e.to_string())?;
                let srq = self.pd.create_srq(depth, 1).map_err(|e| {
                    format!("creating a shared receive queue of {depth} receives: {e}")
                })?;
                let recv = SharedRecv::new(&self.pool, srq, depth, self.size)?;
                let id = q.next_id;
                q.next_id += 1;
                tracing::debug!(
                    queue = id,
                    depth,
                    bytes = depth as usize * self.size,
                    "shared receive queue created"
                );
                q.queues.push(Queue {
                    id,
                    cq,
                    recv,
                    reserve: Arc::new(CreditReserve::new(self.cfg.reserve)),
                    members: 0,
                    peers: HashMap::new(),
                });
                q.queues.last_mut().expect("just pushed")
            }
        };
        queue.members += 1;
        let cap = self.cfg.reserve_per_peer;
        let (loan, n) = queue
            .peers
            .entry(peer)
            .or_insert_with(|| (Arc::new(PeerLoan::new(cap)), 0));
        *n += 1;
        let member = Membership {
            id: queue.id,
            reserve: queue.reserve.clone(),
            peer,
            loan: loan.clone(),
            queues: self.inner.clone(),
            keep_empty: self.cfg.keep_empty,
        };
        Ok((queue.recv.clone(), member, queue.cq.covered()))
    }

    /// Receive buffers all queues hold.
    pub fn buffers(&self) -> usize {
        let q = self.inner.lock().expect("recv groups lock");
        q.queues.len() * self.cfg.depth() as usize
    }

    /// Receives posted in each queue now, for stats: its depth unless buffers are
    /// consumed and not yet reposted (a lasting shortfall is a leak).
    pub fn posted(&self) -> Vec<usize> {
        let q = self.inner.lock().expect("recv groups lock");
        q.queues.iter().map(|g| g.recv.posted()).collect()
    }

    /// Queues and their members, for stats and tests.
    pub fn occupancy(&self) -> Vec<u32> {
        let q = self.inner.lock().expect("recv groups lock");
        q.queues.iter().map(|g| g.members).collect()
    }

    /// Each queue's reserve, for stats.
    pub fn reserves(&self) -> Vec<ReserveStats> {
        let q = self.inner.lock().expect("recv groups lock");
        q.queues
            .iter()
            .map(|g| ReserveStats {
                free: g.reserve.available(),
                lowest: g.reserve.lowest(),
                most_to_one_peer: g.peers.values().map(|(l, _)| l.most()).max().unwrap_or(0),
            })
            .collect()
    }
}

/// One shared queue's credit reserve, as [`ServerStats`](super::ServerStats) shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReserveStats {
    /// Credits free to lend now.
    pub free: u32,
    /// The fewest that were ever free since the queue was made.
    pub lowest: u32,
    /// The most any one peer address with members on the queue now held borrowed at
    /// once (at most `SharedRecvConfig::reserve_per_peer`).
    pub most_to_one_peer: u32,
}

impl<T: Transport> Membership<T> {
    /// The reserve this connection borrows from, and its peer's account with it.
    pub fn reserve(&self) -> (&CreditReserve, &PeerLoan) {
        (&self.reserve, &self.loan)
    }
}

impl<T: Transport> Drop for Membership<T> {
    fn drop(&mut self) {
        let mut q = self.queues.lock().expect("recv groups lock");
        let Some(pos) = q.queues.iter().position(|g| g.id == self.id) else {
            return;
        };
        let queue = &mut q.queues[pos];
        queue.members -= 1;
        if let Some((_, n)) = queue.peers.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                queue.peers.remove(&self.peer);
            }
        }
        let empty = q.queues.iter().filter(|g| g.members == 0).count();
        if q.queues[pos].members == 0 && empty > self.keep_empty {
            // The queue itself goes when its last clone does: the leaving connection's,
            // after its QP.
            let gone = q.queues.swap_remove(pos);
            tracing::debug!(queue = gone.id, "empty shared receive queue released");
        }
    }
}
