//! For the tests whose client is another program (the C library's examples, the
//! Python package's): the `server` binary as a child process, started on the test
//! address with port 0, its address taken from its `listening on` line, killed when
//! the value drops, however the test ends; and a program's run checked.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};

use crate::{target_bin, test_addr};

/// A running `server`.
pub struct ServerBinary {
    child: Child,
    /// Kept open: a server that prints more must not meet a closed pipe.
    _stdout: BufReader<ChildStdout>,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl ServerBinary {
    /// `server --listen <test ip>:0 ARGS...`, once it listens.
    pub fn start<I, S>(args: I) -> ServerBinary
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut child = Command::new(target_bin("server"))
            .args(["--listen", &format!("{}:0", test_addr().ip())])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the server binary (build the examples' binaries)");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let addr = loop {
            let mut line = String::new();
            let n = stdout.read_line(&mut line).expect("the server's output");
            if n == 0 {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the server exited before listening");
            }
            if let Some(a) = line.trim().strip_prefix("listening on ") {
                break a.parse().expect("an address");
            }
        };
        ServerBinary {
            child,
            _stdout: stdout,
            addr,
        }
    }
}

impl Drop for ServerBinary {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The standard output of a program that must have succeeded; otherwise fails with
/// `what`, its exit status and both outputs.
pub fn ok(what: &str, out: Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} exited {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
