//! [`FileTransfer`] over RDMA: the `files` service's own verified upload and fetch
//! (`rdmactor-services`), one connection per transfer, SHA-256.

use std::net::SocketAddr;
use std::path::Path;

use rdmactor::runtime::Client;
use rdmactor_services::file_transfer::{
    fetch_file, send_file, FetchOptions, Outcome, Progress, SendOptions,
};

use super::driver::{FileTransfer, FILES_SERVICE};
use super::plan::Verified;

/// Uploads and fetches through an rdmactor client.
#[derive(Clone, Copy)]
pub struct RdmaFiles<'c> {
    client: &'c Client,
}

impl std::fmt::Debug for RdmaFiles<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RdmaFiles")
    }
}

impl<'c> RdmaFiles<'c> {
    /// Transfers through `client`.
    pub fn new(client: &'c Client) -> RdmaFiles<'c> {
        RdmaFiles { client }
    }
}

impl FileTransfer for RdmaFiles<'_> {
    async fn upload(&self, addr: SocketAddr, path: &Path, name: &str) -> Result<Verified, String> {
        let conn = self
            .client
            .connect(addr, FILES_SERVICE)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let mut offered = None;
        let outcome = send_file(&conn, path, name, &SendOptions::default(), |p| {
            if let Progress::Offer(offer) = p {
                offered = Some(Verified {
                    alg: offer.digest.alg.name().to_owned(),
                    digest: offer.digest.to_string(),
                    size: offer.len,
                });
            }
        })
        .await;
        let result = match outcome {
            Ok(Outcome::Delivered { .. }) => offered.ok_or_else(|| "GOOD without an offer".into()),
            other => Err(failure(other)),
        };
        conn.close().await;
        result
    }

    async fn fetch(&self, addr: SocketAddr, name: &str, dir: &Path) -> Result<Verified, String> {
        let conn = self
            .client
            .connect(addr, FILES_SERVICE)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let outcome = fetch_file(
            &conn,
            self.client,
            name,
            dir,
            &FetchOptions::default(),
            |_| {},
        )
        .await;
        let result = match outcome {
            Ok(Outcome::Stored { len, digest, .. }) => Ok(Verified {
                alg: digest.alg.name().to_owned(),
                digest: digest.to_string(),
                size: len,
            }),
            other => Err(failure(other)),
        };
        conn.close().await;
        result
    }
}

/// Why an upload or a fetch that did not end in its success outcome failed.
fn failure(outcome: Result<Outcome, impl std::fmt::Display>) -> String {
    match outcome {
        Ok(Outcome::Bad(why)) => format!("BAD: {why}"),
        Ok(Outcome::Rejected(why)) => format!("rejected: {why}"),
        Ok(Outcome::Aborted(why)) => format!("aborted: {why}"),
        Ok(other) => format!("unexpected outcome {other:?}"),
        Err(e) => e.to_string(),
    }
}
