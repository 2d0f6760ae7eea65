//! Hook call overhead through the whole runtime, printed as percentiles.
//!
//! `cargo bench -p herald-plugin-runtime --bench hooks` (with mimalloc, as `herald` runs)
//!
//! * `message-policy, pooled`: pool checkout, epoch deadline, call into the component (one
//!   record lowered, one KV read through the host import), result lifted, instance returned.
//! * `message-policy, empty pool`: the same with the pool drained first, so every call
//!   instantiates a fresh instance (store, WASI context, instance, export lookup).
//!
//! * `message-policy + 1 KV, with a shadow`: the pooled call again, with `echo-v2` as its
//!   shadow given every call: what the active path pays for handing the shadow its input.
//! * `deliver-filter, N recipients`: the `block-list` guest (one hash lookup per
//!   recipient) given a room's batch of N user ids, of which it drops one; the time per
//!   call and per recipient (lowering N strings into the guest, the loop, lifting the
//!   answer, the host's set of dropped ids).
//!
//! The guests are `tests/guests/echo` (one `kv::get` per message) and
//! `tests/guests/block-list`, built for wasm32-wasip2 into `target/plugin-guests` by this
//! bench.
#![allow(clippy::print_stdout, clippy::unwrap_used, missing_docs)]

use hdrhistogram::Histogram;
use herald_plugin_runtime::{
    PluginHost, PluginHostConfig,
    types::{Delivery, Message},
};
use std::time::Instant;

mod common;

/// As in the `herald` binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Times `n` calls (`prepare` runs before each, untimed; `check` gets each answer), then
/// yields, so that tasks a call spawned (a shadow's) run between the timed calls.
async fn timed<T, F: std::future::Future<Output = T>>(
    n: usize,
    mut prepare: impl FnMut(),
    mut call: impl FnMut() -> F,
    mut check: impl FnMut(T),
) -> Histogram<u64> {
    let mut h = Histogram::<u64>::new(3).unwrap();
    for _ in 0..n {
        prepare();
        let t = Instant::now();
        let answer = call().await;
        h.record(t.elapsed().as_nanos() as u64).unwrap();
        check(std::hint::black_box(answer));
        tokio::task::yield_now().await;
    }
    h
}

fn report(name: &str, h: &Histogram<u64>) {
    println!(
        "{name:<34} n={:<7} p50={:>7.2} µs  p90={:>7.2} µs  p99={:>7.2} µs  p99.9={:>7.2} µs  max={:>8.2} µs",
        h.len(),
        h.value_at_quantile(0.50) as f64 / 1000.0,
        h.value_at_quantile(0.90) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.value_at_quantile(0.999) as f64 / 1000.0,
        h.max() as f64 / 1000.0,
    );
}

fn main() {
    // `cargo test --benches` runs benches with `--test`; stay quick then.
    let quick = std::env::args().any(|a| a == "--test");
    let guests = common::build_test_guests();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(guests.join("echo_v1.wasm"), dir.path().join("echo.wasm")).unwrap();
    std::fs::copy(guests.join("block_list.wasm"), dir.path().join("block-list.wasm")).unwrap();
    std::fs::write(dir.path().join("block-list.toml"), "[config.blocks]\nuser7 = [\"alice\"]\n").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let host = PluginHost::embedded(PluginHostConfig::default()).unwrap();
    rt.block_on(host.load_dir(dir.path())).unwrap();
    let message = Message {
        sender: "alice".into(),
        sender_device: "phone".into(),
        conversation: "room:lobby".into(),
        kind: 1,
        body: b"hello, world".to_vec(),
        client_msg_id: "00000000-0000-4000-8000-000000000001".into(),
    };
    let (warm, pooled, cold) = if quick { (10, 100, 20) } else { (20_000, 200_000, 5_000) };

    rt.block_on(async {
        for _ in 0..warm {
            host.message_policy(&message).await;
        }
        let h = timed(pooled, || {}, || host.message_policy(&message), drop).await;
        report("message-policy + 1 KV, pooled", &h);

        let h = timed(cold, || _ = host.drain_pool("echo"), || host.message_policy(&message), drop).await;
        report("message-policy, empty pool", &h);

        // The same call with a shadow attached: the active call hands the shadow its input
        // (a clone and a task); the shadow's call runs after it, between the timed calls.
        std::fs::copy(guests.join("echo_v2.wasm"), dir.path().join("echo.shadow.wasm")).unwrap();
        host.reload().await.unwrap();
        let h = timed(pooled, || {}, || host.message_policy(&message), drop).await;
        report("message-policy + 1 KV, with a shadow", &h);
        let shadow = host.plugin_status("echo").and_then(|s| s.shadow).unwrap();
        println!("{:<34} shadow compared {} calls, skipped {}", "", shadow.compared, shadow.skipped);
        std::fs::remove_file(dir.path().join("echo.shadow.wasm")).unwrap();
        host.reload().await.unwrap();

        for recipients in [1usize, 100, 1_000, 10_000] {
            let delivery = Delivery {
                conversation: "room:lobby".into(),
                seq: 1,
                sender: "alice".into(),
                kind: 1,
                body: b"hello, world".to_vec(),
                recipients: (0..recipients).map(|n| format!("user{n}")).collect(),
            };
            let calls = if quick { 5 } else { (2_000_000 / recipients).clamp(200, 50_000) };
            for _ in 0..calls / 10 {
                host.deliver_filter(&delivery).await;
            }
            let check = |dropped: std::collections::HashSet<String>| {
                assert_eq!(dropped.len(), usize::from(recipients > 7));
            };
            let h = timed(calls, || {}, || host.deliver_filter(&delivery), check).await;
            report(&format!("deliver-filter, {recipients} recipients"), &h);
            println!("{:<34} p50={:>7.1} ns per recipient", "", h.value_at_quantile(0.50) as f64 / recipients as f64);
        }
    });
    let s = host.plugin_status("echo").unwrap();
    println!("status: calls={} failures={} p99={:?} µs", s.calls, s.failures, s.p99_call_us);
}
