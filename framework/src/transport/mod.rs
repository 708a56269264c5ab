//! Transports: what rdmactor asks of an RDMA stack, as traits, so that the runtime can
//! later be generic over where its bytes go (issue 29, item 1).
//!
//! Two transports implement them:
//! - the verbs wrapper ([`crate::verbs`], rdma_cm and libibverbs), the default and the
//!   only one the runtime uses today; its implementation (`verbs.rs` here) only
//!   delegates, so a runtime generic over [`Transport`] and instantiated with [`Verbs`]
//!   makes the calls it makes now (a chain of several work requests is collected into
//!   the wrapper's own type once more on the way, where the wrapper allocates anyway);
//! - [`loopback`], an in-memory transport for one process, faithful where rdmactor
//!   depends on RDMA semantics, with fault hooks for tests.
//!
//! The runtime is generic over them, with [`Verbs`] as the default; `docs/loopback.md`
//! lists what remains.
//!
//! # Shape
//!
//! One family trait, [`Transport`], names a type for each verbs object; a trait per
//! object says what the runtime does with it. Everything is generic (associated types),
//! never `dyn`: the data path (`post_send`, `post_recv`, `poll`) is a direct, inlinable
//! call on the concrete type, as it is today.
//!
//! | verbs object | associated type | trait |
//! |---|---|---|
//! | context + protection domain | `Domain` | [`Domain`]: registers memory, creates CQs, channels, SRQs, cm_ids |
//! | memory region (and its scatter/gather entries) | `Region`, `Sge<'a>` | [`Region`] |
//! | memory window (type 2) | `Window` | (opaque; bound by [`QueuePair::bind_window`], revoked by drop) |
//! | a registration granted per connection | `Shared` | [`SharedRegion`] (bound by [`QueuePair::bind_shared_window`]) |
//! | completion channel | `Channel` | [`CompletionChannel`] |
//! | completion queue | `Cq` | [`CompletionQueue`] |
//! | shared receive queue | `Srq` | [`SharedReceiveQueue`] |
//! | RC queue pair | `Qp` | [`QueuePair`] |
//! | rdma_cm event channel, event, id | `EventChannel`, `CmEvent`, `CmId` | [`EventChannel`], [`CmEvent`], [`CmId`] |
//!
//! Work requests are [`SendWr`] and [`RecvWr`], generic over the transport's
//! scatter/gather entry; the verbs wrapper's own `SendWr`/`RecvWr` convert to and from
//! them field by field. The operation ([`SendOp`]), remote addresses ([`RemoteRegion`]),
//! access flags ([`Access`]), completions ([`WorkCompletion`], [`WcStatus`],
//! [`WcOpcode`]), connection parameters ([`ConnParam`]) and CM event kinds
//! ([`CmEventKind`]) are the verbs wrapper's plain types, shared as they are: none of
//! them touches a verbs object.

pub mod loopback;
mod shared;
mod verbs;

use std::fmt;
use std::hash::Hash;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

pub use self::shared::{accepts, copy_of, SharedRegion, VERSION_LEN};
pub use self::verbs::Verbs;
pub use crate::verbs::{
    Access, AsyncEvent, CmEventKind, ConnParam, ListedDevice, QpCaps, RemoteRegion, SendOp,
    WcOpcode, WcStatus, WorkCompletion,
};

/// A send-queue work request, over a transport's scatter/gather entry `L`. The fields
/// are those of [`crate::verbs::SendWr`], so the verbs transport converts by moving them.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<L> {
    /// Returned in the completion; the runtime keeps a slab index here.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local bytes (source of SEND and WRITE, destination of READ and atomics).
    pub local: Option<L>,
    /// Produce a completion on success (errors and flushes always complete).
    pub signaled: bool,
    /// Copy the bytes at post time (small SEND and WRITE only).
    pub inline: bool,
    /// Set the solicited-event bit (wakes a peer armed with `solicited_only`).
    pub solicited: bool,
}

impl<L> SendWr<L> {
    /// A signaled request of `op` with `local` bytes: what nearly every post is.
    pub fn new(wr_id: u64, op: SendOp, local: Option<L>) -> Self {
        SendWr {
            wr_id,
            op,
            local,
            signaled: true,
            inline: false,
            solicited: false,
        }
    }
}

/// A receive-queue work request, over a transport's scatter/gather entry `L`.
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<L> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where an incoming SEND lands (`None`: only a WRITE_WITH_IMM without payload fits).
    pub local: Option<L>,
}

