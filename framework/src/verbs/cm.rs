//! rdma_cm: communication ids and their calls (event channels and the events they
//! deliver are in `event_channel.rs`).
//!
//! Events are copied out and acknowledged as soon as they are read: `rdma_destroy_id`
//! blocks until every event reported for the id is acked, so holding raw events invites
//! deadlocks at teardown. A CONNECT_REQUEST's new id is wrapped in an owned [`CmId`]; if
//! nobody takes it, dropping it destroys the id and the peer sees a reject.

use std::net::SocketAddr;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use super::sys::*;

use super::cq::CompletionQueue;
use super::device::Context;
use super::error::{check, check_ptr, Result, Verb, VerbsError};
use super::event_channel::{CmIdKey, EventChannel};
use super::os;
use super::pd::ProtectionDomain;
use super::qp::{QpCaps, QueuePair};
use super::srq::SharedReceiveQueue;

/// Private data a connect request can carry over RoCE/IB (the CM REQ has 92 bytes, the
/// rdma_cm header takes 36).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Private data an accept (CM REP) can carry.
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// Private data a reject (CM REJ) can carry.
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;

/// What a REJECTED event's status means when no rdmactor reason came with it: on
/// InfiniBand and RoCE, the IB CM reject reason (IBTA vol. 1, "REJ"; `enum
/// ib_cm_rej_reason` in the kernel); on iWARP, a negative errno. For example `8` is
/// "no listener for the service ID (IB CM reject 8)".
pub fn transport_reject(status: i32) -> String {
    let reason = match status {
        1 => "no QP available",
        2 => "no EEC available",
        3 => "no resources available at the server",
        4 => "the server's CM timed out",
        5 => "unsupported request",
        6 => "invalid communication ID",
        7 => "invalid communication instance",
        8 => "no listener for the service ID",
        9 => "invalid transport type",
        10 => "stale connection (a REQ that matches an old one)",
        12 => "invalid GID",
        13 => "invalid LID",
        14 => "invalid SL",
        15 => "invalid traffic class",
        16 => "invalid hop limit",
        17 => "invalid packet rate",
        26 => "invalid MTU",
        27 => "insufficient responder resources",
        28 => "rejected by the server's application, with no reason attached",
        29 => "invalid RNR retry count",
        30 => "duplicate local communication ID",
        31 => "unsupported CM class version",
        s if s < 0 => {
            let err = std::io::Error::from_raw_os_error(-s);
            return format!("{err} (transport errno {})", -s);
        }
        _ => "reject",
    };
    format!("{reason} (IB CM reject {status})")
}

/// Parameters of `rdma_connect` / `rdma_accept`.
#[derive(Debug, Clone, Copy)]
pub struct ConnParam<'a> {
    /// Application bytes for the peer (service name, version, ...).
    pub private_data: &'a [u8],
    /// RDMA READ/atomic requests we accept as responder.
    pub responder_resources: u8,
    /// RDMA READ/atomic requests we issue as initiator.
    pub initiator_depth: u8,
    /// Transport retries before a request fails with RetryExceeded.
    pub retry_count: u8,
    /// RNR retries (7 means infinite).
    pub rnr_retry_count: u8,
}

impl Default for ConnParam<'_> {
    fn default() -> Self {
        ConnParam {
            private_data: &[],
            responder_resources: 16,
            initiator_depth: 16,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }
}

impl ConnParam<'_> {
    fn raw(&self) -> rdma_conn_param {
        rdma_conn_param {
            private_data: if self.private_data.is_empty() {
                std::ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: self.private_data.len() as u8,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: 1,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: 0,
            qp_num: 0,
        }
    }
}

/// An rdma_cm communication id (RDMA_PS_TCP, i.e. reliable connected). Cheap to clone;
/// destroyed once the last clone and its QP are gone.
#[derive(Clone)]
pub struct CmId {
    pub(super) inner: Arc<CmIdInner>,
}

