//! Out-of-band QP bring-up: rdma-core's unmodified `ibv_rc_pingpong`, `ibv_uc_pingpong`,
//! `ibv_ud_pingpong` and `ibv_srq_pingpong` clients, many at once, against one rdmactor
//! server (one TCP port per transport); bad exchanges and vanished clients cost only
//! themselves; rdmactor's own out-of-band client against the stock RC server.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rdmactor::proto::oob::{Dest, RECORD_LEN};
use rdmactor::runtime::{OobPort, OobStats, OobTransport, Server};
use rdmactor::verbs::Gid;
use rdmactor_services::pingpong::{StockConfig, StockPingPongService};
use rdmactor_tests::{
    actix_run, assert_released, eventually, rdma_context, resource_counts, target_bin, test_addr,
    ResourceCounts,
};

/// A server with one out-of-band port per transport in `ports`.
fn oob_server(ports: &[OobTransport], stock: StockConfig, tweak: impl Fn(&mut OobPort)) -> Server {
    let mut b = Server::builder()
        .service("stock-rc", StockPingPongService::connected(stock))
        .service("stock-ud", StockPingPongService::datagram(stock))
        .service("stock-srq", StockPingPongService::shared(stock));
    for &t in ports {
        let service = match t {
            OobTransport::Ud => "stock-ud",
            OobTransport::Srq => "stock-srq",
            _ => "stock-rc",
        };
        let mut port = OobPort::new(test_addr(), t, service);
        tweak(&mut port);
        b = b.oob(port);
    }
    b.start().expect("server")
}

/// Runs `n` copies of `ibv_{tool}_pingpong ARGS -p PORT IP` at once (each with a time
/// limit), waiting without blocking the actors.
async fn run_clients(tool: &str, n: usize, args: &[&str], addr: SocketAddr) -> Vec<Output> {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let mut cmd = Command::new("timeout");
            cmd.arg("240")
                .arg(format!("ibv_{tool}_pingpong"))
                .args(args)
                .args(["-p", &addr.port().to_string(), &addr.ip().to_string()]);
            std::thread::spawn(move || cmd.output().expect("run the pingpong client"))
        })
        .collect();
    while !handles.iter().all(|h| h.is_finished()) {
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn assert_all_ok(tool: &str, outs: &[Output], iters: u32) {
    let failed: Vec<String> = outs
        .iter()
        .enumerate()
        .filter(|(_, o)| !o.status.success())
        .map(|(i, o)| {
            format!(
                "client {i}: {:?}\n{}{}",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} {tool} clients failed:\n{}",
        failed.len(),
        outs.len(),
        failed.join("\n")
    );
    for o in outs {
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains(&format!("{iters} iters in")),
            "{tool} did not report {iters} iterations: {text}"
        );
    }
}

async fn port_stats(server: &Server, i: usize) -> OobStats {
    server.oob_stats().await.swap_remove(i)
}

/// Waits until every out-of-band connection of `server` closed and was released.
async fn wait_oob_idle(server: &Server, within: Duration) {
    eventually("out-of-band connections to close", within, || async {
        server.oob_stats().await.iter().all(|s| s.connections == 0)
    })
    .await;
}

/// Tracked counts and SRQs back to `base`.
fn assert_all_released(base: &ResourceCounts) {
    assert_released(base);
    let now = resource_counts();
    assert_eq!(now.get("srq"), base.get("srq"), "SRQs released");
}

fn stock(iters: Option<u64>) -> StockConfig {
    StockConfig {
        iters,
        idle: Duration::from_secs(3),
        ..StockConfig::default()
    }
}

/// Iterations of each client of [`many_at_once`]: enough for every client to overlap
/// all the others (they start together), few enough that 16 clients of 4 KiB take
/// seconds, not a minute, under emulation.
const MANY_ITERS: u64 = 300;

/// `n` stock clients of `tool` at once with `args` (and `-n` [`MANY_ITERS`]); all must
/// exit 0, and every QP is released afterwards.
fn many_at_once(transport: OobTransport, tool: &str, n: usize, args: &[&str], qps_each: u64) {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    args.extend(["-n".to_owned(), MANY_ITERS.to_string()]);
    let tool = tool.to_owned();
    actix_run(async move {
        let server = oob_server(&[transport], stock(Some(MANY_ITERS)), |_| {});
        let addr = server.oob_addrs()[0];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = Instant::now();
        let outs = run_clients(&tool, n, &args, addr).await;
        eprintln!(
            "{n} × ibv_{tool}_pingpong {args:?}: {:.1} s",
            started.elapsed().as_secs_f64()
        );
        assert_all_ok(&tool, &outs, MANY_ITERS as u32);
        wait_oob_idle(&server, Duration::from_secs(30)).await;
        let stats = port_stats(&server, 0).await;
        assert_eq!(stats.clients, n as u64, "{stats:?}");
        assert_eq!(stats.refused, 0, "{stats:?}");
        assert_eq!(stats.closed, n as u64 * qps_each, "{stats:?}");
        server.shutdown().await;
    });
    assert_all_released(&base);
}

#[test]
fn sixteen_rc_clients_at_once() {
    many_at_once(OobTransport::Rc, "rc", 16, &["-g", "1", "-s", "4096"], 1);
}

#[test]
fn sixteen_uc_clients_at_once() {
    many_at_once(OobTransport::Uc, "uc", 16, &["-g", "1", "-s", "4096"], 1);
}

#[test]
fn eight_ud_clients_at_once() {
    many_at_once(OobTransport::Ud, "ud", 8, &["-g", "1"], 1);
}

#[test]
fn eight_srq_clients_of_four_qps_at_once() {
    many_at_once(OobTransport::Srq, "srq", 8, &["-g", "1", "-q", "4"], 4);
}

/// Writes `bytes` to the port, then reads whatever comes back until EOF (the server
/// closes a refused client's socket).
fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(bytes).expect("write");
    s.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let mut back = Vec::new();
    let _ = s.read_to_end(&mut back);
    back
}

