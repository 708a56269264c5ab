//! Device contexts.
//!
//! rdma_cm opens every RDMA device itself and binds each cm_id to one of those contexts;
//! `rdma_create_qp` refuses a PD from any other context. So the context handed out here
//! is librdmacm's own (from `rdma_get_devices`), which lets one PD be shared by every
//! connection that rdma_cm routes to the device.

use std::ffi::CStr;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::sys::*;

use super::error::{check, Result, Verb, VerbsError};

/// An open RDMA device. Cheap to clone; the device stays open while any clone, PD, CQ or
/// other child object exists.
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

struct ContextInner {
    list: NonNull<*mut ibv_context>,
    ctx: NonNull<ibv_context>,
    name: String,
}

// SAFETY: libibverbs contexts are thread-safe (the library locks internally); the list
// pointer is only freed in Drop, once.
unsafe impl Send for ContextInner {}
// SAFETY: as above, every operation on the context is safe to call from several threads.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        // SAFETY: `list` came from rdma_get_devices and is freed exactly once here; the
        // contexts themselves stay owned by librdmacm.
        unsafe { rdma_free_devices(self.list.as_ptr()) };
        OPEN_CONTEXTS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// [`Context`]s alive in this process (every PD, CQ, QP and MR holds one).
static OPEN_CONTEXTS: AtomicUsize = AtomicUsize::new(0);

/// Held around everything that may make librdmacm open a device (`rdma_get_devices`)
/// and around [`release_removed_devices`], so that one never points a descriptor the
/// other just opened at `/dev/null`.
static LISTING: Mutex<()> = Mutex::new(());

/// The device limits a framework needs for sizing queues and rd_atomic depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Maximum number of QPs.
    pub max_qp: u32,
    /// Maximum outstanding work requests per queue.
    pub max_qp_wr: u32,
    /// Maximum scatter/gather entries per work request.
    pub max_sge: u32,
    /// Maximum entries of one CQ.
    pub max_cqe: u32,
    /// Maximum MR size in bytes.
    pub max_mr_size: u64,
    /// RDMA READ / atomic requests a QP can have outstanding as responder.
    pub max_qp_rd_atom: u32,
    /// RDMA READ / atomic requests a QP can have outstanding as initiator.
    pub max_qp_init_rd_atom: u32,
    /// Whether the device supports atomics at all.
    pub atomics: bool,
}

fn device_name(ctx: *mut ibv_context) -> String {
    // SAFETY: `ctx` is a live context from rdma_get_devices; its `device` pointer and the
    // NUL-terminated name it owns live as long as the context.
    unsafe {
        let name = ibv_get_device_name((*ctx).device);
        if name.is_null() {
            String::new()
        } else {
            CStr::from_ptr(name).to_string_lossy().into_owned()
        }
    }
}

fn device_index(ctx: *mut ibv_context) -> Option<u32> {
    // SAFETY: `ctx` is a live context from rdma_get_devices; its `device` pointer lives
    // as long as the context, and ibv_get_device_index only reads it.
    let index = unsafe { ibv_get_device_index((*ctx).device) };
    u32::try_from(index).ok()
}

/// A device as [`Context::listed`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedDevice {
    /// Its name (for example `rxe0`).
    pub name: String,
    /// The kernel's index of it, if the kernel reports one.
    pub index: Option<u32>,
}

fn devices() -> Result<(NonNull<*mut ibv_context>, Vec<NonNull<ibv_context>>)> {
    let _listing = LISTING.lock().unwrap_or_else(|e| e.into_inner());
    let mut n: i32 = 0;
    // SAFETY: `n` is a valid out-pointer; the returned array is NULL-terminated and owned
    // by the caller until rdma_free_devices.
    let list = unsafe { rdma_get_devices(&mut n) };
    let list = NonNull::new(list).ok_or_else(|| VerbsError::last_os(Verb::GetDevices))?;
    let mut out = Vec::with_capacity(n.max(0) as usize);
    for i in 0..n.max(0) as usize {
        // SAFETY: i < n, and the array holds n valid entries followed by NULL.
        let ctx = unsafe { *list.as_ptr().add(i) };
        if let Some(ctx) = NonNull::new(ctx) {
            out.push(ctx);
        }
    }
    Ok((list, out))
}

impl Context {
    /// Names of the RDMA devices librdmacm can use (for example `["rxe0"]`).
    pub fn device_names() -> Result<Vec<String>> {
        let (list, ctxs) = devices()?;
        let names = ctxs.iter().map(|c| device_name(c.as_ptr())).collect();
        // SAFETY: `list` came from rdma_get_devices and is not used after this.
        unsafe { rdma_free_devices(list.as_ptr()) };
        Ok(names)
    }

    /// The RDMA devices librdmacm can use now, with their kernel indexes.
    ///
    /// This goes through `rdma_get_devices` on purpose: librdmacm keeps its own open
    /// handle of every device it has seen and closes the handle of a removed device only
    /// when it next compares its list with the kernel's, which this call does. A process
    /// that released everything of a removed device calls this to let the kernel's
    /// removal finish (rxe cannot revoke a process's handle; the removal waits for it).
    pub fn listed() -> Result<Vec<ListedDevice>> {
        let (list, ctxs) = devices()?;
        let out = ctxs
            .iter()
            .map(|c| ListedDevice {
                name: device_name(c.as_ptr()),
                index: device_index(c.as_ptr()),
            })
            .collect();
        // SAFETY: `list` came from rdma_get_devices and is not used after this.
        unsafe { rdma_free_devices(list.as_ptr()) };
        Ok(out)
    }

