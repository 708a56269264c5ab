//! The verbs transport: the traits of [`super`] over the verbs wrapper, by delegation.
//!
//! Every method is a direct call of the wrapper's method of the same name; the work
//! requests convert by moving their fields (the two `SendWr` types have the same
//! fields, and [`crate::verbs::SendWr`] keeps its own so that the wrapper needs nothing
//! from this module). The one extra cost is in `post_send_list`, which collects the
//! converted chain into a `Vec` before the wrapper builds its own raw chain (the wrapper
//! allocates there already).

use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use crate::verbs as v;

use super::{Access, ConnParam, QpCaps, RecvWr, RemoteRegion, SendWr, Transport, WorkCompletion};

/// The verbs transport: rdma_cm and libibverbs through [`crate::verbs`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Verbs;

impl Transport for Verbs {
    type Error = v::VerbsError;
    type Domain = v::ProtectionDomain;
    type Region = v::MemoryRegion;
    type Sge<'a> = v::Sge<'a>;
    type Window = v::MemoryWindow;
    type Shared = v::SharedRegion;
    type Channel = v::CompletionChannel;
    type Cq = v::CompletionQueue;
    type CqKey = v::CqKey;
    type Srq = v::SharedReceiveQueue;
    type Qp = v::QueuePair;
    type EventChannel = v::EventChannel;
    type CmEvent = v::CmEvent;
    type CmId = v::CmId;
    type CmIdKey = v::CmIdKey;

    fn open(device: Option<&str>) -> v::Result<v::ProtectionDomain> {
        v::ProtectionDomain::new(&v::Context::open(device)?)
    }
    fn listed() -> v::Result<Vec<v::ListedDevice>> {
        v::Context::listed()
    }
    fn release_removed_devices() -> std::io::Result<usize> {
        v::release_removed_devices()
    }
    const PINS_MEMORY: bool = true;

    fn memlock_limit() -> Option<u64> {
        v::memlock_limit()
    }
}

impl<'a> From<SendWr<v::Sge<'a>>> for v::SendWr<'a> {
    fn from(w: SendWr<v::Sge<'a>>) -> Self {
        v::SendWr {
            wr_id: w.wr_id,
            op: w.op,
            local: w.local,
            signaled: w.signaled,
            inline: w.inline,
            solicited: w.solicited,
        }
    }
}

impl<'a> From<v::SendWr<'a>> for SendWr<v::Sge<'a>> {
    fn from(w: v::SendWr<'a>) -> Self {
        SendWr {
            wr_id: w.wr_id,
            op: w.op,
            local: w.local,
            signaled: w.signaled,
            inline: w.inline,
            solicited: w.solicited,
        }
    }
}

impl<'a> From<RecvWr<v::Sge<'a>>> for v::RecvWr<'a> {
    fn from(w: RecvWr<v::Sge<'a>>) -> Self {
        v::RecvWr {
            wr_id: w.wr_id,
            local: w.local,
        }
    }
}

/// The wrapper's receive chain of `wrs` (receives are posted in small batches; the
/// wrapper allocates its raw chain for more than one anyway).
fn recvs<'a>(wrs: &[RecvWr<v::Sge<'a>>]) -> Vec<v::RecvWr<'a>> {
    wrs.iter().map(|w| v::RecvWr::from(*w)).collect()
}

impl super::Domain<Verbs> for v::ProtectionDomain {
    fn register(&self, len: usize, access: Access) -> v::Result<v::MemoryRegion> {
        v::MemoryRegion::register(self, len, access)
    }
    fn register_vec(&self, bytes: Vec<u8>, access: Access) -> v::Result<v::MemoryRegion> {
        v::MemoryRegion::register_vec(self, bytes, access)
    }
    fn alloc_window(&self) -> v::Result<v::MemoryWindow> {
        v::MemoryWindow::alloc(self)
    }
    fn create_channel(&self) -> v::Result<v::CompletionChannel> {
        v::CompletionChannel::new(self.context())
    }
    fn create_cq(
        &self,
        capacity: u32,
        channel: Option<&v::CompletionChannel>,
    ) -> v::Result<v::CompletionQueue> {
        v::CompletionQueue::new(self.context(), capacity, channel)
    }
    fn create_srq(&self, max_wr: u32, max_sge: u32) -> v::Result<v::SharedReceiveQueue> {
        v::SharedReceiveQueue::new(self, max_wr, max_sge)
    }
    fn create_event_channel(&self) -> v::Result<v::EventChannel> {
        v::EventChannel::new()
    }
    fn create_id(&self, channel: &v::EventChannel) -> v::Result<v::CmId> {
        v::CmId::new(channel)
    }
    fn device_name(&self) -> &str {
        self.context().name()
    }
    fn device_index(&self) -> Option<u32> {
        self.context().index()
    }
    fn watch_async_events(&self) -> v::Result<bool> {
        self.context().watch_async_events().map(|()| true)
    }
    fn next_async_event(&self, timeout: Duration) -> v::Result<Option<v::AsyncEvent>> {
        self.context().next_async_event(timeout)
    }
}

