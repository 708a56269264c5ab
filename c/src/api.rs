//! The library's operations on handles and Rust values: everything the C entry points
//! do once their pointers are read (`ffi/` reads them, and only it).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt as _;
use rdmactor_services::members;

use crate::block::block_on;
use crate::link::{Link, ReadFailure, Transfer};
use crate::runtime::{with_timeout, Context, Done, Engine, Output};
use crate::status::{Failure, Result, RDMACTOR_BUSY, RDMACTOR_SHUTTING_DOWN, RDMACTOR_TIMEOUT};
use crate::tables::{ConnEntry, CONNECTIONS, CONTEXTS};

/// `0` means no limit, the rest milliseconds: the C calls' convention.
pub fn timeout(ms: u32) -> Option<Duration> {
    (ms != 0).then(|| Duration::from_millis(u64::from(ms)))
}

fn context(id: u64) -> Result<Arc<Context>> {
    CONTEXTS
        .get(id)
        .ok_or_else(|| Failure::bad_handle("context"))
}

fn connection(id: u64) -> Result<Arc<ConnEntry>> {
    CONNECTIONS
        .get(id)
        .ok_or_else(|| Failure::bad_handle("connection"))
}

fn timed_out(what: &str, t: Option<Duration>) -> Failure {
    let ms = t.map_or(0, |t| t.as_millis());
    Failure::new(
        RDMACTOR_TIMEOUT,
        format!("{what}: no answer within {ms} ms"),
    )
}

pub fn ctx_new() -> Result<u64> {
    Ok(ctx_insert(Context::start_verbs()?))
}

pub fn ctx_insert(ctx: Context) -> u64 {
    CONTEXTS.insert(ctx)
}

pub fn ctx_free(id: u64) -> Result<()> {
    let ctx = CONTEXTS
        .remove(id)
        .ok_or_else(|| Failure::bad_handle("context"))?;
    ctx.stop(id);
    Ok(())
}

/// Frees context `id` without waiting: its thread is told to close the connections and
/// shut down, and ends on its own. For destructors, which must not block (Python's run
/// holding the GIL, and freeing waits for every connection's goodbye).
pub fn ctx_release(id: u64) -> Result<()> {
    let ctx = CONTEXTS
        .remove(id)
        .ok_or_else(|| Failure::bad_handle("context"))?;
    ctx.stop_in_background(id);
    Ok(())
}

pub fn ctx_fd(id: u64) -> Result<i32> {
    Ok(context(id)?.completions.raw_fd())
}

/// Parses `host:port` as C gives it; names are not resolved (rdma_cm wants an
/// address, and a DNS wait would hide inside a call with a timeout).
pub fn parse_addr(addr: &str) -> Result<SocketAddr> {
    addr.parse()
        .map_err(|e| Failure::invalid(format!("address {addr:?}: {e} (want IP:PORT)")))
}

/// Parses a comma-separated list of `host:port` seeds (at least one).
pub fn parse_seeds(seeds: &str) -> Result<Vec<SocketAddr>> {
    let list = seeds
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(parse_addr)
        .collect::<Result<Vec<_>>>()?;
    if list.is_empty() {
        return Err(Failure::invalid(
            "seeds: no address (want IP:PORT[,IP:PORT..])",
        ));
    }
    Ok(list)
}

/// Where a connect goes.
pub enum Target {
    /// One server.
    Addr(SocketAddr),
    /// A server of the cluster these seeds know (`members`).
    Seeds(Vec<SocketAddr>),
}

impl Target {
    /// `addr` for [`Target::Addr`], a seed list for [`Target::Seeds`].
    pub fn parse(text: &str, through_seeds: bool) -> Result<Target> {
        Ok(if through_seeds {
            Target::Seeds(parse_seeds(text)?)
        } else {
            Target::Addr(parse_addr(text)?)
        })
    }
}

