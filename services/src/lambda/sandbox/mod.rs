//! The WebAssembly sandbox: a wasmtime [`Engine`] compiling with Cranelift, with fuel
//! metering and epoch interruption; a bounded LRU cache of compiled modules keyed by
//! BLAKE3 hash; one fresh [`Store`](wasmtime::Store) per invocation.
//!
//! Files: [`limits`] (what an invocation and the sandbox may use, and the store's
//! resource limiter), [`cache`] (compiled modules), [`clock`] (the epoch ticker behind
//! the wall clock), [`invoke`] (one invocation).

mod cache;
mod client;
mod clock;
mod error;
mod invoke;
mod limits;

use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use wasmtime::{
    Config, Engine, ExternType, InstanceAllocationStrategy, Linker, Module, OptLevel,
    PoolingAllocationConfig, ValType,
};

pub use cache::ModuleHash;
pub use client::SandboxClient;
pub use error::{LambdaError, Result};
pub use invoke::Phases;
pub use limits::{Limits, SandboxConfig};

use cache::{AbiExports, EXPORT_ALLOC, EXPORT_MEMORY, EXPORT_RUN};
pub(crate) use cache::{ClientId, Compiled, ModuleCache, Quota};
use clock::EpochTicker;

/// Size of a Wasm memory page.
const WASM_PAGE_BYTES: u64 = 64 << 10;
/// Stack a guest may use, in bytes. Deeper recursion traps (stack overflow) long
/// before the host thread's stack (2 MiB for Rust threads) is at risk.
const MAX_WASM_STACK: usize = 256 << 10;

/// Validates, compiles, caches and runs WebAssembly lambdas. Cheap to share: `&Sandbox` is
/// all [`load`](Sandbox::load) and [`run`](Sandbox::run) need, from any thread.
pub struct Sandbox {
    engine: Engine,
    config: SandboxConfig,
    cache: Mutex<ModuleCache>,
    /// Held while compiling, so that concurrent loads of the same bytes compile once.
    compiling: Mutex<()>,
    compilations: AtomicU64,
    evictions: AtomicU64,
    /// The next [`SandboxClient`]'s id (0 is the application's).
    next_client: AtomicU64,
    running: Arc<AtomicUsize>,
    ticker: EpochTicker,
}

