//! The WebAssembly sandbox: a wasmi [`Engine`] with fuel metering, a module cache keyed by
//! BLAKE3 hash, and one fresh [`Store`] per invocation, run on its own worker thread.

use std::collections::HashMap;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use wasmi::errors::{ErrorKind, MemoryError};
use wasmi::{
    CompilationMode, Config, CustomFuelCosts, EnforcedLimits, Engine, ExternType, Instance, Memory,
    Module, Store, StoreLimits, StoreLimitsBuilder, TrapCode, TypedFunc, TypedResumableCall,
    ValType, WasmParams, WasmResults,
};

/// Everything that can go wrong when loading or running a lambda.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LambdaError {
    /// The bytes are not a valid WebAssembly module (or use a feature the sandbox turns off,
    /// such as a `start` function or 64-bit memory).
    #[error("invalid WebAssembly module: {0}")]
    InvalidModule(String),
    /// The module is bigger than [`SandboxConfig::max_module_bytes`].
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
    /// The module cache holds [`SandboxConfig::max_cached_modules`] modules already.
    #[error("module cache is full ({limit} modules)")]
    CacheFull {
        /// The configured limit.
        limit: usize,
    },
    /// No module with this hash was loaded, or no native lambda has this name.
    #[error("unknown lambda {0}")]
    UnknownLambda(String),
    /// [`SandboxConfig::max_workers`] invocations are still running.
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
        /// [`Limits::max_memory_bytes`].
        limit: usize,
    },
    /// The guest trapped (`unreachable`, out-of-bounds access, division by zero, stack
    /// exhaustion, ...). The string is wasmi's description.
    #[error("lambda trapped: {0}")]
    Trap(String),
    /// The guest executed more instructions than [`Limits::fuel`] allows.
    #[error("lambda ran out of fuel ({fuel} units)")]
    OutOfFuel {
        /// [`Limits::fuel`].
        fuel: u64,
    },
    /// The guest's memory (or a table) would have grown beyond [`Limits::max_memory_bytes`].
    #[error("lambda exceeded its memory limit of {limit} bytes")]
    MemoryLimit {
        /// [`Limits::max_memory_bytes`].
        limit: usize,
    },
    /// The invocation did not finish within [`Limits::wall_clock`].
    #[error("lambda did not finish within {limit:?}")]
    Timeout {
        /// [`Limits::wall_clock`].
        limit: Duration,
    },
    /// `alloc` or `run` returned a pointer/length outside the guest's memory.
    #[error("lambda broke the ABI: {0}")]
    BadResult(String),
    /// `run` returned more bytes than [`Limits::max_output`].
    #[error("lambda output of {len} bytes is larger than the limit of {limit} bytes")]
    OutputTooLarge {
        /// Length the guest returned.
        len: usize,
        /// [`Limits::max_output`].
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

/// Per-invocation limits. A server would typically take a client's requested limits and
/// [`cap`](Limits::capped_by) them with its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Fuel for the whole invocation (`alloc` plus `run`); roughly one unit per executed
    /// Wasm instruction, plus one per 64 bytes that `memory.grow/fill/copy` touch.
    pub fuel: u64,
    /// Largest size the guest's linear memory may reach, in bytes (rounded down to whole
    /// 64 KiB pages by the guest's `memory.grow`).
    pub max_memory_bytes: usize,
    /// Wall-clock limit for the invocation, from the call to [`Sandbox::run`] to its result.
    pub wall_clock: Duration,
    /// Largest output the guest may return, in bytes.
    pub max_output: usize,
}

impl Default for Limits {
    /// 1e9 fuel (about a second of interpretation), 64 MiB of memory, 2 s of wall clock,
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
    /// Largest module [`Sandbox::load`] accepts, in bytes.
    pub max_module_bytes: usize,
    /// Most modules kept in the cache; [`Sandbox::unload`] makes room.
    pub max_cached_modules: usize,
    /// Most invocations running at once. A timed-out invocation stops within one fuel
    /// slice of its deadline, and its worker counts until it has.
    pub max_workers: usize,
}

impl Default for SandboxConfig {
    /// 8 MiB modules, 1024 cached modules, 64 workers.
    fn default() -> Self {
        Self {
            max_module_bytes: 8 << 20,
            max_cached_modules: 1024,
            max_workers: 64,
        }
    }
}

/// BLAKE3 hash of a module's bytes: the name a client uses to run a loaded module.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ModuleHash([u8; 32]);

