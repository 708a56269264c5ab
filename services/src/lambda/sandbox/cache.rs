//! The module cache: compiled modules by BLAKE3 hash, bounded by count and by bytes, the
//! least recently used evicted first.

use std::fmt;

use lru::LruCache;
use serde::{Deserialize, Serialize};
use wasmtime::Module;

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

/// A validated, compiled module and what `run` needs to know about it.
#[derive(Clone)]
pub(super) struct Compiled {
    pub module: Module,
    /// The memory's declared minimum size, in bytes.
    pub min_memory_bytes: u64,
    /// What it counts against [`ModuleCache`]'s byte bound: Wasm bytes plus machine code.
    pub cost: usize,
}

/// Compiled modules, least recently used first out. No locking of its own: the sandbox
/// holds it behind a mutex and keeps each access short (a lookup clones the `Module`,
/// an `Arc` inside).
pub(super) struct ModuleCache {
    entries: LruCache<ModuleHash, Compiled>,
    bytes: usize,
    max_modules: usize,
    max_bytes: usize,
}

impl ModuleCache {
    pub fn new(max_modules: usize, max_bytes: usize) -> Self {
        ModuleCache {
            entries: LruCache::unbounded(),
            bytes: 0,
            max_modules,
            max_bytes,
        }
    }

    /// The module, marked as just used.
    pub fn get(&mut self, hash: &ModuleHash) -> Option<Compiled> {
        self.entries.get(hash).cloned()
    }

    pub fn contains(&self, hash: &ModuleHash) -> bool {
        self.entries.contains(hash)
    }

    /// Adds a module, evicting the least recently used ones until both bounds hold;
    /// returns how many were evicted. The caller checked that `compiled.cost` fits
    /// `max_bytes` on its own.
    pub fn insert(&mut self, hash: ModuleHash, compiled: Compiled) -> usize {
        self.bytes += compiled.cost;
        if let Some(old) = self.entries.put(hash, compiled) {
            self.bytes -= old.cost;
        }
        let mut evicted = 0;
        while self.entries.len() > self.max_modules.max(1) || self.bytes > self.max_bytes {
            let Some((old_hash, old)) = self.entries.pop_lru() else {
                break;
            };
            self.bytes -= old.cost;
            evicted += 1;
            tracing::debug!(hash = %old_hash, bytes = old.cost, "evicted lambda module");
        }
        evicted
    }

    pub fn remove(&mut self, hash: &ModuleHash) -> bool {
        match self.entries.pop(hash) {
            Some(old) => {
                self.bytes -= old.cost;
                true
            }
            None => false,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }
}