pub(crate) struct CmIdInner {
    // Field order is drop order: the id is destroyed before its channel.
    pub(super) raw: RawCmId,
    pub(super) _channel: EventChannel,
}

pub(super) struct RawCmId(pub(super) NonNull<rdma_cm_id>);

// SAFETY: librdmacm calls on one id are serialized internally by the kernel/ucma; the id
// is destroyed once in Drop, after its QP (which holds an Arc to the owner).
unsafe impl Send for RawCmId {}
// SAFETY: as above.
unsafe impl Sync for RawCmId {}

impl CmIdInner {
    pub(crate) fn as_ptr(&self) -> *mut rdma_cm_id {
        self.raw.0.as_ptr()
    }
}

impl Drop for RawCmId {
    fn drop(&mut self) {
        // SAFETY: the QP (if any) held an Arc to us and is gone; every event for this id
        // was acked when read; the channel outlives us via `_channel`.
        let ret = unsafe { rdma_destroy_id(self.0.as_ptr()) };
        if ret != 0 {
            tracing::error!(error = %std::io::Error::last_os_error(), "rdma_destroy_id failed");
        }
    }
}

fn check_len(what: &str, data: &[u8], max: usize) -> Result<()> {
    if data.len() > max {
        return Err(VerbsError::InvalidArgument(format!(
            "{what} private data is {} bytes, at most {max} fit",
            data.len()
        )));
    }
    Ok(())
}

