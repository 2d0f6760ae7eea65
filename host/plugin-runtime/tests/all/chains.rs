//! Several plugins per hook: configured order, first rejection wins, rewrites feed the next
//! plugin; connect decisions and user-id overrides.

use crate::support::{TestHost, install, message, no_quarantine};
use herald_plugin_runtime::{
    Hook, PluginHostConfig,
    types::{ConnectDecision, ConnectRequest, MessageDecision},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewrite_feeds_the_next_plugin_and_the_first_rejection_wins() {
    let t = TestHost::new(no_quarantine());
    install(t.path(), "gate", "gate-b", Some("order = 2"));
    install(t.path(), "gate", "gate-a", Some("order = 1"));
    install(t.path(), "echo-v1", "echo", Some("order = 3"));
    t.load().await;
    assert_eq!(t.host.chain(Hook::MessagePolicy), ["gate-a", "gate-b", "echo"]);
    assert_eq!(
        t.host.message_policy(&message("a", "room:x", "hi")).await,
        MessageDecision::Rewrite(b"hi+gate+gate".to_vec())
    );
    let secret = t.host.message_policy(&message("a", "room:x", "my secret")).await;
    assert!(matches!(&secret, MessageDecision::Reject(r) if r.code == "secret"), "{secret:?}");
    assert_eq!(t.status("gate-b").calls, 1, "gate-b never saw the rejected message");
    assert_eq!(t.status("echo").calls, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_config_reorders_and_disables_plugins() {
    let mut config = no_quarantine();
    config.plugins.insert("gate-a".into(), toml::from_str("order = 9").unwrap_or_default());
    config.plugins.insert("echo".into(), toml::from_str("enabled = false").unwrap_or_default());
    let t = TestHost::new(config);
    install(t.path(), "gate", "gate-a", Some("order = 1"));
    install(t.path(), "gate", "gate-b", Some("order = 2"));
    install(t.path(), "echo-v1", "echo", None);
    t.load().await;
    assert_eq!(t.host.chain(Hook::MessagePolicy), ["gate-b", "gate-a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_denies_and_overrides_user_ids() {
    let t = TestHost::new(PluginHostConfig::default());
    install(t.path(), "gate", "gate", None);
    t.load().await;
    let req = |user: &str| ConnectRequest { user: user.into(), device: "d".into(), claims: vec![] };
    assert_eq!(t.host.connect(&req("bob")).await, ConnectDecision::Allow(None));
    assert_eq!(t.host.connect(&req("alias")).await, ConnectDecision::Allow(Some("alice".into())));
    assert_eq!(t.host.connect(&req("mallory")).await, ConnectDecision::Deny("mallory is banned".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_plugins_every_hook_gives_the_built_in_default() {
    let t = TestHost::new(PluginHostConfig::default());
    t.load().await;
    assert_eq!(t.host.message_policy(&message("a", "room:x", "hi")).await, MessageDecision::Allow);
    assert_eq!(
        t.host.connect(&ConnectRequest { user: "u".into(), device: "d".into(), claims: vec![] }).await,
        ConnectDecision::Allow(None)
    );
}
