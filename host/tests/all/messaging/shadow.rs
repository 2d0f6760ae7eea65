//! Shadow and promotion through the admin API: a shadow's answers are compared on live
//! traffic and never applied; promoted, its answers are.

use serde_json::{Value, json};

use super::client::Client;
use super::hostile::guest;
use super::server::Herald;

const DM: &str = "dm:alice:bob";

async fn echo_status(herald: &Herald) -> Value {
    let listing = herald.get("/admin/plugins", Some("dev-key")).await;
    assert_eq!(listing.status, 200, "{}", listing.body);
    let plugins = listing.json()["plugins"].as_array().cloned().unwrap_or_default();
    assert_eq!(plugins.len(), 1, "the shadow shows under echo, not beside it: {plugins:?}");
    plugins[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_is_compared_on_live_traffic_and_applied_only_once_promoted() {
    let dir = tempfile::tempdir().expect("plugins dir");
    std::fs::copy(guest("echo_v1"), dir.path().join("echo.wasm")).expect("copy echo-v1");
    std::fs::copy(guest("echo_v2"), dir.path().join("echo.shadow.wasm")).expect("copy echo-v2");
    let herald = Herald::with().set("PLUGINS", dir.path().display()).start().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;

    alice.send_ok(DM, "version?").await;
    alice.send_ok(DM, "hello").await;
    let got = bob.deliver_in(DM).await.message.expect("a message");
    assert_eq!(got.body.as_ref(), b"echo-v1", "the active version's rewrite is applied");
    let mut echo = echo_status(&herald).await;
    for _ in 0..100 {
        if echo["shadow"]["compared"] == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        echo = echo_status(&herald).await;
    }
    let shadow = &echo["shadow"];
    assert_eq!((shadow["compared"].clone(), shadow["differed"].clone()), (json!(2), json!(1)), "{echo}");
    assert_eq!(shadow["differences"][0]["kind"], "message-policy: rewrite → rewrite", "{echo}");

    let promoted = herald.post("/admin/plugins/echo/promote", Some("dev-key"), &json!({})).await;
    assert_eq!(promoted.status, 200, "{}", promoted.body);
    assert_eq!(promoted.json()["plugin"]["canary"]["state"], "watching", "{}", promoted.body);
    alice.send_ok(DM, "version?").await;
    let got = bob.deliver_in(DM).await.message.expect("a message");
    let got = if got.body.as_ref() == b"hello" { bob.deliver_in(DM).await.message.expect("a message") } else { got };
    assert_eq!(got.body.as_ref(), b"echo-v2", "the promoted version's rewrite is applied");

    let again = herald.post("/admin/plugins/echo/promote", Some("dev-key"), &json!({})).await;
    assert_eq!(again.status, 404, "{}", again.body);
    let discard = herald.request("DELETE", "/admin/plugins/echo/shadow", Some("dev-key"), None).await;
    assert_eq!(discard.status, 404, "{}", discard.body);
    let no_key = herald.post("/admin/plugins/echo/promote", None, &json!({})).await;
    assert_eq!(no_key.status, 401, "{}", no_key.body);
}
