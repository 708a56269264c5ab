//! Shared helpers for the real-verbs tests: `rdma resource` counts, this process's
//! memory, the tools' binaries, an echo checked byte for byte and a blocking SEND flood;
//! a framed peer made by hand ([`framed`]), the `server` binary and other
//! programs as children ([`programs`]), the driver of `scripts/wire` ([`wire`]) and a
//! cluster on its four hosts ([`cluster_wire`]).
//!
//! The fixtures the tests share with the services' unit tests and the tools (the byte
//! [`pattern`], the device and addresses, servers, clients, a connected verbs pair) live
//! in the `rdmactor-testkit` crate and are re-exported here, so a test names them all
//! from this crate.
//!
//! The tests need an RDMA device (run them through `scripts/test`, which boots the
//! Soft-RoCE VM). Outside the VM they print that they skip, unless
//! `RDMACTOR_REQUIRE_RDMA=1` is set (the VM run sets it), in which case a missing device
//! fails the test.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use rdmactor::blocking::Endpoint;

pub use rdmactor_testkit::{
    actix_run, assert_leases_returned, capped_pool, close_all, connect_n, connect_pair,
    dropped_connections_close, eventually, first_close_reason, pattern, rdma_context,
    second_peer_ip, serve, serve_with, test_addr, wait_idle, Pair, Reasons, Recorded, Slow,
    SlowSink,
};

pub mod cluster_wire;
pub mod framed;
pub mod programs;
pub mod wire;

/// Per-kind object counts of one device, as `rdma resource show` prints them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceCounts(pub BTreeMap<String, u64>);

/// The kinds every test must give back.
pub const TRACKED: [&str; 5] = ["pd", "cq", "qp", "mr", "cm_id"];

impl ResourceCounts {
    /// Count of one kind (0 when absent).
    pub fn get(&self, kind: &str) -> u64 {
        self.0.get(kind).copied().unwrap_or(0)
    }
}

/// Reads `rdma resource show` for the test device.
pub fn resource_counts() -> ResourceCounts {
    let out = Command::new("rdma")
        .args(["resource", "show"])
        .output()
        .expect("run `rdma resource show` (iproute2)");
    assert!(out.status.success(), "rdma resource show failed: {out:?}");
    ResourceCounts::parse(&String::from_utf8_lossy(&out.stdout))
}

impl ResourceCounts {
    /// Parses `rdma resource show` output (its first device).
    pub fn parse(text: &str) -> ResourceCounts {
        // "0: rxe0: pd 1 cq 2 qp 1 cm_id 0 mr 0 ctx 0 srq 0": key/value pairs after the name.
        let line = text.lines().next().unwrap_or_default();
        let mut counts = BTreeMap::new();
        let fields: Vec<&str> = line.split_whitespace().skip(2).collect();
        for pair in fields.chunks(2) {
            if let [k, v] = pair {
                if let Ok(v) = v.parse() {
                    counts.insert((*k).to_owned(), v);
                }
            }
        }
        ResourceCounts(counts)
    }
}

/// Asserts every tracked count returns to `baseline` (allowing the kernel a few seconds
/// to finish releasing cm_ids after TIMEWAIT).
pub fn assert_released(baseline: &ResourceCounts) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = resource_counts();
        let leaked: Vec<String> = TRACKED
            .iter()
            .filter(|k| now.get(k) != baseline.get(k))
            .map(|k| format!("{k}: {} -> {}", baseline.get(k), now.get(k)))
            .collect();
        if leaked.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "resources not released: {leaked:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The QPs process `pid` holds on the test device now (`rdma resource show qp pid PID`):
/// what a server run as a child process gave back is seen in its count alone, whatever
/// the test process itself holds.
pub fn qps_of(pid: u32) -> usize {
    let out = Command::new("rdma")
        .args(["resource", "show", "qp", "pid", &pid.to_string()])
        .output()
        .expect("run `rdma resource show qp` (iproute2)");
    assert!(
        out.status.success(),
        "rdma resource show qp failed: {out:?}"
    );
    let owner = format!(" pid {pid} ");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("link ") && l.contains(&owner))
        .count()
}

/// Where the VM's rxe device keeps its port counters, one file each.
const HW_COUNTERS: &str = "/sys/class/infiniband/rxe0/ports/1/hw_counters";

