//! One size class: its arenas and their free lists. Leases of a class take the
//! lowest arena with a free chunk, so higher arenas drain and can be given back.

use std::collections::BTreeSet;

use slab::Slab;

use crate::memory::line::Reserved;

pub(super) struct Arena<C> {
    pub(super) free: Vec<C>,
    pub(super) chunks: usize,
}

pub(super) struct Class<C> {
    pub(super) size: usize,
    /// Chunks per arena.
    pub(super) count: usize,
    pub(super) arenas: Slab<Arena<C>>,
    /// Arenas with a free chunk; leases take the lowest, so high arenas drain and go back.
    pub(super) with_free: BTreeSet<usize>,
    pub(super) leased: usize,
}

impl<C> Class<C> {
    pub(super) fn arena_bytes(&self) -> usize {
        self.size * self.count
    }

    /// Whether someone other than the head of the line may take a free chunk of this
    /// class (index `me`): there is one, and it is not the last one of the class the
    /// head waits for.
    pub(super) fn may_take(&self, me: usize, reserved: Reserved) -> bool {
        let mut free = self.with_free.iter().map(|&id| self.arenas[id].free.len());
        if reserved.class != Some(me) {
            return free.next().is_some();
        }
        free.sum::<usize>() > 1
    }

    pub(super) fn take(&mut self) -> Option<(usize, C)> {
        let &id = self.with_free.first()?;
        let arena = &mut self.arenas[id];
        let chunk = arena.free.pop().expect("listed as having a free chunk");
        if arena.free.is_empty() {
            self.with_free.remove(&id);
        }
        self.leased += 1;
        Some((id, chunk))
    }

    /// An arena none of whose chunks is leased, if any.
    pub(super) fn idle_arena(&self) -> Option<usize> {
        self.with_free
            .iter()
            .rev()
            .copied()
            .find(|&id| self.arenas[id].free.len() == self.arenas[id].chunks)
    }

    pub(super) fn remove_arena(&mut self, id: usize) -> Vec<C> {
        self.with_free.remove(&id);
        self.arenas.remove(id).free
    }
}
