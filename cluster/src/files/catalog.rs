//! The catalog in etcd: one key per file, created once by a transaction, changed by a
//! repair only under the file's lock and only if nobody changed it since it was read.
//!
//! Choices, as etcd-based systems make them:
//! - create-if-absent: `Txn(create_revision(key) == 0) then put else get`, so of two
//!   clients racing for a name exactly one creates it, and the other reads the winner;
//! - repairs lock the name with etcd's lock service, under a lease that is kept alive
//!   while the copy runs (a repairer that dies lets go when its lease lapses);
//! - fencing by revision: a repair's update compares the record's `mod_revision` with
//!   the one it read and that its lock key still exists, so a repairer whose lease
//!   lapsed mid-copy cannot overwrite what the next one wrote.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, GetOptions, LockOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use tokio::sync::OnceCell;

use super::record::{file_key, files_prefix, repair_lock, FileRecord};
use crate::etcd::{EtcdConfig, Members};
use crate::record::check_name;
use crate::{Error, Result};

/// How [`Catalog::create`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// This call created the name.
    New,
    /// The name existed already, with this record (the race's winner, or an older file).
    Exists(FileRecord),
}

/// How [`Catalog::add_copy`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddedCopy {
    /// The first copy: this call created the record.
    New,
    /// The node was added to the file's record.
    Added,
    /// The record listed the node already.
    Listed,
    /// The name is recorded with other bytes; nothing changed.
    Taken(FileRecord),
    /// The owner's new bytes replaced the record's (an overwrite,
    /// [`Catalog::add_version`]): the record now names this node alone.
    Replaced,
}

/// What [`Catalog::add`] may do besides adding a node to a record of the same bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Create the record when there is none (an upload).
    Create,
    /// Nothing more (a replicator's copy).
    Fill,
    /// Create it, or replace a record of other bytes that names the same owner (the
    /// owner's overwrite).
    Version,
}

/// How [`Catalog::remove`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removed {
    /// This call removed the record.
    Removed,
    /// There was no record.
    Absent,
    /// The record names another owner; nothing changed.
    NotOwner(FileRecord),
}

/// A file's record and the etcd revision it was last written at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The file's name.
    pub name: String,
    /// Its record.
    pub record: FileRecord,
    /// The revision of its last write (what a repair's update is fenced by).
    pub mod_revision: i64,
}

/// The files of one cluster in etcd.
pub struct Catalog {
    etcd: EtcdConfig,
    cluster: String,
    members: OnceCell<Members>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog")
            .field("cluster", &self.cluster)
            .field("etcd", &self.etcd.endpoints)
            .finish()
    }
}

/// A held repair lock: its key exists while the lock is held.
#[derive(Debug)]
pub struct RepairLock {
    key: Vec<u8>,
    lease: i64,
    keep_alive: tokio::task::JoinHandle<()>,
}

impl Catalog {
    /// The catalog of `cluster`.
    ///
    /// # Errors
    ///
    /// A cluster name that would break the key layout; no endpoint.
    pub fn new(etcd: EtcdConfig, cluster: &str) -> Result<Catalog> {
        check_name("cluster", cluster)?;
        if etcd.endpoints.is_empty() {
            return Err(Error::NoEndpoints);
        }
        Ok(Catalog {
            etcd,
            cluster: cluster.to_owned(),
            members: OnceCell::new(),
        })
    }

    async fn members(&self) -> Result<&Members> {
        self.members.get_or_try_init(|| self.etcd.connect()).await
    }

