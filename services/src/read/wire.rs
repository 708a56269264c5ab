//! Messages of the `read` service (postcard, request/response).

use rdmactor::verbs::RemoteRegion;
use serde::{Deserialize, Serialize};

/// A client's request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReadRequest {
    /// Where is the region `name`? Answered with [`ReadResponse::Region`] or
    /// [`ReadResponse::Unknown`].
    Lookup {
        /// The region's name.
        name: String,
    },
    /// Publish the latest version of every region this connection looked up, then answer
    /// [`ReadResponse::Synced`]. (Every message does the former; see the module docs.)
    Sync,
    /// The names served: answered with [`ReadResponse::Names`].
    List,
}

/// The server's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReadResponse {
    /// The region asked for.
    Region(RegionInfo),
    /// No region has this name.
    Unknown {
        /// The name asked for.
        name: String,
    },
    /// The versions now published to this connection, by region name.
    Synced {
        /// `(name, version)` pairs.
        versions: Vec<(String, u64)>,
    },
    /// The names served.
    Names(Vec<String>),
    /// The request cannot be served (the reason says why, e.g. a memory cap).
    Refused(String),
}

/// Where a region is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionInfo {
    /// The region's name.
    pub name: String,
    /// The whole registration: the version word, then the data (REMOTE_READ only,
    /// exactly `8 + len` bytes).
    pub registration: RemoteRegion,
    /// Bytes of data.
    pub len: u64,
    /// The version published when the lookup was answered (even).
    pub version: u64,
    /// False for regions that never change (files, static buffers): a plain READ is
    /// consistent.
    pub mutable: bool,
}
