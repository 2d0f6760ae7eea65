//! Each first-party plugin, loaded in the runtime, changes decisions as configured.

use crate::support::{TestHost, install_first_party, message};
use herald_plugin_runtime::{
    PluginHostConfig, PluginState,
    types::{Acceptance, AnnounceDecision, Announcement, CommandKind, Health, MessageDecision, RouteRequest, Tier},
};

fn announcement(room: &str, id: Option<&str>) -> Announcement {
    Announcement { room: room.into(), announcement_id: id.map(Into::into), sender: None, content: "hello".into() }
}

fn retry_after(d: &MessageDecision) -> Option<u64> {
    match d {
        MessageDecision::Reject(r) if r.code == "rate-limited" => r.retry_after_ms,
        _ => None,
    }
}

/// As shipped: each player one message per 400 ms in a room, no cap on the room as a whole,
/// announcements one per 100 ms per room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_rate_limit_paces_each_sender_in_a_room_and_announcements_per_room() {
    let t = TestHost::new(PluginHostConfig::default());
    install_first_party(t.path(), "room-rate-limit", "");
    let status = t.load().await;
    assert_eq!(status[0].state, PluginState::Active, "{status:?}");

    assert_eq!(t.host.message_policy(&message("alice", "room:lobby", "hi")).await, MessageDecision::Allow);
    t.clock.advance_ms(150);
    assert_eq!(t.host.message_policy(&message("bob", "room:lobby", "hi")).await, MessageDecision::Allow);
    let early = t.host.message_policy(&message("alice", "room:lobby", "hi")).await;
    assert_eq!(retry_after(&early), Some(250), "{early:?}");
    assert_eq!(t.host.message_policy(&message("alice", "room:other", "hi")).await, MessageDecision::Allow);
    assert_eq!(t.host.message_policy(&message("alice", "dm:alice:bob", "hi")).await, MessageDecision::Allow);
    t.clock.advance_ms(250);
    assert_eq!(t.host.message_policy(&message("alice", "room:lobby", "hi")).await, MessageDecision::Allow);

    let accept = AnnounceDecision::Accept(Acceptance { archive: true });
    assert_eq!(t.host.announce_policy(&announcement("room:news", None)).await, accept);
    t.clock.advance_ms(40);
    assert_eq!(t.host.announce_policy(&announcement("room:news", None)).await, AnnounceDecision::Defer(60));
    t.clock.advance_ms(60);
    assert_eq!(t.host.announce_policy(&announcement("room:news", None)).await, accept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announce_archive_archives_by_pattern_and_accepts_an_id_once() {
    // The host config overrides the manifest's [config] key by key.
    let mut config = PluginHostConfig::default();
    config.plugins.insert(
        "announce-archive".into(),
        toml::from_str(r#"config = { archive = ["room:news-*"] }"#).unwrap_or_default(),
    );
    let t = TestHost::new(config);
    install_first_party(t.path(), "announce-archive", "");
    t.load().await;
    let live = AnnounceDecision::Accept(Acceptance { archive: false });
    let archived = AnnounceDecision::Accept(Acceptance { archive: true });
    assert_eq!(t.host.announce_policy(&announcement("room:news-eu", Some("a1"))).await, archived);
    assert_eq!(t.host.announce_policy(&announcement("room:news-eu", Some("a1"))).await, AnnounceDecision::Duplicate);
    assert_eq!(t.host.announce_policy(&announcement("room:lobby", Some("a1"))).await, live);
    assert_eq!(t.host.announce_policy(&announcement("room:lobby", None)).await, live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_key_routes_a_shards_rooms_together_and_defers_the_rest_to_the_default() {
    let t = TestHost::new(PluginHostConfig::default());
    install_first_party(t.path(), "route-key", "");
    t.load().await;
    let req = |command, conversation: Option<&str>| RouteRequest {
        command,
        user: "alice".into(),
        conversation: conversation.map(Into::into),
    };
    assert_eq!(t.host.route_key(&req(CommandKind::Send, Some("room:s12-lobby"))).await, "shard:s12");
    assert_eq!(t.host.route_key(&req(CommandKind::Subscribe, Some("room:s12-trade"))).await, "shard:s12");
    assert_eq!(t.host.route_key(&req(CommandKind::Send, Some("room:lobby"))).await, "room:lobby");
    assert_eq!(t.host.route_key(&req(CommandKind::Sync, None)).await, "alice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn degrade_tiers_follows_the_configured_thresholds() {
    let t = TestHost::new(PluginHostConfig::default());
    install_first_party(t.path(), "degrade-tiers", "");
    t.load().await;
    let health = |cpu: f32, latency: u32| Health {
        connections: 10,
        send_queue_depth_p99: 0,
        send_queue_depth_max: 0,
        store_latency_p99_ms: latency,
        redelivery_ratio: 0.0,
        cpu_load: cpu,
        errors_per_second: 0.0,
    };
    assert_eq!(t.host.degrade(&health(0.2, 5)).await, Tier::Normal);
    assert_eq!(t.host.degrade(&health(0.5, 300)).await, Tier::NoBackfill);
    assert_eq!(t.host.degrade(&health(0.99, 5)).await, Tier::PullOnly);
    // hold_ms = 10 s in the shipped manifest: calm health does not step down at once...
    assert_eq!(t.host.degrade(&health(0.2, 5)).await, Tier::PullOnly);
    t.clock.advance_ms(10_000);
    // ...but does once the hold has passed.
    assert_eq!(t.host.degrade(&health(0.2, 5)).await, Tier::Normal);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_announcement_does_not_burn_its_id_when_pacing_runs_first() {
    let t = TestHost::new(PluginHostConfig::default());
    install_first_party(t.path(), "room-rate-limit", "");
    install_first_party(t.path(), "announce-archive", "");
    t.load().await;
    assert_eq!(
        t.host.chain(herald_plugin_runtime::Hook::AnnouncePolicy),
        vec!["room-rate-limit".to_owned(), "announce-archive".to_owned()]
    );
    let accept = AnnounceDecision::Accept(Acceptance { archive: true });
    assert_eq!(t.host.announce_policy(&announcement("room:a", Some("x"))).await, accept);
    assert!(matches!(t.host.announce_policy(&announcement("room:a", Some("y"))).await, AnnounceDecision::Defer(_)));
    t.clock.advance_ms(100);
    assert_eq!(t.host.announce_policy(&announcement("room:a", Some("y"))).await, accept);
    t.clock.advance_ms(100);
    assert_eq!(t.host.announce_policy(&announcement("room:a", Some("x"))).await, AnnounceDecision::Duplicate);
}
