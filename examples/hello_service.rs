//! Hello, anywhere: a service with state shared by every connection, and a client.
//!
//! `cargo run --example hello_service` runs both in this process over the in-memory
//! loopback transport, on any Linux machine. `--verbs ADDR` runs the same code on RDMA
//! verbs (in the project's VM: `scripts/softroce target/debug/examples/hello_service
//! --verbs 192.0.2.1:7471`).

use std::collections::HashMap;
use std::error::Error;
use std::net::SocketAddr;
use std::sync::Mutex;

use rdmactor::prelude::*;
use rdmactor::transport::{loopback::Loopback, Transport, Verbs};

/// Greets a name and counts its visits, across every connection of the server.
#[derive(Default)]
struct Hello {
    visits: Mutex<HashMap<String, u64>>,
}

impl RequestHandler for Hello {
    type Req = String;
    type Resp = String;
    type Error = String;
    async fn call(&self, name: String, _cx: &RequestCx) -> Result<String, String> {
        if name.is_empty() {
            return Err("no name given".into()); // reaches the client as CallError::Handler
        }
        let mut visits = self
            .visits
            .lock()
            .expect("never poisoned: nothing panics under it");
        let n = visits.entry(name.clone()).or_default();
        *n += 1;
        Ok(format!("hello, {name} (visit {n})"))
    }
}

/// Serves `hello` on `addr` over `transport` and calls it from four connections.
async fn run<T: Transport + Copy>(transport: T, addr: SocketAddr) -> Result<(), Box<dyn Error>> {
    let server = Server::over(transport)
        .listen(addr, None)
        .handler("hello", Hello::default())
        .start()?;
    let client = Client::over(transport, NodeConfig::default())?;
    for name in ["ada", "grace", "ada", ""] {
        let conn = client.connect(server.local_addrs()[0], "hello").await?;
        match conn
            .call_typed::<String, String, String>(&name.into())
            .await
        {
            Ok(greeting) => println!("{greeting}"),
            Err(CallError::Handler(why)) => println!("refused: {why}"),
            Err(other) => return Err(other.into()),
        }
        conn.close().await;
    }
    client.shutdown().await;
    server.shutdown().await;
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    actix::System::new().block_on(async {
        match args.as_slice() {
            [] => run(Loopback, "10.0.0.1:7471".parse()?).await,
            [flag, addr] if flag == "--verbs" => run(Verbs, addr.parse()?).await,
            _ => Err("usage: hello_service [--verbs ADDR:PORT]".into()),
        }
    })
}
