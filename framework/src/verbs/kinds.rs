//! The kinds the verbs report, as Rust enums: a completion's status and opcode, an
//! rdma_cm event's type. Kept apart from the objects that produce them so that
//! `error.rs`, which names them, depends on nothing but this file, and this file on
//! nothing but the bindings.

use std::ffi::CStr;
use std::fmt;

use super::sys::*;

macro_rules! raw_enum {
    ($(#[$m:meta])* $name:ident : $module:ident { $($(#[$vm:meta])* $variant:ident = $raw:ident,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $name {
            $($(#[$vm])* $variant,)*
            /// A value this crate does not know.
            Other(u32),
        }

        impl $name {
            pub(crate) fn from_raw(raw: u32) -> Self {
                match raw {
                    $(x if x == $module::$raw => $name::$variant,)*
                    other => $name::Other(other),
                }
            }

            /// The libibverbs value.
            pub fn raw(self) -> u32 {
                match self {
                    $($name::$variant => $module::$raw,)*
                    $name::Other(v) => v,
                }
            }
        }
    };
}

raw_enum! {
    /// Completion status (`enum ibv_wc_status`).
    WcStatus: ibv_wc_status {
        /// The request completed.
        Success = IBV_WC_SUCCESS,
        /// A local length check failed (for example a RECV buffer too small).
        LocalLengthError = IBV_WC_LOC_LEN_ERR,
        /// A local QP consistency error.
        LocalQpOpError = IBV_WC_LOC_QP_OP_ERR,
        /// A local buffer was not covered by a valid lkey.
        LocalProtectionError = IBV_WC_LOC_PROT_ERR,
        /// Flushed because the QP went to the error state.
        WrFlushError = IBV_WC_WR_FLUSH_ERR,
        /// Memory window bind failed.
        MemoryWindowBindError = IBV_WC_MW_BIND_ERR,
        /// Unexpected response from the responder.
        BadResponseError = IBV_WC_BAD_RESP_ERR,
        /// Local access error on the responder side (reported to the requester).
        LocalAccessError = IBV_WC_LOC_ACCESS_ERR,
        /// The responder found the request invalid.
        RemoteInvalidRequestError = IBV_WC_REM_INV_REQ_ERR,
        /// Bad rkey, range outside the region, or access not granted at the responder.
        RemoteAccessError = IBV_WC_REM_ACCESS_ERR,
        /// The responder could not complete the operation.
        RemoteOperationError = IBV_WC_REM_OP_ERR,
        /// Transport retries exhausted (peer gone).
        RetryExceeded = IBV_WC_RETRY_EXC_ERR,
        /// Receiver-not-ready retries exhausted (peer had no RECV posted).
        RnrRetryExceeded = IBV_WC_RNR_RETRY_EXC_ERR,
        /// The remote request was aborted.
        RemoteAbortError = IBV_WC_REM_ABORT_ERR,
        /// A fatal local error.
        FatalError = IBV_WC_FATAL_ERR,
        /// Response timeout.
        ResponseTimeout = IBV_WC_RESP_TIMEOUT_ERR,
        /// General error.
        GeneralError = IBV_WC_GENERAL_ERR,
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: ibv_wc_status_str returns a static string for any value.
        let s = unsafe { CStr::from_ptr(ibv_wc_status_str(self.raw())) };
        write!(f, "{:?} ({})", self, s.to_string_lossy())
    }
}

raw_enum! {
    /// What a work completion was for (`enum ibv_wc_opcode`).
    WcOpcode: ibv_wc_opcode {
        /// A SEND (with or without immediate) finished.
        Send = IBV_WC_SEND,
        /// An RDMA WRITE (with or without immediate) finished.
        RdmaWrite = IBV_WC_RDMA_WRITE,
        /// An RDMA READ finished; the bytes are in the local buffer.
        RdmaRead = IBV_WC_RDMA_READ,
        /// A compare-and-swap finished; the old value is in the local buffer.
        CompareSwap = IBV_WC_COMP_SWAP,
        /// A fetch-and-add finished; the old value is in the local buffer.
        FetchAdd = IBV_WC_FETCH_ADD,
        /// A memory window bind finished.
        BindMw = IBV_WC_BIND_MW,
        /// A local invalidate finished.
        LocalInvalidate = IBV_WC_LOCAL_INV,
        /// A RECV consumed an incoming SEND.
        Recv = IBV_WC_RECV,
        /// A RECV consumed an incoming RDMA WRITE with immediate.
        RecvRdmaWithImm = IBV_WC_RECV_RDMA_WITH_IMM,
    }
}

/// rdma_cm event types (`enum rdma_cm_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)]
pub enum CmEventKind {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    DeviceRemoval,
    MulticastJoin,
    MulticastError,
    AddrChange,
    TimewaitExit,
    Other(u32),
}

impl CmEventKind {
    pub(super) fn from_raw(raw: u32) -> Self {
        use rdma_cm_event_type::*;
        match raw {
            RDMA_CM_EVENT_ADDR_RESOLVED => CmEventKind::AddrResolved,
            RDMA_CM_EVENT_ADDR_ERROR => CmEventKind::AddrError,
            RDMA_CM_EVENT_ROUTE_RESOLVED => CmEventKind::RouteResolved,
            RDMA_CM_EVENT_ROUTE_ERROR => CmEventKind::RouteError,
            RDMA_CM_EVENT_CONNECT_REQUEST => CmEventKind::ConnectRequest,
            RDMA_CM_EVENT_CONNECT_RESPONSE => CmEventKind::ConnectResponse,
            RDMA_CM_EVENT_CONNECT_ERROR => CmEventKind::ConnectError,
            RDMA_CM_EVENT_UNREACHABLE => CmEventKind::Unreachable,
            RDMA_CM_EVENT_REJECTED => CmEventKind::Rejected,
            RDMA_CM_EVENT_ESTABLISHED => CmEventKind::Established,
            RDMA_CM_EVENT_DISCONNECTED => CmEventKind::Disconnected,
            RDMA_CM_EVENT_DEVICE_REMOVAL => CmEventKind::DeviceRemoval,
            RDMA_CM_EVENT_MULTICAST_JOIN => CmEventKind::MulticastJoin,
            RDMA_CM_EVENT_MULTICAST_ERROR => CmEventKind::MulticastError,
            RDMA_CM_EVENT_ADDR_CHANGE => CmEventKind::AddrChange,
            RDMA_CM_EVENT_TIMEWAIT_EXIT => CmEventKind::TimewaitExit,
            other => CmEventKind::Other(other),
        }
    }
}
