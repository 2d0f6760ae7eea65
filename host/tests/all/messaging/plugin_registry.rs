//! The plugin registry: uploads checked before they are stored (a refusal changes
//! nothing), deploys, shadows, promotions and rollbacks through `herald plugin push` /
//! `deploy` and the admin API, the audit trail; on one embedded node, and on three cluster
//! nodes on PostgreSQL and on MariaDB, where every node switches together, a node that
//! cannot warm a version aborts the deploy everywhere, a node that was down serves the
//! registry's version from its first connection, a shadow's comparisons are summed over the
//! nodes, and a canary that fails on one node is rolled back on all of them.

use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine as _;
use herald_host::store::Backend;
use herald_proto::v1::send_ack::Status;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

use super::client::Client;
use super::dm;
use super::hostile::guest;
use super::nodes::Nodes;
use super::server::{DEV_KEY, Herald};
use crate::support::poll::poll;

pub(super) const ECHO_V1: &str = "name = \"echo\"\nversion = \"1.0.0\"\n";
pub(super) const ECHO_V2: &str = "name = \"echo\"\nversion = \"2.0.0\"\n";
const WF: &str = "name = \"wf\"\nversion = \"1.0.0\"\n[config]\nblocked_words = [\"spam\"]\n";

/// `PUT /admin/plugins/{name}/versions/{version}` with raw bytes and the manifest header.
async fn put(herald: &Herald, name: &str, version: &str, component: &[u8], manifest: &str) -> (u16, Value) {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", herald.port)).await.expect("connect");
    let mut head = format!(
        "PUT /admin/plugins/{name}/versions/{version} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         Authorization: Bearer {DEV_KEY}\r\nContent-Length: {}\r\n",
        component.len()
    );
    if !manifest.is_empty() {
        let encoded = base64::engine::general_purpose::STANDARD.encode(manifest);
        head.push_str(&format!("X-Herald-Manifest: {encoded}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.expect("write head");
    // A server refusing a large body may close before reading it all.
    let _ = stream.write_all(component).await;
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Runs `herald plugin ARGS… --url URL --key dev-key`; its stdout, or its stderr as the error.
pub(super) fn cli(herald: &Herald, args: &[&str]) -> Result<Value, String> {
    cli_on(herald.port, args)
}

/// [`cli`] through node `at` of `nodes`; a failure panics with every node's log.
fn cli_through(nodes: &Nodes, at: usize, args: &[&str]) -> Value {
    cli(&nodes.nodes[at], args)
        .unwrap_or_else(|error| panic!("herald plugin {}: {error}\n{}", args.join(" "), nodes.log_tails()))
}

/// [`cli`] on the node listening on `port`.
fn cli_on(port: u16, args: &[&str]) -> Result<Value, String> {
    let output = Command::new(env!("CARGO_BIN_EXE_herald"))
        .arg("plugin")
        .args(args)
        .args(["--url", &format!("http://127.0.0.1:{port}"), "--key", DEV_KEY])
        .output()
        .expect("run herald plugin");
    if output.status.success() {
        Ok(serde_json::from_slice(&output.stdout).unwrap_or(Value::Null))
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// Writes `text` to a manifest file in `dir`.
fn manifest_file(dir: &tempfile::TempDir, file: &str, text: &str) -> String {
    let path = dir.path().join(file);
    std::fs::write(&path, text).expect("write manifest");
    path.display().to_string()
}

pub(super) fn push(herald: &Herald, krate: &str, manifest: &str) -> Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = manifest_file(&dir, "plugin.toml", manifest);
    let wasm = guest(krate).display().to_string();
    cli(herald, &["push", &wasm, "--manifest", &file]).unwrap_or_else(|error| panic!("push {krate}: {error}"))
}

/// The version of plugin `name` the node serves (its manifest version), if any.
async fn serving(herald: &Herald, name: &str) -> Option<String> {
    let listing = herald.get("/admin/plugins", Some(DEV_KEY)).await.json();
    let plugins = listing["plugins"].as_array().cloned().unwrap_or_default();
    plugins.iter().find(|p| p["name"] == name).and_then(|p| p["version"].as_str().map(str::to_owned))
}

async fn history(herald: &Herald, name: &str) -> Vec<String> {
    let response = herald.get(&format!("/admin/plugins/{name}/history"), Some(DEV_KEY)).await;
    assert_eq!(response.status, 200, "{}", response.body);
    let rows = response.json()["history"].as_array().cloned().unwrap_or_default();
    rows.iter().map(|row| row["action"].as_str().unwrap_or_default().to_owned()).collect()
}

async fn registry(herald: &Herald) -> Value {
    herald.get("/admin/plugins", Some(DEV_KEY)).await.json()["registry"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_uploads_are_refused_with_a_reason_and_leave_the_registry_unchanged() {
    let herald = Herald::with().set("PLUGIN_REGISTRY__MAX_COMPONENT_BYTES", 3_000_000).start().await;
    let echo = std::fs::read(guest("echo_v1")).expect("echo-v1");

    let (status, body) = put(&herald, "junk", "1.0.0", b"not a component at all", "").await;
    assert_eq!((status, body["error"]["code"].clone()), (422, json!("refused")), "{body}");

    let future = std::fs::read(guest("future_contract")).expect("future-contract");
    let (status, body) = put(&herald, "future", "1.0.0", &future, "").await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("contract"), "{body}");

    let filter = std::fs::read(guest("word_filter")).expect("word-filter");
    let bad_config = "name = \"wf\"\nversion = \"1.0.0\"\n[config]\nblocked_words = \"not a list\"\n";
    let (status, body) = put(&herald, "wf", "1.0.0", &filter, bad_config).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("sample message-policy call"), "{body}");

    let (status, body) = put(&herald, "echo", "3.0.0", &echo, ECHO_V1).await;
    assert_eq!(status, 422, "the manifest says 1.0.0: {body}");

    let (status, body) = put(&herald, "echo", "1.0.0", &vec![0u8; 3_000_001], "").await;
    assert_eq!((status, body["error"]["code"].clone()), (413, json!("too_large")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("max_component_bytes"), "{body}");

    let (status, body) = put(&herald, "not.a.name", "1.0.0", &echo, "").await;
    assert_eq!(status, 400, "{body}");

    // Without the admin key nothing else of a request is read: a bad body gets 401, not 400.
    let unkeyed = herald.post("/admin/plugins/not.a.name/deploy", None, &json!("not a deploy")).await;
    assert_eq!(unkeyed.status, 401, "{}", unkeyed.body);
    let wrong = herald.post("/admin/plugins/echo/deploy", Some("not-the-key"), &json!({"version": "1.0.0"})).await;
    assert_eq!(wrong.status, 401, "{}", wrong.body);

    let registry = registry(&herald).await;
    assert_eq!(registry["plugins"], json!([]), "{registry}");
    for name in ["junk", "future", "wf", "echo"] {
        assert!(history(&herald, name).await.is_empty(), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_deploy_shadow_promote_and_rollback_on_one_node_leave_an_audit_trail() {
    let herald = Herald::with().set("PLUGIN_REGISTRY__POLL_MS", 200).start().await;
    assert_eq!(push(&herald, "echo_v1", ECHO_V1)["stored"], true);
    assert_eq!(push(&herald, "echo_v1", ECHO_V1)["stored"], false, "the same upload again changes nothing");
    let deployed = cli(&herald, &["deploy", "echo", "1.0.0"]).expect("deploy 1.0.0");
    assert_eq!(deployed["active"], "1.0.0", "{deployed}");
    assert_eq!(serving(&herald, "echo").await.as_deref(), Some("1.0.0"));

    // A version is written once: other bytes under 1.0.0 are refused.
    let echo_v2 = std::fs::read(guest("echo_v2")).expect("echo-v2");
    let (status, body) = put(&herald, "echo", "1.0.0", &echo_v2, ECHO_V1).await;
    assert_eq!(status, 409, "{body}");

    push(&herald, "echo_v2", ECHO_V2);
    cli(&herald, &["deploy", "echo", "2.0.0", "--shadow"]).expect("deploy 2.0.0 as shadow");
    let listing = herald.get("/admin/plugins", Some(DEV_KEY)).await.json();
    let echo = listing["plugins"].as_array().and_then(|p| p.iter().find(|p| p["name"] == "echo").cloned());
    assert_eq!(echo.as_ref().map(|e| e["shadow"]["version"].clone()), Some(json!("2.0.0")), "{listing}");

    let promoted = herald.post("/admin/plugins/echo/promote", Some(DEV_KEY), &json!({})).await;
    assert_eq!(promoted.status, 200, "{}", promoted.body);
    assert_eq!(serving(&herald, "echo").await.as_deref(), Some("2.0.0"));
    let rolled = herald.post("/admin/plugins/echo/rollback", Some(DEV_KEY), &json!({})).await;
    assert_eq!(rolled.status, 200, "{}", rolled.body);
    assert_eq!(serving(&herald, "echo").await.as_deref(), Some("1.0.0"));

    let versions = registry(&herald).await["plugins"][0]["versions"].clone();
    let node = herald.get("/admin/cluster", Some(DEV_KEY)).await.json()["this_node"].to_string();
    assert_eq!(versions[0]["nodes"][&node], "active", "{versions}");
    assert_eq!(versions[1]["nodes"][&node], "stored", "{versions}");
    assert_eq!(history(&herald, "echo").await, ["upload", "deploy", "upload", "deploy-shadow", "promote", "rollback"]);
}

async fn a_deploy_switches_every_node_and_one_that_cannot_warm_aborts_it(backend: Backend) {
    let fast = [("PLUGIN_REGISTRY__POLL_MS", "200")];
    let mut nodes = Nodes::start_with(2, backend, &fast).await;
    // Node 2 gives plugin `wf` a setting its code cannot read: its sample call traps there only.
    let odd = nodes.options().set("PLUGIN_RUNTIME__PLUGINS__WF__CONFIG__BLOCKED_WORDS", "oops").start().await;
    nodes.nodes.push(odd);
    nodes.wait_for_members(3).await;

    push(&nodes.nodes[0], "echo_v1", ECHO_V1);
    cli_through(&nodes, 0, &["deploy", "echo", "1.0.0"]);
    push(&nodes.nodes[1], "echo_v2", ECHO_V2);
    cli_through(&nodes, 0, &["deploy", "echo", "2.0.0"]);
    let everywhere = poll().within(Duration::from_secs(2)).every(Duration::from_millis(20));
    everywhere
        .until("every node to serve echo 2.0.0", async || {
            for node in &nodes.nodes {
                if serving(node, "echo").await.as_deref() != Some("2.0.0") {
                    return false;
                }
            }
            true
        })
        .await;

    // `wf` passes the upload's checks (default settings), but node 2 cannot warm it.
    push(&nodes.nodes[0], "word_filter", WF);
    let odd_id = nodes.node_id(2).await;
    let refused = cli(&nodes.nodes[0], &["deploy", "wf", "1.0.0"]).expect_err("the deploy must abort");
    assert!(refused.contains(&format!("node {odd_id}")) && refused.contains("sample"), "{refused}");
    for node in &nodes.nodes {
        assert_eq!(serving(node, "wf").await, None, "no node serves the aborted version");
        assert_eq!(serving(node, "echo").await.as_deref(), Some("2.0.0"));
    }
    assert_eq!(history(&nodes.nodes[1], "wf").await, ["upload", "deploy-aborted"]);

    // A node down during a deploy serves the new version from its first connection on.
    nodes.terminate(1).await;
    nodes
        .wait_until("node 0 to see two members", async || {
            nodes.cluster_of(0).await["members"].as_array().map(Vec::len) == Some(2)
        })
        .await;
    let rolled = nodes.nodes[0].post("/admin/plugins/echo/rollback", Some(DEV_KEY), &json!({})).await;
    assert_eq!(rolled.status, 200, "{}", rolled.body);
    nodes.restart(1).await;
    assert_eq!(serving(&nodes.nodes[1], "echo").await.as_deref(), Some("1.0.0"), "{}", nodes.log_tails());
    assert_eq!(history(&nodes.nodes[2], "echo").await, ["upload", "deploy", "upload", "deploy", "rollback"]);
    nodes.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_switches_every_node_and_one_that_cannot_warm_aborts_it_on_postgres() {
    a_deploy_switches_every_node_and_one_that_cannot_warm_aborts_it(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_switches_every_node_and_one_that_cannot_warm_aborts_it_on_mariadb() {
    a_deploy_switches_every_node_and_one_that_cannot_warm_aborts_it(Backend::MySql).await;
}

/// One message of the switch test: when it was sent and acknowledged, as the test saw it.
struct Sent {
    sent: Instant,
    acked: Instant,
    id: u64,
    ok: bool,
}

/// Sends `version?` on `conversation` until `stop`, one at a time, counting acks in `acked`.
/// A send turned back with `RETRY` (a node shedding load: the senders go flat out on a
/// small machine) is sent again with the same `client_msg_id` once `retry_after_ms` has
/// passed, as PROTOCOL.md asks of a client; it counts as sent at its last attempt, the one
/// the plugin decided (at its first when the answer is `DUPLICATE`: an earlier attempt
/// was stored).
async fn keep_sending(
    mut client: Client,
    conversation: String,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
) -> (Client, String, Vec<Sent>) {
    let mut log = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let give_up = Instant::now() + Duration::from_secs(30);
        let (ack, sent) = client.resend_while_retry(&super::uuid(), &conversation, b"version?", give_up).await;
        let ok = matches!(ack.status(), Status::Ok | Status::Duplicate);
        log.push(Sent { sent, acked: Instant::now(), id: ack.message_id, ok });
        acked.fetch_add(1, Ordering::Relaxed);
    }
    (client, conversation, log)
}

/// The switch is one moment for the cluster: while senders on every node keep sending,
/// no message is decided by the old version once any node decided one by the new. Each
/// decision names its version (`echo` rewrites `version?` to `echo-v1` / `echo-v2`), read
/// back from the stored messages; "once" is what the test itself saw: a message sent after
/// the acknowledgement of one decided by the new version was decided after it.
async fn a_deploy_switches_every_node_at_one_moment(backend: Backend) {
    let fast = [("PLUGIN_REGISTRY__POLL_MS", "200")];
    let mut nodes = Nodes::start_with(2, backend, &fast).await;
    // The third node hears of each step at its poll only, up to 200 ms after the others
    // (which hear at once): without the cluster-wide hold it would go on deciding with the
    // old version that long after they decided with the new.
    let late = nodes.options().set("PLUGIN_REGISTRY__NOTICES", "false").start().await;
    nodes.nodes.push(late);
    nodes.wait_for_members(3).await;
    push(&nodes.nodes[0], "echo_v1", ECHO_V1);
    cli_through(&nodes, 0, &["deploy", "echo", "1.0.0"]);
    push(&nodes.nodes[0], "echo_v2", ECHO_V2);

    let (stop, acked) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
    let mut senders = Vec::new();
    for (at, node) in nodes.nodes.iter().enumerate() {
        for k in 0..4 {
            let user = format!("sender{at}x{k}");
            let client = Client::connect(node, &user, "phone").await;
            let conversation = dm(&user, "sink");
            senders.push(tokio::spawn(keep_sending(client, conversation, Arc::clone(&stop), Arc::clone(&acked))));
        }
    }
    let sending = poll().within(Duration::from_secs(60));
    sending.until("the senders to get going", async || acked.load(Ordering::Relaxed) >= 200).await;
    let port = nodes.nodes[1].port;
    let deployed = tokio::task::spawn_blocking(move || cli_on(port, &["deploy", "echo", "2.0.0"])).await;
    let deployed = deployed
        .expect("the deploy's thread")
        .unwrap_or_else(|error| panic!("deploy 2.0.0: {error}\n{}", nodes.log_tails()));
    assert_eq!(deployed["applied_everywhere"], true, "{deployed}");
    // The answer says how long each step took, the hold included.
    for phase in ["ready", "hold", "switch", "apply"] {
        assert!(deployed["phases_ms"][phase].is_u64(), "phases_ms.{phase} missing in {deployed}");
    }
    let after = acked.load(Ordering::Relaxed) + 300;
    sending.until("300 more messages after the deploy", async || acked.load(Ordering::Relaxed) >= after).await;
    stop.store(true, Ordering::Relaxed);

    let mut decided = Vec::new();
    for sender in senders {
        let (mut client, conversation, log) = sender.await.expect("a sender");
        let stored: HashMap<u64, String> = client
            .whole_history(&conversation)
            .await
            .into_iter()
            .map(|m| (m.id, String::from_utf8_lossy(&m.body).into_owned()))
            .collect();
        for sent in log {
            assert!(sent.ok, "every message is accepted during the deploy");
            let version = stored.get(&sent.id).cloned().unwrap_or_else(|| panic!("message {} is stored", sent.id));
            decided.push((sent, version));
        }
    }
    let first_new = decided.iter().filter(|(_, v)| v == "echo-v2").map(|(s, _)| s.acked).min();
    let first_new = first_new.expect("some messages were decided by the new version");
    let late_old: Vec<u64> =
        decided.iter().filter(|(s, v)| v == "echo-v1" && s.sent > first_new).map(|(s, _)| s.id).collect();
    assert!(decided.iter().any(|(_, v)| v == "echo-v1"), "some messages were decided by the old version");
    assert!(
        late_old.is_empty(),
        "{} of {} messages were decided by the old version after one was decided by the new: {late_old:?}",
        late_old.len(),
        decided.len()
    );
    nodes.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_switches_every_node_at_one_moment_on_postgres() {
    a_deploy_switches_every_node_at_one_moment(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_switches_every_node_at_one_moment_on_mariadb() {
    a_deploy_switches_every_node_at_one_moment(Backend::MySql).await;
}

/// The hostile guest as version 2.0.0 of `echo`: it allows every message but traps on the
/// body `panic`, and a failed call lets the message through.
const HOSTILE_V2: &str = "name = \"echo\"\nversion = \"2.0.0\"\n[failure]\nmessage-policy = \"allow\"\n";

/// A conversation of `user` whose owner is node `at`, found by asking the route table.
async fn owned_by(nodes: &Nodes, at: usize, user: &str) -> String {
    for k in 0..200 {
        let conversation = dm(user, &format!("peer{k}"));
        if nodes.owner_of(0, user, &conversation).await == at {
            return conversation;
        }
    }
    panic!("no conversation of {user} is owned by node {at}")
}

/// `echo`'s entry in the registry listing of `herald`.
async fn echo_entry(herald: &Herald) -> Value {
    let plugins = registry(herald).await["plugins"].as_array().cloned().unwrap_or_default();
    plugins.into_iter().find(|p| p["name"] == "echo").unwrap_or(Value::Null)
}

/// A shadow runs on every node and its comparisons are summed over them; a promoted
/// version that fails on one node only (its failures there cross the canary's bound, the
/// sum over the nodes does not) is rolled back on every node, the history naming the node.
async fn a_shadow_is_summed_over_the_nodes_and_a_canary_failing_on_one_rolls_back_everywhere(backend: Backend) {
    let settings = [
        ("PLUGIN_REGISTRY__POLL_MS", "200"),
        ("PLUGIN_RUNTIME__CANARY__MIN_CALLS", "5"),
        ("PLUGIN_RUNTIME__CANARY__MAX_FAILURE_RATIO", "0.3"),
        // Latency is not what this test is about: a loaded machine must not roll back.
        ("PLUGIN_RUNTIME__CANARY__MIN_P99_US", "60000000"),
    ];
    let nodes = Nodes::start_with(3, backend, &settings).await;
    push(&nodes.nodes[0], "echo_v1", ECHO_V1);
    cli_through(&nodes, 0, &["deploy", "echo", "1.0.0"]);
    push(&nodes.nodes[0], "hostile", HOSTILE_V2);
    cli_through(&nodes, 1, &["deploy", "echo", "2.0.0", "--shadow"]);

    // One sender per node, each writing in a conversation that node owns, where the
    // message policy (and so the shadow) runs.
    let mut senders = Vec::new();
    for at in 0..3 {
        let user = format!("owner{at}sender");
        let conversation = owned_by(&nodes, at, &user).await;
        senders.push((Client::connect(&nodes.nodes[at], &user, "phone").await, conversation));
    }
    const EACH: u64 = 10;
    for (client, conversation) in &mut senders {
        for _ in 0..EACH {
            // `echo` 1.0.0 rewrites `version?`; the shadow allows it as it is: a difference.
            assert_eq!(client.send(conversation, "version?").await.status(), Status::Ok);
        }
    }
    let everything = 3 * EACH;
    let summed = poll()
        .until("every node's shadow comparisons to be reported and summed", async || {
            let echo = echo_entry(&nodes.nodes[2]).await;
            let summed = echo["shadow_summed"].clone();
            (summed["compared"] == everything).then_some(echo)
        })
        .await;
    assert_eq!(summed["shadow_summed"]["differed"], everything, "{summed}");
    let per_node: Vec<u64> = summed["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|node| node["shadow_status"]["compared"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(per_node, [EACH; 3], "each node compared what it decided: {summed}");

    let promoted = nodes.nodes[0].post("/admin/plugins/echo/promote", Some(DEV_KEY), &json!({})).await;
    assert_eq!(promoted.status, 200, "{}", promoted.body);
    for node in &nodes.nodes {
        poll()
            .until("every node to serve the promoted version", async || {
                serving(node, "echo").await.as_deref() == Some("2.0.0")
            })
            .await;
    }
    // Node 2's calls all fail; the other two nodes' calls all pass, enough of them that the
    // ratio summed over the nodes stays under the bound.
    let (failing, passing) = (6, 30);
    for (at, (client, conversation)) in senders.iter_mut().enumerate() {
        let (body, count) = if at == 2 { ("panic", failing) } else { ("hello", passing) };
        for _ in 0..count {
            assert_eq!(client.send(conversation, body).await.status(), Status::Ok, "a failed call lets it through");
        }
    }
    for node in &nodes.nodes {
        poll()
            .until("every node to serve the previous version again", async || {
                serving(node, "echo").await.as_deref() == Some("1.0.0")
            })
            .await;
    }
    let response = nodes.nodes[1].get("/admin/plugins/echo/history", Some(DEV_KEY)).await;
    let rows = response.json()["history"].as_array().cloned().unwrap_or_default();
    let rollback = rows.iter().rev().find(|row| row["action"] == "rollback").cloned().expect("a rollback");
    let failing_node = nodes.node_id(2).await;
    let detail = rollback["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with(&format!("canary: node {failing_node}: ")),
        "the node that crossed is named: {rollback}"
    );
    assert_eq!(echo_entry(&nodes.nodes[0]).await["canary"]["state"], "rolled_back");
    nodes.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_is_summed_over_the_nodes_and_a_canary_failing_on_one_rolls_back_everywhere_on_postgres() {
    a_shadow_is_summed_over_the_nodes_and_a_canary_failing_on_one_rolls_back_everywhere(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_is_summed_over_the_nodes_and_a_canary_failing_on_one_rolls_back_everywhere_on_mariadb() {
    a_shadow_is_summed_over_the_nodes_and_a_canary_failing_on_one_rolls_back_everywhere(Backend::MySql).await;
}
