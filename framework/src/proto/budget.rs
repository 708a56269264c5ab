//! A connection's rendezvous budget: how many bytes it may have registered for
//! rendezvous messages in one direction at once, and the largest message it takes.
//!
//! A rendezvous offer names its length, and the receiver takes that much memory to READ
//! it into: without a limit, a peer decides how much memory the server holds (issue 16:
//! 64 offers of 1 GiB per connection). The budget is checked when an offer arrives,
//! before anything is allocated: an offer no budget could ever hold is refused (a
//! `Refuse` frame carrying the [`BudgetError`], which the sender hands to whoever sent
//! the message; the connection goes on); one that fits once earlier messages are done
//! waits for them. A service may declare a smaller largest message than the node's
//! (`Service::max_message`). The two directions have budgets of their own: a side's outgoing
//! offers are released only when the peer has READ them, so if both shared one budget,
//! two peers full of outgoing offers could each wait for the other forever.
//!
//! No I/O and no clock; the connection drives it.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use super::frame::REFUSAL_LEN;

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
    /// The pool had no room for it (its rendezvous registration on the sender's side,
    /// its heap share on the receiver's) within the wait allowed (`ConnectionConfig::pool_wait`):
    /// the memory stayed held by other connections' messages.
    #[error(
        "no room for a message of {len} bytes: the memory pool stayed full for {waited_ms} ms"
    )]
    NoRoom {
        /// The message's length.
        len: usize,
        /// How long it waited, in milliseconds.
        waited_ms: usize,
    },
}

impl BudgetError {
    /// The body of a `Refuse` frame naming this error (see `proto::frame`): a code byte,
    /// then the message's length and the limit it broke, little-endian.
    pub fn encode(&self) -> [u8; REFUSAL_LEN] {
        let (code, len, limit) = match *self {
            BudgetError::OverBudget { len, budget } => (1u8, len, budget),
            BudgetError::TooLarge { len, max } => (2u8, len, max),
            BudgetError::NoRoom { len, waited_ms } => (3u8, len, waited_ms),
        };
        let mut out = [0u8; REFUSAL_LEN];
        out[0] = code;
        out[1..9].copy_from_slice(&(len as u64).to_le_bytes());
        out[9..17].copy_from_slice(&(limit as u64).to_le_bytes());
        out
    }

    /// Parses a `Refuse` frame's body; `None` for an unknown code or length.
    pub fn decode(body: &[u8]) -> Option<BudgetError> {
        if body.len() != REFUSAL_LEN {
            return None;
        }
        let word = |at: usize| {
            let v = u64::from_le_bytes(body[at..][..8].try_into().expect("8 bytes"));
            usize::try_from(v).unwrap_or(usize::MAX)
        };
        let (len, limit) = (word(1), word(9));
        match body[0] {
            1 => Some(BudgetError::OverBudget { len, budget: limit }),
            2 => Some(BudgetError::TooLarge { len, max: limit }),
            3 => Some(BudgetError::NoRoom {
                len,
                waited_ms: limit,
            }),
            _ => None,
        }
    }
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

    /// Lowers the largest message taken to `max` (never raises it).
    pub fn limit_message(&mut self, max: usize) {
        self.max_message = self.max_message.min(max);
    }

    /// True when `len` more bytes fit now.
    pub fn fits(&self, len: usize) -> bool {
        // `len` may be a peer's: a sum past `usize::MAX` does not fit either.
        self.in_use
            .checked_add(len)
            .is_some_and(|n| n <= self.limit)
    }

    /// Counts `len` bytes as registered; false (and nothing counted) if they do not fit.
    pub fn take(&mut self, len: usize) -> bool {
        match self.in_use.checked_add(len) {
            Some(n) if n <= self.limit => {
                self.in_use = n;
                true
            }
            _ => false,
        }
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

// The tests' own numbers, not a peer's.
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
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
    fn refusals_round_trip_and_unknown_codes_are_rejected() {
        for e in [
            BudgetError::OverBudget {
                len: 1 << 30,
                budget: 32 << 20,
            },
            BudgetError::TooLarge {
                len: 17 << 20,
                max: 16 << 20,
            },
            BudgetError::NoRoom {
                len: 7 << 20,
                waited_ms: 30_000,
            },
        ] {
            assert_eq!(BudgetError::decode(&e.encode()), Some(e));
        }
        let mut body = BudgetError::TooLarge { len: 1, max: 0 }.encode();
        body[0] = 9;
        assert_eq!(BudgetError::decode(&body), None);
        assert_eq!(BudgetError::decode(&body[..5]), None);
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
