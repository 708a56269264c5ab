//! The functions `infiniband/verbs.h` defines `static inline`, which no library exports
//! and bindgen therefore cannot bind. Each one is a call through the context's operation
//! table, written here in Rust so that the data path (post, poll, notify) costs what it
//! costs in C: one indirect call, no extra hop through a compiled C shim.
//!
//! Each function keeps the header's name and contract; the `# Safety` sections are the
//! verbs API's own preconditions.

use std::os::raw::c_int;

use super::generated::*;

/// The errno the header's wrappers return when a provider lacks an operation.
const NOT_SUPPORTED: c_int = libc::EOPNOTSUPP;

/// Posts a chain of send work requests (`ibv_post_send`).
///
/// # Safety
/// `qp` must be a live QP; `wr` a valid chain whose buffers stay registered until their
/// completions; `bad_wr` a valid out-pointer.
#[inline]
pub(crate) unsafe fn ibv_post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the caller guarantees a live QP, so its context and operation table are
    // valid; every provider fills post_send.
    unsafe {
        match (*(*qp).context).ops.post_send {
            Some(post) => post(qp, wr, bad_wr),
            None => NOT_SUPPORTED,
        }
    }
}

/// Posts a chain of receive work requests (`ibv_post_recv`).
///
/// # Safety
/// As [`ibv_post_send`], for receives.
#[inline]
pub(crate) unsafe fn ibv_post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: as in ibv_post_send.
    unsafe {
        match (*(*qp).context).ops.post_recv {
            Some(post) => post(qp, wr, bad_wr),
            None => NOT_SUPPORTED,
        }
    }
}

/// Posts a chain of receives to a shared receive queue (`ibv_post_srq_recv`).
///
/// # Safety
/// `srq` must be a live SRQ; the chain and out-pointer as in [`ibv_post_recv`].
#[inline]
pub(crate) unsafe fn ibv_post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the caller guarantees a live SRQ, so its context is valid.
    unsafe {
        match (*(*srq).context).ops.post_srq_recv {
            Some(post) => post(srq, wr, bad_wr),
            None => NOT_SUPPORTED,
        }
    }
}

/// Polls up to `num_entries` completions into `wc` (`ibv_poll_cq`); negative on error.
///
/// # Safety
/// `cq` must be a live CQ and `wc` valid for `num_entries` writes.
#[inline]
pub(crate) unsafe fn ibv_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: the caller guarantees a live CQ and room for `num_entries` completions.
    unsafe {
        match (*(*cq).context).ops.poll_cq {
            Some(poll) => poll(cq, num_entries, wc),
            None => -NOT_SUPPORTED,
        }
    }
}

/// Arms the CQ's completion channel for its next completion (`ibv_req_notify_cq`).
///
/// # Safety
/// `cq` must be a live CQ.
#[inline]
pub(crate) unsafe fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: the caller guarantees a live CQ.
    unsafe {
        match (*(*cq).context).ops.req_notify_cq {
            Some(notify) => notify(cq, solicited_only),
            None => NOT_SUPPORTED,
        }
    }
}

/// Allocates a memory window (`ibv_alloc_mw`); null with errno set on failure.
///
/// # Safety
/// `pd` must be a live protection domain.
pub(crate) unsafe fn ibv_alloc_mw(pd: *mut ibv_pd, kind: ibv_mw_type::Type) -> *mut ibv_mw {
    // SAFETY: the caller guarantees a live PD, so its context is valid.
    unsafe {
        match (*(*pd).context).ops.alloc_mw {
            Some(alloc) => alloc(pd, kind),
            None => {
                *libc::__errno_location() = NOT_SUPPORTED;
                std::ptr::null_mut()
            }
        }
    }
}

/// Frees a memory window (`ibv_dealloc_mw`).
///
/// # Safety
/// `mw` must come from [`ibv_alloc_mw`] and not have been freed.
pub(crate) unsafe fn ibv_dealloc_mw(mw: *mut ibv_mw) -> c_int {
    // SAFETY: the caller guarantees a live window, so its context is valid.
    unsafe {
        match (*(*mw).context).ops.dealloc_mw {
            Some(dealloc) => dealloc(mw),
            None => NOT_SUPPORTED,
        }
    }
}

/// Queries a port into the full `ibv_port_attr` (the header's `ibv_query_port` macro).
///
/// The exported `ibv_query_port` symbol takes the older, shorter `_compat_ibv_port_attr`.
/// Contexts opened by rdma-core 17 and later are extended (`verbs_context`) and carry a
/// `query_port` that is told the caller's struct size; older ones fall back to the symbol.
///
/// # Safety
/// `context` must be an open device context and `attr` a valid out-pointer.
pub(crate) unsafe fn ibv_query_port_full(
    context: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // SAFETY: the caller guarantees an open context; an extended one is the last field of
    // a `verbs_context`, so stepping back by that field's offset stays in the allocation,
    // and `sz` says how much of the struct before `context` the library knows (the
    // header's `verbs_get_ctx_op` test, which a newer header than the library can fail).
    unsafe {
        std::ptr::write_bytes(attr, 0, 1);
        if (*context).abi_compat as usize == usize::MAX {
            let offset = std::mem::offset_of!(verbs_context, context);
            let vctx = context.byte_sub(offset).cast::<verbs_context>();
            let needed = std::mem::size_of::<verbs_context>()
                - std::mem::offset_of!(verbs_context, query_port);
            if (*vctx).sz >= needed {
                if let Some(query) = (*vctx).query_port {
                    return query(context, port, attr, std::mem::size_of::<ibv_port_attr>());
                }
            }
        }
        ibv_query_port(context, port, attr.cast())
    }
}

/// The id's local address (`rdma_get_local_addr`): the start of `route.addr`'s source
/// union, which librdmacm keeps sized for any address family.
///
/// # Safety
/// `id` must be a live rdma_cm id.
pub(crate) unsafe fn rdma_get_local_addr(id: *const rdma_cm_id) -> *const libc::sockaddr {
    // SAFETY: the caller guarantees a live id; only an address is computed.
    unsafe { std::ptr::addr_of!((*id).route.addr.__bindgen_anon_1).cast() }
}

/// The id's peer address (`rdma_get_peer_addr`), as [`rdma_get_local_addr`].
///
/// # Safety
/// `id` must be a live rdma_cm id.
pub(crate) unsafe fn rdma_get_peer_addr(id: *const rdma_cm_id) -> *const libc::sockaddr {
    // SAFETY: the caller guarantees a live id; only an address is computed.
    unsafe { std::ptr::addr_of!((*id).route.addr.__bindgen_anon_2).cast() }
}
