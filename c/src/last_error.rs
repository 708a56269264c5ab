//! The message of the last failed call on each thread (`rdmactor_last_error`).
//!
//! Thread-local, as errno is: a C caller reads it right after the call that failed,
//! on the same thread, with no lock and nothing to free.

use std::cell::RefCell;
use std::ffi::{c_char, CString};

use crate::status::Failure;

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Keeps `failure`'s message for this thread. Interior NULs (from a peer's close
/// reason, say) are dropped rather than truncating the text there.
pub(crate) fn set(failure: &Failure) {
    let bytes: Vec<u8> = failure.message.bytes().filter(|&b| b != 0).collect();
    let text = CString::new(bytes).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = text);
}

/// The message, as a pointer that stays valid until the next failed call on this
/// thread replaces it (the thread's own storage holds it).
pub(crate) fn as_ptr() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}