impl ModuleHash {
    /// Hashes module bytes.
    pub fn of(bytes: &[u8]) -> Self {
        Self(*blake3::hash(bytes).as_bytes())
    }

    /// Wraps a hash received from elsewhere (e.g. a client's request).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The 32 hash bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for ModuleHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for ModuleHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ModuleHash({self})")
    }
}

/// Exported linear memory, per the ABI.
const EXPORT_MEMORY: &str = "memory";
/// Exported `alloc(len: i32) -> i32`, per the ABI.
const EXPORT_ALLOC: &str = "alloc";
/// Exported `run(ptr: i32, len: i32) -> i64`, per the ABI.
const EXPORT_RUN: &str = "run";
/// Bytes `memory.grow/fill/copy` may touch per unit of fuel (wasmi's default, set
/// explicitly because [`classify`] relies on it).
const BYTES_PER_FUEL: u32 = 64;
/// Size of a Wasm memory page.
const WASM_PAGE_BYTES: u64 = 64 << 10;
/// Most elements a guest table may hold.
const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Most tables a guest may define (as [`EnforcedLimits::strict`] allows at load).
const MAX_TABLES: usize = 100;
/// Fuel the guest gets at a time; between slices the worker checks the wall clock. wasmi
/// has no interrupt, so this is what makes a timeout stop the work for real (a slice
/// takes well under a millisecond in release builds, a few in debug builds) instead of
/// leaving a worker burning the rest of its fuel after the caller was told `Timeout`.
const FUEL_SLICE: u64 = 100_000;

/// A validated, compiled module and what `run` needs to know about it.
#[derive(Debug, Clone)]
struct Compiled {
    module: Module,
    /// The memory's declared minimum size, in bytes.
    min_memory_bytes: u64,
}