impl CmId {
    /// Creates an id on `channel`; its events arrive there.
    pub fn new(channel: &EventChannel) -> Result<CmId> {
        let mut id: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: the channel is alive (and kept alive by the clone stored below); `id` is
        // a valid out-pointer.
        let ret = unsafe {
            rdma_create_id(
                channel.inner.ch.as_ptr(),
                &mut id,
                std::ptr::null_mut(),
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        check(Verb::CreateId, ret)?;
        let id = check_ptr(Verb::CreateId, id)?;
        Ok(CmId {
            inner: Arc::new(CmIdInner {
                raw: RawCmId(id),
                _channel: channel.clone(),
            }),
        })
    }

    /// The key events about this id carry.
    pub fn key(&self) -> CmIdKey {
        CmIdKey(self.inner.as_ptr() as usize)
    }

    /// Binds to a local address (port 0 picks a free port).
    pub fn bind(&self, addr: SocketAddr) -> Result<()> {
        let mut ss = os::to_sockaddr(&addr);
        // SAFETY: the id is alive; `ss` holds a valid sockaddr for the call.
        let ret = unsafe {
            rdma_bind_addr(
                self.inner.as_ptr(),
                (&mut ss as *mut libc::sockaddr_storage).cast(),
            )
        };
        check(Verb::BindAddr, ret)
    }

    /// Moves this id (and its future events) to `channel`, so an accepted connection can
    /// have a channel of its own instead of sharing the listener's. Fails when the id is
    /// shared (a clone or a QP exists).
    pub fn migrate(self, channel: &EventChannel) -> Result<CmId> {
        let inner = Arc::try_unwrap(self.inner).map_err(|_| {
            VerbsError::InvalidArgument("cannot migrate a cm_id that is shared".into())
        })?;
        // SAFETY: the id is alive and owned by us alone; both channels are alive.
        let ret = unsafe { rdma_migrate_id(inner.as_ptr(), channel.inner.ch.as_ptr()) };
        // On failure the id still reports to the old channel, so keep that one alive.
        let CmIdInner { raw, _channel: old } = inner;
        let id = CmId {
            inner: Arc::new(CmIdInner {
                raw,
                _channel: if ret == 0 { channel.clone() } else { old },
            }),
        };
        check(Verb::MigrateId, ret)?;
        Ok(id)
    }

    /// Sets the local ACK timeout of the id's QP to 4.096 µs × 2^`exponent` (the
    /// exponent is the IB `timeout` attribute, 0..=31). rdma_cm otherwise derives it from
    /// the path's packet lifetime (about half a second on RoCE). With the QP's retry
    /// count it bounds how long a request to a dead peer lingers before it fails with
    /// `RetryExceeded`. Takes effect when the QP reaches RTS: call it before
    /// [`connect`](Self::connect) or [`accept`](Self::accept).
    pub fn set_ack_timeout(&self, exponent: u8) -> Result<()> {
        // librdmacm's option names (rdma_cma.h): level RDMA_OPTION_ID, option
        // RDMA_OPTION_ID_ACK_TIMEOUT, a u8 value.
        const RDMA_OPTION_ID: i32 = 0;
        const RDMA_OPTION_ID_ACK_TIMEOUT: i32 = 3;
        let mut value = exponent.min(31);
        // SAFETY: the id is alive; the option value is a valid u8 for the call's duration
        // and its length is given exactly.
        let ret = unsafe {
            rdma_set_option(
                self.inner.as_ptr(),
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_ACK_TIMEOUT,
                (&mut value as *mut u8).cast(),
                std::mem::size_of::<u8>(),
            )
        };
        check(Verb::SetOption, ret)
    }

    /// Starts listening; CONNECT_REQUEST events follow on the channel.
    pub fn listen(&self, backlog: i32) -> Result<()> {
        // SAFETY: the id is alive and bound.
        check(Verb::Listen, unsafe {
            rdma_listen(self.inner.as_ptr(), backlog)
        })
    }

    /// Starts resolving `dst` (ADDR_RESOLVED or ADDR_ERROR follows).
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let mut src_ss = src.map(|s| os::to_sockaddr(&s));
        let mut dst_ss = os::to_sockaddr(&dst);
        let src_ptr = src_ss.as_mut().map_or(std::ptr::null_mut(), |s| {
            (s as *mut libc::sockaddr_storage).cast()
        });
        // SAFETY: the id is alive; both sockaddrs are valid for the call.
        let ret = unsafe {
            rdma_resolve_addr(
                self.inner.as_ptr(),
                src_ptr,
                (&mut dst_ss as *mut libc::sockaddr_storage).cast(),
                timeout.as_millis().min(i32::MAX as u128) as i32,
            )
        };
        check(Verb::ResolveAddr, ret)
    }

    /// Starts resolving the route (ROUTE_RESOLVED or ROUTE_ERROR follows).
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        // SAFETY: the id is alive and its address is resolved.
        let ret = unsafe {
            rdma_resolve_route(
                self.inner.as_ptr(),
                timeout.as_millis().min(i32::MAX as u128) as i32,
            )
        };
        check(Verb::ResolveRoute, ret)
    }

