//! Per-client shares of the receiving side: how many uploads one client may run at
//! once and how many bytes it may hold reserved (admitted, not yet stored), so that one
//! client cannot take the disk or the service from the others.
//!
//! A server connection carries one transfer at a time, so a per-connection count would
//! always be one: a client that wants more opens more connections. The share is
//! therefore kept per *client*, by peer IP address (connections without an address,
//! such as out-of-band ones, count each on its own). The ledger is consulted once per
//! offer, on the control path, never per chunk.
//!
//! The ledger also counts the bytes admitted on file systems that cannot reserve space
//! (no `fallocate`): the free-space check of a later offer subtracts them, since the
//! file system does not know about them yet.

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

#[derive(Debug, Default)]
struct Use {
    uploads: u32,
    bytes: u64,
}

#[derive(Debug, Default)]
struct State {
    clients: HashMap<String, Use>,
    /// Admitted bytes the file system did not reserve (no `fallocate`).
    unbacked: u64,
}

/// The service's ledger of admitted uploads. Cloning shares it.
#[derive(Debug, Clone)]
pub struct Ledger {
    quota: ClientQuota,
    state: Arc<Mutex<State>>,
}

impl Ledger {
    /// An empty ledger enforcing `quota`.
    pub fn new(quota: ClientQuota) -> Ledger {
        Ledger {
            quota,
            state: Arc::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain counters behind: keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits an upload of `len` bytes for `client`, or says which share it would
    /// exceed. The returned [`Admission`] gives the share back when dropped.
    ///
    /// # Errors
    ///
    /// [`RejectReason::Quota`] naming the limit.
    pub fn admit(&self, client: &str, len: u64) -> Result<Admission, RejectReason> {
        let mut state = self.state();
        let used = state.clients.entry(client.to_owned()).or_default();
        let uploads = used.uploads + 1;
        if uploads > self.quota.uploads {
            let limit = self.quota.uploads;
            drop_if_idle(&mut state, client);
            return Err(RejectReason::Quota {
                what: "uploads at once".into(),
                limit: u64::from(limit),
                would_use: u64::from(uploads),
            });
        }
        let bytes = used.bytes.saturating_add(len);
        if bytes > self.quota.reserved_bytes {
            let limit = self.quota.reserved_bytes;
            drop_if_idle(&mut state, client);
            return Err(RejectReason::Quota {
                what: "bytes reserved and not yet stored".into(),
                limit,
                would_use: bytes,
            });
        }
        used.uploads = uploads;
        used.bytes = bytes;
        Ok(Admission {
            ledger: self.clone(),
            client: client.to_owned(),
            len,
            unbacked: false,
        })
    }

    /// Admitted bytes that no `fallocate` reserved: free space a file system reports
    /// that is already promised.
    pub fn unbacked(&self) -> u64 {
        self.state().unbacked
    }

    /// Uploads admitted now, over every client.
    pub fn uploads(&self) -> u64 {
        self.state()
            .clients
            .values()
            .map(|u| u64::from(u.uploads))
            .sum()
    }

    /// Uploads and bytes `client` has admitted now (for tests and logs).
    pub fn usage(&self, client: &str) -> (u32, u64) {
        self.state()
            .clients
            .get(client)
            .map_or((0, 0), |u| (u.uploads, u.bytes))
    }
}

fn drop_if_idle(state: &mut State, client: &str) {
    if state
        .clients
        .get(client)
        .is_some_and(|u| u.uploads == 0 && u.bytes == 0)
    {
        state.clients.remove(client);
    }
}

/// One admitted upload's share of its client's quota; given back on drop (the upload
/// was stored, refused, aborted or its connection closed).
#[derive(Debug)]
pub struct Admission {
    ledger: Ledger,
    client: String,
    len: u64,
    unbacked: bool,
}

impl Admission {
    /// The file system could not reserve this upload's bytes: count them as promised
    /// until the admission ends.
    pub fn mark_unbacked(&mut self) {
        if !self.unbacked {
            self.unbacked = true;
            self.ledger.state().unbacked += self.len;
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut state = self.ledger.state();
        if self.unbacked {
            state.unbacked -= self.len;
        }
        if let Some(used) = state.clients.get_mut(&self.client) {
            used.uploads -= 1;
            used.bytes -= self.len;
        }
        drop_if_idle(&mut state, &self.client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploads_and_bytes_are_limited_per_client_and_given_back_on_drop() {
        let ledger = Ledger::new(ClientQuota {
            uploads: 2,
            reserved_bytes: 100,
        });
        let a1 = ledger.admit("a", 40).unwrap();
        let a2 = ledger.admit("a", 40).unwrap();
        match ledger.admit("a", 1).unwrap_err() {
            RejectReason::Quota {
                limit, would_use, ..
            } => assert_eq!((limit, would_use), (2, 3)),
            other => panic!("{other:?}"),
        }
        // Another client is not affected.
        let b = ledger.admit("b", 100).unwrap();
        drop(a2);
        match ledger.admit("a", 61).unwrap_err() {
            RejectReason::Quota {
                limit, would_use, ..
            } => assert_eq!((limit, would_use), (100, 101)),
            other => panic!("{other:?}"),
        }
        let a3 = ledger.admit("a", 60).unwrap();
        assert_eq!(ledger.usage("a"), (2, 100));
        drop((a1, a3, b));
        assert_eq!(ledger.usage("a"), (0, 0));
        assert!(
            ledger.state().clients.is_empty(),
            "idle clients are forgotten"
        );
    }

    #[test]
    fn unbacked_bytes_are_counted_until_the_admission_ends() {
        let ledger = Ledger::new(ClientQuota::default());
        let mut a = ledger.admit("a", 7).unwrap();
        a.mark_unbacked();
        a.mark_unbacked();
        assert_eq!(ledger.unbacked(), 7);
        drop(a);
        assert_eq!(ledger.unbacked(), 0);
    }
}
