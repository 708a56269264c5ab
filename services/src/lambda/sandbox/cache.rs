//! The module cache: compiled modules by BLAKE3 hash, held by the clients that loaded
//! them, each client within its own quota.
//!
//! # Who pays for a cached module
//!
//! A compiled module stays cached while at least one client *holds* it; a client holds
//! what it loaded (a load of bytes already cached is a hold, not a compilation). Each
//! client's holds are bounded ([`Quota`]: modules and bytes), and a client loading past
//! its quota lets go of its own least recently used holds: a module nobody holds any
//! more leaves the cache. A module two clients hold counts fully against each one's
//! quota (either alone would keep it cached, so each pays as if alone, and neither can
//! push it out under the other) but once against the cache's own bounds. So one client
//! can fill only its share, and can never evict another client's module.
//!
//! The cache as a whole is bounded too (count and bytes). Past that bound the loading
//! client again gives up its own least recently used holds; if it has none left, the
//! load is refused ([`CacheTaken`](super::LambdaError::CacheTaken)) rather than taking
//! another client's room: size the cache as connections times the per-client quota to
//! never see it. A client's holds end with it ([`ModuleCache::release`], called when its
//! connection closes).

use std::collections::HashMap;
use std::fmt;

use lru::LruCache;
use serde::{Deserialize, Serialize};
use wasmtime::{InstancePre, ModuleExport};

use super::limits::Host;
use super::{LambdaError, Result};

/// BLAKE3 hash of a module's bytes: the name a client uses to run a loaded module.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ModuleHash([u8; 32]);

impl ModuleHash {
    /// Hashes module bytes.
    pub fn of(bytes: &[u8]) -> Self {
        Self(*blake3::hash(bytes).as_bytes())
    }

    /// Wraps a hash received from elsewhere (e.g. a client's request).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The 32 hash bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for ModuleHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for ModuleHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ModuleHash({self})")
    }
}

/// Who holds cached modules: one id per client (connection), and
/// [`APPLICATION`](ClientId::APPLICATION) for the embedding application's own loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ClientId(pub u64);

impl ClientId {
    /// Loads through [`Sandbox::load`](super::Sandbox::load): the application, whose
    /// quota is the whole cache.
    pub const APPLICATION: ClientId = ClientId(0);
}

/// How much of the cache one client may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Quota {
    pub modules: usize,
    pub bytes: usize,
}

/// A validated, compiled module and what `run` needs to know about it.
#[derive(Clone)]
pub(crate) struct Compiled {
    /// The module with its (empty) imports resolved once, at upload: each invocation
    /// only instantiates it, with no linking or import type checks.
    pub(super) pre: InstancePre<Host>,
    /// The ABI's exports, looked up once by name at upload; an invocation finds them in
    /// its instance by index.
    pub(super) exports: AbiExports,
    /// The memory's declared minimum size, in bytes.
    pub min_memory_bytes: u64,
    /// What it counts against the cache's and each holder's byte bounds: Wasm bytes plus
    /// machine code.
    pub cost: usize,
}

/// Exported linear memory, per the ABI.
pub(super) const EXPORT_MEMORY: &str = "memory";
/// Exported `alloc(len: i32) -> i32`, per the ABI.
pub(super) const EXPORT_ALLOC: &str = "alloc";
/// Exported `run(ptr: i32, len: i32) -> i64`, per the ABI.
pub(super) const EXPORT_RUN: &str = "run";

/// Where the ABI's exports are in a module (see [`Compiled::exports`]).
#[derive(Clone)]
pub(crate) struct AbiExports {
    pub memory: ModuleExport,
    pub alloc: ModuleExport,
    pub run: ModuleExport,
}

struct Entry {
    compiled: Compiled,
    /// Clients holding it; it leaves the cache when the last one lets go.
    holders: Vec<ClientId>,
}

/// One client's holds, least recently used first out.
struct Holds {
    order: LruCache<ModuleHash, ()>,
    bytes: usize,
}

impl Holds {
    fn new() -> Self {
        Holds {
            order: LruCache::unbounded(),
            bytes: 0,
        }
    }
}

/// Compiled modules and who holds them: a plain state machine with no locking of its
/// own. The lambda service's actor owns the service's cache; a [`Sandbox`] used
/// directly by an application keeps its own behind a mutex, each access short (a lookup
/// clones the `Module`, an `Arc` inside).
///
/// [`Sandbox`]: super::Sandbox
pub(crate) struct ModuleCache {
    entries: HashMap<ModuleHash, Entry>,
    clients: HashMap<ClientId, Holds>,
    bytes: usize,
    max_modules: usize,
    max_bytes: usize,
    per_client: Quota,
}

impl ModuleCache {
    pub fn new(max_modules: usize, max_bytes: usize, per_client: Quota) -> Self {
        ModuleCache {
            entries: HashMap::new(),
            clients: HashMap::new(),
            bytes: 0,
            max_modules: max_modules.max(1),
            max_bytes,
            per_client: Quota {
                modules: per_client.modules.max(1),
                bytes: per_client.bytes,
            },
        }
    }

    fn quota(&self, client: ClientId) -> Quota {
        if client == ClientId::APPLICATION {
            Quota {
                modules: self.max_modules,
                bytes: self.max_bytes,
            }
        } else {
            self.per_client
        }
    }

    /// The module, marked as just used by `client` if it holds it.
    pub fn get(&mut self, client: ClientId, hash: &ModuleHash) -> Option<Compiled> {
        let compiled = self.entries.get(hash)?.compiled.clone();
        if let Some(holds) = self.clients.get_mut(&client) {
            holds.order.get(hash);
        }
        Some(compiled)
    }