impl super::Region<Verbs> for v::MemoryRegion {
    fn len(&self) -> usize {
        v::MemoryRegion::len(self)
    }
    fn access(&self) -> Access {
        v::MemoryRegion::access(self)
    }
    fn is_on(&self, domain: &v::ProtectionDomain) -> bool {
        self.pd().same_as(domain)
    }
    fn lkey(&self) -> u32 {
        v::MemoryRegion::lkey(self)
    }
    fn rkey(&self) -> u32 {
        v::MemoryRegion::rkey(self)
    }
    fn addr(&self) -> u64 {
        v::MemoryRegion::addr(self)
    }
    fn remote(&self) -> RemoteRegion {
        v::MemoryRegion::remote(self)
    }
    fn sge(&self, range: Range<usize>) -> v::Result<v::Sge<'_>> {
        v::MemoryRegion::sge(self, range)
    }
    fn sge_all(&self) -> v::Sge<'_> {
        v::MemoryRegion::sge_all(self)
    }
    fn split(self, chunk: usize) -> Vec<Self> {
        v::MemoryRegion::split(self, chunk)
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> v::Result<()> {
        let bytes = offset
            .checked_add(out.len())
            .and_then(|end| self.as_slice().get(offset..end))
            .ok_or_else(|| out_of_region(offset, out.len(), self.len()))?;
        out.copy_from_slice(bytes);
        Ok(())
    }
    fn write(&mut self, offset: usize, data: &[u8]) -> v::Result<()> {
        let len = v::MemoryRegion::len(self);
        let bytes = offset
            .checked_add(data.len())
            .and_then(|end| self.as_mut_slice().get_mut(offset..end))
            .ok_or_else(|| out_of_region(offset, data.len(), len))?;
        bytes.copy_from_slice(data);
        Ok(())
    }
    fn bytes(&self) -> Option<&[u8]> {
        Some(self.as_slice())
    }
    fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        Some(self.as_mut_slice())
    }
}

fn out_of_region(offset: usize, len: usize, region: usize) -> v::VerbsError {
    v::VerbsError::InvalidArgument(format!(
        "bytes {offset}+{len} outside a region of {region} bytes"
    ))
}

impl super::Window for v::MemoryWindow {
    fn next_rkey(&self) -> u32 {
        v::MemoryWindow::next_rkey(self)
    }
}

impl super::CompletionChannel<Verbs> for v::CompletionChannel {
    type Waiter = tokio::io::unix::AsyncFd<v::ChannelFd>;

    fn wait(&self, timeout: Option<Duration>) -> v::Result<Option<v::CqKey>> {
        v::CompletionChannel::wait(self, timeout)
    }
    fn waiter(&self) -> v::Result<Self::Waiter> {
        self.register_async().map_err(reactor)
    }
    async fn ready(&self, waiter: &Self::Waiter) -> v::Result<()> {
        // The poller's own sequence: readable, consume the events, clear the readiness.
        let mut guard = waiter.readable().await.map_err(reactor)?;
        while v::CompletionChannel::wait(self, Some(Duration::ZERO))?.is_some() {}
        guard.clear_ready();
        Ok(())
    }
}

/// An error of the reactor waiting on a channel's fd, named as the wait it was.
fn reactor(source: std::io::Error) -> v::VerbsError {
    v::VerbsError::Call {
        verb: v::Verb::Poll,
        source,
    }
}

