//! Shadow and promotion through the admin API: a shadow that rejects what the active
//! version allows shows the differences on live traffic and changes no delivery; promoted,
//! its decisions apply.

use serde_json::{Value, json};

use super::client::Client;
use super::hostile::guest;
use super::server::Herald;
use crate::support::poll;

const DM: &str = "dm:alice:bob";

async fn echo_status(herald: &Herald) -> Value {
    let listing = herald.get("/admin/plugins", Some("dev-key")).await;
    assert_eq!(listing.status, 200, "{}", listing.body);
    let plugins = listing.json()["plugins"].as_array().cloned().unwrap_or_default();
    assert_eq!(plugins.len(), 1, "the shadow shows under echo, not beside it: {plugins:?}");
    plugins[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejecting_shadow_shows_its_differences_changes_no_delivery_and_applies_once_promoted() {
    let dir = tempfile::tempdir().expect("plugins dir");
    std::fs::copy(guest("echo_v1"), dir.path().join("echo.wasm")).expect("copy echo-v1");
    std::fs::copy(guest("word_filter"), dir.path().join("echo.shadow.wasm")).expect("copy word-filter");
    std::fs::write(dir.path().join("echo.shadow.toml"), "[config]\nblocked_words = [\"spam\"]\n").expect("manifest");
    let herald = Herald::with().set("PLUGINS", dir.path().display()).start().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;

    // The active version allows both; the shadow would reject the first. Both are delivered.
    let spam = alice.send_ok(DM, "buy spam now").await;
    let fine = alice.send_ok(DM, "hello").await;
    assert_eq!(bob.deliver_of(spam.message_id).await.message.map(|m| m.body.to_vec()), Some(b"buy spam now".to_vec()));
    bob.deliver_of(fine.message_id).await;
    // The shadow's calls run on a task of its own, after the active version answered.
    let echo = poll::until("the shadow to compare both calls", async || {
        let echo = echo_status(&herald).await;
        if echo["shadow"]["compared"] == 2 { Ok(echo) } else { Err(echo) }
    })
    .await;
    let shadow = &echo["shadow"];
    assert_eq!((shadow["compared"].clone(), shadow["differed"].clone()), (json!(2), json!(1)), "{echo}");
    let kind = &shadow["differences"][0];
    assert_eq!(kind["kind"], "message-policy: allow → reject blocked-word", "{echo}");
    assert_eq!(kind["examples"][0]["input"]["body"], json!(b"buy spam now".to_vec()), "{echo}");

    // Promoted, the shadow decides.
    let promoted = herald.post("/admin/plugins/echo/promote", Some("dev-key"), &json!({})).await;
    assert_eq!(promoted.status, 200, "{}", promoted.body);
    assert_eq!(promoted.json()["plugin"]["canary"]["state"], "watching", "{}", promoted.body);
    let reason = alice.send_rejected(DM, "more spam").await;
    assert!(reason.contains("blocked-word"), "{reason}");
    alice.send_ok(DM, "still fine").await;

    let again = herald.post("/admin/plugins/echo/promote", Some("dev-key"), &json!({})).await;
    assert_eq!(again.status, 404, "{}", again.body);
    let discard = herald.request("DELETE", "/admin/plugins/echo/shadow", Some("dev-key"), None).await;
    assert_eq!(discard.status, 404, "{}", discard.body);
    let no_key = herald.post("/admin/plugins/echo/promote", None, &json!({})).await;
    assert_eq!(no_key.status, 401, "{}", no_key.body);
}