/// A family of RDMA objects that work together: the types a runtime generic over the
/// transport names, so that nothing on the data path is dispatched dynamically.
pub trait Transport: Sized + Send + Sync + 'static {
    /// True when posting a work request moves its bytes on the posting thread (loopback,
    /// which has no NIC), false when a device moves them later (verbs). What a post
    /// costs the poster differs: over verbs a doorbell (under Soft-RoCE a system call
    /// and a run of the kernel's requester), worth sharing among a connection's posts;
    /// over loopback the bytes, which one turn should not gather. A poller stepping a
    /// connection's bulk completions (`runtime::turns`) lets it hold its posts until its
    /// last step only where this is false.
    const POSTS_MOVE_BYTES: bool = false;
    /// What every fallible call reports.
    type Error: std::error::Error + Send + Sync + 'static;
    /// A device opened with one protection domain: what objects are created on.
    type Domain: Domain<Self>;
    /// Registered memory.
    type Region: Region<Self>;
    /// A checked range of a region, borrowed for the post call.
    type Sge<'a>: Copy + fmt::Debug;
    /// A memory window: remote access to part of a region for one QP, revoked on drop.
    type Window: Window;
    /// Memory registered once and granted to each connection through a window over a
    /// range of it (`SessionCx::grant`); updated in place by the application.
    type Shared: SharedRegion<Self>;
    /// What a sleeping poller waits on.
    type Channel: CompletionChannel<Self>;
    /// A completion queue.
    type Cq: CompletionQueue<Self>;
    /// Which CQ a channel event was for.
    type CqKey: Copy + Eq + Hash + fmt::Debug + Send + Sync + Unpin;
    /// A shared receive queue.
    type Srq: SharedReceiveQueue<Self>;
    /// A reliable-connected queue pair.
    type Qp: QueuePair<Self>;
    /// Where connection-manager events arrive.
    type EventChannel: EventChannel<Self>;
    /// One connection-manager event.
    type CmEvent: CmEvent<Self>;
    /// A connection-manager id: one side of one connection, or a listener.
    type CmId: CmId<Self>;
    /// Which cm_id an event is about, for routing it to its connection.
    type CmIdKey: Copy + Eq + Hash + Ord + fmt::Debug + Send + Sync + Unpin + 'static;

    /// Opens the device named `device` (the first one with `None`) with one protection
    /// domain: what a node serves on.
    fn open(device: Option<&str>) -> Result<Self::Domain, Self::Error>;

    /// The devices there are now: how a server notices that a device it lost has come
    /// back. A transport whose devices cannot go lists none (the default).
    fn listed() -> Result<Vec<ListedDevice>, Self::Error> {
        Ok(Vec::new())
    }

    /// Releases what this process still holds of removed devices, so that the kernel
    /// can finish removing them; how many handles it released (verbs: see
    /// [`crate::verbs::release_removed_devices`]). Nothing to do by default.
    fn release_removed_devices() -> std::io::Result<usize> {
        Ok(0)
    }

    /// Whether registering memory pins it, so that the process's locked-memory limit
    /// (`RLIMIT_MEMLOCK`) applies to registrations: true for verbs, not for memory that
    /// never leaves the process.
    const PINS_MEMORY: bool = false;

    /// The locked-memory limit registrations count against (`None`: unlimited). Read
    /// only where [`PINS_MEMORY`](Self::PINS_MEMORY) holds.
    fn memlock_limit() -> Option<u64> {
        None
    }
}

