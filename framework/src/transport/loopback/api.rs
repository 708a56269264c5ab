//! The transport traits over the loopback objects, by delegation to their own methods
//! (which tests and tools may call directly, fault hooks included).

use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use super::cm::{CmEvent, CmId, CmIdKey, EventChannel};
use super::cq::{Channel, Cq, CqKey};
use super::error::{LoopbackError, Result};
use super::fabric::Device;
use super::mr::{Mr, Mw, Sge};
use super::qp::Qp;
use super::srq::Srq;
use crate::transport::{self as t, RecvWr, SendWr, Transport};
use crate::verbs::{Access, CmEventKind, ConnParam, QpCaps, RemoteRegion, WorkCompletion};

/// The loopback transport: every object in this process's memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct Loopback;

impl Transport for Loopback {
    const POSTS_MOVE_BYTES: bool = true;
    type Error = LoopbackError;
    type Domain = Device;
    type Region = Mr;
    type Sge<'a> = Sge<'a>;
    type Window = Mw;
    type Shared = super::Shared;
    type Channel = Channel;
    type Cq = Cq;
    type CqKey = CqKey;
    type Srq = Srq;
    type Qp = Qp;
    type EventChannel = EventChannel;
    type CmEvent = CmEvent;
    type CmId = CmId;
    type CmIdKey = CmIdKey;

    /// A device of the process's shared fabric ([`super::Fabric::shared`]), named
    /// `device` (`"loopback"` with `None`): every node that opens one reaches the others.
    fn open(device: Option<&str>) -> Result<Device> {
        Ok(super::Fabric::shared().device(device.unwrap_or("loopback")))
    }
}

impl t::Domain<Loopback> for Device {
    fn register(&self, len: usize, access: Access) -> Result<Mr> {
        Device::register(self, len, access)
    }
    fn register_vec(&self, bytes: Vec<u8>, access: Access) -> Result<Mr> {
        Mr::register_bytes(&self.core, &bytes, access)
    }
    fn alloc_window(&self) -> Result<Mw> {
        Device::alloc_window(self)
    }
    fn create_channel(&self) -> Result<Channel> {
        Device::create_channel(self)
    }
    fn create_cq(&self, capacity: u32, channel: Option<&Channel>) -> Result<Cq> {
        Device::create_cq(self, capacity, channel)
    }
    fn create_srq(&self, max_wr: u32, _max_sge: u32) -> Result<Srq> {
        Device::create_srq(self, max_wr)
    }
    fn create_event_channel(&self) -> Result<EventChannel> {
        Device::create_event_channel(self)
    }
    fn create_id(&self, channel: &EventChannel) -> Result<CmId> {
        Device::create_id(self, channel)
    }
    fn device_name(&self) -> &str {
        Device::name(self)
    }
}

impl t::Region<Loopback> for Mr {
    fn len(&self) -> usize {
        Mr::len(self)
    }
    fn access(&self) -> Access {
        Mr::access(self)
    }
    fn is_on(&self, domain: &Device) -> bool {
        std::sync::Arc::ptr_eq(self.device_core(), &domain.core)
    }
    fn lkey(&self) -> u32 {
        Mr::lkey(self)
    }
    fn rkey(&self) -> u32 {
        Mr::rkey(self)
    }
    fn addr(&self) -> u64 {
        Mr::addr(self)
    }
    fn remote(&self) -> RemoteRegion {
        Mr::remote(self)
    }
    fn sge(&self, range: Range<usize>) -> Result<Sge<'_>> {
        Mr::sge(self, range)
    }
    fn sge_all(&self) -> Sge<'_> {
        Mr::sge_all(self)
    }
    fn split(self, chunk: usize) -> Vec<Self> {
        Mr::split(self, chunk)
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        Mr::read(self, offset, out)
    }
    fn write(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        Mr::write(self, offset, data)
    }
}

impl t::Window for Mw {
    fn next_rkey(&self) -> u32 {
        Mw::next_rkey(self)
    }
}

impl t::CompletionChannel<Loopback> for Channel {
    type Waiter = ();

    fn wait(&self, timeout: Option<Duration>) -> Result<Option<CqKey>> {
        Ok(Channel::wait(self, timeout))
    }
    fn waiter(&self) -> Result<()> {
        Ok(())
    }
    async fn ready(&self, _waiter: &()) -> Result<()> {
        Channel::wait_ready(self).await;
        Ok(())
    }
}

impl t::CompletionQueue<Loopback> for Cq {
    fn poll(&self, out: &mut Vec<WorkCompletion>) -> Result<usize> {
        Cq::poll(self, out)
    }
    fn req_notify(&self, solicited_only: bool) -> Result<()> {
        Cq::req_notify(self, solicited_only);
        Ok(())
    }
    fn key(&self) -> CqKey {
        Cq::key(self)
    }
    fn capacity(&self) -> u32 {
        Cq::capacity(self)
    }
}

