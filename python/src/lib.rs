//! The native half of rdmactor's Python package, `rdmactor._native`: Python classes
//! over the C library's Rust layer (`rdmactor_c::api`), so that Python calls the very
//! operations C calls, on the same handles, runtime thread and status folding, and no
//! second client is written. The pure-Python half (`python/rdmactor/`) re-exports
//! these, keeps the default context, and builds `rdmactor.aio` on the completion fd.
//!
//! - Every call that waits releases the GIL (`Python::detach`): other Python threads
//!   run while one waits on the network, and a request's answer wakes the waiting
//!   thread directly, as it does a C caller's.
//! - A failure is an exception of the class named by its C status (`errors.rs`).
//! - No `unsafe`: bytes come in through the buffer protocol's safe API, a copy into a
//!   Vec the connection owns (the framework sends from owned buffers), and go out as
//!   `bytes`, or into a caller's writable buffer.
//! - `rdmactor._testing` (`testing.rs`) serves echo, files and read on the loopback
//!   transport inside the Python process, for the package's tests.

use std::path::PathBuf;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyMemoryView, PySlice};
use rdmactor_c::api::{self, FileOp, Submit};
use rdmactor_c::link::{ReadFailure, Transfer, Verdict};
use rdmactor_c::runtime::{Done, Output};
use rdmactor_c::status::Failure;

mod errors;
mod testing;

use errors::to_py;

/// What a submitted operation was, carried in the completion's user data, so that a
/// connect's completion (which carries a new handle) is told from a send's.
const OP_CONNECT: u64 = 1;
const OP_REQUEST: u64 = 2;
const OP_SEND: u64 = 3;
const OP_READ: u64 = 4;
const OP_FILE: u64 = 5;

/// Seconds as Python gives them (`None`: no limit) to the C layer's milliseconds (0:
/// no limit). Zero or less is refused rather than read as "no limit", which is what a
/// C caller's 0 means and never what a Python caller's 0.0 means.
fn millis(timeout: Option<f64>) -> PyResult<u32> {
    match timeout {
        None => Ok(0),
        Some(t) if t.is_nan() || t <= 0.0 => Err(PyValueError::new_err(format!(
            "timeout must be a positive number of seconds, or None for no limit, not {t}"
        ))),
        // Saturates past 49 days; a sub-millisecond timeout waits one millisecond.
        Some(t) => Ok((t * 1000.0).ceil().min(f64::from(u32::MAX)) as u32),
    }
}

/// The bytes of any object with the buffer protocol (bytes, bytearray, memoryview,
/// numpy arrays of bytes), as the Vec the connection will own.
fn bytes_in(data: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    PyBuffer::<u8>::get(data)?.to_vec(data.py())
}

/// Seeds as Python gives them: one string (commas allowed) or a sequence of strings.
fn seed_list(seeds: &Bound<'_, PyAny>) -> PyResult<String> {
    if let Ok(text) = seeds.extract::<String>() {
        return Ok(text);
    }
    let list: Vec<String> = seeds
        .extract()
        .map_err(|_| pyo3::exceptions::PyTypeError::new_err("seeds: a str or a sequence of str"))?;
    Ok(list.join(","))
}

/// A context: the C library's (a runtime thread, the device, a completion queue).
/// Closing it, or its last reference going, closes every connection it opened.
#[pyclass(module = "rdmactor._native", frozen)]
pub struct Context {
    pub(crate) id: u64,
}

#[pymethods]
impl Context {
    /// A context on verbs: opens the RDMA device now, so that a machine without one
    /// fails here rather than at the first connect.
    #[new]
    fn new(py: Python<'_>) -> PyResult<Context> {
        let id = py.detach(api::ctx_new).map_err(to_py)?;
        Ok(Context { id })
    }

    /// Connects to `service` at `addr` (`"IP:PORT"`), proving the identity in
    /// `key_file` when given.
    #[pyo3(signature = (addr, service, key_file=None, timeout=Some(30.0)))]
    fn connect(
        slf: &Bound<'_, Self>,
        addr: String,
        service: String,
        key_file: Option<PathBuf>,
        timeout: Option<f64>,
    ) -> PyResult<Connection> {
        let target = api::Target::parse(&addr, false).map_err(to_py)?;
        Context::open(slf, target, service, key_file, timeout)
    }

