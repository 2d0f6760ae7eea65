//! The first-party plugins loaded in a real server change what it does, as configured in
//! their manifests (plugins/<name>/plugin.toml): room rate limits on sends, announcement
//! pacing per room with 429 + Retry-After, archiving, once-only announcement ids, and the
//! admin view. The plugins are built by scripts/test.sh (wasm32-wasip2).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use herald_proto::v1::frame::Body;
use serde_json::json;

use super::client::Client;
use super::server::Herald;
use crate::support::poll::poll;

/// Copies the named first-party plugins (built .wasm + manifest) into a fresh folder.
pub fn install(names: &[&str]) -> tempfile::TempDir {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins");
    let dir = tempfile::tempdir().expect("plugins dir");
    for name in names {
        let file = format!("{}.wasm", name.replace('-', "_"));
        let built: Option<PathBuf> = ["debug", "release"]
            .iter()
            .map(|profile| root.join("target/wasm32-wasip2").join(profile).join(&file))
            .find(|path| path.exists());
        let built = built.unwrap_or_else(|| {
            panic!("plugin {name} is not built; run scripts/test.sh (it runs cargo build --manifest-path plugins/Cargo.toml --target wasm32-wasip2)")
        });
        std::fs::copy(&built, dir.path().join(format!("{name}.wasm"))).expect("copy plugin");
        std::fs::copy(root.join(name).join("plugin.toml"), dir.path().join(format!("{name}.toml")))
            .expect("copy manifest");
    }
    dir
}

/// Replaces the `[config]` of installed plugin `name`'s manifest with `config` (TOML that
/// follows a `[config]` header).
pub fn configure(dir: &tempfile::TempDir, name: &str, config: &str) {
    let path = dir.path().join(format!("{name}.toml"));
    let manifest = std::fs::read_to_string(&path).expect("manifest");
    let head = manifest.split("\n[config").next().unwrap_or_default();
    std::fs::write(&path, format!("{head}\n[config]\n{config}")).expect("write manifest");
}

