//! The C client library (crate rdmactor-c) against the `server` binary on real verbs:
//! the library installed with `scripts/install-c --no-build` from the build next to
//! this test (`cargo build --release -p rdmactor-c` makes it), `examples/c/` and the
//! hostile caller compiled with `cc -Wall -Werror` through pkg-config, then the echo
//! client's bytes, ft's verdict and SHA-256, and every hostile check, with a server
//! to connect to. Natively the same programs are compiled and the device-free checks
//! run by `cargo test -p rdmactor-c`.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use rdmactor_tests::{rdma_context, target_bin, test_addr};
use sha2::Digest as _;

/// Kills the server when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn found(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok()
}

fn ok(what: &str, out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} exited {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Installs the library under `prefix` and compiles the C programs into `prefix/bin`.
fn build_c(prefix: &Path) {
    let profile_dir = target_bin("");
    let profile = profile_dir
        .file_name()
        .expect("target/<profile>")
        .to_owned();
    let mut install = Command::new(repo().join("scripts/install-c"));
    if profile == "debug" {
        install.arg("--debug");
    }
    let out = install
        .arg("--no-build")
        .arg(prefix)
        .env("CARGO_TARGET_DIR", profile_dir.parent().expect("target/"))
        .output()
        .expect("running scripts/install-c");
    ok(
        "scripts/install-c (build rdmactor-c first: cargo build --release -p rdmactor-c)",
        out,
    );
    let pkg = Command::new("pkg-config")
        .args(["--cflags", "--libs", "rdmactor"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
        .output()
        .expect("pkg-config");
    let flags = ok("pkg-config", pkg);
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    for src in [
        "examples/c/echo_client.c",
        "examples/c/ft.c",
        "c/tests/hostile.c",
    ] {
        let bin = prefix.join("bin").join(Path::new(src).file_stem().unwrap());
        let out = Command::new("cc")
            .args([
                "-Wall",
                "-Wextra",
                "-Werror",
                "-std=c11",
                "-D_POSIX_C_SOURCE=200809L",
            ])
            .arg(repo().join(src))
            .args(flags.split_whitespace())
            .arg("-o")
            .arg(&bin)
            .output()
            .expect("cc");
        ok(&format!("cc {src}"), out);
    }
}

fn run(prefix: &Path, name: &str, args: &[&str]) -> Output {
    Command::new(prefix.join("bin").join(name))
        .args(args)
        .env("LD_LIBRARY_PATH", prefix.join("lib"))
        .output()
        .unwrap_or_else(|e| panic!("running {name}: {e}"))
}

#[test]
fn c_programs_echo_upload_and_are_refused_cleanly_against_the_server() {
    let Some(_ctx) = rdma_context() else { return };
    // cc links every Rust program and scripts/setup installs pkg-config: missing, they
    // fail the test rather than pass it with nothing run.
    for tool in ["cc", "pkg-config"] {
        assert!(
            found(tool),
            "{tool} not found: the C programs cannot be compiled"
        );
    }
    let prefix = tempfile::tempdir().unwrap();
    build_c(prefix.path());

    let store = tempfile::tempdir().unwrap();
    let child = Command::new(target_bin("server"))
        .args(["--listen", &format!("{}:0", test_addr().ip())])
        .arg("--files-dir")
        .arg(store.path())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the server binary (build the examples' binaries)");
    let mut server = Running(child);
    let mut lines = BufReader::new(server.0.stdout.take().unwrap());
    let addr: SocketAddr = loop {
        let mut line = String::new();
        assert!(
            lines.read_line(&mut line).unwrap() > 0,
            "the server exited before listening"
        );
        if let Some(a) = line.trim().strip_prefix("listening on ") {
            break a.parse().expect("an address");
        }
    };
    let addr = addr.to_string();

    let echo = ok(
        "echo_client",
        run(prefix.path(), "echo_client", &[&addr, "hello from C"]),
    );
    assert_eq!(echo.trim(), "echo: hello from C");
    let timed = ok(
        "echo_client (timed)",
        run(prefix.path(), "echo_client", &[&addr, "", "2000", "64"]),
    );
    assert!(
        timed.contains("RESULT kind=c-echo size=64 rounds=2000 p50_us="),
        "{timed}"
    );
    println!("{}", timed.trim());

    let src = tempfile::tempdir().unwrap();
    let path = src.path().join("from-c.bin");
    let bytes: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(&path, &bytes).unwrap();
    let want = hex_digest(&bytes);
    let ft = ok(
        "ft",
        run(prefix.path(), "ft", &[&addr, path.to_str().unwrap()]),
    );
    let line = format!("GOOD {} sha256:{want} {}", path.display(), bytes.len());
    assert_eq!(ft.trim(), line);
    assert!(
        std::fs::read(store.path().join("from-c.bin")).unwrap() == bytes,
        "the stored bytes"
    );
    // The same name again: the service's verdict, printed, exit 1.
    let again = run(prefix.path(), "ft", &[&addr, path.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    assert!(String::from_utf8_lossy(&again.stdout).starts_with("REJECTED "));

    let hostile = ok("hostile", run(prefix.path(), "hostile", &[&addr]));
    assert!(
        !hostile.contains("FAIL") && !hostile.contains("skip"),
        "{hostile}"
    );
    assert!(
        hostile.contains("ok a closed connection used again"),
        "{hostile}"
    );
    assert!(hostile.contains("ok a second free"), "{hostile}");
}

fn hex_digest(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
