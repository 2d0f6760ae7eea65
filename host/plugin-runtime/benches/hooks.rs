//! Hook call overhead through the whole runtime, printed as percentiles.
//!
//! `cargo bench -p herald-plugin-runtime --bench hooks` (with mimalloc, as `herald` runs)
//!
//! * `message-policy, pooled`: pool checkout, epoch deadline, call into the component (one
//!   record lowered, one KV read through the host import), result lifted, instance returned.
//! * `message-policy, empty pool`: the same with the pool drained first, so every call
//!   instantiates a fresh instance (store, WASI context, instance, export lookup).
//!
//! * `message-policy + 1 KV, with a shadow`: the pooled call again, on a second host where
//!   `echo-v2` is echo's shadow, given every call — what the active path pays for handing
//!   the shadow its input — in rounds alternating with the same call on the first host
//!   (`no shadow`); the median of the rounds' p50 ratios is the figure to hold at 1.10.
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

        // The same call on a host where echo has a shadow (echo-v2, given every call), in
        // rounds alternating with the host without one: the active call queues a copy of
        // its input for the shadow's worker, whose calls run between the timed ones. The
        // rounds pair runs a second apart, so a change in the machine's speed (this kind
        // of VM drifts by 10 % over a minute) weighs on both sides alike.
        let shadowed_dir = tempfile::tempdir().unwrap();
        std::fs::copy(guests.join("echo_v1.wasm"), shadowed_dir.path().join("echo.wasm")).unwrap();
        std::fs::copy(guests.join("echo_v2.wasm"), shadowed_dir.path().join("echo.shadow.wasm")).unwrap();
        let shadowed = PluginHost::embedded(PluginHostConfig::default()).unwrap();
        shadowed.load_dir(shadowed_dir.path()).await.unwrap();
        for _ in 0..warm {
            shadowed.message_policy(&message).await;
            // The shadow's worker warms up too (and nothing is skipped for want of a turn).
            tokio::task::yield_now().await;
        }
        let rounds = if quick { 2 } else { 6 };
        let (mut plain, mut with_shadow) = (Histogram::<u64>::new(3).unwrap(), Histogram::<u64>::new(3).unwrap());
        let mut ratios = Vec::new();
        for round in 0..rounds {
            let run =
                async |host: &PluginHost| timed(pooled / rounds, || {}, || host.message_policy(&message), drop).await;
            let (a, b) = if round % 2 == 0 {
                let a = run(&host).await;
                (a, run(&shadowed).await)
            } else {
                let b = run(&shadowed).await;
                (run(&host).await, b)
            };
            ratios.push(b.value_at_quantile(0.5) as f64 / a.value_at_quantile(0.5) as f64);
            plain.add(&a).unwrap();
            with_shadow.add(&b).unwrap();
        }
        report("message-policy + 1 KV, no shadow", &plain);
        report("message-policy + 1 KV, with a shadow", &with_shadow);
        let shadow = shadowed.plugin_status("echo").and_then(|s| s.shadow).unwrap();
        println!("{:<34} shadow compared {} calls, skipped {}", "", shadow.compared, shadow.skipped);
        ratios.sort_by(f64::total_cmp);
        let median = (ratios[(ratios.len() - 1) / 2] + ratios[ratios.len() / 2]) / 2.0;
        println!(
            "{:<34} p50 with a shadow / without, per round: {} — median x{median:.3} (target at most x1.10)",
            "",
            ratios.iter().map(|r| format!("x{r:.3}")).collect::<Vec<_>>().join(", ")
        );
        drop(shadowed);

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