/// rxe's port counter `name` (RNR NAKs sent, retries given up, packets dropped, ...).
pub fn hw_counter(name: &str) -> u64 {
    let path = format!("{HW_COUNTERS}/{name}");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .parse()
        .expect("a counter")
}

/// Every rxe port counter, by name, and the packets the kernel's input queues dropped
/// (`softnet_dropped`, from /proc/net/softnet_stat): what a test prints to say what the
/// fabric did.
pub fn hw_counters() -> std::collections::BTreeMap<String, u64> {
    let mut counters: std::collections::BTreeMap<String, u64> = std::fs::read_dir(HW_COUNTERS)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let value = std::fs::read_to_string(e.path())
                .ok()?
                .trim()
                .parse()
                .ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), value))
        })
        .collect();
    let softnet = std::fs::read_to_string("/proc/net/softnet_stat").unwrap_or_default();
    let dropped = softnet
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|hex| u64::from_str_radix(hex, 16).ok())
        .sum();
    counters.insert("softnet_dropped".into(), dropped);
    counters
}

/// A path next to the test binary's `target/<profile>/` (for example the examples'
/// binaries, which `scripts/test` builds first).
pub fn target_bin(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("target/<profile>");
    profile_dir.join(name)
}

/// Sends `payload` to an `echo` service and asserts it comes back unchanged.
pub async fn echo_ok(conn: &rdmactor::runtime::ClientConnection, payload: Vec<u8>) {
    use rdmactor_services::echo::{EchoRequest, EchoResponse};
    let resp: EchoResponse = conn
        .request_typed(&EchoRequest {
            payload: payload.clone(),
        })
        .await
        .expect("echo request");
    assert!(resp.payload == payload, "echo payload differs");
}

/// This process's resident set size in KiB (`VmRSS` in `/proc/self/status`). The tests
/// run their server in-process, so its growth bounds what the server kept in memory.
pub fn rss_kib() -> u64 {
    status_kib("VmRSS")
}

/// Peak resident memory of this process, in KiB (`VmHWM`; reset it by writing `5` to
/// `/proc/self/clear_refs`).
pub fn peak_rss_kib() -> u64 {
    status_kib("VmHWM")
}

/// One `KEY:   N kB` line of `/proc/self/status`.
fn status_kib(key: &str) -> u64 {
    rdmactor_testkit::proc_status::status_kib("self", key)
        .unwrap_or_else(|| panic!("no {key} line in /proc/self/status"))
}

/// Posts up to `count` SENDs of `bytes` (their contents chosen per index by `fill`) on a
/// blocking endpoint, keeping at most `window` in flight and never posting a receive, as
/// fast as the QP completes them. Stops early when `stop` returns true, when a SEND
/// fails (the server closed the connection) or when none completes for the endpoint's
/// timeout. Returns how many SENDs completed successfully.
pub fn flood_sends(
    ep: &Endpoint,
    buf: &mut rdmactor::verbs::MemoryRegion,
    bytes: usize,
    count: usize,
    window: usize,
    mut fill: impl FnMut(usize, &mut [u8]),
    stop: impl Fn() -> bool,
) -> usize {
    use rdmactor::verbs::{SendOp, SendWr};
    let (mut posted, mut done, mut inflight) = (0, 0, 0);
    while done < count {
        if posted < count && inflight < window && !stop() {
            // One buffer for every SEND: a SEND's bytes are read when it is processed,
            // and the tests that care about contents post them one at a time.
            fill(posted, &mut buf.as_mut_slice()[..bytes]);
            let wr = SendWr::new(
                posted as u64,
                SendOp::Send,
                Some(buf.sge(0..bytes).unwrap()),
            );
            if ep.qp.post_send(&wr).is_err() {
                break;
            }
            posted += 1;
            inflight += 1;
            if inflight < window && !stop() {
                continue;
            }
        }
        if inflight == 0 {
            break;
        }
        match ep.wait_any(1) {
            Ok(wcs) if wcs.iter().all(|wc| wc.ok().is_ok()) => {
                // The peer's frames (its Close) land in receives on the same CQ: only
                // the SENDs count. Counting every completion once made `inflight` wrap,
                // which only the overflow checks of release builds showed.
                let sends = wcs
                    .iter()
                    .filter(|wc| wc.opcode == rdmactor::verbs::WcOpcode::Send)
                    .count();
                done += sends;
                inflight -= sends;
            }
            _ => break,
        }
    }
    done
}
