//! The tour of rdmactor's verbs layer: a server and a client in one process connect over
//! rdma_cm and move data with every operation the layer offers, printing each result.
//!
//! Run it in the Soft-RoCE VM with `scripts/demo --tour` (or directly on a host with an
//! RDMA device: `cargo run -p rdmactor-examples --bin verbs_tour -- --addr <rdma-ip>:0`).

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::{ensure, Context as _, Result};
use clap::Parser;
use rdmactor::blocking::{self, EndpointOptions, Listener};
use rdmactor::verbs::{Access, Context, MemoryRegion, ProtectionDomain, RecvWr, SendOp, SendWr};

#[derive(Parser)]
#[command(about = "Connect a client to a server over rdma_cm and exercise every verb")]
struct Args {
    /// Address of the RDMA interface to listen on (port 0 picks one).
    #[arg(long, default_value = "192.0.2.1:0")]
    addr: SocketAddr,
    /// RDMA device (default: the first one).
    #[arg(long)]
    device: Option<String>,
}

const SLOT: usize = 1 << 20;

fn main() -> Result<()> {
    let args = Args::parse();
    let ctx = Context::open(args.device.as_deref()).context("open RDMA device")?;
    let attr = ctx.query()?;
    println!(
        "device {}: max_qp {} max_qp_wr {} max_cqe {} atomics {}",
        ctx.name(),
        attr.max_qp,
        attr.max_qp_wr,
        attr.max_cqe,
        attr.atomics
    );
    let pd = ProtectionDomain::new(&ctx)?;

    // Server side: a receive buffer, and a window peers may write, read and run atomics on.
    let inbox = MemoryRegion::register(&pd, SLOT, Access::LOCAL_WRITE)?;
    let mut window = MemoryRegion::register(
        &pd,
        SLOT,
        Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
    )?;
    window.as_mut_slice()[..8].copy_from_slice(&5u64.to_ne_bytes());
    let listener = Listener::bind(args.addr)?;
    let addr = listener.local_addr().context("listener address")?;
    println!("server listening on {addr}");

    let opts = EndpointOptions::default();
    let (client, server) = std::thread::scope(|s| -> Result<_> {
        let server = s.spawn(|| {
            listener.accept(&pd, &opts, b"hello from server", |qp| {
                let wrs: Vec<RecvWr> = (0..4)
                    .map(|i| RecvWr {
                        wr_id: i,
                        local: Some(inbox.sge_all()),
                    })
                    .collect();
                qp.post_recv(&wrs)
            })
        });
        let client = blocking::connect(&pd, addr, &opts, b"hello from client", |_| Ok(()))?;
        let server = server.join().expect("server thread")?;
        Ok((client, server))
    })?;
    println!(
        "connected: client {} (qp {}) <-> server {} (qp {}); server got {:?}",
        client.id().local_addr().context("client addr")?,
        client.qp.qp_num(),
        addr,
        server.qp.qp_num(),
        String::from_utf8_lossy(&server.peer_data).trim_end_matches('\0'),
    );

    let mut src = MemoryRegion::register(&pd, SLOT, Access::NONE)?;
    let back = MemoryRegion::register(&pd, SLOT, Access::LOCAL_WRITE)?;
    for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
        *b = (i * 31 % 251) as u8;
    }
    let remote = window.remote();

    // Two-sided: SEND and SEND_WITH_IMM consume the server's pre-posted receives.
    for (name, op, len) in [
        ("SEND", SendOp::Send, 4096),
        ("SEND_WITH_IMM", SendOp::SendWithImm(0xC0FFEE), 64),
    ] {
        let t = Instant::now();
        client
            .qp
            .post_send(&SendWr::new(1, op, Some(src.sge(0..len)?)))?;
        client.wait(1)?;
        let wc = server.wait(1)?[0];
        ensure!(
            wc.byte_len as usize == len,
            "received {} of {len} B",
            wc.byte_len
        );
        ensure!(
            inbox.as_slice()[..len] == src.as_slice()[..len],
            "{name}: bytes differ"
        );
        println!(
            "{name:<16} {len:>8} B  server received {} B, bytes match, imm {:?} ({:?})",
            wc.byte_len,
            wc.imm_data.map(|v| format!("{v:#x}")),
            t.elapsed()
        );
    }

    // One-sided WRITE_WITH_IMM: data lands in the window, the immediate in a receive.
    client.qp.post_send(&SendWr::new(
        2,
        SendOp::WriteWithImm(remote.slice(4096, 4096)?, 7),
        Some(src.sge(0..4096)?),
    ))?;
    client.wait(1)?;
    let wc = server.wait(1)?[0];
    ensure!(
        window.as_slice()[4096..8192] == src.as_slice()[..4096],
        "WRITE_WITH_IMM bytes"
    );
    println!(
        "{:<16} {:>8} B  server completion imm {:?}, bytes match",
        "WRITE_WITH_IMM", 4096, wc.imm_data
    );

    // One-sided WRITE then READ back, at three sizes.
    for len in [1usize, 4096, SLOT] {
        let target = remote.slice(0, len as u64)?;
        let t = Instant::now();
        client.qp.post_send(&SendWr::new(
            3,
            SendOp::Write(target),
            Some(src.sge(0..len)?),
        ))?;
        client.wait(1)?;
        let wrote = t.elapsed();
        ensure!(
            window.as_slice()[..len] == src.as_slice()[..len],
            "WRITE bytes"
        );
        let t = Instant::now();
        client.qp.post_send(&SendWr::new(
            4,
            SendOp::Read(target),
            Some(back.sge(0..len)?),
        ))?;
        client.wait(1)?;
        ensure!(
            back.as_slice()[..len] == src.as_slice()[..len],
            "READ bytes"
        );
        println!(
            "{:<16} {len:>8} B  written and read back, bytes match (write {wrote:?}, read {:?})",
            "WRITE + READ",
            t.elapsed()
        );
    }

    // Atomics on the first word of the window.
    window.as_mut_slice()[..8].copy_from_slice(&5u64.to_ne_bytes());
    let word = |mr: &MemoryRegion| u64::from_ne_bytes(mr.as_slice()[..8].try_into().unwrap());
    let cas = SendOp::CompareSwap {
        remote,
        compare: 5,
        swap: 9,
    };
    client
        .qp
        .post_send(&SendWr::new(5, cas, Some(back.sge(0..8)?)))?;
    client.wait(1)?;
    println!(
        "{:<16} {:>8} B  compare 5 swap 9: old {}, now {}",
        "CMP_AND_SWP",
        8,
        word(&back),
        word(&window)
    );
    ensure!(
        word(&back) == 5 && word(&window) == 9,
        "compare-and-swap result"
    );
    let faa = SendOp::FetchAdd { remote, add: 3 };
    client
        .qp
        .post_send(&SendWr::new(6, faa, Some(back.sge(0..8)?)))?;
    client.wait(1)?;
    println!(
        "{:<16} {:>8} B  add 3: old {}, now {}",
        "FETCH_AND_ADD",
        8,
        word(&back),
        word(&window)
    );
    ensure!(
        word(&back) == 9 && word(&window) == 12,
        "fetch-and-add result"
    );

    blocking::close_both(client, server)?;
    println!("disconnected; every operation verified");
    Ok(())
}
