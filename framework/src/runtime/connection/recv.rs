//! The receive side of a connection: receives posted on its own queue (reposted after
//! the turn's answers for framed connections, at once for raw ones) or taken from a
//! queue shared with other connections (reposted at once, credits settled with the
//! queue's reserve), and the frames they carry turned into deliveries.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use std::borrow::Cow;

use super::{Core, Delivery, Outgoing};
use crate::proto::budget::BudgetError;
use crate::proto::frame::{FrameKind, Header, RendezvousOffer};
use crate::runtime::close::CloseReason;
use crate::runtime::service::{Framing, Incoming};
use crate::transport::{QueuePair as _, Region as _, Transport};
use crate::verbs::{WcOpcode, WorkCompletion};

impl<T: Transport> Core<T> {
    /// Queues every receive buffer; the driver posts them before the QP reaches RTR,
    /// so the peer's first SEND always finds one.
    pub(crate) fn queue_all_receives(&mut self) {
        for slot in 0..self.recv.len() {
            self.queue_recv(slot);
        }
        self.cut();
    }

    /// Queues the receives consumed this turn again; true when there were any.
    pub(super) fn repost_receives(&mut self) -> Result<bool, CloseReason> {
        if self.reposts.is_empty() || self.closing.is_some() {
            return Ok(false);
        }
        let n = self.reposts.len();
        for i in 0..n {
            self.queue_recv(self.reposts[i]);
        }
        self.reposts.clear();
        if let Some(credits) = self.credits.as_mut() {
            // Queued receives are posted before any SEND that could grant them.
            // At most the receive queue's depth, a u32.
            credits.handle_reposted(u32::try_from(n).unwrap_or(u32::MAX));
        }
        Ok(true)
    }

    /// Handles one received frame; returns messages to deliver in order.
    pub(super) fn handle_recv(
        &mut self,
        slot: usize,
        wc: &WorkCompletion,
    ) -> Result<(), CloseReason> {
        let len = wc.byte_len as usize;
        match self.framing {
            Framing::Raw { .. } => {
                let data = if wc.opcode == WcOpcode::RecvRdmaWithImm {
                    Vec::new()
                } else {
                    self.received(slot, len)?.into_owned()
                };
                // In this turn, before the answer: a plain peer has no credits to tell
                // it when a receive is back, and may send its next message as soon as
                // it has our answer (receives are posted before SENDs, see `post.rs`).
                self.queue_recv(slot);
                self.deliveries.push_back(Delivery::Ready(Incoming {
                    tag: 0,
                    imm: wc.imm_data,
                    data,
                }));
            }
            Framing::Framed => {
                // Moved out for the parse: `data` may borrow this core.
                let mut spare = std::mem::take(&mut self.spare_bodies);
                let data = match wc.opcode {
                    WcOpcode::RecvRdmaWithImm => None,
                    _ => Some(self.received(slot, len)?),
                };
                let frame = Frame::parse(data.as_deref(), &mut spare);
                drop(data);
                self.spare_bodies = spare;
                let frame = frame?;
                self.handle_frame(frame, wc)?;
                self.reposts.push(slot);
            }
        }
        Ok(())
    }