/// A device and its protection domain: everything is created here, so that objects of
/// one domain can reach each other's memory and nothing else can.
pub trait Domain<T: Transport>: Unpin + Clone + Send + Sync + fmt::Debug {
    /// Registers `len` zeroed bytes with `access` (remote write or atomics imply local
    /// write, as the verbs wrapper does).
    fn register(&self, len: usize, access: Access) -> Result<T::Region, T::Error>;
    /// Registers the bytes of `bytes` with `access`: a message about to be offered for
    /// the peer's READ. The default registers and copies; verbs registers the vector
    /// where it lies, without a copy.
    fn register_vec(&self, bytes: Vec<u8>, access: Access) -> Result<T::Region, T::Error> {
        let mut region = self.register(bytes.len(), access)?;
        region.write(0, &bytes)?;
        Ok(region)
    }
    /// Allocates a memory window, unbound.
    fn alloc_window(&self) -> Result<T::Window, T::Error>;
    /// Creates a completion channel.
    fn create_channel(&self) -> Result<T::Channel, T::Error>;
    /// Creates a CQ of at least `capacity` entries, attached to `channel` if given.
    fn create_cq(&self, capacity: u32, channel: Option<&T::Channel>) -> Result<T::Cq, T::Error>;
    /// Creates a shared receive queue of `max_wr` receives of `max_sge` entries.
    fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<T::Srq, T::Error>;
    /// Creates a connection-manager event channel.
    fn create_event_channel(&self) -> Result<T::EventChannel, T::Error>;
    /// Creates a cm_id whose events arrive on `channel`.
    fn create_id(&self, channel: &T::EventChannel) -> Result<T::CmId, T::Error>;
    /// The device's name (for logs, and to find it again after it went).
    fn device_name(&self) -> &str;
    /// The kernel's index of the device, if it has one: a device removed and added
    /// again under the same name gets a new one.
    fn device_index(&self) -> Option<u32> {
        None
    }
    /// Starts delivering the device's asynchronous events (a QP in error, a port down,
    /// the device failed) to [`next_async_event`](Self::next_async_event); `false` when
    /// the transport has none to deliver (the default), and nobody need wait for them.
    fn watch_async_events(&self) -> Result<bool, T::Error> {
        Ok(false)
    }
    /// The next asynchronous event, waiting up to `timeout`.
    fn next_async_event(&self, timeout: Duration) -> Result<Option<AsyncEvent>, T::Error> {
        std::thread::sleep(timeout);
        Ok(None)
    }
}

/// Registered memory. The bytes are reached by copies (`read`, `write`) rather than
/// slices, because a transport whose "NIC" is another thread of this process cannot
/// hand out a `&[u8]` that the NIC may write underneath without a data race; the verbs
/// transport implements them with one `copy_from_slice`.
pub trait Region<T: Transport>: Unpin + Send + Sync + fmt::Debug + Sized {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True for an empty region (never produced by `register`).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The access the registration grants.
    fn access(&self) -> Access;
    /// Whether it was registered on `domain` (only then may that domain's QPs use it).
    fn is_on(&self, domain: &T::Domain) -> bool;
    /// The local key.
    fn lkey(&self) -> u32;
    /// The remote key (useful only with remote access).
    fn rkey(&self) -> u32;
    /// The address of the first byte, as peers name it in [`RemoteRegion`].
    fn addr(&self) -> u64;
    /// What a peer needs to reach the whole region.
    fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.addr(),
            len: self.len() as u64,
            rkey: self.rkey(),
        }
    }
    /// A scatter/gather entry over `range` (bytes from the start of this region).
    fn sge(&self, range: Range<usize>) -> Result<T::Sge<'_>, T::Error>;
    /// A scatter/gather entry over the whole region.
    fn sge_all(&self) -> T::Sge<'_>;
    /// Splits into consecutive disjoint regions of `chunk` bytes (the pool's arenas).
    fn split(self, chunk: usize) -> Vec<Self>;
    /// Copies `out.len()` bytes from `offset` out of the region.
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), T::Error>;
    /// Copies `data` into the region at `offset`.
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), T::Error>;
    /// The bytes in place, when the transport can lend them (verbs can: the NIC is not
    /// a thread of this process), so that a hot path such as frame decoding needs no
    /// copy there; `None` means use [`read`](Self::read).
    fn bytes(&self) -> Option<&[u8]> {
        None
    }
    /// The bytes in place, mutably, where [`bytes`](Self::bytes) lends them.
    fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        None
    }
    /// Hands `f` the bytes of `range`: in place where the transport lends them, else a
    /// copy. `None` for a range outside the region.
    fn with_bytes<R>(&self, range: Range<usize>, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        if let Some(bytes) = self.bytes() {
            return bytes.get(range).map(f);
        }
        let mut copy = vec![0; range.end.checked_sub(range.start)?];
        self.read(range.start, &mut copy).ok()?;
        Some(f(&copy))
    }
    /// Hands `f` the bytes of `range` to change: in place where the transport lends
    /// them, else a copy written back after `f`. `None` for a range outside the region.
    fn with_bytes_mut<R>(
        &mut self,
        range: Range<usize>,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        if let Some(bytes) = self.bytes_mut() {
            return bytes.get_mut(range).map(f);
        }
        let mut copy = vec![0; range.end.checked_sub(range.start)?];
        self.read(range.start, &mut copy).ok()?;
        let r = f(&mut copy);
        self.write(range.start, &copy).ok()?;
        Some(r)
    }
}

/// A type 2 memory window.
pub trait Window: Unpin + Send + Sync + fmt::Debug {
    /// The rkey its next bind will give: known before the bind is posted, so a
    /// connection can write the frame that carries it while the bind waits in its queue
    /// (the post checks the bind gave exactly this).
    fn next_rkey(&self) -> u32;
}