/// The connect job: on the runtime thread, inserts the handle in the same step that
/// checks the context is still live (see `tables::close_connections_of`).
fn connect_job(
    ctx_id: u64,
    engine: Rc<dyn Engine>,
    target: Target,
    service: String,
    key: Option<PathBuf>,
    limit: Option<Duration>,
) -> futures::future::LocalBoxFuture<'static, Result<u64>> {
    let link = match target {
        Target::Addr(addr) => engine.connect(addr, service, key),
        Target::Seeds(seeds) => {
            // Each node's connect within the call's own limit, at most the usual bound.
            let dial = limit.map_or(members::DEFAULT_DIAL, |l| l.min(members::DEFAULT_DIAL));
            engine.connect_via(seeds, service, key, dial)
        }
    };
    let fut = with_timeout(link, limit, "connect");
    async move {
        let link = fut.await?;
        match CONTEXTS.get(ctx_id) {
            Some(ctx) if !engine.closing() => Ok(CONNECTIONS.insert(ConnEntry {
                ctx_id,
                ctx,
                link,
                transfer: Default::default(),
            })),
            _ => {
                link.close().await;
                Err(Failure::new(
                    RDMACTOR_SHUTTING_DOWN,
                    "connect: the context was freed meanwhile",
                ))
            }
        }
    }
    .boxed_local()
}

pub fn connect(
    ctx_id: u64,
    target: Target,
    service: &str,
    key: Option<PathBuf>,
    timeout_ms: u32,
) -> Result<u64> {
    let ctx = context(ctx_id)?;
    let service = service.to_owned();
    let limit = timeout(timeout_ms);
    ctx.block(None, "connect", move |engine| {
        connect_job(ctx_id, engine, target, service, key, limit)
    })
}

pub fn close(conn: u64) -> Result<()> {
    let entry = CONNECTIONS
        .remove(conn)
        .ok_or_else(|| Failure::bad_handle("connection"))?;
    block_on(entry.link.close(), None);
    Ok(())
}

/// Closes `conn` without waiting for the server's goodbye: the handle goes now, and
/// the connection closes as a dropped `ClientConnection` does (the goodbye sent when
/// the connection is still up, released locally otherwise). For destructors, which
/// must not block; a call still running on the connection in another thread finishes
/// first, holding its own reference.
pub fn release(conn: u64) -> Result<()> {
    CONNECTIONS
        .remove(conn)
        .map(drop)
        .ok_or_else(|| Failure::bad_handle("connection"))
}

pub fn request(conn: u64, data: Vec<u8>, timeout_ms: u32) -> Result<Vec<u8>> {
    let entry = connection(conn)?;
    let t = timeout(timeout_ms);
    block_on(entry.link.request(data), t).unwrap_or_else(|| Err(timed_out("request", t)))
}

pub fn send(conn: u64, data: Vec<u8>, timeout_ms: u32) -> Result<()> {
    let entry = connection(conn)?;
    let t = timeout(timeout_ms);
    block_on(entry.link.send(data), t).unwrap_or_else(|| Err(timed_out("send", t)))
}

pub fn read(
    conn: u64,
    name: &str,
    offset: u64,
    cap: usize,
    timeout_ms: u32,
) -> Result<(Vec<u8>, u64), ReadFailure> {
    let entry = connection(conn)?;
    let t = timeout(timeout_ms);
    block_on(entry.link.read(name.to_owned(), offset, cap), t)
        .unwrap_or_else(|| Err(timed_out("read", t).into()))
}

/// The name an upload is stored under when the caller gives none: the path's file
/// name, as `cp` to a directory would name it.
pub fn upload_name(path: &Path) -> Result<String> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| Failure::invalid(format!("{} has no UTF-8 file name", path.display())))
}

/// Which way a file goes.
pub enum FileOp {
    Send { path: PathBuf, name: String },
    Fetch { name: String, dir: PathBuf },
}

/// Runs a transfer on the runtime thread. A transfer cut by the timeout is closed with
/// its connection: the server then drops its side (and any partial file) rather than
/// waiting for chunks that never come, as the files client does on any error.
pub fn file(conn: u64, op: FileOp, overwrite: bool, timeout_ms: u32) -> Result<Transfer> {
    let entry = connection(conn)?;
    take_transfer(&entry)?;
    let link: Arc<dyn Link> = entry.link.clone();
    let limit = timeout(timeout_ms);
    let result = entry.ctx.block(None, "file transfer", move |_| {
        transfer(link, op, overwrite, limit).boxed_local()
    });
    entry.transfer.store(false, Ordering::Release);
    result
}

/// What a submitted operation does.
pub enum Submit {
    Request(Vec<u8>),
    Send(Vec<u8>),
    /// A `read` region from `offset`, at most `cap` bytes.
    Read {
        name: String,
        offset: u64,
        cap: usize,
    },
    /// A file transfer (the connection's transfer flag is taken at submit).
    File {
        op: FileOp,
        overwrite: bool,
    },
}

