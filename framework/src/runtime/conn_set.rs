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

use super::close::CloseReason;
use super::connection::{CmNotice, ConnectionActor, ConnectionParts};
use super::service::Session;
use crate::transport::Transport;
use crate::verbs::CmIdKey;

struct Open<T> {
    conn: Recipient<CmNotice>,
    qp_num: u32,
    /// What the owner keeps with the connection (the peer address it counts under, the
    /// out-of-band client it belongs to).
    tag: T,
}

/// The open connections of one owner, by key `K` (a transport's cm_id key), with the
/// owner's `T` for each.
pub(crate) struct ConnSet<T, K = CmIdKey> {
    open: HashMap<K, Open<T>>,
    /// The connection of each QP, for device events that name a QP (`device_watch.rs`).
    qps: HashMap<u32, K>,
    /// Connections released since start.
    closed: u64,
    /// Answered once every connection has released (see [`ConnSet::drain`]).
    drained: Vec<oneshot::Sender<()>>,
}

impl<T, K> Default for ConnSet<T, K> {
    fn default() -> Self {
        ConnSet {
            open: HashMap::new(),
            qps: HashMap::new(),
            closed: 0,
            drained: Vec::new(),
        }
    }
}

impl<T, K: Copy + Eq + std::hash::Hash + std::fmt::Debug> ConnSet<T, K> {
    /// Starts the connection's actor (see [`ConnectionActor::start`]) and keeps it, with
    /// `tag`, until it is released.
    pub fn start<S: Session<Tr>, Tr: Transport<CmIdKey = K>>(
        &mut self,
        parts: ConnectionParts<S, Tr>,
        tag: T,
    ) -> Addr<ConnectionActor<S, Tr>> {
        let (key, qp_num) = (parts.key, parts.core.qp_num());
        let addr = ConnectionActor::start(parts);
        self.insert(key, qp_num, addr.clone().recipient(), tag);
        addr
    }

    /// Keeps a connection started elsewhere (an active connect's, started by the side
    /// that dialled it) until it is released.
    pub fn insert(&mut self, key: K, qp_num: u32, conn: Recipient<CmNotice>, tag: T) {
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
    pub fn by_qp(&self, qp_num: u32) -> Option<K> {
        self.qps.get(&qp_num).copied()
    }

    /// Tells connection `key` of `notice` (logged when it is gone already).
    pub fn notify(&self, key: K, notice: CmNotice) {
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

    /// Gives connection `key` the tag `tag`, handing back the one it had (`None`: not
    /// one of this set's).
    pub fn retag(&mut self, key: K, tag: T) -> Option<T> {
        self.open
            .get_mut(&key)
            .map(|open| std::mem::replace(&mut open.tag, tag))
    }

    /// Connection `key` has released everything: forgets it and hands back its tag
    /// (`None`: not one of this set's). Then [`answer_if_drained`](Self::answer_if_drained).
    pub fn release(&mut self, key: K) -> Option<T> {
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

/// Shutdown, to an owner of a set: stop taking connections, close every one, and answer
/// once all have released (see [`ConnSet::drain`]).
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Drain(pub oneshot::Sender<()>);

/// Sends [`Drain`] to `owner` and waits for the answer (or for the owner to be gone).
pub(crate) async fn drain<A>(owner: &Addr<A>)
where
    A: Actor + Handler<Drain>,
    A::Context: actix::dev::ToEnvelope<A, Drain>,
{
    let (tx, rx) = oneshot::channel();
    owner.do_send(Drain(tx));
    let _ = rx.await;
}

/// A peer address for a connection's label (`?` when unknown).
pub(crate) fn fmt_addr(addr: Option<SocketAddr>) -> String {
    addr.map_or_else(|| "?".into(), |a| a.to_string())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Stands in for a connection actor: keeps the notices it is sent.
    struct Heard(Arc<Mutex<Vec<String>>>);

    impl Actor for Heard {
        type Context = Context<Self>;
    }

    impl Handler<CmNotice> for Heard {
        type Result = ();
        fn handle(&mut self, notice: CmNotice, _: &mut Context<Self>) {
            self.0.lock().unwrap().push(format!("{notice:?}"));
        }
    }

    fn key(n: usize) -> CmIdKey {
        CmIdKey::out_of_band(n)
    }

    /// Runs `f` on a set holding connections 1 to 3 (tags 10, 20, 20; QPs 101 to 103),
    /// then returns what each connection heard.
    fn with_set(f: impl FnOnce(&mut ConnSet<u64>) + 'static) -> Vec<Vec<String>> {
        actix::System::new().block_on(async move {
            let heard: Vec<_> = (0..3).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
            let mut set = ConnSet::default();
            for (i, tag) in [10, 20, 20].into_iter().enumerate() {
                let conn = Heard(heard[i].clone()).start().recipient();
                set.insert(key(i + 1), 101 + i as u32, conn, tag);
            }
            f(&mut set);
            // Every notice sent is delivered before this one-turn sleep ends.
            actix::clock::sleep(std::time::Duration::from_millis(20)).await;
            heard.iter().map(|h| h.lock().unwrap().clone()).collect()
        })
    }

    #[test]
    fn a_drain_closes_every_connection_and_answers_once_all_released() {
        let (tx, mut rx) = oneshot::channel();
        let heard = with_set(move |set| {
            set.drain(tx);
            assert!(rx.try_recv().is_err(), "three still open");
            assert_eq!(set.release(key(2)), Some(20));
            assert_eq!(set.release(key(2)), None, "released once");
            assert!(!set.answer_if_drained());
            set.release(key(1));
            set.release(key(3));
            assert!(set.answer_if_drained());
            assert_eq!(rx.try_recv(), Ok(()));
            assert_eq!((set.len(), set.closed()), (0, 3));
        });
        for h in heard {
            assert_eq!(h, vec!["Close(Shutdown)"]);
        }
    }

    #[test]
    fn a_drain_of_an_empty_set_answers_at_once() {
        let mut set: ConnSet<()> = ConnSet::default();
        let (tx, mut rx) = oneshot::channel();
        set.drain(tx);
        assert_eq!(rx.try_recv(), Ok(()));
    }

    #[test]
    fn close_where_reaches_only_the_tagged_and_notify_only_the_named() {
        let heard = with_set(|set| {
            set.close_where(|&t| t == 20, &CloseReason::Protocol("left".into()));
            set.notify(key(1), CmNotice::Disconnected);
            set.notify(key(9), CmNotice::Disconnected);
        });
        assert_eq!(heard[0], vec!["Disconnected"]);
        let left = r#"Close(Protocol("left"))"#;
        assert_eq!(heard[1], vec![left]);
        assert_eq!(heard[2], vec![left]);
    }

    #[test]
    fn a_qp_names_its_connection_until_released_or_reused() {
        with_set(|set| {
            assert_eq!(set.by_qp(102), Some(key(2)));
            assert_eq!(set.by_qp(104), None);
            // rxe reuses QP numbers: a new connection on QP 102 before the old one's
            // release keeps the number.
            let other = set.open[&key(1)].conn.clone();
            set.insert(key(4), 102, other, 30);
            set.release(key(2));
            assert_eq!(set.by_qp(102), Some(key(4)));
            set.release(key(4));
            assert_eq!(set.by_qp(102), None);
        });
    }
}
