//! A key-value service written as a [`RequestHandler`]: Put, Get and Delete over typed
//! messages, one map shared by every connection and kept by an owner actor, and a client
//! that drives many connections and checks every answer. The `kv` binary serves it and
//! runs the client; `tests/verbs/kv.rs` runs both in the VM.
//!
//! The file is in three parts, the protocol, the server and the client, so that each
//! can be counted (docs/writing-a-service.md compares them with a hand-written session).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use anyhow::{bail, Context as _};
use rdmactor::prelude::*;
use rdmactor::transport::{Transport, Verbs};
use serde::{Deserialize, Serialize};

// ---- the protocol --------------------------------------------------------------------

/// A request to the `kv` service.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum KvRequest {
    /// Store `value` under `key`.
    Put {
        /// The key.
        key: String,
        /// The value, as one length and a copy on the wire.
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    },
    /// The value under `key`.
    Get {
        /// The key.
        key: String,
    },
    /// Remove `key`.
    Delete {
        /// The key.
        key: String,
    },
    /// Store under `key` the bytes of the client's region `from`, which the server
    /// RDMA READs: a large value never travels in a message.
    PutFrom {
        /// The key.
        key: String,
        /// Where the value is (registered by the client with remote read access).
        from: RemoteRegion,
    },
    /// RDMA WRITE the value under `key` into the client's region `into`.
    GetInto {
        /// The key.
        key: String,
        /// Where the value goes (registered by the client with remote write access).
        into: RemoteRegion,
    },
}

/// What a `ClusterSession` may send again after a lost connection: a put or a get has
/// the same effect twice; a delete does not answer the same (the second finds nothing
/// and fails with `NotFound`), so the caller is told instead.
#[cfg(feature = "cluster")]
impl rdmactor_cluster::Idempotent for KvRequest {
    fn idempotency(&self) -> rdmactor_cluster::Idempotency {
        use rdmactor_cluster::Idempotency::{Idempotent, Once};
        match self {
            KvRequest::Put { .. }
            | KvRequest::Get { .. }
            | KvRequest::PutFrom { .. }
            | KvRequest::GetInto { .. } => Idempotent,
            KvRequest::Delete { .. } => Once,
        }
    }
}

/// The answer to a [`KvRequest`] that succeeded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvResponse {
    /// Put: stored; `replaced` says whether the key had a value.
    Stored {
        /// The key had a value before.
        replaced: bool,
    },
    /// Get: the value.
    Value(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Delete: removed.
    Deleted,
    /// GetInto: this many bytes are in the client's region.
    Written(u64),
}

/// Why a [`KvRequest`] failed; the client gets it typed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum KvError {
    /// Get or Delete of a key that has no value.
    #[error("no such key")]
    NotFound,
    /// A key longer than [`MAX_KEY`].
    #[error("key of {0} bytes is longer than {MAX_KEY}")]
    KeyTooLong(usize),
    /// The store's actor stopped (the server is shutting down).
    #[error("the store is gone")]
    StoreGone,
    /// PutFrom or GetInto could not move the value: the READ or WRITE's reason.
    #[error("moving the value failed: {0}")]
    Transfer(String),
    /// A Put or PutFrom of a value larger than [`KvLimits::max_value`]; nothing read or
    /// stored.
    #[error("value of {len} bytes is larger than the store takes ({max})")]
    ValueTooLarge {
        /// The value's length.
        len: u64,
        /// [`KvLimits::max_value`].
        max: u64,
    },
    /// The Put would take the store past [`KvLimits::max_bytes`] (keys and values of
    /// every client): refused, nothing replaced; it succeeds once others are deleted.
    #[error("the store is full: {used} of {limit} bytes held, the put needs {len} more")]
    StoreFull {
        /// Bytes (key and value) the put would add.
        len: u64,
        /// Bytes held now.
        used: u64,
        /// [`KvLimits::max_bytes`].
        limit: u64,
    },
}

/// The longest key the service takes.
pub const MAX_KEY: usize = 256;

/// How much the store holds (issue 45: it kept every value with no cap, so clients
/// could grow the server's heap until the kernel killed it). Both bounds are checked
/// before a value is stored, and `max_value` before a PutFrom's READ too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLimits {
    /// Bytes of keys and values held at once, over every key.
    pub max_bytes: u64,
    /// The largest value.
    pub max_value: u64,
}

