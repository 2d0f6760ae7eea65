//! The word filter in Rust, Python and JavaScript through the whole runtime: what a plugin's
//! language costs per call, per fresh instance and in memory.
//!
//! `cargo bench -p herald-plugin-runtime --bench languages`
//!
//! For each language (the same manifest, `blocked_words = ["spam", "scam", "grüße"]`, and the
//! same clean 28-byte message, so every word is searched for):
//!
//! * `load`: compiling the component and the trial instantiation (`load_dir`), once.
//! * `call, pooled`: pool checkout, call, instance returned (`hooks.rs` measures the same
//!   path with the `echo` guest).
//! * `call, empty pool`: the pool drained before each call, so each call instantiates a
//!   fresh instance first (and parses the config again): what an instance costs to create.
//! * `memory per instance`: resident memory (VmRSS) the process gives back when an idle
//!   instance is dropped, in a host with pooling off (so a dropped instance's memory is
//!   unmapped at once); the median of several rounds, each after one call on a fresh
//!   instance. This is the memory an instance holds: pages of its linear memory, tables and
//!   stack it touched; untouched pages of the snapshot image are never resident.
//!
//! The Rust guest is `tests/guests/word-filter`, built into `target/plugin-guests`; the
//! Python and JavaScript ones are `guests/*/word-filter`, built (tools installed first) by
//! `scripts/lib.sh`'s `build_language_guests` into `target/language-guests`.
#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use hdrhistogram::Histogram;
use herald_plugin_runtime::{
    PluginHost, PluginHostConfig,
    types::{Message, MessageDecision},
};
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

mod common;

/// The manifest all three load with (the same as the `languages` tests').
const MANIFEST: &str = include_str!("../tests/guests/word-filter/plugin.toml");

fn build() -> Vec<(&'static str, PathBuf)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let guests = common::build_test_guests();
    let status = Command::new("bash")
        .args(["-c", ". scripts/lib.sh && build_language_guests"])
        .current_dir(&root)
        .status()
        .expect("running bash");
    assert!(status.success(), "scripts/lib.sh build_language_guests failed (its error is above)");
    let languages = root.join("target/language-guests");
    vec![
        ("Rust", guests.join("word_filter.wasm")),
        ("Python", languages.join("word_filter_py.wasm")),
        ("JavaScript", languages.join("word_filter_js.wasm")),
    ]
}

fn micros(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn report(name: &str, h: &Histogram<u64>) {
    println!(
        "  {name:<18} n={:<7} p50={:>9.2} µs  p90={:>9.2} µs  p99={:>9.2} µs  max={:>10.2} µs",
        h.len(),
        micros(h.value_at_quantile(0.50)),
        micros(h.value_at_quantile(0.90)),
        micros(h.value_at_quantile(0.99)),
        micros(h.max()),
    );
}

/// VmRSS of this process, KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn host_with(wasm: &Path, pooling: bool) -> (PluginHost, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(wasm, dir.path().join("word-filter.wasm")).unwrap();
    std::fs::write(dir.path().join("word-filter.toml"), MANIFEST).unwrap();
    let config = PluginHostConfig { pooling, ..PluginHostConfig::default() };
    (PluginHost::embedded(config).unwrap(), dir)
}

fn main() {
    // `cargo test --benches` runs benches with `--test`; stay quick then.
    let quick = std::env::args().any(|a| a == "--test");
    let (warm, pooled, fresh, rounds) = if quick { (5, 50, 5, 2) } else { (2_000, 50_000, 300, 9) };
    let message = Message {
        sender: "alice".into(),
        sender_device: "phone".into(),
        conversation: "room:lobby".into(),
        kind: 1,
        body: b"hello, world, how are you?!!".to_vec(),
        client_msg_id: "00000000-0000-4000-8000-000000000001".into(),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    for (language, wasm) in build() {
        let size = std::fs::metadata(&wasm).map(|m| m.len()).unwrap_or(0);
        println!("{language} word filter ({:.1} MiB component)", size as f64 / (1 << 20) as f64);
        let (host, dir) = host_with(&wasm, true);
        rt.block_on(async {
            let t = Instant::now();
            let status = host.load_dir(dir.path()).await.unwrap();
            let load = t.elapsed();
            assert!(status[0].last_error.is_none(), "{language}: {status:?}");
            println!("  {:<18} {:>9.1} ms (compile + first instance)", "load", load.as_secs_f64() * 1000.0);
            for _ in 0..warm {
                assert_eq!(host.message_policy(&message).await, MessageDecision::Allow);
            }
            let mut h = Histogram::<u64>::new(3).unwrap();
            for _ in 0..pooled {
                let t = Instant::now();
                let d = host.message_policy(&message).await;
                h.record(t.elapsed().as_nanos() as u64).unwrap();
                std::hint::black_box(d);
            }
            report("call, pooled", &h);
            let mut h = Histogram::<u64>::new(3).unwrap();
            for _ in 0..fresh {
                host.drain_pool("word-filter");
                let t = Instant::now();
                let d = host.message_policy(&message).await;
                h.record(t.elapsed().as_nanos() as u64).unwrap();
                std::hint::black_box(d);
            }
            report("call, empty pool", &h);
            let s = host.plugin_status("word-filter").unwrap();
            assert_eq!(s.failures, 0, "{language}: {s:?}");
        });
        drop(host);

        let (host, dir) = host_with(&wasm, false);
        let mut freed = rt.block_on(async {
            host.load_dir(dir.path()).await.unwrap();
            let mut freed = Vec::new();
            for _ in 0..rounds {
                host.drain_pool("word-filter");
                std::thread::sleep(Duration::from_millis(20));
                let before = rss_kib();
                assert_eq!(host.message_policy(&message).await, MessageDecision::Allow);
                let with_instance = rss_kib();
                host.drain_pool("word-filter");
                std::thread::sleep(Duration::from_millis(20));
                let after = rss_kib();
                freed.push((with_instance.saturating_sub(after), with_instance.saturating_sub(before)));
            }
            freed
        });
        freed.sort_unstable();
        let (median_freed, median_grew) = freed[freed.len() / 2];
        println!(
            "  {:<18} {:>9.1} MiB resident (freed when dropped; grew {:.1} MiB when created and called)",
            "memory per instance",
            median_freed as f64 / 1024.0,
            median_grew as f64 / 1024.0,
        );
        drop(host);
    }
}
