//! Makes a client's key: writes the private key file (mode 0600, never overwriting one)
//! and prints the line for the server's authorized keys file.
//!
//! ```text
//! keygen --identity alice --out alice.key            # Ed25519
//! keygen --identity jobs --out jobs.key --psk        # a pre-shared key
//! ```
//!
//! The key file's format is documented in `rdmactor::runtime::Credential` and in
//! docs/operations.md ("Who is connecting"). For an Ed25519 key the printed line holds
//! only the public key; for a PSK it holds the secret itself, as the server must: keep
//! that authorized keys file as private as the key.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::Parser;
use rdmactor::runtime::Credential;

#[derive(Parser)]
#[command(about = "rdmactor keygen: a client key file, and its authorized keys line")]
struct Args {
    /// The identity the key proves (1 to 64 letters, digits or ._@-).
    #[arg(long)]
    identity: String,
    /// Where to write the private key file (created with mode 0600; an existing file is
    /// left alone).
    #[arg(long)]
    out: PathBuf,
    /// A pre-shared key instead of an Ed25519 key pair.
    #[arg(long)]
    psk: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let credential = if args.psk {
        Credential::generate_psk(&args.identity)
    } else {
        Credential::generate_ed25519(&args.identity)
    }?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    file.write_all(credential.to_key_file().as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "wrote {}; add this line to the server's authorized keys file:",
        args.out.display()
    );
    println!("{}", credential.authorized_line());
    Ok(())
}
