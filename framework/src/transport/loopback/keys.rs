//! A device's key table: which rkeys open which bytes, for whom, and with what access.
//! This is the check a NIC makes on every incoming WRITE, READ and atomic.
//!
//! A key is a slot index and an 8-bit tag (`(index + 1) << 8 | tag`), as NICs make
//! them: rebinding a memory window bumps its tag, so rkeys from earlier binds stop
//! working while the slot stays the window's. Lookups take a read lock and clone an
//! `Arc`; the copy that follows holds no lock.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, RwLock};

use slab::Slab;

use super::memory::Storage;
use crate::verbs::Access;

/// Where a window is bound.
pub(super) struct Binding {
    pub(super) storage: Arc<Storage>,
    /// First byte granted, as an address.
    pub(super) addr: u64,
    /// Bytes granted.
    pub(super) len: u64,
    /// Remote access granted.
    pub(super) access: Access,
    /// The only QP whose peer may use the rkey.
    pub(super) qp_num: u32,
}

enum Entry {
    Region(Arc<Storage>),
    Window { key: u32, binding: Option<Binding> },
}

/// Why a remote request was refused (the requester sees a remote access error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// No region or window has this rkey (never had, deregistered, revoked, rebound).
    UnknownKey,
    /// The window is bound to another QP.
    OtherQp,
    /// The registration or window does not grant the access.
    Access,
    /// The range leaves the registration or the window.
    Bounds,
}

/// One device's keys.
#[derive(Default)]
pub(super) struct KeyTable {
    slots: RwLock<Slab<Entry>>,
    tags: AtomicU32,
}

fn key_of(index: usize, tag: u32) -> u32 {
    // The table's own slab index, not a peer's: 24 bits of the key, as in a NIC's.
    #[allow(clippy::cast_possible_truncation)]
    let index = index as u32;
    (index.wrapping_add(1) << 8) | (tag & 0xff)
}

fn index_of(key: u32) -> Option<usize> {
    ((key >> 8) as usize).checked_sub(1)
}

impl KeyTable {
    /// Enters a registration; `make` builds its bytes once the key is known.
    pub(super) fn insert_region(&self, make: impl FnOnce(u32) -> Storage) -> Arc<Storage> {
        let mut slots = self.slots.write().expect("key table");
        let entry = slots.vacant_entry();
        let storage = Arc::new(make(key_of(entry.key(), self.tags.fetch_add(1, Relaxed))));
        entry.insert(Entry::Region(storage.clone()));
        storage
    }

    /// Enters an unbound window; returns its key.
    pub(super) fn insert_window(&self) -> u32 {
        let mut slots = self.slots.write().expect("key table");
        let entry = slots.vacant_entry();
        let key = key_of(entry.key(), self.tags.fetch_add(1, Relaxed));
        entry.insert(Entry::Window { key, binding: None });
        key
    }

    /// Removes the registration or window with `key` (a key already gone is ignored).
    pub(super) fn remove(&self, key: u32) {
        let mut slots = self.slots.write().expect("key table");
        let Some(index) = index_of(key) else { return };
        let ours = match slots.get(index) {
            Some(Entry::Region(s)) => s.key == key,
            // A window's key changes with each bind; its slot is its own either way.
            Some(Entry::Window { .. }) => true,
            None => false,
        };
        if ours {
            slots.remove(index);
        }
    }

    /// Binds the window in `key`'s slot under `new_key`; false when it is gone.
    pub(super) fn bind(&self, key: u32, new_key: u32, binding: Binding) -> bool {
        let mut slots = self.slots.write().expect("key table");
        match index_of(key).and_then(|i| slots.get_mut(i)) {
            Some(Entry::Window { key, binding: b }) => {
                *key = new_key;
                *b = Some(binding);
                true
            }
            _ => false,
        }
    }

    /// The bytes `[addr, addr + len)` behind `rkey` for a request with `need` access
    /// arriving at QP `qp_num`, and the offset of `addr` in them. Zero-length requests
    /// are not checked here: the caller lets them through, as NICs do.
    pub(super) fn resolve(
        &self,
        rkey: u32,
        addr: u64,
        len: usize,
        need: Access,
        qp_num: u32,
    ) -> Result<(Arc<Storage>, usize), Refusal> {
        let slots = self.slots.read().expect("key table");
        let entry = index_of(rkey)
            .and_then(|i| slots.get(i))
            .ok_or(Refusal::UnknownKey)?;
        let (storage, lo, hi, access) = match entry {
            Entry::Region(s) if s.key == rkey => (
                s,
                s.base,
                s.base.saturating_add(s.len() as u64),
                s.access.remote_part(),
            ),
            Entry::Window {
                key,
                binding: Some(b),
            } if *key == rkey => {
                if b.qp_num != qp_num {
                    return Err(Refusal::OtherQp);
                }
                (&b.storage, b.addr, b.addr.saturating_add(b.len), b.access)
            }
            _ => return Err(Refusal::UnknownKey),
        };
        if !storage.is_live() {
            return Err(Refusal::UnknownKey);
        }
        if !access.contains(need) {
            return Err(Refusal::Access);
        }
        let end = addr.checked_add(len as u64).ok_or(Refusal::Bounds)?;
        if addr < lo || end > hi {
            return Err(Refusal::Bounds);
        }
        // Checked, not assumed: the bounds are a window's as well as the storage's.
        let offset = addr
            .checked_sub(storage.base)
            .and_then(|o| usize::try_from(o).ok())
            .ok_or(Refusal::Bounds)?;
        Ok((storage.clone(), offset))
    }
}
