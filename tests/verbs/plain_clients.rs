//! Plain verbs clients, which send no rdmactor hello, reach the listener's default
//! service: raw-echo returns each SEND byte for byte; the rping service serves rdma-core's
//! unmodified `rping` client, many at once.

use std::process::Command;
use std::time::Duration;

use rdmactor::blocking::{self, EndpointOptions};
use rdmactor::runtime::Server;
use rdmactor::verbs::{Access, MemoryRegion, ProtectionDomain, RecvWr, SendOp, SendWr};
use rdmactor_services::echo::RawEcho;
use rdmactor_services::rping::Rping;
use rdmactor_tests::{
    actix_run, assert_released, pattern, rdma_context, resource_counts, test_addr, wait_idle,
};

#[test]
fn raw_echo_returns_bytes_to_a_plain_verbs_client() {
    let Some(ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async {
        let server = Server::builder()
            .listen(test_addr(), Some("raw-echo"))
            .service("raw-echo", RawEcho::default())
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let ctx = ctx.clone();
        // The plain client blocks, so it runs on its own thread.
        let plain = std::thread::spawn(move || {
            let pd = ProtectionDomain::new(&ctx).unwrap();
            let mut out = MemoryRegion::register(&pd, 4096, Access::NONE).unwrap();
            let back = MemoryRegion::register(&pd, 4096, Access::LOCAL_WRITE).unwrap();
            let ep =
                blocking::connect(&pd, addr, &EndpointOptions::default(), &[], |_| Ok(())).unwrap();
            for (i, n) in [1usize, 17, 1000, 4096].into_iter().enumerate() {
                let data = pattern(n, i as u64 + 3);
                out.as_mut_slice()[..n].copy_from_slice(&data);
                ep.qp
                    .post_recv(&[RecvWr {
                        wr_id: 1,
                        local: Some(back.sge_all()),
                    }])
                    .unwrap();
                let imm = (i % 2 == 1).then_some(0xabc0 + i as u32);
                let op = imm.map_or(SendOp::Send, SendOp::SendWithImm);
                ep.qp
                    .post_send(&SendWr::new(2, op, Some(out.sge(0..n).unwrap())))
                    .unwrap();
                let wcs = ep.wait(2).unwrap();
                let recv = wcs.iter().find(|w| w.wr_id == 1).expect("echo received");
                assert_eq!(recv.byte_len as usize, n);
                assert_eq!(recv.imm_data, imm, "immediate echoed");
                assert_eq!(&back.as_slice()[..n], &data[..], "{n} bytes echoed");
            }
            ep.disconnect().unwrap();
        });
        while !plain.is_finished() {
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
        plain.join().expect("plain client");
        wait_idle(&server, "connections to close", Duration::from_secs(20)).await;
        server.shutdown().await;
    });
    assert_released(&base);
}

#[test]
fn unmodified_rping_clients_complete() {
    let Some(_ctx) = rdma_context() else { return };
    let clients: usize = std::env::var("RDMACTOR_RPING_CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let count = std::env::var("RDMACTOR_RPING_COUNT").unwrap_or_else(|_| "200".into());
    let base = resource_counts();
    actix_run(async move {
        let server = Server::builder()
            .listen(test_addr(), Some("rping"))
            .service("rping", Rping::default())
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let handles: Vec<_> = (0..clients)
            .map(|_| {
                let (ip, port, count) = (
                    addr.ip().to_string(),
                    addr.port().to_string(),
                    count.clone(),
                );
                std::thread::spawn(move || {
                    Command::new("rping")
                        .args([
                            "-c", "-a", &ip, "-p", &port, "-C", &count, "-S", "4096", "-V",
                        ])
                        .output()
                        .expect("run rping")
                })
            })
            .collect();
        while !handles.iter().all(|h| h.is_finished()) {
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
        for (i, h) in handles.into_iter().enumerate() {
            let out = h.join().unwrap();
            assert!(
                out.status.success(),
                "rping client {i} failed: {:?}\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        wait_idle(&server, "connections to close", Duration::from_secs(20)).await;
        let stats = server.stats().await;
        assert_eq!(stats.accepted, clients as u64);
        server.shutdown().await;
    });
    assert_released(&base);
}
