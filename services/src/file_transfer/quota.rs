//! Per-client shares of the receiving side: how many uploads one client may run at
//! once and how many bytes it may hold reserved (admitted, not yet stored), so that one
//! client cannot take the disk or the service from the others.
//!
//! A server connection carries one transfer at a time, so a per-connection count would
//! always be one: a client that wants more opens more connections. The share is
//! therefore kept per *client*, by peer IP address (connections without an address,
//! such as out-of-band ones, count each on its own).
//!
//! The ledger also keeps the space bookkeeping: bytes admitted and not (yet) reserved
//! on disk by `fallocate` are *promised*, and the free-space check of a later offer
//! subtracts them, since the file system does not know about them yet. An admission is
//! promised from the moment it is granted until its receiver says `fallocate` backed
//! it; on file systems without `fallocate` it stays promised until it ends.
//!
//! [`Ledger`] is the plain state machine (no locking, no I/O); the service's
//! [`QuotaOwner`](super::owner::QuotaOwner) actor owns the one instance and sessions
//! ask it by message, once per offer, never per chunk.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::wire::RejectReason;

/// The limits, per client (see [`Config::with_client_quota`](super::Config::with_client_quota)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientQuota {
    /// Uploads one client may have admitted at once (over all its connections).
    pub uploads: u32,
    /// Bytes one client may have admitted and not yet stored, over all its uploads.
    pub reserved_bytes: u64,
}

impl Default for ClientQuota {
    /// 64 uploads and 64 GiB at once per client: a client host with many users (or
    /// a test driving 50 connections) is served, one connection-hopping client cannot
    /// take thousands of slots or the whole disk.
    fn default() -> Self {
        ClientQuota {
            uploads: 64,
            reserved_bytes: 64 << 30,
        }
    }
}

/// Names one admitted upload in its [`Ledger`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AdmissionId(u64);

#[derive(Debug, Default)]
struct Use {
    uploads: u32,
    bytes: u64,
}

#[derive(Debug)]
struct Admitted {
    client: String,
    len: u64,
    /// Not reserved on disk (yet): counted in [`Ledger::promised`].
    promised: bool,
}

/// The service's ledger of admitted uploads: a plain state machine, owned by one actor
/// per service.
#[derive(Debug)]
pub struct Ledger {
    quota: ClientQuota,
    /// Uploads admitted at once over every client (see [`Ledger::with_max_uploads`]).
    max_uploads: u64,
    clients: HashMap<String, Use>,
    admitted: HashMap<AdmissionId, Admitted>,
    /// Admitted bytes no `fallocate` reserved (yet).
    promised: u64,
    next: u64,
}

impl Ledger {
    /// An empty ledger enforcing `quota`.
    pub fn new(quota: ClientQuota) -> Ledger {
        Ledger {
            quota,
            max_uploads: u64::MAX,
            clients: HashMap::new(),
            admitted: HashMap::new(),
            promised: 0,
            next: 0,
        }
    }

    /// Admits at most `max` uploads at once over every client: each admitted upload
    /// stages a temporary file (an open descriptor, disk reserved by `fallocate`, a
    /// receiver's window), and the per-client share alone let many addresses stage
    /// without bound. Past it an offer is refused with [`RejectReason::ServerFull`].
    #[must_use]
    pub fn with_max_uploads(mut self, max: u64) -> Ledger {
        self.max_uploads = max;
        self
    }

    /// Admits an upload of `len` bytes for `client` when the file system reports `free`
    /// bytes available, or says which share or room it would exceed. The bytes count as
    /// promised until [`handle_backed`](Self::handle_backed); the share comes back with
    /// [`handle_release`](Self::handle_release).
    ///
    /// # Errors
    ///
    /// [`RejectReason::ServerFull`] when the service has its
    /// [`max_uploads`](Self::with_max_uploads) admitted; [`RejectReason::Quota`] naming
    /// the client's limit; [`RejectReason::NoSpace`] when `free` less what is promised
    /// already cannot hold `len`.
    pub fn handle_admit(
        &mut self,
        client: &str,
        len: u64,
        free: u64,
    ) -> Result<AdmissionId, RejectReason> {
        if self.uploads() >= self.max_uploads {
            return Err(RejectReason::ServerFull {
                what: "uploads at once on this server".into(),
                limit: self.max_uploads,
            });
        }
        let (uploads, bytes) = self.usage(client);
        let uploads = uploads.saturating_add(1);
        if uploads > self.quota.uploads {
            return Err(RejectReason::Quota {
                what: "uploads at once".into(),
                limit: u64::from(self.quota.uploads),
                would_use: u64::from(uploads),
            });
        }
        let bytes = bytes.saturating_add(len);
        if bytes > self.quota.reserved_bytes {
            return Err(RejectReason::Quota {
                what: "bytes reserved and not yet stored".into(),
                limit: self.quota.reserved_bytes,
                would_use: bytes,
            });
        }
        let available = free.saturating_sub(self.promised);
        if available < len {
            return Err(RejectReason::NoSpace {
                needed: len,
                available,
            });
        }
        let used = self.clients.entry(client.to_owned()).or_default();
        used.uploads = uploads;
        used.bytes = bytes;
        self.promised += len;
        let id = AdmissionId(self.next);
        self.next += 1;
        self.admitted.insert(
            id,
            Admitted {
                client: client.to_owned(),
                len,
                promised: true,
            },
        );
        Ok(id)
    }

