//! Step 7, **identity**: the server's `whoami` takes only `demo-user`'s key. The right
//! key is served and the reply names `demo-user`; an impostor (the same identity, a key
//! of its own) is refused as a bad proof; a client with no key is refused as needing
//! authentication. Each refusal must be the framework's own reason
//! ([`AuthRefusal`]), not merely a failed connect: a refusal for another reason (the
//! connection lost, the service unknown) fails the step.

use std::net::SocketAddr;

use anyhow::{bail, ensure, Context as _, Result};
use rdmactor::runtime::{
    AuthRefusal, CallError, Client, ConnectError, Credential, Identity, NodeConfig,
};

use crate::table::Row;

/// The authenticated-only service of the demo's server.
const SERVICE: &str = "whoami";

/// The three clients against `addr`: `key` (the identity the server knows), an impostor
/// of the same identity, and `anonymous` (a client with no credential: the demo's own).
/// The first two are clients of their own (a credential is a client's, not a
/// connection's), started on `config` and shut down whatever the outcome.
pub async fn run(
    config: &NodeConfig,
    anonymous: &Client,
    addr: SocketAddr,
    key: &Credential,
) -> Result<Row> {
    let name = key.identity();
    let impostor_key = Credential::generate_ed25519(name).context("making the impostor's key")?;
    let holder = Client::start(config.clone())
        .context("starting the key holder's client")?
        .with_identity(key.clone());
    let impostor = match Client::start(config.clone()) {
        Ok(client) => client.with_identity(impostor_key),
        Err(e) => {
            holder.shutdown().await;
            return Err(e).context("starting the impostor's client");
        }
    };
    let verdict = check(&holder, &impostor, anonymous, addr, name).await;
    holder.shutdown().await;
    impostor.shutdown().await;
    verdict?;
    Ok(Row {
        service: "identity",
        clients: 3,
        operations: "right key, impostor, no key".into(),
        verified: "1/1 served, 2/2 refused".into(),
        secs: 0.0,
    })
}

/// The three connects, each checked for what it must do.
async fn check(
    holder: &Client,
    impostor: &Client,
    anonymous: &Client,
    addr: SocketAddr,
    name: &str,
) -> Result<()> {
    // The key the server holds: served, and the service sees who it is.
    let conn = holder
        .connect(addr, SERVICE)
        .await
        .with_context(|| format!("{name}'s own key was not served"))?;
    ensure!(
        conn.identity() == &Identity::Key(name.to_owned()),
        "the server accepted {name}'s key as {}",
        conn.identity()
    );
    let reply: Result<String, CallError<String>> = conn.call_typed(&()).await;
    conn.close().await;
    let reply = reply.context("asking whoami")?;
    ensure!(reply == name, "whoami answered {reply:?}, not {name:?}");
    println!("      {name}'s key: served; whoami answers {reply:?}");

    // The same identity with another key: what a stolen name without the key gets.
    expect_refused(
        impostor.connect(addr, SERVICE).await,
        &AuthRefusal::BadProof,
        &format!("an impostor ({name}, another key)"),
    )?;

    // No credential at all.
    expect_refused(
        anonymous.connect(addr, SERVICE).await,
        &AuthRefusal::NeedsAuthentication,
        "no key",
    )
}

/// Passes when the connect was refused at the door for `want`, and says so.
fn expect_refused<C>(result: Result<C, ConnectError>, want: &AuthRefusal, who: &str) -> Result<()> {
    match result {
        // The client reads the server's reason as text: `AuthRefusal`'s own `Display`.
        Err(ConnectError::Auth(why)) if why == want.to_string() => {
            println!("      {who}: {}", ConnectError::Auth(why));
            Ok(())
        }
        Err(ConnectError::Auth(why)) => {
            bail!("{who}: refused as {why:?}, not as {:?}", want.to_string())
        }
        Err(other) => bail!("{who}: the connect failed, but not at the door: {other}"),
        Ok(_) => bail!("{who}: served by {SERVICE}, which takes only the server's key"),
    }
}
