//! The Python package (python/, crate rdmactor-py) against the `server` binary on real
//! verbs: examples/python/ run with the venv that scripts/lib/python-tests makes
//! (`<target>/python-venv`, or the one `RDMACTOR_PYTHON_VENV` names), whose package was
//! built from this tree, so run that script before the VM stage. Then the echo
//! client's bytes and a timed 64 B run, a 64 MiB upload GOOD with the SHA-256 computed
//! here, and one-sided reads of a region. Natively, the package's pytest suite runs
//! the same examples against a loopback server in the Python process.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rdmactor_tests::programs::{ok, repo, ServerBinary};
use rdmactor_tests::{rdma_context, target_bin};
use sha2::Digest as _;

pub(crate) fn venv_python() -> PathBuf {
    let venv = std::env::var_os("RDMACTOR_PYTHON_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let profile_dir = target_bin("");
            profile_dir
                .parent()
                .expect("target/<profile>")
                .join("python-venv")
        });
    venv.join("bin/python")
}

pub(crate) fn example(python: &Path, name: &str, args: &[&str]) -> Output {
    Command::new(python)
        .arg(repo().join("examples/python").join(name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {name}: {e}"))
}

#[test]
fn python_examples_echo_upload_and_read_against_the_server() {
    let Some(_ctx) = rdma_context() else { return };
    let python = venv_python();
    // Missing, the test fails rather than passing with nothing run.
    assert!(
        python.exists(),
        "{} not found: run scripts/lib/python-tests first (it makes the venv and installs the package)",
        python.display()
    );

    let store = tempfile::tempdir().unwrap();
    let region = store.path().join("region.bin");
    let region_bytes: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::write(&region, &region_bytes).unwrap();
    let files = store.path().join("files");
    std::fs::create_dir(&files).unwrap();
    let mut region_arg = std::ffi::OsString::from("pyregion=");
    region_arg.push(&region);
    let server = ServerBinary::start([
        "--files-dir".as_ref(),
        files.as_os_str(),
        "--region".as_ref(),
        region_arg.as_os_str(),
    ]);
    let addr = server.addr.to_string();

    let echo = ok(
        "echo.py",
        example(&python, "echo.py", &[&addr, "hello from Python"]),
    );
    assert_eq!(echo.trim(), "echo: hello from Python");
    let timed = ok(
        "echo.py (timed)",
        example(&python, "echo.py", &[&addr, "", "2000", "64"]),
    );
    assert!(
        timed.contains("RESULT kind=py-echo size=64 rounds=2000 p50_us="),
        "{timed}"
    );
    println!("{}", timed.trim());

    let src = tempfile::tempdir().unwrap();
    let path = src.path().join("from-python.bin");
    let bytes: Vec<u8> = (0..64u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    std::fs::write(&path, &bytes).unwrap();
    let want: String = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let up = ok(
        "files.py",
        example(&python, "files.py", &[&addr, path.to_str().unwrap()]),
    );
    let line = format!("GOOD {} sha256:{want} {}", path.display(), bytes.len());
    assert_eq!(up.trim(), line);
    assert!(
        std::fs::read(files.join("from-python.bin")).unwrap() == bytes,
        "the stored bytes"
    );
    let again = example(&python, "files.py", &[&addr, path.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    assert!(String::from_utf8_lossy(&again.stdout).starts_with("REJECTED "));

    let reads = ok(
        "read_loop.py",
        example(&python, "read_loop.py", &[&addr, "pyregion", "3", "0"]),
    );
    let head: String = region_bytes[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let lines: Vec<&str> = reads.lines().collect();
    assert_eq!(lines.len(), 3, "{reads}");
    for line in lines {
        assert!(line.ends_with(&format!("len=4096 head={head}")), "{line}");
    }
}
