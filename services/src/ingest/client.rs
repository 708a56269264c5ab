//! The client side: one writer per connection.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use rdmactor::runtime::{Client, ClientConnection, RequestError};
use rdmactor::transport::{Transport, Verbs};

use super::ring::ClientRing;
use super::wire::{seal, Credits, IngestRequest, IngestResponse, RingInfo};
use super::IngestError;

/// A WRITE handed to the connection, waiting for its completion.
type PendingWrite = Pin<Box<dyn Future<Output = Result<(), RequestError>> + Send>>;

/// Pushes records into a server's `ingest` service over one connection.
///
/// [`push`](Self::push) returns once the WRITE is queued on the connection, so a writer
/// keeps up to a ring's worth of records in flight; a failed WRITE surfaces at a later
/// `push` or at [`flush`](Self::flush).
pub struct Ingest<T: Transport = Verbs> {
    conn: ClientConnection<T>,
    info: RingInfo,
    ring: ClientRing,
    writes: VecDeque<PendingWrite>,
}

impl<T: Transport> fmt::Debug for Ingest<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ingest")
            .field("ring", &self.info)
            .field("free_slots", &self.ring.free_slots())
            .field("writes_in_flight", &self.writes.len())
            .finish()
    }
}

impl<T: Transport> Ingest<T> {
    /// Connects to `service` at `addr` and opens a ring.
    ///
    /// # Errors
    /// [`IngestError::Connect`], or as [`Ingest::open`].
    pub async fn connect(
        client: &Client<T>,
        addr: SocketAddr,
        service: &str,
    ) -> Result<Ingest<T>, IngestError> {
        let conn = client.connect(addr, service).await?;
        Ingest::open(conn).await
    }

    /// Opens a ring on a connection to an `ingest` service. The connection's inbox
    /// (`ClientConnection::recv`) belongs to this writer from now on.
    ///
    /// # Errors
    /// [`IngestError::Refused`] (a ring is open on it already), [`IngestError::Request`].
    pub async fn open(conn: ClientConnection<T>) -> Result<Ingest<T>, IngestError> {
        match conn.request_typed(&IngestRequest::Open).await? {
            IngestResponse::Ring(info) => Ok(Ingest {
                ring: ClientRing::new(info.slots, info.slot_len)?,
                info,
                conn,
                writes: VecDeque::new(),
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
    pub fn connection(&self) -> &ClientConnection<T> {
        &self.conn
    }

    /// Writes `record` into a free slot, waiting for the server to return one when all
    /// are in use; returns once the WRITE is queued on the connection (records leave in
    /// the order they were pushed).
    ///
    /// # Errors
    /// [`IngestError::RecordTooLarge`] (nothing sent), [`IngestError::Request`] (this or
    /// an earlier WRITE failed: the connection is gone), [`IngestError::BadCredit`] /
    /// [`IngestError::Protocol`] (the server broke the protocol).
    pub async fn push(&mut self, record: &[u8]) -> Result<(), IngestError> {
        self.reap_writes()?;
        if self.writes.len() >= self.info.slots as usize {
            if let Some(write) = self.writes.pop_front() {
                write.await?;
            }
        }
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
        let conn = self.conn.clone();
        let mut write: PendingWrite =
            Box::pin(async move { conn.write(dst, sealed, Some(imm)).await });
        // The first poll hands the WRITE to the connection's actor, in push order.
        if let Poll::Ready(result) = write.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            result?;
        } else {
            self.writes.push_back(write);
        }
        Ok(())
    }

    /// Drops the WRITEs at the front that completed; the first failure is returned.
    fn reap_writes(&mut self) -> Result<(), IngestError> {
        let mut cx = Context::from_waker(Waker::noop());
        while let Some(write) = self.writes.front_mut() {
            match write.as_mut().poll(&mut cx) {
                Poll::Ready(result) => {
                    self.writes.pop_front();
                    result?;
                }
                Poll::Pending => break,
            }
        }
        Ok(())
    }

    /// Waits until the server processed every record pushed so far and returned every
    /// slot (all are free afterwards); returns how many records it processed on this
    /// connection.
    ///
    /// # Errors
    /// [`IngestError::Request`].
    pub async fn flush(&mut self) -> Result<u64, IngestError> {
        while let Some(write) = self.writes.pop_front() {
            write.await?;
        }
        let records = match self.conn.request_typed(&IngestRequest::Flush).await? {
            IngestResponse::Flushed { records } => records,
            other => return Err(IngestError::Protocol(format!("{other:?}"))),
        };
        // The server returned every slot before answering, and its credit messages were
        // delivered before the answer: take them all in now.
        while self.ring.free_slots() < self.info.slots as usize {
            self.wait_for_credits().await?;
        }
        Ok(records)
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
