//! The C client library (crate rdmactor-c) against the `server` binary on real verbs:
//! the library installed with `scripts/install-c --no-build` from the build next to
//! this test (`cargo build --release -p rdmactor-c` makes it), `examples/c/` and the
//! hostile caller compiled with `cc -Wall -Werror` through pkg-config, then the echo
//! client's bytes, ft's verdict and SHA-256, and every hostile check, with a server
//! to connect to. Natively the same programs are compiled and the device-free checks
//! run by `cargo test -p rdmactor-c`.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};

use rdmactor_tests::programs::{ok, repo, ServerBinary};
use rdmactor_tests::{assert_released, rdma_context, resource_counts, target_bin};
use sha2::Digest as _;

fn found(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok()
}

/// A new prefix with the library installed and only `examples/c/echo_client.c`
/// compiled into its `bin` (for other modules' tests).
pub(crate) fn echo_client() -> tempfile::TempDir {
    let prefix = tempfile::tempdir().unwrap();
    let flags = install(prefix.path());
    compile(prefix.path(), "examples/c/echo_client.c", &flags, &[]);
    prefix
}

/// A new prefix with the library installed and the C programs compiled into its `bin`.
fn installed() -> tempfile::TempDir {
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
    prefix
}

/// Installs the library under `prefix` and compiles the C programs into `prefix/bin`.
fn build_c(prefix: &Path) {
    let flags = install(prefix);
    for src in [
        "examples/c/echo_client.c",
        "examples/c/ft.c",
        "c/tests/hostile.c",
    ] {
        compile(prefix, src, &flags, &[]);
    }
    // The cycles under AddressSanitizer: its leak report at exit is the check.
    compile(
        prefix,
        "c/tests/cycles.c",
        &flags,
        &["-fsanitize=address", "-g"],
    );
}

/// Installs the library under `prefix`; returns its compile and link flags, as
/// pkg-config gives them.
fn install(prefix: &Path) -> String {
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
    flags
}

/// `cc -Wall -Wextra -Werror EXTRA.. SRC FLAGS -o prefix/bin/<stem>`.
fn compile(prefix: &Path, src: &str, flags: &str, extra: &[&str]) {
    let bin = prefix.join("bin").join(Path::new(src).file_stem().unwrap());
    let out = Command::new("cc")
        .args([
            "-Wall",
            "-Wextra",
            "-Werror",
            "-std=c11",
            "-D_POSIX_C_SOURCE=200809L",
        ])
        .args(extra)
        .arg(repo().join(src))
        .args(flags.split_whitespace())
        .arg("-o")
        .arg(&bin)
        .output()
        .expect("cc");
    ok(&format!("cc {src}"), out);
}

pub(crate) fn run(prefix: &Path, name: &str, args: &[&str]) -> Output {
    Command::new(prefix.join("bin").join(name))
        .args(args)
        .env("LD_LIBRARY_PATH", prefix.join("lib"))
        .output()
        .unwrap_or_else(|e| panic!("running {name}: {e}"))
}

#[test]
fn c_programs_echo_upload_and_are_refused_cleanly_against_the_server() {
    let Some(_ctx) = rdma_context() else { return };
    let prefix = installed();

    let store = tempfile::tempdir().unwrap();
    let server = ServerBinary::start([OsStr::new("--files-dir"), store.path().as_os_str()]);
    let addr = server.addr.to_string();

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
    let bytes: Vec<u8> = (0..64u32 << 20)
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

/// Issue 50: no leak after 1,000 connect/close cycles through the C library. The
/// cycles program runs under AddressSanitizer, whose LeakSanitizer fails the run at
/// exit naming any allocation nothing reaches any more (one a cycle left behind shows
/// 1,000 times over), and the server's QPs, cm ids, CQs and MRs must come back to
/// their count before the cycles, taken after a first run of 10 (the server makes its
/// CQ and keeps a pool arena on its first connection).
///
/// A connection the server closes before answering its echo is counted and made again
/// (see docs/known-gaps.md: 1 of 1,000 once, on a loaded host); more than 1% fails.
#[test]
fn a_thousand_connect_close_cycles_leak_nothing() {
    let Some(_ctx) = rdma_context() else { return };
    let prefix = installed();
    let server = ServerBinary::start(std::iter::empty::<&OsStr>());
    let addr = server.addr.to_string();
    let cycles = |n: &str| {
        let out = Command::new(prefix.path().join("bin/cycles"))
            .args([&addr, n])
            .env("LD_LIBRARY_PATH", prefix.path().join("lib"))
            // detect_leaks is on by default on x86_64 Linux; said here so that a host
            // default cannot turn it off.
            .env("ASAN_OPTIONS", "detect_leaks=1")
            .output()
            .expect("running cycles");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !stderr.contains("LeakSanitizer"),
            "the cycles leaked:\n{stderr}"
        );
        (ok("cycles (under AddressSanitizer)", out), stderr)
    };
    cycles("10");
    let base = resource_counts();
    let (printed, stderr) = cycles("1000");
    let dropped: u64 = printed
        .trim()
        .strip_prefix("cycles: 1000 connect/close cycles, each echo verified, ")
        .and_then(|rest| rest.strip_suffix(" dropped"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not the summary line: {printed}"));
    println!("{}\n{stderr}", printed.trim());
    assert!(
        dropped <= 10,
        "{dropped} of 1,000 connections dropped:\n{stderr}"
    );
    assert_released(&base);
}

fn hex_digest(bytes: &[u8]) -> String {
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
