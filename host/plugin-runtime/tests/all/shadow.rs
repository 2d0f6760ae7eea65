//! Shadow runs and canaries: a shadow sees the active version's inputs and is compared but
//! never applied; a promoted version is watched and rolled back by itself when it fails.

use crate::support::poll::poll;
use crate::support::{TestHost, built, install, message, no_quarantine};
use herald_plugin_runtime::{CanaryState, PluginHostConfig, PluginStatus, PromoteError, types::MessageDecision};
use std::{path::Path, time::Duration};

const HOSTILE_MANIFEST: &str = include_str!("../guests/hostile/plugin.toml");

fn rewrite(v: &str) -> MessageDecision {
    MessageDecision::Rewrite(v.as_bytes().to_vec())
}

/// Polls `echo`'s status until `done` holds (the shadow's calls and the canary's checks run
/// in tasks of their own).
async fn until(t: &TestHost, what: &str, done: impl Fn(&PluginStatus) -> bool) -> PluginStatus {
    poll()
        .every(Duration::from_millis(20))
        .until(what, async || {
            let status = t.status("echo");
            if done(&status) { Ok(status) } else { Err(format!("{status:#?}")) }
        })
        .await
}

fn same_bytes(a: &Path, b: &Path) -> bool {
    std::fs::read(a).ok().zip(std::fs::read(b).ok()).is_some_and(|(a, b)| a == b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_is_compared_on_the_same_inputs_and_never_applied() {
    let t = TestHost::new(no_quarantine());
    install(t.path(), "echo-v1", "echo", None);
    install(t.path(), "echo-v2", "echo.shadow", None);
    t.load().await;
    let names: Vec<String> = t.host.status().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["echo"], "the shadow shows under the plugin it shadows");
    for n in 0..12 {
        let body = if n % 4 == 0 { "version?" } else { "hello" };
        let decision = t.host.message_policy(&message("alice", "dm:alice:bob", body)).await;
        // The active version's answer is the one applied, always.
        let expected = if n % 4 == 0 { rewrite("echo-v1") } else { MessageDecision::Allow };
        assert_eq!(decision, expected);
    }
    let status = until(&t, "12 calls compared", |s| s.shadow.as_ref().is_some_and(|s| s.compared == 12)).await;
    let shadow = status.shadow.expect("a shadow");
    assert_eq!((shadow.agreed, shadow.differed, shadow.calls, shadow.failures), (9, 3, 12, 0), "{shadow:#?}");
    assert_eq!(shadow.differences.len(), 1, "{shadow:#?}");
    let kind = &shadow.differences[0];
    assert_eq!((kind.kind.as_str(), kind.count), ("message-policy: rewrite → rewrite", 3));
    let example = &kind.examples[0];
    assert_eq!(
        serde_json::to_value(example).expect("json")["shadow"],
        serde_json::json!({ "message": { "Rewrite": b"echo-v2".to_vec() } })
    );
    assert!(status.p99_call_us.is_some() && shadow.p99_call_us.is_some(), "latency side by side");

    // Removing the shadow removes its files and its comparisons.
    assert!(t.host.discard_shadow("echo").await.expect("discard"));
    assert!(!t.path().join("echo.shadow.wasm").exists());
    assert!(t.status("echo").shadow.is_none());
    assert!(matches!(t.host.promote("echo").await, Err(PromoteError::NoShadow(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_version_that_starts_failing_is_rolled_back_within_the_window() {
    let mut config = no_quarantine();
    config.canary.window_ms = 60_000;
    config.canary.min_calls = 20;
    let t = TestHost::new(config);
    install(t.path(), "echo-v1", "echo", None);
    install(t.path(), "hostile", "echo.shadow", Some(HOSTILE_MANIFEST));
    t.load().await;
    let promoted = t.host.promote("echo").await.expect("promote");
    assert_eq!(promoted.canary.as_ref().map(|c| c.state), Some(CanaryState::Watching), "{promoted:#?}");
    // The shadow's files are the active ones now; the old ones are kept for a rollback.
    assert!(same_bytes(&t.path().join("echo.wasm"), &built().guests.join("hostile.wasm")));
    assert!(same_bytes(&t.path().join("echo.previous.wasm"), &built().guests.join("echo_v1.wasm")));
    assert!(t.path().join("echo.toml").exists() && !t.path().join("echo.shadow.wasm").exists());
    assert_eq!(t.host.message_policy(&message("a", "room:x", "version?")).await, MessageDecision::Allow);

    // It starts failing: its `deny` policy answers, and the canary rolls it back (maybe
    // while these calls still run: then echo-v1 allows the rest).
    let mut refused = 0;
    for _ in 0..25 {
        match t.host.message_policy(&message("a", "room:x", "panic")).await {
            MessageDecision::Reject(_) => refused += 1,
            MessageDecision::Allow => {}
            other => panic!("{other:?}"),
        }
    }
    assert!(refused >= 20, "the canary judges after canary.min_calls calls, not before: {refused}");
    let status =
        until(&t, "the rollback", |s| s.canary.as_ref().is_some_and(|c| c.state == CanaryState::RolledBack)).await;
    let why = status.canary.and_then(|c| c.why).unwrap_or_default();
    assert!(why.contains("calls failed") && why.contains("panics on purpose"), "{why}");
    assert_eq!(t.host.message_policy(&message("a", "room:x", "version?")).await, rewrite("echo-v1"));
    // The files follow: the previous version is active again, the rejected one kept aside.
    assert!(same_bytes(&t.path().join("echo.wasm"), &built().guests.join("echo_v1.wasm")));
    assert!(same_bytes(&t.path().join("echo.rejected.wasm"), &built().guests.join("hostile.wasm")));
    assert!(!t.path().join("echo.toml").exists(), "echo-v1 had no manifest");
    // A reload of the folder leaves it so.
    t.host.reload().await.expect("reload");
    assert_eq!(t.host.message_policy(&message("a", "room:x", "version?")).await, rewrite("echo-v1"));
    assert_eq!(t.host.status().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_version_within_bounds_passes_its_window() {
    let mut config = PluginHostConfig::default();
    config.canary.window_ms = 300;
    let t = TestHost::new(config);
    install(t.path(), "echo-v1", "echo", None);
    install(t.path(), "echo-v2", "echo.shadow", None);
    t.load().await;
    let compiled = t.host.compilations();
    t.host.promote("echo").await.expect("promote");
    assert_eq!(t.host.compilations(), compiled, "the shadow's compiled code is reused");
    for _ in 0..30 {
        assert_eq!(t.host.message_policy(&message("a", "room:x", "version?")).await, rewrite("echo-v2"));
    }
    let status =
        until(&t, "the window passed", |s| s.canary.as_ref().is_some_and(|c| c.state == CanaryState::Passed)).await;
    assert_eq!(status.canary.map(|c| (c.promoted_version, c.previous_version)), Some(("0.0.0".into(), "0.0.0".into())));
    assert_eq!(t.host.message_policy(&message("a", "room:x", "version?")).await, rewrite("echo-v2"));
}