/// A completion channel: one wake-up per armed CQ that got a completion, for a thread
/// (`wait`) or for a task on the poller's tokio runtime (`waiter`, then `ready`).
pub trait CompletionChannel<T: Transport>: Unpin + Clone + Send + Sync {
    /// What a task holds to await events without blocking its thread (verbs: the
    /// channel's fd registered with the reactor).
    type Waiter: Send + Sync;
    /// Waits up to `timeout` (forever with `None`) for a CQ event and consumes it;
    /// `None` on timeout. The CQ must be armed again and drained after.
    fn wait(&self, timeout: Option<Duration>) -> Result<Option<T::CqKey>, T::Error>;
    /// Prepares to await events; call inside the tokio runtime that will await them.
    fn waiter(&self) -> Result<Self::Waiter, T::Error>;
    /// Resolves once at least one event arrived, having consumed every event there is;
    /// the poller then arms its CQs again and drains them.
    fn ready<'a>(
        &'a self,
        waiter: &'a Self::Waiter,
    ) -> impl std::future::Future<Output = Result<(), T::Error>> + Send + 'a;
}

/// A completion queue.
pub trait CompletionQueue<T: Transport>: Unpin + Clone + Send + Sync + fmt::Debug {
    /// Appends up to [`crate::verbs::POLL_BATCH`] completions to `out`; returns how many.
    fn poll(&self, out: &mut Vec<WorkCompletion>) -> Result<usize, T::Error>;
    /// Arms the CQ: the next completion (or next solicited or failed one) raises one
    /// channel event.
    fn req_notify(&self, solicited_only: bool) -> Result<(), T::Error>;
    /// Which CQ this is, as [`CompletionChannel::wait`] reports it.
    fn key(&self) -> T::CqKey;
    /// Completions it can hold.
    fn capacity(&self) -> u32;
}

