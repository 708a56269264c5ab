//! The client side: look a region up once, then read it with one-sided RDMA READs.

use rdmactor::runtime::{ClientConnection, RequestError};
use rdmactor::verbs::RemoteRegion;

use super::layout::{
    decode_version, Contended, ReadStep, VersionedData, VersionedRead, HEADER_LEN,
};
use super::wire::{ReadRequest, ReadResponse, RegionInfo};

/// Inconsistent attempts [`read_consistent`] makes before giving up.
pub const MAX_ATTEMPTS: u32 = 10_000;

/// Why a read-service call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The request or READ failed; a READ outside the region fails here with the NIC's
    /// remote access error (and the connection closes, as its QP is in error).
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The server serves no region by that name.
    #[error("no region named {0:?}")]
    UnknownRegion(String),
    /// The server refused (for example a per-connection memory cap).
    #[error("refused by the server: {0}")]
    Refused(String),
    /// The region kept changing while it was read.
    #[error(transparent)]
    Contended(#[from] Contended),
    /// The server answered something this client does not expect.
    #[error("unexpected reply: {0}")]
    Protocol(String),
}

impl ReadError {
    /// True when the NIC refused the access (a READ outside the region, a revoked key).
    pub fn is_remote_access_error(&self) -> bool {
        matches!(self, ReadError::Request(RequestError::Failed(why)) if why.contains("RemoteAccess"))
    }
}

/// A region looked up on one connection; good for that connection only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionHandle {
    info: RegionInfo,
}

impl RegionHandle {
    /// A handle from a [`RegionInfo`] obtained some other way (it is only good on the
    /// connection that looked it up).
    pub fn from_info(info: RegionInfo) -> Self {
        RegionHandle { info }
    }

    /// The region's name.
    pub fn name(&self) -> &str {
        &self.info.name
    }

    /// Bytes of data.
    pub fn len(&self) -> u64 {
        self.info.len
    }

    /// True for an empty region.
    pub fn is_empty(&self) -> bool {
        self.info.len == 0
    }

    /// The version published when it was looked up.
    pub fn version(&self) -> u64 {
        self.info.version
    }

    /// False when the region never changes (plain [`read`] is then consistent).
    pub fn is_mutable(&self) -> bool {
        self.info.mutable
    }

    /// What the server sent.
    pub fn info(&self) -> &RegionInfo {
        &self.info
    }

    /// The version word.
    pub fn version_word(&self) -> RemoteRegion {
        RemoteRegion {
            len: HEADER_LEN as u64,
            ..self.info.registration
        }
    }

    /// `len` data bytes at `offset`, deliberately not checked against the region: the
    /// server's registration is the authority, and the NIC refuses what lies outside.
    pub fn data_range(&self, offset: u64, len: u64) -> RemoteRegion {
        RemoteRegion {
            addr: self
                .info
                .registration
                .addr
                .wrapping_add(HEADER_LEN as u64)
                .wrapping_add(offset),
            len,
            rkey: self.info.registration.rkey,
        }
    }
}

async fn call(conn: &ClientConnection, req: &ReadRequest) -> Result<ReadResponse, ReadError> {
    Ok(conn.request_typed(req).await?)
}

/// Looks `name` up (and makes the server register it for this connection).
///
/// # Errors
/// [`ReadError::UnknownRegion`], [`ReadError::Refused`], [`ReadError::Request`].
pub async fn lookup(conn: &ClientConnection, name: &str) -> Result<RegionHandle, ReadError> {
    match call(
        conn,
        &ReadRequest::Lookup {
            name: name.to_owned(),
        },
    )
    .await?
    {
        ReadResponse::Region(info) => Ok(RegionHandle { info }),
        ReadResponse::Unknown { name } => Err(ReadError::UnknownRegion(name)),
        ReadResponse::Refused(why) => Err(ReadError::Refused(why)),
        other => Err(ReadError::Protocol(format!("{other:?}"))),
    }
}

/// The names the server serves.
///
/// # Errors
/// [`ReadError::Request`].
pub async fn list(conn: &ClientConnection) -> Result<Vec<String>, ReadError> {
    match call(conn, &ReadRequest::List).await? {
        ReadResponse::Names(names) => Ok(names),
        other => Err(ReadError::Protocol(format!("{other:?}"))),
    }
}

/// Asks the server to publish the latest version of every region this connection looked
/// up, and returns the `(name, version)` pairs now visible.
///
/// Until the framework lets an application update registered memory directly (see the
/// module docs), a connection sees updates only after it sent the server something:
/// readers of changing regions call this periodically.
///
/// # Errors
/// [`ReadError::Request`].
pub async fn sync(conn: &ClientConnection) -> Result<Vec<(String, u64)>, ReadError> {
    match call(conn, &ReadRequest::Sync).await? {
        ReadResponse::Synced { versions } => Ok(versions),
        other => Err(ReadError::Protocol(format!("{other:?}"))),
    }
}

/// One RDMA READ of `len` bytes at `offset`, with no version check: consistent for
/// regions that never change, possibly torn for ones being updated.
///
/// # Errors
/// [`ReadError::Request`] (a remote access error outside the region).
pub async fn read(
    conn: &ClientConnection,
    handle: &RegionHandle,
    offset: u64,
    len: usize,
) -> Result<Vec<u8>, ReadError> {
    Ok(conn
        .read(handle.data_range(offset, len as u64), len)
        .await?)
}

/// The version word, with one READ.
///
/// # Errors
/// [`ReadError::Request`].
pub async fn read_version(
    conn: &ClientConnection,
    handle: &RegionHandle,
) -> Result<u64, ReadError> {
    let word = conn.read(handle.version_word(), HEADER_LEN).await?;
    Ok(decode_version(&word))
}

/// `len` bytes at `offset` that all belong to one version, and that version: READs the
/// version, the data and the version again (one after the other) and retries while a
/// writer was busy or finished in between.
///
/// # Errors
/// [`ReadError::Request`] (a remote access error outside the region),
/// [`ReadError::Contended`] after [`MAX_ATTEMPTS`].
pub async fn read_consistent(
    conn: &ClientConnection,
    handle: &RegionHandle,
    offset: u64,
    len: usize,
) -> Result<(Vec<u8>, u64), ReadError> {
    let v = read_versioned(conn, handle, offset, len, MAX_ATTEMPTS).await?;
    Ok((v.data, v.version))
}

/// [`read_consistent`] with an attempt limit, also reporting how many attempts it
/// discarded.
///
/// # Errors
/// As [`read_consistent`].
pub async fn read_versioned(
    conn: &ClientConnection,
    handle: &RegionHandle,
    offset: u64,
    len: usize,
    max_attempts: u32,
) -> Result<VersionedData, ReadError> {
    let mut machine = VersionedRead::new(max_attempts);
    loop {
        match machine.poll_step() {
            ReadStep::Version => machine.handle_version(read_version(conn, handle).await?),
            ReadStep::Data => machine.handle_data(read(conn, handle, offset, len).await?),
            ReadStep::Finished => {
                return machine
                    .take_outcome()
                    .expect("a finished read has an outcome")
                    .map_err(ReadError::from)
            }
        }
    }
}