    /// The local address (after bind or resolve).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id is alive; route.addr.src_addr is a sockaddr_storage-sized union
        // that librdmacm keeps initialised (zero family until bound).
        unsafe {
            let id = &*self.inner.as_ptr();
            os::from_sockaddr(rdma_get_local_addr(id))
        }
    }

    /// The peer's address (after resolve, or on an incoming request).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as in `local_addr`, for dst_addr.
        unsafe {
            let id = &*self.inner.as_ptr();
            os::from_sockaddr(rdma_get_peer_addr(id))
        }
    }

    /// The device this id is bound to, once bound or resolved.
    pub fn device_name(&self) -> Option<String> {
        // SAFETY: the id is alive; `verbs` is null or a librdmacm-owned context.
        let verbs = unsafe { (*self.inner.as_ptr()).verbs };
        if verbs.is_null() {
            return None;
        }
        // SAFETY: `verbs` is a live context with a valid device.
        let name = unsafe { ibv_get_device_name((*verbs).device) };
        if name.is_null() {
            return None;
        }
        // SAFETY: the name is NUL-terminated and lives as long as the device.
        Some(
            unsafe { std::ffi::CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    /// True when this id routes through `ctx` (required to use a PD from it).
    pub fn is_on(&self, ctx: &Context) -> bool {
        // SAFETY: the id is alive; `verbs` is a plain field.
        unsafe { (*self.inner.as_ptr()).verbs == ctx.as_ptr() }
    }

    /// Creates the RC QP of this id on the shared `pd`, with the given CQs; with `srq`,
    /// the QP takes its receives from that shared queue and has none of its own.
    pub fn create_qp(
        &self,
        pd: &ProtectionDomain,
        send_cq: &CompletionQueue,
        recv_cq: &CompletionQueue,
        caps: QpCaps,
        srq: Option<&SharedReceiveQueue>,
    ) -> Result<QueuePair> {
        if !self.is_on(pd.context()) {
            return Err(VerbsError::InvalidArgument(format!(
                "cm_id routes through {:?}, but the PD belongs to {}",
                self.device_name(),
                pd.context().name()
            )));
        }
        QueuePair::create(self.inner.clone(), pd, send_cq, recv_cq, caps, srq)
    }

    /// Starts connecting (ESTABLISHED, REJECTED, UNREACHABLE or CONNECT_ERROR follows).
    pub fn connect(&self, param: &ConnParam<'_>) -> Result<()> {
        check_len("connect", param.private_data, MAX_CONNECT_PRIVATE_DATA)?;
        let mut raw = param.raw();
        // SAFETY: the id is alive with a route and QP; `raw` and its private data live
        // across the call (librdmacm copies them).
        check(Verb::Connect, unsafe {
            rdma_connect(self.inner.as_ptr(), &mut raw)
        })
    }

    /// Accepts an incoming request (ESTABLISHED follows).
    pub fn accept(&self, param: &ConnParam<'_>) -> Result<()> {
        check_len("accept", param.private_data, MAX_ACCEPT_PRIVATE_DATA)?;
        let mut raw = param.raw();
        // SAFETY: as in `connect`.
        check(Verb::Accept, unsafe {
            rdma_accept(self.inner.as_ptr(), &mut raw)
        })
    }

    /// Rejects an incoming request; `private_data` reaches the peer's REJECTED event.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        check_len("reject", private_data, MAX_REJECT_PRIVATE_DATA)?;
        let ptr = if private_data.is_empty() {
            std::ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        // SAFETY: the id is alive; the data lives across the call (librdmacm copies it).
        let ret = unsafe { rdma_reject(self.inner.as_ptr(), ptr, private_data.len() as u8) };
        check(Verb::Reject, ret)
    }

    /// Starts a disconnect (DISCONNECTED follows on both sides). Both sides may call this
    /// at once; the loser gets EINVAL, which callers may ignore.
    pub fn disconnect(&self) -> Result<()> {
        // SAFETY: the id is alive.
        check(Verb::Disconnect, unsafe {
            rdma_disconnect(self.inner.as_ptr())
        })
    }

    /// Tells the CM that this id's QP is in use (`IBV_EVENT_COMM_EST`: a receive
    /// completed on the passive side before the CM saw the peer's RTU). The CM then
    /// counts the connection as established instead of resending its REP until it
    /// gives up, which would end a connection that already carries data. Called for
    /// an id whose connection is already established, it changes nothing.
    pub fn notify_established(&self) -> Result<()> {
        // SAFETY: the id is alive; IBV_EVENT_COMM_EST is the event rdma_notify takes.
        check(Verb::Notify, unsafe {
            rdma_notify(self.inner.as_ptr(), ibv_event_type::IBV_EVENT_COMM_EST)
        })
    }
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("key", &self.key())
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_rejects_say_what_they_mean() {
        assert_eq!(
            transport_reject(8),
            "no listener for the service ID (IB CM reject 8)"
        );
        assert!(transport_reject(28).contains("IB CM reject 28"));
        assert!(transport_reject(-111).contains("transport errno 111"));
        assert_eq!(transport_reject(99), "reject (IB CM reject 99)");
    }
}
