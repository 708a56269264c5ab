//! What an application implements ([`RequestHandler`]) and what each call is handed
//! ([`RequestCx`]).

use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::one_sided::{Link, OneSidedError};
use crate::runtime::connection::BlockingError;
use crate::runtime::heap::{HeapBudget, Held};
use crate::runtime::service::PeerInfo;
use crate::verbs::RemoteRegion;

/// A service written as one async function from a typed request to a typed result, the
/// shape of a tonic method or an actix-web handler. The framework decodes each request
/// (postcard), runs `call` as a future on the connection's own poller thread, and sends
/// the result back under the request's tag, errors included, where the client's
/// [`call_typed`](crate::runtime::ClientConnection::call_typed) returns them typed.
///
/// # Where the future runs
///
/// On the thread that polls the connection's completions, as a local task next to the
/// connections it serves (that is why it need not be `Send`). It must never block that
/// thread: await instead. An owner actor is asked with `addr.send(msg).await`, slow or
/// blocking work goes to [`RequestCx::spawn_blocking`], a deadline is
/// `actix::clock::sleep`. A future that finishes without waiting for anything (a lookup
/// in a sharded map) is finished in the same turn the request arrived in, as a session
/// callback would: no task is spawned and no wake-up is taken.
///
/// # Limits
///
/// A connection runs at most [`HandlerService::max_in_flight`] calls at once; further
/// requests wait, in order, up to [`HandlerService::max_waiting`] of them and
/// [`HandlerService::max_waiting_bytes`]; past that a request is refused at once with [`Refusal::Busy`], which the client's `call_typed` returns as
/// [`CallError::Refused`]. When the connection closes, its running futures are dropped
/// at their next `.await` and its waiting requests are discarded.
///
/// A message with tag 0 (the client's one-way `send`) is a call whose result nobody
/// wants: it runs, and its result is dropped.
///
/// [`HandlerService::max_in_flight`]: super::HandlerService::max_in_flight
/// [`HandlerService::max_waiting`]: super::HandlerService::max_waiting
/// [`HandlerService::max_waiting_bytes`]: super::HandlerService::max_waiting_bytes
/// [`Refusal::Busy`]: super::Refusal::Busy
/// [`CallError::Refused`]: super::CallError::Refused
///
/// # Example
///
/// A counter every connection shares, kept by an owner actor that each call awaits:
///
/// ```no_run
/// use actix::prelude::*;
/// use rdmactor::prelude::*;
/// use serde::{Deserialize, Serialize};
///
/// /// The shared state: one actor, started with the first call.
/// #[derive(Default)]
/// struct Tally(u64);
/// impl Actor for Tally {
///     type Context = Context<Self>;
/// }
///
/// #[derive(actix::Message)]
/// #[rtype(result = "u64")]
/// struct Add(u64);
///
/// impl Handler<Add> for Tally {
///     type Result = u64;
///     fn handle(&mut self, msg: Add, _: &mut Context<Self>) -> u64 {
///         self.0 += msg.0;
///         self.0
///     }
/// }
///
/// #[derive(Serialize, Deserialize)]
/// struct AddReq { n: u64 }
///
/// #[derive(Serialize, Deserialize, Debug)]
/// enum TallyError { Zero, Gone }
///
/// #[derive(Default)]
/// struct TallyService { owner: Owner<Tally> }
///
/// impl RequestHandler for TallyService {
///     type Req = AddReq;
///     type Resp = u64;
///     type Error = TallyError;
///
///     async fn call(&self, req: AddReq, _cx: &RequestCx) -> Result<u64, TallyError> {
///         if req.n == 0 {
///             return Err(TallyError::Zero); // reaches the client as CallError::Handler
///         }
///         let tally = self.owner.get_or_start(Tally::default);
///         tally.send(Add(req.n)).await.map_err(|_| TallyError::Gone) // the thread never waits
///     }
/// }
///
/// fn main() -> Result<(), ServerError> {
///     // Builds an actix System, serves until SIGINT or SIGTERM, then shuts down.
///     Server::builder()
///         .listen("192.0.2.1:7471".parse().unwrap(), None)
///         .handler("tally", TallyService::default())
///         .run()
/// }
///
/// // The client side, inside an actix System:
/// async fn add(conn: &ClientConnection, n: u64) -> Result<u64, CallError<TallyError>> {
///     conn.call_typed(&AddReq { n }).await
/// }
/// ```
// The futures run on the connection's own thread (spawned locally), so they need not be
// `Send`: the lint's concern, that callers cannot require it, does not apply.
#[allow(async_fn_in_trait)]
pub trait RequestHandler: Send + Sync + 'static {
    /// The request, as the client's `call_typed` encodes it.
    type Req: DeserializeOwned + 'static;
    /// The answer to a request that succeeded.
    type Resp: Serialize + 'static;
    /// The answer to a request that failed: the client gets it as
    /// [`CallError::Handler`](super::CallError::Handler), typed. The connection goes on.
    type Error: Serialize + 'static;

    /// Answers one request. Runs on the connection's poller thread; never block in it.
    async fn call(&self, req: Self::Req, cx: &RequestCx) -> Result<Self::Resp, Self::Error>;
}

