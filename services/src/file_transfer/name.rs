//! File-name validation. A transfer names one file directly inside the configured
//! directory; anything that could name another place, or a file the store uses for
//! itself, is refused before the name reaches the file system.

/// Longest name accepted, in bytes (the usual `NAME_MAX`).
pub const MAX_NAME_LEN: usize = 255;

/// Marks the store's temporary files; names containing it are refused so a peer can
/// neither fetch nor clobber a transfer in progress.
pub(crate) const TEMP_MARKER: &str = ".rdmactor-tmp-";

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The empty string.
    #[error("empty file name")]
    Empty,
    /// More than [`MAX_NAME_LEN`] bytes.
    #[error("file name of {0} bytes, more than {MAX_NAME_LEN}")]
    TooLong(usize),
    /// Contains `/` or `\` (so also every absolute path).
    #[error("file name contains a path separator")]
    Separator,
    /// Is `.` or contains `..`.
    #[error("file name is or contains a dot-dot or dot component")]
    Dots,
    /// Contains NUL.
    #[error("file name contains NUL")]
    Nul,
    /// Contains another control character (newline, escape, DEL, ...).
    #[error("file name contains a control character")]
    Control,
    /// Looks like one of the store's temporary files.
    #[error("file name is reserved for temporary files")]
    Reserved,
    /// Starts with `.`: such names belong to the store (its temporary files are
    /// `.NAME.rdmactor-tmp-*`), so no upload can ever share a name with one, and
    /// `sweep_temp_files` can never remove a client's file.
    #[error("file name starts with '.', which the server keeps for its temporary files")]
    Hidden,
}

/// Returns `name` if it is a plain file name: not empty, at most [`MAX_NAME_LEN`]
/// bytes, no `/` or `\` (so never absolute), not `.`, no `..` anywhere, no NUL or
/// other control character, not in the store's temporary-file pattern, and not
/// starting with `.` (the store's own names).
///
/// # Errors
///
/// The first rule `name` breaks, in the order above.
pub fn validate_name(name: &str) -> Result<&str, NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong(name.len()));
    }
    if name.contains(['/', '\\']) {
        return Err(NameError::Separator);
    }
    if name == "." || name.contains("..") {
        return Err(NameError::Dots);
    }
    if name.contains('\0') {
        return Err(NameError::Nul);
    }
    if name.chars().any(char::is_control) {
        return Err(NameError::Control);
    }
    if name.contains(TEMP_MARKER) {
        return Err(NameError::Reserved);
    }
    if name.starts_with('.') {
        return Err(NameError::Hidden);
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_pass() {
        for n in ["a", "file.txt", "with space", "ünïcode-名前", "a.b.c"] {
            assert_eq!(validate_name(n), Ok(n));
        }
        let longest = "x".repeat(MAX_NAME_LEN);
        assert!(validate_name(&longest).is_ok());
    }

    #[test]
    fn path_tricks_are_refused() {
        let cases = [
            ("", NameError::Empty),
            ("/etc/passwd", NameError::Separator),
            ("a/b", NameError::Separator),
            ("..\\x", NameError::Separator),
            ("C:\\x", NameError::Separator),
            ("..", NameError::Dots),
            (".", NameError::Dots),
            ("a..b", NameError::Dots),
            ("a\0b", NameError::Nul),
            ("a\nb", NameError::Control),
            ("a\u{7f}", NameError::Control),
            (".x.rdmactor-tmp-0011", NameError::Reserved),
            (".hidden", NameError::Hidden),
            (".a", NameError::Hidden),
        ];
        for (name, err) in cases {
            assert_eq!(validate_name(name), Err(err), "{name:?}");
        }
        assert_eq!(
            validate_name(&"é".repeat(128)),
            Err(NameError::TooLong(256))
        );
    }
}