fn record(text: &str) -> Vec<u8> {
    let mut r = vec![0u8; RECORD_LEN];
    r[..text.len()].copy_from_slice(text.as_bytes());
    r
}

#[test]
fn bad_exchanges_and_vanished_clients_cost_only_themselves() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async move {
        let server = oob_server(&[OobTransport::Rc], stock(None), |p| {
            p.options.exchange_timeout = Duration::from_secs(2);
        });
        let addr = server.oob_addrs()[0];
        // A well-behaved client runs through all of it (sleeping on CQ events: -e).
        let good = std::thread::spawn(move || {
            Command::new("timeout")
                .args([
                    "240",
                    "ibv_rc_pingpong",
                    "-g",
                    "1",
                    "-n",
                    "3000",
                    "-s",
                    "4096",
                    "-e",
                ])
                .args(["-p", &addr.port().to_string(), &addr.ip().to_string()])
                .output()
                .expect("good client")
        });
        // A client that will be killed mid-run.
        let mut doomed = Command::new("ibv_rc_pingpong")
            .args(["-g", "1", "-n", "100000000", "-s", "64"])
            .args(["-p", &addr.port().to_string(), &addr.ip().to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("doomed client");
        let refusals = |what: &'static str, bytes: Vec<u8>| {
            std::thread::spawn(move || (what, raw_exchange(addr, &bytes)))
        };
        let gid_unreachable = Dest {
            lid: 0,
            qpn: 0x123,
            psn: 0x42,
            gid: Gid("::ffff:10.9.9.9"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets()),
        };
        let bad = vec![
            refusals("garbage", record("this is not a pingpong record at all")),
            refusals("truncated", b"0000:000011:74e3".to_vec()),
            refusals("unreachable GID", gid_unreachable.encode().to_vec()),
            // Connects and never writes: the exchange deadline ends it.
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                let mut back = Vec::new();
                let _ = s.read_to_end(&mut back);
                ("silent", back)
            }),
        ];
        // The killed client: its QP is up and answering, then the process dies.
        eventually(
            "the doomed client to connect",
            Duration::from_secs(30),
            || async { port_stats(&server, 0).await.clients >= 1 },
        )
        .await;
        actix_rt::time::sleep(Duration::from_millis(500)).await;
        doomed.kill().expect("kill");
        let _ = doomed.wait();
        while !bad.iter().all(|h| h.is_finished()) {
            actix_rt::time::sleep(Duration::from_millis(50)).await;
        }
        for h in bad {
            let (what, back) = h.join().unwrap();
            // Truncated input is answered by closing; nothing of ours is sent.
            assert!(
                back.is_empty(),
                "{what}: the server answered {} bytes",
                back.len()
            );
        }
        while !good.is_finished() {
            actix_rt::time::sleep(Duration::from_millis(50)).await;
        }
        let out = good.join().unwrap();
        assert_all_ok("rc", &[out], 3000);
        // The killed client's connection ends when it has been quiet for `idle`.
        wait_oob_idle(&server, Duration::from_secs(30)).await;
        let stats = port_stats(&server, 0).await;
        assert_eq!(stats.refused, 4, "{stats:?}");
        assert_eq!(stats.clients, 2, "{stats:?}");
        assert_eq!(stats.closed, 2, "{stats:?}");
        server.shutdown().await;
    });
    assert_all_released(&base);
}

