//! The `/metrics` HTTP endpoint, bounded so that whoever can reach it cannot make it
//! hold the process's threads or memory: at most `max_connections` at once (the next
//! one is answered 503 and closed), one request per connection, the request head read
//! within `timeout` and at most `max_request_bytes` of it, the answer written within
//! `timeout`. It serves `GET /metrics` and nothing else.
//!
//! It is written here, over std's TCP, rather than taken from the exporter crate: that
//! crate's listener has no connection limit and no timeouts, and a scraper needs none
//! of HTTP beyond one GET. The text comes from any renderer (for example
//! `metrics_exporter_prometheus::PrometheusHandle::render`), so the framework depends on
//! no exporter. It must not face clients: bind it to loopback or a management network.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one scraper may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointLimits {
    /// Connections served at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// To read the request head, and again to write the answer.
    pub timeout: Duration,
    /// Longest request head read.
    pub max_request_bytes: usize,
}

impl Default for EndpointLimits {
    fn default() -> Self {
        EndpointLimits {
            max_connections: 8,
            timeout: Duration::from_secs(5),
            max_request_bytes: 8 << 10,
        }
    }
}

/// Serves `render()`'s text at `http://ADDR/metrics` on a thread of its own, within
/// `limits`. Returns the bound address (port 0 picks one).
///
/// # Errors
///
/// Binding `addr` failed.
pub fn serve(
    addr: SocketAddr,
    limits: EndpointLimits,
    render: impl Fn() -> String + Send + Sync + 'static,
) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let render = Arc::new(render);
    let active = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                if active.fetch_add(1, Ordering::AcqRel) >= limits.max_connections {
                    active.fetch_sub(1, Ordering::AcqRel);
                    let _ = refuse(stream, limits.timeout);
                    continue;
                }
                let (render, done) = (render.clone(), active.clone());
                let spawned = std::thread::Builder::new()
                    .name("metrics-http-conn".into())
                    .spawn(move || {
                        let _ = answer(stream, &limits, &*render);
                        done.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    // The closure (and the stream) is gone with the error.
                    active.fetch_sub(1, Ordering::AcqRel);
                }
            }
        })?;
    Ok(bound)
}

fn refuse(mut stream: TcpStream, timeout: Duration) -> io::Result<()> {
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
}

fn answer(
    mut stream: TcpStream,
    limits: &EndpointLimits,
    render: &dyn Fn() -> String,
) -> io::Result<()> {
    let deadline = Instant::now() + limits.timeout;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || head.len() >= limits.max_request_bytes {
            return Ok(()); // Too slow or too long: closed without an answer.
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    stream.set_write_timeout(Some(limits.timeout))?;
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let (status, body) = match line.split(|&b| b == b' ').collect::<Vec<_>>()[..] {
        [b"GET", b"/metrics", _] => ("200 OK", render()),
        [b"GET", _, _] => ("404 Not Found", String::new()),
        _ => ("400 Bad Request", String::new()),
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    fn start(limits: EndpointLimits) -> SocketAddr {
        serve("127.0.0.1:0".parse().unwrap(), limits, || {
            "rdmactor_up 1\n".to_string()
        })
        .unwrap()
    }

    #[test]
    fn serves_get_metrics_and_nothing_else() {
        let addr = start(EndpointLimits::default());
        let ok = get(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(
            ok.starts_with("HTTP/1.1 200 OK") && ok.ends_with("rdmactor_up 1\n"),
            "{ok}"
        );
        assert!(get(addr, b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get(addr, b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 400"));
    }

    /// Issue 26 (11): idle connections could be held open for ever, as many as the
    /// scraper liked. Beyond the cap the next is refused at once; a silent one is closed
    /// after the timeout, and its place serves the next scraper.
    #[test]
    fn idle_connections_are_capped_and_timed_out() {
        let limits = EndpointLimits {
            max_connections: 2,
            timeout: Duration::from_millis(300),
            max_request_bytes: 64,
        };
        let addr = start(limits);
        let idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(50));
        let refused = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
        // The silent ones are closed once the timeout passes (EOF).
        for mut s in idle {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut b = [0u8; 1];
            assert_eq!(s.read(&mut b).unwrap_or(0), 0);
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(get(addr, b"GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200"));
        // A head longer than the limit gets no answer.
        let long = [b'a'; 200];
        assert_eq!(get(addr, &long), "");
    }
}
