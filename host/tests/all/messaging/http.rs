//! PROTOCOL.md's HTTP API: dev tokens, conversation history as JSON,
//! presence, groups, and errors as `{"error":{"code","message"}}`.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use herald_proto::Encoding;
use herald_proto::v1;
use serde_json::{Value, json};

use super::client::Client;
use super::server::{DEV_KEY, Herald, Response};
use super::{WAIT, dm};
use crate::support::poll::poll;

/// A uint64 in JSON: a string (canonical mapping) or a number.
fn as_u64(value: &Value) -> Option<u64> {
    value.as_u64().or_else(|| value.as_str().and_then(|s| s.parse().ok()))
}

/// The messages of an HTTP history response: `{"messages":[…]}` (or a bare array).
fn messages(response: &Response) -> Vec<Value> {
    let json = response.json();
    let list = json.get("messages").unwrap_or(&json);
    list.as_array().unwrap_or_else(|| panic!("history response has no messages array: {}", response.body)).clone()
}

fn assert_matches_acks(got: &[Value], acks: &[v1::SendAck], bodies: &[String], what: &str) {
    let pairs: Vec<(Option<u64>, Option<u64>)> = got.iter().map(|m| (as_u64(&m["id"]), as_u64(&m["seq"]))).collect();
    let want: Vec<(Option<u64>, Option<u64>)> = acks.iter().map(|a| (Some(a.message_id), Some(a.seq))).collect();
    assert_eq!(pairs, want, "{what}: (id, seq) in order; got {got:?}");
    for (message, body) in got.iter().zip(bodies) {
        let text = message["body"].as_str().unwrap_or_default();
        let decoded = STANDARD.decode(text).ok();
        assert!(
            decoded.as_deref() == Some(body.as_bytes()) || text == body,
            "{what}: body of {message} should be {body:?} (base64 in the canonical mapping)"
        );
        assert_eq!(message["sender"].as_str(), Some("alice"), "{what}: sender of {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_token_connects_and_history_is_served_as_json() {
    let herald = Herald::start().await;
    let alice_token = herald.dev_token("alice").await;
    assert!(!alice_token.is_empty());
    let mut alice = Client::open(&herald, Encoding::Json).await;
    let connected = alice.login(&alice_token, "laptop").await.unwrap_or_else(|why| panic!("dev token refused: {why}"));
    assert_eq!(connected.user_id, "alice");

    let conversation = dm("alice", "bob");
    let bodies: Vec<String> = (0..5).map(|i| format!("over http {i}")).collect();
    let mut acks = Vec::new();
    for body in &bodies {
        acks.push(alice.send_ok(&conversation, body).await);
    }

    let bob_token = herald.dev_token("bob").await;
    let path = format!("/v1/conversations/{conversation}/messages?after_seq=0&limit=100");
    let all = herald.get(&path, Some(&bob_token)).await;
    assert_eq!(all.status, 200, "{all:?}");
    assert!(all.header("content-type").is_some_and(|t| t.contains("application/json")), "{all:?}");
    assert_matches_acks(&messages(&all), &acks, &bodies, "GET messages after 0");

    let path = format!("/v1/conversations/{conversation}/messages?after_seq={}&limit=2", acks[1].seq);
    let page = herald.get(&path, Some(&alice_token)).await;
    assert_eq!(page.status, 200, "{page:?}");
    assert_matches_acks(&messages(&page), &acks[2..4], &bodies[2..4], "GET messages after the 2nd, limit 2");

    // In dev mode `dev:<user>` works as a bearer token too.
    let dev = herald.get(&format!("/v1/conversations/{conversation}/messages"), Some("dev:bob")).await;
    assert_eq!(dev.status, 200, "{dev:?}");
    assert_eq!(messages(&dev).len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_history_is_for_members_only() {
    let herald = Herald::start().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    alice.send_ok(&dm("alice", "bob"), "private").await;
    let path = format!("/v1/conversations/{}/messages", dm("alice", "bob"));

    let anonymous = herald.get(&path, None).await;
    assert_eq!(anonymous.status, 401, "no token: {anonymous:?}");
    anonymous.error_code();
    let garbage = herald.get(&path, Some("not-a-token")).await;
    assert_eq!(garbage.status, 401, "bad token: {garbage:?}");
    garbage.error_code();
    let carol = herald.dev_token("carol").await;
    let stranger = herald.get(&path, Some(&carol)).await;
    assert!(stranger.status == 403 || stranger.status == 404, "non-member: {stranger:?}");
    assert!(!stranger.body.contains("private") && !stranger.body.contains(&STANDARD.encode("private")));
    stranger.error_code();
    let bad_name = herald.get("/v1/conversations/dm:bob:alice/messages", Some("dev:alice")).await;
    assert_eq!(bad_name.status, 400, "malformed conversation: {bad_name:?}");
    bad_name.error_code();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_lists_online_devices_until_they_leave() {
    let herald = Herald::start().await;
    let laptop = Client::connect(&herald, "alice", "alpha-laptop-device").await;
    let _phone = Client::connect(&herald, "alice", "beta-phone-device").await;

    let presence = herald.get("/v1/users/alice/presence", Some(DEV_KEY)).await;
    assert_eq!(presence.status, 200, "{presence:?}");
    presence.json();
    assert!(
        presence.body.contains("alpha-laptop-device") && presence.body.contains("beta-phone-device"),
        "{presence:?}"
    );

    let anonymous = herald.get("/v1/users/alice/presence", None).await;
    assert!(anonymous.status == 401 || anonymous.status == 403, "presence needs the api key: {anonymous:?}");
    anonymous.error_code();

    laptop.close().await;
    let left = "a cleanly closed device to leave presence";
    let presence = poll()
        .within(WAIT)
        .every(std::time::Duration::from_millis(100))
        .until(left, async || {
            let presence = herald.get("/v1/users/alice/presence", Some(DEV_KEY)).await;
            assert_eq!(presence.status, 200, "{presence:?}");
            if presence.body.contains("alpha-laptop-device") { Err(format!("{presence:?}")) } else { Ok(presence) }
        })
        .await;
    assert!(presence.body.contains("beta-phone-device"), "the phone is still online: {presence:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_errors_are_json_with_a_fitting_status() {
    let herald = Herald::start().await;
    let group = json!({ "id": "team", "members": ["alice", "bob"] });

    let no_key = herald.post("/v1/groups", None, &group).await;
    assert_eq!(no_key.status, 401, "groups need the api key: {no_key:?}");
    no_key.error_code();
    let wrong_key = herald.post("/v1/groups", Some("not-the-key"), &group).await;
    assert!(wrong_key.status == 401 || wrong_key.status == 403, "{wrong_key:?}");
    wrong_key.error_code();

    let bad_id = herald.post("/v1/groups", Some(DEV_KEY), &json!({ "id": "two words", "members": ["alice"] })).await;
    assert_eq!(bad_id.status, 400, "invalid group id: {bad_id:?}");
    bad_id.error_code();
    let bad_member = herald.post("/v1/groups", Some(DEV_KEY), &json!({ "id": "ok", "members": ["al ice"] })).await;
    assert_eq!(bad_member.status, 400, "invalid member id: {bad_member:?}");
    bad_member.error_code();
    let not_json = herald.request_text("POST", "/v1/groups", Some(DEV_KEY), Some("{\"id\": ".into())).await;
    assert!((400..500).contains(&not_json.status), "malformed JSON body: {not_json:?}");
    not_json.error_code();

    let unknown_group = herald.request("PUT", "/v1/groups/nope/members/alice", Some(DEV_KEY), None).await;
    assert_eq!(unknown_group.status, 404, "member of a group that does not exist: {unknown_group:?}");
    unknown_group.error_code();

    let bad_user = herald.post("/v1/dev/token", None, &json!({ "user": "bad user" })).await;
    assert_eq!(bad_user.status, 400, "dev token for an invalid user id: {bad_user:?}");
    bad_user.error_code();

    let nothing = herald.get("/v1/nothing-here", None).await;
    assert_eq!(nothing.status, 404);
    nothing.error_code();

    // The valid request still works after all that.
    herald.create_group("team", &["alice", "bob"]).await;
    let again = herald.request("PUT", "/v1/groups/team/members/carol", Some(DEV_KEY), None).await;
    assert!(again.is_success(), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_cluster_and_health_describe_the_node() {
    let herald = Herald::start().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    alice.send_ok("dm:alice:bob", "counted").await;

    let metrics = herald.get("/metrics", None).await;
    assert_eq!(metrics.status, 200);
    assert!(
        metrics.body.contains("herald_store_batch_rows"),
        "Prometheus text with Herald's metrics: {}",
        metrics.body
    );

    let cluster = herald.get("/admin/cluster", Some("dev-key")).await;
    assert_eq!(cluster.status, 200, "{}", cluster.body);
    let cluster = cluster.json();
    assert_eq!(cluster["mode"], "embedded");
    let nodes = cluster["nodes"].as_array().cloned().unwrap_or_default();
    assert_eq!(nodes.len(), 1, "{cluster}");
    assert_eq!(nodes[0]["id"], cluster["this_node"]);
    assert_eq!(herald.get("/admin/cluster", None).await.status, 401);

    // Without a degrade plugin the tier is the built-in default.
    let health = herald.get("/admin/health", Some("dev-key")).await.json();
    assert_eq!(health["tier"], "normal", "{health}");
}
