//! [`SessionCx`]: what a session can do with its connection (send, one-sided operations,
//! buffers and the rkeys it grants), handed to every session callback.

use super::wr::BindOf;
use super::{Buf, BufEntry, BufId, Core, Op, Outgoing};
use crate::memory::{Charge, RegisteredChunks};
use crate::runtime::service::{Incoming, OpId, SessionError};
use crate::transport::{Domain as _, Region as _, Transport, Verbs};
use crate::verbs::{Access, RemoteRegion};

/// What a session can do with its connection, handed to every [`Session`] callback.
///
/// [`Session`]: crate::runtime::Session
pub struct SessionCx<'a, T: Transport = Verbs> {
    pub(super) core: &'a mut Core<T>,
    pub(super) close: Option<String>,
}

impl<'a, T: Transport> SessionCx<'a, T> {
    pub(super) fn new(core: &'a mut Core<T>) -> Self {
        SessionCx { core, close: None }
    }

    /// Sends a framed message with `tag` (any size up to the connection's
    /// `max_message` and rendezvous budget: small ones go inline, large ones through an
    /// RDMA READ rendezvous). Queued when out of credits or budget.
    pub fn send(&mut self, tag: u32, data: Vec<u8>) -> Result<(), SessionError> {
        self.core
            .metrics
            .iter_mut()
            .for_each(|c| c.message_out(data.len()));
        if self.core.credits.is_none() {
            return Err(SessionError::new("send on a raw connection; use send_raw"));
        }
        if data.len() > self.core.eager_limit() {
            self.core.budget_out.check(data.len()).map_err(|e| {
                SessionError::new(format!("message of {} bytes refused: {e}", data.len()))
            })?;
        }
        self.core.queue(Outgoing::Data { tag, bytes: data });
        Ok(())
    }

    /// Answers `msg` (same tag): the client's `request` returns `data`. A message with
    /// tag 0 is one-way and nobody waits for an answer to it: replying to one sends a
    /// one-way message back, which the client sees in `recv`, not as an answer.
    pub fn reply(&mut self, msg: &Incoming, data: Vec<u8>) -> Result<(), SessionError> {
        self.send(msg.tag, data)
    }

    /// Answers `msg` with `value` encoded with postcard, what the client's
    /// `request_typed` decodes. Fails (and closes the connection, if the session returns
    /// the error) only when `value` cannot be encoded by serde.
    pub fn reply_typed<V: serde::Serialize + ?Sized>(
        &mut self,
        msg: &Incoming,
        value: &V,
    ) -> Result<(), SessionError> {
        let bytes = postcard::to_allocvec(value)
            .map_err(|e| SessionError::new(format!("answer to {} not encoded: {e}", msg.tag)))?;
        self.send(msg.tag, bytes)
    }

    /// Sends bytes as one plain SEND (raw connections), optionally with an immediate.
    pub fn send_raw(&mut self, data: &[u8], imm: Option<u32>) -> Result<(), SessionError> {
        self.core
            .metrics
            .iter_mut()
            .for_each(|c| c.message_out(data.len()));
        if self.core.credits.is_some() {
            return Err(SessionError::new(
                "send_raw on a framed connection; use send",
            ));
        }
        if data.len() > self.core.pool.largest() {
            return Err(SessionError::new(format!(
                "raw message of {} bytes is too large",
                data.len()
            )));
        }
        self.core.queue(Outgoing::Raw {
            bytes: data.to_vec(),
            imm,
        });
        Ok(())
    }

    /// The largest buffer [`alloc`](Self::alloc) leases (the pool's largest size class):
    /// larger transfers go in chunks of this, or through [`register`](Self::register).
    pub fn largest_buffer(&self) -> usize {
        self.core.pool.largest()
    }

    /// Leases a local buffer from the shared pool, for one-sided operations.
    pub fn alloc(&mut self, len: usize) -> Result<BufId, SessionError> {
        let lease = self
            .core
            .pool
            .lease(len)
            .map_err(|e| SessionError::new(e.to_string()))?;
        Ok(self.insert_buf(Buf::Pooled(lease), None, None))
    }

