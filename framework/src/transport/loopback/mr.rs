//! Memory regions and memory windows of the loopback transport.
//!
//! A region owns its bytes (`memory.rs`): a queued request holds them by `Arc`, so no
//! request can outlive the memory it names, whatever the application drops. Dropping
//! the last piece of a registration deregisters it: its key stops opening it at once,
//! and requests still naming it fail with a protection error, as on a NIC.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;

use super::core::DeviceCore;
use super::error::{LoopbackError, Result};
use super::memory::{Slice, Storage};
use crate::verbs::{Access, RemoteRegion};

pub(super) struct Registration {
    pub(super) storage: Arc<Storage>,
    device: Arc<DeviceCore>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.storage.retire();
        self.device.keys.remove(self.storage.key);
    }
}

/// Registered memory on a loopback device; the pieces of a split share the
/// registration, which goes with the last of them.
pub struct Mr {
    pub(super) reg: Arc<Registration>,
    offset: usize,
    len: usize,
}

impl Mr {
    /// The device it was registered on.
    pub(super) fn device_core(&self) -> &Arc<DeviceCore> {
        &self.reg.device
    }

    /// Registers `len` zeroed bytes on `device` (remote write or atomics imply local
    /// write, as the verbs wrapper does).
    pub(super) fn register(device: &Arc<DeviceCore>, len: usize, access: Access) -> Result<Mr> {
        Mr::register_filled(device, len, access, None)
    }

    /// Registers a copy of `bytes`, made in one pass: a message offered for the peer's
    /// READ (`Domain::register_vec`), whose registration the pool's default (zeroed
    /// bytes, then the copy written over them) paid for twice.
    pub(super) fn register_bytes(
        device: &Arc<DeviceCore>,
        bytes: &[u8],
        access: Access,
    ) -> Result<Mr> {
        Mr::register_filled(device, bytes.len(), access, Some(bytes))
    }

    fn register_filled(
        device: &Arc<DeviceCore>,
        len: usize,
        access: Access,
        bytes: Option<&[u8]>,
    ) -> Result<Mr> {
        if device.removed.load(Relaxed) {
            return Err(LoopbackError::DeviceRemoved(device.name.clone()));
        }
        if device.refuse_registrations.load(Relaxed) {
            return Err(LoopbackError::RegistrationRefused { len });
        }
        if len == 0 {
            return Err(LoopbackError::InvalidArgument(
                "cannot register an empty region".into(),
            ));
        }
        let mut access = access;
        if access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC) {
            access |= Access::LOCAL_WRITE;
        }
        let base = device.next_addr(len);
        let storage = device.keys.insert_region(|key| match bytes {
            Some(bytes) => Storage::from_bytes(bytes, base, access, key),
            None => Storage::new(len, base, access, key),
        });
        Ok(Mr {
            reg: Arc::new(Registration {
                storage,
                device: device.clone(),
            }),
            offset: 0,
            len,
        })
    }

    fn storage(&self) -> &Storage {
        &self.reg.storage
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty piece (never produced by registering).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The access of the registration.
    pub fn access(&self) -> Access {
        self.storage().access
    }

    /// The local key (loopback's lkey and rkey are one key, as on many NICs).
    pub fn lkey(&self) -> u32 {
        self.storage().key
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.storage().key
    }

    /// The address of the first byte, as work requests name it.
    pub fn addr(&self) -> u64 {
        self.storage().base + self.offset as u64
    }

    /// What a peer needs to reach this whole piece.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.addr(),
            len: self.len as u64,
            rkey: self.rkey(),
        }
    }

    /// A scatter/gather entry over `range` of this piece.
    pub fn sge(&self, range: Range<usize>) -> Result<Sge<'_>> {
        if range.start > range.end || range.end > self.len {
            return Err(LoopbackError::InvalidArgument(format!(
                "local range {range:?} outside a region of {} bytes",
                self.len
            )));
        }
        if u32::try_from(range.len()).is_err() {
            return Err(LoopbackError::InvalidArgument(
                "a scatter/gather entry is at most 4 GiB".into(),
            ));
        }
        Ok(Sge {
            mr: self,
            offset: range.start,
            len: range.len(),
        })
    }

    /// A scatter/gather entry over the whole piece.
    pub fn sge_all(&self) -> Sge<'_> {
        Sge {
            mr: self,
            offset: 0,
            len: self.len.min(u32::MAX as usize),
        }
    }

    /// Splits into consecutive disjoint pieces of `chunk` bytes (the last may be
    /// shorter); each shares the registration and its keys.
    pub fn split(self, chunk: usize) -> Vec<Mr> {
        let chunk = chunk.max(1);
        (0..self.len)
            .step_by(chunk)
            .map(|start| Mr {
                reg: self.reg.clone(),
                offset: self.offset + start,
                len: chunk.min(self.len - start),
            })
            .collect()
    }

    fn check(&self, offset: usize, len: usize) -> Result<usize> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.offset + offset),
            _ => Err(LoopbackError::InvalidArgument(format!(
                "bytes {offset}+{len} outside a region of {} bytes",
                self.len
            ))),
        }
    }

    /// Copies bytes from `offset` of this piece into `out`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let at = self.check(offset, out.len())?;
        self.storage().read(at, out);
        Ok(())
    }

    /// Copies `data` into this piece at `offset`.
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        let at = self.check(offset, data.len())?;
        self.storage().write(at, data);
        Ok(())
    }
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("key", &self.lkey())
            .field("access", &self.access())
            .finish()
    }
}

