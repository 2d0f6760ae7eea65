//! The plugins' KV and rate limiter in Redis (`cluster::plugin_state`) against the
//! machine's real Redis: each proves what its in-process twin (`MemoryKv`, `MemoryLimiter`)
//! proves, plus what only shared state can show — two nodes seeing each other's writes,
//! once-only and atomic across nodes under concurrency, one bucket paced across nodes, a
//! stalled Redis failing calls within their deadline, and a real first-party plugin
//! (`room-rate-limit`, `announce-archive`) keeping its limits across two plugin hosts.
//! Each test works under a prefix of its own and deletes its keys when done.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use herald_host::cluster::{RedisPluginKv, RedisRateLimiter, RedisTimeouts};
use herald_host::config::{Config, StorageConfig};
use herald_host::model::NodeId;
use herald_host::plugins::types::{Acceptance, AnnounceDecision, Announcement, Message, MessageDecision};
use herald_host::plugins::{PluginHostConfig, Plugins, RegistryWiring};
use herald_host::store::Database;
use herald_plugin_runtime::{KvError, KvLimits, Limit, LimiterError, PluginKv, RateLimiter};
use tokio::time::Instant;

use crate::redis_scratch::{Scratch, connect, partitionable_proxy};
use crate::support::poll::poll;

/// Deadlines for the tests that are not about deadlines: generous, as the machine is shared
/// by many tests at once.
const PATIENT: RedisTimeouts = RedisTimeouts { lookup: Duration::from_secs(2), write: Duration::from_secs(2) };

/// The longest anything that should happen promptly may take.
const WAIT: Duration = Duration::from_secs(5);

/// The scope (plugin name) most tests write under.
const PLUGIN: &str = "room-rate-limit";

impl Scratch {
    /// A node's plugin KV: a connection of its own, as a second process would have.
    async fn node_kv(&self) -> Arc<RedisPluginKv> {
        Arc::new(RedisPluginKv::new(connect(&self.url).await, self.keys.clone(), PATIENT, KvLimits::default()))
    }

    /// A node's rate limiter, on a connection of its own.
    async fn node_limiter(&self) -> Arc<RedisRateLimiter> {
        Arc::new(RedisRateLimiter::new(connect(&self.url).await, self.keys.clone(), PATIENT))
    }
}

fn millis(limit: Limit) -> Option<u64> {
    match limit {
        Limit::Allowed => None,
        Limit::RetryAfter(wait) => Some(u64::try_from(wait.as_millis()).expect("a sane wait")),
    }
}

