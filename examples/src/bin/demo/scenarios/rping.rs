//! Step 2, **rping**: unmodified `rping -c -V` processes (rdma-core) at once against the
//! port whose default service is `rping`: plain rdma_cm clients, no rdmactor code.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context as _, Result};

use crate::table::Row;
use crate::verify::{wait_all, Proc};

/// `n` processes of `count` pings each against `addr`.
pub async fn run(addr: SocketAddr, n: usize, count: u32) -> Result<Row> {
    let procs = (0..n)
        .map(|i| {
            let child = Command::new("rping")
                .args([
                    "-c",
                    "-a",
                    &addr.ip().to_string(),
                    "-p",
                    &addr.port().to_string(),
                ])
                .args(["-C", &count.to_string(), "-S", "4096", "-V"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .context("starting rping (rdmacm-utils)")?;
            Ok(Proc {
                what: format!("rping client {i}"),
                child,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    println!(
        "      {n} × `rping -c -a {} -p {} -C {count} -S 4096 -V` started",
        addr.ip(),
        addr.port()
    );
    let (ok, failed) = wait_all(procs, Duration::from_secs(120)).await?;
    ensure!(failed.is_empty(), "{}", failed.join("; "));
    Ok(Row {
        service: "rping",
        clients: n,
        operations: format!(
            "{} pings of 4 KiB (READ+WRITE)",
            n as u64 * u64::from(count)
        ),
        verified: format!("{ok}/{n} exited 0 (-V)"),
        secs: 0.0,
    })
}
