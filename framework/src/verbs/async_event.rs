//! The device's asynchronous events (`ibv_get_async_event`): errors and state changes
//! that belong to no work request — a QP or CQ the device put in error, a port going
//! down or up, the whole device failing. Each event is copied into an [`AsyncEvent`]
//! and acknowledged at once (`ibv_destroy_qp` and friends wait for the
//! acknowledgement of every event naming their object, so holding one would block
//! their teardown).

use std::fmt;
use std::time::Duration;

use super::sys::*;

use super::device::Context;
use super::error::{Result, Verb, VerbsError};
use super::os::{poll_readable, set_nonblocking};

/// What happened, by the verbs name (`IBV_EVENT_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncEventKind {
    /// A CQ overran or failed; its QPs are in error.
    CqErr,
    /// A QP hit an error the device could not report in a completion.
    QpFatal,
    /// A QP received a request that violates the transport.
    QpReqErr,
    /// A QP received a request that violates its access rights.
    QpAccessErr,
    /// The first packet arrived on a QP in RTR.
    CommEst,
    /// A QP's send queue drained (SQD).
    SqDrained,
    /// A QP migrated to its alternate path.
    PathMig,
    /// A QP's path migration failed.
    PathMigErr,
    /// The device failed; nothing on it works any more.
    DeviceFatal,
    /// A port became active.
    PortActive,
    /// A port went down (link down, cable pulled, netdev down for RoCE).
    PortErr,
    /// A port's LID changed.
    LidChange,
    /// A port's P_Key table changed.
    PkeyChange,
    /// The subnet manager changed.
    SmChange,
    /// An SRQ failed.
    SrqErr,
    /// An armed SRQ fell below its limit.
    SrqLimitReached,
    /// The last WQE of a QP attached to an SRQ was consumed.
    QpLastWqeReached,
    /// The SM asks clients to re-register.
    ClientReregister,
    /// A port's GID table changed.
    GidChange,
    /// A work queue failed.
    WqFatal,
    /// A value this crate does not know.
    Other(u32),
}

impl AsyncEventKind {
    fn from_raw(t: ibv_event_type) -> Self {
        use ibv_event_type::*;
        match t {
            IBV_EVENT_CQ_ERR => Self::CqErr,
            IBV_EVENT_QP_FATAL => Self::QpFatal,
            IBV_EVENT_QP_REQ_ERR => Self::QpReqErr,
            IBV_EVENT_QP_ACCESS_ERR => Self::QpAccessErr,
            IBV_EVENT_COMM_EST => Self::CommEst,
            IBV_EVENT_SQ_DRAINED => Self::SqDrained,
            IBV_EVENT_PATH_MIG => Self::PathMig,
            IBV_EVENT_PATH_MIG_ERR => Self::PathMigErr,
            IBV_EVENT_DEVICE_FATAL => Self::DeviceFatal,
            IBV_EVENT_PORT_ACTIVE => Self::PortActive,
            IBV_EVENT_PORT_ERR => Self::PortErr,
            IBV_EVENT_LID_CHANGE => Self::LidChange,
            IBV_EVENT_PKEY_CHANGE => Self::PkeyChange,
            IBV_EVENT_SM_CHANGE => Self::SmChange,
            IBV_EVENT_SRQ_ERR => Self::SrqErr,
            IBV_EVENT_SRQ_LIMIT_REACHED => Self::SrqLimitReached,
            IBV_EVENT_QP_LAST_WQE_REACHED => Self::QpLastWqeReached,
            IBV_EVENT_CLIENT_REREGISTER => Self::ClientReregister,
            IBV_EVENT_GID_CHANGE => Self::GidChange,
            IBV_EVENT_WQ_FATAL => Self::WqFatal,
        }
    }

    /// The verbs name, as `ibv_event_type_str` and the specs spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::CqErr => "IBV_EVENT_CQ_ERR",
            Self::QpFatal => "IBV_EVENT_QP_FATAL",
            Self::QpReqErr => "IBV_EVENT_QP_REQ_ERR",
            Self::QpAccessErr => "IBV_EVENT_QP_ACCESS_ERR",
            Self::CommEst => "IBV_EVENT_COMM_EST",
            Self::SqDrained => "IBV_EVENT_SQ_DRAINED",
            Self::PathMig => "IBV_EVENT_PATH_MIG",
            Self::PathMigErr => "IBV_EVENT_PATH_MIG_ERR",
            Self::DeviceFatal => "IBV_EVENT_DEVICE_FATAL",
            Self::PortActive => "IBV_EVENT_PORT_ACTIVE",
            Self::PortErr => "IBV_EVENT_PORT_ERR",
            Self::LidChange => "IBV_EVENT_LID_CHANGE",
            Self::PkeyChange => "IBV_EVENT_PKEY_CHANGE",
            Self::SmChange => "IBV_EVENT_SM_CHANGE",
            Self::SrqErr => "IBV_EVENT_SRQ_ERR",
            Self::SrqLimitReached => "IBV_EVENT_SRQ_LIMIT_REACHED",
            Self::QpLastWqeReached => "IBV_EVENT_QP_LAST_WQE_REACHED",
            Self::ClientReregister => "IBV_EVENT_CLIENT_REREGISTER",
            Self::GidChange => "IBV_EVENT_GID_CHANGE",
            Self::WqFatal => "IBV_EVENT_WQ_FATAL",
            Self::Other(_) => "IBV_EVENT_(unknown)",
        }
    }
}