/// The test address as a RoCE GID (IPv4-mapped), as the client's own.
fn own_gid() -> String {
    match test_addr().ip() {
        std::net::IpAddr::V4(v4) => format!("::ffff:{v4}"),
        std::net::IpAddr::V6(v6) => v6.to_string(),
    }
}

/// One record with QP number `qpn` and the GID written as an IPv6 address.
fn own_record(qpn: u32, gid: &str) -> Vec<u8> {
    Dest {
        qpn,
        psn: 0x42,
        gid: Gid(gid.parse::<std::net::Ipv6Addr>().unwrap().octets()),
        ..Dest::default()
    }
    .encode()
    .to_vec()
}

#[test]
fn refusal_reasons_name_the_problem() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async move {
        let server = oob_server(&[OobTransport::Rc, OobTransport::Srq], stock(None), |p| {
            p.options.exchange_timeout = Duration::from_secs(1);
            p.options.max_qps_per_client = 8;
        });
        let [rc, srq] = server.oob_addrs()[..] else {
            panic!("two ports")
        };
        let cases: Vec<(SocketAddr, Vec<u8>, &str)> = vec![
            (
                rc,
                record("0000:00001g:74e326:00000000000000000000ffffc0000201"),
                "QPN is not 6 hex digits",
            ),
            (rc, b"0000:".to_vec(), "exchange truncated: 5 of 52 bytes"),
            (rc, Vec::new(), "silent client"),
            (
                rc,
                Dest {
                    qpn: 0x77,
                    gid: Gid("::ffff:10.9.9.9"
                        .parse::<std::net::Ipv6Addr>()
                        .unwrap()
                        .octets()),
                    ..Dest::default()
                }
                .encode()
                .to_vec(),
                "is not the address this client connected from",
            ),
            // Records naming a third host on the subnet (UD would answer there), a
            // multicast group, or a reserved QP.
            (
                rc,
                own_record(0x77, "::ffff:192.0.2.77"),
                "is not the address this client connected from",
            ),
            (rc, own_record(0x77, "ff0e::1"), "is a multicast GID"),
            (rc, own_record(1, &own_gid()), "QPN 0x1 is reserved"),
            // Run without -g: no GID, so no GRH, which RoCE cannot do.
            (
                rc,
                record("0000:000077:000042:00000000000000000000000000000000"),
                "no GID in the record",
            ),
            (srq, vec![0u8; 0], "silent client"),
            (
                srq,
                record("0000:000000:000000:00000000000000000000000000000000").repeat(256),
                "no QP",
            ),
            (
                srq,
                (0..256)
                    .flat_map(|i| {
                        Dest {
                            qpn: 0x100 + i,
                            ..Dest::default()
                        }
                        .encode()
                    })
                    .collect(),
                "at most 8 per client",
            ),
        ];
        for (i, (addr, bytes, why)) in cases.into_iter().enumerate() {
            let port = if addr == rc { 0 } else { 1 };
            let before = port_stats(&server, port).await.refused;
            let t = std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                if !bytes.is_empty() {
                    s.write_all(&bytes).unwrap();
                    s.shutdown(std::net::Shutdown::Write).unwrap();
                }
                let mut back = Vec::new();
                let _ = s.read_to_end(&mut back);
                back
            });
            eventually("the refusal", Duration::from_secs(20), || async {
                port_stats(&server, port).await.refused > before
            })
            .await;
            let reason = port_stats(&server, port)
                .await
                .last_refusal
                .unwrap_or_default();
            assert!(
                reason.contains(why),
                "case {i}: expected {why:?} in {reason:?}"
            );
            while !t.is_finished() {
                actix_rt::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(t.join().unwrap().is_empty(), "case {i}: nothing answered");
        }
        wait_oob_idle(&server, Duration::from_secs(10)).await;
        server.shutdown().await;
    });
    assert_all_released(&base);
}

