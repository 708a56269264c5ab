//! What authentication costs (issue 46): connection setup and the echo round trip of a
//! client proving an Ed25519 key or a pre-shared key to a server with authorized keys,
//! each beside an anonymous client of a server without keys (its floor), measured in
//! the same repetition, the three clients taking turns.
//!
//! A proof adds one message and a signature (or an HMAC) to each connect; once proved,
//! a connection's messages take the same path as an anonymous one's, so the round trip
//! should not move.

use std::time::Duration;

use anyhow::{Context as _, Result};
use rdmactor::runtime::{Client, Credential, KeySet};
use rdmactor::transport::loopback::{Fabric, Loopback};

use super::stats::{quantile_us, Figure, Report};
use super::{bulk, config, host::Host, latency, listen_addr, setup, Plan};

/// Connects in flight at once: below the 64 an address may have proving at once (its
/// bucket's tokens, given back by each good proof), so none is throttled.
const AT_ONCE: usize = 50;

/// Measures the group and adds its figures to `report`.
pub async fn run(fabric: &Fabric, plan: &Plan, req: &[u8], report: &mut Report) -> Result<()> {
    let ed25519 = Credential::generate_ed25519("bench-ed25519")?;
    let psk = Credential::generate_psk("bench-psk")?;
    let keys = KeySet::parse(&format!(
        "{}\n{}\n",
        ed25519.authorized_line(),
        psk.authorized_line()
    ))
    .context("the bench's authorized keys")?;
    let open = Host::start(fabric, "auth-open", listen_addr(4), config())?;
    let keyed = Host::start_keyed(fabric, "auth-keyed", listen_addr(5), config(), Some(keys))?;
    let anonymous = Client::<Loopback>::on(fabric.device("auth-anonymous"), config())?;
    let proving_ed25519 =
        Client::<Loopback>::on(fabric.device("auth-ed25519"), config())?.with_identity(ed25519);
    let proving_psk =
        Client::<Loopback>::on(fabric.device("auth-psk"), config())?.with_identity(psk);
    let turns = [
        (&anonymous, open.addr),
        (&proving_ed25519, keyed.addr),
        (&proving_psk, keyed.addr),
    ];
    let (rounds, limit) = plan.latency_budget();
    let (mut setups, mut p50s) = ([vec![], vec![], vec![]], [vec![], vec![], vec![]]);
    for _ in 0..plan.reps {
        for (i, &(client, addr)) in turns.iter().enumerate() {
            let (conns, rate) = setup::connect_at_once(client, addr, AT_ONCE).await?;
            setups[i].push(rate);
            setup::close_all(conns).await;
            bulk::settle(Duration::from_millis(200)).await;
            let h = latency::session(client, addr, req, rounds, limit).await?;
            p50s[i].push(quantile_us(&h, 0.5));
        }
    }
    let [open_setup, ed_setup, psk_setup] = setups;
    let [open_p50, ed_p50, psk_p50] = p50s;
    for (kind, setup, p50) in [("ed25519", ed_setup, ed_p50), ("psk", psk_setup, psk_p50)] {
        report.add(
            Figure::new(
                &format!("auth_setup_conn_per_s_{kind}"),
                "conn/s",
                setup,
                format!(
                    "{AT_ONCE} connects to echo at once, each proving a {kind} key; floor: the \
                     same, anonymous, to a server without keys (taking turns)"
                ),
            )
            .with_floor(open_setup.clone()),
        );
        report.add(
            Figure::new(
                &format!("auth_echo_rtt_p50_us_{kind}"),
                "us",
                p50,
                format!(
                    "64 B echo round trip, client-side session, once proved with a {kind} \
                     key; floor: the same, anonymous, to a server without keys (taking turns)"
                ),
            )
            .with_floor(open_p50.clone()),
        );
    }
    for client in [anonymous, proving_ed25519, proving_psk] {
        client.shutdown().await;
    }
    keyed.stop();
    open.stop();
    Ok(())
}