/// Validates, compiles, caches and runs WebAssembly lambdas. Cheap to share: `&Sandbox` is
/// all [`load`](Sandbox::load) and [`run`](Sandbox::run) need, from any thread.
pub struct Sandbox {
    engine: Engine,
    config: SandboxConfig,
    modules: RwLock<HashMap<ModuleHash, Compiled>>,
    /// Held while compiling, so that concurrent loads of the same bytes compile once.
    compiling: Mutex<()>,
    compilations: AtomicU64,
    running: Arc<AtomicUsize>,
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
    pub fn with_config(config: SandboxConfig) -> Self {
        let mut wasm = Config::default();
        wasm.consume_fuel(true)
            .fuel_cost(CustomFuelCosts {
                bytes_copied_per_fuel: BYTES_PER_FUEL,
                fuel_per_bytes_translated: 7,
                fuel_per_bytes_validated: 2,
            })
            // Validate and translate everything in `load`, nothing on first call.
            .compilation_mode(CompilationMode::Eager)
            // Caps on globals, functions, params, ... against compile-time bombs.
            .enforced_limits(EnforcedLimits::strict())
            // A start function would run during instantiation; the ABI has no use for it.
            .allow_start_fn(false)
            // One 32-bit memory, so that pointers are i32 and the limit is per lambda.
            .wasm_memory64(false)
            .wasm_multi_memory(false);
        Self {
            engine: Engine::new(&wasm),
            config,
            modules: RwLock::new(HashMap::new()),
            compiling: Mutex::new(()),
            compilations: AtomicU64::new(0),
            running: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The sandbox's own limits.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// Validates and compiles a module, or finds it in the cache, and returns its hash.
    ///
    /// # Errors
    ///
    /// [`ModuleTooLarge`](LambdaError::ModuleTooLarge),
    /// [`InvalidModule`](LambdaError::InvalidModule),
    /// [`ImportsNotAllowed`](LambdaError::ImportsNotAllowed),
    /// [`MissingExport`](LambdaError::MissingExport), [`CacheFull`](LambdaError::CacheFull).
    pub fn load(&self, bytes: &[u8]) -> Result<ModuleHash> {
        if bytes.len() > self.config.max_module_bytes {
            return Err(LambdaError::ModuleTooLarge {
                len: bytes.len(),
                limit: self.config.max_module_bytes,
            });
        }
        let hash = ModuleHash::of(bytes);
        if self.contains(&hash) {
            return Ok(hash);
        }
        let _compiling = self
            .compiling
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Someone may have compiled it while we waited for the lock.
        if self.contains(&hash) {
            return Ok(hash);
        }
        if self.cached_modules() >= self.config.max_cached_modules {
            return Err(LambdaError::CacheFull {
                limit: self.config.max_cached_modules,
            });
        }
        self.compilations.fetch_add(1, Ordering::Relaxed);
        let module = Module::new(&self.engine, bytes)
            .map_err(|e| LambdaError::InvalidModule(e.to_string()))?;
        let compiled = check_abi(module)?;
        tracing::debug!(%hash, len = bytes.len(), "compiled lambda module");
        self.modules
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(hash, compiled);
        Ok(hash)
    }

    /// `true` if a module with this hash is loaded.
    pub fn contains(&self, hash: &ModuleHash) -> bool {
        self.modules
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(hash)
    }

    /// Drops a module from the cache; `false` if it was not there. Running invocations keep
    /// their own reference and finish normally.
    pub fn unload(&self, hash: &ModuleHash) -> bool {
        self.modules
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(hash)
            .is_some()
    }

    /// Modules in the cache.
    pub fn cached_modules(&self) -> usize {
        self.modules
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Modules compiled so far (cache misses of [`load`](Sandbox::load), including invalid
    /// modules).
    pub fn compilations(&self) -> u64 {
        self.compilations.load(Ordering::Relaxed)
    }

    /// Invocations whose worker thread is still running, including timed-out ones.
    pub fn running_workers(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// Runs a loaded module on `input` and returns its output. Copies `input` once for the
    /// worker thread; [`run_owned`](Sandbox::run_owned) avoids that.
    ///
    /// # Errors
    ///
    /// [`UnknownLambda`](LambdaError::UnknownLambda) if the hash was never loaded,
    /// [`Busy`](LambdaError::Busy), and any error the guest causes: see [`LambdaError`].
    pub fn run(&self, hash: &ModuleHash, input: &[u8], limits: &Limits) -> Result<Vec<u8>> {
        self.run_owned(hash, input.to_vec(), limits)
    }

    /// [`run`](Sandbox::run), taking ownership of the input.
    ///
    /// # Errors
    ///
    /// As [`run`](Sandbox::run).
    pub fn run_owned(&self, hash: &ModuleHash, input: Vec<u8>, limits: &Limits) -> Result<Vec<u8>> {
        let compiled = self
            .modules
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(hash)
            .cloned()
            .ok_or_else(|| LambdaError::UnknownLambda(hash.to_string()))?;
        let worker = WorkerSlot::claim(&self.running, self.config.max_workers)?;
        let engine = self.engine.clone();
        let limits = *limits;
        let deadline = Instant::now() + limits.wall_clock;
        let (tx, rx) = mpsc::sync_channel(1);
        thread::Builder::new()
            .name("lambda".into())
            // The interpreter's frames are large in unoptimised builds; a generous stack
            // keeps deep guest recursion a wasmi stack-limit trap, not a host overflow.
            .stack_size(8 << 20)
            .spawn(move || {
                let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
                    invoke(&engine, &compiled, &input, &limits, deadline)
                }))
                .unwrap_or_else(|panic| Err(LambdaError::Trap(panic_message(&*panic))));
                // Free the slot before answering, so that the caller's next run finds it.
                drop(worker);
                // The caller may have given up (timeout); then nobody listens.
                let _ = tx.send(outcome);
            })
            .map_err(|e| LambdaError::Trap(format!("cannot start a worker thread: {e}")))?;
        // The worker checks the deadline between fuel slices and answers `Timeout`
        // itself, so waiting for it returns soon after the deadline, and only once the
        // guest has really stopped: the caller's job (and its per-connection count)
        // lasts exactly as long as the work.
        rx.recv()
            .unwrap_or_else(|_| Err(LambdaError::Trap("the worker thread died".into())))
    }
}

/// One of [`SandboxConfig::max_workers`] slots, released on drop (by the worker thread).
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

/// Refuses imports and checks the ABI's exports and their types.
fn check_abi(module: Module) -> Result<Compiled> {
    let imports: Vec<String> = module
        .imports()
        .map(|i| format!("{}.{}", i.module(), i.name()))
        .collect();
    if !imports.is_empty() {
        return Err(LambdaError::ImportsNotAllowed(imports));
    }
    let min_memory_bytes = match module.get_export(EXPORT_MEMORY) {
        // Custom page sizes are off (the engine's default), so pages are 64 KiB.
        Some(ExternType::Memory(ty)) => ty.minimum().saturating_mul(WASM_PAGE_BYTES),
        _ => {
            return Err(LambdaError::MissingExport(format!(
                "`{EXPORT_MEMORY}`: a linear memory"
            )))
        }
    };
    let check_func = |name: &str, params: &[ValType], results: &[ValType]| match module
        .get_export(name)
    {
        Some(ExternType::Func(ty)) if ty.params() == params && ty.results() == results => Ok(()),
        _ => Err(LambdaError::MissingExport(format!(
            "`{name}`: a function {params:?} -> {results:?}"
        ))),
    };
    check_func(EXPORT_ALLOC, &[ValType::I32], &[ValType::I32])?;
    check_func(EXPORT_RUN, &[ValType::I32, ValType::I32], &[ValType::I64])?;
    Ok(Compiled {
        module,
        min_memory_bytes,
    })
}

/// One invocation, in a fresh store: instantiate, `alloc`, copy the input in, `run`, copy
/// the output out.
fn invoke(
    engine: &Engine,
    compiled: &Compiled,
    input: &[u8],
    limits: &Limits,
    deadline: Instant,
) -> Result<Vec<u8>> {
    let memory_limit = LambdaError::MemoryLimit {
        limit: limits.max_memory_bytes,
    };
    if input.len() > limits.max_memory_bytes {
        return Err(LambdaError::InputTooLarge {
            len: input.len(),
            limit: limits.max_memory_bytes,
        });
    }
    if compiled.min_memory_bytes > limits.max_memory_bytes as u64 {
        return Err(memory_limit);
    }
    let mut store = Store::new(
        engine,
        StoreLimitsBuilder::new()
            .memory_size(limits.max_memory_bytes)
            .table_elements(MAX_TABLE_ELEMENTS)
            .instances(1)
            .memories(1)
            .tables(MAX_TABLES)
            // A refused `memory.grow` traps instead of returning -1, so that a memory bomb
            // ends at once with a recognisable trap (see `classify`).
            .trap_on_grow_failure(true)
            .build(),
    );
    store.limiter(|limits: &mut StoreLimits| limits);
    let fuel_err = |e: wasmi::Error| LambdaError::Trap(e.to_string());
    // Instantiation runs no guest code (no start function), only bounded set-up: it
    // gets the whole budget; the calls then get it a slice at a time.
    store.set_fuel(limits.fuel).map_err(fuel_err)?;
    let instance =
        Instance::new(&mut store, &compiled.module, &[]).map_err(|e| match e.kind() {
            ErrorKind::Memory(
                MemoryError::ResourceLimiterDeniedAllocation | MemoryError::OutOfSystemMemory,
            ) => memory_limit.clone(),
            _ => classify(&store, None, &e, limits, 0),
        })?;
    let left = store.get_fuel().map_err(fuel_err)?;
    let mut meter = Meter {
        reserve: left - left.min(FUEL_SLICE),
        deadline,
        limits: *limits,
    };
    store.set_fuel(left.min(FUEL_SLICE)).map_err(fuel_err)?;
    let missing = |what: &str| LambdaError::MissingExport(what.to_string());
    let memory = instance
        .get_memory(&store, EXPORT_MEMORY)
        .ok_or_else(|| missing(EXPORT_MEMORY))?;
    let alloc = instance
        .get_typed_func::<i32, i32>(&store, EXPORT_ALLOC)
        .map_err(|_| missing(EXPORT_ALLOC))?;
    let run = instance
        .get_typed_func::<(i32, i32), i64>(&store, EXPORT_RUN)
        .map_err(|_| missing(EXPORT_RUN))?;

    let len = i32::try_from(input.len()).map_err(|_| LambdaError::InputTooLarge {
        len: input.len(),
        limit: i32::MAX as usize,
    })?;
    let ptr = meter.call(&mut store, memory, &alloc, len)?;
    memory
        .write(&mut store, ptr as u32 as usize, input)
        .map_err(|_| {
            LambdaError::BadResult(format!(
                "alloc({len}) returned {ptr}, but memory has {} bytes",
                memory.data_size(&store)
            ))
        })?;
    let packed = meter.call(&mut store, memory, &run, (ptr, len))?;
    if packed < 0 {
        return Err(LambdaError::GuestError(packed));
    }
    let out_ptr = (packed >> 32) as usize;
    let out_len = (packed & 0xffff_ffff) as usize;
    if out_len > limits.max_output {
        return Err(LambdaError::OutputTooLarge {
            len: out_len,
            limit: limits.max_output,
        });
    }
    let data = memory.data(&store);
    out_ptr
        .checked_add(out_len)
        .and_then(|end| data.get(out_ptr..end))
        .map(<[u8]>::to_vec)
        .ok_or_else(|| {
            LambdaError::BadResult(format!(
                "run returned {out_len} bytes at {out_ptr}, but memory has {} bytes",
                data.len()
            ))
        })
}

/// The fuel not yet handed to the store, and the wall-clock deadline, of one
/// invocation.
struct Meter {
    /// Fuel of [`Limits::fuel`] not yet put into the store.
    reserve: u64,
    deadline: Instant,
    limits: Limits,
}

impl Meter {
    /// Calls `func`, topping the store's fuel up one [`FUEL_SLICE`] at a time from the
    /// reserve and checking the deadline before each top-up. Ends with
    /// [`LambdaError::Timeout`] once the deadline passed, with
    /// [`LambdaError::OutOfFuel`] once the reserve cannot pay what the guest needs.
    fn call<P: WasmParams, R: WasmResults>(
        &mut self,
        store: &mut Store<StoreLimits>,
        memory: Memory,
        func: &TypedFunc<P, R>,
        params: P,
    ) -> Result<R> {
        let limits = self.limits;
        let mut call = func
            .call_resumable(&mut *store, params)
            .map_err(|e| classify(store, Some(memory), &e, &limits, self.reserve))?;
        loop {
            let out_of_fuel = match call {
                TypedResumableCall::Finished(r) => return Ok(r),
                TypedResumableCall::HostTrap(_) => {
                    // Lambdas import nothing, so there is no host function to trap in.
                    return Err(LambdaError::Trap("unexpected host trap".into()));
                }
                TypedResumableCall::OutOfFuel(call) => call,
            };
            if Instant::now() >= self.deadline {
                return Err(LambdaError::Timeout {
                    limit: limits.wall_clock,
                });
            }
            let have = store.get_fuel().unwrap_or(0);
            let need = out_of_fuel.required_fuel();
            if have.saturating_add(self.reserve) < need {
                return Err(LambdaError::OutOfFuel { fuel: limits.fuel });
            }
            let add = need.saturating_sub(have).max(FUEL_SLICE).min(self.reserve);
            self.reserve -= add;
            store
                .set_fuel(have + add)
                .map_err(|e| LambdaError::Trap(e.to_string()))?;
            call = out_of_fuel
                .resume(&mut *store)
                .map_err(|e| classify(store, Some(memory), &e, &limits, self.reserve))?;
        }
    }
}

/// Turns a wasmi error from instantiation or a call into a [`LambdaError`].
///
/// wasmi 2 does not export the error type of [`wasmi::ResourceLimiter`], so a limiter that
/// records its refusals cannot be written outside wasmi; [`StoreLimits`] with
/// `trap_on_grow_failure` is used instead, and the trap is interpreted here.
///
/// A refused `memory.grow` traps with [`TrapCode::GrowthOperationLimited`], but wasmi also
/// uses that trap when a `memory.grow` the limiter allowed finds too little fuel left. The
/// two are told apart by the remaining fuel: any grow within the limit costs at most
/// `(limit - current size) / BYTES_PER_FUEL`, so with at least that much left (in the
/// store and in the `reserve` not yet handed to it), the limit refused it.
fn classify(
    store: &Store<StoreLimits>,
    memory: Option<Memory>,
    e: &wasmi::Error,
    limits: &Limits,
    reserve: u64,
) -> LambdaError {
    match e.as_trap_code() {
        Some(TrapCode::OutOfFuel) => LambdaError::OutOfFuel { fuel: limits.fuel },
        Some(TrapCode::GrowthOperationLimited) => {
            let fuel_left = store.get_fuel().unwrap_or(0).saturating_add(reserve);
            let current = memory.map_or(0, |m| m.data_size(store));
            let max_grow_cost =
                limits.max_memory_bytes.saturating_sub(current) as u64 / u64::from(BYTES_PER_FUEL);
            if fuel_left < max_grow_cost {
                LambdaError::OutOfFuel { fuel: limits.fuel }
            } else {
                LambdaError::MemoryLimit {
                    limit: limits.max_memory_bytes,
                }
            }
        }
        Some(TrapCode::OutOfSystemMemory) => LambdaError::MemoryLimit {
            limit: limits.max_memory_bytes,
        },
        _ => LambdaError::Trap(e.to_string()),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    let what = panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("unknown panic");
    format!("the interpreter panicked: {what}")
}
