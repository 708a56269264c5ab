//! Handles C holds: ids into tables with a generation per slot, never pointers.
//!
//! A C program can pass anything as a handle: zero, a closed connection's id, a
//! context's id where a connection's belongs, a value it made up. Each of those must
//! be an error code, never undefined behaviour, so a handle is looked up, not
//! dereferenced. A slot's generation goes up each time it is freed, so a stale id
//! finds a newer generation and is refused; the kind tag in the top byte refuses an id
//! of another table; id 0 is never issued, so a zeroed handle is refused too.

use std::sync::{Arc, Mutex, MutexGuard};

/// Which table an id belongs to: its top byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Context = 0xC7,
    Connection = 0xC0,
}

/// Generations wrap after 2^24 reuses of one slot: an id kept that long (16 million
/// closes of connections that happened to reuse its slot) could be taken for a newer
/// one. That is a wrong handle, still never memory unsafety.
const GEN_BITS: u32 = 24;
const GEN_MASK: u64 = (1 << GEN_BITS) - 1;

struct Slot<V> {
    generation: u32,
    value: Option<V>,
}

/// A generational table of `V`s.
pub(crate) struct Table<V> {
    kind: Kind,
    slots: Vec<Slot<V>>,
    free: Vec<u32>,
    live: usize,
}

impl<V> Table<V> {
    pub const fn new(kind: Kind) -> Table<V> {
        Table {
            kind,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }

    fn id(&self, index: u32, generation: u32) -> u64 {
        ((self.kind as u64) << 56) | ((u64::from(generation) & GEN_MASK) << 32) | u64::from(index)
    }

    /// (index, generation) of `id` if it is of this table's kind; a real slot is not
    /// implied.
    fn split(&self, id: u64) -> Option<(usize, u32)> {
        if id >> 56 != self.kind as u64 {
            return None;
        }
        let generation = ((id >> 32) & GEN_MASK) as u32;
        Some((id as u32 as usize, generation))
    }

    /// Stores `value` under a fresh id.
    pub fn insert(&mut self, value: V) -> u64 {
        self.live += 1;
        if let Some(index) = self.free.pop() {
            let slot = &mut self.slots[index as usize];
            slot.value = Some(value);
            let generation = slot.generation;
            return self.id(index, generation);
        }
        let index = u32::try_from(self.slots.len()).expect("fewer than 2^32 handles");
        // Generation 1 first, so that no id of slot 0 is a small integer a C caller
        // might pass by mistake.
        self.slots.push(Slot {
            generation: 1,
            value: Some(value),
        });
        self.id(index, 1)
    }

    pub fn get(&self, id: u64) -> Option<&V> {
        let (index, generation) = self.split(id)?;
        let slot = self.slots.get(index)?;
        if slot.generation != generation {
            return None;
        }
        slot.value.as_ref()
    }

    /// Takes the value out; the id (and every copy of it) is dead from now on.
    pub fn remove(&mut self, id: u64) -> Option<V> {
        let (index, generation) = self.split(id)?;
        let slot = self.slots.get_mut(index)?;
        if slot.generation != generation {
            return None;
        }
        let value = slot.value.take()?;
        slot.generation = (slot.generation + 1) & GEN_MASK as u32;
        if slot.generation == 0 {
            slot.generation = 1;
        }
        self.free.push(index as u32);
        self.live -= 1;
        Some(value)
    }

    /// Ids and values now live, for a context's shutdown to find its connections.
    pub fn ids_where(&self, mut keep: impl FnMut(&V) -> bool) -> Vec<u64> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match &s.value {
                Some(v) if keep(v) => Some(self.id(i as u32, s.generation)),
                _ => None,
            })
            .collect()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.live
    }
}

/// A table behind a mutex, the form the library's process-wide tables take. The lock
/// is held only to look up, insert or remove: values are `Arc`s cloned out, so no
/// call blocks another while it waits on the network.
pub(crate) struct Shared<V>(Mutex<Table<Arc<V>>>);

impl<V> Shared<V> {
    pub const fn new(kind: Kind) -> Shared<V> {
        Shared(Mutex::new(Table::new(kind)))
    }

    pub fn lock(&self) -> MutexGuard<'_, Table<Arc<V>>> {
        // Nothing panics while the lock is held that leaves the table half changed
        // (every change is one call), so a poisoned lock is still a good table.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, value: V) -> u64 {
        self.lock().insert(Arc::new(value))
    }

    pub fn get(&self, id: u64) -> Option<Arc<V>> {
        self.lock().get(id).cloned()
    }

    pub fn remove(&self, id: u64) -> Option<Arc<V>> {
        self.lock().remove(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_made_up_ids_are_refused() {
        let mut t = Table::new(Kind::Connection);
        let id = t.insert("a");
        assert!(t.get(0).is_none());
        assert!(t.get(1).is_none());
        assert!(t.get(u64::MAX).is_none());
        assert!(t.get(id ^ 1).is_none(), "another index");
        assert_eq!(t.get(id), Some(&"a"));
    }

    #[test]
    fn a_removed_id_stays_dead_when_its_slot_is_reused() {
        let mut t = Table::new(Kind::Connection);
        let old = t.insert(1);
        assert_eq!(t.remove(old), Some(1));
        assert_eq!(
            t.remove(old),
            None,
            "a second remove (double close) finds nothing"
        );
        let new = t.insert(2);
        assert_ne!(old, new, "same slot, newer generation");
        assert_eq!(old as u32, new as u32, "the slot was reused");
        assert!(t.get(old).is_none());
        assert_eq!(t.get(new), Some(&2));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn an_id_of_another_table_is_refused() {
        let mut contexts = Table::new(Kind::Context);
        let mut connections = Table::new(Kind::Connection);
        let ctx = contexts.insert("ctx");
        let conn = connections.insert("conn");
        assert_eq!(ctx as u32, conn as u32, "same index and generation in both");
        assert!(connections.get(ctx).is_none());
        assert!(contexts.get(conn).is_none());
    }

    #[test]
    fn generations_skip_zero_when_they_wrap() {
        let mut t = Table::new(Kind::Context);
        let first = t.insert(());
        t.slots[0].generation = GEN_MASK as u32;
        let id = t.id(0, GEN_MASK as u32);
        t.remove(id);
        assert_eq!(t.slots[0].generation, 1);
        let again = t.insert(());
        assert_eq!(again, first, "a wrapped generation may alias (documented)");
        assert_eq!(t.get(id), None);
    }
}
