//! The event side of rdma_cm: channels, the events read from them and the keys that name
//! their ids. Apart from `cm.rs` because events are read and acknowledged on their own
//! (see the `cm.rs` module docs), while a [`CmId`]'s calls are about one connection.

use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use super::sys::*;

use super::cm::{CmId, CmIdInner, RawCmId};
use super::error::{check_ptr, Result, Verb, VerbsError};
use super::kinds::CmEventKind;
use super::os;

/// An rdma_cm event channel: one fd delivering events for every id created on it.
#[derive(Clone)]
pub struct EventChannel {
    pub(super) inner: Arc<EventChannelInner>,
}

pub(super) struct EventChannelInner {
    pub(super) ch: NonNull<rdma_event_channel>,
}

// SAFETY: the channel wraps a kernel fd; librdmacm calls on it are thread-safe. It is
// destroyed once, after every id created on it (they hold an Arc).
unsafe impl Send for EventChannelInner {}
// SAFETY: as above.
unsafe impl Sync for EventChannelInner {}

impl Drop for EventChannelInner {
    fn drop(&mut self) {
        // SAFETY: all ids on this channel are destroyed (each held an Arc to us), and all
        // events were acked when read.
        unsafe { rdma_destroy_event_channel(self.ch.as_ptr()) };
    }
}

impl EventChannel {
    /// Creates an event channel with a non-blocking fd, so an async runtime or a poll
    /// loop can drive it without stalling.
    pub fn new() -> Result<Self> {
        // SAFETY: no preconditions.
        let ch = check_ptr(Verb::CreateEventChannel, unsafe {
            rdma_create_event_channel()
        })?;
        let chan = EventChannel {
            inner: Arc::new(EventChannelInner { ch }),
        };
        os::set_nonblocking(chan.fd(), Verb::CreateEventChannel)?;
        Ok(chan)
    }

    /// The channel's fd, readable when an event is pending.
    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is alive; `fd` is a plain field.
        unsafe { (*self.inner.ch.as_ptr()).fd }
    }

    /// Reads one pending event without blocking.
    pub fn try_next(&self) -> Result<Option<CmEvent>> {
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY: the channel is alive; `ev` is a valid out-pointer.
        let ret = unsafe { rdma_get_cm_event(self.inner.ch.as_ptr(), &mut ev) };
        if ret != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(VerbsError::Call {
                verb: Verb::GetCmEvent,
                source: err,
            });
        }
        // SAFETY: rdma_get_cm_event succeeded, so `ev` is a valid event until acked.
        let event = unsafe { CmEvent::copy_from(ev, self) };
        // SAFETY: `ev` came from rdma_get_cm_event and is acked exactly once; nothing
        // refers to it afterwards (the event above holds copies only).
        unsafe { rdma_ack_cm_event(ev) };
        Ok(Some(event))
    }

    /// Waits up to `timeout` (`None`: forever) for the next event.
    pub fn next(&self, timeout: Option<Duration>) -> Result<Option<CmEvent>> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if let Some(ev) = self.try_next()? {
                return Ok(Some(ev));
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(std::time::Instant::now()) {
                    Some(left) => Some(left),
                    None => return Ok(None),
                },
                None => None,
            };
            os::poll_readable(self.fd(), left)?;
        }
    }

    /// Waits for the next event and requires it to be `kind` (for synchronous code with
    /// one id per channel). Any other event becomes [`VerbsError::UnexpectedEvent`].
    pub fn expect(&self, kind: CmEventKind, timeout: Duration) -> Result<CmEvent> {
        let ev = self
            .next(Some(timeout))?
            .ok_or(VerbsError::Timeout("rdma_cm event"))?;
        if ev.kind == kind {
            Ok(ev)
        } else {
            Err(VerbsError::UnexpectedEvent {
                expected: kind,
                got: ev.kind,
                status: ev.status,
                private_data: ev.private_data,
            })
        }
    }
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

/// Identifies a cm_id in events, so a CM loop can route them to their connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmIdKey(pub(super) usize);

impl CmIdKey {
    /// A key for a connection without a cm_id (brought up out of band), unique among
    /// the keys of the actor that hands it out (not among real cm_ids).
    pub(crate) fn out_of_band(n: usize) -> CmIdKey {
        CmIdKey(n)
    }
}

/// One rdma_cm event, copied out of librdmacm and already acknowledged.
#[derive(Debug)]
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventKind,
    /// The event status (for REJECTED: the CM reject reason; for errors: -errno).
    pub status: i32,
    /// The id the event is about (for CONNECT_REQUEST: the new id).
    pub id: CmIdKey,
    /// For CONNECT_REQUEST: the listening id it arrived on.
    pub listen_id: Option<CmIdKey>,
    /// Private data from the peer (CONNECT_REQUEST, ESTABLISHED on the active side,
    /// REJECTED). The transport pads it, so protocols must carry their own length.
    pub private_data: Vec<u8>,
    /// The peer's requested RDMA READ/atomic responder depth.
    pub responder_resources: u8,
    /// The peer's requested RDMA READ/atomic initiator depth.
    pub initiator_depth: u8,
    request: Option<CmId>,
}

impl CmEvent {
    /// # Safety
    /// `ev` must be a valid, not yet acked event read from `channel`.
    unsafe fn copy_from(ev: *mut rdma_cm_event, channel: &EventChannel) -> CmEvent {
        // SAFETY: the caller guarantees `ev` is valid.
        let e = unsafe { &*ev };
        let kind = CmEventKind::from_raw(e.event);
        // SAFETY: for connection events the union holds `conn`; UD events are not used
        // by this crate (only RDMA_PS_TCP ids are created), so `conn` is the live member.
        let conn = unsafe { e.param.conn };
        let private_data = if conn.private_data.is_null() || conn.private_data_len == 0 {
            Vec::new()
        } else {
            // SAFETY: librdmacm guarantees private_data_len readable bytes until the ack.
            unsafe {
                std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    conn.private_data_len as usize,
                )
            }
            .to_vec()
        };
        let request = if kind == CmEventKind::ConnectRequest {
            NonNull::new(e.id).map(|id| CmId {
                inner: Arc::new(CmIdInner {
                    raw: RawCmId(id),
                    _channel: channel.clone(),
                }),
            })
        } else {
            None
        };
        CmEvent {
            kind,
            status: e.status,
            id: CmIdKey(e.id as usize),
            listen_id: NonNull::new(e.listen_id).map(|p| CmIdKey(p.as_ptr() as usize)),
            private_data,
            responder_resources: conn.responder_resources,
            initiator_depth: conn.initiator_depth,
            request,
        }
    }

    /// For CONNECT_REQUEST: takes ownership of the new id, to create a QP on it and
    /// accept or reject. Dropping it instead destroys the id (the peer sees a reject).
    pub fn take_request(&mut self) -> Option<CmId> {
        self.request.take()
    }
}
