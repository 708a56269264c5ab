//! The server side: one ring per connection, driven by the connection's messages.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rdmactor::runtime::{BufId, Incoming, PeerInfo, Service, Session, SessionCx, SessionError};
use rdmactor::transport::Transport;
use rdmactor::verbs::Access;

use super::ring::ServerRing;
use super::wire::{unseal, Credits, IngestRequest, IngestResponse, RingInfo};
use super::{IngestConfig, IngestError};

/// A record handed to the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The connection it came from (numbered from 0 per service, in accept order).
    pub connection: u64,
    /// Its position among that connection's records, from 0.
    pub seq: u64,
    /// The bytes the client pushed (checksum verified and removed).
    pub data: Vec<u8>,
}

/// Where records go.
pub type Sink = Arc<dyn Fn(Record) + Send + Sync>;

/// The `ingest` service.
pub struct IngestService {
    config: IngestConfig,
    sink: Sink,
    next_connection: AtomicU64,
}

impl fmt::Debug for IngestService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IngestService")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl IngestService {
    /// Rings sized by `config`; every record goes to `sink`.
    ///
    /// # Panics
    /// When `config` describes a ring that cannot work (see [`super::ImmCodec::new`]).
    pub fn new(config: IngestConfig, sink: Sink) -> Self {
        if let Err(e) = ServerRing::new(config.slots, config.slot_len, config.credit_batch) {
            panic!("ingest configuration: {e}");
        }
        IngestService {
            config,
            sink,
            next_connection: AtomicU64::new(0),
        }
    }
}

impl<T: Transport> Service<T> for IngestService {
    fn max_message(&self) -> Option<usize> {
        Some(crate::CONTROL_MESSAGE_MAX)
    }

    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session<T>> {
        Box::new(IngestSession {
            config: self.config,
            sink: self.sink.clone(),
            connection: self.next_connection.fetch_add(1, Ordering::Relaxed),
            ring: None,
            records: 0,
        })
    }
}

struct IngestSession {
    config: IngestConfig,
    sink: Sink,
    connection: u64,
    ring: Option<(ServerRing, BufId)>,
    records: u64,
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, SessionError> {
    postcard::to_allocvec(value).map_err(|e| SessionError::new(e.to_string()))
}

fn fail(e: IngestError) -> SessionError {
    SessionError::new(e.to_string())
}

impl IngestSession {
    fn handle_record<T: Transport>(
        &mut self,
        cx: &mut SessionCx<'_, T>,
        imm: u32,
    ) -> Result<(), SessionError> {
        let Some((ring, buf)) = self.ring.as_mut() else {
            return Err(SessionError::new(
                "record written before the ring was opened",
            ));
        };
        let arrival = ring.handle_write(imm).map_err(fail)?;
        let data = cx
            .read_with(*buf, arrival.range, |sealed| {
                unseal(sealed).map(<[u8]>::to_vec)
            })?
            .ok_or_else(|| fail(IngestError::Checksum { slot: arrival.slot }))?;
        (self.sink)(Record {
            connection: self.connection,
            seq: self.records,
            data,
        });
        // Our own count of records.
        self.records = self.records.wrapping_add(1);
        ring.handle_processed(arrival.slot);
        if let Some(slots) = ring.poll_credits() {
            cx.send(0, encode(&Credits { slots })?)?;
        }
        Ok(())
    }

    fn handle_request<T: Transport>(
        &mut self,
        cx: &mut SessionCx<'_, T>,
        req: IngestRequest,
    ) -> Result<IngestResponse, SessionError> {
        Ok(match req {
            IngestRequest::Open if self.ring.is_some() => {
                IngestResponse::Refused("the ring is open already".into())
            }
            IngestRequest::Open => {
                let c = self.config;
                let ring = ServerRing::new(c.slots, c.slot_len, c.credit_batch).map_err(fail)?;
                // Out of registrable memory (a memlock limit, the pool's cap) is the
                // server's condition, told to this client; its connection stays.
                let buf = match cx.register(ring.ring_len(), Access::REMOTE_WRITE) {
                    Ok(buf) => buf,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot register an ingest ring");
                        return Ok(IngestResponse::Refused(format!(
                            "cannot register a ring of {} bytes: {e}",
                            ring.ring_len()
                        )));
                    }
                };
                let info = RingInfo {
                    remote: cx.remote(buf)?,
                    slots: c.slots,
                    slot_len: c.slot_len,
                };
                self.ring = Some((ring, buf));
                IngestResponse::Ring(info)
            }
            IngestRequest::Flush => {
                // Writes and SENDs arrive in order on the QP: every record written before
                // this request has been processed by now.
                if let Some(slots) = self.ring.as_mut().and_then(|(r, _)| r.flush_credits()) {
                    cx.send(0, encode(&Credits { slots })?)?;
                }
                IngestResponse::Flushed {
                    records: self.records,
                }
            }
        })
    }
}

impl<T: Transport> Session<T> for IngestSession {
    fn on_message(&mut self, cx: &mut SessionCx<'_, T>, msg: Incoming) -> Result<(), SessionError> {
        if let Some(imm) = msg.imm {
            return self.handle_record(cx, imm);
        }
        let req: IngestRequest = postcard::from_bytes(&msg.data)
            .map_err(|e| SessionError::new(format!("malformed ingest request: {e}")))?;
        let resp = self.handle_request(cx, req)?;
        cx.reply(&msg, encode(&resp)?)
    }
}
