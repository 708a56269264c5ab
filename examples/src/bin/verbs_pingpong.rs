//! The floor under rdmactor's latency: a SEND ping-pong on rdmactor's safe verbs layer
//! alone (no runtime, no actors, no framing), spinning on the CQ the way `ib_send_lat`
//! does. `scripts/bench` runs it next to `ib_send_lat` and the framework's echo, so the
//! table separates what the verbs wrapper costs from what the runtime adds.
//!
//! ```sh
//! verbs_pingpong server --listen 192.0.2.1:7480          # answers one client, then exits
//! verbs_pingpong client --addr 192.0.2.1:7480 --iters 5000 --size 64
//! ```

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};
use rdmactor::blocking::{self, Endpoint, EndpointOptions, Listener};
use rdmactor::verbs::{
    self, Access, Context, MemoryRegion, ProtectionDomain, QueuePair, RecvWr, SendOp, SendWr,
    WorkCompletion,
};
use rdmactor_examples::report;

#[derive(Parser)]
#[command(about = "SEND ping-pong on rdmactor's verbs layer, no runtime (a latency floor)")]
struct Args {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand)]
enum Role {
    /// Accept one connection and answer every message until the peer disconnects.
    Server {
        #[arg(long)]
        listen: SocketAddr,
    },
    /// Connect, measure `iters` round trips of `size` bytes, print percentiles.
    Client {
        #[arg(long)]
        addr: SocketAddr,
        #[arg(long, default_value_t = 5000)]
        iters: usize,
        #[arg(long, default_value_t = 64)]
        size: usize,
    },
}

/// Receive buffers kept posted; the peer never has more than one message in flight.
const RECVS: usize = 4;
/// Largest message.
const MAX_SIZE: usize = 4096;
/// Largest SEND copied into the work request (rxe takes up to 256 B inline).
const MAX_INLINE: usize = 128;

/// One side's registered memory: `RECVS` receive slots, then one send slot, each `slot`
/// bytes.
struct Buffers {
    mr: MemoryRegion,
    slot: usize,
}

impl Buffers {
    fn new(pd: &ProtectionDomain, slot: usize) -> Result<Buffers> {
        let mr = MemoryRegion::register(pd, slot * (RECVS + 1), Access::LOCAL_WRITE)?;
        Ok(Buffers { mr, slot })
    }

    fn post_recv(&self, qp: &QueuePair, slot: usize) -> verbs::Result<()> {
        let at = slot * self.slot;
        let sge = self.mr.sge(at..at + self.slot)?;
        qp.post_recv(&[RecvWr {
            wr_id: slot as u64,
            local: Some(sge),
        }])
    }

    fn post_all(&self, qp: &QueuePair) -> verbs::Result<()> {
        (0..RECVS).try_for_each(|slot| self.post_recv(qp, slot))
    }

    /// Sends `len` bytes of the send slot; every SEND is signalled, as in `ib_send_lat`.
    fn send(&self, ep: &Endpoint, len: usize) -> Result<()> {
        let at = RECVS * self.slot;
        let mut wr = SendWr::new(u64::MAX, SendOp::Send, Some(self.mr.sge(at..at + len)?));
        wr.inline = len <= MAX_INLINE;
        ep.qp.post_send(&wr)?;
        Ok(())
    }
}

/// Spins on the CQ until a receive completes, consuming send completions on the way;
/// returns the receive's slot and length.
fn next_recv(
    ep: &Endpoint,
    wcs: &mut Vec<WorkCompletion>,
    deadline: Instant,
) -> Result<(usize, usize)> {
    loop {
        wcs.clear();
        ep.cq.poll(wcs)?;
        let mut got = None;
        for wc in wcs.iter() {
            if !wc.is_ok() {
                bail!("completion failed: {:?}", wc.status);
            }
            if wc.wr_id != u64::MAX {
                got = Some((wc.wr_id as usize, wc.byte_len as usize));
            }
        }
        if let Some(got) = got {
            return Ok(got);
        }
        if Instant::now() > deadline {
            bail!("no message within the deadline");
        }
    }
}

fn serve(pd: &ProtectionDomain, listen: SocketAddr) -> Result<()> {
    let listener = Listener::bind(listen).context("listen")?;
    let bufs = Buffers::new(pd, MAX_SIZE)?;
    let ep = listener.accept(pd, &EndpointOptions::default(), b"", |qp| bufs.post_all(qp))?;
    let mut wcs = Vec::with_capacity(32);
    loop {
        let (slot, len) = next_recv(&ep, &mut wcs, Instant::now() + Duration::from_secs(30))?;
        bufs.post_recv(&ep.qp, slot)?;
        // The client ends the run with a zero-length message.
        if len == 0 {
            break;
        }
        bufs.send(&ep, len)?;
    }
    ep.wait_disconnected()?;
    Ok(())
}

fn ping(pd: &ProtectionDomain, addr: SocketAddr, iters: usize, size: usize) -> Result<()> {
    if size == 0 || size > MAX_SIZE {
        bail!("--size must be 1..={MAX_SIZE}");
    }
    let bufs = Buffers::new(pd, size)?;
    let opts = EndpointOptions::default();
    let ep = blocking::connect(pd, addr, &opts, b"", |qp| bufs.post_all(qp))?;
    let mut wcs = Vec::with_capacity(32);
    let mut rtts = Vec::with_capacity(iters);
    let warmup = iters / 10;
    for i in 0..iters + warmup {
        let t = Instant::now();
        bufs.send(&ep, size)?;
        let (slot, _) = next_recv(&ep, &mut wcs, Instant::now() + Duration::from_secs(10))?;
        bufs.post_recv(&ep.qp, slot)?;
        if i >= warmup {
            rtts.push(t.elapsed());
        }
    }
    // A zero-length SEND tells the server to stop.
    let mut bye = SendWr::new(u64::MAX, SendOp::Send, None);
    bye.inline = true;
    ep.qp.post_send(&bye)?;
    ep.wait(1)?;
    ep.disconnect()?;
    report::latency("verbs_pingpong", size, iters, rtts);
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let ctx = Context::open(None).context("open the RDMA device")?;
    let pd = ProtectionDomain::new(&ctx)?;
    match args.role {
        Role::Server { listen } => serve(&pd, listen),
        Role::Client { addr, iters, size } => ping(&pd, addr, iters, size),
    }
}