#[test]
fn rdmactor_oob_client_against_the_stock_rc_server() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    let port = "18611";
    let mut server = Command::new("timeout")
        .args([
            "120",
            "ibv_rc_pingpong",
            "-g",
            "1",
            "-n",
            "500",
            "-s",
            "4096",
            "-p",
            port,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("stock server");
    std::thread::sleep(Duration::from_millis(700));
    let ip = test_addr().ip().to_string();
    let out = Command::new(target_bin("oob_client"))
        .args([
            "--addr",
            &format!("{ip}:{port}"),
            "--gid-index",
            "1",
            "--iters",
            "500",
            "--size",
            "4096",
        ])
        .output()
        .expect("run oob_client");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "oob_client failed: {:?}\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("500/500 replies verified"), "{text}");
    let status = server.wait().expect("stock server");
    assert!(status.success(), "the stock server failed: {status:?}");
    assert_all_released(&base);
}

/// Issue 26 (8): out-of-band QPs were outside `max_connections`, so 1,024 clients × 255
/// QPs per port could be made on a server limited to 1,024 connections. Now rdma_cm and
/// out-of-band connections draw on one budget: an SRQ client asking for more QPs than
/// are left is refused whole with the reason, a client that fits takes its slot, and
/// rdma_cm connects beyond the limit are refused until it is given back.
#[test]
fn out_of_band_qps_count_under_max_connections() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async move {
        let stock = stock(None);
        let mut rc = OobPort::new(test_addr(), OobTransport::Rc, "stock-rc");
        rc.options.exchange_timeout = Duration::from_secs(30);
        let srq = OobPort::new(test_addr(), OobTransport::Srq, "stock-srq");
        let server = Server::builder()
            .listen(test_addr(), None)
            .service("echo", rdmactor_services::echo::Echo)
            .service("stock-rc", StockPingPongService::connected(stock))
            .service("stock-srq", StockPingPongService::shared(stock))
            .oob(rc)
            .oob(srq)
            .max_connections(4)
            .max_connections_per_peer(0)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let [rc, srq] = server.oob_addrs()[..] else {
            panic!("two ports")
        };
        let client =
            rdmactor::runtime::Client::start(rdmactor::runtime::NodeConfig::default()).unwrap();
        let mut conns = Vec::new();
        for _ in 0..3 {
            conns.push(client.connect(addr, "echo").await.expect("connect"));
        }
        assert_eq!(server.stats().await.qps, 3);

        // Four QPs asked for, one left: refused whole, nothing brought up.
        let records: Vec<u8> = (0..4u32)
            .flat_map(|i| own_record(0x100 + i, &own_gid()))
            .chain(record("0000:000000:000000:00000000000000000000000000000000").repeat(252))
            .collect();
        let t = std::thread::spawn(move || exchange(srq, &records));
        eventually(
            "the SRQ client's refusal",
            Duration::from_secs(20),
            || async { port_stats(&server, 1).await.refused > 0 },
        )
        .await;
        let reason = port_stats(&server, 1)
            .await
            .last_refusal
            .unwrap_or_default();
        assert!(
            reason.contains("4 QPs asked for: connection limit of 4 reached (3 QPs open"),
            "{reason}"
        );
        assert!(join(t).await.is_empty(), "nothing answered");
        assert_eq!(server.stats().await.qps, 3);

        // One RC QP fits: brought up and answered; it holds the last slot until its
        // client leaves without "done".
        let (tx, rx) = std::sync::mpsc::channel();
        let one = own_record(0x200, &own_gid());
        let t = std::thread::spawn(move || {
            let mut s = TcpStream::connect(rc).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s.write_all(&one).unwrap();
            let mut answer = vec![0u8; RECORD_LEN];
            s.read_exact(&mut answer).expect("the server's record");
            tx.send(()).unwrap();
            // Hold the exchange open a while, then leave without "done".
            std::thread::sleep(Duration::from_secs(3));
            drop(s);
        });
        while rx.try_recv().is_err() {
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(server.stats().await.qps, 4);
        match client.connect(addr, "echo").await {
            Err(rdmactor::runtime::ConnectError::Rejected(r)) => {
                assert!(r.message.contains("connection limit of 4 reached"), "{r:?}")
            }
            Err(e) => panic!("expected a ServerFull reject, got {e}"),
            Ok(_) => panic!("a fifth QP was admitted"),
        }
        join(t).await;
        eventually(
            "the abandoned QP's slot to come back",
            Duration::from_secs(20),
            || async { server.stats().await.qps == 3 },
        )
        .await;
        conns.push(
            client
                .connect(addr, "echo")
                .await
                .expect("the freed slot admits"),
        );
        for c in &conns {
            rdmactor_tests::echo_ok(c, b"served".to_vec()).await;
        }
        rdmactor_tests::close_all(&server, client, conns).await;
        server.shutdown().await;
    });
    assert_released(&base);
}

