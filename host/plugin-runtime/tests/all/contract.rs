//! Contract checks at load: versions, hooks discovered from exports, manifests; and the
//! `check` helper behind `herald plugin check`.

use crate::support::{TestHost, built, install};
use herald_plugin_runtime::{CONTRACT_VERSION, Hook, PluginHostConfig, PluginState, check};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_built_for_another_contract_version_is_refused_naming_both() {
    let t = TestHost::new(PluginHostConfig::default());
    install(t.path(), "future-contract", "future", None);
    t.load().await;
    let s = t.status("future");
    assert_eq!(s.state, PluginState::Failed);
    let error = s.last_load_error.unwrap_or_default();
    assert!(
        error.contains("herald:plugin@0.2.0") && error.contains(&format!("herald:plugin@{CONTRACT_VERSION}")),
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
    assert!(refused.is_err_and(|e| e.to_string().contains("0.2.0")));
}
