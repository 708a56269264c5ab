//! One invocation in a fresh store: instantiate, `alloc`, copy the input in, `run`, copy
//! the output out; and the translation of wasmtime's errors into [`LambdaError`]s.

use std::time::{Duration, Instant};

use wasmtime::{Engine, Extern, Store, Trap, TypedFunc, UpdateDeadline};

use super::cache::{Compiled, EXPORT_ALLOC, EXPORT_MEMORY, EXPORT_RUN};
use super::limits::{GuestLimiter, Host};
use super::{LambdaError, Limits, Result};

/// Where one invocation's time went, for benchmarks (`examples/src/bin/lambda_bench.rs`): the
/// sandbox's own costs (instantiation, copies) apart from the guest's code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Phases {
    /// Store set-up and instantiation (a pooled instance slot, memory reset).
    pub instantiate: Duration,
    /// `alloc` and copying the input into linear memory.
    pub copy_in: Duration,
    /// The guest's `run`.
    pub run: Duration,
    /// Checking and copying the output out.
    pub copy_out: Duration,
    /// Dropping the store: the instance goes back to the pool, its memory is reset.
    pub teardown: Duration,
    /// The whole of [`Sandbox::run`](super::Sandbox::run): the phases above plus the
    /// cache lookup, the worker slot and the epoch ticker's start.
    pub total: Duration,
}

/// Runs `compiled` on `input` within `limits`, on the calling thread; `deadline` is when
/// [`Limits::wall_clock`] runs out.
pub(super) fn invoke(
    engine: &Engine,
    compiled: &Compiled,
    input: &[u8],
    limits: &Limits,
    deadline: Instant,
    phases: &mut Phases,
) -> Result<Vec<u8>> {
    let start = Instant::now();
    if input.len() > limits.max_memory_bytes {
        return Err(LambdaError::InputTooLarge {
            len: input.len(),
            limit: limits.max_memory_bytes,
        });
    }
    if compiled.min_memory_bytes > limits.max_memory_bytes as u64 {
        return Err(LambdaError::MemoryLimit {
            limit: limits.max_memory_bytes,
        });
    }
    let mut store = Store::new(
        engine,
        Host {
            limiter: GuestLimiter::new(limits.max_memory_bytes),
            timed_out: false,
        },
    );
    store.limiter(|host| &mut host.limiter);
    store
        .set_fuel(limits.fuel)
        .map_err(|e| LambdaError::Trap(e.to_string()))?;
    // At every epoch tick, compare the clock with the deadline (see `clock`).
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |mut cx| {
        if Instant::now() >= deadline {
            cx.data_mut().timed_out = true;
            Ok(UpdateDeadline::Interrupt)
        } else {
            Ok(UpdateDeadline::Continue(1))
        }
    });
    let fail = |store: &Store<Host>, e: wasmtime::Error| classify(store, &e, limits);

    let instance = compiled
        .pre
        .instantiate(&mut store)
        .map_err(|e| fail(&store, e))?;
    let missing = |what: &str| LambdaError::MissingExport(what.to_string());
    let exports = &compiled.exports;
    let memory = match instance.get_module_export(&mut store, &exports.memory) {
        Some(Extern::Memory(memory)) => memory,
        _ => return Err(missing(EXPORT_MEMORY)),
    };
    let func = |store: &mut Store<Host>, export, name| match instance
        .get_module_export(&mut *store, export)
    {
        Some(Extern::Func(func)) => Ok(func),
        _ => Err(missing(name)),
    };
    let alloc: TypedFunc<i32, i32> = func(&mut store, &exports.alloc, EXPORT_ALLOC)?
        .typed(&store)
        .map_err(|_| missing(EXPORT_ALLOC))?;
    let run: TypedFunc<(i32, i32), i64> = func(&mut store, &exports.run, EXPORT_RUN)?
        .typed(&store)
        .map_err(|_| missing(EXPORT_RUN))?;

    let instantiated = Instant::now();
    phases.instantiate = instantiated - start;
    let len = i32::try_from(input.len()).map_err(|_| LambdaError::InputTooLarge {
        len: input.len(),
        limit: i32::MAX as usize,
    })?;
    let ptr = alloc.call(&mut store, len).map_err(|e| fail(&store, e))?;
    memory
        .write(&mut store, ptr as u32 as usize, input)
        .map_err(|_| {
            LambdaError::BadResult(format!(
                "alloc({len}) returned {ptr}, but memory has {} bytes",
                memory.data_size(&store)
            ))
        })?;
    let copied = Instant::now();
    phases.copy_in = copied - instantiated;
    let packed = run
        .call(&mut store, (ptr, len))
        .map_err(|e| fail(&store, e))?;
    let ran = Instant::now();
    phases.run = ran - copied;
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
    let output = out_ptr
        .checked_add(out_len)
        .and_then(|end| data.get(out_ptr..end))
        .map(<[u8]>::to_vec)
        .ok_or_else(|| {
            LambdaError::BadResult(format!(
                "run returned {out_len} bytes at {out_ptr}, but memory has {} bytes",
                data.len()
            ))
        });
    let copied_out = Instant::now();
    phases.copy_out = copied_out - ran;
    drop(store);
    phases.teardown = copied_out.elapsed();
    output
}

/// Turns an error from instantiation or a call into a [`LambdaError`]. The store's own
/// records come first: a refused growth and a passed deadline each raise a trap whose
/// kind alone would not say which limit was hit.
fn classify(store: &Store<Host>, e: &wasmtime::Error, limits: &Limits) -> LambdaError {
    let host = store.data();
    if host.limiter.refused {
        return LambdaError::MemoryLimit {
            limit: limits.max_memory_bytes,
        };
    }
    if host.timed_out {
        return LambdaError::Timeout {
            limit: limits.wall_clock,
        };
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => LambdaError::OutOfFuel { fuel: limits.fuel },
        Some(trap) => LambdaError::Trap(trap.to_string()),
        None => LambdaError::Trap(format!("{e:#}")),
    }
}
