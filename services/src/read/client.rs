//! The client side: look a region up once, then read it with one-sided RDMA READs.

use rdmactor::runtime::{ClientConnection, RequestError};
use rdmactor::transport::Transport;
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

    /// The last complete version when it was looked up.
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

    /// The version word of a mutable region (static regions have none).
    pub fn version_word(&self) -> Option<RemoteRegion> {
        self.info.mutable.then_some(RemoteRegion {
            len: HEADER_LEN as u64,
            ..self.info.grant
        })
    }

    /// Copies of the data the region keeps (1 for static regions).
    pub fn copies(&self) -> usize {
        (self.info.copies as usize).max(1)
    }

    /// `len` data bytes at `offset` of version `version` (in that version's copy),
    /// deliberately not checked against the region: the server's grant is the
    /// authority, and the NIC refuses what lies outside.
    pub fn data_range(&self, version: u64, offset: u64, len: u64) -> RemoteRegion {
        // Wrapping, like the address below: `len` and `copies` are the server's word, and
        // whatever address they make, the NIC checks it against the grant's rkey.
        let header = if self.info.mutable {
            let copy = rdmactor::transport::copy_of(version, self.copies()) as u64;
            (HEADER_LEN as u64).wrapping_add(copy.wrapping_mul(self.info.len))
        } else {
            0
        };
        RemoteRegion {
            addr: self
                .info
                .grant
                .addr
                .wrapping_add(header)
                .wrapping_add(offset),
            len,
            rkey: self.info.grant.rkey,
        }
    }
}

async fn call<T: Transport>(
    conn: &ClientConnection<T>,
    req: &ReadRequest,
) -> Result<ReadResponse, ReadError> {
    Ok(conn.request_typed(req).await?)
}

/// Looks `name` up: the server grants this connection READ access to it (a memory window
/// bound to this connection's QP; the handle is useless on any other connection).
///
/// # Errors
/// [`ReadError::UnknownRegion`], [`ReadError::Refused`], [`ReadError::Request`].
pub async fn lookup<T: Transport>(
    conn: &ClientConnection<T>,
    name: &str,
) -> Result<RegionHandle, ReadError> {
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
pub async fn list<T: Transport>(conn: &ClientConnection<T>) -> Result<Vec<String>, ReadError> {
    match call(conn, &ReadRequest::List).await? {
        ReadResponse::Names(names) => Ok(names),
        other => Err(ReadError::Protocol(format!("{other:?}"))),
    }
}

/// `len` bytes at `offset` with no version check: one RDMA READ, consistent for regions
/// that never change; for a mutable region the version is READ first (to find the
/// current copy) and the data may be torn.
///
/// # Errors
/// [`ReadError::Request`] (a remote access error outside the region).
pub async fn read<T: Transport>(
    conn: &ClientConnection<T>,
    handle: &RegionHandle,
    offset: u64,
    len: usize,
) -> Result<Vec<u8>, ReadError> {
    let version = if handle.is_mutable() {
        read_version(conn, handle).await? & !1
    } else {
        handle.version()
    };
    read_at(conn, handle, version, offset, len).await
}

async fn read_at<T: Transport>(
    conn: &ClientConnection<T>,
    handle: &RegionHandle,
    version: u64,
    offset: u64,
    len: usize,
) -> Result<Vec<u8>, ReadError> {
    Ok(conn
        .read(handle.data_range(version, offset, len as u64), len)
        .await?)
}

/// The version word, with one READ (a static region's version never changes: no READ).
///
/// # Errors
/// [`ReadError::Request`].
pub async fn read_version<T: Transport>(
    conn: &ClientConnection<T>,
    handle: &RegionHandle,
) -> Result<u64, ReadError> {
    match handle.version_word() {
        Some(word) => Ok(decode_version(&conn.read(word, HEADER_LEN).await?)),
        None => Ok(handle.version()),
    }
}

/// `len` bytes at `offset` that all belong to one version, and that version: READs the
/// version, the data and the version again (one after the other) and retries while a
/// writer was busy or finished in between.
///
/// # Errors
/// [`ReadError::Request`] (a remote access error outside the region),
/// [`ReadError::Contended`] after [`MAX_ATTEMPTS`].
pub async fn read_consistent<T: Transport>(
    conn: &ClientConnection<T>,
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
pub async fn read_versioned<T: Transport>(
    conn: &ClientConnection<T>,
    handle: &RegionHandle,
    offset: u64,
    len: usize,
    max_attempts: u32,
) -> Result<VersionedData, ReadError> {
    if !handle.is_mutable() {
        // Never changes: one READ is consistent.
        return Ok(VersionedData {
            data: read_at(conn, handle, handle.version(), offset, len).await?,
            version: handle.version(),
            retries: 0,
        });
    }
    let mut machine = VersionedRead::with_copies(max_attempts, handle.copies());
    loop {
        match machine.poll_step() {
            ReadStep::Version => machine.handle_version(read_version(conn, handle).await?),
            ReadStep::Data => {
                let version = machine.data_version().expect("a data step has a version");
                machine.handle_data(read_at(conn, handle, version, offset, len).await?)
            }
            ReadStep::Finished => {
                return machine
                    .take_outcome()
                    .expect("a finished read has an outcome")
                    .map_err(ReadError::from)
            }
        }
    }
}
