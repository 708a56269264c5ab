//! The locked-memory limit (`RLIMIT_MEMLOCK`, what `ulimit -l` shows): every
//! registration pins its pages, and the kernel charges them to this limit unless the
//! process holds `CAP_IPC_LOCK`. Distributions default to 64 KiB or 8 MiB, far below
//! what a server's pool registers, and the verb then fails with a bare `ENOMEM` or
//! `EPERM`: this module lets the error name the limit instead.

use std::io;

use super::error::{Verb, VerbsError};

/// The process's locked-memory limit in bytes (the soft limit, which is the one
/// enforced), or `None` when unlimited.
pub fn memlock_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the call to fill; getrlimit reads
    // nothing else and keeps no pointer.
    let ret = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    if ret != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(lim.rlim_cur)
}

/// The error of a registration of `len` bytes that just failed (read errno before any
/// other call): [`VerbsError::Memlock`] when the errno is one the memlock limit causes
/// (`ENOMEM`, `EPERM`, `EAGAIN`) and a limit is set, else the verb's plain error.
pub(crate) fn registration_failed(len: usize) -> VerbsError {
    let source = io::Error::last_os_error();
    let memlock_errno = matches!(
        source.raw_os_error(),
        Some(libc::ENOMEM | libc::EPERM | libc::EAGAIN)
    );
    match memlock_limit() {
        Some(limit) if memlock_errno => VerbsError::Memlock { len, limit, source },
        _ => VerbsError::Call {
            verb: Verb::RegMr,
            source,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_names_the_limit_and_how_to_raise_it() {
        let e = VerbsError::Memlock {
            len: 4 << 20,
            limit: 64 << 10,
            source: io::Error::from_raw_os_error(libc::ENOMEM),
        };
        let text = e.to_string();
        for part in [
            "RLIMIT_MEMLOCK",
            "ulimit -l",
            "65536",
            "4194304",
            "CAP_IPC_LOCK",
        ] {
            assert!(text.contains(part), "{part} missing from {text}");
        }
    }
}