impl super::CompletionQueue<Verbs> for v::CompletionQueue {
    fn poll(&self, out: &mut Vec<WorkCompletion>) -> v::Result<usize> {
        v::CompletionQueue::poll(self, out)
    }
    fn req_notify(&self, solicited_only: bool) -> v::Result<()> {
        v::CompletionQueue::req_notify(self, solicited_only)
    }
    fn key(&self) -> v::CqKey {
        v::CompletionQueue::key(self)
    }
    fn capacity(&self) -> u32 {
        v::CompletionQueue::capacity(self)
    }
}

impl super::SharedReceiveQueue<Verbs> for v::SharedReceiveQueue {
    fn post_recv(&self, wrs: &[RecvWr<v::Sge<'_>>]) -> v::Result<()> {
        v::SharedReceiveQueue::post_recv(self, &recvs(wrs))
    }
}

impl super::QueuePair<Verbs> for v::QueuePair {
    fn qp_num(&self) -> u32 {
        v::QueuePair::qp_num(self)
    }
    fn post_send(&self, wr: &SendWr<v::Sge<'_>>) -> v::Result<()> {
        v::QueuePair::post_send(self, &v::SendWr::from(*wr))
    }
    fn post_send_list(&self, wrs: &[SendWr<v::Sge<'_>>]) -> v::Result<()> {
        let wrs: Vec<v::SendWr<'_>> = wrs.iter().map(|w| v::SendWr::from(*w)).collect();
        v::QueuePair::post_send_list(self, &wrs)
    }
    fn post_recv(&self, wrs: &[RecvWr<v::Sge<'_>>]) -> v::Result<()> {
        match wrs {
            // The reposting path: one receive, no allocation (as the wrapper's own).
            [one] => v::QueuePair::post_recv(self, &[v::RecvWr::from(*one)]),
            _ => v::QueuePair::post_recv(self, &recvs(wrs)),
        }
    }
    fn to_error(&self) -> v::Result<()> {
        v::QueuePair::to_error(self)
    }
    fn set_min_rnr_timer(&self, timer: u8) -> v::Result<()> {
        v::QueuePair::set_min_rnr_timer(self, timer)
    }
    fn bind_window(
        &self,
        wr_id: u64,
        window: &v::MemoryWindow,
        region: &v::MemoryRegion,
        access: Access,
    ) -> v::Result<RemoteRegion> {
        v::QueuePair::bind_window(self, wr_id, window, region, access)
    }
    fn bind_shared_window(
        &self,
        wr_id: u64,
        window: &v::MemoryWindow,
        region: &v::SharedRegion,
        range: Range<usize>,
        access: Access,
    ) -> v::Result<RemoteRegion> {
        v::QueuePair::bind_shared_window(self, wr_id, window, region, range, access)
    }
    fn srq(&self) -> Option<&v::SharedReceiveQueue> {
        v::QueuePair::srq(self)
    }
}

impl super::SharedRegion<Verbs> for v::SharedRegion {
    fn alloc(domain: &v::ProtectionDomain, len: usize) -> v::Result<Self> {
        v::SharedRegion::alloc(domain, len)
    }
    fn alloc_versioned(
        domain: &v::ProtectionDomain,
        data_len: usize,
        copies: usize,
    ) -> v::Result<Self> {
        v::SharedRegion::alloc_versioned(domain, data_len, copies)
    }
    fn map_file(domain: &v::ProtectionDomain, file: &std::fs::File) -> v::Result<Self> {
        v::SharedRegion::map_file(domain, file)
    }
    fn len(&self) -> usize {
        v::SharedRegion::len(self)
    }
    fn copies(&self) -> usize {
        v::SharedRegion::copies(self)
    }
    fn data_len(&self) -> usize {
        v::SharedRegion::data_len(self)
    }
    fn data_offset(&self, version: u64) -> usize {
        v::SharedRegion::data_offset(self, version)
    }
    fn is_writable(&self) -> bool {
        v::SharedRegion::is_writable(self)
    }
    fn access(&self) -> Access {
        v::SharedRegion::access(self)
    }
    fn addr(&self) -> u64 {
        v::SharedRegion::addr(self)
    }
    fn is_on(&self, domain: &v::ProtectionDomain) -> bool {
        self.pd().same_as(domain)
    }
    fn same_as(&self, other: &Self) -> bool {
        v::SharedRegion::same_as(self, other)
    }
    fn version(&self) -> Option<u64> {
        v::SharedRegion::version(self)
    }
    fn read(&self, offset: usize, len: usize) -> v::Result<Vec<u8>> {
        v::SharedRegion::read(self, offset, len)
    }
    fn update(&self, f: impl FnOnce(u64, &mut [u8])) -> v::Result<u64> {
        v::SharedRegion::update(self, f)
    }
    fn publish(&self, version: u64, f: impl FnOnce(&mut [u8])) -> v::Result<()> {
        v::SharedRegion::publish(self, version, f)
    }
    fn write(&self, offset: usize, data: &[u8]) -> v::Result<u64> {
        v::SharedRegion::write(self, offset, data)
    }
}

impl super::EventChannel<Verbs> for v::EventChannel {
    fn next(&self, timeout: Option<Duration>) -> v::Result<Option<v::CmEvent>> {
        v::EventChannel::next(self, timeout)
    }
    fn try_next(&self) -> v::Result<Option<v::CmEvent>> {
        v::EventChannel::try_next(self)
    }
}

impl super::CmEvent<Verbs> for v::CmEvent {
    fn kind(&self) -> v::CmEventKind {
        self.kind
    }
    fn status(&self) -> i32 {
        self.status
    }
    fn id(&self) -> v::CmIdKey {
        self.id
    }
    fn listen_id(&self) -> Option<v::CmIdKey> {
        self.listen_id
    }
    fn private_data(&self) -> &[u8] {
        &self.private_data
    }
    fn take_request(&mut self) -> Option<v::CmId> {
        v::CmEvent::take_request(self)
    }
    fn initiator_depth(&self) -> u8 {
        self.initiator_depth
    }
    fn responder_resources(&self) -> u8 {
        self.responder_resources
    }
}

impl super::CmId<Verbs> for v::CmId {
    fn key(&self) -> v::CmIdKey {
        v::CmId::key(self)
    }
    fn bind(&self, addr: SocketAddr) -> v::Result<()> {
        v::CmId::bind(self, addr)
    }
    fn listen(&self, backlog: i32) -> v::Result<()> {
        v::CmId::listen(self, backlog)
    }
    fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> v::Result<()> {
        v::CmId::resolve_addr(self, src, dst, timeout)
    }
    fn resolve_route(&self, timeout: Duration) -> v::Result<()> {
        v::CmId::resolve_route(self, timeout)
    }
    fn set_ack_timeout(&self, exponent: u8) -> v::Result<()> {
        v::CmId::set_ack_timeout(self, exponent)
    }
    fn create_qp(
        &self,
        domain: &v::ProtectionDomain,
        send_cq: &v::CompletionQueue,
        recv_cq: &v::CompletionQueue,
        caps: QpCaps,
        srq: Option<&v::SharedReceiveQueue>,
    ) -> v::Result<v::QueuePair> {
        v::CmId::create_qp(self, domain, send_cq, recv_cq, caps, srq)
    }
    fn connect(&self, param: &ConnParam<'_>) -> v::Result<()> {
        v::CmId::connect(self, param)
    }
    fn accept(&self, param: &ConnParam<'_>) -> v::Result<()> {
        v::CmId::accept(self, param)
    }
    fn reject(&self, private_data: &[u8]) -> v::Result<()> {
        v::CmId::reject(self, private_data)
    }
    fn disconnect(&self) -> v::Result<()> {
        v::CmId::disconnect(self)
    }
    fn notify_established(&self) -> v::Result<()> {
        v::CmId::notify_established(self)
    }
    fn local_addr(&self) -> Option<SocketAddr> {
        v::CmId::local_addr(self)
    }
    fn peer_addr(&self) -> Option<SocketAddr> {
        v::CmId::peer_addr(self)
    }
    fn device_name(&self) -> Option<String> {
        v::CmId::device_name(self)
    }
    fn is_on(&self, domain: &v::ProtectionDomain) -> bool {
        v::CmId::is_on(self, domain.context())
    }
}
