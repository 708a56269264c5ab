//! Where received files go, without ever losing one: bytes are written to a temporary
//! file in the destination directory (`.NAME.rdmactor-tmp-XXXXXXXXXXXXXXXX`), fsynced,
//! and only then given the final name, after which the directory is fsynced too. A
//! [`TempFile`] that is dropped without [`commit`](TempFile::commit) (BAD, abort, a
//! connection that died) removes its temporary file: at once, or on a [`Reaper`]'s
//! thread if it was given one, so that a slow disk does not stall the thread that drops
//! it (the server's poller). A file whose hash did not match is
//! [abandoned](TempFile::abandon) instead: its `commit` removes it, so the driver that
//! runs commits off the poller removes it too, before the verdict goes out.
//!
//! Without `overwrite`, the final name is created with `link(2)`, which fails if the
//! name exists, so a file that appeared during the transfer is never replaced. With
//! `overwrite`, `rename(2)` replaces the old file atomically: readers see the old or
//! the new content, never a mix.

use std::collections::hash_map::RandomState;
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, Hasher as _};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{SystemTime, UNIX_EPOCH};

use super::file_key::FileKey;
use super::name::{validate_name, NameError, MAX_NAME_LEN, TEMP_MARKER};

/// How often [`TempFile::create`] retries when a random name is taken.
const NAME_ATTEMPTS: usize = 16;

/// Why storing or serving a file failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The name is not a plain file name.
    #[error(transparent)]
    Name(#[from] NameError),
    /// A file of that name exists and overwriting was not asked for.
    #[error("{} exists", .0.display())]
    Exists(PathBuf),
    /// No regular file of that name (missing, a directory, a symlink, ...).
    #[error("{} is not a regular file", .0.display())]
    NotFound(PathBuf),
    /// The file was [abandoned](TempFile::abandon): `commit` removed it.
    #[error("{} abandoned", .0.display())]
    Abandoned(PathBuf),
    /// The file system has not enough free space for the file (checked with `statvfs`
    /// before creating it, or `fallocate` refused the reservation).
    #[error("no space for {needed} bytes in {} ({available} bytes free)", path.display())]
    NoSpace {
        /// The directory or temporary file.
        path: PathBuf,
        /// Bytes the file needs.
        needed: u64,
        /// Bytes free for it.
        available: u64,
    },
    /// The file was stored, but its [`Recorder`](super::Recorder) refused it (a new
    /// file is removed again).
    #[error("{name} not recorded: {why}")]
    NotRecorded {
        /// The file.
        name: String,
        /// The recorder's reason.
        why: String,
    },
    /// A file-system call failed.
    #[error("{op} {} failed: {source}", path.display())]
    Io {
        /// The call (`"create"`, `"write"`, `"fsync"`, `"rename"`, ...).
        op: &'static str,
        /// The path it was given.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl StoreError {
    /// True when the file system ran out of space (`ENOSPC` from a write, a failed
    /// reservation, or not enough free space for an offer): a reason the peer is told
    /// as such rather than as an I/O error.
    pub fn is_no_space(&self) -> bool {
        match self {
            StoreError::NoSpace { .. } => true,
            StoreError::Io { source, .. } => {
                source.kind() == io::ErrorKind::StorageFull
                    || source.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error())
            }
            _ => false,
        }
    }
}