    /// Connects to `service` on a server of a cluster, knowing only `seeds` (one
    /// `"IP:PORT"`, several comma-separated, or a list of them): the seeds are asked
    /// in order for the servers of `service`, which are then tried least loaded first,
    /// each for at most 5 s (or `timeout`, if shorter). `Unreachable` names every
    /// address tried when none serves.
    #[pyo3(signature = (seeds, service, key_file=None, timeout=Some(30.0)))]
    fn connect_cluster(
        slf: &Bound<'_, Self>,
        seeds: &Bound<'_, PyAny>,
        service: String,
        key_file: Option<PathBuf>,
        timeout: Option<f64>,
    ) -> PyResult<Connection> {
        let target = api::Target::parse(&seed_list(seeds)?, true).map_err(to_py)?;
        Context::open(slf, target, service, key_file, timeout)
    }

    /// Starts a `connect_cluster`; its completion carries the connection. Returns the
    /// op id.
    #[pyo3(signature = (seeds, service, key_file=None, timeout=Some(30.0)))]
    fn submit_connect_cluster(
        &self,
        seeds: &Bound<'_, PyAny>,
        service: &str,
        key_file: Option<PathBuf>,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        let target = api::Target::parse(&seed_list(seeds)?, true).map_err(to_py)?;
        api::connect_submit(
            self.id,
            target,
            service,
            key_file,
            millis(timeout)?,
            OP_CONNECT,
        )
        .map_err(to_py)
    }

    /// The eventfd that is readable while completions wait (for `add_reader`).
    fn fileno(&self) -> PyResult<i32> {
        api::ctx_fd(self.id).map_err(to_py)
    }

    /// Starts a connect; its completion carries the connection. Returns the op id.
    #[pyo3(signature = (addr, service, key_file=None, timeout=Some(30.0)))]
    fn submit_connect(
        &self,
        addr: &str,
        service: &str,
        key_file: Option<PathBuf>,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        api::connect_submit(
            self.id,
            api::Target::parse(addr, false).map_err(to_py)?,
            service,
            key_file,
            millis(timeout)?,
            OP_CONNECT,
        )
        .map_err(to_py)
    }

    /// Up to `max` finished operations, oldest first, as `(op, ok, value)`: `value`
    /// is the connection, the reply bytes or None when `ok`, the exception otherwise.
    /// Never blocks.
    #[pyo3(signature = (max=256))]
    fn poll_completions(
        slf: &Bound<'_, Self>,
        max: usize,
    ) -> PyResult<Vec<(u64, bool, Py<PyAny>)>> {
        let done = api::poll(slf.get().id, max).map_err(to_py)?;
        done.into_iter().map(|d| completion(slf, d)).collect()
    }

    /// Closes every connection of the context and stops its thread. Idempotent.
    fn close(&self, py: Python<'_>) {
        let id = self.id;
        // A second close finds no handle: nothing more to do.
        let _ = py.detach(move || api::ctx_free(id));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) {
        self.close(py);
    }
}

impl Context {
    /// The blocking connect of both `connect` and `connect_cluster`, the GIL released
    /// while it waits.
    fn open(
        slf: &Bound<'_, Self>,
        target: api::Target,
        service: String,
        key_file: Option<PathBuf>,
        timeout: Option<f64>,
    ) -> PyResult<Connection> {
        let ms = millis(timeout)?;
        let ctx = slf.get().id;
        let id = slf
            .py()
            .detach(move || api::connect(ctx, target, &service, key_file, ms))
            .map_err(to_py)?;
        Ok(Connection {
            id,
            ctx: slf.clone().unbind(),
        })
    }
}