    /// The upload's bytes are reserved on disk: the file system's free space counts
    /// them from now on, so they are no longer promised.
    pub fn handle_backed(&mut self, id: AdmissionId) {
        if let Some(a) = self.admitted.get_mut(&id) {
            if a.promised {
                a.promised = false;
                self.promised -= a.len;
            }
        }
    }

    /// The upload ended (stored, refused, aborted, or its connection closed): its share
    /// comes back. Unknown ids are ignored (released twice).
    pub fn handle_release(&mut self, id: AdmissionId) {
        let Some(a) = self.admitted.remove(&id) else {
            return;
        };
        if a.promised {
            self.promised -= a.len;
        }
        if let Some(used) = self.clients.get_mut(&a.client) {
            used.uploads -= 1;
            used.bytes -= a.len;
            if used.uploads == 0 {
                // Idle clients are forgotten.
                self.clients.remove(&a.client);
            }
        }
    }

    /// Admitted bytes that no `fallocate` reserved: free space a file system reports
    /// that is already promised.
    pub fn promised(&self) -> u64 {
        self.promised
    }

    /// Uploads admitted now, over every client.
    pub fn uploads(&self) -> u64 {
        self.admitted.len() as u64
    }

    /// Uploads and bytes `client` has admitted now.
    pub fn usage(&self, client: &str) -> (u32, u64) {
        self.clients
            .get(client)
            .map_or((0, 0), |u| (u.uploads, u.bytes))
    }

    /// Clients with an upload admitted now.
    pub fn clients(&self) -> usize {
        self.clients.len()
    }
}

/// How many `Fetch` preparations (whole-file hashes) each client may have running at
/// once, over all its connections: a client that opens many connections and fetches
/// large files on each would otherwise fill the blocking pool with reads of the disk.
/// A fetch whose digest is known needs no preparation and takes no permit.
///
/// A shared counter rather than a question to the [`QuotaOwner`](super::QuotaOwner)
/// like an upload's admission: whether a fetch needs hashing is only known once its
/// file is opened and `fstat`ed on the blocking pool, so asking the actor would take a
/// second job and a round trip per fetch, while the count needs nothing the ledger
/// keeps. The job takes a [`PreparationPermit`] right before hashing and drops it when
/// done (or cancelled), under a mutex held for a map update.
#[derive(Debug)]
pub struct PreparationLimit {
    limit: u32,
    running: Mutex<HashMap<String, u32>>,
}