async fn with_plugins(names: &[&str]) -> (Herald, tempfile::TempDir) {
    let dir = install(names);
    let herald = Herald::with().set("PLUGINS", dir.path().display()).start().await;
    (herald, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_rate_limit_rejects_a_second_message_within_the_room_interval() {
    let dir = install(&["room-rate-limit"]);
    // A room interval far longer than any stall: with the manifest's 400 ms, a slow disk
    // holding the first send's commit (a 1.2 s checkpoint was seen) let the second through.
    configure(
        &dir,
        "room-rate-limit",
        "[[config.rules]]\npattern = \"room:*\"\nroom_interval_ms = 60000\nsender_interval_ms = 100\nannounce_interval_ms = 100\n",
    );
    let herald = Herald::with().set("PLUGINS", dir.path().display()).start().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    alice.subscribe("room:arena", None).await;
    alice.send_ok("room:arena", "first").await;
    let reason = alice.send_rejected("room:arena", "too soon").await;
    assert!(
        reason.to_lowercase().contains("rate") || reason.contains("interval"),
        "rejected as rate limited: {reason}"
    );
    // Direct messages are not covered by the room rules.
    alice.send_ok("dm:alice:bob", "dm 1").await;
    alice.send_ok("dm:alice:bob", "dm 2").await;
    // Its calls are in /metrics: one message-policy call per send at least.
    let metrics = herald.get("/metrics", None).await.body;
    let calls = super::metric(&metrics, "herald_plugin_calls_total{plugin=\"room-rate-limit\"}");
    assert!(calls >= 4.0, "four sends went through the plugin: {calls}\n{metrics}");
    assert!(metrics.contains("herald_plugin_failures_total{plugin=\"room-rate-limit\"} 0"), "{metrics}");
    assert!(metrics.contains("herald_plugin_call_p99_seconds{plugin=\"room-rate-limit\"}"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_plugins_lists_loaded_plugins_with_their_hooks() {
    let (herald, _dir) = with_plugins(&["room-rate-limit", "announce-archive"]).await;
    let listing = herald.get("/admin/plugins", Some("dev-key")).await;
    assert_eq!(listing.status, 200, "{}", listing.body);
    let plugins = listing.json()["plugins"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = plugins.iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(names.contains(&"room-rate-limit") && names.contains(&"announce-archive"), "{}", listing.body);
    assert!(listing.body.contains("announce-policy"), "hooks are listed: {}", listing.body);
    assert_eq!(herald.get("/admin/plugins", None).await.status, 401);
    let reloaded = herald.post("/admin/plugins/reload", Some("dev-key"), &json!({})).await;
    assert_eq!(reloaded.status, 200, "{}", reloaded.body);
}

/// Posts one announcement, waiting out every 429 as its `Retry-After` says; returns the
/// first answer that is not a 429.
async fn post_announcement(herald: &Herald, room: &str, body: &serde_json::Value) -> super::server::Response {
    for _ in 0..200 {
        let response = herald.post(&format!("/v1/rooms/{room}/announcements"), Some("dev-key"), body).await;
        if response.status != 429 {
            return response;
        }
        let wait_ms: u64 = response
            .header("retry-after-ms")
            .and_then(|v| v.parse().ok())
            .or_else(|| response.header("retry-after").and_then(|v| v.parse::<u64>().ok()).map(|s| s * 1000))
            .expect("a 429 carries Retry-After");
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
    }
    panic!("announcement to {room} still paced after 200 tries");
}

/// Posts one announcement until accepted; returns when it was accepted.
async fn announce_until_accepted(herald: &Herald, room: &str, id: &str, content: &str) -> Instant {
    let response = post_announcement(herald, room, &json!({ "content": content, "announcement_id": id })).await;
    assert_eq!(response.status, 202, "announcement {id} to {room}: {}", response.body);
    Instant::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announcements_are_paced_per_room_archived_and_accepted_once() {
    let (herald, _dir) = with_plugins(&["room-rate-limit", "announce-archive"]).await;
    let herald = std::sync::Arc::new(herald);
    // 200 rooms x 10 announcements, fired at once, each client honouring Retry-After.
    let started = Instant::now();
    let mut rooms = Vec::new();
    for room in 0..200 {
        let herald = std::sync::Arc::clone(&herald);
        rooms.push(tokio::spawn(async move {
            let mut accepted = Vec::new();
            for n in 0..10 {
                accepted.push(
                    announce_until_accepted(
                        &herald,
                        &format!("r{room}"),
                        &format!("a{room}-{n}"),
                        &format!("news {n}"),
                    )
                    .await,
                );
            }
            accepted
        }));
    }
    for room in rooms {
        room.await.expect("room task");
    }
    let took = started.elapsed();
    eprintln!("200 rooms x 10 announcements (100 ms room interval) all accepted in {took:?}");
    // About one room's pacing (10 x 100 ms), not the sum over rooms (~200 s).
    assert!(took < Duration::from_secs(10), "the burst took {took:?}");

    // Archived: a subscriber arriving afterwards catches up on all ten, paced apart.
    let mut late = Client::connect(&herald, "late", "phone").await;
    let caught_up = late.subscribe("room:r7", Some(0)).await;
    let contents: Vec<String> =
        caught_up.messages.iter().map(|m| String::from_utf8_lossy(&m.body).into_owned()).collect();
    assert_eq!(contents, (0..10).map(|n| format!("news {n}")).collect::<Vec<_>>());
    for pair in caught_up.messages.windows(2) {
        let gap = pair[1].sent_at_ms.saturating_sub(pair[0].sent_at_ms);
        assert!(gap >= 50, "announcements of one room only {gap} ms apart (room interval 100 ms)");
    }

    // The same announcement id is accepted once.
    let again = post_announcement(&herald, "r7", &json!({ "content": "news 0", "announcement_id": "a7-0" })).await;
    assert!(
        again.status == 200 || again.status == 409,
        "a repeated announcement id: HTTP {} {}",
        again.status,
        again.body
    );
    let history = late.subscribe("room:r7", Some(0)).await;
    assert_eq!(history.messages.len(), 10, "nothing stored twice");

    let bad = herald.post("/v1/rooms/r1/announcements", Some("dev-key"), &json!({ "content": "" })).await;
    assert_eq!(bad.status, 400);
    let unauthorized = herald.post("/v1/rooms/r1/announcements", None, &json!({ "content": "x" })).await;
    assert_eq!(unauthorized.status, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_announcement_is_answered_with_the_originals_ids_after_its_dedup_mark_expired() {
    let dir = install(&["announce-archive"]);
    // Marks that live 50 ms: the repeat below comes long after its original's expired.
    let herald = Herald::with().set("PLUGINS", dir.path().display()).set("DELIVERY__DEDUP_TTL_MS", 50).start().await;
    let first = post_announcement(&herald, "lobby", &json!({ "content": "doors open", "announcement_id": "d1" })).await;
    assert_eq!(first.status, 202, "{}", first.body);
    // Set-up, not a verdict: stay away well past the mark's 50 ms.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let again = post_announcement(&herald, "lobby", &json!({ "content": "doors open", "announcement_id": "d1" })).await;
    assert_eq!(again.status, 200, "{}", again.body);
    let (first, again) = (first.json(), again.json());
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["archived"], true, "the original was archived: {again}");
    assert_eq!(again["message_id"], first["message_id"], "the original's id, read from the database");
    assert_eq!(again["seq"], first["seq"]);

    let mut late = Client::connect(&herald, "late", "phone").await;
    assert_eq!(late.subscribe("room:lobby", Some(0)).await.messages.len(), 1, "stored once");
}

/// Waits (up to 10 s) until the node reports `wanted` as its tier.
async fn await_tier(herald: &Herald, wanted: &str) {
    poll()
        .every(Duration::from_millis(50))
        .until(&format!("the tier to become {wanted}"), async || {
            let health = herald.get("/admin/health", Some("dev-key")).await;
            assert_eq!(health.status, 200, "{}", health.body);
            if health.json()["tier"] == wanted { Ok(()) } else { Err(health.body) }
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn degrade_tiers_turns_push_into_sync_hints_past_its_threshold_and_back() {
    let dir = install(&["degrade-tiers"]);
    // Pull-only from three open connections; no hold, so it steps down at once.
    configure(&dir, "degrade-tiers", "hold_ms = 0\n[config.pull_only]\nconnections = 3\n");
    let herald =
        Herald::with().set("PLUGINS", dir.path().display()).set("DELIVERY__DEGRADE_INTERVAL_MS", 50).start().await;
    let conversation = "dm:alice:bob";
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    await_tier(&herald, "normal").await;
    let before = alice.send_ok(conversation, "pushed whole").await;
    assert_eq!(bob.deliver_of(before.message_id).await.attempt, 1);
    bob.deliver_ack(conversation, before.seq).await;

    let carol = Client::connect(&herald, "carol", "tablet").await;
    await_tier(&herald, "pull-only").await;
    let during = alice.send_ok(conversation, "hinted").await;
    let hint = bob
        .wait_for("a sync_hint", Duration::from_secs(5), |frame| match &frame.body {
            Some(Body::SyncHint(hint)) => Some(hint.clone()),
            _ => None,
        })
        .await;
    assert_eq!((hint.conversation.as_str(), hint.latest_seq), (conversation, during.seq));
    bob.assert_quiet(Duration::from_millis(300), "no deliver while pull-only", |frame| {
        matches!(frame.body, Some(Body::Deliver(_)))
    })
    .await;
    let pulled = bob.sync(&[(conversation, before.seq)], 0).await;
    let bodies: Vec<&[u8]> =
        pulled.conversations.iter().flat_map(|c| c.messages.iter()).map(|m| m.body.as_ref()).collect();
    assert_eq!(bodies, vec![b"hinted".as_slice()], "the hinted message is there to pull");

    carol.close().await;
    await_tier(&herald, "normal").await;
    let after = alice.send_ok(conversation, "pushed again").await;
    bob.deliver_of(after.message_id).await;
    let health = herald.get("/admin/health", Some("dev-key")).await.json();
    assert_eq!(health["health"]["connections"], 2, "{health}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn degrade_tiers_no_backfill_leaves_a_connecting_device_to_sync() {
    let dir = install(&["degrade-tiers"]);
    configure(&dir, "degrade-tiers", "hold_ms = 0\n[config.no_backfill]\nconnections = 1\n");
    let herald =
        Herald::with().set("PLUGINS", dir.path().display()).set("DELIVERY__DEGRADE_INTERVAL_MS", 50).start().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let sent = alice.send_ok("dm:alice:bob", "while bob was away").await;
    await_tier(&herald, "no-backfill").await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    bob.assert_quiet(Duration::from_millis(500), "no backfill push in no-backfill", |frame| {
        matches!(frame.body, Some(Body::Deliver(_)))
    })
    .await;
    let pulled = bob.sync(&[], 0).await;
    assert!(
        pulled.conversations.iter().flat_map(|c| c.messages.iter()).any(|m| m.id == sent.message_id),
        "sync has it: {pulled:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_key_routes_a_shards_rooms_by_one_key() {
    let (herald, _dir) = with_plugins(&["route-key"]).await;
    let route = |query: &'static str| {
        let herald = &herald;
        async move {
            let response = herald.get(&format!("/admin/route?{query}"), Some("dev-key")).await;
            assert_eq!(response.status, 200, "{}", response.body);
            response.json()
        }
    };
    let lobby = route("user=alice&conversation=room:s12-lobby").await;
    let trade = route("user=bob&conversation=room:s12-trade").await;
    assert_eq!((lobby["key"].as_str(), trade["key"].as_str()), (Some("shard:s12"), Some("shard:s12")));
    assert_eq!(lobby["owner"], lobby["this_node"], "embedded: this node owns every key");
    // Outside the plugin's pattern, the built-in default: the conversation for sends, the
    // user otherwise.
    assert_eq!(route("user=alice&conversation=room:lobby").await["key"], "room:lobby");
    assert_eq!(route("user=alice&command=sync").await["key"], "alice");
    assert_eq!(herald.get("/admin/route?user=alice&command=fly", Some("dev-key")).await.status, 400);
    assert_eq!(herald.get("/admin/route?user=alice", None).await.status, 401);
    // Sends go through the hook and still land.
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    alice.subscribe("room:s12-lobby", None).await;
    alice.send_ok("room:s12-lobby", "routed by shard").await;
}