/// Bytes an unprivileged writer may still allocate in the file system holding `dir`
/// (`statvfs`: available blocks times the fragment size).
///
/// # Errors
///
/// `statvfs` failed.
pub fn free_space(dir: &Path) -> Result<u64, StoreError> {
    let st = rustix::fs::statvfs(dir).map_err(|e| io_err("statvfs", dir)(e.into()))?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// A file being received: a temporary file next to its final name.
#[derive(Debug)]
pub struct TempFile {
    file: Option<File>,
    dir: PathBuf,
    temp: PathBuf,
    target: PathBuf,
    overwrite: bool,
    written: u64,
    /// The temporary name still exists (until commit or removal).
    temp_exists: bool,
    /// `commit` removes the file instead of naming it.
    abandoned: bool,
    /// Where Drop sends the temporary file to be removed; `None`: removed in Drop.
    reaper: Option<Reaper>,
    /// With `overwrite`: the identity whose file alone may be replaced (see
    /// [`owned_by`](TempFile::owned_by)).
    replaces_only: Option<String>,
}

/// A thread that closes and removes abandoned temporary files, so that whoever drops a
/// [`TempFile`] does not wait for the disk ([`TempFile::set_reaper`]). Cloning shares
/// the thread; it ends when the last clone and the last file handed to it are gone.
#[derive(Debug, Clone)]
pub struct Reaper {
    tx: mpsc::Sender<(Option<File>, PathBuf)>,
}

impl Reaper {
    /// Starts the thread.
    ///
    /// # Errors
    ///
    /// The thread cannot be spawned.
    pub fn start() -> io::Result<Reaper> {
        let (tx, rx) = mpsc::channel::<(Option<File>, PathBuf)>();
        thread::Builder::new()
            .name("files-reaper".into())
            .spawn(move || {
                for (file, path) in rx {
                    drop(file);
                    remove_temp(&path);
                }
            })?;
        Ok(Reaper { tx })
    }
}

fn remove_temp(path: &Path) {
    if let Err(e) = fs::remove_file(path) {
        tracing::warn!(path = %path.display(), error = %e, "cannot remove temporary file");
    }
}

impl TempFile {
    /// Creates the temporary file for `name` in `dir`. Without `overwrite`, fails with
    /// [`StoreError::Exists`] if `name` already exists (the final check is in
    /// [`commit`](Self::commit)).
    ///
    /// # Errors
    ///
    /// A bad name, an existing target, or the file system's error.
    pub fn create(dir: &Path, name: &str, overwrite: bool) -> Result<TempFile, StoreError> {
        let name = validate_name(name)?;
        let target = dir.join(name);
        if !overwrite && fs::symlink_metadata(&target).is_ok() {
            return Err(StoreError::Exists(target));
        }
        let mut attempt = 0;
        let (file, temp) = loop {
            let temp = dir.join(temp_name(name));
            match OpenOptions::new().write(true).create_new(true).open(&temp) {
                Ok(f) => break (f, temp),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < NAME_ATTEMPTS => {
                    attempt += 1;
                }
                Err(e) => return Err(io_err("create", &temp)(e)),
            }
        };
        Ok(TempFile {
            file: Some(file),
            dir: dir.to_owned(),
            temp,
            target,
            overwrite,
            written: 0,
            temp_exists: true,
            abandoned: false,
            reaper: None,
            replaces_only: None,
        })
    }

    /// Makes `identity` the file's owner (see `ownership.rs`), set on the temporary file
    /// so that it arrives with the bytes. With `only_own`, an overwrite replaces only a
    /// file `identity` owns: another's is [`StoreError::Exists`], now and again at
    /// [`commit`](Self::commit).
    ///
    /// # Errors
    ///
    /// [`StoreError::Exists`] for another's file, or the failing call (a file system
    /// without user extended attributes fails here, before any byte is sent).
    pub fn owned_by(&mut self, identity: &str, only_own: bool) -> Result<(), StoreError> {
        let file = self.file.as_ref().expect("open until commit");
        super::ownership::set_owner(file, identity).map_err(io_err("setxattr", &self.temp))?;
        if self.overwrite && only_own {
            self.replaces_only = Some(identity.to_owned());
            self.check_replaceable()?;
        }
        Ok(())
    }

    /// An overwrite limited to its owner's files: the file under the final name, if
    /// any, is that owner's.
    fn check_replaceable(&self) -> Result<(), StoreError> {
        let Some(who) = &self.replaces_only else {
            return Ok(());
        };
        if fs::symlink_metadata(&self.target).is_err() {
            return Ok(());
        }
        match super::ownership::owner_at(&self.target) {
            Ok(Some(owner)) if owner == *who => Ok(()),
            Ok(_) => Err(StoreError::Exists(self.target.clone())),
            Err(e) => Err(io_err("getxattr", &self.target)(e)),
        }
    }

    /// Reserves `len` bytes of disk for this file with `fallocate(FALLOC_FL_KEEP_SIZE)`,
    /// so that writes cannot run out of space later (another upload, or anyone else,
    /// filling the disk meanwhile): the file keeps its size, only blocks are allocated.
    /// Returns `false` when the file system cannot reserve (no `fallocate`, as on
    /// some network and FUSE file systems): the free-space check made before is then
    /// all there is, and a write may still meet `ENOSPC`.
    ///
    /// # Errors
    ///
    /// [`StoreError::NoSpace`] when the space is not there, or the call's error.
    pub fn reserve(&mut self, len: u64) -> Result<bool, StoreError> {
        use rustix::io::Errno;
        if len == 0 {
            return Ok(true);
        }
        let file = self.file.as_ref().expect("open until commit");
        match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::KEEP_SIZE, 0, len) {
            Ok(()) => Ok(true),
            Err(Errno::OPNOTSUPP | Errno::NOSYS) => Ok(false),
            Err(Errno::NOSPC | Errno::FBIG) => Err(StoreError::NoSpace {
                path: self.temp.clone(),
                needed: len,
                available: free_space(&self.dir).unwrap_or(0),
            }),
            Err(e) => Err(io_err("fallocate", &self.temp)(e.into())),
        }
    }

    /// From now on, dropping this file without a commit hands its removal to `reaper`.
    pub fn set_reaper(&mut self, reaper: Reaper) {
        self.reaper = Some(reaper);
    }

    /// Marks the file as not to be kept: [`commit`](Self::commit) then removes it and
    /// returns [`StoreError::Abandoned`].
    pub fn abandon(&mut self) {
        self.abandoned = true;
    }

    /// Whether [`abandon`](Self::abandon) was called.
    pub fn is_abandoned(&self) -> bool {
        self.abandoned
    }

    /// Appends bytes.
    ///
    /// # Errors
    ///
    /// The write failed (disk full, I/O error).
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        let file = self.file.as_mut().expect("open until commit");
        file.write_all(bytes).map_err(io_err("write", &self.temp))?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The temporary file's path.
    pub fn temp_path(&self) -> &Path {
        &self.temp
    }

    /// The name the file gets on commit.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Makes the file durable and gives it its final name: fsync the file, link or
    /// rename it into place, fsync the directory. On error the temporary file is
    /// removed and nothing exists under the final name that was not there before.
    ///
    /// # Errors
    ///
    /// [`StoreError::Exists`] if the name appeared meanwhile (without overwrite),
    /// [`StoreError::Abandoned`] (after removing it) for an abandoned file, or the
    /// failing file-system call.
    pub fn commit(self) -> Result<PathBuf, StoreError> {
        self.commit_identified().map(|(path, _)| path)
    }

    /// [`commit`](Self::commit), and the [`FileKey`] of the file now under the final
    /// name, for remembering its digest (see [`DigestCache`](super::DigestCache)):
    /// `None` when it cannot be told that the name still holds the bytes written (it
    /// was replaced or written to since, or `fstat` failed). The key is taken after the
    /// link or rename, which change the file's ctime, from a fresh open of the final
    /// name, as a fetch will see it; the file written stays open until then, so its
    /// inode number cannot go to another file meanwhile.
    ///
    /// # Errors
    ///
    /// As [`commit`](Self::commit).
    pub fn commit_identified(mut self) -> Result<(PathBuf, Option<FileKey>), StoreError> {
        if self.abandoned {
            self.file.take();
            if self.temp_exists {
                // On error Drop tries again.
                fs::remove_file(&self.temp).map_err(io_err("remove", &self.temp))?;
                self.temp_exists = false;
            }
            return Err(StoreError::Abandoned(self.temp.clone()));
        }
        let file = self.file.take().expect("open until commit");
        file.sync_all().map_err(io_err("fsync", &self.temp))?;
        let written = file.metadata().ok().map(|m| FileKey::of(&m));
        if self.overwrite {
            self.check_replaceable()?;
            fs::rename(&self.temp, &self.target).map_err(io_err("rename", &self.target))?;
            self.temp_exists = false;
        } else {
            self.link_new()?;
        }
        sync_dir(&self.dir)?;
        let key = written.and_then(|w| self.identify(w));
        drop(file);
        Ok((self.target.clone(), key))
    }

    /// The key of the file under the final name, if it is the file written (same
    /// inode) and unchanged (same length and mtime).
    fn identify(&self, written: FileKey) -> Option<FileKey> {
        let meta = File::open(&self.target).and_then(|f| f.metadata()).ok()?;
        let now = FileKey::of(&meta);
        let same = (now.dev, now.ino, now.len, now.mtime_ns)
            == (written.dev, written.ino, written.len, written.mtime_ns);
        same.then_some(now)
    }

    /// Gives the temporary file its final name only if that name is free.
    fn link_new(&mut self) -> Result<(), StoreError> {
        match fs::hard_link(&self.temp, &self.target) {
            Ok(()) => {
                // The data is safe under its final name; dropping the extra name is
                // cleanup, and Drop retries it if this fails.
                if fs::remove_file(&self.temp).is_ok() {
                    self.temp_exists = false;
                }
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Err(StoreError::Exists(self.target.clone()))
            }
            Err(_) => {
                // No hard links on this file system: check, then rename (a racing
                // creator could be replaced here, which link() above rules out).
                if fs::symlink_metadata(&self.target).is_ok() {
                    return Err(StoreError::Exists(self.target.clone()));
                }
                fs::rename(&self.temp, &self.target).map_err(io_err("rename", &self.target))?;
                self.temp_exists = false;
                Ok(())
            }
        }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let file = self.file.take();
        if !self.temp_exists {
            return;
        }
        if let Some(reaper) = &self.reaper {
            match reaper.tx.send((file, self.temp.clone())) {
                Ok(()) => return,
                // The thread is gone: remove it here.
                Err(mpsc::SendError((file, _))) => drop(file),
            }
        }
        remove_temp(&self.temp);
    }
}

