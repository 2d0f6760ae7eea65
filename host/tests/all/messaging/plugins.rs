//! The first-party plugins loaded in a real server change what it does, as configured in
//! their manifests (plugins/<name>/plugin.toml): room rate limits on sends, announcement
//! pacing per room with 429 + Retry-After, archiving, once-only announcement ids, and the
//! admin view. The plugins are built by scripts/test.sh (wasm32-wasip2).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

use super::client::Client;
use super::server::Herald;

/// Copies the named first-party plugins (built .wasm + manifest) into a fresh folder.
fn install(names: &[&str]) -> tempfile::TempDir {
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
        std::fs::copy(root.join(name).join("plugin.toml"), dir.path().join(format!("{name}.toml"))).expect("copy manifest");
    }
    dir
}

async fn with_plugins(names: &[&str]) -> (Herald, tempfile::TempDir) {
    let dir = install(names);
    let herald = Herald::with().set("PLUGINS", dir.path().display()).start().await;
    (herald, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_rate_limit_rejects_a_second_message_within_the_room_interval() {
    let (herald, _dir) = with_plugins(&["room-rate-limit"]).await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    alice.subscribe("room:arena", None).await;
    alice.send_ok("room:arena", "first").await;
    let reason = alice.send_rejected("room:arena", "too soon").await;
    assert!(reason.to_lowercase().contains("rate") || reason.contains("interval"), "rejected as rate limited: {reason}");
    // Direct messages are not covered by the room rules.
    alice.send_ok("dm:alice:bob", "dm 1").await;
    alice.send_ok("dm:alice:bob", "dm 2").await;
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
                accepted.push(announce_until_accepted(&herald, &format!("r{room}"), &format!("a{room}-{n}"), &format!("news {n}")).await);
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
    let contents: Vec<String> = caught_up.messages.iter().map(|m| String::from_utf8_lossy(&m.body).into_owned()).collect();
    assert_eq!(contents, (0..10).map(|n| format!("news {n}")).collect::<Vec<_>>());
    for pair in caught_up.messages.windows(2) {
        let gap = pair[1].sent_at_ms.saturating_sub(pair[0].sent_at_ms);
        assert!(gap >= 50, "announcements of one room only {gap} ms apart (room interval 100 ms)");
    }

    // The same announcement id is accepted once.
    let again = post_announcement(&herald, "r7", &json!({ "content": "news 0", "announcement_id": "a7-0" })).await;
    assert!(again.status == 200 || again.status == 409, "a repeated announcement id: HTTP {} {}", again.status, again.body);
    let history = late.subscribe("room:r7", Some(0)).await;
    assert_eq!(history.messages.len(), 10, "nothing stored twice");

    let bad = herald.post("/v1/rooms/r1/announcements", Some("dev-key"), &json!({ "content": "" })).await;
    assert_eq!(bad.status, 400);
    let unauthorized = herald.post("/v1/rooms/r1/announcements", None, &json!({ "content": "x" })).await;
    assert_eq!(unauthorized.status, 401);
}
