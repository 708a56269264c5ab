//! One connection as the library drives it, whatever the transport: the framework's
//! `ClientConnection<T>` and the services' clients behind one object-safe trait, so
//! that the handle tables and the C entry points are not generic (the cdylib runs on
//! verbs; the crate's own tests run the same code over loopback).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, LocalBoxFuture};
use futures::FutureExt as _;
use rdmactor::runtime::{Client, ClientConnection};
use rdmactor::transport::Transport;
use rdmactor_services::file_transfer::{
    fetch_file, send_file, Digest, FetchOptions, Outcome, Progress, SendOptions,
};
use rdmactor_services::read::{self, RegionHandle};

use crate::status::{Failure, Result};

/// How a transfer ended, when it reached a verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub verdict: Verdict,
    /// File bytes (the offer's length).
    pub bytes: u64,
    /// The SHA-256 of the file, when the transfer got as far as an offer.
    pub digest: Option<Digest>,
    /// Why, for anything but GOOD.
    pub reason: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Good,
    Bad,
    Rejected,
    Aborted,
}

/// What C can do with a connection. Futures are `'static` (they hold a clone of the
/// connection), so they can be driven on the caller's thread or the runtime's.
pub trait Link: Send + Sync + 'static {
    fn request(&self, data: Vec<u8>) -> BoxFuture<'static, Result<Vec<u8>>>;
    fn send(&self, data: Vec<u8>) -> BoxFuture<'static, Result<()>>;
    /// The region `name` from `offset` to its end, consistent (one version), and that
    /// version; `Err(BUFFER_TOO_SMALL)` with the length when it is more than `cap`.
    fn read(
        &self,
        name: String,
        offset: u64,
        cap: usize,
    ) -> BoxFuture<'static, Result<(Vec<u8>, u64), ReadFailure>>;
    /// Runs on the runtime thread (the files client spawns threads and timers).
    fn send_file(
        &self,
        path: PathBuf,
        name: String,
        overwrite: bool,
    ) -> LocalBoxFuture<'static, Result<Transfer>>;
    fn fetch_file(
        &self,
        name: String,
        dir: PathBuf,
        overwrite: bool,
    ) -> LocalBoxFuture<'static, Result<Transfer>>;
    /// Closes and waits for the release; every clone of the connection is closed.
    fn close(&self) -> BoxFuture<'static, ()>;
}

/// A read that failed, or found the caller's buffer too small (`needed` bytes).
#[derive(Debug)]
pub enum ReadFailure {
    TooSmall { needed: usize },
    Failed(Failure),
}

impl From<Failure> for ReadFailure {
    fn from(f: Failure) -> ReadFailure {
        ReadFailure::Failed(f)
    }
}

/// The framework's connection, and the client that made it (the files client
/// registers a download's window through it).
pub struct Conn<T: Transport> {
    pub conn: ClientConnection<T>,
    pub client: Arc<Client<T>>,
    /// Regions looked up on this connection: a lookup grants a window bound to it, so
    /// one per name is enough, and each read after is READs only.
    regions: Arc<Mutex<HashMap<String, RegionHandle>>>,
}

impl<T: Transport> Conn<T> {
    pub fn new(conn: ClientConnection<T>, client: Arc<Client<T>>) -> Conn<T> {
        Conn {
            conn,
            client,
            regions: Arc::default(),
        }
    }
}

impl<T: Transport> Link for Conn<T> {
    fn request(&self, data: Vec<u8>) -> BoxFuture<'static, Result<Vec<u8>>> {
        let conn = self.conn.clone();
        async move { Ok(conn.request(data).await?) }.boxed()
    }

    fn send(&self, data: Vec<u8>) -> BoxFuture<'static, Result<()>> {
        let conn = self.conn.clone();
        async move { Ok(conn.send(data).await?) }.boxed()
    }

    fn read(
        &self,
        name: String,
        offset: u64,
        cap: usize,
    ) -> BoxFuture<'static, Result<(Vec<u8>, u64), ReadFailure>> {
        let conn = self.conn.clone();
        let regions = self.regions.clone();
        async move {
            let known = regions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&name)
                .cloned();
            let handle = match known {
                Some(h) => h,
                None => {
                    let h = read::lookup(&conn, &name).await.map_err(Failure::from)?;
                    let mut regions = regions.lock().unwrap_or_else(|p| p.into_inner());
                    regions.insert(name.clone(), h.clone());
                    h
                }
            };
            let rest = handle.len().checked_sub(offset).ok_or_else(|| {
                Failure::invalid(format!(
                    "offset {offset} is past the end of region {name:?} ({} bytes)",
                    handle.len()
                ))
            })?;
            let needed = usize::try_from(rest)
                .map_err(|_| Failure::invalid("the region is larger than this address space"))?;
            if needed > cap {
                return Err(ReadFailure::TooSmall { needed });
            }
            let (data, version) = read::read_consistent(&conn, &handle, offset, needed)
                .await
                .map_err(Failure::from)?;
            Ok((data, version))
        }
        .boxed()
    }

    fn send_file(
        &self,
        path: PathBuf,
        name: String,
        overwrite: bool,
    ) -> LocalBoxFuture<'static, Result<Transfer>> {
        let conn = self.conn.clone();
        async move {
            let opts = SendOptions {
                overwrite,
                ..SendOptions::default()
            };
            let mut offered = None;
            let outcome = send_file(&conn, &path, &name, &opts, |p| {
                if let Progress::Offer(offer) = p {
                    offered = Some((offer.len, offer.digest));
                }
            })
            .await?;
            Ok(transfer(outcome, offered))
        }
        .boxed_local()
    }

    fn fetch_file(
        &self,
        name: String,
        dir: PathBuf,
        overwrite: bool,
    ) -> LocalBoxFuture<'static, Result<Transfer>> {
        let conn = self.conn.clone();
        let client = self.client.clone();
        async move {
            let opts = FetchOptions {
                overwrite,
                ..FetchOptions::default()
            };
            let mut offered = None;
            let outcome = fetch_file(&conn, &client, &name, &dir, &opts, |p| {
                if let Progress::Offer(offer) = p {
                    offered = Some((offer.len, offer.digest));
                }
            })
            .await?;
            Ok(transfer(outcome, offered))
        }
        .boxed_local()
    }

    fn close(&self) -> BoxFuture<'static, ()> {
        self.conn.clone().close().boxed()
    }
}

/// The verdict C sees: the service's answer, not an error of the call. `offered` is
/// the length and digest of the file's offer, if the transfer got that far.
fn transfer(outcome: Outcome, offered: Option<(u64, Digest)>) -> Transfer {
    let (bytes, offered) = offered.map_or((0, None), |(len, d)| (len, Some(d)));
    let (verdict, reason, digest) = match outcome {
        Outcome::Delivered { .. } => (Verdict::Good, String::new(), offered),
        Outcome::Stored { digest, len, .. } => {
            return Transfer {
                verdict: Verdict::Good,
                bytes: len,
                digest: Some(digest),
                reason: String::new(),
            }
        }
        Outcome::Bad(why) => (Verdict::Bad, why.to_string(), offered),
        Outcome::Rejected(why) => (Verdict::Rejected, why.to_string(), offered),
        Outcome::Aborted(why) => (Verdict::Aborted, why.to_string(), offered),
        other => (
            Verdict::Aborted,
            format!("not a transfer's answer: {other:?}"),
            offered,
        ),
    };
    Transfer {
        verdict,
        bytes,
        digest,
        reason,
    }
}
