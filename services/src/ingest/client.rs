//! The client side: one writer per connection.

use std::net::SocketAddr;

use rdmactor::runtime::{Client, ClientConnection, RequestError};

use super::ring::ClientRing;
use super::wire::{seal, Credits, IngestRequest, IngestResponse, RingInfo};
use super::IngestError;

/// Pushes records into a server's `ingest` service over one connection.
#[derive(Debug)]
pub struct Ingest {
    conn: ClientConnection,
    info: RingInfo,
    ring: ClientRing,
}

impl Ingest {
    /// Connects to `service` at `addr` and opens a ring.
    ///
    /// # Errors
    /// [`IngestError::Connect`], or as [`Ingest::open`].
    pub async fn connect(
        client: &Client,
        addr: SocketAddr,
        service: &str,
    ) -> Result<Ingest, IngestError> {
        let conn = client.connect(addr, service).await?;
        Ingest::open(conn).await
    }

    /// Opens a ring on a connection to an `ingest` service. The connection's inbox
    /// (`ClientConnection::recv`) belongs to this writer from now on.
    ///
    /// # Errors
    /// [`IngestError::Refused`] (a ring is open on it already), [`IngestError::Request`].
    pub async fn open(conn: ClientConnection) -> Result<Ingest, IngestError> {
        match conn.request_typed(&IngestRequest::Open).await? {
            IngestResponse::Ring(info) => Ok(Ingest {
                ring: ClientRing::new(info.slots, info.slot_len)?,
                info,
                conn,
            }),
            IngestResponse::Refused(why) => Err(IngestError::Refused(why)),
            other => Err(IngestError::Protocol(format!("{other:?}"))),
        }
    }

    /// The ring the server granted.
    pub fn ring(&self) -> &RingInfo {
        &self.info
    }

    /// The largest record [`push`](Self::push) accepts.
    pub fn max_record(&self) -> usize {
        self.ring.max_record()
    }

    /// Slots free right now.
    pub fn free_slots(&self) -> usize {
        self.ring.free_slots()
    }

    /// The connection.
    pub fn connection(&self) -> &ClientConnection {
        &self.conn
    }

    /// Writes `record` into a free slot, waiting for the server to return one when all
    /// are in use; returns once the WRITE completed (the record is in the server's
    /// memory and its immediate queued there).
    ///
    /// # Errors
    /// [`IngestError::RecordTooLarge`] (nothing sent), [`IngestError::Request`] (the
    /// connection is gone), [`IngestError::BadCredit`] / [`IngestError::Protocol`] (the
    /// server broke the protocol).
    pub async fn push(&mut self, record: &[u8]) -> Result<(), IngestError> {
        let sealed = seal(record);
        let (slot, imm) = loop {
            if let Some(taken) = self.ring.take_slot(sealed.len())? {
                break taken;
            }
            self.wait_for_credits().await?;
        };
        let dst = self
            .info
            .remote
            .slice(self.info.slot_offset(slot), sealed.len() as u64)
            .map_err(|e| IngestError::Protocol(format!("slot {slot}: {e}")))?;
        self.conn.write(dst, sealed, Some(imm)).await?;
        Ok(())
    }

    /// Waits until the server processed every record pushed so far and returned the
    /// slots; returns how many records it processed on this connection.
    ///
    /// # Errors
    /// [`IngestError::Request`].
    pub async fn flush(&mut self) -> Result<u64, IngestError> {
        match self.conn.request_typed(&IngestRequest::Flush).await? {
            IngestResponse::Flushed { records } => Ok(records),
            other => Err(IngestError::Protocol(format!("{other:?}"))),
        }
    }

    /// Closes the connection.
    pub async fn close(self) {
        self.conn.close().await;
    }

    async fn wait_for_credits(&mut self) -> Result<(), IngestError> {
        let msg = self.conn.recv().await.ok_or_else(|| {
            IngestError::Request(RequestError::Closed(rdmactor::runtime::CloseReason::Local(
                "connection closed".into(),
            )))
        })?;
        let credits: Credits = postcard::from_bytes(&msg.data)
            .map_err(|e| IngestError::Protocol(format!("credit message: {e}")))?;
        self.ring.handle_credits(&credits.slots)
    }
}
