//! The connections one owner has started and not yet seen released: the CM actor's
//! (rdma_cm, passive and active) and each out-of-band listener's. Both start a
//! connection, tell one or all of them to close, count the released ones, and drain at
//! shutdown the same way, here.
//!
//! The drain: every connection is told to close ([`CloseReason::Shutdown`]); whoever
//! asked is answered once the last one has released its resources (its `ConnClosed`
//! reached the owner), so the owner's own resources (the node, the listener's socket) go
//! only after every connection's.

use std::collections::HashMap;
use std::net::SocketAddr;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::connection::{CmNotice, ConnectionActor, ConnectionParts};
use super::service::Session;
use super::CloseReason;
use crate::verbs::CmIdKey;

struct Open<T> {
    conn: Recipient<CmNotice>,
    qp_num: u32,
    /// What the owner keeps with the connection (the peer address it counts under, the
    /// out-of-band client it belongs to).
    tag: T,
}

/// The open connections of one owner, by key, with the owner's `T` for each.
pub(crate) struct ConnSet<T> {
    open: HashMap<CmIdKey, Open<T>>,
    /// The connection of each QP, for device events that name a QP (`device_watch.rs`).
    qps: HashMap<u32, CmIdKey>,
    /// Connections released since start.
    closed: u64,
    /// Answered once every connection has released (see [`ConnSet::drain`]).
    drained: Vec<oneshot::Sender<()>>,
}

impl<T> Default for ConnSet<T> {
    fn default() -> Self {
        ConnSet {
            open: HashMap::new(),
            qps: HashMap::new(),
            closed: 0,
            drained: Vec::new(),
        }
    }
}

impl<T> ConnSet<T> {
    /// Starts the connection's actor (see [`ConnectionActor::start`]) and keeps it, with
    /// `tag`, until it is released.
    pub fn start<S: Session>(
        &mut self,
        parts: ConnectionParts<S>,
        tag: T,
    ) -> Addr<ConnectionActor<S>> {
        let (key, qp_num) = (parts.key, parts.core.qp_num());
        let addr = ConnectionActor::start(parts);
        self.insert(key, qp_num, addr.clone().recipient(), tag);
        addr
    }

    /// Keeps a connection started elsewhere (an active connect's, started by the side
    /// that dialled it) until it is released.
    pub fn insert(&mut self, key: CmIdKey, qp_num: u32, conn: Recipient<CmNotice>, tag: T) {
        self.open.insert(key, Open { conn, qp_num, tag });
        self.qps.insert(qp_num, key);
    }

    /// Connections open now.
    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Connections released since start.
    pub fn closed(&self) -> u64 {
        self.closed
    }

    /// The connection of the QP `qp_num`, if one has it.
    pub fn by_qp(&self, qp_num: u32) -> Option<CmIdKey> {
        self.qps.get(&qp_num).copied()
    }

    /// Tells connection `key` of `notice` (logged when it is gone already).
    pub fn notify(&self, key: CmIdKey, notice: CmNotice) {
        match self.open.get(&key) {
            Some(open) => open.conn.do_send(notice),
            None => tracing::debug!(?notice, "event for a connection already gone"),
        }
    }

    /// Tells every connection whose tag `which` picks to close for `reason`.
    pub fn close_where(&self, which: impl Fn(&T) -> bool, reason: &CloseReason) {
        for open in self.open.values().filter(|o| which(&o.tag)) {
            open.conn.do_send(CmNotice::Close(reason.clone()));
        }
    }

    /// Tells every connection to close for `reason`.
    pub fn close_all(&self, reason: &CloseReason) {
        self.close_where(|_| true, reason);
    }

    /// Connection `key` has released everything: forgets it and hands back its tag
    /// (`None`: not one of this set's). Then [`answer_if_drained`](Self::answer_if_drained).
    pub fn release(&mut self, key: CmIdKey) -> Option<T> {
        let open = self.open.remove(&key)?;
        self.closed += 1;
        // rxe reuses QP numbers: only if it still names this connection.
        if self.qps.get(&open.qp_num) == Some(&key) {
            self.qps.remove(&open.qp_num);
        }
        Some(open.tag)
    }

    /// Once none is open: answers every [`drain`](Self::drain) waiting, and says so.
    pub fn answer_if_drained(&mut self) -> bool {
        if !self.open.is_empty() {
            return false;
        }
        for w in self.drained.drain(..) {
            let _ = w.send(());
        }
        true
    }

    /// Shutdown: tells every connection to close, and answers `done` once all have
    /// released (now, if none is open).
    pub fn drain(&mut self, done: oneshot::Sender<()>) {
        self.close_all(&CloseReason::Shutdown);
        self.drained.push(done);
        self.answer_if_drained();
    }
}

/// A peer address for a connection's label (`?` when unknown).
pub(crate) fn fmt_addr(addr: Option<SocketAddr>) -> String {
    addr.map_or_else(|| "?".into(), |a| a.to_string())
}
