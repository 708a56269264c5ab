//! A connection to a service that outlives its node: [`ClusterSession`] keeps one
//! connection, moves it to another node when its node drains or leaves the registry,
//! and when the connection is lost under a request it reconnects and sends the request
//! again, if the request says it may be ([`Idempotency`]).
//!
//! Why the request decides, and not the session: only the application knows whether a
//! request that may have run on the lost node can run again. An echo, a read or a put
//! of the same value can; an append or a counter increment cannot, and for those the
//! caller gets [`SessionError::NotRetried`], naming the node and the reason, and decides
//! (the next request reconnects either way).
//!
//! A reconnect is a connect of its [`ClusterClient`]: each node tried for at most the
//! client's dial bound, nodes that did not answer tried last (the client's module docs),
//! so a session whose next node is a dead host that is still listed moves on in one
//! bound, and the client's other sessions and connects do not wait for that host again.
//!
//! Which errors mean "the connection is gone" is the error type's to say
//! ([`ConnectionFault`]); the rdmactor client's `RequestError` and `CallError` say so
//! for every close but the client's own shutdown (a peer that vanished,
//! `PeerUnreachable`; a device that went, `DeviceLost`; a server that closed or drained).

use std::fmt;
use std::future::Future;

use crate::client::{Attempt, ClusterClient, ClusterError, Connector, Placement};
use crate::membership::Membership;
use crate::NodeInfo;

/// Whether a request may be sent again after its connection was lost before the answer
/// came (it may have run on the lost node, or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idempotency {
    /// Running it twice has the effect of running it once: sent again on another node.
    Idempotent,
    /// Not safe to repeat: the caller is told the connection was lost, and decides.
    Once,
}

/// A request type's own declaration, for request enums whose variants differ (a read
/// is idempotent, an append is not). Pass `req.idempotency()` to
/// [`ClusterSession::request`]. With the `rdmactor` feature, `echo`'s request declares
/// itself here; the tools' key-value example declares its requests per variant.
pub trait Idempotent {
    /// Whether this request may be sent again after a lost connection.
    fn idempotency(&self) -> Idempotency;
}

/// What an error of a request says about its connection.
pub trait ConnectionFault {
    /// `Some(reason)` when the connection is gone (the request may or may not have run;
    /// another node should be tried), `None` when the request failed on a connection
    /// that goes on (a handler's error, a refusal).
    fn connection_lost(&self) -> Option<String>;
}

/// What the session does after a lost connection: a plain decision, unit tested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Reconnect and send the request again.
    Retry,
    /// Not idempotent: tell the caller.
    NotRetried,
    /// Lost on as many nodes as a request may try.
    GiveUp,
}

/// After the `lost`-th lost connection of one request (1 for the first).
pub(crate) fn after_loss(idempotency: Idempotency, lost: usize, max_attempts: usize) -> Next {
    match idempotency {
        Idempotency::Once => Next::NotRetried,
        Idempotency::Idempotent if lost >= max_attempts => Next::GiveUp,
        Idempotency::Idempotent => Next::Retry,
    }
}

/// Why a request through a [`ClusterSession`] failed. Each names the node(s) and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError<E> {
    /// No node could be connected; `lost` lists the connections lost before, if the
    /// request had been sent already.
    #[error("{source}{}", lost_suffix(lost))]
    Connect {
        /// Connections this request lost before the failed connect.
        lost: Vec<Attempt>,
        /// Why no node could be connected.
        #[source]
        source: ClusterError,
    },
    /// The request failed on a live connection (the connection goes on).
    #[error("node {node} ({addr}): {error}")]
    Failed {
        /// The node.
        node: String,
        /// Its address.
        addr: std::net::SocketAddr,
        /// The request's own error.
        error: E,
    },
    /// The connection was lost under a request marked [`Idempotency::Once`]: it was not
    /// sent again, and may or may not have run on that node.
    #[error(
        "{lost}; the request is not idempotent, so it was not sent again (it may have run there)"
    )]
    NotRetried {
        /// The node and why its connection was lost.
        lost: Attempt,
        /// The request's error.
        error: E,
    },
    /// The connection was lost on every node tried.
    #[error("the connection was lost on {} nodes: {}", attempts.len(), join(attempts))]
    GaveUp {
        /// Each node and why, in order.
        attempts: Vec<Attempt>,
        /// The last error.
        error: E,
    },
}

