//! Contract checks at load: versions, hooks discovered from exports, manifests; and the
//! `check` helper behind `herald plugin check`.

use crate::support::{TestHost, built, install, message};
use herald_plugin_runtime::{
    CONTRACT_VERSION, Hook, OLDEST_CONTRACT_VERSION, PluginHostConfig, PluginState, check,
    types::{Delivery, MessageDecision, Rejection},
};
use std::collections::HashSet;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_built_for_another_contract_version_is_refused_naming_both() {
    let t = TestHost::new(PluginHostConfig::default());
    install(t.path(), "future-contract", "future", None);
    t.load().await;
    let s = t.status("future");
    assert_eq!(s.state, PluginState::Failed);
    let error = s.last_load_error.unwrap_or_default();
    assert!(
        error.contains("herald:plugin@0.3.0")
            && error.contains(&format!("herald:plugin@{OLDEST_CONTRACT_VERSION} to herald:plugin@{CONTRACT_VERSION}")),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_are_discovered_from_the_exports() {
    let t = TestHost::new(PluginHostConfig::default());
    install(t.path(), "gate", "gate", None);
    install(t.path(), "echo-v1", "echo", None);
    t.load().await;
    assert_eq!(t.status("gate").hooks, [Hook::MessagePolicy, Hook::Connect]);
    assert_eq!(t.status("echo").hooks, [Hook::MessagePolicy]);
    assert_eq!(t.host.chain(Hook::Connect), ["gate"]);
    assert!(t.host.chain(Hook::Degrade).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_claiming_other_hooks_than_exported_is_refused() {
    let t = TestHost::new(PluginHostConfig::default());
    install(t.path(), "echo-v1", "echo", Some(r#"hooks = ["message-policy", "degrade"]"#));
    t.load().await;
    let error = t.status("echo").last_load_error.unwrap_or_default();
    assert!(
        error.contains("claims hooks [message-policy, degrade]") && error.contains("exports [message-policy]"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_manifests_and_oversized_memory_caps_are_refused_with_the_reason() {
    let t = TestHost::new(PluginHostConfig::default());
    install(t.path(), "echo-v1", "typo", Some("vresion = \"1\""));
    install(t.path(), "echo-v1", "named", Some("name = \"other\""));
    install(t.path(), "echo-v1", "greedy", Some("[limits]\nmemory_mib = 4096"));
    t.load().await;
    let err = |n: &str| t.status(n).last_load_error.unwrap_or_default();
    assert!(err("typo").contains("vresion"), "{}", err("typo"));
    assert!(err("named").contains("`other`"), "{}", err("named"));
    assert!(err("greedy").contains("4096 MiB"), "{}", err("greedy"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_lists_hooks_and_contract_and_runs_each_hook_once() {
    let report = check(built().guests.join("gate.wasm")).await.expect("checking gate");
    assert_eq!(report.contract_version, CONTRACT_VERSION);
    assert_eq!(report.hooks, [Hook::MessagePolicy, Hook::Connect]);
    assert_eq!(report.samples.len(), 2);
    assert!(report.samples.iter().all(|s| s.outcome.is_ok()), "{report:?}");
    assert!(report.imports.iter().any(|i| i.starts_with("herald:plugin/host@")) || report.imports.is_empty());
    let refused = check(built().guests.join("future_contract.wasm")).await;
    assert!(refused.is_err_and(|e| e.to_string().contains("0.3.0")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_built_for_contract_0_1_loads_and_works_unchanged() {
    assert_ne!(OLDEST_CONTRACT_VERSION, CONTRACT_VERSION, "this test is about an older contract");
    let t = TestHost::new(PluginHostConfig::default());
    install(t.path(), "contract-0-1", "old", None);
    t.load().await;
    let status = t.status("old");
    assert_eq!(status.state, PluginState::Active, "{status:?}");
    assert_eq!(status.contract.as_deref(), Some("0.1.0"));
    assert_eq!(status.hooks, [Hook::MessagePolicy]);
    // Its hook answers, and its host imports (`host@0.1.0`: a KV counter) work.
    assert_eq!(t.host.message_policy(&message("alice", "dm:alice:bob", "hello")).await, MessageDecision::Allow);
    assert_eq!(
        t.host.message_policy(&message("alice", "dm:alice:bob", "count?")).await,
        MessageDecision::Rewrite(b"2".to_vec())
    );
    assert_eq!(
        t.host.message_policy(&message("alice", "dm:alice:bob", "forbidden")).await,
        MessageDecision::Reject(Rejection {
            code: "old-contract".into(),
            reason: "refused by a 0.1.0 plugin".into(),
            retry_after_ms: None
        })
    );
    assert_eq!(t.status("old").failures, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_the_contract_a_file_targets() {
    let old = check(built().guests.join("contract_0_1.wasm")).await.expect("checking the 0.1.0 plugin");
    assert_eq!(old.contract_version, "0.1.0");
    assert!(old.imports.iter().any(|i| i == "herald:plugin/host@0.1.0"), "{:?}", old.imports);
    let current = check(built().guests.join("block_list.wasm")).await.expect("checking block-list");
    assert_eq!(current.contract_version, CONTRACT_VERSION);
    assert_eq!(current.hooks, [Hook::DeliverFilter]);
    assert!(current.samples.iter().all(|s| s.outcome.is_ok()), "{current:?}");
}

fn delivery(conversation: &str, sender: &str, recipients: &[&str]) -> Delivery {
    Delivery {
        conversation: conversation.into(),
        seq: 7,
        sender: sender.into(),
        kind: 1,
        body: b"hi".to_vec(),
        recipients: recipients.iter().map(|&r| r.to_owned()).collect(),
    }
}

fn users(ids: &[&str]) -> HashSet<String> {
    ids.iter().map(|&id| id.to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_filter_drops_exactly_the_recipients_its_plugins_name() {
    let t = TestHost::new(PluginHostConfig::default());
    // Without a plugin nobody is dropped.
    let everyone = delivery("grp:team", "alice", &["bob", "carol", "dave"]);
    assert!(t.host.deliver_filter(&everyone).await.is_empty());
    install(
        t.path(),
        "block-list",
        "blocks",
        Some("[config.blocks]\nbob = [\"alice\"]\n[config.muted_rooms]\n\"room:lobby\" = [\"dave\"]\n"),
    );
    t.load().await;
    assert_eq!(t.status("blocks").contract.as_deref(), Some(CONTRACT_VERSION));
    assert_eq!(t.host.chain(Hook::DeliverFilter), ["blocks"]);
    assert_eq!(t.host.deliver_filter(&everyone).await, users(&["bob"]));
    // Another sender: bob blocked only alice.
    assert!(t.host.deliver_filter(&delivery("grp:team", "erin", &["bob", "carol"])).await.is_empty());
    // In the muted room both rules apply.
    assert_eq!(
        t.host.deliver_filter(&delivery("room:lobby", "alice", &["bob", "carol", "dave"])).await,
        users(&["bob", "dave"])
    );
    // A big batch: one call, the same answer.
    let crowd: Vec<String> = (0..10_000).map(|n| format!("user{n}")).chain(["bob".to_owned()]).collect();
    let crowd: Vec<&str> = crowd.iter().map(String::as_str).collect();
    assert_eq!(t.host.deliver_filter(&delivery("room:big", "alice", &crowd)).await, users(&["bob"]));
}
