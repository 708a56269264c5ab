//! The `ingest` service: clients push records with RDMA WRITE_WITH_IMM into a ring of
//! slots the server granted them; the server checks and hands each record to the
//! application, and returns slots with credit messages.
//!
//! # Protocol
//!
//! ```text
//! client                                         server
//!   Open  ───────────────────────────────────►     registers S x L bytes, REMOTE_WRITE only
//!         ◄─────────────────────── Ring{remote, S, L}   (every slot granted)
//!   WRITE_WITH_IMM(slot k, record‖checksum,
//!                  imm = k << len_bits | len) ─►   check slot k granted, len, checksum;
//!                                                  sink(Record); slot k processed
//!         ◄──────────── Credits{[k, ...]} (tag 0)   once a batch of processed slots is full
//!   Flush ───────────────────────────────────►     (everything before it is processed)
//!         ◄──────────────────── Flushed{records}   after returning every processed slot
//! ```
//!
//! The immediate carries the slot in its high bits and the written length in its low
//! `len_bits` bits, just enough for the slot length ([`ImmCodec`]). Each record ends
//! with an 8-byte checksum ([`checksum`], [`seal`]), so a record that was overwritten or
//! cut short is never handed on. A write to a slot the client
//! does not hold, a bad length or a bad checksum closes the connection: only a broken or
//! hostile client does that. The framework's credits cover the receive each immediate
//! consumes, so nobody ever meets an RNR; the slot credits cover the ring.
//!
//! The [ring] module holds both sides' slot bookkeeping, without I/O.
//!
//! # The sink
//!
//! [`IngestService`] calls its sink (`Arc<dyn Fn(Record) + Send + Sync>`) on the
//! connection's actor for every record, in the order a connection wrote them: keep it
//! short (push to a channel for heavy work). A slot is returned only after the sink has
//! returned, so a slow sink slows its writers down instead of losing records.
//!
//! # Quick start
//!
//! ```no_run
//! # async fn demo(client: rdmactor::runtime::Client, addr: std::net::SocketAddr)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use rdmactor::runtime::Server;
//! use rdmactor_services::ingest::{Ingest, IngestConfig, IngestService, Record};
//!
//! let sink = Arc::new(|r: Record| println!("{} bytes from {}", r.data.len(), r.connection));
//! let server = Server::builder()
//!     .listen(addr, None)
//!     .service("ingest", IngestService::new(IngestConfig::default(), sink))
//!     .start()?;
//! let mut ingest = Ingest::connect(&client, server.local_addrs()[0], "ingest").await?;
//! ingest.push(b"hello").await?;
//! assert_eq!(ingest.flush().await?, 1);
//! # Ok(()) }
//! ```
//!
//! # Thread safety
//!
//! The service is shared by every connection's actor; the sink may be called from
//! several poller threads at once. [`Ingest`] is one writer (`push` takes `&mut self`);
//! use one per task.
#![deny(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

mod client;
pub mod ring;
mod session;
// The tests' own numbers, not a peer's.
#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests;
mod wire;

use rdmactor::runtime::{ConnectError, RequestError};

pub use client::Ingest;
pub use session::{IngestService, Record, Sink};
pub use wire::{
    checksum, seal, unseal, Credits, ImmCodec, IngestRequest, IngestResponse, RingInfo,
    CHECKSUM_LEN,
};

/// Sizing of each connection's ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngestConfig {
    /// Slots per connection.
    pub slots: u32,
    /// Bytes per slot: the largest record plus [`CHECKSUM_LEN`].
    pub slot_len: u32,
    /// Processed slots returned together in one credit message.
    pub credit_batch: u32,
}

impl Default for IngestConfig {
    /// 64 slots of 4 KiB (256 KiB registered per connection), returned 16 at a time.
    fn default() -> Self {
        IngestConfig {
            slots: 64,
            slot_len: 4096,
            credit_batch: 16,
        }
    }
}

/// Everything that goes wrong in ingest, on either side.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IngestError {
    /// The ring's geometry does not work.
    #[error("unusable ring {0}")]
    BadRing(String),
    /// An immediate named a slot past the ring.
    #[error("slot {slot} is outside the ring of {slots} slots")]
    SlotOutOfRange {
        /// The slot named.
        slot: u32,
        /// Slots in the ring.
        slots: u32,
    },
    /// The client wrote into a slot the server still held: it overran the ring.
    #[error("slot {slot} was written while the server held it")]
    SlotNotGranted {
        /// The slot.
        slot: u32,
    },
    /// An immediate's length is shorter than a checksum or longer than a slot.
    #[error("record length {len} does not fit a slot of {slot_len} bytes")]
    BadLength {
        /// The length.
        len: u32,
        /// Bytes per slot.
        slot_len: u32,
    },
    /// A record's checksum does not match its bytes.
    #[error("the record in slot {slot} fails its checksum")]
    Checksum {
        /// The slot.
        slot: u32,
    },
    /// The server returned a slot the client did not hand it.
    #[error("credit for slot {slot}, which the client holds or does not have")]
    BadCredit {
        /// The slot.
        slot: u32,
    },
    /// The record does not fit a slot.
    #[error("record of {len} bytes; a slot holds at most {max}")]
    RecordTooLarge {
        /// The record's length.
        len: usize,
        /// The largest record.
        max: usize,
    },
    /// The server refused the request.
    #[error("refused by the server: {0}")]
    Refused(String),
    /// Connecting failed.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// A request or WRITE failed, or the connection closed.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The server sent something unexpected.
    #[error("unexpected message: {0}")]
    Protocol(String),
}