/// A shared receive queue: receives that every QP created on it consumes from.
pub trait SharedReceiveQueue<T: Transport>: Unpin + Clone + Send + Sync + fmt::Debug {
    /// Posts receives; the buffers must stay registered until they complete.
    fn post_recv(&self, wrs: &[RecvWr<T::Sge<'_>>]) -> Result<(), T::Error>;
}

/// A reliable-connected queue pair.
pub trait QueuePair<T: Transport>: Unpin + Clone + Send + Sync + fmt::Debug {
    /// The QP number: completions carry it, pollers route by it.
    fn qp_num(&self) -> u32;
    /// Posts one send-queue request.
    fn post_send(&self, wr: &SendWr<T::Sge<'_>>) -> Result<(), T::Error>;
    /// Posts a chain of send-queue requests, executed in order.
    fn post_send_list(&self, wrs: &[SendWr<T::Sge<'_>>]) -> Result<(), T::Error>;
    /// Posts receives (an error for a QP on a shared receive queue).
    fn post_recv(&self, wrs: &[RecvWr<T::Sge<'_>>]) -> Result<(), T::Error>;
    /// Moves the QP to the error state: every outstanding request completes with
    /// [`WcStatus::WrFlushError`].
    fn to_error(&self) -> Result<(), T::Error>;
    /// Sets the RNR NAK timer this QP advertises as a responder (the IB code, 0..=31).
    fn set_min_rnr_timer(&self, timer: u8) -> Result<(), T::Error>;
    /// Binds `window` to this QP over all of `region` with the remote part of `access`,
    /// as a signaled send-queue request ordered with the others; returns what the peer
    /// needs. The region needs [`Access::MW_BIND`].
    fn bind_window(
        &self,
        wr_id: u64,
        window: &T::Window,
        region: &T::Region,
        access: Access,
    ) -> Result<RemoteRegion, T::Error>;
    /// Binds `window` to this QP over `range` of the shared region `region` with
    /// `access` (remote flags only, at least one; write or atomic only on a writable
    /// region), as a signaled send-queue request ordered with the others; returns what
    /// the peer needs. The window grants this QP's peer alone, until it is bound again
    /// or dropped.
    fn bind_shared_window(
        &self,
        wr_id: u64,
        window: &T::Window,
        region: &T::Shared,
        range: Range<usize>,
        access: Access,
    ) -> Result<RemoteRegion, T::Error>;
    /// The shared receive queue its receives come from, if any.
    fn srq(&self) -> Option<&T::Srq>;
}

/// Where connection-manager events arrive.
pub trait EventChannel<T: Transport>: Unpin + Clone + Send + Sync {
    /// The next event, waiting up to `timeout` (forever with `None`).
    fn next(&self, timeout: Option<Duration>) -> Result<Option<T::CmEvent>, T::Error>;
    /// The next event if one is ready.
    fn try_next(&self) -> Result<Option<T::CmEvent>, T::Error>;
}

/// One connection-manager event, already acknowledged.
pub trait CmEvent<T: Transport>: Unpin + Send + fmt::Debug {
    /// What happened.
    fn kind(&self) -> CmEventKind;
    /// For REJECTED the reject reason; for errors -errno.
    fn status(&self) -> i32;
    /// The id the event is about (for CONNECT_REQUEST: the new id).
    fn id(&self) -> T::CmIdKey;
    /// For CONNECT_REQUEST: the listening id it arrived on.
    fn listen_id(&self) -> Option<T::CmIdKey>;
    /// The peer's private data (CONNECT_REQUEST, ESTABLISHED on the active side,
    /// REJECTED); transports may pad it.
    fn private_data(&self) -> &[u8];
    /// For CONNECT_REQUEST: the new id, to create a QP on and accept or reject.
    fn take_request(&mut self) -> Option<T::CmId>;
    /// For CONNECT_REQUEST: the READs the peer will have outstanding at us at once
    /// (what our responder resources must cover).
    fn initiator_depth(&self) -> u8 {
        16
    }
    /// For CONNECT_REQUEST: the READs the peer can serve at once (what our initiator
    /// depth may use).
    fn responder_resources(&self) -> u8 {
        16
    }
}

/// A connection-manager id, with the calls the runtime makes on it, in the order it
/// makes them: passive `bind` and `listen`; active `resolve_addr`, `resolve_route`,
/// `create_qp`, `connect`; on a request `create_qp` then `accept` or `reject`; either
/// side `disconnect`.
pub trait CmId<T: Transport>: Unpin + Clone + Send + Sync + fmt::Debug {
    /// Routes events to this id's connection.
    fn key(&self) -> T::CmIdKey;
    /// Binds a listener's address.
    fn bind(&self, addr: SocketAddr) -> Result<(), T::Error>;
    /// Starts listening (CONNECT_REQUEST events follow).
    fn listen(&self, backlog: i32) -> Result<(), T::Error>;
    /// Starts resolving `dst` (ADDR_RESOLVED or ADDR_ERROR follows).
    fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), T::Error>;
    /// Starts resolving the route (ROUTE_RESOLVED or ROUTE_ERROR follows).
    fn resolve_route(&self, timeout: Duration) -> Result<(), T::Error>;
    /// Sets the transport's ACK timeout as the IB exponent (4.096 us × 2^exponent).
    fn set_ack_timeout(&self, exponent: u8) -> Result<(), T::Error>;
    /// Creates this id's RC QP on `domain`, receiving from `srq` if given.
    fn create_qp(
        &self,
        domain: &T::Domain,
        send_cq: &T::Cq,
        recv_cq: &T::Cq,
        caps: QpCaps,
        srq: Option<&T::Srq>,
    ) -> Result<T::Qp, T::Error>;
    /// Starts connecting (ESTABLISHED, REJECTED, UNREACHABLE or CONNECT_ERROR follows).
    fn connect(&self, param: &ConnParam<'_>) -> Result<(), T::Error>;
    /// Accepts a request (ESTABLISHED follows on both sides).
    fn accept(&self, param: &ConnParam<'_>) -> Result<(), T::Error>;
    /// Rejects a request; `private_data` reaches the peer's REJECTED event.
    fn reject(&self, private_data: &[u8]) -> Result<(), T::Error>;
    /// Starts a disconnect (DISCONNECTED follows on both sides).
    fn disconnect(&self) -> Result<(), T::Error>;
    /// The device said this id's QP carries data (`IBV_EVENT_COMM_EST`) before the CM
    /// saw the connection established: tell the CM. A transport whose CM cannot lose
    /// the last handshake message has nothing to do.
    fn notify_established(&self) -> Result<(), T::Error> {
        Ok(())
    }
    /// The local address, once bound or resolved.
    fn local_addr(&self) -> Option<SocketAddr>;
    /// The peer's address, once resolved or on an incoming request.
    fn peer_addr(&self) -> Option<SocketAddr>;
    /// The device this id routes through, once bound or resolved.
    fn device_name(&self) -> Option<String>;
    /// Whether this id routes through `domain`'s device (a QP on it may use that PD).
    fn is_on(&self, domain: &T::Domain) -> bool;
}