    /// Registers a buffer with `access` (for regions the peer may read or write). It is
    /// deregistered, revoking the rkey, when freed or when the connection ends.
    ///
    /// Remote access is granted through a type 2 memory window bound to this
    /// connection's QP: the rkey from [`SessionCx::remote`] works for this peer only (any
    /// other connection on the shared PD gets a remote access error), and freeing the
    /// buffer deallocates the window, revoking it. The bind is posted here, ahead of any
    /// message that carries the rkey.
    ///
    /// The bytes count against the pool's cap (as a rendezvous buffer does) until the
    /// buffer is freed: a session's windows and staging buffers come out of the same
    /// registered-memory budget as everything else, so many connections each within
    /// their service's own bounds cannot together pin more than the cap. At the cap this
    /// fails at once with the pool's reason (`registering N B would pass the pool's cap`),
    /// before anything is registered; the service decides what its client is told.
    pub fn register(&mut self, len: usize, access: Access) -> Result<BufId, SessionError> {
        let charge = self
            .core
            .pool
            .charge(len)
            .map_err(|e| SessionError::new(e.to_string()))?;
        let remote = access.remote_part();
        if remote == Access::NONE {
            let mr = self
                .core
                .pd
                .register(len, access)
                .map_err(|e| SessionError::new(e.to_string()))?;
            return Ok(self.insert_buf(Buf::Registered(mr), None, Some(charge)));
        }
        let err = |e: T::Error| SessionError::new(e.to_string());
        let mr = self
            .core
            .pd
            .register(len, Access::LOCAL_WRITE | Access::MW_BIND)
            .map_err(err)?;
        let window = self.core.pd.alloc_window().map_err(err)?;
        if self.core.send_outstanding >= self.core.send_depth {
            return Err(SessionError::new(
                "send queue full; cannot bind a window now",
            ));
        }
        // The window's rkey is filled in once the bind is queued, ahead of any message
        // that carries it.
        let id = self.insert_buf(
            Buf::Registered(mr),
            Some((
                window,
                RemoteRegion {
                    addr: 0,
                    len: 0,
                    rkey: 0,
                },
            )),
            Some(charge),
        );
        let grant = self.core.queue_bind(BindOf::Buf(id), remote);
        if let Some((_, g)) = self.core.bufs[id.0].grant.as_mut() {
            *g = grant;
        }
        Ok(id)
    }

    fn insert_buf(
        &mut self,
        buf: Buf<T>,
        grant: Option<(T::Window, RemoteRegion)>,
        charge: Option<Charge<RegisteredChunks<T>>>,
    ) -> BufId {
        BufId(self.core.bufs.insert(BufEntry {
            grant,
            buf,
            _charge: charge,
            inflight: 0,
            freed: false,
        }))
    }

    /// Frees a buffer: the peer's access (if granted) is revoked at once, the memory goes
    /// after the operations using it complete.
    pub fn free(&mut self, id: BufId) {
        if let Some(e) = self.core.bufs.get_mut(id.0) {
            // Revoke the peer's access now, even if our own operations still use the bytes.
            e.grant = None;
            e.freed = true;
            if e.inflight == 0 {
                self.core.bufs.remove(id.0);
            }
        }
    }

    fn entry(&self, id: BufId) -> Result<&BufEntry<T>, SessionError> {
        self.core
            .bufs
            .get(id.0)
            .filter(|e| !e.freed)
            .ok_or_else(|| SessionError::new(format!("{id:?} does not exist")))
    }

    /// Copies bytes of a buffer from `offset` into `out`: the way to read a buffer on
    /// any transport (over verbs, [`bytes`](SessionCx::bytes) lends them in place).
    pub fn copy_out(&self, id: BufId, offset: usize, out: &mut [u8]) -> Result<(), SessionError> {
        self.entry(id)?
            .buf
            .region()
            .read(offset, out)
            .map_err(|e| SessionError::new(e.to_string()))
    }