/// Runs one transfer under `limit`; a transfer cut by the timeout closes its
/// connection (see [`file`]). On the runtime thread.
async fn transfer(
    link: Arc<dyn Link>,
    op: FileOp,
    overwrite: bool,
    limit: Option<Duration>,
) -> Result<Transfer> {
    let fut = match op {
        FileOp::Send { path, name } => link.send_file(path, name, overwrite),
        FileOp::Fetch { name, dir } => link.fetch_file(name, dir, overwrite),
    };
    let res = with_timeout(fut, limit, "file transfer").await;
    if matches!(&res, Err(f) if f.status == RDMACTOR_TIMEOUT) {
        link.close().await;
    }
    res
}

/// Takes connection `entry`'s transfer flag: one file transfer at a time carries it.
fn take_transfer(entry: &ConnEntry) -> Result<()> {
    if entry.transfer.swap(true, Ordering::AcqRel) {
        return Err(Failure::new(
            RDMACTOR_BUSY,
            "a file transfer is already running on this connection",
        ));
    }
    Ok(())
}

/// Starts `what` on connection `conn`; its completion goes to the connection's
/// context's queue, the reply copied to `dest` when polled.
pub fn submit(
    conn: u64,
    what: Submit,
    dest: (usize, usize),
    timeout_ms: u32,
    user_data: u64,
) -> Result<u64> {
    let entry = connection(conn)?;
    let ctx = entry.ctx.clone();
    let completions = ctx.completions.clone();
    completions.admit()?;
    let is_file = matches!(what, Submit::File { .. });
    if is_file {
        if let Err(e) = take_transfer(&entry) {
            completions.release();
            return Err(e);
        }
    }
    let op = ctx.next_op();
    let limit = timeout(timeout_ms);
    let link = entry.link.clone();
    let held = entry.clone();
    let started = ctx.run(move |_| {
        async move {
            let result = match what {
                Submit::Request(data) => with_timeout(link.request(data), limit, "request")
                    .await
                    .map(Output::Bytes),
                Submit::Send(data) => with_timeout(link.send(data), limit, "send")
                    .await
                    .map(|()| Output::Nothing),
                Submit::Read { name, offset, cap } => {
                    match with_timeout(
                        async { Ok::<_, Failure>(link.read(name, offset, cap).await) },
                        limit,
                        "read",
                    )
                    .await
                    {
                        Ok(Ok((data, version))) => Ok(Output::Region { data, version }),
                        Ok(Err(ReadFailure::TooSmall { needed })) => {
                            Ok(Output::RegionTooSmall { needed })
                        }
                        Ok(Err(ReadFailure::Failed(f))) | Err(f) => Err(f),
                    }
                }
                Submit::File { op, overwrite } => {
                    let done = transfer(link, op, overwrite, limit).await;
                    held.transfer.store(false, Ordering::Release);
                    done.map(Output::File)
                }
            };
            completions.push(Done {
                op,
                user_data,
                conn,
                result,
                dest,
            });
        }
        .boxed_local()
    });
    if let Err(e) = started {
        if is_file {
            entry.transfer.store(false, Ordering::Release);
        }
        entry.ctx.completions.release();
        return Err(e);
    }
    Ok(op)
}

pub fn connect_submit(
    ctx_id: u64,
    target: Target,
    service: &str,
    key: Option<PathBuf>,
    timeout_ms: u32,
    user_data: u64,
) -> Result<u64> {
    let ctx = context(ctx_id)?;
    let service = service.to_owned();
    let completions = ctx.completions.clone();
    completions.admit()?;
    let op = ctx.next_op();
    let limit = timeout(timeout_ms);
    let started = ctx.run(move |engine| {
        let fut = connect_job(ctx_id, engine, target, service, key, limit);
        async move {
            let result = fut.await;
            let conn = *result.as_ref().unwrap_or(&0);
            completions.push(Done {
                op,
                user_data,
                conn,
                result: result.map(|_| Output::Nothing),
                dest: (0, 0),
            });
        }
        .boxed_local()
    });
    if let Err(e) = started {
        ctx.completions.release();
        return Err(e);
    }
    Ok(op)
}

pub fn poll(ctx_id: u64, max: usize) -> Result<Vec<Done>> {
    Ok(context(ctx_id)?.completions.pop(max))
}
