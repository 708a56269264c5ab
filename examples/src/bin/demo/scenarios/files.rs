//! Step 3, **files**: the `ft` binary uploads a file with SHA-256; the server verifies
//! the digest, stores it (temp file, fsync, rename) and, because this upload created
//! the file the ID names, answers `Identify` with its secret; the stored bytes are
//! compared with the source. Against another host's server the upload is fetched back
//! to compare it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use rdmactor_testkit::pattern;

use crate::server::{ID, SECRET};
use crate::table::Row;
use crate::verify::{wait_all, Proc};

/// The binary `name` next to this one (`ft`).
fn sibling(name: &str) -> Result<PathBuf> {
    let me = std::env::current_exe()?;
    let path = me.with_file_name(name);
    ensure!(
        path.exists(),
        "{} not found (build the examples)",
        path.display()
    );
    Ok(path)
}

/// Runs the `ft` binary next to this one with `args`; its stdout once it exited 0.
async fn ft(addr: SocketAddr, args: &[&str]) -> Result<String> {
    let mut child = Command::new(sibling("ft")?)
        .arg("--addr")
        .arg(addr.to_string())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting ft")?;
    println!("      ft --addr {addr} {}", args.join(" "));
    let mut stdout = child.stdout.take().context("ft stdout")?;
    let proc = Proc {
        what: format!("ft {}", args[0]),
        child,
    };
    let (_, failed) = wait_all(vec![proc], Duration::from_secs(120)).await?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut out)?;
    ensure!(failed.is_empty(), "{}; stdout: {out}", failed.join("; "));
    Ok(out)
}

/// Uploads `len` bytes with `ft send` and checks them: in the server's store when it is
/// ours (`store`), else by fetching them back with `ft fetch` (the server on the other
/// host stored them under a name of this process's own).
pub async fn run(addr: SocketAddr, work: &Path, store: Option<&Path>, len: usize) -> Result<Row> {
    let name = match store {
        Some(_) => ID.to_owned(),
        None => format!("demo-{}.bin", std::process::id()),
    };
    let source = work.join(&name);
    let content = pattern(len, 42);
    std::fs::write(&source, &content)?;
    let source_arg = source.to_string_lossy().into_owned();
    let mib = len >> 20;
    let out = match store {
        Some(_) => ft(addr, &["send", "--id", ID, &source_arg]).await?,
        None => ft(addr, &["send", &source_arg]).await?,
    };
    let good = out
        .lines()
        .find(|l| l.starts_with("GOOD "))
        .with_context(|| format!("no GOOD verdict: {out}"))?;
    println!("      {good}");
    let Some(store) = store else {
        let back = work.join("fetched");
        std::fs::create_dir_all(&back)?;
        let back_arg = back.to_string_lossy().into_owned();
        let out = ft(addr, &["fetch", "--out", &back_arg, &name]).await?;
        let good = out
            .lines()
            .find(|l| l.starts_with("GOOD "))
            .with_context(|| format!("no GOOD verdict for the fetch: {out}"))?;
        println!("      {good}");
        let fetched = std::fs::read(back.join(&name)).context("the fetched file")?;
        ensure!(
            fetched == content,
            "the fetched file differs from the source"
        );
        return Ok(Row {
            service: "files",
            clients: 2,
            operations: format!("upload and fetch {mib} MiB"),
            verified: "GOOD both ways, bytes".into(),
            secs: 0.0,
        });
    };
    let secret = out
        .lines()
        .find_map(|l| l.strip_prefix("SECRET "))
        .with_context(|| format!("no secret released: {out}"))?;
    ensure!(secret == SECRET, "the secret differs: {secret}");
    println!("      SECRET {secret}");
    let stored = std::fs::read(store.join(ID)).context("the stored file")?;
    ensure!(stored == content, "the stored file differs from the source");
    Ok(Row {
        service: "files",
        clients: 1,
        operations: format!("upload {mib} MiB, Identify"),
        verified: "GOOD, secret, bytes".into(),
        secs: 0.0,
    })
}