    /// Hands `read` the bytes of `range` of a buffer: in place where the transport
    /// lends them (verbs: no copy), else a copy. For code that decodes or checks
    /// received bytes on any transport without paying a copy on verbs.
    pub fn read_with<R>(
        &self,
        id: BufId,
        range: std::ops::Range<usize>,
        read: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, SessionError> {
        let outside = || SessionError::new(format!("{range:?} is outside {id:?}"));
        self.entry(id)?
            .buf
            .region()
            .with_bytes(range.clone(), read)
            .ok_or_else(outside)
    }

    /// Copies `data` into a buffer at `offset`: the way to fill a buffer on any
    /// transport (over verbs, [`bytes_mut`](SessionCx::bytes_mut) lends it in place).
    pub fn copy_in(&mut self, id: BufId, offset: usize, data: &[u8]) -> Result<(), SessionError> {
        self.entry(id)?;
        self.core.bufs[id.0]
            .buf
            .region_mut()
            .write(offset, data)
            .map_err(|e| SessionError::new(e.to_string()))
    }

    /// What the peer needs to reach a buffer registered with remote access (addr, len,
    /// and the rkey of the window bound to this connection).
    pub fn remote(&self, id: BufId) -> Result<RemoteRegion, SessionError> {
        let e = self.entry(id)?;
        Ok(match &e.grant {
            Some((_, grant)) => *grant,
            None => e.buf.region().remote(),
        })
    }

    /// Posts a one-sided operation; its completion arrives in [`Session::on_op`](crate::runtime::Session::on_op).
    pub fn post(&mut self, op: Op) -> Result<OpId, SessionError> {
        self.entry(op.buf())?;
        let id = OpId(self.core.next_op);
        self.core.next_op += 1;
        self.core.queue(Outgoing::Op {
            op: id,
            op_spec: op,
        });
        Ok(id)
    }

    /// The local QP number.
    pub fn qp_num(&self) -> u32 {
        self.core.qp_num()
    }

    /// Opens the gate that [`Core::gate_messages`] shut: from now on only the
    /// connection's own message limit applies. Refusals still queued for the session are
    /// the gate's (the session sent nothing while it was shut), and go with it.
    pub(crate) fn open_gate(&mut self) {
        if self.core.gated.take().is_some() {
            self.core.refusals.clear();
        }
    }

    /// Closes the connection after this callback returns. What is still queued is
    /// dropped; on a raw connection the SENDs already posted complete first (for a
    /// moment at most); a framed one tells the peer why with a `Close` frame when it can.
    pub fn close(&mut self, reason: impl Into<String>) {
        self.close = Some(reason.into());
    }
}

/// What only verbs memory allows: regions the application registered, handed in and
/// taken back, and the bytes of a buffer lent in place.
impl<T: Transport> SessionCx<'_, T> {
    /// Hands a region the application registered (on this connection's PD) to the
    /// connection, so operations can use it in place: no copy into a pool buffer. Get it
    /// back with [`take_back`](Self::take_back) once its operations completed.
    pub fn adopt(&mut self, region: T::Region) -> Result<BufId, SessionError> {
        if !region.is_on(&self.core.pd) {
            return Err(SessionError::new(
                "the region is registered on another protection domain",
            ));
        }
        Ok(self.insert_buf(Buf::Registered(region), None, None))
    }

    /// Returns a buffer from [`adopt`](Self::adopt) (or [`register`](Self::register), if
    /// it was registered without remote access) to the caller. `None`, and the buffer
    /// stays, while operations still use it, for a pool buffer or one with a window
    /// bound; `None` for an unknown id. A registered buffer's charge against the pool's
    /// cap ends here: the region is the caller's from now on.
    pub fn take_back(&mut self, id: BufId) -> Option<T::Region> {
        match self.core.bufs.get(id.0) {
            Some(BufEntry {
                grant: None,
                buf: Buf::Registered(_),
                inflight: 0,
                freed: false,
                ..
            }) => {}
            _ => return None,
        }
        match self.core.bufs.remove(id.0).buf {
            Buf::Registered(region) => Some(region),
            Buf::Pooled(_) => unreachable!("checked above"),
        }
    }
}

impl SessionCx<'_> {
    /// The bytes of a buffer.
    pub fn bytes(&self, id: BufId) -> Result<&[u8], SessionError> {
        Ok(self.entry(id)?.buf.region().as_slice())
    }

    /// The bytes of a buffer, mutably.
    pub fn bytes_mut(&mut self, id: BufId) -> Result<&mut [u8], SessionError> {
        self.entry(id)?;
        Ok(self.core.bufs[id.0].buf.region_mut().as_mut_slice())
    }
}
