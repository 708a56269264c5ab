//! The bounded fuzz run of every decoder of peer bytes, on stable Rust, in every
//! `cargo test`: the committed corpus (`fuzz/corpus/<target>/`) replayed, then a time
//! budget per target of seeded random inputs and mutations of the corpus. No input may
//! panic, and no input may make the decoders hold more than [`ALLOC_CAP`] bytes of heap
//! at once: a length field a peer controls must never size an allocation by itself.
//! The heap is watched by the `cap` crate's allocator, limited around each input; an
//! allocation past the limit fails, which aborts the test binary with "memory
//! allocation of N bytes failed" after the line naming the target being fed (inputs
//! are seeded, so the run repeats). `cargo fuzz` runs the same targets longer (see
//! `fuzz/Cargo.toml` and the README).

use std::alloc::System;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cap::Cap;
use rdmactor_services::file_transfer::fuzz::{run_sequence, Bytes};
use rdmactor_services::fuzz::Target;

/// Most heap the decoders may hold at once for one input of at most 4 KiB.
const ALLOC_CAP: usize = 4 << 20;
/// Time for each target's random and mutated inputs.
const BUDGET: Duration = Duration::from_millis(300);

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

/// The limit is on the whole process's heap: the tests of this binary take turns, so
/// that one's allocations never count against another's input.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `f` with the heap limited to what is allocated now plus [`ALLOC_CAP`].
fn limited<T>(f: impl FnOnce() -> T) -> T {
    ALLOCATOR
        .set_limit(ALLOCATOR.allocated() + ALLOC_CAP)
        .expect("the limit is above what is allocated");
    let out = f();
    ALLOCATOR.set_limit(usize::MAX).expect("no limit");
    out
}

/// xorshift64*: seeded, so a failure names the seed and input to reproduce it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

fn corpus(target: Target) -> Vec<Vec<u8>> {
    let mut inputs = target.seeds();
    if let Ok(dir) = std::fs::read_dir(corpus_dir(target.name())) {
        for entry in dir {
            inputs.push(std::fs::read(entry.unwrap().path()).unwrap());
        }
    }
    inputs
}

fn mutate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    if corpus.is_empty() || rng.below(4) == 0 {
        let len = rng.below(512);
        return (0..len).map(|_| rng.next() as u8).collect();
    }
    let mut v = corpus[rng.below(corpus.len())].clone();
    for _ in 0..=rng.below(4) {
        match rng.below(6) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = [0, 0xff, 0x7f, 0x80, 1][rng.below(5)];
            }
            2 => {
                let i = rng.below(v.len() + 1);
                v.insert(i, rng.next() as u8);
            }
            3 => v.truncate(rng.below(v.len() + 1)),
            4 if !v.is_empty() => {
                let a = rng.below(v.len());
                let b = a + rng.below(v.len() - a);
                let dup = v[a..=b.min(v.len() - 1)].to_vec();
                v.extend(dup);
            }
            _ => {
                let other = &corpus[rng.below(corpus.len())];
                let cut = rng.below(other.len() + 1);
                v.extend_from_slice(&other[cut..]);
            }
        }
    }
    v.truncate(4096);
    v
}

/// A panic inside [`limited`] is reported with the limit lifted: formatting its message
/// and backtrace allocates, and an allocation failing there aborts the binary with no
/// word of the panic (or hangs it) instead of failing the test with the input.
fn report_panics_unlimited() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let _ = ALLOCATOR.set_limit(usize::MAX);
            report(info);
        }));
    });
}

/// Runs one input with the heap limited; panics name the target and input.
fn feed(target: Target, input: &[u8]) {
    report_panics_unlimited();
    let result = limited(|| std::panic::catch_unwind(|| target.run(input)));
    if let Err(panic) = result {
        std::panic::resume_unwind(Box::new(format!(
            "{} panicked on {:02x?}: {:?}",
            target.name(),
            input,
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        )));
    }
}

#[test]
fn every_decoder_survives_its_corpus_and_a_bounded_random_run() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (i, target) in Target::ALL.into_iter().enumerate() {
        eprintln!("{:<18} feeding", target.name());
        let corpus = corpus(target);
        assert!(!corpus.is_empty(), "{} has seeds", target.name());
        for input in &corpus {
            feed(target, input);
        }
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1));
        let started = Instant::now();
        let mut runs = 0u64;
        while started.elapsed() < BUDGET {
            let input = mutate(&mut rng, &corpus);
            feed(target, &input);
            runs += 1;
        }
        eprintln!(
            "{:<18} {} corpus inputs, {runs} generated",
            target.name(),
            corpus.len()
        );
    }
}

#[test]
fn file_transfer_sequences_survive_a_bounded_random_run() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x5eed);
    let started = Instant::now();
    let mut runs = 0;
    while started.elapsed() < BUDGET {
        let data: Vec<u8> = (0..rng.below(256)).map(|_| rng.next() as u8).collect();
        run_sequence(&mut Bytes(&data), dir.path(), 64);
        runs += 1;
    }
    eprintln!("file_transfer_sequences: {runs} generated");
}

/// Writes each target's seeds into `fuzz/corpus/<target>/` (run by hand after adding a
/// target: `cargo test -p rdmactor-services --test fuzz_decoders -- --ignored`).
#[test]
#[ignore]
fn write_seed_corpus() {
    for target in Target::ALL {
        let dir = corpus_dir(target.name());
        std::fs::create_dir_all(&dir).unwrap();
        for (i, seed) in target.seeds().iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), seed).unwrap();
        }
    }
}