fn join(attempts: &[Attempt]) -> String {
    attempts
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn lost_suffix(lost: &[Attempt]) -> String {
    if lost.is_empty() {
        String::new()
    } else {
        format!(" (after losing the connection: {})", join(lost))
    }
}

/// Where a session's connections go: the owned form of [`Placement`].
#[derive(Debug, Clone)]
enum Place {
    LeastLoaded,
    Key(Vec<u8>),
}

impl Place {
    fn as_placement(&self) -> Placement<'_> {
        match self {
            Place::LeastLoaded => Placement::LeastLoaded,
            Place::Key(key) => Placement::Key(key),
        }
    }
}

/// A connection to a service of the cluster that moves to another node when its node
/// drains, leaves the registry, or the connection is lost. Made by
/// [`ClusterClient::session`]; one request at a time (`&mut self`).
pub struct ClusterSession<'c, C: Connector> {
    client: &'c ClusterClient<C>,
    service: String,
    place: Place,
    members: Membership,
    current: Option<(C::Connection, NodeInfo)>,
    /// Nodes this session lost a connection to, the most recent last: tried last while
    /// others are listed.
    avoid: Vec<String>,
    /// Every move so far: the node left and why.
    moves: Vec<Attempt>,
}

impl<C: Connector> fmt::Debug for ClusterSession<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterSession")
            .field("service", &self.service)
            .field("node", &self.node().map(|n| &n.node))
            .field("moves", &self.moves)
            .finish()
    }
}

impl<C: Connector> ClusterClient<C> {
    /// A session with `service`, connected at once to a node chosen by `placement`.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect).
    pub async fn session(
        &self,
        service: &str,
        placement: Placement<'_>,
    ) -> Result<ClusterSession<'_, C>, ClusterError> {
        let place = match placement {
            Placement::LeastLoaded => Place::LeastLoaded,
            Placement::Key(key) => Place::Key(key.to_vec()),
        };
        let mut session = ClusterSession {
            client: self,
            service: service.to_owned(),
            members: self.membership(service)?,
            place,
            current: None,
            avoid: Vec::new(),
            moves: Vec::new(),
        };
        session.ensure_connected().await?;
        Ok(session)
    }
}

impl<C: Connector> ClusterSession<'_, C> {
    /// The node connected now (none between a lost connection and the next request).
    pub fn node(&self) -> Option<&NodeInfo> {
        self.current.as_ref().map(|(_, node)| node)
    }

    /// The connection now, if any (for calls the session does not wrap).
    pub fn connection(&self) -> Option<&C::Connection> {
        self.current.as_ref().map(|(conn, _)| conn)
    }

    /// Every node this session left so far, and why (lost, draining, unlisted).
    pub fn moves(&self) -> &[Attempt] {
        &self.moves
    }

    /// Runs `request` on (a clone of) the session's connection: owned, so that the
    /// future it returns may hold it. Before it, a connection whose node
    /// is draining or no longer listed is moved to another node. When the request fails
    /// because the connection is gone, the node is left, and the request is sent again
    /// on another node if it is [`Idempotency::Idempotent`] (as many nodes as the
    /// client tries per connect).
    ///
    /// # Errors
    ///
    /// [`SessionError`]: each variant names the node and the reason.
    pub async fn request<T, E, F, Fut>(
        &mut self,
        idempotency: Idempotency,
        mut request: F,
    ) -> Result<T, SessionError<E>>
    where
        C::Connection: Clone,
        E: ConnectionFault,
        F: FnMut(C::Connection) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut lost: Vec<Attempt> = Vec::new();
        loop {
            self.leave_if_gone().await;
            if let Err(source) = self.ensure_connected().await {
                return Err(SessionError::Connect { lost, source });
            }
            let (conn, node) = self.current.as_ref().expect("connected above");
            let error = match request(conn.clone()).await {
                Ok(answer) => return Ok(answer),
                Err(error) => error,
            };
            let Some(reason) = error.connection_lost() else {
                return Err(SessionError::Failed {
                    node: node.node.clone(),
                    addr: node.record.addr,
                    error,
                });
            };
            let attempt = Attempt {
                node: node.node.clone(),
                addr: node.record.addr,
                reason,
            };
            tracing::info!(service = %self.service, %attempt, "cluster: connection lost");
            self.leave(attempt.clone()).await;
            self.avoid.retain(|n| *n != attempt.node);
            self.avoid.push(attempt.node.clone());
            lost.push(attempt);
            match after_loss(idempotency, lost.len(), self.client.max_attempts()) {
                Next::Retry => continue,
                Next::NotRetried => {
                    let lost = lost.pop().expect("pushed above");
                    return Err(SessionError::NotRetried { lost, error });
                }
                Next::GiveUp => {
                    return Err(SessionError::GaveUp {
                        attempts: lost,
                        error,
                    })
                }
            }
        }
    }

    /// Closes the connection.
    pub async fn close(mut self) {
        if let Some((conn, _)) = self.current.take() {
            self.client.connector().close(conn).await;
        }
    }

    /// Leaves the node if the registry says it is draining, or (while the list is
    /// current) no longer lists it.
    async fn leave_if_gone(&mut self) {
        let Some((_, node)) = &self.current else {
            return;
        };
        let listed = self
            .members
            .nodes()
            .into_iter()
            .find(|n| n.node == node.node);
        let reason = match listed {
            Some(n) if n.record.draining => "draining (shutting down)",
            Some(_) => return,
            None if self.members.is_synced() => "no longer in the registry (its lease lapsed)",
            None => return,
        };
        let attempt = Attempt {
            node: node.node.clone(),
            addr: node.record.addr,
            reason: reason.into(),
        };
        tracing::info!(service = %self.service, %attempt, "cluster: moving to another node");
        self.leave(attempt).await;
    }

    async fn leave(&mut self, why: Attempt) {
        if let Some((conn, _)) = self.current.take() {
            self.client.connector().close(conn).await;
        }
        self.moves.push(why);
    }

    async fn ensure_connected(&mut self) -> Result<(), ClusterError> {
        if self.current.is_some() {
            return Ok(());
        }
        let connected = self
            .client
            .connect_avoiding(&self.service, self.place.as_placement(), &self.avoid)
            .await?;
        // Connected again (it was the best left): no longer avoided.
        self.avoid.retain(|n| *n != connected.node.node);
        self.current = Some((connected.connection, connected.node));
        Ok(())
    }
}

