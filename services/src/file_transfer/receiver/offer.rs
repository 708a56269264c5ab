//! Answering an offer: the checks (name, size, room), the service's admission, and
//! the temporary file and window an admitted offer gets. Every refusal here is an
//! answer (`Reject`) to the peer, not an error.

use std::sync::Arc;

use super::consume::Sink;
use super::incoming::Incoming;
use super::state::{Admitting, State};
use super::Receiver;
use crate::file_transfer::hash::Hasher;
use crate::file_transfer::name::validate_name;
use crate::file_transfer::output::Output;
use crate::file_transfer::owner::Admission;
use crate::file_transfer::store::{free_space, StoreError, TempFile};
use crate::file_transfer::wire::{chunk_count, FileOffer, Msg, RejectReason, MAX_CHUNKS};

impl Receiver {
    pub(super) fn offer(&mut self, offer: FileOffer, overwrite: bool) {
        let config = Arc::clone(&self.config);
        if let Err(e) = validate_name(&offer.name) {
            return self.reject(RejectReason::BadName {
                reason: e.to_string(),
            });
        }
        if offer.len > config.max_size {
            return self.reject(RejectReason::TooLarge {
                max: config.max_size,
            });
        }
        // Small files get one slot of their own size; larger ones the configured slots.
        let slot_len = u32::try_from(offer.len.max(1)).map_or(config.slot_len.max(1), |len| {
            len.min(config.slot_len.max(1))
        });
        let chunks = chunk_count(offer.len, slot_len);
        if chunks > MAX_CHUNKS {
            return self.reject(RejectReason::TooLarge {
                max: MAX_CHUNKS * u64::from(slot_len),
            });
        }
        let slots = u32::try_from(chunks.max(1)).map_or(config.slots.max(1), |chunks| {
            chunks.min(config.slots.max(1))
        });
        // Room first (cheap, and no file is created for an offer that cannot fit).
        let free = match free_space(&config.dir) {
            Ok(free) => free,
            Err(e) => {
                return self.reject(RejectReason::Unavailable {
                    reason: e.to_string(),
                })
            }
        };
        let pending = Box::new(Admitting {
            offer,
            overwrite,
            slots,
            slot_len,
            chunks,
        });
        match &self.quota {
            // The service's owner decides, with what other offers were promised.
            Some(client) => {
                self.out.push_back(Output::Admit {
                    client: client.clone(),
                    len: pending.offer.len,
                    free,
                });
                self.state = State::Admitting(pending);
            }
            None if free < pending.offer.len => self.reject(RejectReason::NoSpace {
                needed: pending.offer.len,
                available: free,
            }),
            None => self.admitted(*pending, None),
        }
    }

    /// Creates the temporary file of an admitted offer, reserves its bytes, and asks for
    /// the window.
    pub(super) fn admitted(&mut self, pending: Admitting, mut admission: Option<Admission>) {
        let config = Arc::clone(&self.config);
        let Admitting {
            offer,
            overwrite,
            slots,
            slot_len,
            chunks,
        } = pending;
        let mut temp = match TempFile::create(&config.dir, &offer.name, overwrite) {
            Ok(t) => t,
            Err(StoreError::Exists(_)) => return self.reject(RejectReason::Exists),
            Err(e) => {
                return self.reject(RejectReason::Unavailable {
                    reason: e.to_string(),
                })
            }
        };
        if let Some(reaper) = &self.reaper {
            temp.set_reaper(reaper.clone());
        }
        if let Some(who) = &self.owner {
            match temp.owned_by(who, !config.overwrite_others) {
                Ok(()) => {}
                Err(StoreError::Exists(_)) => return self.reject(RejectReason::Exists),
                Err(e) => {
                    return self.reject(RejectReason::Unavailable {
                        reason: e.to_string(),
                    })
                }
            }
        }
        match temp.reserve(offer.len) {
            Ok(true) => {
                if let Some(a) = admission.as_mut() {
                    a.mark_backed();
                }
            }
            // No fallocate: the bytes stay promised until the upload ends.
            Ok(false) => {}
            Err(e) => return self.reject(store_reason(&e, offer.len)),
        }
        let inc = Box::new(Incoming {
            admission,
            sink: Some(Box::new(Sink {
                hasher: Hasher::new(offer.digest.alg),
                temp,
            })),
            queued: Vec::new(),
            released: 0,
            early: 0,
            done_pending: false,
            offer,
            slots,
            slot_len,
            chunks,
            next: 0,
            window: None,
        });
        if chunks == 0 {
            self.out
                .push_back(Output::Send(Msg::Grant { window: None }));
            self.state = State::Receiving(inc);
        } else {
            self.out.push_back(Output::GrantWindow {
                len: inc.window_len(),
            });
            self.state = State::Granting(inc);
        }
    }
}

/// What the peer is told when storing failed: the lack of space as such, anything
/// else as unavailable with the error.
pub(super) fn store_reason(e: &StoreError, len: u64) -> RejectReason {
    match e {
        StoreError::NoSpace {
            needed, available, ..
        } => RejectReason::NoSpace {
            needed: *needed,
            available: *available,
        },
        e if e.is_no_space() => RejectReason::NoSpace {
            needed: len,
            available: 0,
        },
        e => RejectReason::Unavailable {
            reason: e.to_string(),
        },
    }
}