/// Issue 45 (3): an out-of-band port let one host hold 1,024 clients of 255 QPs each,
/// so `ibv_srq_pingpong` clients of one address could take the whole QP budget that
/// rdma_cm clients share, and every rdma_cm client was refused with `ServerFull`. Now a
/// client asks for 16 QPs at most and one address holds 64 QPs per port: five clients of
/// one host asking for 255 QPs each are refused, five asking for 16 bring up four (64
/// QPs) and the fifth is refused whole, and with 16 of 80 slots left the host, from
/// both of its addresses, and so any other host, still connects over rdma_cm.
#[test]
fn one_host_of_srq_clients_cannot_fill_the_qp_budget() {
    let Some(_ctx) = rdma_context() else { return };
    let base = resource_counts();
    actix_run(async move {
        // The QPs stay up through the test: no idle limit to race.
        let stock = StockConfig {
            idle: Duration::from_secs(120),
            ..stock(None)
        };
        let mut srq = OobPort::new(test_addr(), OobTransport::Srq, "stock-srq");
        srq.options.exchange_timeout = Duration::from_secs(30);
        let server = Server::builder()
            .listen(test_addr(), None)
            .service("echo", rdmactor_services::echo::Echo)
            .service("stock-srq", StockPingPongService::shared(stock))
            .oob(srq)
            .max_connections(80)
            .start()
            .expect("server");
        let addr = server.local_addrs()[0];
        let srq = server.oob_addrs()[0];
        let asking = |n: u32, first: u32| -> Vec<u8> {
            (0..n)
                .flat_map(|i| own_record(first + i, &own_gid()))
                .chain(
                    record("0000:000000:000000:00000000000000000000000000000000")
                        .repeat(256 - n as usize),
                )
                .collect()
        };

        // 255 QPs each: more than one client may ask for.
        for c in 0..5u32 {
            let records = asking(255, 0x1000 * (c + 1));
            let back = join(std::thread::spawn(move || exchange(srq, &records))).await;
            assert!(back.is_empty(), "client {c} of 255 QPs answered");
        }
        let stats = port_stats(&server, 0).await;
        assert_eq!(stats.refused, 5, "{stats:?}");
        let reason = stats.last_refusal.unwrap_or_default();
        assert!(reason.contains("255") && reason.contains("16"), "{reason}");
        assert_eq!(server.stats().await.qps, 0);

        // 16 QPs each (the most): four fit under the address's 64, the fifth is refused.
        let mut answered = 0;
        for c in 0..5u32 {
            let records = asking(16, 0x10_0000 + 0x100 * c);
            let t = std::thread::spawn(move || {
                let mut s = TcpStream::connect(srq).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                s.write_all(&records).unwrap();
                let mut answer = vec![0u8; 256 * RECORD_LEN];
                if s.read_exact(&mut answer).is_err() {
                    return false;
                }
                s.write_all(&rdmactor::proto::oob::DONE).unwrap();
                true
            });
            if join(t).await {
                answered += 1;
            }
        }
        assert_eq!(answered, 4, "four clients of 16 QPs brought up");
        eventually(
            "the four clients' done",
            Duration::from_secs(20),
            || async { port_stats(&server, 0).await.clients == 4 },
        )
        .await;
        let stats = port_stats(&server, 0).await;
        let reason = stats.last_refusal.clone().unwrap_or_default();
        assert!(
            reason.contains("per-peer QP limit of 64 reached"),
            "{reason}"
        );
        assert_eq!((stats.refused, stats.connections), (6, 64), "{stats:?}");
        assert_eq!(server.stats().await.qps, 64);

        // The same host from its two addresses, and so any other host: still admitted.
        let client =
            rdmactor::runtime::Client::start(rdmactor::runtime::NodeConfig::default()).unwrap();
        let mut conns = Vec::new();
        for from in [test_addr().ip(), rdmactor_tests::second_peer_ip()] {
            let conn = client
                .connect_from(from, addr, "echo")
                .await
                .unwrap_or_else(|e| panic!("an rdma_cm client from {from}: {e}"));
            rdmactor_tests::echo_ok(&conn, b"still room".to_vec()).await;
            conns.push(conn);
        }
        assert_eq!(server.stats().await.qps, 66);
        // The out-of-band clients' 64 QPs stay up until the server shuts down, so the
        // pool's leases are checked by `assert_all_released` after it, not here.
        for conn in conns {
            conn.close().await;
        }
        eventually(
            "the rdma_cm connections released",
            Duration::from_secs(20),
            || async { server.stats().await.qps == 64 },
        )
        .await;
        client.shutdown().await;
        server.shutdown().await;
    });
    assert_all_released(&base);
}

/// Writes `bytes` to an out-of-band port, closes the write side, and returns whatever
/// came back.
fn exchange(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(bytes).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut back = Vec::new();
    let _ = s.read_to_end(&mut back);
    back
}

/// Joins a client thread without blocking the actors of this thread (the CM actor's).
async fn join<T>(t: std::thread::JoinHandle<T>) -> T {
    while !t.is_finished() {
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    t.join().expect("the client thread")
}
