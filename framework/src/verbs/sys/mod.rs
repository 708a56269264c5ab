//! The raw C interface: bindings generated from the system's rdma-core headers, the
//! header-only inline functions written out in Rust (the libc helpers beside them are `verbs/os.rs`).
//!
//! Nothing outside `verbs/` sees this module. `build.rs` says why the bindings are made
//! here rather than taken from a `-sys` crate.

mod inline;

#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    unnecessary_transmutes,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    missing_docs
)]
mod generated {
    // The socket and thread types the build script keeps out of the bindings.
    use libc::{
        pthread_cond_t, pthread_mutex_t, sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage,
        socklen_t, timespec,
    };
    include!(concat!(env!("OUT_DIR"), "/rdma.rs"));
}

pub(crate) use generated::*;
pub(crate) use inline::*;
