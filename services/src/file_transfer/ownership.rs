//! Which identity owns a stored file, kept with the file itself: an extended attribute,
//! `user.rdmactor.owner`, set on the temporary file before it takes its final name. The
//! owner thus arrives with the bytes in the one `link`/`rename` that makes them visible,
//! holds across connections and restarts, and reaches another server with every copy
//! that carries it. Files stored by anonymous connections have no owner: only the
//! connection that stored them (or anyone, with `--files-public-fetch`) may fetch them.
//!
//! Needs a file system with user extended attributes (ext4, xfs, btrfs, tmpfs from
//! Linux 6.6). Where they are missing, an authenticated upload is refused with the
//! reason rather than stored without an owner nobody could then prove.

use std::io;
use std::os::fd::AsFd;
use std::path::Path;

use rdmactor::runtime::MAX_IDENTITY;

/// The attribute's name.
pub const OWNER_ATTR: &str = "user.rdmactor.owner";

/// Records `identity` as the owner of the open file `fd`.
///
/// # Errors
///
/// The call's error (`ENOTSUP`: no user attributes on this file system).
pub fn set_owner(fd: impl AsFd, identity: &str) -> io::Result<()> {
    rustix::fs::fsetxattr(
        fd,
        OWNER_ATTR,
        identity.as_bytes(),
        rustix::fs::XattrFlags::empty(),
    )
    .map_err(io::Error::from)
}

/// The owner of the open file `fd`: `None` when it has none (stored anonymously, or by
/// hand), or when the file system keeps no attributes.
///
/// # Errors
///
/// Any other failure of the call, or an attribute that is no identity name.
pub fn owner_of(fd: impl AsFd) -> io::Result<Option<String>> {
    let mut buf = [0u8; MAX_IDENTITY];
    decode(rustix::fs::fgetxattr(fd, OWNER_ATTR, &mut buf[..]), &buf)
}

/// The owner of the file at `path` (not following a final symlink), as [`owner_of`].
///
/// # Errors
///
/// As [`owner_of`].
pub fn owner_at(path: &Path) -> io::Result<Option<String>> {
    let mut buf = [0u8; MAX_IDENTITY];
    decode(rustix::fs::lgetxattr(path, OWNER_ATTR, &mut buf[..]), &buf)
}

fn decode(got: rustix::io::Result<usize>, buf: &[u8]) -> io::Result<Option<String>> {
    use rustix::io::Errno;
    match got {
        Ok(len) => {
            let bytes = buf.get(..len).unwrap_or_default();
            match std::str::from_utf8(bytes) {
                Ok(s) if rdmactor::runtime::valid_identity(s) => Ok(Some(s.to_owned())),
                _ => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{OWNER_ATTR} holds no identity name"),
                )),
            }
        }
        Err(Errno::NODATA | Errno::NOTSUP | Errno::NOENT) => Ok(None),
        // Longer than any identity: not one of ours.
        Err(Errno::RANGE) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{OWNER_ATTR} is longer than an identity"),
        )),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_set_on_the_file_is_read_back_by_handle_and_by_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = std::fs::File::create(&path).unwrap();
        assert_eq!(owner_of(&file).unwrap(), None);
        set_owner(&file, "alice").unwrap();
        assert_eq!(owner_of(&file).unwrap().as_deref(), Some("alice"));
        assert_eq!(owner_at(&path).unwrap().as_deref(), Some("alice"));
        // The owner travels with the inode through a rename.
        let moved = dir.path().join("g");
        std::fs::rename(&path, &moved).unwrap();
        assert_eq!(owner_at(&moved).unwrap().as_deref(), Some("alice"));
        assert_eq!(owner_at(&dir.path().join("missing")).unwrap(), None);
    }

    #[test]
    fn an_attribute_that_is_no_identity_is_an_error_not_an_owner() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::File::create(dir.path().join("f")).unwrap();
        rustix::fs::fsetxattr(&file, OWNER_ATTR, b"a b", rustix::fs::XattrFlags::empty()).unwrap();
        assert!(owner_of(&file).is_err());
        let long = vec![b'a'; MAX_IDENTITY + 1];
        rustix::fs::fsetxattr(&file, OWNER_ATTR, &long, rustix::fs::XattrFlags::empty()).unwrap();
        assert!(owner_of(&file).is_err());
    }
}