impl fmt::Display for AsyncEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Other(v) => write!(f, "IBV_EVENT_{v}"),
            k => f.write_str(k.name()),
        }
    }
}

/// The object an event is about, copied out of the event (plain numbers: the object
/// may be gone by the time anyone looks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncElement {
    /// A QP, by number.
    Qp(u32),
    /// A CQ (no number to name it by).
    Cq,
    /// An SRQ.
    Srq,
    /// A work queue.
    Wq,
    /// A port, by number.
    Port(u8),
    /// The device itself.
    Device,
}

/// One asynchronous event, already acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventKind,
    /// To what.
    pub element: AsyncElement,
}

impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.element {
            AsyncElement::Qp(n) => write!(f, "{} on QP {n}", self.kind),
            AsyncElement::Port(p) => write!(f, "{} on port {p}", self.kind),
            AsyncElement::Cq => write!(f, "{} on a CQ", self.kind),
            AsyncElement::Srq => write!(f, "{} on an SRQ", self.kind),
            AsyncElement::Wq => write!(f, "{} on a WQ", self.kind),
            AsyncElement::Device => write!(f, "{}", self.kind),
        }
    }
}

impl Context {
    /// Makes the context's async-event descriptor non-blocking, so that
    /// [`next_async_event`](Self::next_async_event) can wait with a timeout. Call once
    /// before reading events.
    ///
    /// # Errors
    ///
    /// `fcntl` failed.
    pub fn watch_async_events(&self) -> Result<()> {
        // SAFETY: the context is live while `self` is; async_fd is a plain int field.
        let fd = unsafe { (*self.as_ptr()).async_fd };
        set_nonblocking(fd, Verb::GetAsyncEvent)
    }

    /// The next asynchronous event of the device, waiting up to `timeout`; `None` if
    /// none came. The event is acknowledged before it is returned.
    ///
    /// # Errors
    ///
    /// Polling or reading the descriptor failed (other than "nothing to read").
    pub fn next_async_event(&self, timeout: Duration) -> Result<Option<AsyncEvent>> {
        // SAFETY: as in `watch_async_events`.
        let fd = unsafe { (*self.as_ptr()).async_fd };
        if !poll_readable(fd, Some(timeout))? {
            return Ok(None);
        }
        // SAFETY: ibv_async_event is plain old data; all-zero is a valid value to be
        // overwritten by the call.
        let mut ev: ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: the context is live; `ev` is a valid out-pointer.
        let ret = unsafe { ibv_get_async_event(self.as_ptr(), &mut ev) };
        if ret != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(VerbsError::Call {
                verb: Verb::GetAsyncEvent,
                source: err,
            });
        }
        let kind = AsyncEventKind::from_raw(ev.event_type);
        use AsyncEventKind::*;
        let element = match kind {
            QpFatal | QpReqErr | QpAccessErr | CommEst | SqDrained | PathMig | PathMigErr
            | QpLastWqeReached => {
                // SAFETY: for QP events the union holds the QP pointer, and the QP
                // cannot be destroyed before this event is acknowledged (below).
                let qp = unsafe { ev.element.qp };
                if qp.is_null() {
                    AsyncElement::Device
                } else {
                    // SAFETY: as above, the QP is live until the ack.
                    AsyncElement::Qp(unsafe { (*qp).qp_num })
                }
            }
            CqErr => AsyncElement::Cq,
            SrqErr | SrqLimitReached => AsyncElement::Srq,
            WqFatal => AsyncElement::Wq,
            PortActive | PortErr | LidChange | PkeyChange | SmChange | ClientReregister
            | GidChange => {
                // SAFETY: for port events the union holds the port number.
                AsyncElement::Port(unsafe { ev.element.port_num } as u8)
            }
            DeviceFatal | Other(_) => AsyncElement::Device,
        };
        // SAFETY: `ev` came from ibv_get_async_event and is acknowledged exactly once.
        unsafe { ibv_ack_async_event(&mut ev) };
        Ok(Some(AsyncEvent { kind, element }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_named_as_the_verbs_spell_them() {
        use ibv_event_type::*;
        assert_eq!(
            AsyncEventKind::from_raw(IBV_EVENT_PORT_ERR).to_string(),
            "IBV_EVENT_PORT_ERR"
        );
        assert_eq!(
            AsyncEventKind::from_raw(IBV_EVENT_QP_FATAL),
            AsyncEventKind::QpFatal
        );
        let ev = AsyncEvent {
            kind: AsyncEventKind::PortActive,
            element: AsyncElement::Port(1),
        };
        assert_eq!(ev.to_string(), "IBV_EVENT_PORT_ACTIVE on port 1");
    }
}
