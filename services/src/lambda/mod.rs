//! Lambdas: client code run next to the server's data, without RDMA (the session that moves
//! inputs and outputs over RDMA drives this module).
//!
//! # Why WebAssembly
//!
//! Native code shipped by a client could do anything the server process can. A
//! WebAssembly module can only touch its own linear memory and what it imports; lambdas
//! may import nothing, so all a module can do is compute on the bytes it is given. The
//! module is run by [wasmi], an interpreter: no JIT, no code generated at run time, fuel
//! metering built in. Interpretation costs speed (see the checksum timing in the tests);
//! the embedding application can still register trusted [native lambdas](NativeLambdas).
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
//! | [`fuel`](Limits::fuel) | wasmi fuel metering: every instruction costs fuel, the store gets `fuel` before the call | [`OutOfFuel`](LambdaError::OutOfFuel) |
//! | [`max_memory_bytes`](Limits::max_memory_bytes) | wasmi's store resource limiter: growing memory past it traps at once | [`MemoryLimit`](LambdaError::MemoryLimit) |
//! | [`wall_clock`](Limits::wall_clock) | the invocation runs on its own worker thread; the caller waits with a timeout | [`Timeout`](LambdaError::Timeout) |
//! | [`max_output`](Limits::max_output) | checked before the output is copied out | [`OutputTooLarge`](LambdaError::OutputTooLarge) |
//!
//! Wall clock: wasmi 2 has no epoch interruption, and a call cannot be stopped from another
//! thread. It can be resumed after running out of fuel, so the run could be sliced into
//! fuel quanta with a clock check between them; but a `memory.grow` that runs out of fuel
//! mid-slice becomes a non-resumable trap when the limiter traps on refused growth (which
//! is what makes memory bombs recognisable), so slicing would randomly kill well-behaved
//! guests. Hence a worker thread per invocation: on timeout the caller gets
//! [`Timeout`](LambdaError::Timeout) immediately and the abandoned worker stops by itself
//! when its fuel runs out, so its CPU time stays bounded by [`Limits::fuel`]. Such workers
//! count towards [`SandboxConfig::max_workers`] until they end
//! ([`Busy`](LambdaError::Busy) beyond it); keep `fuel` roughly in line with `wall_clock`.
//!
//! Traps, out-of-bounds accesses and stack exhaustion become [`LambdaError::Trap`]; a
//! panic inside the interpreter is caught and reported the same way, so a guest cannot
//! take the host process down.
//!
//! # Cache
//!
//! [`Sandbox::load`] hashes the bytes with BLAKE3 and validates and compiles a module only
//! the first time it sees the hash ([`Sandbox::compilations`] counts compilations); the
//! [`ModuleHash`] then names the module in [`Sandbox::run`].
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
mod native;
mod sandbox;
mod service;
mod session;
#[cfg(test)]
mod tests;
mod wire;

pub use client::{invoke, upload, CallError, Invocation};
pub use config::LambdaConfig;
pub use native::{checksum_native, NativeFn, NativeLambdas};
pub use sandbox::{LambdaError, Limits, ModuleHash, Result, Sandbox, SandboxConfig};
pub use service::LambdaService;
pub use wire::{Failure, FailureKind, LambdaRef, LambdaRequest, LambdaResponse, WireLimits};
