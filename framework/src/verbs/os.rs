//! Small libc helpers the verbs objects share: fd flags, poll(2), socket addresses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::RawFd;
use std::time::Duration;

use crate::verbs::error::{Result, Verb, VerbsError};

/// Puts `fd` in non-blocking mode so event reads never stall a runtime thread.
pub(crate) fn set_nonblocking(fd: RawFd, verb: Verb) -> Result<()> {
    // SAFETY: fcntl on a descriptor we own with F_GETFL/F_SETFL has no memory effects.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(VerbsError::last_os(verb));
    }
    Ok(())
}

/// Waits until `fd` is readable or `timeout` passes (`None`: forever). EINTR retries.
pub(crate) fn poll_readable(fd: RawFd, timeout: Option<Duration>) -> Result<bool> {
    let ms = timeout.map_or(-1, poll_millis);
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: `pfd` is a valid array of one pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n >= 0 {
            return Ok(n > 0);
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(VerbsError::Call {
                verb: Verb::Poll,
                source: err,
            });
        }
    }
}

/// A `sockaddr_storage` holding `addr`, for rdma_bind_addr / rdma_resolve_addr.
pub(crate) fn to_sockaddr(addr: &SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    ss
}

/// Reads a `sockaddr` written by librdmacm back into a `SocketAddr`.
///
/// # Safety
/// `sa` must point to a valid sockaddr whose family-specific struct is fully readable.
pub(crate) unsafe fn from_sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: the caller guarantees `sa` is valid to read.
    let family = unsafe { (*sa).sa_family } as i32;
    match family {
        libc::AF_INET => {
            // SAFETY: the family says this is a sockaddr_in.
            let sin = unsafe { &*(sa as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this is a sockaddr_in6.
            let sin6 = unsafe { &*(sa as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::new(
                IpAddr::V6(ip),
                u16::from_be(sin6.sin6_port),
            ))
        }
        _ => None,
    }
}

/// `poll(2)`'s timeout for `t`: whole milliseconds, rounded up. Rounded down, the last
/// millisecond before a caller's deadline became a run of `poll(0)` calls: the rdma_cm
/// event thread, which waits in 50 ms steps, spun through that millisecond every time:
/// `perf trace` in the VM counted 1,667 polls and 1,719 failed `rdma_get_cm_event` calls
/// in its 2.7 s of waiting (about 630 wake-ups a second), and 55 polls once rounded up.
fn poll_millis(t: Duration) -> i32 {
    let ms = t.as_nanos().div_ceil(1_000_000);
    ms.min(i32::MAX as u128) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_timeouts_round_up_to_whole_milliseconds() {
        assert_eq!(poll_millis(Duration::ZERO), 0);
        assert_eq!(poll_millis(Duration::from_nanos(1)), 1);
        assert_eq!(poll_millis(Duration::from_micros(999)), 1);
        assert_eq!(poll_millis(Duration::from_millis(1)), 1);
        assert_eq!(poll_millis(Duration::from_micros(1001)), 2);
        assert_eq!(poll_millis(Duration::from_millis(50)), 50);
        assert_eq!(poll_millis(Duration::from_secs(u64::MAX)), i32::MAX);
    }
}
