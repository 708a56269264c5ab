//! Connections open per authenticated identity. The per-peer cap counts an address's
//! connections while they are anonymous or still proving who they are; once a proof is
//! good, the connection counts against its identity instead (the CM actor takes it off
//! its address), so that many users behind one client host are each held to the cap,
//! and one identity cannot hold more than the cap from any number of hosts.
//!
//! The gate takes a slot on the connection's thread right after the proof verifies, and
//! holds it for the connection's life: it goes back when the gate (and the session in
//! it) is dropped, on every path.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::proof::AuthRefusal;

/// How many connections each identity has open, against one cap.
#[derive(Debug, Default)]
pub(crate) struct IdentityCounts {
    /// Most connections one identity may hold (0: no limit).
    max: usize,
    open: Mutex<HashMap<String, usize>>,
}

impl IdentityCounts {
    /// Counts against `max` (0: no limit).
    pub fn new(max: usize) -> IdentityCounts {
        IdentityCounts {
            max,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// A slot for one more connection of `identity`, or the refusal its client reads.
    pub fn take(self: &Arc<Self>, identity: &str) -> Result<IdentitySlot, AuthRefusal> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(identity.to_owned()).or_default();
        if self.max > 0 && *n >= self.max {
            return Err(AuthRefusal::TooManyConnections { max: self.max });
        }
        *n = n.saturating_add(1);
        Ok(IdentitySlot {
            counts: self.clone(),
            identity: identity.to_owned(),
        })
    }

    /// Connections `identity` has open now.
    #[cfg(test)]
    pub fn open(&self, identity: &str) -> usize {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(identity).copied().unwrap_or(0)
    }
}

/// One open connection of an identity: given back when dropped.
#[derive(Debug)]
pub(crate) struct IdentitySlot {
    counts: Arc<IdentityCounts>,
    identity: String,
}

impl Drop for IdentitySlot {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.identity) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.identity);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_holds_at_most_the_cap_and_gets_slots_back_on_drop() {
        let counts = Arc::new(IdentityCounts::new(2));
        let a1 = counts.take("alice").unwrap();
        let _a2 = counts.take("alice").unwrap();
        assert_eq!(
            counts.take("alice").unwrap_err(),
            AuthRefusal::TooManyConnections { max: 2 }
        );
        let _b = counts
            .take("bob")
            .expect("another identity is counted apart");
        drop(a1);
        assert_eq!(counts.open("alice"), 1);
        let _a3 = counts.take("alice").unwrap();
        assert!(counts.open.lock().unwrap().len() == 2);
    }

    #[test]
    fn zero_is_no_limit_and_empty_entries_are_forgotten() {
        let counts = Arc::new(IdentityCounts::new(0));
        let slots: Vec<_> = (0..100).map(|_| counts.take("jobs").unwrap()).collect();
        assert_eq!(counts.open("jobs"), 100);
        drop(slots);
        assert!(counts.open.lock().unwrap().is_empty());
    }
}
