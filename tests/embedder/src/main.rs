//! Replays hostile frame sequences through rdmactor's connection harness (the fuzz
//! target's, `rdmactor::fuzz`) and prints one line per input: how the two cores took
//! it, or `PANIC` and the message. For the generated sequences (corpus and seeds) that
//! is each side's close reason, which the frames decide; how many honest messages got
//! through before the close depends on thread timing, so it is left out. For the named
//! adversarial sequences, which have no honest traffic, it is the whole outcome.
//! The inputs: the committed corpus of the `connection` fuzz target, seeded sequences
//! of the same generator, and rdmactor's named adversarial frame sequences (lengths,
//! credits and addresses at the edges where sums wrap). Exits 1 after a panic.
//!
//! `embedder-check <corpus dir> [seeds]`; run by `scripts/lib/embedder-check`, which
//! compares the output of two builds.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use rdmactor::fuzz::{
    adversarial, fuzz_connection_outcome, replay_frames, Bytes, Outcome, SplitMix,
};

fn main() {
    let mut args = std::env::args().skip(1);
    let corpus = PathBuf::from(
        args.next()
            .expect("usage: embedder-check <corpus dir> [seeds]"),
    );
    let seeds: u64 = args
        .next()
        .map_or(40, |s| s.parse().expect("a number of seeds"));
    // The panic's message goes on the input's line, not to stderr.
    std::panic::set_hook(Box::new(|_| {}));
    // Which profile this is, for the script to check it compared what it meant to: an
    // overflow panics only with overflow-checks on.
    let wrapped = catch_unwind(|| std::hint::black_box(u8::MAX) + std::hint::black_box(1u8));
    eprintln!(
        "embedder-check: overflow-checks {}",
        if wrapped.is_err() { "on" } else { "off" }
    );
    let mut panics = 0;
    let mut report = |name: &str, whole: bool, run: &mut dyn FnMut() -> Outcome| match catch_unwind(
        AssertUnwindSafe(run),
    ) {
        Ok(outcome) if whole => println!("{name}: {outcome}"),
        Ok(o) => println!(
            "{name}: a: {} | b: {}",
            o.a.as_deref().unwrap_or("open"),
            o.b.as_deref().unwrap_or("open")
        ),
        Err(e) => {
            panics += 1;
            let msg = e
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| e.downcast_ref::<&str>().copied())
                .unwrap_or("(not a string)");
            println!("{name}: PANIC {msg}");
        }
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&corpus)
        .unwrap_or_else(|e| panic!("{}: {e}", corpus.display()))
        .map(|entry| entry.expect("a corpus entry").path())
        .collect();
    files.sort();
    for file in &files {
        let data = std::fs::read(file).expect("a corpus file");
        let name = format!(
            "corpus {}",
            file.file_name().unwrap_or_default().to_string_lossy()
        );
        report(&name, false, &mut || {
            fuzz_connection_outcome(&mut Bytes(&data))
        });
    }
    for seed in 0..seeds {
        report(&format!("seed {seed}"), false, &mut || {
            fuzz_connection_outcome(&mut SplitMix(seed))
        });
    }
    for (name, frames) in adversarial() {
        report(&format!("adversarial {name}"), true, &mut || {
            replay_frames(&frames)
        });
    }
    if panics > 0 {
        eprintln!("embedder-check: {panics} input(s) panicked");
        std::process::exit(1);
    }
}