/// Opens a file to serve: `name` must be a plain name of a regular file (not a symlink)
/// directly in `dir`. Returns the file and its length.
///
/// # Errors
///
/// A bad name, [`StoreError::NotFound`], or the failing call.
pub fn open_source(dir: &Path, name: &str) -> Result<(File, u64), StoreError> {
    let name = validate_name(name)?;
    let path = dir.join(name);
    match fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_file() => {}
        Ok(_) => return Err(StoreError::NotFound(path)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(StoreError::NotFound(path)),
        Err(e) => return Err(io_err("stat", &path)(e)),
    }
    let file = File::open(&path).map_err(io_err("open", &path))?;
    let meta = file.metadata().map_err(io_err("stat", &path))?;
    if !meta.is_file() {
        return Err(StoreError::NotFound(path));
    }
    Ok((file, meta.len()))
}

/// Removes the temporary files a crashed server left in `dir` (regular files named
/// `.NAME.rdmactor-tmp-*`); a [`TempFile`] removes its own on drop, but nothing runs
/// after a crash or SIGKILL. Call it once before serving, when no transfer can own
/// one. Returns how many were removed.
///
/// # Errors
///
/// `dir` cannot be listed, or a temporary file cannot be removed.
pub fn sweep_temp_files(dir: &Path) -> Result<usize, StoreError> {
    let mut removed = 0;
    for entry in fs::read_dir(dir).map_err(io_err("list", dir))? {
        let entry = entry.map_err(io_err("list", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if is_file && name.starts_with('.') && name.contains(TEMP_MARKER) {
            let path = entry.path();
            fs::remove_file(&path).map_err(io_err("remove", &path))?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Fsyncs a directory, so that names created or renamed in it survive a crash.
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync", dir))
}

/// `.NAME.rdmactor-tmp-XXXXXXXXXXXXXXXX`, with NAME cut (on a character boundary) so
/// the whole stays within [`MAX_NAME_LEN`] bytes.
fn temp_name(name: &str) -> String {
    let suffix = format!("{TEMP_MARKER}{:016x}", random_u64());
    let room = MAX_NAME_LEN - 1 - suffix.len();
    let mut cut = name.len().min(room);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(".{}{suffix}", &name[..cut])
}

/// A random-enough number for temporary names (collisions are retried anyway): the
/// standard library's randomly keyed hasher over the time, the process and a counter.
fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    if let Ok(t) = SystemTime::now().duration_since(UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Every entry of `dir`, sorted.
    pub(crate) fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn commit_puts_the_file_in_place_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = TempFile::create(dir.path(), "out.bin", false).unwrap();
        let temp_name = t
            .temp_path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(
            temp_name.starts_with(".out.bin.rdmactor-tmp-"),
            "{temp_name}"
        );
        t.write_all(b"hello ").unwrap();
        t.write_all(b"world").unwrap();
        assert_eq!(t.written(), 11);
        assert_eq!(entries(dir.path()), vec![temp_name]);
        let p = t.commit().unwrap();
        assert_eq!(p, dir.path().join("out.bin"));
        assert_eq!(fs::read(&p).unwrap(), b"hello world");
        assert_eq!(entries(dir.path()), vec!["out.bin"]);
    }

    #[test]
    fn a_committed_file_is_known_by_the_key_a_fetch_will_see() {
        let dir = tempfile::tempdir().unwrap();
        for overwrite in [false, true] {
            let mut t = TempFile::create(dir.path(), "f", overwrite).unwrap();
            t.write_all(b"stored").unwrap();
            let (path, key) = t.commit_identified().unwrap();
            let seen = FileKey::of(&File::open(&path).unwrap().metadata().unwrap());
            assert_eq!(key, Some(seen), "overwrite: {overwrite}");
            assert_eq!(seen.len, 6);
        }
    }

    /// Security issue item 7: temporary files left by a crash were never removed.
    #[test]
    fn a_sweep_removes_only_leftover_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let t = TempFile::create(dir.path(), "big", false).unwrap();
        std::mem::forget(t); // what a crash leaves
        fs::write(dir.path().join("keep"), b"k").unwrap();
        fs::write(dir.path().join(".keep"), b"k").unwrap();
        fs::create_dir(dir.path().join(".d.rdmactor-tmp-0")).unwrap();
        assert_eq!(entries(dir.path()).len(), 4);
        assert_eq!(sweep_temp_files(dir.path()).unwrap(), 1);
        assert_eq!(
            entries(dir.path()),
            vec![".d.rdmactor-tmp-0", ".keep", "keep"]
        );
    }

    #[test]
    fn drop_removes_the_temp() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = TempFile::create(dir.path(), "x", false).unwrap();
        t.write_all(b"partial").unwrap();
        drop(t);
        assert!(entries(dir.path()).is_empty());
    }

    #[test]
    fn a_reaper_removes_dropped_temps_on_its_own_thread() {
        let dir = tempfile::tempdir().unwrap();
        let reaper = Reaper::start().unwrap();
        let mut t = TempFile::create(dir.path(), "f", false).unwrap();
        t.set_reaper(reaper.clone());
        t.write_all(b"partial").unwrap();
        drop(t);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !entries(dir.path()).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the reaper removes it"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // A committed file is not the reaper's business.
        let mut t = TempFile::create(dir.path(), "g", false).unwrap();
        t.set_reaper(reaper);
        t.write_all(b"whole").unwrap();
        t.commit().unwrap();
        assert_eq!(entries(dir.path()), vec!["g".to_string()]);
    }

    #[test]
    fn an_abandoned_file_is_removed_by_commit_and_never_named() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("f"), b"good").unwrap();
        let mut t = TempFile::create(dir.path(), "f", true).unwrap();
        t.write_all(b"bad").unwrap();
        t.abandon();
        assert!(matches!(t.commit(), Err(StoreError::Abandoned(_))));
        assert_eq!(entries(dir.path()), vec!["f".to_string()]);
        assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"good");
    }

    #[test]
    fn existing_files_are_kept_unless_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, b"old").unwrap();
        assert!(matches!(
            TempFile::create(dir.path(), "f", false),
            Err(StoreError::Exists(_))
        ));
        let mut t = TempFile::create(dir.path(), "f", true).unwrap();
        t.write_all(b"new").unwrap();
        t.commit().unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new");
        assert_eq!(entries(dir.path()), vec!["f"]);
    }

    #[test]
    fn a_file_appearing_during_the_transfer_is_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let mut t = TempFile::create(dir.path(), "f", false).unwrap();
        t.write_all(b"mine").unwrap();
        fs::write(dir.path().join("f"), b"theirs").unwrap();
        assert!(matches!(t.commit(), Err(StoreError::Exists(_))));
        assert_eq!(fs::read(dir.path().join("f")).unwrap(), b"theirs");
        assert_eq!(entries(dir.path()), vec!["f"]);
    }

    #[test]
    fn long_names_get_short_enough_temp_names() {
        let dir = tempfile::tempdir().unwrap();
        let name = "é".repeat(127); // 254 bytes
        let t = TempFile::create(dir.path(), &name, false).unwrap();
        let temp = t.temp_path().file_name().unwrap().len();
        assert!(temp <= MAX_NAME_LEN, "{temp}");
    }

    #[test]
    fn bad_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            TempFile::create(dir.path(), "../x", false),
            Err(StoreError::Name(_))
        ));
        assert!(matches!(
            open_source(dir.path(), "/etc/passwd"),
            Err(StoreError::Name(_))
        ));
    }

    #[test]
    fn only_regular_files_are_served() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("f"), b"abc").unwrap();
        fs::create_dir(dir.path().join("d")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("l")).unwrap();
        assert_eq!(open_source(dir.path(), "f").unwrap().1, 3);
        for n in ["d", "l", "missing"] {
            assert!(
                matches!(open_source(dir.path(), n), Err(StoreError::NotFound(_))),
                "{n}"
            );
        }
    }
}
