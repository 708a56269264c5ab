//! The C side, compiled and run as a C programmer would: the library installed by
//! `scripts/install-c` into a temporary prefix (the build `cargo test` just made, not
//! a second one), the examples and the hostile caller compiled against it through
//! pkg-config with `cc -Wall -Werror`, and the hostile caller run.
//!
//! Natively there is no RDMA device, so the hostile caller runs the checks that need
//! none (and says which it skipped); the VM suite runs it against a server
//! (tests/verbs/c_client.rs).

use std::path::{Path, PathBuf};
use std::process::Command;

fn found(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok()
}

/// `target/<profile>`: the test binary is in its `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_owned()
}

/// Installs the library built for this test run under a new prefix.
fn install() -> tempfile::TempDir {
    let prefix = tempfile::tempdir().expect("a prefix");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = profile_dir();
    let mut cmd = Command::new(root.join("scripts/install-c"));
    if dir.ends_with("debug") {
        cmd.arg("--debug");
    }
    let target = dir.parent().expect("target/");
    let out = cmd
        .arg("--no-build")
        .arg(prefix.path())
        .env("CARGO_TARGET_DIR", target)
        .output()
        .expect("running scripts/install-c");
    assert!(
        out.status.success(),
        "scripts/install-c failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    prefix
}

/// `cc -Wall -Werror SRC $(pkg-config --cflags --libs rdmactor) -o OUT`.
fn compile(prefix: &Path, src: &Path, out: &Path) {
    let pc = prefix.join("lib/pkgconfig");
    let flags = Command::new("pkg-config")
        .args(["--cflags", "--libs", "rdmactor"])
        .env("PKG_CONFIG_PATH", &pc)
        .output()
        .expect("pkg-config");
    assert!(
        flags.status.success(),
        "pkg-config: {}",
        String::from_utf8_lossy(&flags.stderr)
    );
    let flags = String::from_utf8(flags.stdout).expect("UTF-8 flags");
    let out_cc = Command::new("cc")
        .args([
            "-Wall",
            "-Wextra",
            "-Werror",
            "-std=c11",
            "-D_POSIX_C_SOURCE=200809L",
        ])
        .arg(src)
        .args(flags.split_whitespace())
        .arg("-o")
        .arg(out)
        .output()
        .expect("cc");
    assert!(
        out_cc.status.success(),
        "cc {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&out_cc.stderr)
    );
}

#[test]
fn examples_and_the_hostile_caller_compile_and_the_hostile_caller_is_refused_cleanly() {
    // Both are there wherever this crate builds: cc links every Rust program, and
    // scripts/setup installs pkg-config (the framework's build needs it too). A machine
    // without them fails here rather than passing with nothing compiled.
    for tool in ["cc", "pkg-config"] {
        assert!(
            found(tool),
            "{tool} not found: the C programs cannot be compiled"
        );
    }
    let prefix = install();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for header in [
        "include/rdmactor.h",
        "lib/librdmactor.so.0",
        "lib/librdmactor.a",
    ] {
        assert!(prefix.path().join(header).exists(), "{header} installed");
    }
    let bin = prefix.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for src in [
        "examples/c/echo_client.c",
        "examples/c/ft.c",
        "c/tests/hostile.c",
        "c/tests/cycles.c",
    ] {
        let name = Path::new(src).file_stem().unwrap();
        compile(prefix.path(), &root.join(src), &bin.join(name));
    }
    let run = Command::new(bin.join("hostile"))
        .env("LD_LIBRARY_PATH", prefix.path().join("lib"))
        .output()
        .expect("running hostile");
    let stdout = String::from_utf8_lossy(&run.stdout);
    println!("{stdout}");
    assert!(
        run.status.success(),
        "hostile failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(!stdout.contains("FAIL"), "{stdout}");
    let summary = stdout.lines().last().unwrap_or_default();
    let passed: usize = summary
        .strip_prefix("hostile: ")
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no summary line: {stdout}"));
    assert!(
        passed >= 11,
        "at least the checks that need no device ran: {stdout}"
    );
    // The examples refuse bad usage with a message, not a crash.
    let ft = Command::new(bin.join("ft"))
        .env("LD_LIBRARY_PATH", prefix.path().join("lib"))
        .output()
        .expect("running ft");
    assert_eq!(ft.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&ft.stderr).contains("usage"));
}
