//! One server connection: any number of transfers, one at a time, each started by the
//! client. An `Offer` makes the server the [`Receiver`] (upload); a `Fetch` makes it
//! the [`Sender`] of a file from [`Config::dir`] (download). `Identify` is answered
//! after an upload's GOOD. A `Stat` is prepared as a `Fetch` is (same access rules,
//! same digest cache and preparation limit) and answered with `Held` instead of an
//! offer.

use std::collections::{HashSet, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::config::Config;
use super::digests::DigestCache;
use super::endpoint::Endpoint;
use super::error::Result;
use super::output::{ChunkWrite, Outcome, Output};
use super::prepare::PrepareFetch;
use super::quota::PreparationLimit;
use super::receiver::Receiver;
use super::sender::Sender;
use super::store::Reaper;
use super::wire::{Msg, RejectReason, RemoteWindow};

#[derive(Debug)]
enum Role {
    Idle,
    /// A `Fetch` or a `Stat` is being prepared (the file opened and its digest found)
    /// off the connection's thread; the job until the driver takes it. A `Stat` is
    /// answered with what the preparation found and nothing is sent.
    Preparing {
        job: Option<PrepareFetch>,
        stat: bool,
    },
    /// A `Delete` is being carried out off the connection's thread; the job until the
    /// driver takes it, and the name (an anonymous connection's own names lose it).
    Deleting {
        job: Option<super::DeleteJob>,
        name: String,
    },
    Receive(Receiver),
    /// Boxed: a sender is more than twice the size of the other roles.
    Send(Box<Sender>),
}

/// The server side of a connection (see [`Endpoint`] for how to drive it). Between
/// transfers, and after an error, it behaves as described on [`Receiver`] and
/// [`Sender`]; a new `Offer` or `Fetch` is accepted whenever the previous transfer is
/// finished.
///
/// A `Fetch` hashes the whole file before the offer goes out: the server emits
/// [`Output::Prepare`] and the driver runs the hashing elsewhere
/// ([`Endpoint::take_prepare`], [`Endpoint::handle_prepared`]).
#[derive(Debug)]
pub struct Server {
    config: Arc<Config>,
    role: Role,
    /// Names this connection stored: the files an anonymous connection may fetch and
    /// overwrite unless [`Config::public_fetch`] / [`Config::overwrite_others`] say
    /// anyone may.
    owned: HashSet<String>,
    /// The identity the connection proved at connect: it owns the files it stores, on
    /// every connection and every server (see `ownership.rs`), in place of `owned`.
    identity: Option<String>,
    /// Outputs of a role that was replaced, and fetch refusals.
    out: VecDeque<Output>,
    /// Given to every upload's receiver (see [`Receiver::set_reaper`]).
    reaper: Option<Reaper>,
    /// This connection's client, whose uploads the service's quota owner admits (see
    /// [`Receiver::set_quota`]).
    quota: Option<String>,
    /// Set when the service stops taking transfers (shutdown has begun).
    draining: Option<Arc<AtomicBool>>,
    /// The service's known digests, given to every fetch's preparation.
    digests: Option<Arc<DigestCache>>,
    /// The service's per-client limit of fetch preparations.
    preparations: Option<Arc<PreparationLimit>>,
}

impl Server {
    /// A connection served with `config`.
    pub fn new(config: Arc<Config>) -> Server {
        Server {
            config,
            role: Role::Idle,
            owned: HashSet::new(),
            identity: None,
            out: VecDeque::new(),
            reaper: None,
            quota: None,
            draining: None,
            digests: None,
            preparations: None,
        }
    }

    /// Looks every fetched file's digest up in `digests` before hashing it, and
    /// stores what it hashes there (see [`PrepareFetch`]).
    pub fn with_digests(mut self, digests: Arc<DigestCache>) -> Server {
        self.digests = Some(digests);
        self
    }

    /// Counts the fetches this connection's client has being hashed against `limit`:
    /// the client given to [`with_quota`](Self::with_quota), without which there is
    /// no one to count against and no limit.
    pub fn with_preparation_limit(mut self, limit: Arc<PreparationLimit>) -> Server {
        self.preparations = Some(limit);
        self
    }

    /// Refuses every new offer and fetch with [`RejectReason::ShuttingDown`] once
    /// `flag` is set (see `FileTransfer::refuse_new_transfers`).
    pub fn with_drain_flag(mut self, flag: Arc<AtomicBool>) -> Server {
        self.draining = Some(flag);
        self
    }

    fn draining(&self) -> bool {
        self.draining
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// Has this connection's uploads admitted by the service's quota owner, charged to
    /// `client`'s share (see [`Config::client_quota`] and [`Output::Admit`]).
    pub fn with_quota(mut self, client: String) -> Server {
        self.quota = Some(client);
        self
    }

    /// Serves a connection that proved `identity`: its uploads are stored as its own,
    /// and it fetches and replaces the files it owns, whichever connection or server
    /// stored them.
    pub fn with_identity(mut self, identity: String) -> Server {
        self.identity = Some(identity);
        self
    }

    /// Has every upload's abandoned temporary file removed by `reaper` rather than on
    /// the thread that drops it (see [`Receiver::set_reaper`]).
    pub fn with_reaper(mut self, reaper: Reaper) -> Server {
        self.reaper = Some(reaper);
        self
    }

    fn role(&self) -> Option<&dyn Endpoint> {
        match &self.role {
            Role::Idle | Role::Preparing { .. } | Role::Deleting { .. } => None,
            Role::Receive(r) => Some(r),
            Role::Send(s) => Some(&**s),
        }
    }

    fn role_mut(&mut self) -> Option<&mut dyn Endpoint> {
        match &mut self.role {
            Role::Idle | Role::Preparing { .. } | Role::Deleting { .. } => None,
            Role::Receive(r) => Some(r),
            Role::Send(s) => Some(&mut **s),
        }
    }

    /// A receiver for one upload, with the service's reaper and this client's quota.
    fn receiver(&self) -> Receiver {
        let mut r = Receiver::new(Arc::clone(&self.config));
        if let Some(reaper) = &self.reaper {
            r.set_reaper(reaper.clone());
        }
        if let Some(client) = &self.quota {
            r.set_quota(client.clone());
        }
        r
    }

    /// Whether the connection proved an identity the service trusts to copy files for
    /// their owners ([`Config::replicators`]).
    fn is_replicator(&self) -> bool {
        self.identity
            .as_ref()
            .is_some_and(|who| self.config.replicators.contains(who))
    }

    /// Answers the message just taken with `reason`: the transfer it asked for ends
    /// before it began.
    fn refuse(&mut self, reason: RejectReason) {
        self.out.push_back(Output::Send(Msg::Reject {
            reason: reason.clone(),
        }));
        self.out
            .push_back(Output::Finished(Outcome::Rejected(reason)));
    }

    /// Ends the current role, keeping whatever it still has to say.
    fn retire(&mut self) {
        if let Some(ep) = self.role_mut() {
            let rest: Vec<Output> = std::iter::from_fn(|| ep.poll_output()).collect();
            self.out.extend(rest);
        }
        self.role = Role::Idle;
    }
}

impl Endpoint for Server {
    fn state_name(&self) -> &'static str {
        match self.role {
            Role::Preparing { .. } => return "hashing the file asked for",
            Role::Deleting { .. } => return "removing the file asked for",
            _ => {}
        }
        self.role()
            .map_or("waiting for an offer or a fetch", |ep| ep.state_name())
    }

    fn handle_msg(&mut self, msg: Msg) -> Result<()> {
        let between = self.is_finished();
        let stat = matches!(msg, Msg::Stat { .. });
        match msg {
            Msg::Offer(_)
            | Msg::OfferFor { .. }
            | Msg::Fetch { .. }
            | Msg::Stat { .. }
            | Msg::Delete { .. }
                if between && self.draining() =>
            {
                self.retire();
                self.refuse(RejectReason::ShuttingDown);
                Ok(())
            }
            Msg::Offer(mut offer) if between => {
                self.retire();
                // Overwriting someone else's file is asked for as if it were not:
                // the receiver then answers `Exists` if the file is there.
                // (An identity's files are told apart by their owner, in the store.)
                if !self.config.overwrite_others
                    && self.identity.is_none()
                    && !self.owned.contains(&offer.name)
                {
                    offer.overwrite = false;
                }
                let mut r = self.receiver();
                if let Some(who) = &self.identity {
                    r.set_owner(who.clone());
                }
                let res = r.handle_msg(Msg::Offer(offer));
                self.role = Role::Receive(r);
                res
            }
            Msg::OfferFor { mut offer, owner } if between => {
                self.retire();
                if !self.is_replicator() {
                    self.refuse(RejectReason::Forbidden {
                        what: "only a replicator may offer a copy for another owner".into(),
                    });
                    return Ok(());
                }
                if !rdmactor::runtime::valid_identity(&owner) {
                    self.refuse(RejectReason::Forbidden {
                        what: format!("a copy for {owner:?}, which is no identity name"),
                    });
                    return Ok(());
                }
                // A copy fills a gap; it never replaces what a node holds.
                offer.overwrite = false;
                let mut r = self.receiver();
                r.set_copy_owner(owner);
                let res = r.handle_msg(Msg::Offer(offer));
                self.role = Role::Receive(r);
                res
            }
            Msg::Delete { name } if between => {
                self.retire();
                // Where an overwrite would be allowed: the owner (told on the open
                // file), or the connection that stored an unowned file.
                let allowed = self.config.overwrite_others
                    || self.identity.is_some()
                    || self.owned.contains(&name);
                // Bad names go on to the job, which says what is wrong with them.
                let valid = super::name::validate_name(&name).is_ok();
                if valid && (name.starts_with('.') || !allowed) {
                    self.refuse(RejectReason::NotFound);
                    return Ok(());
                }
                let job = super::DeleteJob {
                    dir: self.config.dir.clone(),
                    name: name.clone(),
                    owner: self
                        .identity
                        .clone()
                        .filter(|_| !self.config.overwrite_others),
                    recorder: self.config.recorder.clone(),
                };
                self.role = Role::Deleting {
                    job: Some(job),
                    name,
                };
                self.out.push_back(Output::Delete);
                Ok(())
            }
            Msg::Fetch { name, .. } | Msg::Stat { name, .. }
                if between
                    && super::name::validate_name(&name).is_ok()
                    && (name.starts_with('.')
                        || !(self.config.public_fetch
                            || self.identity.is_some()
                            || self.owned.contains(&name))) =>
            {
                // Hidden files are never served; others' files only when public. The
                // answer is the one for a missing file, so it says nothing about them.
                // (Bad names go on to the preparation, which says what is wrong.)
                self.retire();
                self.refuse(RejectReason::NotFound);
                Ok(())
            }
            Msg::Fetch { name, alg } | Msg::Stat { name, alg } if between => {
                self.retire();
                let mut job = PrepareFetch::new(self.config.dir.clone(), name, alg);
                job.digests = self.digests.clone();
                job.limit = self.preparations.clone().zip(self.quota.clone());
                // An identity's fetch is served if the file is its own: told by the
                // opened file's owner, in the preparation.
                // A replicator's fetch is served whoever owns the file.
                job.owner = self
                    .identity
                    .clone()
                    .filter(|_| !self.config.public_fetch && !self.is_replicator());
                self.role = Role::Preparing {
                    job: Some(job),
                    stat,
                };
                self.out.push_back(Output::Prepare);
                Ok(())
            }
            msg => match self.role_mut() {
                Some(ep) => ep.handle_msg(msg),
                None => Err(super::endpoint::unexpected(self, msg.kind().to_owned())),
            },
        }
    }

    fn poll_output(&mut self) -> Option<Output> {
        let out = self
            .out
            .pop_front()
            .or_else(|| self.role_mut().and_then(|ep| ep.poll_output()));
        match (&out, &self.role) {
            (Some(Output::Finished(Outcome::Stored { path, .. })), Role::Receive(_)) => {
                if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
                    self.owned.insert(name.to_owned());
                }
            }
            // The client found the bytes we sent unlike the digest we offered: if it
            // was remembered (see `DigestCache` for how that can happen), the next
            // fetch hashes again.
            (Some(Output::Finished(Outcome::Bad(_))), Role::Send(s)) => {
                if let (Some(cache), Some(key)) = (&self.digests, s.fetched_key()) {
                    cache.forget(key, s.offer().digest.alg);
                }
            }
            _ => {}
        }
        out
    }

    fn is_finished(&self) -> bool {
        !matches!(self.role, Role::Preparing { .. } | Role::Deleting { .. })
            && self.role().is_none_or(|ep| ep.is_finished())
    }

    fn stopped_sending(&self) -> bool {
        self.role().is_none_or(|ep| ep.stopped_sending())
    }

    fn waits_on_peer(&self) -> bool {
        self.role().is_some_and(|ep| ep.waits_on_peer())
    }

    fn give_up(&mut self, reason: RejectReason) {
        if let Some(ep) = self.role_mut() {
            ep.give_up(reason);
        }
    }

    fn handle_job_refused(&mut self, reason: RejectReason) {
        if let Some(ep) = self.role_mut() {
            ep.handle_job_refused(reason);
        }
    }

    fn handle_admitted(
        &mut self,
        answer: std::result::Result<super::Admission, RejectReason>,
    ) -> Result<()> {
        match self.role_mut() {
            Some(ep) => ep.handle_admitted(answer),
            None => Err(super::endpoint::unexpected(self, "an admission".into())),
        }
    }

    fn take_prepare(&mut self) -> Option<PrepareFetch> {
        match &mut self.role {
            Role::Preparing { job, .. } => job.take(),
            _ => None,
        }
    }

    fn handle_prepared(
        &mut self,
        result: std::result::Result<Sender, super::wire::RejectReason>,
    ) -> Result<()> {
        let Role::Preparing { stat, .. } = self.role else {
            return Err(super::endpoint::unexpected(self, "a prepared fetch".into()));
        };
        match result {
            // The sender is dropped unused, which closes the file.
            Ok(s) if stat => {
                self.role = Role::Idle;
                let (len, digest) = (s.offer().len, s.offer().digest);
                self.out.push_back(Output::Send(Msg::Held { len, digest }));
                self.out
                    .push_back(Output::Finished(Outcome::Held { len, digest }));
            }
            Ok(s) => self.role = Role::Send(Box::new(s.with_max_window(self.config.max_window))),
            Err(reason) => {
                self.role = Role::Idle;
                self.out.push_back(Output::Send(Msg::Reject {
                    reason: reason.clone(),
                }));
                self.out
                    .push_back(Output::Finished(Outcome::Rejected(reason)));
            }
        }
        Ok(())
    }

    fn take_delete(&mut self) -> Option<super::DeleteJob> {
        match &mut self.role {
            Role::Deleting { job, .. } => job.take(),
            _ => None,
        }
    }

    fn handle_deleted(&mut self, result: std::result::Result<(), RejectReason>) -> Result<()> {
        let Role::Deleting { name, .. } = std::mem::replace(&mut self.role, Role::Idle) else {
            return Err(super::endpoint::unexpected(self, "a deletion".into()));
        };
        match result {
            Ok(()) => {
                self.owned.remove(&name);
                self.out.push_back(Output::Send(Msg::Deleted));
                self.out.push_back(Output::Finished(Outcome::Deleted));
            }
            Err(reason) => self.refuse(reason),
        }
        Ok(())
    }

    fn chunk_range(&self, index: u32) -> Result<Range<usize>> {
        match self.role() {
            Some(ep) => ep.chunk_range(index),
            None => Err(super::endpoint::unexpected(self, format!("chunk {index}"))),
        }
    }

    fn handle_chunk(&mut self, index: u32, bytes: &[u8]) -> Result<()> {
        match self.role_mut() {
            Some(ep) => ep.handle_chunk(index, bytes),
            None => Err(super::endpoint::unexpected(self, format!("chunk {index}"))),
        }
    }

    fn handle_window(&mut self, region: RemoteWindow) -> Result<()> {
        match self.role_mut() {
            Some(ep) => ep.handle_window(region),
            None => Err(super::endpoint::unexpected(
                self,
                "window registration".into(),
            )),
        }
    }

    fn window_refused(&mut self, reason: String) -> Result<()> {
        match self.role_mut() {
            Some(ep) => ep.window_refused(reason),
            None => Err(super::endpoint::unexpected(self, "window refusal".into())),
        }
    }

    fn fill_chunk(&mut self, chunk: &ChunkWrite, dst: &mut [u8]) -> Result<()> {
        match self.role_mut() {
            Some(ep) => ep.fill_chunk(chunk, dst),
            None => Err(super::endpoint::unexpected(
                self,
                format!("fill of chunk {}", chunk.index),
            )),
        }
    }

    fn take_read(&mut self, chunk: &ChunkWrite) -> Result<super::sender::ReadJob> {
        match self.role_mut() {
            Some(ep) => ep.take_read(chunk),
            None => Err(super::endpoint::unexpected(
                self,
                format!("read of chunk {}", chunk.index),
            )),
        }
    }

    fn handle_read(&mut self, read: super::sender::ChunkRead) -> Result<Vec<u8>> {
        match self.role_mut() {
            Some(ep) => ep.handle_read(read),
            None => Err(super::endpoint::unexpected(self, "a chunk read".into())),
        }
    }

    fn take_consume(&mut self) -> Option<super::receiver::ConsumeJob> {
        self.role_mut().and_then(|ep| ep.take_consume())
    }

    fn handle_consumed(&mut self, consumed: super::receiver::Consumed) -> Result<()> {
        match self.role_mut() {
            Some(ep) => ep.handle_consumed(consumed),
            None => Err(super::endpoint::unexpected(self, "consumed chunks".into())),
        }
    }

    fn take_commit(&mut self) -> Option<super::store::TempFile> {
        self.role_mut().and_then(|ep| ep.take_commit())
    }

    fn commit_copy(&self) -> Option<super::StoredCopy> {
        self.role().and_then(|ep| ep.commit_copy())
    }

    fn handle_committed(
        &mut self,
        result: std::result::Result<std::path::PathBuf, super::store::StoreError>,
    ) -> Result<()> {
        match self.role_mut() {
            Some(ep) => ep.handle_committed(result),
            None => Err(super::endpoint::unexpected(self, "a commit result".into())),
        }
    }

    fn handle_write_done(&mut self, index: u32) -> Result<()> {
        match self.role_mut() {
            Some(ep) => ep.handle_write_done(index),
            None => Err(super::endpoint::unexpected(
                self,
                format!("completion of chunk {index}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_transfer::hash::hash_bytes;
    use crate::file_transfer::wire::{FileOffer, HashAlg};

    #[test]
    fn a_draining_service_refuses_new_transfers_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let flag = Arc::new(AtomicBool::new(false));
        let mut s = Server::new(Arc::new(Config::new(dir.path()))).with_drain_flag(flag.clone());
        let offer = Msg::Offer(FileOffer {
            name: "f".into(),
            len: 3,
            digest: hash_bytes(HashAlg::Sha256, b"abc"),
            overwrite: false,
        });
        s.handle_msg(offer.clone()).unwrap();
        assert!(matches!(s.poll_output(), Some(Output::GrantWindow { .. })));
        // The transfer under way is not disturbed; the next one is refused.
        flag.store(true, Ordering::Relaxed);
        s.handle_window(RemoteWindow {
            addr: 0,
            len: 3,
            rkey: 1,
        })
        .unwrap();
        assert!(matches!(
            s.poll_output(),
            Some(Output::Send(Msg::Grant { window: Some(_) }))
        ));
        let mut s = Server::new(Arc::new(Config::new(dir.path()))).with_drain_flag(flag);
        for msg in [
            offer,
            Msg::Fetch {
                name: "f".into(),
                alg: HashAlg::Sha256,
            },
        ] {
            s.handle_msg(msg).unwrap();
            assert_eq!(
                s.poll_output(),
                Some(Output::Send(Msg::Reject {
                    reason: RejectReason::ShuttingDown
                }))
            );
            assert_eq!(
                s.poll_output(),
                Some(Output::Finished(Outcome::Rejected(
                    RejectReason::ShuttingDown
                )))
            );
        }
        assert!(RejectReason::ShuttingDown
            .to_string()
            .contains("shutting down"));
    }

    #[test]
    fn a_stat_answers_what_a_fetch_would_offer_and_moves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"abc").unwrap();
        std::fs::write(dir.path().join(".hidden"), b"abc").unwrap();
        let config = Arc::new(Config {
            public_fetch: true,
            ..Config::new(dir.path())
        });
        let mut s = Server::new(config);
        let stat = |name: &str| Msg::Stat {
            name: name.into(),
            alg: HashAlg::Sha256,
        };
        s.handle_msg(stat("f")).unwrap();
        assert_eq!(s.poll_output(), Some(Output::Prepare));
        assert!(!s.is_finished(), "hashing");
        let job = s.take_prepare().unwrap();
        s.handle_prepared(job.run()).unwrap();
        let digest = hash_bytes(HashAlg::Sha256, b"abc");
        assert_eq!(
            s.poll_output(),
            Some(Output::Send(Msg::Held { len: 3, digest }))
        );
        assert_eq!(
            s.poll_output(),
            Some(Output::Finished(Outcome::Held { len: 3, digest }))
        );
        assert_eq!(s.poll_output(), None, "no offer, no window");
        assert!(s.is_finished());
        // A missing file, and a hidden one, are refused as a fetch of them would be.
        s.handle_msg(stat("missing")).unwrap();
        assert_eq!(s.poll_output(), Some(Output::Prepare));
        let job = s.take_prepare().unwrap();
        s.handle_prepared(job.run()).unwrap();
        assert_eq!(
            s.poll_output(),
            Some(Output::Send(Msg::Reject {
                reason: RejectReason::NotFound
            }))
        );
        assert!(matches!(
            s.poll_output(),
            Some(Output::Finished(Outcome::Rejected(_)))
        ));
        s.handle_msg(stat(".hidden")).unwrap();
        assert_eq!(s.poll_output(), Some(Output::Prepare));
        let job = s.take_prepare().unwrap();
        s.handle_prepared(job.run()).unwrap();
        assert!(matches!(
            s.poll_output(),
            Some(Output::Send(Msg::Reject { .. }))
        ));
        // After a stat, the connection takes the next request.
        assert!(s.poll_output().is_some());
        s.handle_msg(Msg::Fetch {
            name: "f".into(),
            alg: HashAlg::Sha256,
        })
        .unwrap();
        assert_eq!(s.poll_output(), Some(Output::Prepare));
    }
}