    pub fn contains(&self, hash: &ModuleHash) -> bool {
        self.entries.contains_key(hash)
    }

    /// `true` if `client` holds the module.
    pub fn holds(&self, client: ClientId, hash: &ModuleHash) -> bool {
        self.clients
            .get(&client)
            .is_some_and(|h| h.order.contains(hash))
    }

    /// Makes `client` hold a cached module (a load of bytes already cached), within its
    /// quota; returns how many modules left the cache, or `None` if it is not cached.
    ///
    /// # Errors
    ///
    /// As [`insert`](Self::insert), when the module alone exceeds the client's quota.
    pub fn hold(&mut self, client: ClientId, hash: &ModuleHash) -> Option<Result<usize>> {
        let cost = self.entries.get(hash)?.compiled.cost;
        if self.holds(client, hash) {
            self.get(client, hash);
            return Some(Ok(0));
        }
        let quota = self.quota(client);
        if cost > quota.bytes {
            return Some(Err(LambdaError::CacheFull {
                len: cost,
                limit: quota.bytes,
            }));
        }
        self.add_hold(client, *hash, cost);
        Some(Ok(self.fit_quota(client)))
    }

    /// Adds a newly compiled module held by `client`, then lets go of the client's least
    /// recently used holds until its quota and the cache's bounds hold again; returns how
    /// many modules left the cache.
    ///
    /// # Errors
    ///
    /// [`CacheFull`](LambdaError::CacheFull) if the module alone is bigger than the
    /// client's byte quota or the whole cache; [`CacheTaken`](LambdaError::CacheTaken) if
    /// the cache is full of other clients' modules (nothing is added then).
    pub fn insert(
        &mut self,
        client: ClientId,
        hash: ModuleHash,
        compiled: Compiled,
    ) -> Result<usize> {
        let quota = self.quota(client);
        let limit = quota.bytes.min(self.max_bytes);
        if compiled.cost > limit {
            return Err(LambdaError::CacheFull {
                len: compiled.cost,
                limit,
            });
        }
        if self.entries.contains_key(&hash) {
            // Compiled twice (two clients raced past the cache lookup): keep the first.
            return self.hold(client, &hash).unwrap_or(Ok(0));
        }
        let cost = compiled.cost;
        self.bytes += cost;
        self.entries.insert(
            hash,
            Entry {
                compiled,
                holders: Vec::new(),
            },
        );
        self.add_hold(client, hash, cost);
        let mut evicted = self.fit_quota(client);
        while self.entries.len() > self.max_modules || self.bytes > self.max_bytes {
            // The client's oldest hold other than the new module (which is its newest).
            let oldest = self
                .clients
                .get(&client)
                .and_then(|h| h.order.peek_lru().map(|(k, ())| *k))
                .filter(|k| *k != hash);
            match oldest {
                Some(old) => evicted += usize::from(self.release_one(client, &old)),
                None => {
                    self.release_one(client, &hash);
                    return Err(LambdaError::CacheTaken {
                        modules: self.max_modules,
                        bytes: self.max_bytes,
                    });
                }
            }
        }
        Ok(evicted)
    }

    fn add_hold(&mut self, client: ClientId, hash: ModuleHash, cost: usize) {
        let holds = self.clients.entry(client).or_insert_with(Holds::new);
        holds.order.put(hash, ());
        holds.bytes += cost;
        if let Some(entry) = self.entries.get_mut(&hash) {
            entry.holders.push(client);
        }
    }

    /// Lets go of `client`'s least recently used holds until it is within its quota;
    /// returns how many modules left the cache.
    fn fit_quota(&mut self, client: ClientId) -> usize {
        let quota = self.quota(client);
        let mut evicted = 0;
        loop {
            let Some(holds) = self.clients.get(&client) else {
                return evicted;
            };
            if holds.order.len() <= quota.modules && holds.bytes <= quota.bytes {
                return evicted;
            }
            let Some((old, ())) = holds.order.peek_lru() else {
                return evicted;
            };
            let old = *old;
            evicted += usize::from(self.release_one(client, &old));
        }
    }

    /// Ends `client`'s hold on one module; `true` if the module left the cache.
    fn release_one(&mut self, client: ClientId, hash: &ModuleHash) -> bool {
        let Some(entry) = self.entries.get_mut(hash) else {
            return false;
        };
        let cost = entry.compiled.cost;
        entry.holders.retain(|c| *c != client);
        let unheld = entry.holders.is_empty();
        if let Some(holds) = self.clients.get_mut(&client) {
            if holds.order.pop(hash).is_some() {
                holds.bytes -= cost;
            }
            if holds.order.is_empty() {
                self.clients.remove(&client);
            }
        }
        if unheld {
            self.entries.remove(hash);
            self.bytes -= cost;
            tracing::debug!(%hash, bytes = cost, ?client, "evicted lambda module");
        }
        unheld
    }

    /// Ends every hold of `client` (its connection closed); returns how many modules
    /// left the cache.
    pub fn release(&mut self, client: ClientId) -> usize {
        let Some(holds) = self.clients.get(&client) else {
            return 0;
        };
        let hashes: Vec<ModuleHash> = holds.order.iter().map(|(k, ())| *k).collect();
        hashes
            .iter()
            .map(|h| usize::from(self.release_one(client, h)))
            .sum()
    }

    /// Drops a module whoever holds it.
    pub fn remove(&mut self, hash: &ModuleHash) -> bool {
        let Some(entry) = self.entries.get(hash) else {
            return false;
        };
        for client in entry.holders.clone() {
            self.release_one(client, hash);
        }
        true
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Modules `client` holds.
    pub fn held_by(&self, client: ClientId) -> usize {
        self.clients.get(&client).map_or(0, |h| h.order.len())
    }
}
