//! A connection's rendezvous budget: how many bytes it may have registered for
//! rendezvous messages in one direction at once, and the largest message it takes.
//!
//! A rendezvous offer names its length, and the receiver registers that much to READ
//! it into: without a limit, a peer decides how much memory the server pins (issue 16:
//! 64 offers of 1 GiB per connection). The budget is checked when an offer arrives,
//! before anything is allocated: an offer no budget could ever hold ends the connection
//! with [`BudgetError`] as its reason; one that fits once earlier messages are done
//! waits for them. The two directions have budgets of their own: a side's outgoing
//! offers are released only when the peer has READ them, so if both shared one budget,
//! two peers full of outgoing offers could each wait for the other forever.
//!
//! No I/O and no clock; the connection drives it.

/// Why a message is refused outright.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BudgetError {
    /// Larger than the connection's whole budget: it could never be registered.
    #[error("rendezvous offer of {len} bytes exceeds the connection's budget of {budget}")]
    OverBudget {
        /// The message's length.
        len: usize,
        /// The connection's budget in that direction.
        budget: usize,
    },
    /// Larger than the largest message the connection accepts.
    #[error("rendezvous offer of {len} bytes exceeds the connection's largest message of {max}")]
    TooLarge {
        /// The message's length.
        len: usize,
        /// The largest message.
        max: usize,
    },
}

/// Bytes registered for rendezvous messages in one direction of one connection.
#[derive(Debug, Clone)]
pub struct Budget {
    limit: usize,
    max_message: usize,
    in_use: usize,
}

impl Budget {
    /// A budget of `limit` bytes at once, for messages of at most `max_message` bytes.
    pub fn new(limit: usize, max_message: usize) -> Budget {
        Budget {
            limit,
            max_message,
            in_use: 0,
        }
    }

    /// Checks a message of `len` bytes against the limits, before anything is allocated
    /// for it: an error means it can never be taken.
    pub fn check(&self, len: usize) -> Result<(), BudgetError> {
        if len > self.limit {
            return Err(BudgetError::OverBudget {
                len,
                budget: self.limit,
            });
        }
        if len > self.max_message {
            return Err(BudgetError::TooLarge {
                len,
                max: self.max_message,
            });
        }
        Ok(())
    }

    /// True when `len` more bytes fit now.
    pub fn fits(&self, len: usize) -> bool {
        self.in_use + len <= self.limit
    }

    /// Counts `len` bytes as registered; false (and nothing counted) if they do not fit.
    pub fn take(&mut self, len: usize) -> bool {
        if !self.fits(len) {
            return false;
        }
        self.in_use += len;
        true
    }

    /// A message of `len` bytes was done with (READ, or released by the peer).
    pub fn release(&mut self, len: usize) {
        self.in_use = self.in_use.saturating_sub(len);
    }

    /// Bytes counted now.
    pub fn in_use(&self) -> usize {
        self.in_use
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_beyond_the_budget_are_refused_with_a_reason() {
        let b = Budget::new(32 << 20, 16 << 20);
        let err = b.check(1 << 30).unwrap_err();
        assert_eq!(
            err.to_string(),
            "rendezvous offer of 1073741824 bytes exceeds the connection's budget of 33554432"
        );
        assert!(matches!(
            b.check(20 << 20),
            Err(BudgetError::TooLarge { .. })
        ));
        assert!(b.check(16 << 20).is_ok());
    }

    #[test]
    fn bytes_in_use_never_pass_the_limit() {
        let mut b = Budget::new(100, 100);
        assert!(b.take(60));
        assert!(!b.take(41), "would pass the limit");
        assert_eq!(b.in_use(), 60, "a refused take counts nothing");
        assert!(b.take(40));
        assert!(!b.fits(1));
        b.release(60);
        assert!(b.fits(60));
        assert_eq!(b.in_use(), 40);
    }
}
