//! Completion queues, completion channels and work completions.

use std::fmt;
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use super::sys::*;

use super::device::Context;
use super::error::{check, check_ptr, Result, Verb, VerbsError};
use super::kinds::{WcOpcode, WcStatus};
use super::os;

/// A completion channel: a file descriptor that becomes readable when an armed CQ gets
/// a completion. Lets a poller thread sleep instead of spinning.
#[derive(Clone)]
pub struct CompletionChannel {
    inner: Arc<ChannelInner>,
}

struct ChannelInner {
    _ctx: Context,
    ch: NonNull<ibv_comp_channel>,
}

// SAFETY: the channel is a kernel fd wrapper; verbs on it are thread-safe. Destroyed once.
unsafe impl Send for ChannelInner {}
// SAFETY: as above.
unsafe impl Sync for ChannelInner {}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        // SAFETY: every CQ attached to this channel holds an Arc to it, so none is left.
        let ret = unsafe { ibv_destroy_comp_channel(self.ch.as_ptr()) };
        if ret != 0 {
            tracing::error!(errno = ret, "ibv_destroy_comp_channel failed");
        }
    }
}

/// Identifies which CQ a completion-channel event was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqKey(usize);

impl CompletionChannel {
    /// Creates a completion channel on `ctx`.
    pub fn new(ctx: &Context) -> Result<Self> {
        // SAFETY: the context is open; we keep a clone so it outlives the channel.
        let ch = unsafe { ibv_create_comp_channel(ctx.as_ptr()) };
        let ch = check_ptr(Verb::CreateCompChannel, ch)?;
        let chan = CompletionChannel {
            inner: Arc::new(ChannelInner {
                _ctx: ctx.clone(),
                ch,
            }),
        };
        os::set_nonblocking(chan.fd(), Verb::CreateCompChannel)?;
        Ok(chan)
    }

    /// The channel's file descriptor (non-blocking).
    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is alive; `fd` is a plain field.
        unsafe { (*self.inner.ch.as_ptr()).fd }
    }

    /// Waits up to `timeout` for a CQ event and acknowledges it. Returns which CQ fired,
    /// or `None` on timeout. The CQ must be re-armed with `req_notify` and then drained.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<Option<CqKey>> {
        if !os::poll_readable(self.fd(), timeout)? {
            return Ok(None);
        }
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut cq_ctx: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: the channel is alive and both out-pointers are valid.
        let ret = unsafe { ibv_get_cq_event(self.inner.ch.as_ptr(), &mut cq, &mut cq_ctx) };
        if ret != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(VerbsError::Call {
                verb: Verb::GetCqEvent,
                source: err,
            });
        }
        // Acknowledge at once: ibv_destroy_cq waits for every event to be acked, and the
        // caller never needs the event object itself.
        // SAFETY: `cq` was returned by ibv_get_cq_event and cannot be destroyed before
        // this ack (destroy blocks on unacked events).
        unsafe { ibv_ack_cq_events(cq, 1) };
        Ok(Some(CqKey(cq as usize)))
    }
}

/// A completion channel's fd, kept open by the channel handle inside, for registration
/// with an async reactor.
#[derive(Clone)]
pub struct ChannelFd(CompletionChannel);

impl std::os::fd::AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.fd()
    }
}

impl CompletionChannel {
    /// Registers the channel's fd with the current tokio reactor, to await CQ events
    /// without a blocking thread. Must be called inside a tokio runtime.
    pub fn register_async(&self) -> std::io::Result<tokio::io::unix::AsyncFd<ChannelFd>> {
        let inner = ChannelFd(self.clone());
        // SAFETY: the fd belongs to the channel held inside `inner`, which keeps it open
        // and unchanged for as long as the AsyncFd owns `inner`.
        unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(inner, tokio::io::Interest::READABLE)
        }
        .map_err(std::io::Error::from)
    }
}

/// A completion queue. Cheap to clone; destroyed after the last QP using it is gone.
#[derive(Clone)]
pub struct CompletionQueue {
    inner: Arc<CqInner>,
}

struct CqInner {
    _ctx: Context,
    _channel: Option<CompletionChannel>,
    cq: NonNull<ibv_cq>,
    capacity: u32,
}

// SAFETY: ibv_poll_cq / ibv_req_notify_cq are thread-safe in libibverbs providers; the CQ
// is destroyed once in Drop.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc to it, so none is left.
        let ret = unsafe { ibv_destroy_cq(self.cq.as_ptr()) };
        if ret != 0 {
            tracing::error!(errno = ret, "ibv_destroy_cq failed");
        }
    }
}

/// Completions polled in one `ibv_poll_cq` call at most.
pub const POLL_BATCH: usize = 32;

impl CompletionQueue {
    /// Creates a CQ with room for at least `capacity` completions, optionally attached to
    /// a completion channel for event-driven polling.
    pub fn new(ctx: &Context, capacity: u32, channel: Option<&CompletionChannel>) -> Result<Self> {
        let ch = channel.map_or(std::ptr::null_mut(), |c| c.inner.ch.as_ptr());
        let cqe = i32::try_from(capacity.max(1))
            .map_err(|_| VerbsError::InvalidArgument("CQ capacity too large".into()))?;
        // SAFETY: the context (and channel, when given) are alive and kept alive by the
        // clones stored below.
        let cq = unsafe { ibv_create_cq(ctx.as_ptr(), cqe, std::ptr::null_mut(), ch, 0) };
        let cq = check_ptr(Verb::CreateCq, cq)?;
        // SAFETY: the CQ was just created; `cqe` is the real size the provider chose.
        let real = unsafe { cq.as_ref().cqe }.max(0) as u32;
        Ok(CompletionQueue {
            inner: Arc::new(CqInner {
                _ctx: ctx.clone(),
                _channel: channel.cloned(),
                cq,
                capacity: real,
            }),
        })
    }