/// Dropped (garbage-collected, or at interpreter exit) without `close()`: freed
/// without waiting, since a destructor runs holding the GIL and freeing waits for
/// every connection's goodbye. The context's thread finishes the shutdown alone.
impl Drop for Context {
    fn drop(&mut self) {
        let _ = api::ctx_release(self.id);
    }
}

/// A completion as Python sees it.
fn completion(ctx: &Bound<'_, Context>, d: Done) -> PyResult<(u64, bool, Py<PyAny>)> {
    let py = ctx.py();
    let value = match d.result {
        Err(f) => return Ok((d.op, false, to_py(f).into_value(py).into_any())),
        Ok(Output::Bytes(reply)) => PyBytes::new(py, &reply).into_any().unbind(),
        Ok(Output::Nothing) if d.user_data == OP_CONNECT => Py::new(
            py,
            Connection {
                id: d.conn,
                ctx: ctx.clone().unbind(),
            },
        )?
        .into_any(),
        Ok(Output::Nothing) => py.None(),
        Ok(Output::Region { data, version }) => (PyBytes::new(py, &data), version)
            .into_pyobject(py)?
            .into_any()
            .unbind(),
        Ok(Output::RegionTooSmall { needed }) => {
            let e = errors::BufferTooSmall::new_err((
                format!("the region is {needed} bytes; the buffer holds less"),
                needed,
            ));
            return Ok((d.op, false, e.into_value(py).into_any()));
        }
        Ok(Output::File(done)) => Py::new(py, FileResult::from(done))?.into_any(),
    };
    Ok((d.op, true, value))
}

/// One connection to one service. Every call may be made from any thread; requests
/// from several threads each get their own reply. Closed by `close()`, by leaving a
/// `with` block, by its context's close, or when the last reference goes.
#[pyclass(module = "rdmactor._native", frozen)]
pub struct Connection {
    id: u64,
    /// Keeps the context (its runtime thread) alive while the connection is.
    ctx: Py<Context>,
}

