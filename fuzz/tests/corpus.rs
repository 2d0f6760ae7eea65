//! Every fuzz target, briefly, on stable Rust as part of the suite: each input of
//! `fuzz/corpus/<target>/` (the seeds) and `fuzz/regressions/<target>/` (every crash ever
//! found, named for what it broke), then mutations of them — bits flipped, bytes
//! overwritten, inserted, deleted, ranges repeated, inputs spliced. A panic fails the test
//! naming the file, or the seed that reproduces the mutation (`HERALD_FUZZ_SEED=<seed>`),
//! and writes the input to `target/fuzz-failures/`.
//!
//! `HERALD_FUZZ_MUTATIONS` sets how many mutations each target gets (default: 3,000; the
//! HTTP target, which runs a real router, a sixth of that). Coverage-guided fuzzing at length
//! is `scripts/fuzz.sh`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_owned()
}

/// The files of `fuzz/<kind>/<target>/`, sorted.
fn inputs(kind: &str, target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = fuzz_dir().join(kind).join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries.filter_map(Result::ok).map(|entry| entry.path()).collect();
    files.sort();
    files
        .into_iter()
        .filter(|path| path.is_file())
        .map(|path| {
            let bytes = std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            (path, bytes)
        })
        .collect()
}

/// Runs `target` on `input`; on a panic, keeps the input and says how to get it back.
fn survives(name: &str, target: fn(&[u8]), input: &[u8], origin: &str) {
    if catch_unwind(AssertUnwindSafe(|| target(input))).is_ok() {
        return;
    }
    let failures = fuzz_dir().join("../target/fuzz-failures");
    let _ = std::fs::create_dir_all(&failures);
    let digest: u64 =
        input.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let kept = failures.join(format!("{name}-{digest:016x}"));
    let _ = std::fs::write(&kept, input);
    panic!(
        "fuzz target {name} panicked on {origin}; the input is in {} — add it to fuzz/regressions/{name}/ \
         once fixed",
        kept.display()
    );
}

/// One random change to `input`.
fn mutate(rng: &mut StdRng, input: &mut Vec<u8>, others: &[(PathBuf, Vec<u8>)]) {
    let len = input.len();
    match rng.random_range(0..7) {
        0 if len > 0 => {
            let at = rng.random_range(0..len);
            input[at] ^= 1 << rng.random_range(0..8);
        }
        1 if len > 0 => {
            let at = rng.random_range(0..len);
            input[at] = *[0u8, 0xff, b'"', b'{', b'[', b'\\', b'0', 0x80].get(rng.random_range(0..8)).unwrap_or(&0);
        }
        2 => {
            let at = rng.random_range(0..=len);
            let mut extra = vec![0u8; rng.random_range(1..16)];
            rng.fill_bytes(&mut extra);
            input.splice(at..at, extra);
        }
        3 if len > 0 => {
            let start = rng.random_range(0..len);
            let end = rng.random_range(start..=len.min(start + 32));
            input.drain(start..end);
        }
        4 if len > 0 => {
            let start = rng.random_range(0..len);
            let end = rng.random_range(start..=len.min(start + 64));
            let piece = input[start..end].to_vec();
            for _ in 0..rng.random_range(1..8) {
                input.splice(start..start, piece.iter().copied());
            }
        }
        5 if !others.is_empty() => {
            let (_, other) = &others[rng.random_range(0..others.len())];
            let at = rng.random_range(0..=len);
            let from = rng.random_range(0..=other.len());
            input.truncate(at);
            input.extend_from_slice(&other[from..]);
        }
        _ => input.truncate(rng.random_range(0..=len)),
    }
}

fn run(name: &str) {
    let (_, target) = *herald_fuzz::TARGETS.iter().find(|(n, _)| *n == name).expect("a target of that name");
    let seeds = inputs("corpus", name);
    assert!(!seeds.is_empty(), "fuzz/corpus/{name}/ holds the target's seeds");
    for (path, input) in seeds.iter().chain(&inputs("regressions", name)) {
        survives(name, target, input, &path.display().to_string());
    }
    let default = if name == "http_api" { 500 } else { 3_000 };
    let mutations = std::env::var("HERALD_FUZZ_MUTATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let seed = std::env::var("HERALD_FUZZ_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(rand::random::<u64>);
    let mut rng = StdRng::seed_from_u64(seed);
    for round in 0..mutations {
        let (_, base) = &seeds[rng.random_range(0..seeds.len())];
        let mut input = base.clone();
        for _ in 0..rng.random_range(1..5) {
            mutate(&mut rng, &mut input, &seeds);
        }
        survives(name, target, &input, &format!("mutation {round} of HERALD_FUZZ_SEED={seed}"));
    }
}

#[test]
fn frame_proto() {
    run("frame_proto");
}

#[test]
fn frame_json() {
    run("frame_json");
}

#[test]
fn token() {
    run("token");
}

#[test]
fn config() {
    run("config");
}

#[test]
fn manifest() {
    run("manifest");
}

#[test]
fn http_api() {
    run("http_api");
}

#[test]
fn plugin_imports() {
    run("plugin_imports");
}

#[test]
fn every_target_has_a_test_here() {
    let source = include_str!("corpus.rs");
    for (name, _) in herald_fuzz::TARGETS {
        assert!(source.contains(&format!("fn {name}()")), "tests/corpus.rs runs {name}");
    }
}
