//! Typed errors for the verbs layer: every failure names the verb that failed and why.

use std::fmt;
use std::io;

use super::kinds::{CmEventKind, WcOpcode, WcStatus};

/// A libibverbs / librdmacm entry point, named so errors say exactly which call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[allow(missing_docs)]
pub enum Verb {
    GetDevices,
    QueryDevice,
    AllocPd,
    DeallocPd,
    RegMr,
    /// `ibv_get_async_event` (and making its descriptor non-blocking).
    GetAsyncEvent,
    DeregMr,
    CreateCompChannel,
    DestroyCompChannel,
    CreateCq,
    DestroyCq,
    ReqNotifyCq,
    GetCqEvent,
    PollCq,
    CreateQp,
    ModifyQp,
    QueryQp,
    PostSend,
    PostRecv,
    CreateEventChannel,
    GetCmEvent,
    CreateId,
    DestroyId,
    BindAddr,
    Listen,
    ResolveAddr,
    ResolveRoute,
    Connect,
    Accept,
    Reject,
    SetOption,
    Disconnect,
    Notify,
    MigrateId,
    AllocMw,
    Mmap,
    Poll,
    CreatePlainQp,
    ModifyQpToInit,
    ModifyQpToRtr,
    ModifyQpToRts,
    CreateAh,
    CreateSrq,
    ModifySrq,
    QuerySrq,
    PostSrqRecv,
    QueryPort,
    QueryGid,
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Verb::GetDevices => "rdma_get_devices",
            Verb::QueryDevice => "ibv_query_device",
            Verb::AllocPd => "ibv_alloc_pd",
            Verb::DeallocPd => "ibv_dealloc_pd",
            Verb::RegMr => "ibv_reg_mr",
            Verb::GetAsyncEvent => "ibv_get_async_event",
            Verb::DeregMr => "ibv_dereg_mr",
            Verb::CreateCompChannel => "ibv_create_comp_channel",
            Verb::DestroyCompChannel => "ibv_destroy_comp_channel",
            Verb::CreateCq => "ibv_create_cq",
            Verb::DestroyCq => "ibv_destroy_cq",
            Verb::ReqNotifyCq => "ibv_req_notify_cq",
            Verb::GetCqEvent => "ibv_get_cq_event",
            Verb::PollCq => "ibv_poll_cq",
            Verb::CreateQp => "rdma_create_qp",
            Verb::ModifyQp => "ibv_modify_qp",
            Verb::QueryQp => "ibv_query_qp",
            Verb::PostSend => "ibv_post_send",
            Verb::PostRecv => "ibv_post_recv",
            Verb::CreateEventChannel => "rdma_create_event_channel",
            Verb::GetCmEvent => "rdma_get_cm_event",
            Verb::CreateId => "rdma_create_id",
            Verb::DestroyId => "rdma_destroy_id",
            Verb::BindAddr => "rdma_bind_addr",
            Verb::Listen => "rdma_listen",
            Verb::ResolveAddr => "rdma_resolve_addr",
            Verb::ResolveRoute => "rdma_resolve_route",
            Verb::Connect => "rdma_connect",
            Verb::Accept => "rdma_accept",
            Verb::Reject => "rdma_reject",
            Verb::SetOption => "rdma_set_option",
            Verb::Disconnect => "rdma_disconnect",
            Verb::Notify => "rdma_notify",
            Verb::MigrateId => "rdma_migrate_id",
            Verb::AllocMw => "ibv_alloc_mw",
            Verb::Mmap => "mmap",
            Verb::Poll => "poll",
            Verb::CreatePlainQp => "ibv_create_qp",
            Verb::ModifyQpToInit => "ibv_modify_qp (RESET to INIT)",
            Verb::ModifyQpToRtr => "ibv_modify_qp (INIT to RTR)",
            Verb::ModifyQpToRts => "ibv_modify_qp (RTR to RTS)",
            Verb::CreateAh => "ibv_create_ah",
            Verb::CreateSrq => "ibv_create_srq",
            Verb::ModifySrq => "ibv_modify_srq",
            Verb::QuerySrq => "ibv_query_srq",
            Verb::PostSrqRecv => "ibv_post_srq_recv",
            Verb::QueryPort => "ibv_query_port",
            Verb::QueryGid => "ibv_query_gid",
        };
        f.write_str(name)
    }
}

