//! rdmactor's own out-of-band ping-pong client: the client side of `ibv_rc_pingpong`,
//! built on rdmactor's verbs layer (typed RESET → INIT → RTR → RTS bring-up, no
//! rdma_cm), speaking the tools' TCP exchange. Every reply is checked byte for byte
//! against the message sent (the stock server answers from the buffer it received into).
//!
//! ```sh
//! ibv_rc_pingpong -g 1 -n 1000 -s 4096 &            # the stock server
//! oob_client --addr 192.0.2.1:18515 --gid-index 1 --iters 1000 --size 4096
//! ```

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Parser;
use rdmactor::proto::oob::{self, Dest, RECORD_LEN};
use rdmactor::verbs::{
    Access, AddressVector, Bringup, CompletionQueue, ConnectedInit, Context, GlobalRoute,
    MemoryRegion, Mtu, ProtectionDomain, QpCaps, Rc, RcRtr, RcRts, RecvWr, Reset, SendOp, SendWr,
};

#[derive(Parser)]
#[command(about = "ping-pong against an ibv_rc_pingpong server (or rdmactor --oob-rc)")]
struct Args {
    /// The server's TCP address.
    #[arg(long)]
    addr: String,
    /// Local GID index (the tools' -g; 1 is the IPv4 GID on rxe).
    #[arg(long, default_value_t = 1)]
    gid_index: u8,
    /// Device port (the tools' -i).
    #[arg(long, default_value_t = 1)]
    ib_port: u8,
    /// Exchanges (the tools' -n).
    #[arg(long, default_value_t = 1000)]
    iters: u32,
    /// Message size (the tools' -s).
    #[arg(long, default_value_t = 4096)]
    size: usize,
    /// Path MTU (the tools' -m).
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
    /// RDMA device (default: the first).
    #[arg(long)]
    device: Option<String>,
}

const SEND: u64 = 1;
const RECV: u64 = 2;

fn main() -> Result<()> {
    let args = Args::parse();
    let mtu = Mtu::from_bytes(args.mtu).context("--mtu must be 256..4096, a power of two")?;
    let ctx = Context::open(args.device.as_deref()).context("opening the device")?;
    let pd = ProtectionDomain::new(&ctx)?;
    let cq = CompletionQueue::new(&ctx, 16, None)?;
    let mut out = MemoryRegion::register(&pd, args.size, Access::LOCAL_WRITE)?;
    let back = MemoryRegion::register(&pd, args.size, Access::LOCAL_WRITE)?;
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = Bringup::<Rc, Reset>::create(&pd, &cq, &cq, caps, None)?.init(&ConnectedInit {
        port_num: args.ib_port,
        pkey_index: 0,
        access: Access::NONE,
    })?;
    let post_recv = |qp: &rdmactor::verbs::QueuePair| {
        qp.post_recv(&[RecvWr {
            wr_id: RECV,
            local: Some(back.sge_all()),
        }])
    };
    post_recv(qp.qp())?;
    let port = ctx.query_port(args.ib_port)?;
    let me = Dest {
        lid: port.lid,
        qpn: qp.qp().qp_num(),
        psn: std::process::id() & 0xff_ffff,
        gid: ctx.query_gid(args.ib_port, args.gid_index)?,
    };
    println!(
        "local:  QPN {:#08x}, PSN {:#08x}, GID {}",
        me.qpn, me.psn, me.gid
    );

    // The exchange: our record, theirs, then "done".
    let mut tcp =
        TcpStream::connect(&args.addr).with_context(|| format!("connecting to {}", args.addr))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    tcp.write_all(&me.encode())?;
    let mut rec = [0u8; RECORD_LEN];
    tcp.read_exact(&mut rec)
        .context("reading the server's record")?;
    let peer = Dest::decode(0, &rec)?;
    println!(
        "remote: QPN {:#08x}, PSN {:#08x}, GID {}",
        peer.qpn, peer.psn, peer.gid
    );
    let qp = qp
        .ready_to_receive(&RcRtr {
            path: AddressVector {
                dlid: peer.lid,
                sl: 0,
                port_num: args.ib_port,
                grh: (peer.gid.interface_id() != 0)
                    .then(|| GlobalRoute::to(peer.gid, args.gid_index)),
            },
            mtu: mtu.min(port.active_mtu),
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
        })?
        .ready_to_send(&RcRts {
            sq_psn: me.psn,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 1,
        })?;
    tcp.write_all(&oob::DONE)?;
    drop(tcp);

    let started = Instant::now();
    let mut verified = 0;
    for i in 0..args.iters {
        let msg: Vec<u8> = (0..args.size)
            .map(|j| (j as u32).wrapping_mul(31).wrapping_add(i * 7) as u8)
            .collect();
        out.as_mut_slice().copy_from_slice(&msg);
        qp.post_send(&SendWr::new(SEND, SendOp::Send, Some(out.sge_all())))?;
        let wcs = cq.poll_blocking(2, Duration::from_secs(10))?;
        for wc in &wcs {
            wc.ok()?;
        }
        let recv = wcs.iter().find(|w| w.wr_id == RECV).context("no reply")?;
        if recv.byte_len as usize != args.size || back.as_slice() != &msg[..] {
            bail!(
                "reply {i} differs from the message sent ({} bytes)",
                recv.byte_len
            );
        }
        verified += 1;
        if i + 1 < args.iters {
            post_recv(&qp)?;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!("{verified}/{} replies verified", args.iters);
    println!(
        "{} iters in {secs:.2} seconds = {:.2} usec/iter",
        args.iters,
        secs * 1e6 / args.iters as f64
    );
    println!("RESULT usec_per_iter={:.2}", secs * 1e6 / args.iters as f64);
    Ok(())
}
