//! What goes wrong when loading or running a lambda.

use std::time::Duration;

/// Everything that can go wrong when loading or running a lambda.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LambdaError {
    /// The bytes are not a valid WebAssembly module (or use a feature the sandbox turns off,
    /// such as a `start` function or 64-bit memory).
    #[error("invalid WebAssembly module: {0}")]
    InvalidModule(String),
    /// The module is bigger than [`SandboxConfig::max_module_bytes`](super::SandboxConfig::max_module_bytes).
    #[error("module of {len} bytes is larger than the limit of {limit} bytes")]
    ModuleTooLarge {
        /// Size of the module.
        len: usize,
        /// The configured limit.
        limit: usize,
    },
    /// The module imports something; lambdas get no host functions, memories or globals.
    #[error("lambdas may not import anything, but the module imports {}", .0.join(", "))]
    ImportsNotAllowed(Vec<String>),
    /// The module lacks an export the ABI needs, or exports it with the wrong type.
    #[error("missing or mistyped export: {0}")]
    MissingExport(String),
    /// The compiled module alone is larger than the whole module cache
    /// ([`SandboxConfig::max_cached_bytes`](super::SandboxConfig::max_cached_bytes)) or
    /// than one client's share of it
    /// ([`SandboxConfig::max_bytes_per_client`](super::SandboxConfig::max_bytes_per_client));
    /// smaller modules evict the loader's older ones instead.
    #[error(
        "compiled module of {len} bytes does not fit the module cache's limit of {limit} bytes"
    )]
    CacheFull {
        /// Bytes the module would take in the cache (its Wasm plus its machine code).
        len: usize,
        /// The configured limit.
        limit: usize,
    },
    /// The module cache is at its bounds with other clients' modules, each within its
    /// quota, and the loading client holds none it could let go of. Other clients'
    /// modules are never evicted for it.
    #[error(
        "the module cache is full of other clients' modules (at most {modules} modules in \
         {bytes} bytes)"
    )]
    CacheTaken {
        /// [`SandboxConfig::max_cached_modules`](super::SandboxConfig::max_cached_modules).
        modules: usize,
        /// [`SandboxConfig::max_cached_bytes`](super::SandboxConfig::max_cached_bytes).
        bytes: usize,
    },
    /// No module with this hash was loaded, or no native lambda has this name.
    #[error("unknown lambda {0}")]
    UnknownLambda(String),
    /// [`SandboxConfig::max_workers`](super::SandboxConfig::max_workers) invocations are still running.
    #[error("all {limit} lambda workers are busy")]
    Busy {
        /// The configured limit.
        limit: usize,
    },
    /// The input does not fit in the guest's memory limit.
    #[error("input of {len} bytes does not fit the memory limit of {limit} bytes")]
    InputTooLarge {
        /// Size of the input.
        len: usize,
        /// [`Limits::max_memory_bytes`](super::Limits::max_memory_bytes).
        limit: usize,
    },
    /// The guest trapped (`unreachable`, out-of-bounds access, division by zero, stack
    /// exhaustion, ...). The string is wasmtime's description of the trap.
    #[error("lambda trapped: {0}")]
    Trap(String),
    /// The guest executed more Wasm operators than [`Limits::fuel`](super::Limits::fuel) allows.
    #[error("lambda ran out of fuel ({fuel} units)")]
    OutOfFuel {
        /// [`Limits::fuel`](super::Limits::fuel).
        fuel: u64,
    },
    /// The guest's memory (or a table) would have grown beyond [`Limits::max_memory_bytes`](super::Limits::max_memory_bytes).
    #[error("lambda exceeded its memory limit of {limit} bytes")]
    MemoryLimit {
        /// [`Limits::max_memory_bytes`](super::Limits::max_memory_bytes).
        limit: usize,
    },
    /// The invocation did not finish within [`Limits::wall_clock`](super::Limits::wall_clock).
    #[error("lambda did not finish within {limit:?}")]
    Timeout {
        /// [`Limits::wall_clock`](super::Limits::wall_clock).
        limit: Duration,
    },
    /// `alloc` or `run` returned a pointer/length outside the guest's memory.
    #[error("lambda broke the ABI: {0}")]
    BadResult(String),
    /// `run` returned more bytes than [`Limits::max_output`](super::Limits::max_output).
    #[error("lambda output of {len} bytes is larger than the limit of {limit} bytes")]
    OutputTooLarge {
        /// Length the guest returned.
        len: usize,
        /// [`Limits::max_output`](super::Limits::max_output).
        limit: usize,
    },
    /// `run` returned this negative value: an error the guest reports itself.
    #[error("lambda reported error {0}")]
    GuestError(i64),
    /// A native lambda returned an error or panicked.
    #[error("native lambda failed: {0}")]
    NativeError(String),
}

/// `Result` with a [`LambdaError`].
pub type Result<T, E = LambdaError> = std::result::Result<T, E>;