impl t::SharedReceiveQueue<Loopback> for Srq {
    fn post_recv(&self, wrs: &[RecvWr<Sge<'_>>]) -> Result<()> {
        Srq::post_recv(self, wrs)
    }
}

impl t::QueuePair<Loopback> for Qp {
    fn qp_num(&self) -> u32 {
        Qp::qp_num(self)
    }
    fn post_send(&self, wr: &SendWr<Sge<'_>>) -> Result<()> {
        Qp::post_send(self, wr)
    }
    fn post_send_list(&self, wrs: &[SendWr<Sge<'_>>]) -> Result<()> {
        Qp::post_send_list(self, wrs)
    }
    fn post_recv(&self, wrs: &[RecvWr<Sge<'_>>]) -> Result<()> {
        Qp::post_recv(self, wrs)
    }
    fn to_error(&self) -> Result<()> {
        Qp::to_error(self)
    }
    fn set_min_rnr_timer(&self, timer: u8) -> Result<()> {
        Qp::set_min_rnr_timer(self, timer)
    }
    fn bind_window(
        &self,
        wr_id: u64,
        window: &Mw,
        region: &Mr,
        access: Access,
    ) -> Result<RemoteRegion> {
        Qp::bind_window(self, wr_id, window, region, access)
    }
    fn bind_shared_window(
        &self,
        wr_id: u64,
        window: &Mw,
        region: &super::Shared,
        range: Range<usize>,
        access: Access,
    ) -> Result<RemoteRegion> {
        Qp::bind_shared_window(self, wr_id, window, region, range, access)
    }
    fn srq(&self) -> Option<&Srq> {
        Qp::srq(self)
    }
}

impl t::EventChannel<Loopback> for EventChannel {
    fn next(&self, timeout: Option<Duration>) -> Result<Option<CmEvent>> {
        Ok(EventChannel::next(self, timeout))
    }
    fn try_next(&self) -> Result<Option<CmEvent>> {
        Ok(EventChannel::try_next(self))
    }
}

impl t::CmEvent<Loopback> for CmEvent {
    fn kind(&self) -> CmEventKind {
        self.kind
    }
    fn status(&self) -> i32 {
        self.status
    }
    fn id(&self) -> CmIdKey {
        self.id
    }
    fn listen_id(&self) -> Option<CmIdKey> {
        self.listen_id
    }
    fn private_data(&self) -> &[u8] {
        &self.private_data
    }
    fn take_request(&mut self) -> Option<CmId> {
        CmEvent::take_request(self)
    }
}

impl t::CmId<Loopback> for CmId {
    fn key(&self) -> CmIdKey {
        CmId::key(self)
    }
    fn bind(&self, addr: SocketAddr) -> Result<()> {
        CmId::bind(self, addr)
    }
    fn listen(&self, backlog: i32) -> Result<()> {
        CmId::listen(self, backlog)
    }
    fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        CmId::resolve_addr(self, src, dst, timeout)
    }
    fn resolve_route(&self, timeout: Duration) -> Result<()> {
        CmId::resolve_route(self, timeout)
    }
    fn set_ack_timeout(&self, exponent: u8) -> Result<()> {
        CmId::set_ack_timeout(self, exponent)
    }
    fn create_qp(
        &self,
        domain: &Device,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCaps,
        srq: Option<&Srq>,
    ) -> Result<Qp> {
        CmId::create_qp(self, domain, send_cq, recv_cq, caps, srq)
    }
    fn connect(&self, param: &ConnParam<'_>) -> Result<()> {
        CmId::connect(self, param)
    }
    fn accept(&self, param: &ConnParam<'_>) -> Result<()> {
        CmId::accept(self, param)
    }
    fn reject(&self, private_data: &[u8]) -> Result<()> {
        CmId::reject(self, private_data)
    }
    fn disconnect(&self) -> Result<()> {
        CmId::disconnect(self)
    }
    fn local_addr(&self) -> Option<SocketAddr> {
        CmId::local_addr(self)
    }
    fn peer_addr(&self) -> Option<SocketAddr> {
        CmId::peer_addr(self)
    }
    fn device_name(&self) -> Option<String> {
        Some(CmId::device_name(self).to_owned())
    }
    fn is_on(&self, domain: &Device) -> bool {
        std::sync::Arc::ptr_eq(self.device_core(), &domain.core)
    }
}

impl t::SharedRegion<Loopback> for super::Shared {
    fn alloc(domain: &Device, len: usize) -> Result<Self> {
        Self::alloc(domain, len)
    }
    fn alloc_versioned(domain: &Device, data_len: usize, copies: usize) -> Result<Self> {
        Self::alloc_versioned(domain, data_len, copies)
    }
    fn map_file(domain: &Device, file: &std::fs::File) -> Result<Self> {
        Self::map_file(domain, file)
    }
    fn len(&self) -> usize {
        Self::len(self)
    }
    fn copies(&self) -> usize {
        Self::copies(self)
    }
    fn is_writable(&self) -> bool {
        Self::is_writable(self)
    }
    fn access(&self) -> Access {
        Self::access(self)
    }
    fn addr(&self) -> u64 {
        Self::addr(self)
    }
    fn is_on(&self, domain: &Device) -> bool {
        Self::is_on(self, domain)
    }
    fn same_as(&self, other: &Self) -> bool {
        Self::same_as(self, other)
    }
    fn version(&self) -> Option<u64> {
        Self::version(self)
    }
    fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        Self::read(self, offset, len)
    }
    fn update(&self, f: impl FnOnce(u64, &mut [u8])) -> Result<u64> {
        Self::update(self, f)
    }
    fn publish(&self, version: u64, f: impl FnOnce(&mut [u8])) -> Result<()> {
        Self::publish(self, version, f)
    }
    fn write(&self, offset: usize, data: &[u8]) -> Result<u64> {
        Self::write(self, offset, data)
    }
}