    /// The first `len` bytes received into `slot`: lent in place where the transport
    /// can (verbs), else copied out (loopback, whose "NIC" is another thread).
    fn received(&self, slot: usize, len: usize) -> Result<Cow<'_, [u8]>, CloseReason> {
        let chunk = &self.recv[slot];
        if let Some(bytes) = chunk.bytes() {
            return bytes.get(..len).map(Cow::Borrowed).ok_or_else(|| {
                CloseReason::Completion(format!("{len} bytes received into a smaller buffer"))
            });
        }
        let mut out = vec![0; len];
        chunk.read(0, &mut out).map_err(CloseReason::from_verbs)?;
        Ok(Cow::Owned(out))
    }

    /// Handles one frame of a framed connection (or a WRITE_WITH_IMM, which consumed a
    /// receive but carries no frame), wherever its receive came from.
    fn handle_frame(&mut self, frame: Frame, wc: &WorkCompletion) -> Result<(), CloseReason> {
        let Some((header, body)) = frame.0 else {
            self.credits
                .as_mut()
                .expect("framed")
                .handle_received(0)
                .map_err(CloseReason::from_credits)?;
            self.deliveries.push_back(Delivery::Ready(Incoming {
                tag: 0,
                imm: wc.imm_data,
                data: Vec::new(),
            }));
            return Ok(());
        };
        let credits = self.credits.as_mut().expect("framed");
        credits
            .handle_received(header.credits)
            .map_err(CloseReason::from_credits)?;
        match header.kind {
            FrameKind::Data => self.deliveries.push_back(Delivery::Ready(Incoming {
                tag: header.tag,
                imm: wc.imm_data,
                data: body,
            })),
            FrameKind::Credit => {}
            FrameKind::RendezvousOffer => {
                let len = header.len as usize;
                let offer = RendezvousOffer::decode(&body);
                check_offer(&offer, header.len)?;
                // Before anything is allocated for it; refused, the connection goes on.
                let checked = match self.gated {
                    // Not read while the gate is shut, and the session hears of it.
                    Some(max) if len > max => {
                        let why = BudgetError::TooLarge { len, max };
                        self.refusals.push_back((header.tag, why.clone()));
                        Err(why)
                    }
                    _ => self.budget_in.check(len),
                };
                if let Err(why) = checked {
                    tracing::info!(qp = self.qp.qp_num(), %why, "rendezvous offer refused");
                    self.queue(Outgoing::Refuse {
                        key: offer.key,
                        why,
                    });
                    return Ok(());
                }
                let seq = self.next_seq;
                // A u64 count of offers: it never wraps in practice.
                self.next_seq = self.next_seq.wrapping_add(1);
                self.deliveries.push_back(Delivery::Waiting(seq));
                self.queue(Outgoing::Read {
                    seq,
                    tag: header.tag,
                    offer,
                    len,
                });
            }
            FrameKind::Refuse => {
                let why = BudgetError::decode(&body).ok_or_else(|| {
                    CloseReason::Protocol("a refusal with an unknown reason code".into())
                })?;
                self.handle_rendezvous_refused(header.tag, why)?;
            }
            FrameKind::Close => {
                return Err(CloseReason::PeerClosed(
                    String::from_utf8_lossy(&body).into_owned(),
                ))
            }
            FrameKind::RendezvousDone => self.handle_rendezvous_done(header.tag)?,
        }
        Ok(())
    }

    /// A receive from the shared queue: the bytes are copied out and the buffer goes back
    /// to the queue at once (even while closing: the other connections need it). A
    /// framed connection then settles its credits with the queue's reserve: the buffer
    /// is posted again already, so the grant can ride the answer to this very frame.
    pub(super) fn handle_shared_recv(
        &mut self,
        slot: usize,
        wc: &WorkCompletion,
    ) -> Result<(), CloseReason> {
        let Some(shared) = &self.shared_recv else {
            tracing::warn!(
                wr_id = wc.wr_id,
                "shared receive on a connection without one"
            );
            return Ok(());
        };
        let imm = wc.opcode == WcOpcode::RecvRdmaWithImm;
        let failed = || {
            CloseReason::Completion(format!(
                "shared receive on QP {} completed with {}",
                wc.qp_num, wc.status
            ))
        };
        if let Framing::Framed = self.framing {
            // Parsed from the queue's buffer: the body is the only copy.
            let spare = &mut self.spare_bodies;
            let frame = shared
                .take_with(slot, wc, |bytes| {
                    bytes.map(|b| Frame::parse((!imm).then_some(b), spare))
                })
                .map_err(CloseReason::from_verbs)?;
            if self.closing.is_some() {
                return Ok(());
            }
            self.handle_frame(frame.ok_or_else(failed)??, wc)?;
            if let (Some(credits), Some(m)) = (self.credits.as_mut(), &self.membership) {
                let (reserve, loan) = m.reserve();
                credits.settle(reserve, loan);
            }
            return Ok(());
        }
        let data = shared
            .take_with(slot, wc, |bytes| {
                bytes.map(|b| if imm { Vec::new() } else { b.to_vec() })
            })
            .map_err(CloseReason::from_verbs)?;
        if self.closing.is_some() {
            return Ok(());
        }
        self.deliveries.push_back(Delivery::Ready(Incoming {
            tag: 0,
            imm: wc.imm_data,
            data: data.ok_or_else(failed)?,
        }));
        Ok(())
    }

    pub(super) fn next_delivery(&mut self) -> Option<Incoming> {
        match self.deliveries.front() {
            Some(Delivery::Ready(_)) => match self.deliveries.pop_front() {
                Some(Delivery::Ready(m)) => {
                    self.last_message = self.now;
                    self.metrics
                        .iter_mut()
                        .for_each(|c| c.message_in(m.data.len()));
                    Some(m)
                }
                _ => None,
            },
            _ => None,
        }
    }
}

/// A received frame: its header and body bytes, or `None` for a WRITE_WITH_IMM.
struct Frame(Option<(Header, Vec<u8>)>);

impl Frame {
    /// The frame in `bytes`, its body copied into one of the connection's `spare`
    /// bodies when it has one (no allocation per small message), else a new one.
    fn parse(bytes: Option<&[u8]>, spare: &mut Vec<Vec<u8>>) -> Result<Frame, CloseReason> {
        let Some(bytes) = bytes else {
            return Ok(Frame(None));
        };
        let (header, body) =
            Header::decode(bytes).map_err(|e| CloseReason::Protocol(e.to_string()))?;
        let mut owned = spare.pop().unwrap_or_default();
        owned.clear();
        owned.extend_from_slice(body);
        Ok(Frame(Some((header, owned))))
    }
}

/// The peer's offer must name a range its own registration could hold: at least one
/// byte (small messages travel inline, so an empty offer is never sent) whose last byte
/// is addressable. An address near `u64::MAX` would wrap the READs' target addresses.
fn check_offer(offer: &RendezvousOffer, len: u32) -> Result<(), CloseReason> {
    if len == 0 {
        return Err(CloseReason::Protocol(
            "a rendezvous offer of 0 bytes".into(),
        ));
    }
    if offer.addr.checked_add(u64::from(len)).is_none() {
        return Err(CloseReason::Protocol(format!(
            "a rendezvous offer of {len} bytes at {:#x} wraps around the address space",
            offer.addr
        )));
    }
    Ok(())
}

// The tests' own numbers, not a peer's.
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    fn offer(addr: u64) -> RendezvousOffer {
        RendezvousOffer {
            addr,
            rkey: 1,
            key: 2,
        }
    }

    /// Issue 26 (7): the READs of an offer target `addr + offset`; an offer whose end
    /// lies past the address space is refused before any is posted.
    #[test]
    fn offers_that_wrap_or_are_empty_are_protocol_violations() {
        assert!(check_offer(&offer(0x7f00_0000_0000), 1 << 20).is_ok());
        assert!(check_offer(&offer(u64::MAX - 4096), 4096).is_ok());
        for (addr, len) in [(u64::MAX - 10, 1 << 20), (u64::MAX, 1), (1 << 40, 0)] {
            let err = check_offer(&offer(addr), len).unwrap_err();
            assert!(
                matches!(err, CloseReason::Protocol(_)),
                "{addr:#x}+{len}: {err}"
            );
        }
    }
}