/// What one call of a [`RequestHandler`] is handed: who asked, under which tag, and a
/// way to run blocking work without holding up the connection's thread.
#[derive(Debug, Clone)]
pub struct RequestCx {
    pub(super) peer: Arc<PeerInfo>,
    pub(super) tag: u32,
    pub(super) link: Arc<Link>,
    /// Heap the call holds (the bytes its READs returned), counted until the call ends.
    pub(super) holds: Arc<Mutex<Vec<Held>>>,
}

impl RequestCx {
    /// The connection's peer and the service name it connected to.
    pub fn peer(&self) -> &PeerInfo {
        &self.peer
    }

    /// The request's tag; 0 for a one-way message, whose result is dropped.
    pub fn tag(&self) -> u32 {
        self.tag
    }

    /// Runs `f` on the runtime's blocking pool (file I/O, hashing, anything that would
    /// stall the poller thread) and resumes the call with its result. A panic in `f`
    /// comes back as [`BlockingError::Panicked`].
    ///
    /// Bounded as [`SessionCx::spawn_blocking`](crate::runtime::SessionCx::spawn_blocking)
    /// is: a few closures of this connection and of its service run at once, the next
    /// ones wait their turn in order, and past `blocking_queued_per_connection` started
    /// ones this answers [`BlockingError::Busy`] at once. When the connection closes,
    /// the call is dropped, and a closure still waiting for its turn never runs.
    pub async fn spawn_blocking<T, F>(&self, f: F) -> Result<T, BlockingError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let gate = &self.link.blocking;
        let place = gate.start()?;
        let waker = self.link.waker.clone();
        gate.run(place, move || waker.is_connected(), f).await
    }

    /// The server's heap budget, for memory a handler makes because a client asked
    /// (a buffer sized by the request, a copy to send): count it before making it, and
    /// keep the [`Held`] beside it. The framework counts the request itself, and every
    /// [`read`](Self::read) and [`write`](Self::write), already.
    pub fn heap_budget(&self) -> &HeapBudget {
        &self.link.budget
    }

    /// RDMA READs all `src.len` bytes of the client's memory at `src` (an address and
    /// rkey the client sent in its request, from a region it registered with
    /// `Access::REMOTE_READ`; narrow it with [`RemoteRegion::slice`]) and returns them.
    ///
    /// The bytes move in chunks of the pool's largest buffer (1 MiB by default), at most
    /// eight chunks of this connection in flight; the thread never waits. An rkey or a
    /// range the client's NIC refuses completes with a remote access error: the call
    /// gets [`OneSidedError::Failed`] and the connection closes with that reason, since
    /// RDMA leaves its QP in the error state. Other connections are not affected.
    ///
    /// The bytes count against the server's heap budget from before they are allocated
    /// until the call returns: the READ waits its turn for room (up to
    /// [`HandlerService::budget_wait`](super::HandlerService::budget_wait)) and fails
    /// with [`OneSidedError::NoRoom`] past it.
    pub async fn read(&self, src: RemoteRegion) -> Result<Vec<u8>, OneSidedError> {
        let (data, held) = self.link.read(src).await?;
        self.holds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(held);
        Ok(data)
    }

    /// RDMA WRITEs `data` to the client's memory at `dst` (from a region the client
    /// registered with `Access::REMOTE_WRITE`), and returns once the client's NIC has
    /// acknowledged it: the bytes are in the client's memory, ahead of any answer the
    /// call then sends (RC delivers a WRITE before a later SEND). More bytes than
    /// `dst.len` fail with [`OneSidedError::OutsideRegion`] and nothing is posted; the
    /// rest is as for [`read`](Self::read).
    ///
    /// `data` counts against the server's heap budget until the WRITE is done; if the
    /// budget is full it is dropped at once and the call gets [`OneSidedError::NoRoom`]
    /// (bytes that exist already are not held uncounted while they wait).
    pub async fn write(&self, dst: RemoteRegion, data: Vec<u8>) -> Result<(), OneSidedError> {
        self.link.write(dst, data).await
    }

    /// RDMA WRITEs bytes the service keeps anyway (a stored value) to the client's
    /// memory at `dst`, shared rather than copied: nothing new is held, so nothing is
    /// counted against the heap budget, and a flood of calls for the same value costs
    /// no copies. Otherwise as [`write`](Self::write).
    pub async fn write_shared(
        &self,
        dst: RemoteRegion,
        data: std::sync::Arc<[u8]>,
    ) -> Result<(), OneSidedError> {
        self.link.write_shared(dst, data).await
    }
}
