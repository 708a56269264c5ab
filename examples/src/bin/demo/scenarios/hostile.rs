//! Step 6, **hostile**: a client asks to store `../escape`, one uses another
//! connection's rkey, one names a service that does not exist: each is refused with its
//! reason, and the connection that owns the rkey keeps reading.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{bail, ensure, Context as _, Result};
use rdmactor::runtime::{Client, ConnectError};
use rdmactor_services::file_transfer::{hash_bytes, FileOffer, HashAlg, Msg};
use rdmactor_services::read;

use crate::table::Row;

/// The three refusals; `store` is the server's store when it is ours.
pub async fn run(client: &Client, addr: SocketAddr, store: Option<&Path>) -> Result<Row> {
    let mut refused = 0;

    // A path trick: the name must stay inside the store. `send_file` would refuse such a
    // name itself, so this client writes the offer on the wire by hand.
    let conn = client.connect(addr, "files").await?;
    let offer = Msg::Offer(FileOffer {
        name: "../escape".into(),
        len: 9,
        digest: hash_bytes(HashAlg::Sha256, b"not yours"),
        overwrite: true,
    });
    conn.send(offer.encode()).await?;
    let answer = conn
        .recv()
        .await
        .context("the connection closed without an answer")?;
    match Msg::decode(&answer.data)? {
        Msg::Reject { reason } => {
            println!("      offer to store `../escape`: refused: {reason}");
            refused += 1;
        }
        other => bail!("an offer to store `../escape` was answered {other:?}"),
    }
    // (A remote server's store is checked on its host.)
    if let Some(store) = store {
        ensure!(
            !store.with_file_name("escape").exists(),
            "a file escaped the store"
        );
    }
    conn.close().await;

    // An rkey that belongs to another connection: a remote access error ends only the
    // prober's connection; the owner reads on.
    let owner = client.connect(addr, "read").await?;
    let prober = client.connect(addr, "read").await?;
    let theirs = read::lookup(&owner, "live").await?;
    match read::read(&prober, &theirs, 0, 8).await {
        Err(e) if e.is_remote_access_error() => {
            println!("      READ with another connection's rkey: {e}");
            refused += 1;
        }
        other => bail!("a foreign rkey was honoured: {other:?}"),
    }
    read::read_consistent(&owner, &theirs, 0, 8)
        .await
        .context("the rkey's owner can no longer read")?;
    println!("      the rkey's owner still reads");
    owner.close().await;
    prober.close().await;

    // A service that does not exist: rejected at connect time, with the reason.
    match client.connect(addr, "no-such-service").await {
        Err(ConnectError::Rejected(reject)) => {
            println!("      connect to `no-such-service`: {reject}");
            refused += 1;
        }
        Err(e) => bail!("connect to an unknown service failed without a reason: {e}"),
        Ok(_) => bail!("an unknown service was accepted"),
    }
    Ok(Row {
        service: "hostile",
        clients: 4,
        operations: "path trick, foreign rkey, bad service".into(),
        verified: format!("{refused}/3 refused, owner ok"),
        secs: 0.0,
    })
}