impl fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sandbox")
            .field("config", &self.config)
            .field("cached_modules", &self.cached_modules())
            .field("compilations", &self.compilations())
            .field("running_workers", &self.running_workers())
            .finish()
    }
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Sandbox {
    /// A sandbox with [`SandboxConfig::default`].
    pub fn new() -> Self {
        Self::with_config(SandboxConfig::default())
    }

    /// A sandbox with the given limits.
    ///
    /// # Panics
    ///
    /// If wasmtime cannot build an engine for this host (Cranelift targets x86-64,
    /// AArch64, s390x and RISC-V 64), or the epoch thread cannot start.
    pub fn with_config(config: SandboxConfig) -> Self {
        // Instances come from a pool of pre-reserved slots, one per worker, and a slot's
        // first `keep_resident_bytes` of memory stay mapped between invocations (zeroed
        // with memset on reuse). Without it every invocation maps fresh pages and pays a
        // page fault per 4 KiB it touches: cheap on the host, but under the test VM's
        // emulation those faults made a 1 MiB checksum 20 times slower than native.
        let slots = u32::try_from(config.max_workers.max(1)).unwrap_or(u32::MAX);
        let mut pool = PoolingAllocationConfig::new();
        pool.total_core_instances(slots)
            .total_memories(slots)
            .max_memories_per_module(1)
            .total_tables(slots.saturating_mul(limits::MAX_TABLES_PER_MODULE))
            .max_tables_per_module(limits::MAX_TABLES_PER_MODULE)
            .table_elements(limits::MAX_TABLE_ELEMENTS)
            .linear_memory_keep_resident(config.keep_resident_bytes);
        let mut wasm = Config::new();
        wasm.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        wasm.consume_fuel(true)
            .epoch_interruption(true)
            .max_wasm_stack(MAX_WASM_STACK)
            .cranelift_opt_level(OptLevel::Speed)
            // One 32-bit memory, so that pointers are i32 and the limit is per lambda.
            .wasm_memory64(false)
            .wasm_multi_memory(false)
            // 128-bit SIMD (wasmtime's default, said here because the example checksum
            // relies on it): pure computation on values, no new access to anything.
            .wasm_simd(true)
            // Traps are reported by kind; nobody reads guest backtraces.
            .wasm_backtrace_max_frames(None);
        // Explicit bounds checks in the compiled code instead of guard pages and a
        // signal handler. With guard pages, wasmtime changes the protection of a pooled
        // slot twice per invocation (shrinking it back to the module's initial size at
        // instantiation, growing it when `alloc` grows memory), and each `mprotect`
        // flushes the TLB: under the test VM's emulated CPU that cost 0.3 to 0.6 ms per
        // invocation, a third of the whole 1 MiB checksum. Without guard pages the slot
        // stays accessible between invocations (its contents are still reset) and the
        // guest pays a compare per load instead, which modules that load 64 bits at a
        // time (like `examples/lambdas/checksum.wat`) barely notice.
        wasm.signals_based_traps(false).memory_guard_size(0);
        let engine = Engine::new(&wasm).expect("a wasmtime engine for this host");
        let ticker = EpochTicker::start(engine.clone()).expect("the lambda epoch thread");
        Self {
            engine,
            config,
            cache: Mutex::new(ModuleCache::new(
                config.max_cached_modules,
                config.max_cached_bytes,
                Quota {
                    modules: config.max_modules_per_client,
                    bytes: config.max_bytes_per_client,
                },
            )),
            compiling: Mutex::new(()),
            compilations: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            next_client: AtomicU64::new(1),
            running: Arc::new(AtomicUsize::new(0)),
            ticker,
        }
    }

    /// The sandbox's own limits.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    fn cache(&self) -> MutexGuard<'_, ModuleCache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Validates and compiles a module, or finds it in the cache, and returns its hash.
    /// The module is the application's: it counts against the whole cache's bounds but no
    /// client's quota (clients load through [`SandboxClient::load`]).
    ///
    /// Compiling takes time (milliseconds for the examples, more for big modules): call
    /// this from a thread that may block, never from a poller (the lambda service loads
    /// on its job threads). [`SandboxConfig::max_module_bytes`] is checked before
    /// anything is parsed, which bounds the compiler's work.
    ///
    /// # Errors
    ///
    /// [`ModuleTooLarge`](LambdaError::ModuleTooLarge),
    /// [`InvalidModule`](LambdaError::InvalidModule),
    /// [`ImportsNotAllowed`](LambdaError::ImportsNotAllowed),
    /// [`MissingExport`](LambdaError::MissingExport), [`CacheFull`](LambdaError::CacheFull),
    /// [`CacheTaken`](LambdaError::CacheTaken).
    pub fn load(&self, bytes: &[u8]) -> Result<ModuleHash> {
        self.load_for(ClientId::APPLICATION, bytes)
    }

    fn load_for(&self, client: ClientId, bytes: &[u8]) -> Result<ModuleHash> {
        let mut compiled = false;
        let loaded = self.compile_or_hold(client, bytes, &mut compiled);
        rdmactor::metrics::lambda_module_load(match (&loaded, compiled) {
            (Err(_), _) => "refused",
            (Ok(_), true) => "compiled",
            (Ok(_), false) => "cached",
        });
        loaded
    }

    /// [`load_for`](Self::load_for) without the counting; `compiled` says whether it
    /// compiled the module.
    fn compile_or_hold(
        &self,
        client: ClientId,
        bytes: &[u8],
        compiled: &mut bool,
    ) -> Result<ModuleHash> {
        if bytes.len() > self.config.max_module_bytes {
            return Err(LambdaError::ModuleTooLarge {
                len: bytes.len(),
                limit: self.config.max_module_bytes,
            });
        }
        let hash = ModuleHash::of(bytes);
        if self.hold_cached(client, &hash)? {
            return Ok(hash);
        }
        let _compiling = self
            .compiling
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Someone may have compiled it while we waited for the lock.
        if self.hold_cached(client, &hash)? {
            return Ok(hash);
        }
        let (hash, module) = self.compile(bytes)?;
        tracing::debug!(?client, "for the application's cache");
        let evicted = self.cache().insert(client, hash, module)?;
        *compiled = true;
        self.evicted(evicted);
        Ok(hash)
    }

    /// Validates and compiles `bytes` into a module ready to run, cached nowhere (the
    /// lambda service keeps it in its own cache). Blocks: call it on a job thread.
    pub(crate) fn compile(&self, bytes: &[u8]) -> Result<(ModuleHash, Compiled)> {
        if bytes.len() > self.config.max_module_bytes {
            return Err(LambdaError::ModuleTooLarge {
                len: bytes.len(),
                limit: self.config.max_module_bytes,
            });
        }
        let hash = ModuleHash::of(bytes);
        self.compilations.fetch_add(1, Ordering::Relaxed);
        refuse_start_function(bytes)?;
        let module = Module::from_binary(&self.engine, bytes)
            .map_err(|e| LambdaError::InvalidModule(format!("{e:#}")))?;
        let module = check_abi(&self.engine, module, bytes.len())?;
        tracing::debug!(%hash, len = bytes.len(), cost = module.cost, "compiled lambda module");
        Ok((hash, module))
    }

    /// If the module is cached, makes `client` hold it and returns `true`.
    fn hold_cached(&self, client: ClientId, hash: &ModuleHash) -> Result<bool> {
        match self.cache().hold(client, hash) {
            None => Ok(false),
            Some(held) => {
                self.evicted(held?);
                Ok(true)
            }
        }
    }

    /// `true` if a module with this hash is loaded.
    pub fn contains(&self, hash: &ModuleHash) -> bool {
        self.cache().contains(hash)
    }

    /// Drops a module from the cache; `false` if it was not there. Running invocations keep
    /// their own reference and finish normally.
    pub fn unload(&self, hash: &ModuleHash) -> bool {
        self.cache().remove(hash)
    }

    /// Modules `client` holds in the cache.
    fn held_by(&self, client: ClientId) -> usize {
        self.cache().held_by(client)
    }

    /// Ends every hold of `client`; modules nobody else holds leave the cache.
    fn release(&self, client: ClientId) {
        let evicted = self.cache().release(client);
        self.evicted(evicted);
    }

    /// Counts modules that left a cache (the application's, or the lambda service's).
    pub(crate) fn evicted(&self, n: usize) {
        self.evictions.fetch_add(n as u64, Ordering::Relaxed);
        rdmactor::metrics::lambda_modules_evicted(n as u64);
    }

    /// Modules in the cache.
    pub fn cached_modules(&self) -> usize {
        self.cache().len()
    }

    /// Bytes the cached modules take (Wasm plus machine code).
    pub fn cached_bytes(&self) -> usize {
        self.cache().bytes()
    }

    /// Modules compiled so far (cache misses of [`load`](Sandbox::load), including invalid
    /// modules).
    pub fn compilations(&self) -> u64 {
        self.compilations.load(Ordering::Relaxed)
    }

    /// Modules that left the cache so far: evicted to stay within its bounds or a
    /// client's quota, or let go by every client that held them.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Invocations running now.
    pub fn running_workers(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// The machine code this sandbox compiles `bytes` to, as the ELF object wasmtime
    /// produces (`objdump -d` reads it): to see what Cranelift emits for a guest.
    ///
    /// # Errors
    ///
    /// [`InvalidModule`](LambdaError::InvalidModule) if the bytes do not compile.
    pub fn precompile(&self, bytes: &[u8]) -> Result<Vec<u8>> {
        self.engine
            .precompile_module(bytes)
            .map_err(|e| LambdaError::InvalidModule(format!("{e:#}")))
    }

    /// Runs a loaded module on `input`, on the calling thread, and returns its output.
    /// Every limit holds without help from the caller: fuel and memory stop the guest
    /// with a trap, and the epoch ticker stops it at its wall-clock deadline.
    ///
    /// # Errors
    ///
    /// [`UnknownLambda`](LambdaError::UnknownLambda) if the hash is not in the cache
    /// (never loaded, or evicted since), [`Busy`](LambdaError::Busy), and any error the
    /// guest causes: see [`LambdaError`].
    pub fn run(&self, hash: &ModuleHash, input: &[u8], limits: &Limits) -> Result<Vec<u8>> {
        self.run_for(
            ClientId::APPLICATION,
            hash,
            input,
            limits,
            &mut Phases::default(),
        )
    }

    /// [`run`](Sandbox::run), recording in `phases` where the time went (for benchmarks).
    ///
    /// # Errors
    ///
    /// As [`run`](Sandbox::run).
    pub fn run_with_phases(
        &self,
        hash: &ModuleHash,
        input: &[u8],
        limits: &Limits,
        phases: &mut Phases,
    ) -> Result<Vec<u8>> {
        self.run_for(ClientId::APPLICATION, hash, input, limits, phases)
    }

    /// Runs `hash` for `client`: a run marks the module as just used in the client's own
    /// holds (if it holds it), so that the module is the last of them to be let go.
    fn run_for(
        &self,
        client: ClientId,
        hash: &ModuleHash,
        input: &[u8],
        limits: &Limits,
        phases: &mut Phases,
    ) -> Result<Vec<u8>> {
        let compiled = self
            .cache()
            .get(client, hash)
            .ok_or_else(|| LambdaError::UnknownLambda(hash.to_string()))?;
        self.run_compiled(&compiled, input, limits, phases)
    }

    /// Runs a compiled module on `input`, on the calling thread (see
    /// [`run`](Sandbox::run)); the lambda service finds `compiled` in its own cache.
    pub(crate) fn run_compiled(
        &self,
        compiled: &Compiled,
        input: &[u8],
        limits: &Limits,
        phases: &mut Phases,
    ) -> Result<Vec<u8>> {
        let start = Instant::now();
        let deadline = start + limits.wall_clock;
        let _worker = WorkerSlot::claim(&self.running, self.config.max_workers)?;
        let ticking = self.ticker.running(deadline);
        let output = panic::catch_unwind(AssertUnwindSafe(|| {
            invoke::invoke(&self.engine, compiled, input, limits, deadline, phases)
        }))
        .unwrap_or_else(|panic| Err(LambdaError::Trap(panic_message(&*panic))));
        drop(ticking);
        phases.total = start.elapsed();
        output
    }

    /// [`run`](Sandbox::run), taking ownership of the input.
    ///
    /// # Errors
    ///
    /// As [`run`](Sandbox::run).
    pub fn run_owned(&self, hash: &ModuleHash, input: Vec<u8>, limits: &Limits) -> Result<Vec<u8>> {
        self.run(hash, &input, limits)
    }
}

/// One of [`SandboxConfig::max_workers`] slots, released on drop.
struct WorkerSlot(Arc<AtomicUsize>);

impl WorkerSlot {
    fn claim(running: &Arc<AtomicUsize>, max: usize) -> Result<Self> {
        running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| LambdaError::Busy { limit: max })?;
        Ok(Self(Arc::clone(running)))
    }
}

