//! Generates the libibverbs/librdmacm bindings from the system's own rdma-core headers.
//!
//! rdmactor used rdma-sys 0.3, whose build script pins bindgen 0.59: that bindgen turns
//! the names clang 16 and later give anonymous unions into invalid identifiers, so it
//! cannot build on Debian trixie (clang 19), Ubuntu 24.04 or Fedora. A current bindgen,
//! run here against the headers the binary will link with, reads rdma-core 44 (bookworm)
//! through 56 (trixie) under clang 14 through 19. Only the raw declarations come from
//! bindgen; the static inline functions of `verbs.h` (the data path: post, poll, notify)
//! are written in Rust in `src/verbs/sys/inline.rs`, so they inline as before.

use std::env;
use std::path::PathBuf;

/// The oldest rdma-core whose headers this crate was checked against (Debian bookworm's).
const MIN_RDMA_CORE: &str = "1.14.44";

/// Bindings generated from the oldest supported headers, for docs.rs only: its builders
/// may lack rdma-core's headers, and rustdoc links nothing (`scripts/docs-rs-bindings`
/// regenerates the file). Kept in the verbs wrapper's `sys/`, where every binding lives,
/// since they declare `unsafe` items.
const DOCS_RS_BINDINGS: &str = "src/verbs/sys/docs-rs-rdma.rs";

fn main() {
    let header = "src/verbs/sys/rdma.h";
    println!("cargo:rerun-if-changed={header}");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DOCS_RS");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    let mut include_dirs = Vec::new();
    for (lib, package, min) in [
        ("libibverbs", "libibverbs-dev", MIN_RDMA_CORE),
        ("librdmacm", "librdmacm-dev", "1.3.44"),
    ] {
        match pkg_config::Config::new().atleast_version(min).probe(lib) {
            Ok(found) => include_dirs.extend(found.include_paths),
            Err(_) if env::var_os("DOCS_RS").is_some() => {
                std::fs::copy(DOCS_RS_BINDINGS, out.join("rdma.rs"))
                    .expect("copying the bindings kept for docs.rs");
                return;
            }
            Err(e) => panic!(
                "{lib} {min} or later not found through pkg-config ({e}); install {package} \
                 (scripts/setup does) or set PKG_CONFIG_PATH"
            ),
        }
    }

    let mut builder = bindgen::Builder::default()
        .header(header)
        .clang_args(include_dirs.iter().map(|d| format!("-I{}", d.display())))
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .allowlist_function("ibv_.*|rdma_.*")
        .allowlist_type("ibv_.*|rdma_.*|verbs_context")
        .allowlist_var("IBV_.*|RDMA_.*")
        // The socket and thread types are libc's, so addresses pass between librdmacm
        // and std without casts through look-alike structs.
        .blocklist_type("sockaddr|sockaddr_in|sockaddr_in6|sockaddr_storage|in6_addr|in_addr")
        .blocklist_type("sa_family_t|in_port_t|in_addr_t|socklen_t|timespec|pthread_.*")
        .derive_copy(true)
        .derive_debug(true)
        .derive_default(false)
        .generate_comments(false)
        .prepend_enum_name(false)
        .size_t_is_usize(true)
        .layout_tests(false)
        .wrap_unsafe_ops(true)
        // The event kind is matched exhaustively as a Rust enum; every other enum is a
        // module of constants, which stays sound when a newer kernel or provider reports
        // a value these headers do not know.
        .rustified_enum("ibv_event_type")
        .default_enum_style(bindgen::EnumVariation::ModuleConsts);
    // Flag sets that are or-ed together get bit-set newtypes (`A | B`, `.0`).
    for flags in [
        "ibv_access_flags",
        "ibv_send_flags",
        "ibv_wc_flags",
        "ibv_qp_attr_mask",
        "ibv_srq_attr_mask",
        "ibv_device_cap_flags",
        "ibv_port_cap_flags",
    ] {
        builder = builder.bitfield_enum(flags);
    }
    let bindings = builder
        .generate()
        .unwrap_or_else(|e| panic!("bindgen could not read {header}: {e}"));
    bindings
        .write_to_file(out.join("rdma.rs"))
        .expect("writing the generated bindings");
}