impl KvLimits {
    /// 256 MiB in all: half the server's default heap budget, leaving the rest to
    /// messages and READs in flight.
    pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;
    /// 16 MiB: the largest value a GetInto writes in one request.
    pub const DEFAULT_MAX_VALUE: u64 = 16 << 20;
}

impl Default for KvLimits {
    fn default() -> Self {
        KvLimits {
            max_bytes: KvLimits::DEFAULT_MAX_BYTES,
            max_value: KvLimits::DEFAULT_MAX_VALUE,
        }
    }
}

// ---- the server ----------------------------------------------------------------------

/// The map every connection shares, owned by one actor: its messages are handled one
/// at a time, so no lock is taken and no request sees another half done. Bounded by
/// [`KvLimits`].
#[derive(Default)]
pub struct KvStore {
    /// Values shared, not copied, with the calls that WRITE them (`Share`,
    /// `RequestCx::write_shared`): a flood of `GetInto` costs no copies.
    map: HashMap<String, Arc<[u8]>>,
    /// Bytes of keys and values in `map`.
    used: u64,
    limits: KvLimits,
}

impl KvStore {
    /// An empty store within `limits`.
    pub fn new(limits: KvLimits) -> KvStore {
        KvStore {
            limits,
            ..KvStore::default()
        }
    }

    /// Stores `value` under `key` if the limits allow it.
    fn put(&mut self, key: String, value: Vec<u8>) -> Result<bool, KvError> {
        let size = |k: &str, v: &[u8]| (k.len() as u64).saturating_add(v.len() as u64);
        check_value(value.len() as u64, &self.limits)?;
        let len = size(&key, &value);
        let freed = self.map.get(&key).map_or(0, |old| size(&key, old));
        let after = self.used.saturating_sub(freed).saturating_add(len);
        if after > self.limits.max_bytes {
            return Err(KvError::StoreFull {
                len,
                used: self.used,
                limit: self.limits.max_bytes,
            });
        }
        self.used = after;
        Ok(self.map.insert(key, Arc::from(value)).is_some())
    }

    /// Bytes of keys and values held.
    pub fn used(&self) -> u64 {
        self.used
    }
}

/// Refuses a value larger than `limits.max_value`.
fn check_value(len: u64, limits: &KvLimits) -> Result<(), KvError> {
    if len > limits.max_value {
        return Err(KvError::ValueTooLarge {
            len,
            max: limits.max_value,
        });
    }
    Ok(())
}

impl Actor for KvStore {
    type Context = Context<Self>;
}

/// What the store is asked: the requests, once their bytes are here.
#[derive(actix::Message)]
#[rtype(result = "Result<KvResponse, KvError>")]
pub enum StoreOp {
    /// Insert.
    Put(String, Vec<u8>),
    /// Look up.
    Get(String),
    /// Remove.
    Delete(String),
}

impl Handler<StoreOp> for KvStore {
    type Result = Result<KvResponse, KvError>;

    fn handle(&mut self, op: StoreOp, _: &mut Context<Self>) -> Self::Result {
        match op {
            StoreOp::Put(key, value) => {
                return self
                    .put(key, value)
                    .map(|replaced| KvResponse::Stored { replaced })
            }
            StoreOp::Get(key) => self.map.get(&key).map(|v| KvResponse::Value(v.to_vec())),
            StoreOp::Delete(key) => self.map.remove_entry(&key).map(|(k, v)| {
                let size = (k.len() as u64).saturating_add(v.len() as u64);
                self.used = self.used.saturating_sub(size);
                KvResponse::Deleted
            }),
        }
        .ok_or(KvError::NotFound)
    }
}

/// Asks the store for the value under a key, shared: the answer costs no copy.
#[derive(actix::Message)]
#[rtype(result = "Result<Arc<[u8]>, KvError>")]
pub struct Share(pub String);

impl Handler<Share> for KvStore {
    type Result = Result<Arc<[u8]>, KvError>;

    fn handle(&mut self, Share(key): Share, _: &mut Context<Self>) -> Self::Result {
        self.map.get(&key).cloned().ok_or(KvError::NotFound)
    }
}

