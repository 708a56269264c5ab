//! The application's side of the read service: the named regions it serves and the
//! handles it updates them with. No RDMA here; sessions publish what these hold.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use super::layout::FIRST_VERSION;

/// Why a region could not be added or updated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegionError {
    /// A region with this name exists already.
    #[error("a region named {0:?} exists already")]
    Duplicate(String),
    /// Loading a file failed.
    #[error("loading {path}: {source}")]
    Load {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A write does not fit the region.
    #[error("write of {len} bytes at {offset} outside a region of {region_len} bytes")]
    OutOfRange {
        /// Where the write started.
        offset: usize,
        /// Its length.
        len: usize,
        /// The region's length.
        region_len: usize,
    },
}

/// A region's bytes and the version they have.
#[derive(Debug)]
pub(crate) struct Content {
    pub version: u64,
    pub bytes: Vec<u8>,
}

/// One named region: its authoritative content (what sessions publish) and, outside the
/// lock, a copy of its version so that sessions can check for news without locking.
pub(crate) struct Region {
    name: String,
    mutable: bool,
    len: usize,
    version: AtomicU64,
    content: RwLock<Content>,
}

impl Region {
    fn new(name: String, mutable: bool, bytes: Vec<u8>) -> Region {
        Region {
            name,
            mutable,
            len: bytes.len(),
            version: AtomicU64::new(FIRST_VERSION),
            content: RwLock::new(Content {
                version: FIRST_VERSION,
                bytes,
            }),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn is_mutable(&self) -> bool {
        self.mutable
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The latest version (may be ahead of what a caller published).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The content, read-locked (writers wait while it is held).
    pub fn content(&self) -> RwLockReadGuard<'_, Content> {
        self.content.read().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("name", &self.name)
            .field("mutable", &self.mutable)
            .field("len", &self.len)
            .field("version", &self.version())
            .finish()
    }
}

/// The regions a read service serves, by name. Cheap to clone (all clones share the
/// catalogue); add regions before or while the server runs.
#[derive(Clone, Default)]
pub struct ReadRegions {
    regions: Arc<RwLock<HashMap<String, Arc<Region>>>>,
}

impl fmt::Debug for ReadRegions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadRegions")
            .field("names", &self.names())
            .finish()
    }
}

impl ReadRegions {
    /// An empty catalogue.
    pub fn new() -> Self {
        Self::default()
    }

    fn insert(&self, region: Region) -> Result<Arc<Region>, RegionError> {
        let mut map = self.regions.write().unwrap_or_else(PoisonError::into_inner);
        if map.contains_key(&region.name) {
            return Err(RegionError::Duplicate(region.name));
        }
        let region = Arc::new(region);
        map.insert(region.name.clone(), region.clone());
        Ok(region)
    }

    /// Serves `initial` under `name` as a region the application updates through the
    /// returned writer (clients read it with the versioned API).
    ///
    /// # Errors
    /// [`RegionError::Duplicate`].
    pub fn add_buffer(
        &self,
        name: impl Into<String>,
        initial: Vec<u8>,
    ) -> Result<RegionWriter, RegionError> {
        let region = self.insert(Region::new(name.into(), true, initial))?;
        Ok(RegionWriter { region })
    }

    /// Serves `bytes` under `name`, never to change (plain READs are consistent).
    ///
    /// # Errors
    /// [`RegionError::Duplicate`].
    pub fn add_static(&self, name: impl Into<String>, bytes: Vec<u8>) -> Result<(), RegionError> {
        self.insert(Region::new(name.into(), false, bytes))
            .map(|_| ())
    }

    /// Loads the file at `path` and serves its bytes under `name`, read-only (later
    /// changes to the file are not seen).
    ///
    /// # Errors
    /// [`RegionError::Load`], [`RegionError::Duplicate`].
    pub fn add_file(
        &self,
        name: impl Into<String>,
        path: impl AsRef<Path>,
    ) -> Result<(), RegionError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| RegionError::Load {
            path: path.display().to_string(),
            source,
        })?;
        self.add_static(name, bytes)
    }

    /// A writer for the mutable region `name`; `None` for unknown or static regions.
    pub fn writer(&self, name: &str) -> Option<RegionWriter> {
        self.get(name)
            .filter(|r| r.is_mutable())
            .map(|region| RegionWriter { region })
    }

    /// The names served, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .regions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    pub(crate) fn get(&self, name: &str) -> Option<Arc<Region>> {
        self.regions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }
}

/// Updates one mutable region. Cheap to clone, usable from any thread while sessions
/// serve the region; each update bumps the version by 2.
#[derive(Clone)]
pub struct RegionWriter {
    region: Arc<Region>,
}

impl fmt::Debug for RegionWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RegionWriter").field(&self.region).finish()
    }
}

impl RegionWriter {
    /// The region's name.
    pub fn name(&self) -> &str {
        self.region.name()
    }

    /// The region's length in bytes (fixed).
    pub fn len(&self) -> usize {
        self.region.len()
    }

    /// True for an empty region.
    pub fn is_empty(&self) -> bool {
        self.region.len() == 0
    }

    /// The current version.
    pub fn version(&self) -> u64 {
        self.region.version()
    }

    /// Runs `f` on the bytes, with the version they will have once `f` returns, and
    /// returns that version. Sessions publishing the region wait while `f` runs.
    pub fn update(&self, f: impl FnOnce(u64, &mut [u8])) -> u64 {
        let mut content = self
            .region
            .content
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let version = content.version + 2;
        f(version, &mut content.bytes);
        content.version = version;
        self.region.version.store(version, Ordering::Release);
        version
    }

    /// Overwrites `data.len()` bytes at `offset`; returns the new version.
    ///
    /// # Errors
    /// [`RegionError::OutOfRange`] (nothing is written).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<u64, RegionError> {
        let region_len = self.len();
        if offset
            .checked_add(data.len())
            .is_none_or(|end| end > region_len)
        {
            return Err(RegionError::OutOfRange {
                offset,
                len: data.len(),
                region_len,
            });
        }
        Ok(self.update(|_, bytes| bytes[offset..offset + data.len()].copy_from_slice(data)))
    }
}
