//! The application's side of the read service: the named regions it serves and the
//! handles it updates them with. A region is registered once, on the server's protection
//! domain, when a connection first looks it up; from then on the writer updates that
//! registered memory in place (a seqlock write) and every connection reads it through a
//! window of its own.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use rdmactor::transport::{SharedRegion as _, Transport, Verbs};
use rdmactor::verbs::VerbsError;

use super::layout::FIRST_VERSION;

/// Why a region could not be added or updated; `E` is the transport's error
/// (registration failures).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegionError<E = VerbsError> {
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
    /// Registering the region on the server's protection domain failed.
    #[error("registering the region: {0}")]
    Register(#[from] E),
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

/// Copies of its data a mutable region keeps unless told otherwise
/// ([`ReadRegions::add_buffer_with_copies`]).
pub const DEFAULT_COPIES: usize = 4;

/// Where a region's bytes are before any connection looked it up.
enum Source {
    Bytes(Vec<u8>),
    /// Kept open (so the file may be unlinked), mapped read-only on first lookup.
    File(File),
}

/// A region's bytes: held by the catalogue until the first lookup, then registered once
/// on the server's protection domain and granted to every connection from there. Back
/// to `Pending` if the server's device goes ([`ReadRegions::release_all`]).
enum State<T: Transport> {
    Pending {
        version: u64,
        source: Source,
    },
    Shared {
        shared: T::Shared,
        /// A file region's file, kept to map it again on another device.
        file: Option<File>,
    },
}

/// One named region.
pub(crate) struct Region<T: Transport = Verbs> {
    name: String,
    mutable: bool,
    len: usize,
    /// Copies a mutable region keeps (see [`ReadRegions::add_buffer_with_copies`]).
    copies: usize,
    /// Writers and the first lookup take turns here; readers (the NIC) never do.
    state: Mutex<State<T>>,
}

impl<T: Transport> Region<T> {
    fn new(name: String, mutable: bool, len: usize, source: Source) -> Region<T> {
        Region {
            name,
            mutable,
            len,
            copies: 1,
            state: Mutex::new(State::Pending {
                version: FIRST_VERSION,
                source,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
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

    /// Copies of the data a mutable region keeps (1 for static regions).
    pub fn copies(&self) -> usize {
        self.copies
    }

    /// The latest version (odd while an update is under way).
    pub fn version(&self) -> u64 {
        match &*self.state() {
            State::Pending { version, .. } => *version,
            State::Shared { shared, .. } => shared.version().unwrap_or(FIRST_VERSION),
        }
    }

    /// The region registered on `domain`, registering it on first use: a versioned region
    /// (version word, then the data) for mutable regions, the bytes alone for static
    /// ones, a read-only mapping for files. `None` for an empty static region (there is
    /// nothing to register).
    ///
    /// # Errors
    /// [`RegionError::Register`] when registration fails.
    pub fn shared(&self, domain: &T::Domain) -> Result<Option<T::Shared>, RegionError<T::Error>> {
        let mut state = self.state();
        let shared = match &*state {
            State::Shared { shared, .. } => return Ok(Some(shared.clone())),
            State::Pending { .. } if !self.mutable && self.len == 0 => return Ok(None),
            State::Pending {
                version,
                source: Source::Bytes(bytes),
            } if self.mutable => {
                let shared = T::Shared::alloc_versioned(domain, bytes.len(), self.copies)?;
                shared.publish(*version, |data| data.copy_from_slice(bytes))?;
                shared
            }
            State::Pending {
                source: Source::Bytes(bytes),
                ..
            } => {
                let shared = T::Shared::alloc(domain, bytes.len())?;
                shared.update(|_, data| data.copy_from_slice(bytes))?;
                shared
            }
            State::Pending {
                source: Source::File(file),
                ..
            } => T::Shared::map_file(domain, file)?,
        };
        let pending = std::mem::replace(
            &mut *state,
            State::Shared {
                shared: shared.clone(),
                file: None,
            },
        );
        if let (
            State::Pending {
                source: Source::File(f),
                ..
            },
            State::Shared { file, .. },
        ) = (pending, &mut *state)
        {
            *file = Some(f);
        }
        Ok(Some(shared))
    }

    /// Drops the registration, keeping the bytes (a registered buffer's version and data
    /// are copied back out of the registered memory, a file keeps its descriptor): the
    /// next [`shared`](Region::shared) registers it on whichever PD it is given. True if
    /// it was registered.
    fn release(&self) -> bool {
        let mut state = self.state();
        let State::Shared { shared, file } = &mut *state else {
            return false;
        };
        let version = shared.version().unwrap_or(FIRST_VERSION);
        let source = match file.take() {
            Some(file) => Source::File(file),
            None => Source::Bytes(
                shared
                    .read(0, shared.data_len())
                    .expect("the whole registered data"),
            ),
        };
        *state = State::Pending { version, source };
        true
    }

    /// The version and a copy of the data (for tests and diagnostics).
    #[cfg(test)]
    pub fn snapshot(&self) -> (u64, Vec<u8>) {
        match &*self.state() {
            State::Pending {
                version,
                source: Source::Bytes(bytes),
            } => (*version, bytes.clone()),
            State::Pending {
                version,
                source: Source::File(file),
            } => {
                use std::io::{Read, Seek};
                let mut file = file;
                let mut bytes = Vec::new();
                file.rewind().expect("rewind");
                file.read_to_end(&mut bytes).expect("read");
                (*version, bytes)
            }
            State::Shared { shared, .. } => (
                shared.version().unwrap_or(FIRST_VERSION),
                shared.read(0, shared.data_len()).expect("whole data"),
            ),
        }
    }
}

impl<T: Transport> fmt::Debug for Region<T> {
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
/// catalogue); add regions before or while the server runs. Over the transport `T`
/// that the server runs on: [`ReadRegions::new`] for verbs, `ReadRegions::default()`
/// for any.
pub struct ReadRegions<T: Transport = Verbs> {
    regions: Arc<RwLock<HashMap<String, Arc<Region<T>>>>>,
}

impl<T: Transport> Clone for ReadRegions<T> {
    fn clone(&self) -> Self {
        ReadRegions {
            regions: self.regions.clone(),
        }
    }
}

impl<T: Transport> Default for ReadRegions<T> {
    fn default() -> Self {
        ReadRegions {
            regions: Arc::default(),
        }
    }
}

impl<T: Transport> fmt::Debug for ReadRegions<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadRegions")
            .field("names", &self.names())
            .finish()
    }
}

impl ReadRegions {
    /// An empty catalogue, for a verbs server (the concrete type keeps `new()` free of
    /// type annotations, as `HashMap::new` is; `default()` serves any transport).
    pub fn new() -> Self {
        Self::default()
    }
}

impl<T: Transport> ReadRegions<T> {
    fn insert(&self, region: Region<T>) -> Result<Arc<Region<T>>, RegionError<T::Error>> {
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
    /// The region keeps [`DEFAULT_COPIES`] copies of its data; see
    /// [`add_buffer_with_copies`](Self::add_buffer_with_copies).
    ///
    /// # Errors
    /// [`RegionError::Duplicate`].
    pub fn add_buffer(
        &self,
        name: impl Into<String>,
        initial: Vec<u8>,
    ) -> Result<RegionWriter<T>, RegionError<T::Error>> {
        self.add_buffer_with_copies(name, initial, DEFAULT_COPIES)
    }

    /// [`add_buffer`](Self::add_buffer), keeping `copies` copies of the data in the one
    /// registration all connections read (at least 1). Each update writes the next copy,
    /// so a client's versioned read succeeds as long as fewer than `copies` updates happen
    /// during its three READs; with one copy any update in between makes it retry.
    /// Choose `copies` above (update rate × READ round trip × 3); memory is `copies ×
    /// len`, once per server.
    ///
    /// # Errors
    /// [`RegionError::Duplicate`].
    pub fn add_buffer_with_copies(
        &self,
        name: impl Into<String>,
        initial: Vec<u8>,
        copies: usize,
    ) -> Result<RegionWriter<T>, RegionError<T::Error>> {
        let len = initial.len();
        let mut region = Region::new(name.into(), true, len, Source::Bytes(initial));
        region.copies = copies.max(1);
        let region = self.insert(region)?;
        Ok(RegionWriter { region })
    }

    /// Serves `bytes` under `name`, never to change (plain READs are consistent).
    ///
    /// # Errors
    /// [`RegionError::Duplicate`].
    pub fn add_static(
        &self,
        name: impl Into<String>,
        bytes: Vec<u8>,
    ) -> Result<(), RegionError<T::Error>> {
        let len = bytes.len();
        self.insert(Region::new(name.into(), false, len, Source::Bytes(bytes)))
            .map(|_| ())
    }

    /// Serves the file at `path` under `name`, read-only: it is opened now (so it may be
    /// unlinked afterwards) and mapped read-only (`PROT_READ`) and registered without
    /// write access on first lookup; no copy is made. The file must not shrink while it
    /// is served, and it is served as a static region (writes to it may or may not show;
    /// readers have no version to check them against).
    ///
    /// # Errors
    /// [`RegionError::Load`], [`RegionError::Duplicate`].
    pub fn add_file(
        &self,
        name: impl Into<String>,
        path: impl AsRef<Path>,
    ) -> Result<(), RegionError<T::Error>> {
        let path = path.as_ref();
        let load = |source| RegionError::Load {
            path: path.display().to_string(),
            source,
        };
        let file = File::open(path).map_err(load)?;
        let len = file.metadata().map_err(load)?.len();
        let len = usize::try_from(len).map_err(|_| {
            load(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                "larger than the address space",
            ))
        })?;
        if len == 0 {
            // Nothing to map: an empty static region.
            return self.add_static(name, Vec::new());
        }
        self.insert(Region::new(name.into(), false, len, Source::File(file)))
            .map(|_| ())
    }

    /// A writer for the mutable region `name`; `None` for unknown or static regions.
    pub fn writer(&self, name: &str) -> Option<RegionWriter<T>> {
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

    /// Registers every region added so far on `domain` (the server's:
    /// [`Server::protection_domain`](rdmactor::runtime::Server::protection_domain); if
    /// the server's device goes and comes back, [`ReadService`](super::ReadService)
    /// registers them again on the new one), from the calling thread. Without it a region is registered when a client first looks it
    /// up, on the poller thread that also runs every other connection's actor: pinning a
    /// large file or buffer there stalls them all for as long as it takes. Regions added
    /// later are registered on first use as before.
    ///
    /// # Errors
    /// [`RegionError::Register`] for the first region whose registration fails.
    pub fn register_all(&self, domain: &T::Domain) -> Result<(), RegionError<T::Error>> {
        for region in self.all() {
            region.shared(domain)?;
        }
        Ok(())
    }

    /// Every region now, taken out of the lock: registering or releasing one is a
    /// system call, not to be made while writers wait.
    fn all(&self) -> Vec<Arc<Region<T>>> {
        self.regions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// Drops every region's registration (the server's device went: a registration
    /// keeps the device open), keeping the bytes and versions. The names of the regions
    /// that were registered, to register them again on the next device.
    pub(crate) fn release_all(&self) -> Vec<String> {
        self.all()
            .into_iter()
            .filter(|r| r.release())
            .map(|r| r.name.clone())
            .collect()
    }

    pub(crate) fn get(&self, name: &str) -> Option<Arc<Region<T>>> {
        self.regions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }
}

/// Updates one mutable region. Cheap to clone, usable from any thread while sessions
/// serve the region; each update bumps the version by 2.
pub struct RegionWriter<T: Transport = Verbs> {
    region: Arc<Region<T>>,
}

impl<T: Transport> Clone for RegionWriter<T> {
    fn clone(&self) -> Self {
        RegionWriter {
            region: self.region.clone(),
        }
    }
}

impl<T: Transport> fmt::Debug for RegionWriter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RegionWriter").field(&self.region).finish()
    }
}

impl<T: Transport> RegionWriter<T> {
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
    /// returns that version. Once the region is registered, `f` writes the registered
    /// memory itself, inside a seqlock write (version odd, `f`, version even): clients
    /// reading meanwhile with [`read_consistent`](super::read_consistent) retry instead
    /// of seeing a mix. Concurrent updates take turns.
    pub fn update(&self, f: impl FnOnce(u64, &mut [u8])) -> u64 {
        match &mut *self.region.state() {
            State::Pending {
                version,
                source: Source::Bytes(bytes),
            } => {
                // Our own version count: 2^63 updates do not happen.
                *version = version.wrapping_add(2);
                f(*version, bytes);
                *version
            }
            State::Shared { shared, .. } => shared
                .update(f)
                .expect("a mutable region is versioned, writable memory"),
            State::Pending {
                source: Source::File(_),
                ..
            } => unreachable!("writers exist for mutable regions only, never files"),
        }
    }

    /// Overwrites `data.len()` bytes at `offset`; returns the new version.
    ///
    /// # Errors
    /// [`RegionError::OutOfRange`] (nothing is written).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<u64, RegionError<T::Error>> {
        let region_len = self.len();
        let Some(end) = offset
            .checked_add(data.len())
            .filter(|&end| end <= region_len)
        else {
            return Err(RegionError::OutOfRange {
                offset,
                len: data.len(),
                region_len,
            });
        };
        Ok(self.update(|_, bytes| bytes[offset..end].copy_from_slice(data)))
    }
}