#[cfg(feature = "rdmactor")]
mod rdmactor_faults {
    use rdmactor::runtime::{CallError, CloseReason, RequestError};

    use super::ConnectionFault;

    impl ConnectionFault for RequestError {
        fn connection_lost(&self) -> Option<String> {
            match self {
                // The client's own shutdown: no other node would do better.
                RequestError::Closed(CloseReason::Shutdown) => None,
                RequestError::Closed(reason) => Some(reason.to_string()),
                _ => None,
            }
        }
    }

    /// An echo answers the same however often it runs.
    impl super::Idempotent for rdmactor_services::echo::EchoRequest {
        fn idempotency(&self) -> super::Idempotency {
            super::Idempotency::Idempotent
        }
    }

    impl<E> ConnectionFault for CallError<E> {
        fn connection_lost(&self) -> Option<String> {
            match self {
                CallError::Request(e) => e.connection_lost(),
                _ => None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_idempotent_requests_are_sent_again_and_only_so_often() {
        assert_eq!(after_loss(Idempotency::Once, 1, 3), Next::NotRetried);
        assert_eq!(after_loss(Idempotency::Idempotent, 1, 3), Next::Retry);
        assert_eq!(after_loss(Idempotency::Idempotent, 2, 3), Next::Retry);
        assert_eq!(after_loss(Idempotency::Idempotent, 3, 3), Next::GiveUp);
        assert_eq!(after_loss(Idempotency::Idempotent, 1, 1), Next::GiveUp);
    }

    #[test]
    fn errors_name_each_node_and_reason() {
        let a = Attempt {
            node: "a".into(),
            addr: "192.0.2.1:7471".parse().unwrap(),
            reason: "peer unreachable: retry exceeded".into(),
        };
        let b = Attempt {
            node: "b".into(),
            addr: "192.0.2.2:7471".parse().unwrap(),
            reason: "the RDMA device is gone: removed".into(),
        };
        let e: SessionError<String> = SessionError::NotRetried {
            lost: a.clone(),
            error: "x".into(),
        };
        let text = e.to_string();
        assert!(
            text.contains("node a (192.0.2.1:7471): peer unreachable"),
            "{text}"
        );
        assert!(text.contains("not idempotent"), "{text}");
        let e: SessionError<String> = SessionError::GaveUp {
            attempts: vec![a, b],
            error: "x".into(),
        };
        let text = e.to_string();
        assert!(text.contains("lost on 2 nodes"), "{text}");
        assert!(
            text.contains("node b (192.0.2.2:7471): the RDMA device is gone"),
            "{text}"
        );
    }
}