    /// Records `name` unless it exists; then returns what exists.
    ///
    /// # Errors
    ///
    /// etcd unreachable or slow; a bad name; an unreadable existing record.
    pub async fn create(&self, name: &str, record: &FileRecord) -> Result<Created> {
        check_name("file", name)?;
        let key = file_key(&self.cluster, name);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.as_str(), record.to_json(), None)])
            .or_else([TxnOp::get(key.as_str(), None)]);
        // Made again on the next member after any failure of the member's, even one
        // that may come after etcd applied it (a broken connection, no answer in time):
        // the compare makes a second application harmless. If the first one created the
        // name, the second finds this very record, and `ClusterFiles::put` takes a
        // record with the same bytes as created.
        let answer = self.txn("file create txn", txn).await?;
        if answer.succeeded() {
            return Ok(Created::New);
        }
        for op in answer.op_responses() {
            if let TxnOpResponse::Get(get) = op {
                if let Some(kv) = get.kvs().first() {
                    return Ok(Created::Exists(FileRecord::from_json(&key, kv.value())?));
                }
            }
        }
        // Deleted between the compare and the get of the same transaction cannot
        // happen (a transaction is atomic); an empty answer is etcd's bug.
        Err(Error::BadRecord {
            key,
            reason: "create failed but the key is absent".into(),
        })
    }

    /// Records that `node` holds a verified copy of `name` (`copy`'s bytes): creates
    /// the record if there is none, with `copy`'s owner, else adds `node` to a record of
    /// the same bytes (its owner stays), each by a transaction fenced by what was read.
    /// What a server's [`CatalogRecorder`](super::CatalogRecorder) calls before its
    /// client hears GOOD, so that only servers write the catalog.
    ///
    /// # Errors
    ///
    /// etcd unreachable or slow; a bad name; an unreadable record; the record changed
    /// under every one of a few tries.
    pub async fn add_copy(&self, name: &str, copy: &FileRecord, node: &str) -> Result<AddedCopy> {
        self.add(name, copy, node, Mode::Create).await
    }

    /// [`add_copy`](Self::add_copy) for an overwrite: a record of other bytes is
    /// replaced by `copy`'s, naming `node` alone, if both name the same owner (an
    /// identity: a file nobody owns is never overwritten), fenced by the revision read.
    /// The nodes that held the old bytes drop out of the record, and each of the
    /// owner's other new replicas adds itself as its copy lands.
    ///
    /// # Errors
    ///
    /// As [`add_copy`](Self::add_copy).
    pub async fn add_version(
        &self,
        name: &str,
        copy: &FileRecord,
        node: &str,
    ) -> Result<AddedCopy> {
        self.add(name, copy, node, Mode::Version).await
    }

    /// [`add_copy`](Self::add_copy) for a copy that fills a gap in an existing record
    /// (a replicator's, made for the file's owner): `None` when there is no record, which
    /// is left absent, so a copy racing its owner's delete cannot bring the file back.
    ///
    /// # Errors
    ///
    /// As [`add_copy`](Self::add_copy).
    pub async fn add_replica(
        &self,
        name: &str,
        copy: &FileRecord,
        node: &str,
    ) -> Result<Option<AddedCopy>> {
        match self.add(name, copy, node, Mode::Fill).await {
            Ok(AddedCopy::New) => Ok(None),
            other => other.map(Some),
        }
    }

    /// Adds `node`'s copy as `mode` allows (with [`Mode::Fill`], `New` stands for "no
    /// record": nothing was written).
    async fn add(
        &self,
        name: &str,
        copy: &FileRecord,
        node: &str,
        mode: Mode,
    ) -> Result<AddedCopy> {
        check_name("file", name)?;
        let key = file_key(&self.cluster, name);
        // Each round reads, then writes only if the key is as read: racing servers
        // (the R replicas of one upload finish together) each win a round in turn.
        for _ in 0..16 {
            let fence = match self.get(name).await? {
                None if mode == Mode::Fill => return Ok(AddedCopy::New),
                None => {
                    let mut first = copy.clone();
                    first.nodes = vec![node.to_owned()];
                    match self.create(name, &first).await? {
                        Created::New => return Ok(AddedCopy::New),
                        Created::Exists(_) => continue,
                    }
                }
                Some(stored)
                    if !stored.record.same_bytes(copy)
                        && mode == Mode::Version
                        && stored.record.owner.is_some()
                        && stored.record.owner == copy.owner =>
                {
                    let mut version = copy.clone();
                    version.nodes = vec![node.to_owned()];
                    if self.put_fenced(&key, &stored, &version).await? {
                        return Ok(AddedCopy::Replaced);
                    }
                    continue;
                }
                Some(stored) if !stored.record.same_bytes(copy) => {
                    return Ok(AddedCopy::Taken(stored.record))
                }
                Some(stored) if stored.record.nodes.iter().any(|n| n == node) => {
                    return Ok(AddedCopy::Listed)
                }
                Some(stored) => stored,
            };
            let mut record = fence.record.clone();
            record.nodes.push(node.to_owned());
            if self.put_fenced(&key, &fence, &record).await? {
                return Ok(AddedCopy::Added);
            }
        }
        Err(Error::BadRecord {
            key,
            reason: "changed under every one of 16 tries to add a copy".into(),
        })
    }

    /// Writes `record` under `key` if the key is as `fence` was read; whether it was.
    async fn put_fenced(&self, key: &str, fence: &Stored, record: &FileRecord) -> Result<bool> {
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key,
                CompareOp::Equal,
                fence.mod_revision,
            )])
            .and_then([TxnOp::put(key, record.to_json(), None)]);
        // Made again after a member's failure: the compare makes a second application
        // impossible, and the caller's next round reads the outcome.
        Ok(self.txn("file add copy txn", txn).await?.succeeded())
    }

    /// Removes `name`'s record at its owner's delete, if the record names `owner` or
    /// none, fenced by the revision read (a repair's update after it finds no record
    /// and fails, and a record changed meanwhile is read again).
    ///
    /// # Errors
    ///
    /// etcd unreachable or slow; a bad name; an unreadable record; the record changed
    /// under every one of a few tries.
    pub async fn remove(&self, name: &str, owner: Option<&str>) -> Result<Removed> {
        check_name("file", name)?;
        let key = file_key(&self.cluster, name);
        for _ in 0..16 {
            let Some(stored) = self.get(name).await? else {
                return Ok(Removed::Absent);
            };
            if stored.record.owner.is_some() && stored.record.owner.as_deref() != owner {
                return Ok(Removed::NotOwner(stored.record));
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.as_str(),
                    CompareOp::Equal,
                    stored.mod_revision,
                )])
                .and_then([TxnOp::delete(key.as_str(), None)]);
            // Made again after a member's failure: the next round reads the outcome.
            if self.txn("file remove txn", txn).await?.succeeded() {
                return Ok(Removed::Removed);
            }
        }
        Err(Error::BadRecord {
            key,
            reason: "changed under every one of 16 tries to remove it".into(),
        })
    }

    /// A transaction whose compares make a second application harmless: made again on
    /// the next member after a failure of the member's (see `Members::idempotent`).
    async fn txn(&self, op: &'static str, txn: Txn) -> Result<TxnResponse> {
        self.members()
            .await?
            .idempotent(op, |mut client| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            })
            .await
    }

    /// The record of `name`, if any.
    ///
    /// # Errors
    ///
    /// etcd unreachable or slow; an unreadable record.
    pub async fn get(&self, name: &str) -> Result<Option<Stored>> {
        check_name("file", name)?;
        let key = file_key(&self.cluster, name);
        let answer = self
            .members()
            .await?
            .idempotent("file get", |mut client| {
                let key = key.clone();
                async move { client.get(key, None).await }
            })
            .await?;
        match answer.kvs().first() {
            None => Ok(None),
            Some(kv) => Ok(Some(Stored {
                name: name.to_owned(),
                record: FileRecord::from_json(&key, kv.value())?,
                mod_revision: kv.mod_revision(),
            })),
        }
    }

    /// Every file; unreadable records are left out (and logged).
    ///
    /// # Errors
    ///
    /// etcd unreachable or slow.
    pub async fn list(&self) -> Result<Vec<Stored>> {
        let prefix = files_prefix(&self.cluster);
        let answer = self
            .members()
            .await?
            .idempotent("file list", |mut client| {
                let prefix = prefix.clone();
                async move {
                    client
                        .get(prefix, Some(GetOptions::new().with_prefix()))
                        .await
                }
            })
            .await?;
        let mut files = Vec::new();
        for kv in answer.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let name = key.strip_prefix(&prefix).unwrap_or(&key).to_owned();
            match FileRecord::from_json(&key, kv.value()) {
                Ok(record) => files.push(Stored {
                    name,
                    record,
                    mod_revision: kv.mod_revision(),
                }),
                Err(err) => tracing::warn!(%err, "cluster: ignoring a file record"),
            }
        }
        Ok(files)
    }

    /// Takes the repair lock of `name` under a lease of `ttl`, kept alive until
    /// [`release`](Self::release). `None` when another holder kept it for the whole
    /// request timeout.
    ///
    /// # Errors
    ///
    /// etcd unreachable or slow to grant the lease.
    pub async fn lock(&self, name: &str, ttl: Duration) -> Result<Option<RepairLock>> {
        check_name("file", name)?;
        let members = self.members().await?;
        let ttl_secs = ttl.as_secs().clamp(2, i64::MAX as u64) as i64;
        // Not made again once it may have been sent: a second grant is a second lease.
        let lease = members
            .unrepeated("repair lease grant", |mut client| async move {
                client.lease_grant(ttl_secs, None).await
            })
            .await?
            .id();
        // Nor the lock: a second request would queue a second waiter under the lease.
        let (at, mut client) = members.current();
        let lock = self
            .etcd
            .call(
                "repair lock",
                client.lock(
                    repair_lock(&self.cluster, name),
                    Some(LockOptions::new().with_lease(lease)),
                ),
            )
            .await;
        let key = match lock {
            Ok(answer) => answer.key().to_vec(),
            Err(Error::Timeout { .. }) => {
                // Held by another (a member without its leader refuses at once, the
                // lock requiring one); the waiting request dies with the lease.
                self.revoke(lease).await;
                return Ok(None);
            }
            Err(err) => {
                members.leave(at, &err);
                self.revoke(lease).await;
                return Err(err);
            }
        };
        let keep_alive = tokio::spawn(keep_alive(client, lease, ttl / 3));
        Ok(Some(RepairLock {
            key,
            lease,
            keep_alive,
        }))
    }

    /// Replaces `stored`'s record with `record` if it is unchanged since it was read
    /// and `lock` is still held. Returns whether it was replaced.
    ///
    /// # Errors
    ///
    /// etcd unreachable or slow.
    pub async fn replace(
        &self,
        stored: &Stored,
        record: &FileRecord,
        lock: &RepairLock,
    ) -> Result<bool> {
        let key = file_key(&self.cluster, &stored.name);
        let txn = Txn::new()
            .when([
                Compare::mod_revision(key.as_str(), CompareOp::Equal, stored.mod_revision),
                Compare::create_revision(lock.key.clone(), CompareOp::Greater, 0),
            ])
            .and_then([TxnOp::put(key.as_str(), record.to_json(), None)]);
        // Made again after a failure of the member's: the compare on the revision makes a
        // second application impossible. One that finds the record changed may follow
        // a first that went through unanswered: the record as written tells.
        let answer = self.txn("file replace txn", txn).await?;
        if answer.succeeded() {
            return Ok(true);
        }
        Ok(self
            .get(&stored.name)
            .await?
            .is_some_and(|now| now.record == *record))
    }

    /// Lets go of a repair lock (revoking its lease deletes its key).
    pub async fn release(&self, lock: RepairLock) {
        lock.keep_alive.abort();
        self.revoke(lock.lease).await;
    }

    /// Revokes a repair lease; made again after a member's failure (a second revoke
    /// finds the lease gone). On failure the lease lapses at its TTL.
    async fn revoke(&self, lease: i64) {
        let revoked = match self.members().await {
            Ok(members) => {
                members
                    .idempotent("repair lease revoke", |mut client| async move {
                        client.lease_revoke(lease).await
                    })
                    .await
            }
            Err(err) => Err(err),
        };
        if let Err(err) = revoked {
            tracing::warn!(%err, "cluster: the repair lock lapses with its lease");
        }
    }
}

/// Keeps a repair lock's lease alive until aborted.
async fn keep_alive(mut client: Client, lease: i64, every: Duration) {
    let Ok((mut keeper, mut answers)) = client.lease_keep_alive(lease).await else {
        return;
    };
    loop {
        tokio::time::sleep(every.max(Duration::from_millis(500))).await;
        if keeper.keep_alive().await.is_err() {
            return;
        }
        if !matches!(answers.message().await, Ok(Some(_))) {
            return;
        }
    }
}
