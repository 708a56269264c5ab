//! Step 5, **lambda**: a WebAssembly module is uploaded and run on 1 MiB the server
//! READs from the client; its output must equal the same function in native Rust.

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::{ensure, Result};
use rdmactor::runtime::Client;
use rdmactor::verbs::Access;
use rdmactor_examples::lambdas;
use rdmactor_services::lambda::{self, checksum_native, Invocation, LambdaRef};
use rdmactor_testkit::pattern;

use crate::table::Row;

/// The checksum, once in the sandbox and once native.
pub async fn run(client: &Client, addr: SocketAddr) -> Result<Row> {
    let conn = client.connect(addr, "lambda").await?;
    let module = wat::parse_str(lambdas::CHECKSUM_WAT)?;
    let hash = lambda::upload(&conn, &module).await?;
    let data = pattern(1 << 20, 5);
    let mut input = client.register(data.len(), Access::REMOTE_READ)?;
    input.as_mut_slice().copy_from_slice(&data);
    let output = client.register(4096, Access::REMOTE_WRITE)?;
    let expected = checksum_native(&data);
    let mut runs = 0;
    for lambda in [
        LambdaRef::Module(hash),
        LambdaRef::Native("checksum".into()),
    ] {
        let t = Instant::now();
        let inv = Invocation {
            lambda: lambda.clone(),
            input: input.remote(),
            input_len: data.len() as u64,
            output: output.remote(),
            limits: None,
        };
        let len = lambda::invoke(&conn, &inv).await?;
        let got = &output.as_slice()[..len as usize];
        ensure!(
            got == expected,
            "{lambda:?}: checksum differs from native Rust"
        );
        let kind = match lambda {
            LambdaRef::Module(_) => "WebAssembly sandbox",
            LambdaRef::Native(_) => "native Rust",
        };
        println!(
            "      checksum of 1 MiB in the {kind}: {} in {:.1?}",
            hex(got),
            t.elapsed()
        );
        runs += 1;
    }
    conn.close().await;
    Ok(Row {
        service: "lambda",
        clients: 1,
        operations: "upload .wasm, 2 runs over 1 MiB".into(),
        verified: format!("{runs}/2 equal to native"),
        secs: 0.0,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