#[pymethods]
impl Connection {
    /// Sends `data` and returns the service's reply.
    #[pyo3(signature = (data, timeout=Some(30.0)))]
    fn request(&self, data: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<Py<PyBytes>> {
        let py = data.py();
        let (id, data, ms) = (self.id, bytes_in(data)?, millis(timeout)?);
        let reply = py
            .detach(move || api::request(id, data, ms))
            .map_err(to_py)?;
        Ok(PyBytes::new(py, &reply).unbind())
    }

    /// Sends `data` one way; returns once the connection has queued it.
    #[pyo3(signature = (data, timeout=Some(30.0)))]
    fn send(&self, data: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<()> {
        let (id, bytes, ms) = (self.id, bytes_in(data)?, millis(timeout)?);
        data.py()
            .detach(move || api::send(id, bytes, ms))
            .map_err(to_py)
    }

    /// The `read` service's region `region` from `offset` to its end, one consistent
    /// version of it, by one-sided READs; and that version.
    #[pyo3(signature = (region, offset=0, timeout=Some(30.0)))]
    fn read(
        &self,
        py: Python<'_>,
        region: String,
        offset: u64,
        timeout: Option<f64>,
    ) -> PyResult<(Py<PyBytes>, u64)> {
        let (id, ms) = (self.id, millis(timeout)?);
        let got = py.detach(move || api::read(id, &region, offset, usize::MAX, ms));
        let (data, version) = got.map_err(read_failure)?;
        Ok((PyBytes::new(py, &data).unbind(), version))
    }

    /// `read` into `buf`, a writable buffer of bytes (bytearray, memoryview, numpy
    /// array): returns `(length, version)`. `BufferTooSmall` with the length
    /// needed when the region does not fit; nothing is read then.
    #[pyo3(signature = (region, buf, offset=0, timeout=Some(30.0)))]
    fn read_into(
        &self,
        region: String,
        buf: &Bound<'_, PyAny>,
        offset: u64,
        timeout: Option<f64>,
    ) -> PyResult<(usize, u64)> {
        let py = buf.py();
        // Held across the read: while exported, a bytearray cannot be resized by
        // another thread, so `cap` stays true until the copy.
        let dest = PyBuffer::<u8>::get(buf)?;
        if dest.readonly() {
            return Err(PyTypeError::new_err("read_into needs a writable buffer"));
        }
        let cap = dest.item_count();
        let (id, ms) = (self.id, millis(timeout)?);
        let name = region.clone();
        let got = py.detach(move || api::read(id, &name, offset, cap, ms));
        let (data, version) = match got {
            Ok(v) => v,
            Err(ReadFailure::TooSmall { needed }) => {
                return Err(errors::BufferTooSmall::new_err((
                    format!("region {region:?} from byte {offset} is {needed} bytes; the buffer holds {cap}"),
                    needed,
                )))
            }
            Err(ReadFailure::Failed(f)) => return Err(to_py(f)),
        };
        if data.len() == cap {
            dest.copy_from_slice(py, &data)?;
        } else {
            // The buffer protocol's safe copy fills a whole buffer: a memoryview of the
            // first `len` bytes is that buffer here, and the rest is left as it was.
            let end = isize::try_from(data.len())
                .map_err(|_| PyValueError::new_err("a region larger than isize"))?;
            let head = PyMemoryView::from(buf)?.get_item(PySlice::new(py, 0, end, 1))?;
            PyBuffer::<u8>::get(&head)?.copy_from_slice(py, &data)?;
        }
        Ok((data.len(), version))
    }

    /// Uploads the file at `path` to the `files` service as `name` (default: the
    /// path's file name); the server checks its SHA-256. The verdict is in the
    /// result, not an exception: a REJECTED upload is the service's answer.
    #[pyo3(signature = (path, name=None, overwrite=false, timeout=None))]
    fn send_file(
        &self,
        py: Python<'_>,
        path: PathBuf,
        name: Option<String>,
        overwrite: bool,
        timeout: Option<f64>,
    ) -> PyResult<FileResult> {
        let name = match name {
            Some(n) => n,
            None => api::upload_name(&path).map_err(to_py)?,
        };
        self.file(py, FileOp::Send { path, name }, overwrite, timeout)
    }

    /// Fetches the file `name` from the `files` service into directory `dir`.
    #[pyo3(signature = (name, dir, overwrite=false, timeout=None))]
    fn fetch_file(
        &self,
        py: Python<'_>,
        name: String,
        dir: PathBuf,
        overwrite: bool,
        timeout: Option<f64>,
    ) -> PyResult<FileResult> {
        self.file(py, FileOp::Fetch { name, dir }, overwrite, timeout)
    }

    /// Starts a request; its completion carries the reply. Returns the op id.
    #[pyo3(signature = (data, timeout=Some(30.0)))]
    fn submit_request(&self, data: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<u64> {
        let what = Submit::Request(bytes_in(data)?);
        api::submit(self.id, what, (0, 0), millis(timeout)?, OP_REQUEST).map_err(to_py)
    }

    /// Starts a one-way send. Returns the op id.
    #[pyo3(signature = (data, timeout=Some(30.0)))]
    fn submit_send(&self, data: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<u64> {
        let what = Submit::Send(bytes_in(data)?);
        api::submit(self.id, what, (0, 0), millis(timeout)?, OP_SEND).map_err(to_py)
    }

    /// Starts a read of `region` from `offset`, at most `cap` bytes (no limit by
    /// default); its completion carries `(bytes, version)`, or `BufferTooSmall` with
    /// the length needed. Returns the op id.
    #[pyo3(signature = (region, offset=0, cap=None, timeout=Some(30.0)))]
    fn submit_read(
        &self,
        region: String,
        offset: u64,
        cap: Option<usize>,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        let what = Submit::Read {
            name: region,
            offset,
            cap: cap.unwrap_or(usize::MAX),
        };
        api::submit(self.id, what, (0, 0), millis(timeout)?, OP_READ).map_err(to_py)
    }

    /// Starts an upload as `send_file` does; its completion carries the `FileResult`.
    /// Returns the op id.
    #[pyo3(signature = (path, name=None, overwrite=false, timeout=None))]
    fn submit_send_file(
        &self,
        path: PathBuf,
        name: Option<String>,
        overwrite: bool,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        let name = match name {
            Some(n) => n,
            None => api::upload_name(&path).map_err(to_py)?,
        };
        let what = Submit::File {
            op: FileOp::Send { path, name },
            overwrite,
        };
        api::submit(self.id, what, (0, 0), millis(timeout)?, OP_FILE).map_err(to_py)
    }

    /// Starts a fetch as `fetch_file` does; its completion carries the `FileResult`.
    /// Returns the op id.
    #[pyo3(signature = (name, dir, overwrite=false, timeout=None))]
    fn submit_fetch_file(
        &self,
        name: String,
        dir: PathBuf,
        overwrite: bool,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        let what = Submit::File {
            op: FileOp::Fetch { name, dir },
            overwrite,
        };
        api::submit(self.id, what, (0, 0), millis(timeout)?, OP_FILE).map_err(to_py)
    }

    /// The context the connection belongs to.
    #[getter]
    fn context(&self, py: Python<'_>) -> Py<Context> {
        self.ctx.clone_ref(py)
    }

    /// Closes and releases the connection. Idempotent.
    fn close(&self, py: Python<'_>) {
        let id = self.id;
        let _ = py.detach(move || api::close(id));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) {
        self.close(py);
    }
}

impl Connection {
    fn file(
        &self,
        py: Python<'_>,
        op: FileOp,
        overwrite: bool,
        timeout: Option<f64>,
    ) -> PyResult<FileResult> {
        let (id, ms) = (self.id, millis(timeout)?);
        let done = py
            .detach(move || api::file(id, op, overwrite, ms))
            .map_err(to_py)?;
        Ok(FileResult::from(done))
    }
}

/// Dropped without `close()`: closed without waiting for the server's goodbye (a
/// destructor runs holding the GIL; `close()` waits with it released).
impl Drop for Connection {
    fn drop(&mut self) {
        let _ = api::release(self.id);
    }
}

fn read_failure(f: ReadFailure) -> PyErr {
    match f {
        ReadFailure::Failed(f) => to_py(f),
        // Asked with no capacity limit: cannot happen, and would be the library's bug.
        ReadFailure::TooSmall { needed } => to_py(Failure::new(
            rdmactor_c::status::rdmactor_status::RDMACTOR_INTERNAL,
            format!("read without a limit found its buffer too small ({needed} bytes)"),
        )),
    }
}

/// How a file transfer ended: the service's verdict, not an error of the call.
#[pyclass(module = "rdmactor._native", frozen, get_all)]
pub struct FileResult {
    /// `"GOOD"`, `"BAD"`, `"REJECTED"` or `"ABORTED"`.
    verdict: &'static str,
    /// The file's length in bytes (the offer's).
    bytes: u64,
    /// The file's SHA-256 as 64 lowercase hex digits, as `sha256sum` prints it; None
    /// when the transfer ended before an offer.
    sha256: Option<String>,
    /// Why, for anything but GOOD.
    reason: String,
}

#[pymethods]
impl FileResult {
    /// True for GOOD: the server has the file and its digest matched.
    #[getter]
    fn ok(&self) -> bool {
        self.verdict == "GOOD"
    }

    fn __repr__(&self) -> String {
        format!(
            "FileResult(verdict={:?}, bytes={}, sha256={:?}, reason={:?})",
            self.verdict, self.bytes, self.sha256, self.reason
        )
    }
}

impl From<Transfer> for FileResult {
    fn from(t: Transfer) -> FileResult {
        FileResult {
            verdict: match t.verdict {
                Verdict::Good => "GOOD",
                Verdict::Bad => "BAD",
                Verdict::Rejected => "REJECTED",
                Verdict::Aborted => "ABORTED",
            },
            bytes: t.bytes,
            sha256: t.digest.map(|d| d.to_hex()),
            reason: t.reason,
        }
    }
}

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Context>()?;
    m.add_class::<Connection>()?;
    m.add_class::<FileResult>()?;
    errors::register(m)?;
    testing::register(m)?;
    Ok(())
}
