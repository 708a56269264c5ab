//! Lambdas: client code run next to the server's data, without RDMA (the session that moves
//! inputs and outputs over RDMA drives this module).
//!
//! # Why WebAssembly
//!
//! Native code shipped by a client could do anything the server process can. A
//! WebAssembly module can only touch its own linear memory and what it imports; lambdas
//! may import nothing, so all a module can do is compute on the bytes it is given. The
//! module is compiled to machine code by [wasmtime] (Cranelift) once, when uploaded, and
//! the checksum example runs within 1.1x of the same checksum in native Rust on the host
//! (`examples/src/bin/lambda_bench.rs`; the wasmi interpreter used before was 50 times slower in
//! the test VM). Compiled code bounds-checks its memory accesses explicitly instead of
//! relying on guard pages, which spares every invocation two `mprotect` calls. The embedding application can
//! still register trusted [native lambdas](NativeLambdas).
//!
//! # ABI
//!
//! A lambda module has no imports and exports exactly these (more exports are ignored):
//!
//! | export | type | role |
//! |---|---|---|
//! | `memory` | 32-bit linear memory | input and output live here |
//! | `alloc` | `(len: i32) -> i32` | returns where the host may write `len` input bytes |
//! | `run` | `(ptr: i32, len: i32) -> i64` | computes on the input at `ptr..ptr+len` |
//!
//! An invocation instantiates the module afresh (no state survives between invocations),
//! calls `alloc(input.len())`, copies the input to the returned address, calls
//! `run(ptr, len)` and reads the result `r`:
//!
//! - `r >= 0`: the output is the `r & 0xffff_ffff` bytes at address `r >> 32`
//!   (`(out_ptr as i64) << 32 | out_len as i64`);
//! - `r < 0`: the guest reports an error, returned as [`LambdaError::GuestError`]`(r)`.
//!
//! Refused at [`Sandbox::load`]: invalid bytes, any import, a `start` function, 64-bit or
//! multiple memories, missing or mistyped exports. WASI is not provided. The text-format
//! modules in `examples/lambdas/` follow this ABI (`checksum.wat`, `echo_upper.wat`) or
//! break the limits on purpose (`infinite_loop.wat`, `memory_bomb.wat`, `trap.wat`).
//!
//! # Limits
//!
//! Every invocation runs under [`Limits`]; each broken limit has its own error:
//!
//! | limit | enforced by | error |
//! |---|---|---|
//! | [`fuel`](Limits::fuel) | wasmtime fuel metering: every executed Wasm operator costs a unit, the store gets `fuel` before the calls | [`OutOfFuel`](LambdaError::OutOfFuel) |
//! | [`max_memory_bytes`](Limits::max_memory_bytes) | the store's resource limiter: growing memory (or a table) past it traps at once, and the refusal is recorded | [`MemoryLimit`](LambdaError::MemoryLimit) |
//! | [`wall_clock`](Limits::wall_clock) | epoch interruption: compiled code checks an epoch counter at loop back-edges and calls; a ticker thread advances it when the earliest running invocation's deadline comes (and every millisecond while one past its deadline still runs), and the store stops its guest once its deadline passed | [`Timeout`](LambdaError::Timeout) |
//! | [`max_output`](Limits::max_output) | checked before the output is copied out | [`OutputTooLarge`](LambdaError::OutputTooLarge) |
//! | stack | `max_wasm_stack` of 256 KiB: deep recursion traps long before the host thread's stack is at risk | [`Trap`](LambdaError::Trap) |
//!
//! An invocation runs on the calling thread (the service's job thread) and every limit
//! stops the guest itself, so a timed-out invocation has stopped when `Timeout` is
//! returned: nothing keeps burning CPU after its caller gave up.
//! [`SandboxConfig::max_workers`] bounds the invocations running at once
//! ([`Busy`](LambdaError::Busy) beyond it).
//!
//! Traps, out-of-bounds accesses and stack exhaustion become [`LambdaError::Trap`]; a
//! panic inside the sandbox is caught and reported the same way, so a guest cannot take
//! the host process down.
//!
//! # Cache
//!
//! [`Sandbox::load`] refuses modules over [`SandboxConfig::max_module_bytes`] before
//! parsing them, hashes the bytes with BLAKE3, and validates and compiles a module only
//! the first time it sees the hash ([`Sandbox::compilations`] counts compilations); the
//! [`ModuleHash`] then names the module in [`Sandbox::run`]. The cache holds at most
//! [`SandboxConfig::max_cached_modules`] modules in at most
//! [`SandboxConfig::max_cached_bytes`] (Wasm plus machine code).
//!
//! Each client (the service makes one [`SandboxClient`] per connection) has a quota of
//! its own, [`SandboxConfig::max_modules_per_client`] and
//! [`SandboxConfig::max_bytes_per_client`]: a module stays cached while a client that
//! loaded it *holds* it, and a client loading past its quota lets go of its own least
//! recently used modules (a run counts as a use), never another client's. A module two
//! clients loaded is compiled and stored once and counts against each one's quota (each
//! alone would keep it cached); it leaves the cache when the last holder lets go. When
//! the cache as a whole is at its bounds, the loader again gives up its own oldest; a
//! client holding nothing gets [`CacheTaken`](LambdaError::CacheTaken) instead of
//! evicting others. A connection's holds end when it closes. An evicted module is
//! [`UnknownLambda`](LambdaError::UnknownLambda) until uploaded again. The application's
//! own [`Sandbox::load`]s are one more holder whose quota is the whole cache. Compiling
//! takes milliseconds to seconds, so the service compiles on its job threads, never on
//! a poller.
//!
//! # Quick start
//!
//! ```
//! use rdmactor_services::lambda::{LambdaError, Limits, Sandbox};
//!
//! let wasm = wat::parse_str(r#"(module
//!     (memory (export "memory") 1)
//!     (func (export "alloc") (param i32) (result i32) (i32.const 0))
//!     ;; output = input: out_ptr = ptr, out_len = len
//!     (func (export "run") (param $ptr i32) (param $len i32) (result i64)
//!       (i64.or (i64.shl (i64.extend_i32_u (local.get $ptr)) (i64.const 32))
//!               (i64.extend_i32_u (local.get $len)))))"#)?;
//! let sandbox = Sandbox::new();
//! let hash = sandbox.load(&wasm)?;
//! assert_eq!(sandbox.run(&hash, b"hello", &Limits::default())?, b"hello");
//! assert!(matches!(sandbox.load(b"not wasm"), Err(LambdaError::InvalidModule(_))));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Thread safety
//!
//! [`Sandbox`] and [`NativeLambdas`] are `Send + Sync`; share them behind an `Arc` and call
//! them from any thread. Native lambdas run on the calling thread without limits.

mod client;
mod config;
mod job;
mod line;
mod native;
mod owner;
mod sandbox;
mod service;
mod session;
#[cfg(test)]
mod tests;
mod wire;

pub use client::{invoke, upload, CallError, Invocation};
pub use config::LambdaConfig;
pub use native::{checksum_native, NativeFn, NativeLambdas};
pub use owner::{Contains, LambdaOwner, LambdaStats, Stats};
pub use sandbox::{
    LambdaError, Limits, ModuleHash, Phases, Result, Sandbox, SandboxClient, SandboxConfig,
};
pub use service::{LambdaCache, LambdaService};
pub use wire::{Failure, FailureKind, LambdaRef, LambdaRequest, LambdaResponse, WireLimits};