/// A checked range of a loopback region, borrowed for the post call (the queued request
/// then holds the bytes itself).
#[derive(Clone, Copy)]
pub struct Sge<'a> {
    mr: &'a Mr,
    offset: usize,
    len: usize,
}

impl Sge<'_> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What a queued request keeps of it.
    pub(super) fn slice(&self) -> Slice {
        Slice {
            storage: self.mr.reg.storage.clone(),
            offset: self.mr.offset + self.offset,
            len: self.len,
        }
    }

    /// The bytes of an inline request, copied at post time.
    pub(super) fn read_into(&self, out: &mut [u8]) {
        self.mr
            .reg
            .storage
            .read(self.mr.offset + self.offset, &mut out[..self.len]);
    }
}

impl std::fmt::Debug for Sge<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sge")
            .field(
                "addr",
                &format_args!("{:#x}", self.mr.addr() + self.offset as u64),
            )
            .field("len", &self.len)
            .finish()
    }
}

/// A memory window (type 2): remote access to one region for the peer of one QP. Bind
/// it with `Qp::bind_window`; dropping it revokes it, and so does binding it again
/// (the rkey changes).
pub struct Mw {
    pub(super) device: Arc<DeviceCore>,
    /// The key of its latest bind (the slot stays the window's).
    pub(super) key: AtomicU32,
}

impl Mw {
    pub(super) fn alloc(device: &Arc<DeviceCore>) -> Result<Mw> {
        if device.removed.load(Relaxed) {
            return Err(LoopbackError::DeviceRemoved(device.name.clone()));
        }
        Ok(Mw {
            device: device.clone(),
            key: AtomicU32::new(device.keys.insert_window()),
        })
    }

    /// The rkey of its latest bind (the next bind gives a new one).
    pub fn rkey(&self) -> u32 {
        self.key.load(Relaxed)
    }

    /// The rkey its next bind gives: the low byte bumped, as a NIC's type 2 windows do,
    /// so rkeys from earlier binds stop working.
    pub fn next_rkey(&self) -> u32 {
        let key = self.rkey();
        (key & !0xff) | (key.wrapping_add(1) & 0xff)
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        self.device.keys.remove(self.rkey());
    }
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw").field("rkey", &self.rkey()).finish()
    }
}
