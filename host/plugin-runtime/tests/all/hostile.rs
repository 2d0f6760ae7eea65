//! Hostile plugins: each failure costs only its own call, the hook's failure policy answers,
//! the failure shows in status, and other calls keep working.

use crate::support::{TestHost, install, message, no_quarantine};
use herald_plugin_runtime::{PluginHostConfig, PluginState, types::MessageDecision};
use std::time::{Duration, Instant};

const DENY_200MS: &str = include_str!("../guests/hostile/plugin.toml");

fn rejected_for_failure(d: &MessageDecision) -> bool {
    matches!(d, MessageDecision::Reject(r) if r.code == "plugin-failed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_infinite_loop_is_interrupted_within_twice_its_deadline() {
    let t = TestHost::new(no_quarantine());
    install(t.path(), "hostile", "hostile", Some(DENY_200MS));
    t.load().await;
    let started = Instant::now();
    let d = t.host.message_policy(&message("a", "room:x", "loop")).await;
    let took = started.elapsed();
    assert!(rejected_for_failure(&d), "{d:?}");
    assert!(took < Duration::from_millis(400), "a 200 ms deadline took {took:?}");
    assert_eq!(t.host.message_policy(&message("a", "room:x", "ok")).await, MessageDecision::Allow);
    let s = t.status("hostile");
    assert_eq!((s.calls, s.failures, s.timeouts), (2, 1, 1));
    assert!(s.last_error.as_deref().unwrap_or_default().contains("deadline of 200 ms"), "{s:?}");
}

/// The epoch ticker sleeps once no guest has started for a second; a guest that spins
/// after such a quiet spell must wake it, or nothing would ever interrupt the loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_infinite_loop_after_a_quiet_spell_is_still_interrupted() {
    let t = TestHost::new(no_quarantine());
    install(t.path(), "hostile", "hostile", Some(DENY_200MS));
    t.load().await;
    // Not a verdict: long enough that the ticker has parked, so the call below is the
    // first guest to start after it did.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let spinning = message("a", "room:x", "loop");
    let call = t.host.message_policy(&spinning);
    let d = tokio::time::timeout(Duration::from_secs(60), call).await.expect("the spinning call was never interrupted");
    assert!(rejected_for_failure(&d), "{d:?}");
    assert!(t.status("hostile").last_error.as_deref().unwrap_or_default().contains("deadline of 200 ms"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_calls_keep_flowing_while_a_plugin_spins() {
    let t = TestHost::new(no_quarantine());
    install(t.path(), "hostile", "hostile", Some(DENY_200MS));
    install(t.path(), "echo-v1", "echo", None);
    t.load().await;
    let host = t.host.clone();
    let spinning = tokio::spawn(async move { host.message_policy(&message("a", "room:x", "loop")).await });
    // Both plugins serve message-policy: these calls run echo, then hostile's "ok" path on
    // fresh instances while the pooled one spins.
    for _ in 0..50 {
        assert_eq!(t.host.message_policy(&message("a", "room:x", "ok")).await, MessageDecision::Allow);
    }
    assert!(rejected_for_failure(&spinning.await.unwrap_or(MessageDecision::Allow)));
    assert_eq!(t.status("echo").failures, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growing_memory_past_the_cap_traps_and_the_allow_policy_answers() {
    let t = TestHost::new(no_quarantine());
    install(t.path(), "hostile", "hostile", Some(&DENY_200MS.replace("\"deny\"", "\"allow\"")));
    t.load().await;
    assert_eq!(t.host.message_policy(&message("a", "room:x", "grow")).await, MessageDecision::Allow);
    let s = t.status("hostile");
    assert_eq!(s.failures, 1);
    assert!(s.last_error.as_deref().unwrap_or_default().contains("memory limit"), "{s:?}");
    assert_eq!(t.host.message_policy(&message("a", "room:x", "ok")).await, MessageDecision::Allow);
    assert_eq!(t.status("hostile").failures, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_fails_its_call_says_why_and_the_instance_is_replaced() {
    let t = TestHost::new(no_quarantine());
    install(t.path(), "hostile", "hostile", Some(DENY_200MS));
    t.load().await;
    assert_eq!(t.host.idle_instances("hostile"), 1, "the trial instance seeds the pool");
    let d = t.host.message_policy(&message("a", "room:x", "panic")).await;
    assert!(rejected_for_failure(&d), "{d:?}");
    assert_eq!(t.host.idle_instances("hostile"), 0, "a broken instance never returns to the pool");
    let s = t.status("hostile");
    assert!(s.last_error.as_deref().unwrap_or_default().contains("panics on purpose"), "{s:?}");
    assert_eq!(t.host.message_policy(&message("a", "room:x", "ok")).await, MessageDecision::Allow);
    assert_eq!(t.host.idle_instances("hostile"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tight_loop_of_host_calls_is_stopped_by_the_host_call_cap() {
    let t = TestHost::new(no_quarantine());
    install(t.path(), "hostile", "hostile", Some(DENY_200MS));
    t.load().await;
    let started = Instant::now();
    let d = t.host.message_policy(&message("a", "room:x", "spin-host")).await;
    assert!(rejected_for_failure(&d), "{d:?}");
    assert!(started.elapsed() < Duration::from_millis(400));
    let s = t.status("hostile");
    assert!(s.last_error.as_deref().unwrap_or_default().contains("host-call limit"), "{s:?}");
    assert_eq!(t.host.message_policy(&message("a", "room:x", "ok")).await, MessageDecision::Allow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_importing_what_the_host_lacks_is_refused_at_load_and_others_load() {
    let t = TestHost::new(no_quarantine());
    install(t.path(), "spy", "spy", None);
    install(t.path(), "echo-v1", "echo", None);
    t.load().await;
    let spy = t.status("spy");
    assert_eq!(spy.state, PluginState::Failed);
    let error = spy.last_load_error.unwrap_or_default();
    assert!(error.contains("imports `evil:spy/exfiltrate`") && error.contains("does not provide"), "{error}");
    assert_eq!(t.status("echo").state, PluginState::Active);
    assert_eq!(t.host.message_policy(&message("a", "room:x", "hi")).await, MessageDecision::Allow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_failing_n_times_in_the_window_is_quarantined_and_skipped() {
    let mut config = PluginHostConfig::default();
    config.quarantine.failures = 3;
    config.quarantine.duration_ms = 60_000;
    let t = TestHost::new(config);
    install(t.path(), "hostile", "hostile", Some(DENY_200MS));
    t.load().await;
    for _ in 0..3 {
        assert!(rejected_for_failure(&t.host.message_policy(&message("a", "room:x", "panic")).await));
    }
    let s = t.status("hostile");
    assert!(matches!(s.state, PluginState::Quarantined { .. }), "{s:?}");
    assert_eq!(s.quarantines, 1);
    // Quarantined: not called (calls stay at 3), its failure policy answers.
    assert!(rejected_for_failure(&t.host.message_policy(&message("a", "room:x", "ok")).await));
    assert_eq!(t.status("hostile").calls, 3);
}
