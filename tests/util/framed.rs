//! A framed rdmactor peer made by hand, for tests that play a client breaking the wire
//! protocol on purpose: the hello, receives posted, frames written byte by byte.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdmactor::blocking::{self, Endpoint, EndpointOptions};
use rdmactor::proto::frame::{FrameKind, Header, HEADER_LEN};
use rdmactor::proto::hello::{Hello, Welcome, PROTOCOL_VERSION};
use rdmactor::runtime::{Incoming, PeerInfo, Server, Service, Session, SessionCx, SessionError};
use rdmactor::verbs::{Access, MemoryRegion, ProtectionDomain, RecvWr};

use crate::{flood_sends, test_addr, Recorded};

pub use rdmactor_testkit::off_thread;

/// A framed service answering every message with its bytes.
pub struct Mirror;

impl Service for Mirror {
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session> {
        Box::new(MirrorSession)
    }
}

struct MirrorSession;

impl Session for MirrorSession {
    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Incoming) -> Result<(), SessionError> {
        let data = msg.data.clone();
        cx.reply(&msg, data)
    }
}

/// A framed rdmactor connection made by hand: the hello, `depth` receives of 4 KiB
/// posted (so the server's frames never meet RNR) and the server's advertised depth.
pub fn framed_connect(
    pd: &ProtectionDomain,
    addr: std::net::SocketAddr,
) -> (Endpoint, u16, Vec<MemoryRegion>) {
    let depth = 16u16;
    let hello = Hello {
        version: PROTOCOL_VERSION,
        service: "mirror".into(),
        recv_depth: depth,
        recv_size: 4096,
        max_credits: depth,
    }
    .encode()
    .unwrap();
    let recv: Vec<MemoryRegion> = (0..depth)
        .map(|_| MemoryRegion::register(pd, 4096, Access::LOCAL_WRITE).unwrap())
        .collect();
    let ep = blocking::connect(pd, addr, &EndpointOptions::default(), &hello, |qp| {
        for (i, mr) in recv.iter().enumerate() {
            qp.post_recv(&[RecvWr {
                wr_id: 1_000_000 + i as u64,
                local: Some(mr.sge_all()),
            }])?;
        }
        Ok(())
    })
    .unwrap();
    let server_depth = Welcome::decode(&ep.peer_data).expect("welcome").recv_depth;
    (ep, server_depth, recv)
}

/// Writes a Data frame's header into `b`: `body_len` payload bytes, `credits` granted
/// to the server, tag 7.
pub fn data_frame(b: &mut [u8], credits: u32, body_len: usize) {
    Header {
        kind: FrameKind::Data,
        credits,
        len: body_len as u32,
        tag: 7,
    }
    .encode(&mut b[..HEADER_LEN]);
}

/// Starts a `mirror` server recording its close reasons.
pub fn mirror_server() -> (Server, std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let (service, reasons) = Recorded::new(Mirror);
    let server = Server::builder()
        .listen(test_addr(), None)
        .service("mirror", service)
        .start()
        .expect("server");
    let addr = server.local_addrs()[0];
    (server, addr, reasons)
}

/// A framed peer of `addr` that sends `count` frames of `bytes` bytes, each written by
/// `fill`, all in flight at once, and keeps its QP until `done` says the server acted
/// (10 s at most). Returns how many SENDs completed.
pub fn framed_peer_sends(
    ctx: &rdmactor::verbs::Context,
    addr: std::net::SocketAddr,
    bytes: usize,
    count: usize,
    fill: impl FnMut(usize, &mut [u8]),
    done: impl Fn() -> bool,
) -> usize {
    let pd = ProtectionDomain::new(ctx).unwrap();
    let (ep, _depth, _recv) = framed_connect(&pd, addr);
    let mut out = MemoryRegion::register(&pd, bytes.max(4096), Access::NONE).unwrap();
    let sent = flood_sends(&ep, &mut out, bytes, count, count, fill, &done);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    sent
}
