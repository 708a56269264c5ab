//! The server side: answers [`MembersRequest`]s from a [`Directory`].

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use rdmactor::runtime::{RequestCx, RequestHandler};

use super::{Member, MembersError, MembersRequest, MAX_MEMBERS, MAX_SERVICE_NAME};

/// Where a server's answer comes from: a view of the registry this server keeps.
/// `members` is called on a connection's poller thread for every question, so it must
/// answer from memory, at once (the cluster crate's watches etcd in the background).
pub trait Directory: Send + Sync + 'static {
    /// The live servers of `service`, in the order a client should try them.
    ///
    /// # Errors
    ///
    /// [`MembersError::UnknownService`] for a service this directory does not list,
    /// [`MembersError::NotSynced`] while its view is not current.
    fn members(&self, service: &str) -> Result<Vec<Member>, MembersError>;
}

impl<D: Directory + ?Sized> Directory for Arc<D> {
    fn members(&self, service: &str) -> Result<Vec<Member>, MembersError> {
        (**self).members(service)
    }
}

/// A directory whose lists are set by hand: a fixed cluster with no registry, and tests.
/// Clones share the lists.
#[derive(Debug, Clone, Default)]
pub struct StaticDirectory {
    lists: Arc<RwLock<HashMap<String, Vec<Member>>>>,
}

impl StaticDirectory {
    /// An empty directory: every service is unknown.
    pub fn new() -> StaticDirectory {
        StaticDirectory::default()
    }

    /// Lists `members` (in this order) as `service`'s, replacing what was there.
    pub fn set(&self, service: &str, members: Vec<Member>) {
        self.lists
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(service.to_owned(), members);
    }
}

impl Directory for StaticDirectory {
    fn members(&self, service: &str) -> Result<Vec<Member>, MembersError> {
        self.lists
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(service)
            .cloned()
            .ok_or_else(|| MembersError::UnknownService(service.to_owned()))
    }
}

/// How long a question waits for a directory that is not yet current before it is
/// answered `NotSynced`.
const SYNC_WAIT: Duration = Duration::from_secs(2);

/// The `members` service: register it under the name clients bootstrap with (the
/// tools use `members`), beside the services it lists.
#[derive(Debug, Clone)]
pub struct MembersService<D> {
    directory: D,
}

impl<D: Directory> MembersService<D> {
    /// Answers from `directory`.
    pub fn new(directory: D) -> MembersService<D> {
        MembersService { directory }
    }
}

impl<D: Directory> RequestHandler for MembersService<D> {
    type Req = MembersRequest;
    type Resp = Vec<Member>;
    type Error = MembersError;

    async fn call(&self, req: MembersRequest, _: &RequestCx) -> Result<Vec<Member>, MembersError> {
        if req.service.len() > MAX_SERVICE_NAME {
            return Err(MembersError::NameTooLong(req.service.len()));
        }
        // A directory that has just started to watch (the first question about a
        // service) is read within a round trip to the registry: wait that out here
        // rather than send the client to its next seed.
        let deadline = Instant::now() + SYNC_WAIT;
        loop {
            match self.directory.members(&req.service) {
                Err(MembersError::NotSynced) if Instant::now() < deadline => {
                    actix::clock::sleep(Duration::from_millis(20)).await;
                }
                answer => {
                    let mut members = answer?;
                    members.truncate(MAX_MEMBERS);
                    return Ok(members);
                }
            }
        }
    }
}
