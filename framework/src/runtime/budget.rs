//! One server-wide count of the QPs its connections hold, rdma_cm and out-of-band alike.
//!
//! `max_connections` bounds what clients can make the server create in the kernel: QPs,
//! their receive buffers and CQ entries. Counted only by the CM actor, it let an
//! out-of-band port add up to 255 QPs per client on top, so both now draw on this one
//! budget. A [`QpSlots`] is held by the connection's core and given back when the core,
//! and so its QP, is gone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The budget; cheap to clone (every clone counts against the same total).
#[derive(Clone, Debug)]
pub(crate) struct QpBudget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    used: AtomicUsize,
    limit: usize,
}

/// Why QPs were refused: the limit and what is held now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BudgetFull {
    pub limit: usize,
    pub used: usize,
}

impl std::fmt::Display for BudgetFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "connection limit of {} reached ({} QPs open, rdma_cm and out-of-band together)",
            self.limit, self.used
        )
    }
}

impl QpBudget {
    /// A budget of `limit` QPs (`usize::MAX`: unbounded, as on a client).
    pub fn new(limit: usize) -> QpBudget {
        QpBudget {
            inner: Arc::new(Inner {
                used: AtomicUsize::new(0),
                limit,
            }),
        }
    }

    /// Takes `n` slots at once, or none.
    pub fn take(&self, n: usize) -> Result<QpSlots, BudgetFull> {
        let limit = self.inner.limit;
        self.inner
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&after| after <= limit)
            })
            .map(|_| QpSlots {
                budget: self.clone(),
                n,
            })
            .map_err(|used| BudgetFull { limit, used })
    }

    /// Slots held now.
    pub fn used(&self) -> usize {
        self.inner.used.load(Ordering::Acquire)
    }
}

/// Slots taken from a [`QpBudget`], given back when dropped.
#[derive(Debug)]
pub(crate) struct QpSlots {
    budget: QpBudget,
    n: usize,
}

impl QpSlots {
    /// Splits one slot off (for one connection of a client that asked for several).
    /// `None` once none is left.
    pub fn split_one(&mut self) -> Option<QpSlots> {
        if self.n == 0 {
            return None;
        }
        self.n -= 1;
        Some(QpSlots {
            budget: self.budget.clone(),
            n: 1,
        })
    }
}

impl Drop for QpSlots {
    fn drop(&mut self) {
        if self.n > 0 {
            self.budget.inner.used.fetch_sub(self.n, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_all_or_nothing_and_come_back_when_dropped() {
        let budget = QpBudget::new(4);
        let mut three = budget.take(3).unwrap();
        assert_eq!(
            budget.take(2).unwrap_err(),
            BudgetFull { limit: 4, used: 3 }
        );
        let one = budget.take(1).unwrap();
        assert_eq!(budget.used(), 4);
        let a = three.split_one().unwrap();
        drop(three);
        assert_eq!(budget.used(), 2, "the two unsplit slots went back");
        drop(a);
        drop(one);
        assert_eq!(budget.used(), 0);
        assert!(budget.take(usize::MAX).is_err(), "no overflow");
        assert!(BudgetFull { limit: 4, used: 4 }
            .to_string()
            .contains("connection limit of 4 reached"));
    }
}
