//! Limits: per invocation ([`Limits`]), of the sandbox as a whole ([`SandboxConfig`]), and
//! the store's resource limiter that enforces the memory limit while a guest runs.

use std::time::Duration;

use wasmtime::ResourceLimiter;

/// Per-invocation limits. A server would typically take a client's requested limits and
/// [`cap`](Limits::capped_by) them with its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Fuel for the whole invocation (`alloc` plus `run`): one unit per executed Wasm
    /// operator (wasmtime's fuel metering; `nop`, `drop` and block markers are free).
    /// Bulk memory operations cost one unit whatever their length; they are bounded by
    /// the memory limit instead.
    pub fuel: u64,
    /// Largest size the guest's linear memory may reach, in bytes (rounded down to whole
    /// 64 KiB pages by the guest's `memory.grow`).
    pub max_memory_bytes: usize,
    /// Wall-clock limit for the invocation, from the call to
    /// [`Sandbox::run`](super::Sandbox::run) to its result.
    pub wall_clock: Duration,
    /// Largest output the guest may return, in bytes.
    pub max_output: usize,
}

impl Default for Limits {
    /// 1e9 fuel (about a second of compiled code), 64 MiB of memory, 2 s of wall clock,
    /// 16 MiB of output.
    fn default() -> Self {
        Self {
            fuel: 1_000_000_000,
            max_memory_bytes: 64 << 20,
            wall_clock: Duration::from_secs(2),
            max_output: 16 << 20,
        }
    }
}

impl Limits {
    /// The smaller of each limit in `self` and `cap`.
    #[must_use]
    pub fn capped_by(&self, cap: &Limits) -> Limits {
        Limits {
            fuel: self.fuel.min(cap.fuel),
            max_memory_bytes: self.max_memory_bytes.min(cap.max_memory_bytes),
            wall_clock: self.wall_clock.min(cap.wall_clock),
            max_output: self.max_output.min(cap.max_output),
        }
    }
}

/// Limits of the sandbox itself (as opposed to one invocation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxConfig {
    /// Largest module [`Sandbox::load`](super::Sandbox::load) accepts, in bytes; checked
    /// before anything is parsed or compiled, so it bounds the compiler's work too.
    pub max_module_bytes: usize,
    /// Most modules kept in the cache; loading one more evicts the least recently used.
    pub max_cached_modules: usize,
    /// Most bytes the cached modules may take (each counts its Wasm bytes plus its
    /// compiled machine code); loading past it evicts the least recently used.
    pub max_cached_bytes: usize,
    /// Most modules one client (connection) keeps cached; loading one more lets go of its
    /// own least recently used (see [`SandboxClient`](super::SandboxClient)).
    pub max_modules_per_client: usize,
    /// Most bytes one client's cached modules may take (counted like
    /// `max_cached_bytes`); loading past it lets go of its own least recently used.
    pub max_bytes_per_client: usize,
    /// Most invocations running at once ([`Busy`](super::LambdaError::Busy) beyond it);
    /// also the number of instance slots the sandbox reserves (address space only).
    pub max_workers: usize,
    /// Bytes of each instance slot's memory kept mapped between invocations, so that
    /// inputs up to about this size cost no page faults (see `Sandbox::with_config`).
    /// Resident memory can reach `max_workers` times this.
    pub keep_resident_bytes: usize,
}

impl Default for SandboxConfig {
    /// 8 MiB modules, 1024 cached modules in at most 256 MiB, 16 modules in at most
    /// 32 MiB per client (64 clients at their quota fill the cache), 64 workers, 4 MiB
    /// kept resident per worker slot.
    fn default() -> Self {
        Self {
            max_module_bytes: 8 << 20,
            max_cached_modules: 1024,
            max_cached_bytes: 256 << 20,
            max_modules_per_client: 16,
            max_bytes_per_client: 32 << 20,
            max_workers: 64,
            keep_resident_bytes: 4 << 20,
        }
    }
}

/// Most elements a guest table may hold.
pub(super) const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Most tables a guest may define.
pub(super) const MAX_TABLES_PER_MODULE: u32 = 4;

/// What an invocation's store carries for the host: the limiter and whether the
/// deadline passed. Defined here, below both the cache (whose compiled modules are
/// instantiated with it) and the invocation (which fills it in).
pub(super) struct Host {
    pub(super) limiter: GuestLimiter,
    pub(super) timed_out: bool,
}

/// The store's resource limiter for one invocation. A refused growth traps at once (a
/// memory bomb ends at its first growth past the limit instead of spinning on `-1`
/// until its fuel runs out), and the refusal is recorded so that the trap is reported
/// as [`MemoryLimit`](super::LambdaError::MemoryLimit), not as a generic trap.
#[derive(Debug)]
pub(super) struct GuestLimiter {
    max_memory_bytes: usize,
    /// Set when a memory or table growth was refused.
    pub refused: bool,
}

impl GuestLimiter {
    pub(super) fn new(max_memory_bytes: usize) -> Self {
        GuestLimiter {
            max_memory_bytes,
            refused: false,
        }
    }
}

impl ResourceLimiter for GuestLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_memory_bytes {
            self.refused = true;
            return Err(wasmtime::format_err!(
                "memory of {desired} bytes exceeds the limit of {} bytes",
                self.max_memory_bytes
            ));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            self.refused = true;
            return Err(wasmtime::format_err!(
                "table of {desired} elements exceeds the limit of {MAX_TABLE_ELEMENTS}"
            ));
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        1
    }

    fn tables(&self) -> usize {
        MAX_TABLES_PER_MODULE as usize
    }

    fn memories(&self) -> usize {
        1
    }
}
