//! Reading and writing through the pointers C passes: the only place the library
//! dereferences one. Each function checks what can be checked (NULL, alignment,
//! lengths) and states what it must take on trust, which the header's `# Safety`
//! sections ask of the caller.

use std::ffi::{c_char, CStr};

use crate::status::{Failure, Result};

/// A `const char *` argument that must be given.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays valid and unchanged for
/// `'a` (the entry point's call).
pub(super) unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: not NULL, and NUL-terminated and valid for 'a by this function's contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|e| Failure::invalid(format!("{what} is not UTF-8: {e}")))
}

/// A `const char *` argument that may be NULL (absent).
///
/// # Safety
/// As [`str_arg`].
pub(super) unsafe fn opt_str_arg<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: this function's contract is str_arg's.
    unsafe { str_arg(p, what) }.map(Some)
}

/// `len` bytes at `p`; NULL is allowed when `len` is 0.
///
/// # Safety
/// `p` is NULL or points to `len` readable bytes that stay valid and unchanged for
/// `'a`.
pub(super) unsafe fn bytes_arg<'a>(p: *const u8, len: usize, what: &str) -> Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Failure::invalid(format!(
            "{what} is NULL with a length of {len}"
        )));
    }
    if len > isize::MAX as usize {
        return Err(Failure::invalid(format!(
            "{what}: length {len} is not a length"
        )));
    }
    // SAFETY: not NULL, len within isize::MAX (checked), and `len` readable bytes valid
    // for 'a by this function's contract; u8 has no alignment to respect.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// An out-parameter, checked not NULL and aligned when it is taken, written once.
pub(super) struct Out<T>(*mut T);

/// Takes `p` as an out-parameter.
pub(super) fn out<T>(p: *mut T, what: &str) -> Result<Out<T>> {
    if p.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    if !p.is_aligned() {
        return Err(Failure::invalid(format!(
            "{what} is not aligned for its type"
        )));
    }
    Ok(Out(p))
}

/// An out-parameter that may be NULL (not wanted).
pub(super) fn opt_out<T>(p: *mut T, what: &str) -> Result<Option<Out<T>>> {
    if p.is_null() {
        return Ok(None);
    }
    out(p, what).map(Some)
}

impl<T> Out<T> {
    /// Stores `value`, without reading or dropping what was there (C's memory may be
    /// uninitialised).
    ///
    /// # Safety
    /// The pointer is valid for a write of one `T`.
    pub(super) unsafe fn write(&self, value: T) {
        // SAFETY: not NULL and aligned (checked by `out`), valid for writes by this
        // function's contract.
        unsafe { self.0.write(value) }
    }

    /// Stores `value` at index `i` of the array the pointer starts.
    ///
    /// # Safety
    /// The pointer is valid for writes of at least `i + 1` `T`s.
    pub(super) unsafe fn write_at(&self, i: usize, value: T) {
        // SAFETY: the array holds i + 1 elements by this function's contract, so the
        // offset stays inside it; aligned as its start is (checked by `out`).
        unsafe { self.0.add(i).write(value) }
    }
}

/// Copies `data` to `dst`, which holds `cap` bytes; `data.len()` must not exceed `cap`
/// (the callers check, to answer BUFFER_TOO_SMALL instead).
///
/// # Safety
/// `dst` is valid for writes of `cap` bytes (it may be NULL only if `data` is empty).
pub(super) unsafe fn copy_to(dst: *mut u8, cap: usize, data: &[u8]) -> Result<()> {
    assert!(
        data.len() <= cap,
        "copy_to's callers check the capacity first"
    );
    if data.is_empty() {
        return Ok(());
    }
    if dst.is_null() {
        return Err(Failure::invalid("the buffer is NULL"));
    }
    // SAFETY: `dst` is valid for cap >= data.len() bytes by this function's contract;
    // the source is a Rust slice, so the two cannot overlap.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
    Ok(())
}