/// The `kv` service: checks each request and hands it to the store.
#[derive(Default)]
pub struct Kv {
    store: Owner<KvStore>,
    limits: KvLimits,
}

impl Kv {
    /// The service with its store bounded by `limits` (`Kv::default()` has
    /// [`KvLimits::default`]).
    pub fn with_limits(limits: KvLimits) -> Kv {
        Kv {
            store: Owner::default(),
            limits,
        }
    }
}

impl RequestHandler for Kv {
    type Req = KvRequest;
    type Resp = KvResponse;
    type Error = KvError;

    async fn call(&self, req: KvRequest, cx: &RequestCx) -> Result<KvResponse, KvError> {
        let (KvRequest::Put { key, .. }
        | KvRequest::Get { key }
        | KvRequest::Delete { key }
        | KvRequest::PutFrom { key, .. }
        | KvRequest::GetInto { key, .. }) = &req;
        if key.len() > MAX_KEY {
            return Err(KvError::KeyTooLong(key.len()));
        }
        let limits = self.limits;
        // Its own thread: asked on every request, it must not wait for turns on a poller
        // thread busy with the connections it polls (issue 45).
        let store = &self
            .store
            .get_or_start_dedicated(move || KvStore::new(limits));
        let moved = |e: OneSidedError| KvError::Transfer(e.to_string());
        match req {
            KvRequest::Put { key, value } => ask(store, StoreOp::Put(key, value)).await,
            KvRequest::Get { key } => ask(store, StoreOp::Get(key)).await,
            KvRequest::Delete { key } => ask(store, StoreOp::Delete(key)).await,
            KvRequest::PutFrom { key, from } => {
                // Refused before the READ: the value would be held in the heap first.
                check_value(from.len, &self.limits)?;
                let value = cx.read(from).await.map_err(moved)?;
                ask(store, StoreOp::Put(key, value)).await
            }
            KvRequest::GetInto { key, into } => {
                let value = store
                    .send(Share(key))
                    .await
                    .map_err(|_| KvError::StoreGone)??;
                let len = value.len() as u64;
                // Shared, not copied: 32 connections x 64 GetInto of a 16 MiB value once
                // made `kv serve` hold a copy for each, until the OOM killer ended it
                // (issue 45).
                cx.write_shared(into, value).await.map_err(moved)?;
                Ok(KvResponse::Written(len))
            }
        }
    }
}

/// Asks the store; the thread goes on serving while it answers.
async fn ask(store: &Addr<KvStore>, op: StoreOp) -> Result<KvResponse, KvError> {
    store.send(op).await.map_err(|_| KvError::StoreGone)?
}

// ---- the client ----------------------------------------------------------------------

/// A connection to the `kv` service, with one typed method per request (over verbs, or
/// any other transport, as the native tests' loopback).
pub struct KvClient<T: Transport = Verbs>(pub ClientConnection<T>);

impl<T: Transport> KvClient<T> {
    /// Stores `value` under `key`; true if it replaced a value.
    pub async fn put(&self, key: &str, value: Vec<u8>) -> Result<bool, CallError<KvError>> {
        let key = key.to_owned();
        match self.0.call_typed(&KvRequest::Put { key, value }).await? {
            KvResponse::Stored { replaced } => Ok(replaced),
            other => Err(unexpected(other)),
        }
    }

    /// The value under `key`.
    pub async fn get(&self, key: &str) -> Result<Vec<u8>, CallError<KvError>> {
        match self
            .0
            .call_typed(&KvRequest::Get {
                key: key.to_owned(),
            })
            .await?
        {
            KvResponse::Value(value) => Ok(value),
            other => Err(unexpected(other)),
        }
    }

    /// Stores under `key` the bytes of `from`, a region of this client's registered with
    /// remote read access, which the server READs; true if it replaced a value.
    pub async fn put_from(
        &self,
        key: &str,
        from: RemoteRegion,
    ) -> Result<bool, CallError<KvError>> {
        let key = key.to_owned();
        match self.0.call_typed(&KvRequest::PutFrom { key, from }).await? {
            KvResponse::Stored { replaced } => Ok(replaced),
            other => Err(unexpected(other)),
        }
    }