    /// The kernel's index of this device (a device removed and added again under the
    /// same name gets a new one), when the kernel reports indexes.
    pub fn index(&self) -> Option<u32> {
        device_index(self.as_ptr())
    }

    /// Opens the named device, or the first one when `name` is `None`.
    pub fn open(name: Option<&str>) -> Result<Context> {
        let (list, ctxs) = devices()?;
        let found = ctxs.iter().copied().find(|c| match name {
            Some(want) => device_name(c.as_ptr()) == want,
            None => true,
        });
        let Some(ctx) = found else {
            // SAFETY: `list` came from rdma_get_devices and is not used after this.
            unsafe { rdma_free_devices(list.as_ptr()) };
            return Err(match name {
                Some(n) => VerbsError::DeviceNotFound(n.to_owned()),
                None => VerbsError::NoDevice,
            });
        };
        OPEN_CONTEXTS.fetch_add(1, Ordering::SeqCst);
        Ok(Context {
            inner: Arc::new(ContextInner {
                list,
                ctx,
                name: device_name(ctx.as_ptr()),
            }),
        })
    }

    /// The device name, as `ibv_devices` prints it.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Queries the device limits.
    pub fn query(&self) -> Result<DeviceAttr> {
        // SAFETY: ibv_device_attr is plain old data; all-zero is a valid value.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `attr` is a valid out-pointer.
        let ret = unsafe { ibv_query_device(self.as_ptr(), &mut attr) };
        check(Verb::QueryDevice, ret)?;
        let u = |v: i32| v.max(0) as u32;
        Ok(DeviceAttr {
            max_qp: u(attr.max_qp),
            max_qp_wr: u(attr.max_qp_wr),
            max_sge: u(attr.max_sge),
            max_cqe: u(attr.max_cqe),
            max_mr_size: attr.max_mr_size,
            max_qp_rd_atom: u(attr.max_qp_rd_atom),
            max_qp_init_rd_atom: u(attr.max_qp_init_rd_atom),
            atomics: attr.atomic_cap != ibv_atomic_cap::IBV_ATOMIC_NONE,
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_context {
        self.inner.ctx.as_ptr()
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("name", &self.inner.name)
            .finish()
    }
}

/// Lets the kernel finish removing a device when no RDMA device is left: points every
/// descriptor this process still holds on a removed device at `/dev/null`, and says how
/// many it pointed.
///
/// Why: librdmacm keeps its own open handle (command descriptor and async-event
/// descriptor) of every device it has seen, and closes a removed device's only when a
/// listing shows the device gone; but its listing gives up when the kernel lists no
/// device at all (rdma-core's `sync_devices_list` returns at once on an empty list), so
/// with the host's only device removed the handle stays open, and rxe, which cannot
/// revoke a process's handle, makes `rdma link delete` wait for this process to exit.
///
/// It does something only when it cannot hit a live device: no [`Context`] of this
/// process is open (so nothing of ours uses any device), and libibverbs lists no device
/// (so every `/dev/infiniband/uverbs*` descriptor and every `[infinibandevent]` descriptor
/// left belongs to a removed one); the listing lock keeps librdmacm from opening a new
/// device meanwhile. The descriptor numbers stay taken, by `/dev/null`: librdmacm's
/// `ibv_close_device` of the old context, once a later listing sees the device gone,
/// closes them and nothing else. The rdma_cm event channel (`/dev/infiniband/rdma_cm`)
/// is left alone. Returns 0 when there was nothing to do.
pub fn release_removed_devices() -> std::io::Result<usize> {
    let _listing = LISTING.lock().unwrap_or_else(|e| e.into_inner());
    if OPEN_CONTEXTS.load(Ordering::SeqCst) > 0 {
        return Ok(0);
    }
    let mut n: i32 = 0;
    // SAFETY: `n` is a valid out-pointer; the list (which opens no device) is freed right
    // away and not used after.
    unsafe {
        let list = ibv_get_device_list(&mut n);
        if !list.is_null() {
            ibv_free_device_list(list);
        }
    }
    if n != 0 {
        return Ok(0);
    }
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    let mut pointed = 0;
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let entry = entry?;
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue; // the directory's own descriptor, already closed
        };
        let target = target.to_string_lossy();
        if !(target.starts_with("/dev/infiniband/uverbs")
            || target == "anon_inode:[infinibandevent]")
        {
            continue;
        }
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: dup3 only replaces what descriptor `fd` refers to (atomically, so the
        // number is never free for another open to take); `null` is an open descriptor
        // and outlives the call. The descriptor's owner (librdmacm's context of a removed
        // device, see above) closes it later as before.
        if unsafe { libc::dup3(null.as_raw_fd(), fd, libc::O_CLOEXEC) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        pointed += 1;
    }
    Ok(pointed)
}
