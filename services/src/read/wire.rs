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
    /// What this connection may READ (a memory window bound to its QP, REMOTE_READ
    /// only): exactly the version word and the `copies` copies of the data
    /// (`8 + copies × len` bytes) of a mutable region, exactly the data (`len` bytes) of a
    /// static one.
    pub grant: RemoteRegion,
    /// Copies of the data a mutable region keeps (version `v` is in copy
    /// `(v / 2) % copies`); 1 for static regions.
    pub copies: u32,
    /// Bytes of data.
    pub len: u64,
    /// The last complete version when the lookup was answered (even).
    pub version: u64,
    /// False for regions that never change (files, static buffers): a plain READ is
    /// consistent.
    pub mutable: bool,
}
