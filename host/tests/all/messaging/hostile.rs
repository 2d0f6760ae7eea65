//! Hostile plugins in a running server: an infinite loop, memory growth past the cap, a
//! panic, a tight loop of host calls, and an import the host does not provide. Each costs
//! only its own call: the hook's failure policy answers (here `deny`: the send is REJECTED),
//! other clients' traffic keeps flowing meanwhile, and `/admin/plugins` shows the failure.
//!
//! The guests are the runtime's test guests (`host/plugin-runtime/tests/guests`), built by
//! scripts/test.sh into `target/plugin-guests`.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::client::Client;
use super::server::Herald;

/// The message-policy hook denies on failure; a 200 ms deadline and a 4 MiB memory cap.
const HOSTILE_MANIFEST: &str = include_str!("../../../plugin-runtime/tests/guests/hostile/plugin.toml");

pub fn guest(krate: &str) -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/plugin-guests/wasm32-wasip2/release")
        .join(format!("{krate}.wasm"));
    assert!(
        built.exists(),
        "test guest {krate} is not built at {}; scripts/test.sh builds it (cargo build --release --target wasm32-wasip2 --manifest-path host/plugin-runtime/tests/guests/Cargo.toml with CARGO_TARGET_DIR=target/plugin-guests)",
        built.display()
    );
    built
}

/// `/admin/plugins`' entry for `name`.
async fn status(herald: &Herald, name: &str) -> Value {
    let listing = herald.get("/admin/plugins", Some("dev-key")).await;
    assert_eq!(listing.status, 200, "{}", listing.body);
    listing.json()["plugins"]
        .as_array()
        .and_then(|plugins| plugins.iter().find(|p| p["name"] == name).cloned())
        .unwrap_or_else(|| panic!("{name} is not in /admin/plugins: {}", listing.body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_plugins_cost_only_their_own_calls_and_show_in_admin() {
    let dir = tempfile::tempdir().expect("plugins dir");
    std::fs::copy(guest("hostile"), dir.path().join("hostile.wasm")).expect("copy hostile");
    std::fs::write(dir.path().join("hostile.toml"), HOSTILE_MANIFEST).expect("manifest");
    std::fs::copy(guest("spy"), dir.path().join("spy.wasm")).expect("copy spy");
    let herald = Herald::with()
        .set("PLUGINS", dir.path().display())
        // Keep the plugin out of quarantine so every case reaches it.
        .set("PLUGIN_RUNTIME__QUARANTINE__FAILURES", 1000)
        .start()
        .await;

    // Refused at load with a clear message; the server started and serves without it.
    let spy = status(&herald, "spy").await;
    assert_eq!(spy["state"], "failed", "{spy}");
    let load_error = spy["last_load_error"].as_str().unwrap_or_default();
    assert!(load_error.contains("evil:spy/exfiltrate") && load_error.contains("does not provide"), "{load_error}");

    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let conversation = "dm:alice:bob";
    let cases = [
        ("loop", "deadline of 200 ms"),
        ("grow", "memory limit"),
        ("panic", "panics on purpose"),
        ("spin-host", "host-call limit"),
    ];
    for (failures, (body, why)) in (1..).zip(cases) {
        // Alice's send runs the misbehaving path while Bob keeps sending.
        let hostile = tokio::spawn(async move {
            let reason = alice.send_rejected(conversation, body).await;
            (alice, reason)
        });
        for n in 0..5 {
            bob.send_ok(conversation, format!("{body}: bob carries on {n}")).await;
        }
        let (returned, reason) = hostile.await.expect("alice's task");
        alice = returned;
        assert!(reason.contains("plugin-failed"), "{body}: the deny policy answers: {reason}");

        let hostile = status(&herald, "hostile").await;
        assert_eq!(hostile["failures"], failures, "{body}: {hostile}");
        assert_eq!(hostile["state"], "active", "{hostile}");
        let last_error = hostile["last_error"].as_str().unwrap_or_default();
        assert!(last_error.contains(why), "{body}: the failure says why ({why}): {last_error}");
    }
    // Every one of Bob's messages was stored and reaches Alice; none of hers was.
    let history = alice.whole_history(conversation).await;
    assert_eq!(history.len(), 20, "{history:?}");
    assert!(history.iter().all(|m| m.sender == "bob"));
    // And the plugin still serves well-behaved calls.
    alice.send_ok(conversation, "fine again").await;
}