    /// How many completions the CQ holds (at least what was asked for).
    pub fn capacity(&self) -> u32 {
        self.inner.capacity
    }

    /// Which CQ this is, as reported by `CompletionChannel::wait`.
    pub fn key(&self) -> CqKey {
        CqKey(self.inner.cq.as_ptr() as usize)
    }

    /// Arms the CQ: the next completion (or next solicited one) raises a channel event.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        // SAFETY: the CQ is alive.
        let ret = unsafe { ibv_req_notify_cq(self.inner.cq.as_ptr(), solicited_only as i32) };
        check(Verb::ReqNotifyCq, ret)
    }

    /// Polls up to `POLL_BATCH` completions, appending them to `out`. Returns how many.
    pub fn poll(&self, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        thread_local! {
            // Zeroed once per thread, not per call: a busy poller calls this in a loop,
            // and clearing 1.5 KiB on every empty poll was measurable under emulation.
            // Entries keep whatever earlier polls wrote into fields a provider skips
            // (opcode of an error completion, say): stale but initialized values that
            // `from_raw` copies and nobody trusts for such completions.
            static WCS: std::cell::RefCell<[ibv_wc; POLL_BATCH]> = const {
                // SAFETY: ibv_wc is plain old data; all-zero is a valid value.
                std::cell::RefCell::new(unsafe { std::mem::zeroed() })
            };
        }
        WCS.with_borrow_mut(|wcs| {
            // SAFETY: the CQ is alive and `wcs` has room for POLL_BATCH entries.
            let n =
                unsafe { ibv_poll_cq(self.inner.cq.as_ptr(), POLL_BATCH as i32, wcs.as_mut_ptr()) };
            if n < 0 {
                return Err(VerbsError::from_ret(Verb::PollCq, -n));
            }
            let n = n as usize;
            out.extend(wcs[..n].iter().map(WorkCompletion::from_raw));
            Ok(n)
        })
    }

    /// Polls until `count` completions arrived or `timeout` passed (busy-polling). Meant
    /// for tests and simple synchronous tools; servers use the poller threads.
    pub fn poll_blocking(&self, count: usize, timeout: Duration) -> Result<Vec<WorkCompletion>> {
        let deadline = std::time::Instant::now() + timeout;
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            if self.poll(&mut out)? == 0 {
                if std::time::Instant::now() > deadline {
                    return Err(VerbsError::Timeout("work completions"));
                }
                std::thread::yield_now();
            }
        }
        Ok(out)
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_cq {
        self.inner.cq.as_ptr()
    }
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("capacity", &self.inner.capacity)
            .finish()
    }
}

/// A work completion, copied out of the CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The wr_id given when the request was posted.
    pub wr_id: u64,
    /// Success or why it failed.
    pub status: WcStatus,
    /// What completed (only reliable when `status` is `Success`).
    pub opcode: WcOpcode,
    /// Bytes received (RECV) or transferred (READ, atomics).
    pub byte_len: u32,
    /// Immediate data, in host order, for SEND_WITH_IMM / WRITE_WITH_IMM receives.
    pub imm_data: Option<u32>,
    /// The local QP the request belonged to: the key for routing to its connection.
    pub qp_num: u32,
    /// Provider specific error detail.
    pub vendor_err: u32,
}

impl WorkCompletion {
    fn from_raw(wc: &ibv_wc) -> Self {
        let with_imm = wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
        WorkCompletion {
            wr_id: wc.wr_id,
            status: WcStatus::from_raw(wc.status),
            opcode: WcOpcode::from_raw(wc.opcode),
            byte_len: wc.byte_len,
            // SAFETY: with IBV_WC_WITH_IMM set, the union holds imm_data (network order).
            imm_data: with_imm.then(|| u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data })),
            qp_num: wc.qp_num,
            vendor_err: wc.vendor_err,
        }
    }

    /// True when the request succeeded.
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }

    /// `Ok(self)` on success, or the typed error naming the status, wr_id and QP.
    pub fn ok(self) -> Result<Self> {
        if self.is_ok() {
            Ok(self)
        } else {
            Err(VerbsError::Completion {
                status: self.status,
                opcode: self.opcode,
                wr_id: self.wr_id,
                qp_num: self.qp_num,
                vendor_err: self.vendor_err,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_and_name_themselves() {
        for raw in 0..=21 {
            assert_eq!(WcStatus::from_raw(raw).raw(), raw);
        }
        assert_eq!(WcStatus::from_raw(10), WcStatus::RemoteAccessError);
        assert_eq!(WcStatus::from_raw(999), WcStatus::Other(999));
        let shown = WcStatus::RemoteAccessError.to_string();
        assert!(shown.starts_with("RemoteAccessError ("), "{shown}");
        assert_eq!(WcOpcode::from_raw(128), WcOpcode::Recv);
    }

    #[test]
    fn failed_completion_becomes_typed_error() {
        let wc = WorkCompletion {
            wr_id: 9,
            status: WcStatus::RetryExceeded,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm_data: None,
            qp_num: 17,
            vendor_err: 0,
        };
        let err = wc.ok().unwrap_err();
        assert_eq!(err.completion_status(), Some(WcStatus::RetryExceeded));
        assert!(err.to_string().contains("QP 17"), "{err}");
    }
}
