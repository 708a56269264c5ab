//! The client side: ask a seed, then connect to the first member that answers.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use rdmactor::runtime::{CallError, Client, ClientConnection};
use rdmactor::transport::Transport;

use super::{Member, MembersError, MembersRequest, MAX_MEMBERS};

/// How long one connect (to a seed, or to a member) may take before the next is tried:
/// as the cluster client's dial bound, and for its reason. A live server answers within
/// milliseconds; one whose host died never does, and rdma_cm would resend the request
/// for a minute.
pub const DEFAULT_DIAL: Duration = Duration::from_secs(5);

/// Asks the server at the other end of `conn` (connected to its `members` service)
/// which servers serve `service`, in the order to try them.
///
/// # Errors
///
/// The server's [`MembersError`] as [`CallError::Handler`]; the call's own failures.
pub async fn members<T: Transport>(
    conn: &ClientConnection<T>,
    service: &str,
) -> Result<Vec<Member>, CallError<MembersError>> {
    conn.call_typed(&MembersRequest {
        service: service.to_owned(),
    })
    .await
}

/// What [`connect_via`] did at one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// Where.
    pub addr: SocketAddr,
    /// The member's node id (`None` for a seed asked for the list).
    pub node: Option<String>,
    /// Why it failed: the error's text, or that it did not answer within the dial
    /// bound.
    pub reason: String,
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.node {
            Some(node) => write!(f, "node {node} at {}: {}", self.addr, self.reason),
            None => write!(f, "seed {}: {}", self.addr, self.reason),
        }
    }
}

/// A connection made through a seed (`C`: a `ClientConnection`, or what the caller's
/// own connect makes, with [`connect_via_with`]).
#[derive(Debug)]
pub struct Bootstrapped<C> {
    /// The connection to the service.
    pub connection: C,
    /// The member it is to.
    pub member: Member,
    /// What failed before it, in order (seeds that did not answer, members that did
    /// not).
    pub failed: Vec<Attempt>,
}

/// Why [`connect_via`] made no connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BootstrapError {
    /// No seed address was given.
    #[error("no seed address to ask")]
    NoSeeds,
    /// No seed answered with a list that has a member in it.
    #[error("no seed listed a server of the service: {}", list(.0))]
    NoList(Vec<Attempt>),
    /// Every member listed failed to connect.
    #[error("no listed server could be connected: {}", list(.0))]
    NoneServed(Vec<Attempt>),
}

impl BootstrapError {
    /// Every address tried and its reason, in order.
    pub fn attempts(&self) -> &[Attempt] {
        match self {
            BootstrapError::NoSeeds => &[],
            BootstrapError::NoList(a) | BootstrapError::NoneServed(a) => a,
        }
    }
}

fn list(attempts: &[Attempt]) -> String {
    attempts
        .iter()
        .map(Attempt::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Connects `client` to `service` on a server of the cluster, knowing only `seeds`:
/// asks the seeds' `members` service in order until one lists a member, then connects
/// to the members in the order given until one accepts. Each connect and each question
/// is bounded by `dial` (a dropped connect releases what it started). Every failure on
/// the way is kept, to name in the error or to log.
///
/// # Errors
///
/// [`BootstrapError`], with every address tried and why.
pub async fn connect_via<T: Transport>(
    client: &Client<T>,
    seeds: &[SocketAddr],
    service: &str,
    dial: Duration,
) -> Result<Bootstrapped<ClientConnection<T>>, BootstrapError> {
    connect_via_with(client, seeds, service, dial, |addr| {
        client.connect(addr, service)
    })
    .await
}

/// [`connect_via`] with the caller's own connect to each member (a connect with a
/// session of its own, say): `connect(addr)` is called for each member in order,
/// bounded by `dial`, until one succeeds.
///
/// # Errors
///
/// As [`connect_via`].
pub async fn connect_via_with<T, C, E, F, Fut>(
    client: &Client<T>,
    seeds: &[SocketAddr],
    service: &str,
    dial: Duration,
    mut connect: F,
) -> Result<Bootstrapped<C>, BootstrapError>
where
    T: Transport,
    E: fmt::Display,
    F: FnMut(SocketAddr) -> Fut,
    Fut: Future<Output = Result<C, E>>,
{
    let (list, mut failed) = list_via(client, seeds, service, dial).await?;
    for member in list {
        let addr = member.addr;
        let reason = match tokio::time::timeout(dial, connect(addr)).await {
            Ok(Ok(connection)) => {
                return Ok(Bootstrapped {
                    connection,
                    member,
                    failed,
                })
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {dial:?}"),
        };
        failed.push(Attempt {
            addr,
            node: Some(member.node),
            reason,
        });
    }
    Err(BootstrapError::NoneServed(failed))
}

/// The first list a seed gives (at most [`MAX_MEMBERS`] members), and the seeds that
/// failed before it.
async fn list_via<T: Transport>(
    client: &Client<T>,
    seeds: &[SocketAddr],
    service: &str,
    dial: Duration,
) -> Result<(Vec<Member>, Vec<Attempt>), BootstrapError> {
    if seeds.is_empty() {
        return Err(BootstrapError::NoSeeds);
    }
    let mut failed = Vec::new();
    let mut listed = None;
    for &seed in seeds {
        let seed_failed = |reason: String| Attempt {
            addr: seed,
            node: None,
            reason,
        };
        match ask(client, seed, service, dial).await {
            Ok(list) if !list.is_empty() => {
                listed = Some(list);
                break;
            }
            Ok(_) => failed.push(seed_failed("lists no live server of it".into())),
            Err(reason) => failed.push(seed_failed(reason)),
        }
    }
    let Some(mut list) = listed else {
        return Err(BootstrapError::NoList(failed));
    };
    // A server lists at most this many; a longer list is not one to spend dials on.
    list.truncate(MAX_MEMBERS);
    Ok((list, failed))
}

/// One seed's list, or why there is none.
async fn ask<T: Transport>(
    client: &Client<T>,
    seed: SocketAddr,
    service: &str,
    dial: Duration,
) -> Result<Vec<Member>, String> {
    let conn = match tokio::time::timeout(dial, client.connect(seed, "members")).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("no answer within {dial:?}")),
    };
    let answer = tokio::time::timeout(dial, members(&conn, service)).await;
    conn.close().await;
    match answer {
        Ok(Ok(list)) => Ok(list),
        // The server's own words, not the call's Debug of them.
        Ok(Err(CallError::Handler(e))) => Err(e.to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no list within {dial:?}")),
    }
}
