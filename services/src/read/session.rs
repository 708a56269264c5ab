//! The `read` service's session: grants each region a client looks up through a memory
//! window bound to this connection's QP. The bytes are the one shared registration the
//! writer updates in place; the session does nothing per read and nothing per update.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use rdmactor::runtime::{Incoming, PeerInfo, Service, Session, SessionCx, SessionError};
use rdmactor::transport::{SharedRegion as _, Transport, Verbs};
use rdmactor::verbs::{Access, RemoteRegion};

use super::regions::ReadRegions;
use super::wire::{ReadRequest, ReadResponse, RegionInfo};

/// Regions one connection may look up by default (see [`ReadService::with_limit`]).
pub const DEFAULT_MAX_GRANTS_PER_CONNECTION: usize = 256;

/// The `read` service: serves the regions of a [`ReadRegions`] catalogue, on the
/// transport the catalogue is for.
#[derive(Debug, Clone)]
pub struct ReadService<T: Transport = Verbs> {
    regions: ReadRegions<T>,
    max_grants: usize,
    /// Regions that were registered when the server's device went, registered again
    /// when it is back (the others stay lazy, registered on first lookup).
    reregister: Arc<Mutex<Vec<String>>>,
}

impl<T: Transport> ReadService<T> {
    /// Serves `regions`, with up to [`DEFAULT_MAX_GRANTS_PER_CONNECTION`] regions looked
    /// up per connection.
    pub fn new(regions: ReadRegions<T>) -> Self {
        Self::with_limit(regions, DEFAULT_MAX_GRANTS_PER_CONNECTION)
    }

    /// Serves `regions`; a connection's lookup of more than `max_grants` distinct regions
    /// is refused. Each lookup costs a memory window (a device resource), not memory.
    pub fn with_limit(regions: ReadRegions<T>, max_grants: usize) -> Self {
        ReadService {
            regions,
            max_grants,
            reregister: Arc::default(),
        }
    }
}

impl<T: Transport> Service<T> for ReadService<T> {
    fn max_message(&self) -> Option<usize> {
        Some(crate::CONTROL_MESSAGE_MAX)
    }

    fn on_device_down(&self) {
        let released = self.regions.release_all();
        tracing::warn!(
            regions = released.len(),
            "read service: the device went; region registrations dropped, bytes and versions kept"
        );
        *self
            .reregister
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = released;
    }

    fn on_device_up(&self, domain: &T::Domain) {
        let names = std::mem::take(
            &mut *self
                .reregister
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for name in names {
            if let Some(region) = self.regions.get(&name) {
                if let Err(e) = region.shared(domain) {
                    tracing::warn!(region = %name, error = %e, "read service: registering a region again failed; it registers on first lookup");
                }
            }
        }
    }

    fn session(&self, _peer: &PeerInfo) -> Box<dyn Session<T>> {
        Box::new(ReadSession {
            regions: self.regions.clone(),
            max_grants: self.max_grants,
            granted: HashMap::new(),
        })
    }
}

struct ReadSession<T: Transport> {
    regions: ReadRegions<T>,
    max_grants: usize,
    /// What this connection was granted, by region name. The windows themselves belong
    /// to the connection and go when it closes.
    granted: HashMap<String, RemoteRegion>,
}

impl<T: Transport> ReadSession<T> {
    fn lookup(
        &mut self,
        cx: &mut SessionCx<'_, T>,
        name: String,
    ) -> Result<ReadResponse, SessionError> {
        let Some(region) = self.regions.get(&name) else {
            return Ok(ReadResponse::Unknown { name });
        };
        let grant = match self.granted.get(&name) {
            Some(grant) => *grant,
            None => {
                if self.granted.len() >= self.max_grants {
                    return Ok(ReadResponse::Refused(format!(
                        "this connection looked up {} regions already, the most it may",
                        self.max_grants
                    )));
                }
                // The first lookup registers the region (once per server); a failure is the
                // server's problem, reported to the client without closing its connection.
                let shared = match region.shared(cx.domain()) {
                    Ok(shared) => shared,
                    Err(e) => {
                        tracing::warn!(region = %name, error = %e, "cannot serve a region");
                        return Ok(ReadResponse::Refused(format!("region {name:?}: {e}")));
                    }
                };
                let grant = match shared {
                    // Exactly the registered bytes: a READ past the end is a remote access
                    // error, and READ is all the window allows.
                    Some(shared) => {
                        let end = if shared.is_versioned() {
                            shared.len()
                        } else {
                            region.len()
                        };
                        match cx.grant(&shared, 0..end, Access::REMOTE_READ) {
                            Ok(grant) => grant.remote,
                            Err(e) => {
                                tracing::warn!(region = %name, error = %e, "cannot grant a region");
                                return Ok(ReadResponse::Refused(format!(
                                    "region {name:?} cannot be granted: {e}"
                                )));
                            }
                        }
                    }
                    // An empty static region: nothing to reach.
                    None => RemoteRegion {
                        addr: 0,
                        len: 0,
                        rkey: 0,
                    },
                };
                self.granted.insert(name.clone(), grant);
                grant
            }
        };
        Ok(ReadResponse::Region(RegionInfo {
            grant,
            len: region.len() as u64,
            version: region.version() & !1,
            mutable: region.is_mutable(),
            // Our own region's copies, few by construction.
            copies: u32::try_from(region.copies()).unwrap_or(u32::MAX),
            name,
        }))
    }
}

impl<T: Transport> Session<T> for ReadSession<T> {
    fn on_message(&mut self, cx: &mut SessionCx<'_, T>, msg: Incoming) -> Result<(), SessionError> {
        let req: ReadRequest = postcard::from_bytes(&msg.data)
            .map_err(|e| SessionError::new(format!("malformed read request: {e}")))?;
        let resp = match req {
            ReadRequest::Lookup { name } => self.lookup(cx, name)?,
            ReadRequest::List => ReadResponse::Names(self.regions.names()),
        };
        let bytes = postcard::to_allocvec(&resp).map_err(|e| SessionError::new(e.to_string()))?;
        cx.reply(&msg, bytes)
    }
}