/// Everything the verbs layer can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// A verb returned an error; `source` carries the errno.
    #[error("{verb} failed: {source}")]
    Call {
        /// Which call failed.
        verb: Verb,
        /// The errno it reported.
        #[source]
        source: io::Error,
    },
    /// No RDMA device is visible to librdmacm (no NIC, no rxe link, modules missing).
    #[error("no RDMA device found (is an rxe link or RDMA NIC present?)")]
    NoDevice,
    /// A device was asked for by name and is not present.
    #[error("RDMA device {0:?} not found")]
    DeviceNotFound(String),
    /// A work request completed with an error status. The QP is in the error state
    /// afterwards (as the verbs spec requires), so further work on it flushes.
    #[error("work request {wr_id} on QP {qp_num} completed with {status} ({opcode:?}, vendor_err {vendor_err:#x})")]
    Completion {
        /// The failing status (for example `RemoteAccessError`).
        status: WcStatus,
        /// The opcode reported (only meaningful for some statuses).
        opcode: WcOpcode,
        /// The wr_id of the failed request.
        wr_id: u64,
        /// The QP the request was posted on.
        qp_num: u32,
        /// Provider specific detail.
        vendor_err: u32,
    },
    /// An argument was rejected before any verb was called (range outside a region,
    /// oversize private data, zero-length registration, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The runtime's own cap on a kind of object is reached (no verb was called).
    #[error("limit reached: {0}")]
    Limit(String),
    /// A synchronous wait for one rdma_cm event got another one.
    #[error("expected rdma_cm event {expected:?}, got {got:?} (status {status})")]
    UnexpectedEvent {
        /// What the caller waited for.
        expected: CmEventKind,
        /// What arrived.
        got: CmEventKind,
        /// The event status (reject reason, -errno, ...).
        status: i32,
        /// Private data that came with it (a reject's reason, for example).
        private_data: Vec<u8>,
    },
    /// Waiting for an event or completion exceeded its deadline.
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    /// The allocator could not provide the bytes to register. An error, not an abort:
    /// the size may come from a peer, and one connection's request must not end the
    /// process.
    #[error("allocating {len} bytes for a registration failed")]
    OutOfMemory {
        /// Bytes asked for.
        len: usize,
    },
    /// Registering memory failed with the error the locked-memory limit causes, and a
    /// limit is set: pinned pages count against `RLIMIT_MEMLOCK` unless the process
    /// holds `CAP_IPC_LOCK`.
    #[error(
        "ibv_reg_mr of {len} bytes failed ({source}): this process may lock only {limit} bytes \
         of memory (RLIMIT_MEMLOCK, `ulimit -l` = {} KiB); raise it (`ulimit -l unlimited`, \
         LimitMEMLOCK=infinity in a systemd unit, `--ulimit memlock=-1` for docker) or grant \
         CAP_IPC_LOCK",
        limit / 1024
    )]
    Memlock {
        /// Bytes being registered.
        len: usize,
        /// The soft limit, in bytes.
        limit: u64,
        /// The errno `ibv_reg_mr` set.
        #[source]
        source: io::Error,
    },
}

/// Result alias of the verbs layer.
pub type Result<T, E = VerbsError> = std::result::Result<T, E>;

impl VerbsError {
    /// The errno, when the error came from a verb call.
    pub fn errno(&self) -> Option<i32> {
        match self {
            VerbsError::Call { source, .. } | VerbsError::Memlock { source, .. } => {
                source.raw_os_error()
            }
            _ => None,
        }
    }

    /// The failing completion status, when the error is a failed work request.
    pub fn completion_status(&self) -> Option<WcStatus> {
        match self {
            VerbsError::Completion { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub(crate) fn last_os(verb: Verb) -> Self {
        VerbsError::Call {
            verb,
            source: io::Error::last_os_error(),
        }
    }

    pub(crate) fn from_ret(verb: Verb, ret: i32) -> Self {
        // ibv_* verbs return the errno as a positive value; rdma_* and some ibv_* return -1
        // and set errno. Both end here so the conversion is done in one place.
        if ret > 0 {
            VerbsError::Call {
                verb,
                source: io::Error::from_raw_os_error(ret),
            }
        } else {
            Self::last_os(verb)
        }
    }
}

/// Turns a C return code into a `Result`: zero is success, anything else names `verb`.
pub(crate) fn check(verb: Verb, ret: i32) -> Result<()> {
    if ret == 0 {
        Ok(())
    } else {
        Err(VerbsError::from_ret(verb, ret))
    }
}

/// Turns a C constructor's pointer into a `Result`: null means failure with errno set.
pub(crate) fn check_ptr<T>(verb: Verb, ptr: *mut T) -> Result<std::ptr::NonNull<T>> {
    std::ptr::NonNull::new(ptr).ok_or_else(|| VerbsError::last_os(verb))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positive_returns_are_errnos() {
        let err = check(Verb::PostSend, libc::ENOMEM).unwrap_err();
        assert_eq!(err.errno(), Some(libc::ENOMEM));
        assert!(err.to_string().starts_with("ibv_post_send failed"), "{err}");
        assert!(check(Verb::PostSend, 0).is_ok());
    }
}
