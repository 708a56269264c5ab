//! [`FileTransfer`] over RDMA: the `files` service's own verified upload, fetch and
//! stat (`rdmactor-services`), one connection per transfer, SHA-256.

use std::net::SocketAddr;
use std::path::Path;

use rdmactor::runtime::{Client, ClientConnection};
use rdmactor_services::file_transfer::{
    delete_file, fetch_file, send_file, stat_file, Digest, FetchOptions, HashAlg, Outcome,
    Progress, RejectReason, SendOptions,
};

use super::driver::FILES_SERVICE;
use super::plan::Verified;
use super::transfer::{FileTransfer, TransferError, Upload};

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

    async fn connect(&self, addr: SocketAddr) -> Result<ClientConnection, TransferError> {
        self.client
            .connect(addr, FILES_SERVICE)
            .await
            .map_err(|e| TransferError::Failed(format!("connect: {e}")))
    }
}

impl FileTransfer for RdmaFiles<'_> {
    async fn upload(
        &self,
        addr: SocketAddr,
        path: &Path,
        name: &str,
        how: Upload<'_>,
    ) -> Result<Verified, TransferError> {
        let conn = self.connect(addr).await?;
        let mut offered = None;
        let opts = SendOptions {
            copy_for: how.copy_for.map(str::to_owned),
            overwrite: how.overwrite,
            ..SendOptions::default()
        };
        let outcome = send_file(&conn, path, name, &opts, |p| {
            if let Progress::Offer(offer) = p {
                offered = Some(verified(offer.len, &offer.digest));
            }
        })
        .await;
        let result = match outcome {
            Ok(Outcome::Delivered { .. }) => {
                offered.ok_or_else(|| TransferError::Failed("GOOD without an offer".into()))
            }
            other => Err(failure(other)),
        };
        conn.close().await;
        result
    }

    /// The fetch's receiver refuses an offer above `max_size` on the offer itself
    /// (`Reject{TooLarge}`), before a window is granted.
    async fn fetch(
        &self,
        addr: SocketAddr,
        name: &str,
        dir: &Path,
        max_size: u64,
        copy_for: Option<&str>,
    ) -> Result<Verified, TransferError> {
        let conn = self.connect(addr).await?;
        let opts = FetchOptions {
            max_size,
            copy_for: copy_for.map(str::to_owned),
            ..FetchOptions::default()
        };
        let outcome = fetch_file(&conn, self.client, name, dir, &opts, |_| {}).await;
        let result = match outcome {
            Ok(Outcome::Stored { len, digest, .. }) => Ok(verified(len, &digest)),
            other => Err(failure(other)),
        };
        conn.close().await;
        result
    }

    async fn delete(&self, addr: SocketAddr, name: &str) -> Result<(), TransferError> {
        let conn = self.connect(addr).await?;
        let outcome = delete_file(&conn, name).await;
        let result = match outcome {
            Ok(Outcome::Deleted) => Ok(()),
            other => Err(failure(other)),
        };
        conn.close().await;
        result
    }

    async fn stat(&self, addr: SocketAddr, name: &str) -> Result<Verified, TransferError> {
        let conn = self.connect(addr).await?;
        let outcome = stat_file(&conn, name, HashAlg::Sha256).await;
        let result = match outcome {
            Ok(Outcome::Held { len, digest }) => Ok(verified(len, &digest)),
            other => Err(failure(other)),
        };
        conn.close().await;
        result
    }

    /// One connection for all of `names`: the service answers one question after
    /// another on it. A question that ends the connection (an error, not a refusal such
    /// as `NotFound`) gets its answer, and the next one a new connection; a connect that
    /// fails answers every name left with its error.
    async fn stat_many(
        &self,
        addr: SocketAddr,
        names: &[String],
    ) -> Vec<Result<Verified, TransferError>> {
        let mut answers = Vec::with_capacity(names.len());
        let mut conn: Option<ClientConnection> = None;
        for name in names {
            let open = match conn.take() {
                Some(open) => open,
                None => match self.connect(addr).await {
                    Ok(open) => open,
                    // A node that cannot be reached now answers none of the rest either:
                    // no connect per remaining name, each waiting out the dial.
                    Err(e) => {
                        let why = e.to_string();
                        answers.push(Err(e));
                        while answers.len() < names.len() {
                            answers.push(Err(TransferError::Failed(why.clone())));
                        }
                        break;
                    }
                },
            };
            match stat_file(&open, name, HashAlg::Sha256).await {
                Ok(Outcome::Held { len, digest }) => {
                    answers.push(Ok(verified(len, &digest)));
                    conn = Some(open);
                }
                Ok(refused @ Outcome::Rejected(_)) => {
                    answers.push(Err(failure(Ok::<_, String>(refused))));
                    conn = Some(open);
                }
                // `stat_file` closed it (see `finish`).
                other => answers.push(Err(failure(other))),
            }
        }
        if let Some(open) = conn {
            open.close().await;
        }
        answers
    }
}

fn verified(len: u64, digest: &Digest) -> Verified {
    Verified {
        alg: digest.alg.name().to_owned(),
        digest: digest.to_string(),
        size: len,
    }
}

/// Why an upload, fetch or stat that did not end in its success outcome failed; the
/// refusals the cluster's rules act on keep their type.
fn failure(outcome: Result<Outcome, impl std::fmt::Display>) -> TransferError {
    match outcome {
        Ok(Outcome::Rejected(RejectReason::Exists)) => TransferError::Exists,
        Ok(Outcome::Rejected(RejectReason::NotFound)) => TransferError::NotFound,
        Ok(Outcome::Rejected(RejectReason::TooLarge { max })) => TransferError::TooLarge { max },
        Ok(Outcome::Bad(why)) => TransferError::Failed(format!("BAD: {why}")),
        Ok(Outcome::Rejected(why)) => TransferError::Failed(format!("rejected: {why}")),
        Ok(Outcome::Aborted(why)) => TransferError::Failed(format!("aborted: {why}")),
        Ok(other) => TransferError::Failed(format!("unexpected outcome {other:?}")),
        Err(e) => TransferError::Failed(e.to_string()),
    }
}
