//! The `read` service's session: registers each region a client looks up, publishes its
//! content seqlock-style, and republishes newer versions whenever the connection's actor
//! runs for this session (any message from the client).

use std::collections::HashMap;
use std::sync::Arc;

use rdmactor::runtime::{BufId, Message, PeerInfo, Service, Session, SessionCx, SessionError};
use rdmactor::verbs::Access;

use super::layout::{publish, registered_len};
use super::regions::{ReadRegions, Region};
use super::wire::{ReadRequest, ReadResponse, RegionInfo};

/// Registered bytes one connection may hold by default (see [`ReadService::with_limit`]).
pub const DEFAULT_MAX_BYTES_PER_CONNECTION: usize = 1 << 30;

/// The `read` service: serves the regions of a [`ReadRegions`] catalogue.
#[derive(Debug, Clone)]
pub struct ReadService {
    regions: ReadRegions,
    max_bytes: usize,
}

impl ReadService {
    /// Serves `regions`, with up to [`DEFAULT_MAX_BYTES_PER_CONNECTION`] registered per
    /// connection.
    pub fn new(regions: ReadRegions) -> Self {
        Self::with_limit(regions, DEFAULT_MAX_BYTES_PER_CONNECTION)
    }

    /// Serves `regions`; a lookup that would take a connection past `max_bytes` of
    /// registered memory is refused.
    pub fn with_limit(regions: ReadRegions, max_bytes: usize) -> Self {
        ReadService { regions, max_bytes }
    }
}

impl Service for ReadService {
    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session> {
        Box::new(ReadSession {
            regions: self.regions.clone(),
            max_bytes: self.max_bytes,
            registered: 0,
            published: HashMap::new(),
        })
    }
}

/// A region registered for this connection and the version it holds.
struct Published {
    region: Arc<Region>,
    buf: BufId,
    version: u64,
}

struct ReadSession {
    regions: ReadRegions,
    max_bytes: usize,
    registered: usize,
    published: HashMap<String, Published>,
}

impl ReadSession {
    /// Copies newer versions into this connection's registrations.
    fn refresh(&mut self, cx: &mut SessionCx<'_>) -> Result<(), SessionError> {
        for p in self.published.values_mut() {
            if p.region.version() == p.version {
                continue;
            }
            let content = p.region.content();
            publish(cx.bytes_mut(p.buf)?, content.version, &content.bytes);
            p.version = content.version;
        }
        Ok(())
    }

    fn lookup(
        &mut self,
        cx: &mut SessionCx<'_>,
        name: String,
    ) -> Result<ReadResponse, SessionError> {
        if !self.published.contains_key(&name) {
            let Some(region) = self.regions.get(&name) else {
                return Ok(ReadResponse::Unknown { name });
            };
            let len = registered_len(region.len());
            if self.registered + len > self.max_bytes {
                return Ok(ReadResponse::Refused(format!(
                    "registering {name:?} ({len} bytes) would pass this connection's cap of {} bytes",
                    self.max_bytes
                )));
            }
            // Exactly header + data: a READ past the data end is a remote access error.
            let buf = cx.register(len, Access::REMOTE_READ)?;
            let version = {
                let content = region.content();
                publish(cx.bytes_mut(buf)?, content.version, &content.bytes);
                content.version
            };
            self.registered += len;
            self.published.insert(
                name.clone(),
                Published {
                    region,
                    buf,
                    version,
                },
            );
        }
        let p = &self.published[&name];
        Ok(ReadResponse::Region(RegionInfo {
            registration: cx.remote(p.buf)?,
            len: p.region.len() as u64,
            version: p.version,
            mutable: p.region.is_mutable(),
            name,
        }))
    }
}

impl Session for ReadSession {
    fn on_message(&mut self, cx: &mut SessionCx<'_>, msg: Message) -> Result<(), SessionError> {
        self.refresh(cx)?;
        let req: ReadRequest = postcard::from_bytes(&msg.data)
            .map_err(|e| SessionError::new(format!("malformed read request: {e}")))?;
        let resp = match req {
            ReadRequest::Lookup { name } => self.lookup(cx, name)?,
            ReadRequest::Sync => {
                let mut versions: Vec<(String, u64)> = self
                    .published
                    .iter()
                    .map(|(name, p)| (name.clone(), p.version))
                    .collect();
                versions.sort();
                ReadResponse::Synced { versions }
            }
            ReadRequest::List => ReadResponse::Names(self.regions.names()),
        };
        let bytes = postcard::to_allocvec(&resp).map_err(|e| SessionError::new(e.to_string()))?;
        cx.reply(&msg, bytes)
    }
}