#[tokio::test]
async fn two_nodes_see_each_others_plugin_kv_writes() {
    let scratch = Scratch::new().await;
    let (first, second) = (scratch.node_kv().await, scratch.node_kv().await);
    first.set(PLUGIN, "room:lobby", b"busy".to_vec(), None).await.expect("set on node 1");
    assert_eq!(second.get(PLUGIN, "room:lobby").await, Ok(Some(b"busy".to_vec())));
    second.set(PLUGIN, "room:lobby", b"quiet".to_vec(), None).await.expect("overwrite on node 2");
    assert_eq!(first.get(PLUGIN, "room:lobby").await, Ok(Some(b"quiet".to_vec())));
    assert_eq!(scratch.keys_written().into_iter().collect::<Vec<_>>(), vec!["kv:{p:room-rate-limit:room:lobby}"]);
    assert_eq!(scratch.ttl_ms("kv:{p:room-rate-limit:room:lobby}"), -1, "no TTL given: kept until deleted");
    assert_eq!(second.delete(PLUGIN, "room:lobby").await, Ok(true));
    assert_eq!(first.get(PLUGIN, "room:lobby").await, Ok(None));
    assert_eq!(first.delete(PLUGIN, "room:lobby").await, Ok(false), "already gone");
    assert!(scratch.keys_written().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn set_if_absent_is_once_only_across_nodes_under_concurrency() {
    let scratch = Scratch::new().await;
    let nodes = [scratch.node_kv().await, scratch.node_kv().await];
    let mut attempts = Vec::new();
    for attempt in 0..64_u32 {
        let kv = Arc::clone(&nodes[attempt as usize % 2]);
        attempts.push(tokio::spawn(async move {
            let won = kv
                .set_if_absent("announce-archive", "room:news\0a1", attempt.to_string().into_bytes(), None)
                .await
                .expect("set-if-absent");
            won.then_some(attempt)
        }));
    }
    let mut winners = Vec::new();
    for attempt in attempts {
        winners.extend(attempt.await.expect("the attempt ran"));
    }
    assert_eq!(winners.len(), 1, "exactly one of 64 concurrent attempts on two nodes stores: {winners:?}");
    let stored = nodes[1].get("announce-archive", "room:news\0a1").await.expect("get");
    assert_eq!(stored, Some(winners[0].to_string().into_bytes()), "the winner's value is the one kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn increment_is_atomic_across_nodes() {
    let scratch = Scratch::new().await;
    let nodes = [scratch.node_kv().await, scratch.node_kv().await];
    let mut adds = Vec::new();
    for n in 0..200_usize {
        let kv = Arc::clone(&nodes[n % 2]);
        adds.push(tokio::spawn(async move { kv.increment(PLUGIN, "count", 1, None).await.expect("increment") }));
    }
    let mut seen = Vec::new();
    for add in adds {
        seen.push(add.await.expect("the increment ran"));
    }
    seen.sort_unstable();
    assert_eq!(seen, (1..=200).collect::<Vec<i64>>(), "every increment saw a distinct count");
    assert_eq!(nodes[0].get(PLUGIN, "count").await, Ok(Some(b"200".to_vec())));
    assert_eq!(nodes[1].increment(PLUGIN, "count", -250, None).await, Ok(-50), "negative deltas");
}

#[tokio::test]
async fn increment_keeps_memory_kv_semantics() {
    let scratch = Scratch::new().await;
    let kv = scratch.node_kv().await;
    // Absent: created with the TTL; present: the TTL is kept, not renewed.
    assert_eq!(kv.increment(PLUGIN, "n", 5, Some(Duration::from_secs(60))).await, Ok(5));
    let ttl = scratch.ttl_ms("kv:{p:room-rate-limit:n}");
    assert!((1..=60_000).contains(&ttl), "created with its TTL: {ttl}");
    assert_eq!(kv.increment(PLUGIN, "n", -2, Some(Duration::from_secs(3600))).await, Ok(3));
    assert!(scratch.ttl_ms("kv:{p:room-rate-limit:n}") <= 60_000, "an existing entry keeps its TTL");
    // Saturates as i64::saturating_add does, both ways.
    kv.set(PLUGIN, "big", (i64::MAX - 1).to_string().into_bytes(), None).await.expect("set");
    assert_eq!(kv.increment(PLUGIN, "big", 5, None).await, Ok(i64::MAX));
    assert_eq!(kv.increment(PLUGIN, "small", i64::MIN, None).await, Ok(i64::MIN));
    assert_eq!(kv.increment(PLUGIN, "small", -1, None).await, Ok(i64::MIN));
    // Text that Rust reads as an i64 is one, though Redis's INCRBY alone would refuse it.
    for (text, next) in [("+5", 6), ("007", 8), ("-0", 1), ("-007", -6), ("9223372036854775806", i64::MAX)] {
        kv.set(PLUGIN, "loose", text.as_bytes().to_vec(), Some(Duration::from_secs(60))).await.expect("set");
        assert_eq!(kv.increment(PLUGIN, "loose", 1, None).await, Ok(next), "{text:?}");
        assert!(scratch.ttl_ms("kv:{p:room-rate-limit:loose}") > 0, "rewriting {text:?} kept its TTL");
    }
    // Anything else is not an integer, and stays as it was.
    for text in ["x", "1.5", "", " 5", "5 ", "+", "-", "+-1", "9223372036854775808", "99999999999999999999", "0x10"] {
        kv.set(PLUGIN, "text", text.as_bytes().to_vec(), None).await.expect("set");
        assert_eq!(
            kv.increment(PLUGIN, "text", 1, None).await,
            Err(KvError::NotAnInteger("text".to_owned())),
            "{text:?}"
        );
        assert_eq!(kv.get(PLUGIN, "text").await, Ok(Some(text.as_bytes().to_vec())), "{text:?} is unchanged");
    }
}

#[tokio::test]
async fn ttls_expire_and_free_set_if_absent() {
    let scratch = Scratch::new().await;
    let (first, second) = (scratch.node_kv().await, scratch.node_kv().await);
    let short = Some(Duration::from_millis(150));
    assert_eq!(first.set_if_absent(PLUGIN, "id", b"1".to_vec(), short).await, Ok(true));
    assert_eq!(second.set_if_absent(PLUGIN, "id", b"2".to_vec(), None).await, Ok(false));
    let ttl = scratch.ttl_ms("kv:{p:room-rate-limit:id}");
    assert!((1..=150).contains(&ttl), "PX 150: {ttl}");
    let started = Instant::now();
    poll()
        .within(WAIT)
        .every(Duration::from_millis(20))
        .until("the entry to expire", async || second.get(PLUGIN, "id").await.expect("get").is_none())
        .await;
    assert!(started.elapsed() >= Duration::from_millis(100), "expired early: {:?}", started.elapsed());
    assert_eq!(second.set_if_absent(PLUGIN, "id", b"2".to_vec(), None).await, Ok(true), "expiry frees the id");
    // A zero TTL still stores (for at least a millisecond: Redis refuses PX 0).
    assert_eq!(first.set(PLUGIN, "brief", b"x".to_vec(), Some(Duration::ZERO)).await, Ok(()));
    // A set without a TTL clears an earlier one.
    first.set(PLUGIN, "kept", b"x".to_vec(), Some(Duration::from_secs(60))).await.expect("set");
    first.set(PLUGIN, "kept", b"y".to_vec(), None).await.expect("set");
    assert_eq!(scratch.ttl_ms("kv:{p:room-rate-limit:kept}"), -1);
}

#[tokio::test]
async fn scopes_are_isolated() {
    let scratch = Scratch::new().await;
    let kv = scratch.node_kv().await;
    kv.set("a", "k", b"1".to_vec(), None).await.expect("set");
    assert_eq!(kv.get("b", "k").await, Ok(None));
    assert_eq!(kv.get("a", "k").await, Ok(Some(b"1".to_vec())));
    assert_eq!(kv.set_if_absent("b", "k", b"2".to_vec(), None).await, Ok(true), "the same key in another scope");
    // Where the scope ends is never ambiguous, whatever the names hold.
    kv.set("x:y", "z", b"first".to_vec(), None).await.expect("set");
    kv.set("x", "y:z", b"second".to_vec(), None).await.expect("set");
    kv.set("x{", "}z", b"third".to_vec(), None).await.expect("set");
    assert_eq!(kv.get("x:y", "z").await, Ok(Some(b"first".to_vec())));
    assert_eq!(kv.get("x", "y:z").await, Ok(Some(b"second".to_vec())));
    assert_eq!(kv.get("x{", "}z").await, Ok(Some(b"third".to_vec())));
    assert_eq!(kv.delete("b", "k").await, Ok(true));
    assert_eq!(kv.get("a", "k").await, Ok(Some(b"1".to_vec())), "deleting in one scope leaves the other");
}

#[tokio::test]
async fn awkward_and_max_size_keys_work_and_oversize_ones_write_nothing() {
    let scratch = Scratch::new().await;
    let kv = scratch.node_kv().await;
    let limits = KvLimits::default();
    let longest = "k".repeat(limits.max_key_bytes);
    let braces = "{".repeat(limits.max_key_bytes);
    let largest: Vec<u8> = (0..limits.max_value_bytes).map(|n| (n % 256) as u8).collect();
    let awkward = [
        "{",
        "}",
        "{}",
        "}{",
        "a}{b",
        "room:{lobby}",
        "%7B",
        "%",
        "s:room:lobby\0ann",
        "\u{1}\n\t\u{7f}",
        "💬 ünïcode ключ",
        longest.as_str(),
        braces.as_str(),
    ];
    for (n, key) in awkward.iter().enumerate() {
        kv.set(PLUGIN, key, format!("value {n}").into_bytes(), None).await.expect("an awkward key is stored");
    }
    for (n, key) in awkward.iter().enumerate() {
        assert_eq!(kv.get(PLUGIN, key).await, Ok(Some(format!("value {n}").into_bytes())), "{key:?}");
    }
    kv.set(PLUGIN, "largest", largest.clone(), None).await.expect("the largest value is stored");
    assert_eq!(kv.get(PLUGIN, "largest").await, Ok(Some(largest.clone())), "binary values read back exactly");
    let written = scratch.keys_written();
    assert_eq!(written.len(), awkward.len() + 1, "every key distinct: {written:?}");
    for key in &written {
        let tag_open = key.find('{').expect("a tag");
        assert_eq!(key.matches('{').count(), 1, "{key:?}");
        assert_eq!(key.find('}'), Some(key.len() - 1), "the tag closes at the end: {key:?}");
        assert!(key[tag_open..].starts_with("{p:room-rate-limit:"), "{key:?}");
    }

    let too_long = "k".repeat(limits.max_key_bytes + 1);
    let too_large = vec![0_u8; limits.max_value_bytes + 1];
    let refused = [
        kv.set(PLUGIN, &too_long, b"x".to_vec(), None).await,
        kv.set(PLUGIN, "fine", too_large.clone(), None).await,
        kv.set_if_absent(PLUGIN, &too_long, b"x".to_vec(), None).await.map(drop),
        kv.set_if_absent(PLUGIN, "fine", too_large, None).await.map(drop),
        kv.increment(PLUGIN, &too_long, 1, None).await.map(drop),
    ];
    for outcome in refused {
        assert!(matches!(outcome, Err(KvError::TooLarge(_))), "{outcome:?}");
    }
    assert_eq!(scratch.keys_written(), written, "a refused write writes nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_sharing_a_bucket_allow_the_burst_in_total_then_say_when() {
    let scratch = Scratch::new().await;
    let nodes = [scratch.node_limiter().await, scratch.node_limiter().await];
    // 2 per second (one token every 500 ms), 5 at once.
    let mut checks = Vec::new();
    for n in 0..24_usize {
        let limiter = Arc::clone(&nodes[n % 2]);
        checks.push(tokio::spawn(async move { limiter.check(PLUGIN, "r:room:lobby", 2.0, 5).await }));
    }
    let mut answers = Vec::new();
    for check in checks {
        answers.push(check.await.expect("the check ran").expect("a check"));
    }
    let allowed = answers.iter().filter(|answer| **answer == Limit::Allowed).count();
    assert_eq!(allowed, 5, "the burst, in total across both nodes: {answers:?}");
    for wait in answers.into_iter().filter_map(millis) {
        assert!((1..=500).contains(&wait), "the next token frees up within one interval: {wait} ms");
    }
    assert_eq!(nodes[0].check(PLUGIN, "r:room:other", 2.0, 5).await, Ok(Limit::Allowed), "another bucket");
    assert_eq!(nodes[0].check("other-plugin", "r:room:lobby", 2.0, 5).await, Ok(Limit::Allowed), "another scope");
    let ttl = scratch.ttl_ms("limit:{p:room-rate-limit:r:room:lobby}");
    assert!((1..=2_500).contains(&ttl), "the bucket lives until it is full again: {ttl} ms");
}

#[tokio::test]
async fn tokens_refill_over_time_and_idle_buckets_vanish() {
    let scratch = Scratch::new().await;
    let (first, second) = (scratch.node_limiter().await, scratch.node_limiter().await);
    // One token every 400 ms, 2 at once.
    assert_eq!(first.check(PLUGIN, "k", 2.5, 2).await, Ok(Limit::Allowed));
    assert_eq!(second.check(PLUGIN, "k", 2.5, 2).await, Ok(Limit::Allowed));
    let wait = millis(first.check(PLUGIN, "k", 2.5, 2).await.expect("a check")).expect("over the burst");
    assert!((1..=400).contains(&wait), "{wait} ms");
    // A refused check takes no token, so looking again until one is there is a wait for it
    // rather than a guess at how long the machine takes to get there.
    poll()
        .until("a token freed up after the wait", async || match second.check(PLUGIN, "k", 2.5, 2).await {
            Ok(Limit::Allowed) => Ok(()),
            other => Err(format!("{other:?}")),
        })
        .await;
    let again = millis(first.check(PLUGIN, "k", 2.5, 2).await.expect("a check")).expect("only one had freed up");
    assert!((1..=400).contains(&again), "{again} ms");
    // Left alone, the bucket fills up and its key expires: nothing is kept for idle buckets.
    poll()
        .within(WAIT)
        .every(Duration::from_millis(50))
        .until("the idle bucket to vanish", async || {
            let keys = scratch.keys_written();
            if keys.is_empty() { Ok(()) } else { Err(format!("{keys:?}")) }
        })
        .await;
    assert_eq!(first.check(PLUGIN, "k", 2.5, 2).await, Ok(Limit::Allowed));
    assert_eq!(second.check(PLUGIN, "k", 2.5, 2).await, Ok(Limit::Allowed), "a full burst again");
    // A burst of 0 counts as 1, as in MemoryLimiter.
    assert_eq!(first.check(PLUGIN, "zero", 1.0, 0).await, Ok(Limit::Allowed));
    assert!(matches!(first.check(PLUGIN, "zero", 1.0, 0).await, Ok(Limit::RetryAfter(_))));
}

#[tokio::test]
async fn bad_rates_and_oversize_limiter_keys_are_refused() {
    let scratch = Scratch::new().await;
    let limiter = scratch.node_limiter().await;
    for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let answer = limiter.check(PLUGIN, "k", rate, 1).await;
        assert!(matches!(answer, Err(LimiterError::BadRate(_))), "{rate}: {answer:?}");
    }
    let answer = limiter.check(PLUGIN, &"k".repeat(1025), 1.0, 1).await;
    assert!(matches!(answer, Err(LimiterError::TooLarge(_))), "{answer:?}");
    assert_eq!(limiter.check(PLUGIN, &"{".repeat(1024), 1.0, 1).await, Ok(Limit::Allowed), "the longest key");
    // A rate so slow its interval is ages: still a sane expiry and answer.
    assert_eq!(limiter.check(PLUGIN, "slow", 1e-300, 1).await, Ok(Limit::Allowed));
    assert!(matches!(limiter.check(PLUGIN, "slow", 1e-300, 1).await, Ok(Limit::RetryAfter(_))));
    assert_eq!(scratch.keys_written().len(), 2, "refused checks write nothing");
}

#[tokio::test]
async fn a_stalled_redis_fails_plugin_calls_within_their_deadline() {
    let scratch = Scratch::new().await;
    let frozen = Arc::new(AtomicBool::new(false));
    let redis = connect(&partitionable_proxy(&scratch.url, Arc::clone(&frozen)).await).await;
    let timeouts = RedisTimeouts { lookup: Duration::from_millis(50), write: Duration::from_millis(100) };
    let kv = RedisPluginKv::new(redis.clone(), scratch.keys.clone(), timeouts, KvLimits::default());
    let limiter = RedisRateLimiter::new(redis, scratch.keys.clone(), timeouts);
    kv.set(PLUGIN, "k", b"1".to_vec(), None).await.expect("set while Redis answers");
    // Every script loaded first: a script call cut short before Redis had it cached is never
    // retried (its NOSCRIPT answer arrives after the caller gave up), which would make what
    // Redis applied after the thaw depend on its script cache.
    kv.set_if_absent(PLUGIN, "warm", b"1".to_vec(), None).await.expect("load the script");
    kv.increment(PLUGIN, "warm-n", 1, None).await.expect("load the script");
    limiter.check(PLUGIN, "warm", 1.0, 1).await.expect("load the script");

    frozen.store(true, Ordering::SeqCst);
    let started = Instant::now();
    assert_eq!(
        kv.get(PLUGIN, "k").await,
        Err(KvError::Backend("Redis did not answer plugin kv get within 50ms".to_owned()))
    );
    let failures = [
        kv.set(PLUGIN, "k", b"2".to_vec(), None).await.map(drop),
        kv.set_if_absent(PLUGIN, "k", b"2".to_vec(), None).await.map(drop),
        kv.increment(PLUGIN, "n", 1, None).await.map(drop),
        kv.delete(PLUGIN, "k").await.map(drop),
    ];
    for failure in failures {
        let Err(KvError::Backend(message)) = failure else { panic!("a Backend error: {failure:?}") };
        assert!(message.contains("Redis did not answer plugin kv") && message.contains("100ms"), "{message}");
    }
    let Err(LimiterError::Backend(message)) = limiter.check(PLUGIN, "k", 1.0, 1).await else {
        panic!("a Backend error")
    };
    assert_eq!(message, "Redis did not answer plugin rate-limit check within 50ms");
    assert!(started.elapsed() < Duration::from_secs(2), "the calls took {:?}", started.elapsed());

    // Once Redis answers again, so does the same connection. The writes that ran out of
    // time were only held up, not lost: Redis applied the last one, the delete, once it got
    // there, so a plugin that saw a write fail cannot tell whether it happened (the module
    // doc says so).
    frozen.store(false, Ordering::SeqCst);
    let value = poll().within(WAIT).until("the kv to answer after the thaw", async || kv.get(PLUGIN, "k").await).await;
    assert_eq!(value, None, "the late delete was applied");
}

/// A plugins folder with `room-rate-limit` (one message per 2 s per room, no other limit,
/// a deadline for a busy machine) and `announce-archive`, from the built first-party
/// plugins.
fn first_party_plugins() -> tempfile::TempDir {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = tempfile::tempdir().expect("a plugins folder");
    for name in ["room-rate-limit", "announce-archive"] {
        let file = format!("{}.wasm", name.replace('-', "_"));
        let built = ["plugins/target/wasm32-wasip2/debug", "plugins/target/wasm32-wasip2/release", "target/plugin-guests/wasm32-wasip2/release"]
            .iter()
            .map(|folder| root.join(folder).join(&file))
            .find(|path| path.exists())
            .unwrap_or_else(|| {
                panic!("plugin {name} is not built; run `. scripts/lib.sh; build_plugins debug` (cargo build --manifest-path plugins/Cargo.toml --target wasm32-wasip2)")
            });
        std::fs::copy(built, dir.path().join(format!("{name}.wasm"))).expect("copy the plugin");
    }
    let manifest = |name: &str, hooks: &str, order: u32, failure: &str, config: &str| {
        format!(
            "name = \"{name}\"\nversion = \"0.1.0\"\nhooks = [{hooks}]\norder = {order}\n\n[failure]\n{failure}\n\n\
             [limits]\ndeadline_ms = 2000\nmemory_mib = 8\n\n[config]\n{config}\n"
        )
    };
    let rules = "[[config.rules]]\npattern = \"room:*\"\nroom_interval_ms = 2000\nsender_interval_ms = 0\n\
                 announce_interval_ms = 0";
    let hooks = "\"message-policy\", \"announce-policy\"";
    let failure = "message-policy = \"allow\"\nannounce-policy = \"default\"";
    let limit = manifest("room-rate-limit", hooks, 10, failure, rules);
    std::fs::write(dir.path().join("room-rate-limit.toml"), limit).expect("write a manifest");
    let remember = "archive = [\"*\"]\nremember_ids_s = 600";
    let archive = manifest("announce-archive", "\"announce-policy\"", 20, "announce-policy = \"default\"", remember);
    std::fs::write(dir.path().join("announce-archive.toml"), archive).expect("write a manifest");
    dir
}

fn message(sender: &str, room: &str) -> Message {
    Message {
        sender: sender.into(),
        sender_device: "phone".into(),
        conversation: room.into(),
        kind: 1,
        body: b"hi".to_vec(),
        client_msg_id: "00000000-0000-4000-8000-000000000001".into(),
    }
}

fn announcement(room: &str, id: &str) -> Announcement {
    Announcement { room: room.into(), announcement_id: Some(id.into()), sender: None, content: "hello".into() }
}

/// A plugin registry of its own for a plugin host of these tests (they serve the folder's
/// plugins only): an empty SQLite database in `dir`.
async fn empty_registry(dir: &std::path::Path, node: u32) -> RegistryWiring {
    let url = format!("sqlite://{}", dir.join(format!("registry-{node}.db")).display());
    let database = Database::connect(&url, &StorageConfig::default()).await.expect("open the registry's SQLite file");
    database.migrate().await.expect("migrate the registry");
    let config = Config { data_dir: dir.to_path_buf(), ..Config::default() };
    RegistryWiring::embedded(&config, Arc::new(database), NodeId(node))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_party_plugins_keep_their_limits_across_two_plugin_hosts() {
    let scratch = Scratch::new().await;
    let dir = first_party_plugins();
    let registries = tempfile::tempdir().expect("temp dir");
    let mut hosts = Vec::new();
    for node in 0..2 {
        let kv: Arc<dyn PluginKv> = scratch.node_kv().await;
        let limiter: Arc<dyn RateLimiter> = scratch.node_limiter().await;
        let registry = empty_registry(registries.path(), node).await;
        let plugins =
            Plugins::start_with(PluginHostConfig::default(), dir.path(), kv, limiter, registry).await.expect("start");
        let status = plugins.host.status();
        assert!(status.iter().all(|s| s.last_load_error.is_none()) && status.len() == 2, "{status:?}");
        hosts.push(plugins);
    }
    let (first, second) = (&hosts[0].host, &hosts[1].host);

    // room-rate-limit: one message per 2 s in a room, whichever node the senders are on.
    assert_eq!(first.message_policy(&message("ann", "room:lobby")).await, MessageDecision::Allow);
    let MessageDecision::Reject(busy) = second.message_policy(&message("bob", "room:lobby")).await else {
        panic!("the room's limit holds on the other node")
    };
    assert_eq!(busy.code, "rate-limited", "{busy:?}");
    let wait = busy.retry_after_ms.expect("a retry-after");
    assert!((1..=2000).contains(&wait), "{wait} ms");
    assert_eq!(second.message_policy(&message("bob", "room:other")).await, MessageDecision::Allow, "another room");
    poll()
        .until("the room lets bob's message through after the wait", async || {
            let decision = second.message_policy(&message("bob", "room:lobby")).await;
            if decision == MessageDecision::Allow { Ok(()) } else { Err(format!("{decision:?}")) }
        })
        .await;
    assert!(
        matches!(first.message_policy(&message("ann", "room:lobby")).await, MessageDecision::Reject(_)),
        "and the first node sees that message's use of the room"
    );

    // announce-archive: an announcement id is accepted once, across nodes.
    let archived = AnnounceDecision::Accept(Acceptance { archive: true });
    assert_eq!(first.announce_policy(&announcement("room:news", "a1")).await, archived);
    assert_eq!(second.announce_policy(&announcement("room:news", "a1")).await, AnnounceDecision::Duplicate);
    assert_eq!(second.announce_policy(&announcement("room:news", "a2")).await, archived);

    // A node cut off from Redis: the plugin call traps, and the hook's failure policy
    // ("allow" for room-rate-limit's messages) answers within the deadline.
    let frozen = Arc::new(AtomicBool::new(false));
    let redis = connect(&partitionable_proxy(&scratch.url, Arc::clone(&frozen)).await).await;
    let quick = RedisTimeouts { lookup: Duration::from_millis(50), write: Duration::from_millis(100) };
    let kv = Arc::new(RedisPluginKv::new(redis.clone(), scratch.keys.clone(), quick, KvLimits::default()));
    let limiter = Arc::new(RedisRateLimiter::new(redis, scratch.keys.clone(), quick));
    let registry = empty_registry(registries.path(), 2).await;
    let cut_off =
        Plugins::start_with(PluginHostConfig::default(), dir.path(), kv, limiter, registry).await.expect("start");
    frozen.store(true, Ordering::SeqCst);
    let started = Instant::now();
    assert_eq!(cut_off.host.message_policy(&message("cy", "room:lobby")).await, MessageDecision::Allow);
    assert!(started.elapsed() < Duration::from_secs(1), "took {:?}", started.elapsed());
    let status = cut_off.host.plugin_status("room-rate-limit").expect("loaded");
    assert_eq!(status.failures, 1, "{status:?}");
    let error = status.last_error.unwrap_or_default();
    assert!(error.contains("Redis did not answer plugin rate-limit check"), "{error}");
    frozen.store(false, Ordering::SeqCst);
}