impl Drop for WorkerSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Refuses a `start` section: it would run guest code during instantiation, and the ABI
/// has no use for it. wasmtime has no switch for this, so the sections are scanned
/// (cheap: no function bodies are parsed); malformed bytes are left to the compiler's
/// validation, which reports them properly.
fn refuse_start_function(bytes: &[u8]) -> Result<()> {
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        match payload {
            Ok(wasmparser::Payload::StartSection { .. }) => {
                return Err(LambdaError::InvalidModule(
                    "lambdas may not have a start function".into(),
                ))
            }
            Ok(_) => {}
            Err(_) => return Ok(()),
        }
    }
    Ok(())
}

/// Refuses imports and checks the ABI's exports and their types.
fn check_abi(engine: &Engine, module: Module, wasm_len: usize) -> Result<Compiled> {
    let imports: Vec<String> = module
        .imports()
        .map(|i| format!("{}.{}", i.module(), i.name()))
        .collect();
    if !imports.is_empty() {
        return Err(LambdaError::ImportsNotAllowed(imports));
    }
    let min_memory_bytes = match module.get_export(EXPORT_MEMORY) {
        Some(ExternType::Memory(ty)) if !ty.is_64() && !ty.is_shared() => {
            ty.minimum().saturating_mul(WASM_PAGE_BYTES)
        }
        _ => {
            return Err(LambdaError::MissingExport(format!(
                "`{EXPORT_MEMORY}`: a 32-bit linear memory"
            )))
        }
    };
    let same = |got: Vec<ValType>, want: &[ValType]| {
        got.len() == want.len() && got.iter().zip(want).all(|(a, b)| ValType::eq(a, b))
    };
    let check_func =
        |name: &str, params: &[ValType], results: &[ValType]| match module.get_export(name) {
            Some(ExternType::Func(ty))
                if same(ty.params().collect(), params) && same(ty.results().collect(), results) =>
            {
                Ok(())
            }
            _ => Err(LambdaError::MissingExport(format!(
                "`{name}`: a function {params:?} -> {results:?}"
            ))),
        };
    check_func(EXPORT_ALLOC, &[ValType::I32], &[ValType::I32])?;
    check_func(EXPORT_RUN, &[ValType::I32, ValType::I32], &[ValType::I64])?;
    let image = module.image_range();
    let code_bytes = (image.end as usize).saturating_sub(image.start as usize);
    let export = |name: &str| {
        module
            .get_export_index(name)
            .ok_or_else(|| LambdaError::MissingExport(name.to_string()))
    };
    let exports = AbiExports {
        memory: export(EXPORT_MEMORY)?,
        alloc: export(EXPORT_ALLOC)?,
        run: export(EXPORT_RUN)?,
    };
    // No imports (checked above), so an empty linker resolves everything.
    let pre = Linker::new(engine)
        .instantiate_pre(&module)
        .map_err(|e| LambdaError::InvalidModule(format!("{e:#}")))?;
    Ok(Compiled {
        pre,
        exports,
        min_memory_bytes,
        cost: wasm_len.saturating_add(code_bytes),
    })
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let what = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("unknown panic");
    format!("the sandbox panicked: {what}")
}
