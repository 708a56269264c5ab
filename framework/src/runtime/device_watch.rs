//! The device's asynchronous events, read on a thread of their own and acted on: a QP
//! the device put in error (`IBV_EVENT_QP_FATAL`, `_REQ_ERR`, `_ACCESS_ERR`,
//! `PATH_MIG_ERR`) closes its connection with that reason, a QP that carried data before
//! the CM saw it established (`IBV_EVENT_COMM_EST`) has its connection tell the CM
//! (`rdma_notify`), a port going down or up is
//! logged and counted, and a failed device (`IBV_EVENT_DEVICE_FATAL`) is let go like a
//! removed one and served again when it returns (`recovery.rs`). Without this reader the events would only pile up in the kernel, and a
//! connection whose QP failed silently would wait for its keepalive to notice.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::{Message, Recipient};

use super::close::CloseReason;
use super::connection::CmNotice;
use crate::transport::{Domain, Transport};
use crate::verbs::{AsyncElement, AsyncEvent, AsyncEventKind};

/// What the CM actor is told (it knows which connection owns which QP).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) enum DeviceNotice {
    /// Tell the connection of QP `qp_num` `notice`: close, for a QP the device put in
    /// error; `CommEst`, for a receive completed before the CM saw the connection
    /// established (the peer's RTU lost or late).
    Qp { qp_num: u32, notice: CmNotice },
    /// The device failed: close every connection, release the device, wait for it to
    /// return (`recovery.rs`).
    DeviceFatal,
}

/// How often the thread looks at its stop flag while no event comes.
const TICK: Duration = Duration::from_millis(200);

/// The reading thread; stopped (at its next tick) when dropped.
pub(crate) struct DeviceWatch {
    stop: Arc<AtomicBool>,
}

impl Drop for DeviceWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// What to do about one event: the notice for the CM actor, if any. Logging and
/// counting happen in [`handle`]; this is the decision alone.
pub(crate) fn decide(ev: &AsyncEvent) -> Option<DeviceNotice> {
    use AsyncEventKind::*;
    match (ev.kind, ev.element) {
        (QpFatal | QpReqErr | QpAccessErr | PathMigErr, AsyncElement::Qp(qp_num)) => {
            let why = format!("the device reported {} for this connection's QP", ev.kind);
            Some(DeviceNotice::Qp {
                qp_num,
                notice: CmNotice::Close(CloseReason::Verbs(why)),
            })
        }
        (CommEst, AsyncElement::Qp(qp_num)) => Some(DeviceNotice::Qp {
            qp_num,
            notice: CmNotice::CommEst,
        }),
        (DeviceFatal, _) => Some(DeviceNotice::DeviceFatal),
        _ => None,
    }
}

fn handle(device: &str, ev: &AsyncEvent, cm: &Recipient<DeviceNotice>) {
    crate::metrics::device_event(ev.kind.name());
    use AsyncEventKind::*;
    match ev.kind {
        PortActive | CommEst | PathMig | SqDrained | LidChange | PkeyChange | SmChange
        | ClientReregister | GidChange | SrqLimitReached | QpLastWqeReached => {
            tracing::info!(device, event = %ev, "device event")
        }
        _ => tracing::warn!(device, event = %ev, "device event"),
    }
    if let Some(notice) = decide(ev) {
        cm.do_send(notice);
    }
}

/// Starts reading the events of `pd`'s device for the CM actor `cm`; `None` when the
/// transport has none to give (loopback).
///
/// # Errors
///
/// The event descriptor cannot be made non-blocking, or the thread cannot start.
pub(crate) fn start<T: Transport>(
    pd: &T::Domain,
    cm: Recipient<DeviceNotice>,
) -> std::io::Result<Option<DeviceWatch>> {
    if !pd.watch_async_events().map_err(std::io::Error::other)? {
        return Ok(None);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let ctx = pd.clone();
    let device = ctx.device_name().to_owned();
    std::thread::Builder::new()
        .name("rdmactor-async".into())
        .spawn(move || {
            while !flag.load(Ordering::Acquire) {
                match ctx.next_async_event(TICK) {
                    Ok(Some(ev)) => handle(&device, &ev, &cm),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::error!(device, error = %e, "reading device events failed; no longer watching");
                        return;
                    }
                }
            }
        })?;
    Ok(Some(DeviceWatch { stop }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_errors_close_their_connection_and_a_device_failure_closes_all() {
        let ev = |kind, element| AsyncEvent { kind, element };
        assert!(matches!(
            decide(&ev(AsyncEventKind::QpFatal, AsyncElement::Qp(7))),
            Some(DeviceNotice::Qp {
                qp_num: 7,
                notice: CmNotice::Close(CloseReason::Verbs(why)),
            }) if why.contains("IBV_EVENT_QP_FATAL")
        ));
        assert!(matches!(
            decide(&ev(AsyncEventKind::PathMigErr, AsyncElement::Qp(9))),
            Some(DeviceNotice::Qp {
                qp_num: 9,
                notice: CmNotice::Close(_)
            })
        ));
        assert!(matches!(
            decide(&ev(AsyncEventKind::DeviceFatal, AsyncElement::Device)),
            Some(DeviceNotice::DeviceFatal)
        ));
        for kind in [AsyncEventKind::PortErr, AsyncEventKind::PortActive] {
            assert!(decide(&ev(kind, AsyncElement::Port(1))).is_none());
        }
        assert!(matches!(
            decide(&ev(AsyncEventKind::CommEst, AsyncElement::Qp(3))),
            Some(DeviceNotice::Qp {
                qp_num: 3,
                notice: CmNotice::CommEst
            })
        ));
    }
}