impl PreparationLimit {
    /// At most `limit` preparations per client at once.
    pub fn new(limit: u32) -> Arc<PreparationLimit> {
        Arc::new(PreparationLimit {
            limit,
            running: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        // Every change is one call: a panic elsewhere leaves the map consistent.
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A permit for one more preparation by `client`, or the refusal to send.
    ///
    /// # Errors
    ///
    /// [`RejectReason::Quota`] when `client` has `limit` preparations running.
    pub fn try_acquire(self: &Arc<Self>, client: &str) -> Result<PreparationPermit, RejectReason> {
        let mut running = self.lock();
        let now = running.get(client).copied().unwrap_or(0);
        if now >= self.limit {
            return Err(RejectReason::Quota {
                what: "fetches being prepared at once".into(),
                limit: u64::from(self.limit),
                would_use: u64::from(now) + 1,
            });
        }
        running.insert(client.to_owned(), now + 1);
        Ok(PreparationPermit {
            owner: Arc::clone(self),
            client: client.to_owned(),
        })
    }

    /// Preparations `client` has running now.
    pub fn running(&self, client: &str) -> u32 {
        self.lock().get(client).copied().unwrap_or(0)
    }
}

/// One running preparation: given back when dropped.
#[derive(Debug)]
pub struct PreparationPermit {
    owner: Arc<PreparationLimit>,
    client: String,
}

impl Drop for PreparationPermit {
    fn drop(&mut self) {
        let mut running = self.owner.lock();
        if let Some(n) = running.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                // Idle clients are forgotten.
                running.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOTS: u64 = u64::MAX;

    /// Issue 45: many clients, each within its share, are bounded together.
    #[test]
    fn uploads_are_limited_over_every_client_and_given_back_on_release() {
        let mut ledger = Ledger::new(ClientQuota::default()).with_max_uploads(2);
        let a = ledger.handle_admit("10.0.0.1", 1, LOTS).unwrap();
        let _b = ledger.handle_admit("10.0.0.2", 1, LOTS).unwrap();
        assert_eq!(
            ledger.handle_admit("10.0.0.3", 1, LOTS),
            Err(RejectReason::ServerFull {
                what: "uploads at once on this server".into(),
                limit: 2,
            })
        );
        assert_eq!(ledger.usage("10.0.0.3"), (0, 0), "nothing counted for it");
        ledger.handle_release(a);
        ledger
            .handle_admit("10.0.0.3", 1, LOTS)
            .expect("admitted once another upload ended");
    }

    #[test]
    fn uploads_and_bytes_are_limited_per_client_and_given_back_on_release() {
        let mut ledger = Ledger::new(ClientQuota {
            uploads: 2,
            reserved_bytes: 100,
        });
        let a1 = ledger.handle_admit("a", 40, LOTS).unwrap();
        let a2 = ledger.handle_admit("a", 40, LOTS).unwrap();
        match ledger.handle_admit("a", 1, LOTS).unwrap_err() {
            RejectReason::Quota {
                limit, would_use, ..
            } => assert_eq!((limit, would_use), (2, 3)),
            other => panic!("{other:?}"),
        }
        // Another client is not affected.
        let b = ledger.handle_admit("b", 100, LOTS).unwrap();
        ledger.handle_release(a2);
        match ledger.handle_admit("a", 61, LOTS).unwrap_err() {
            RejectReason::Quota {
                limit, would_use, ..
            } => assert_eq!((limit, would_use), (100, 101)),
            other => panic!("{other:?}"),
        }
        let a3 = ledger.handle_admit("a", 60, LOTS).unwrap();
        assert_eq!(ledger.usage("a"), (2, 100));
        assert_eq!(ledger.uploads(), 3);
        for id in [a1, a3, b] {
            ledger.handle_release(id);
        }
        // Released twice: nothing changes.
        ledger.handle_release(a1);
        assert_eq!(ledger.usage("a"), (0, 0));
        assert_eq!(
            (ledger.clients(), ledger.uploads()),
            (0, 0),
            "idle clients are forgotten"
        );
    }

    #[test]
    fn promised_bytes_count_against_free_space_until_backed_or_released() {
        let mut ledger = Ledger::new(ClientQuota::default());
        let a = ledger.handle_admit("a", 70, 100).unwrap();
        assert_eq!(ledger.promised(), 70);
        // The file system still says 100 free, but 70 of it is promised.
        assert_eq!(
            ledger.handle_admit("b", 40, 100),
            Err(RejectReason::NoSpace {
                needed: 40,
                available: 30
            })
        );
        // `fallocate` reserved it: the file system's 30 free is the truth now.
        ledger.handle_backed(a);
        ledger.handle_backed(a);
        assert_eq!(ledger.promised(), 0);
        let b = ledger.handle_admit("b", 30, 30).unwrap();
        ledger.handle_release(b);
        ledger.handle_release(a);
        assert_eq!((ledger.promised(), ledger.uploads()), (0, 0));
        // Never backed (no fallocate): promised until it ends.
        let c = ledger.handle_admit("c", 7, 100).unwrap();
        assert_eq!(ledger.promised(), 7);
        ledger.handle_release(c);
        assert_eq!(ledger.promised(), 0);
    }

    #[test]
    fn a_refused_offer_leaves_no_trace() {
        let mut ledger = Ledger::new(ClientQuota {
            uploads: 1,
            reserved_bytes: 10,
        });
        assert!(ledger.handle_admit("a", 11, LOTS).is_err());
        assert!(ledger.handle_admit("a", 5, 4).is_err());
        assert_eq!(
            (ledger.clients(), ledger.uploads(), ledger.promised()),
            (0, 0, 0)
        );
    }

    #[test]
    fn fetch_preparations_are_limited_per_client_and_given_back_on_drop() {
        let limit = PreparationLimit::new(2);
        let a1 = limit.try_acquire("a").unwrap();
        let _a2 = limit.try_acquire("a").unwrap();
        assert_eq!(
            limit.try_acquire("a").unwrap_err(),
            RejectReason::Quota {
                what: "fetches being prepared at once".into(),
                limit: 2,
                would_use: 3,
            }
        );
        // Another client is not affected.
        let b = limit.try_acquire("b").unwrap();
        assert_eq!((limit.running("a"), limit.running("b")), (2, 1));
        drop(a1);
        let _a3 = limit.try_acquire("a").unwrap();
        drop(b);
        assert_eq!(limit.running("b"), 0);
        assert_eq!(limit.lock().len(), 1, "idle clients are forgotten");
    }
}