    /// Has the server WRITE the value under `key` into `into`, a region of this
    /// client's registered with remote write access; returns the value's length.
    pub async fn get_into(&self, key: &str, into: RemoteRegion) -> Result<u64, CallError<KvError>> {
        let key = key.to_owned();
        match self.0.call_typed(&KvRequest::GetInto { key, into }).await? {
            KvResponse::Written(len) => Ok(len),
            other => Err(unexpected(other)),
        }
    }

    /// Removes `key`.
    pub async fn delete(&self, key: &str) -> Result<(), CallError<KvError>> {
        match self
            .0
            .call_typed(&KvRequest::Delete {
                key: key.to_owned(),
            })
            .await?
        {
            KvResponse::Deleted => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

/// The key of the value the memory adversary tests (issue 45) flood with `GetInto`.
pub const FLOOD_KEY: &str = "big";
/// That value's length: the largest a `GetInto` writes (its encoding is more than one
/// message may carry, so it is put by the server's READ of the client's memory).
pub const FLOOD_LEN: usize = 16 << 20;

/// Stocks a `kv` server for the memory adversary tests through `conn`, a connection of
/// `node`: [`FLOOD_LEN`] bytes under [`FLOOD_KEY`] (put from `node`'s memory), and
/// `"small"` holding `ok`, what the polite client asks for.
pub async fn stock_flood<T: Transport>(node: &Client<T>, conn: &KvClient<T>) {
    use rdmactor::transport::Region as _;
    let mut src = node
        .register(FLOOD_LEN, Access::REMOTE_READ)
        .expect("register");
    src.write(0, &rdmactor_testkit::pattern(FLOOD_LEN, 45))
        .expect("fill");
    conn.put_from(FLOOD_KEY, src.remote())
        .await
        .expect("put 16 MiB");
    drop(src);
    conn.put("small", b"ok".to_vec()).await.expect("put small");
}

/// How a hostile client's `GetInto` calls ended: written whole, refused for want of
/// room (the server's heap budget), or refused busy or overloaded.
pub type FloodTally = std::cell::RefCell<[u64; 3]>;

/// One hostile stream of the memory adversary tests (issue 45): `GetInto` of `key`
/// (`len` bytes) into `into`, again and again until `until`, each outcome counted in
/// `tally`. Any other answer is a failure of the test.
pub async fn get_into_until<T: Transport>(
    conn: &KvClient<T>,
    key: &str,
    len: u64,
    into: RemoteRegion,
    until: Instant,
    tally: &FloodTally,
) {
    while Instant::now() < until {
        let slot = match conn.get_into(key, into).await {
            Ok(n) => {
                assert_eq!(n, len, "a GetInto wrote {n} bytes");
                0
            }
            Err(CallError::Handler(KvError::Transfer(why))) if why.contains("no room") => 1,
            Err(CallError::Refused(
                rdmactor::runtime::Refusal::Busy { .. } | rdmactor::runtime::Refusal::Overloaded(_),
            )) => 2,
            Err(other) => panic!("a hostile GetInto answered {other}"),
        };
        tally.borrow_mut()[slot] += 1;
    }
}

/// The memory adversary tests' flood: `calls` [`get_into_until`] streams of
/// [`FLOOD_KEY`] on each connection of `hostile`, all writing into `into` until `until`,
/// spawned on the current System. Returns the tally they share and their handles; the
/// caller keeps `into`'s registration alive while they run.
pub fn spawn_flood<T: Transport>(
    hostile: &[std::rc::Rc<KvClient<T>>],
    calls: usize,
    into: RemoteRegion,
    until: Instant,
) -> (std::rc::Rc<FloodTally>, Vec<tokio::task::JoinHandle<()>>) {
    let tally = std::rc::Rc::new(FloodTally::new([0; 3]));
    let mut tasks = Vec::new();
    for conn in hostile {
        for _ in 0..calls {
            let (conn, tally) = (std::rc::Rc::clone(conn), std::rc::Rc::clone(&tally));
            tasks.push(actix::spawn(async move {
                get_into_until(&conn, FLOOD_KEY, FLOOD_LEN as u64, into, until, &tally).await;
            }));
        }
    }
    (tally, tasks)
}

fn unexpected(answer: KvResponse) -> CallError<KvError> {
    CallError::BadAnswer(format!("the answer to another request: {answer:?}"))
}

/// `connections` connections to `addr`, each making `requests` requests on keys of its
/// own (puts, gets of what it put, deletes, gets of what it deleted), checking every
/// answer. Returns the round trip of each answer checked; the first wrong one is an
/// error.
pub async fn run_clients<T: Transport>(
    client: &Client<T>,
    addr: SocketAddr,
    connections: usize,
    requests: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut conns = Vec::with_capacity(connections);
    for c in 0..connections {
        let conn = client
            .connect(addr, "kv")
            .await
            .with_context(|| format!("connect {c}"))?;
        conns.push(KvClient(conn));
    }
    let runs = conns
        .iter()
        .enumerate()
        .map(|(c, kv)| one_connection(kv, c, requests));
    let checked = futures::future::try_join_all(runs).await?.concat();
    for kv in conns {
        kv.0.close().await;
    }
    Ok(checked)
}

/// Request `i` of connection `c`, in rounds of four on key `c/i/4`: put, get, delete, get
/// (which must find nothing). The value is the byte pattern of (c, i).
async fn one_connection<T: Transport>(
    kv: &KvClient<T>,
    c: usize,
    requests: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut round_trips = Vec::with_capacity(requests);
    for i in 0..requests {
        let sent = Instant::now();
        let key = format!("{c}/{}", i / 4);
        let value = rdmactor_testkit::pattern(16 + (i / 4) % 200, (c * requests + i / 4) as u64);
        let fail = |what: String| anyhow::anyhow!("connection {c}, request {i} ({key}): {what}");
        match i % 4 {
            0 => match kv.put(&key, value).await {
                Ok(false) => {}
                other => bail!(fail(format!("put answered {other:?}"))),
            },
            1 => match kv.get(&key).await {
                Ok(got) if got == value => {}
                other => bail!(fail(format!("get answered {other:?}, not the value put"))),
            },
            2 => kv
                .delete(&key)
                .await
                .map_err(|e| fail(format!("delete: {e}")))?,
            _ => match kv.get(&key).await {
                Err(CallError::Handler(KvError::NotFound)) => {}
                other => bail!(fail(format!("get after delete answered {other:?}"))),
            },
        }
        round_trips.push(sent.elapsed());
    }
    Ok(round_trips)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> KvLimits {
        KvLimits {
            max_bytes: 100,
            max_value: 60,
        }
    }

    /// Issue 45: Puts past the store's bound are refused with the typed error, nothing
    /// replaced, and the store goes on; a replaced or deleted value gives its bytes back.
    #[test]
    fn puts_past_the_bound_are_refused_and_the_store_goes_on() {
        let mut store = KvStore::new(limits());
        assert_eq!(store.put("a".into(), vec![0; 49]), Ok(false));
        assert_eq!(store.used(), 50);
        assert_eq!(
            store.put("b".into(), vec![0; 61]),
            Err(KvError::ValueTooLarge { len: 61, max: 60 })
        );
        assert_eq!(store.put("b".into(), vec![0; 49]), Ok(false));
        assert_eq!(
            store.put("c".into(), vec![0; 1]),
            Err(KvError::StoreFull {
                len: 2,
                used: 100,
                limit: 100
            })
        );
        assert_eq!(store.used(), 100, "nothing counted for the refused put");
        // Replacing a value counts the new one instead of the old.
        assert_eq!(store.put("a".into(), vec![1; 9]), Ok(true));
        assert_eq!(store.used(), 60);
        assert_eq!(store.put("c".into(), vec![0; 20]), Ok(false));
        assert_eq!(store.used(), 81);
    }

    #[test]
    fn a_delete_through_the_actor_makes_room() {
        actix::System::new().block_on(async {
            let store = KvStore::new(limits()).start();
            let put = |k: &str, n: usize| store.send(StoreOp::Put(k.into(), vec![0; n]));
            put("a", 59).await.unwrap().expect("fits");
            assert!(matches!(
                put("b", 59).await.unwrap(),
                Err(KvError::StoreFull { .. })
            ));
            store
                .send(StoreOp::Delete("a".into()))
                .await
                .unwrap()
                .expect("deleted");
            put("b", 59).await.unwrap().expect("room again");
        });
    }
}
