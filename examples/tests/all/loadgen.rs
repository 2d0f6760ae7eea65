//! The load generator against the in-process relay.

use std::time::Duration;

use herald_examples::{
    loadgen::{self, LoadConfig, RoomLoad, report_dir},
    relay::{Relay, RelayConfig},
};
use herald_proto::Encoding;

fn short_run(url: String) -> LoadConfig {
    LoadConfig {
        label: "relay".to_owned(),
        urls: vec![url],
        users: 20,
        duration: Duration::from_secs(2),
        warmup: Duration::from_millis(200),
        verify: true,
        ..LoadConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadgen_delivers_and_acks_every_message_through_the_relay() {
    let relay = Relay::spawn_local(RelayConfig::default()).await.expect("relay binds");
    let config = LoadConfig { timeline: true, ..short_run(relay.url()) };
    let report = loadgen::run(config).await.expect("run completes");
    let counts = report.counts;
    assert_eq!(counts.connected, 20);
    assert!(counts.delivered > 100, "{}", report.to_text());
    assert_eq!(counts.errors, 0, "{}", report.to_text());
    assert!(report.drained, "{}", report.to_text());
    assert_eq!(counts.ack_ok, counts.sent, "every send acknowledged OK");
    assert_eq!(counts.delivered, counts.sent, "every send delivered");
    assert_eq!(counts.deliver_acks, counts.delivered, "every deliver acknowledged");
    assert_eq!(counts.corrupt, 0, "bodies and ids intact");
    let verification = report.verification.expect("verified");
    assert!(verification.is_exact(), "{verification:?}");
    assert!(report.latency.count > 0 && report.latency.p50_us > 0);
    assert_eq!((report.endpoints, report.cross_endpoint_pairs), (1, 0));
    assert_eq!(report.same_endpoint_latency.count, report.latency.count);
    assert!(!report.to_text().contains("endpoints:"), "one URL prints what it always did");
    let json = report.to_json();
    assert!(json["delivered_per_s"].as_f64().is_some_and(|rate| rate > 0.0));

    // Second by second, the same sends and deliveries, each delivery with its latency.
    let seconds = &report.timeline.as_ref().expect("timeline kept").seconds;
    assert!((2..=5).contains(&seconds.len()), "0.2 s warm-up + 2 s window + drain: {}", seconds.len());
    assert_eq!(seconds.iter().map(|second| second.sent).sum::<u64>(), counts.sent);
    assert_eq!(seconds.iter().map(|second| second.delivered).sum::<u64>(), counts.delivered);
    assert_eq!(seconds.iter().map(|second| second.latency.count).sum::<u64>(), counts.delivered);
    assert!(seconds[1].latency.p50_us > 0 && seconds[1].latency.max_us >= seconds[1].latency.p99_us);

    let temp = tempfile::tempdir().expect("temp dir");
    report_dir::write(temp.path(), &report, None).expect("report written");
    for file in [report_dir::THROUGHPUT_SVG, report_dir::LATENCY_SVG, report_dir::SUMMARY_JSON, report_dir::INDEX_HTML]
    {
        assert!(temp.path().join(file).is_file(), "{file}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadgen_holds_a_fixed_rate_over_json() {
    let relay = Relay::spawn_local(RelayConfig::default()).await.expect("relay binds");
    let config = LoadConfig { rate: 500, encoding: Encoding::Json, ..short_run(relay.url()) };
    let report = loadgen::run(config).await.expect("run completes");
    assert!(report.timeline.is_none(), "no per-second series unless asked for");
    // 500 msg/s for a 2 s window: about 1000 sends in the window.
    let window_sent = report.counts.window_sent;
    assert!((900..=1100).contains(&window_sent), "{}", report.to_text());
    assert_eq!(report.counts.errors, 0, "{}", report.to_text());
    assert!(report.verification.expect("verified").is_exact());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadgen_spreads_users_over_several_urls_and_splits_latency_by_pair() {
    // The same relay under two URLs: every pair is delivered, and the run still counts
    // which pairs joined users on different URLs.
    let relay = Relay::spawn_local(RelayConfig::default()).await.expect("relay binds");
    let url = relay.url();
    let other = url.replace("127.0.0.1", "localhost");
    // 12 users on each URL: 3 same-endpoint pairs on each, 6 pairs across.
    let config =
        LoadConfig { urls: vec![url, other], users: 24, cross_node_share: Some(0.5), ..short_run(String::new()) };
    let report = loadgen::run(config).await.expect("run completes");
    let text = report.to_text();
    assert_eq!(report.counts.errors, 0, "{text}");
    assert!(report.verification.expect("verified").is_exact(), "{text}");
    assert_eq!((report.endpoints, report.pairs, report.cross_endpoint_pairs), (2, 12, 6), "{text}");
    let (same, cross) = (report.same_endpoint_latency.count, report.cross_endpoint_latency.count);
    assert!(same > 0 && cross > 0, "{text}");
    assert_eq!(same + cross, report.latency.count, "{text}");
    assert!(text.contains("pairs: 12, cross-endpoint 6 (50.0%), same-endpoint 6"), "{text}");
    assert_eq!(text.matches("send->deliver latency:").count(), 1, "one overall line for scripts: {text}");
    assert_eq!(report.to_json()["cross_endpoint_pairs"], 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadgen_reports_when_nobody_can_connect() {
    // Bind then drop a listener: the port is very likely closed now.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port();
    let config = LoadConfig {
        users: 2,
        connect_timeout: Duration::from_secs(2),
        ..short_run(format!("ws://127.0.0.1:{port}/v1/ws"))
    };
    let error = loadgen::run(config).await.expect_err("nobody connects");
    assert!(error.to_string().contains("no user could connect"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_mode_times_every_delivery_and_misses_none_through_the_relay_broadcast() {
    let relay = Relay::spawn_local(RelayConfig::default()).await.expect("relay binds");
    // 40 subscribers over 3 rooms (14, 13, 13); 4 publishers, so room 0 has two, which
    // hear each other without that counting as a delivery.
    let rooms = RoomLoad { rooms: 3, subscribers: 40, publishers: 4 };
    let config = LoadConfig {
        rooms: Some(rooms),
        duration: Duration::from_secs(1),
        timeline: true,
        verify: false,
        ..short_run(relay.url())
    };
    let report = loadgen::run(config).await.expect("run completes");
    let text = report.to_text();
    let figures = report.rooms.clone().expect("room figures");
    assert_eq!((figures.subscribers_connected, figures.publishers_connected), (40, 4), "{text}");
    assert_eq!(report.counts.errors, 0, "{text}");
    assert!(report.drained, "{text}");
    assert!(report.counts.delivered > 1000, "{text}");
    assert_eq!(report.counts.ack_ok, report.counts.sent, "{text}");
    assert!(figures.expected > 0 && figures.expected == figures.received, "{text}");
    assert_eq!(figures.missing, 0, "{text}");
    assert_eq!(report.counts.duplicates, 0, "{text}");
    assert_eq!(report.counts.deliver_acks, 0, "room messages are not acknowledged");
    assert!(figures.publisher_received > 0, "room 0's publishers hear each other: {text}");
    assert!(report.latency.count > 0 && report.latency.p50_us > 0, "{text}");
    assert!(text.contains("deliveries: expected") && text.contains("send->deliver latency:"), "{text}");
    let json = report.to_json();
    assert_eq!(json["rooms"]["missing_deliveries"], 0);
    assert!(json["delivered_per_s"].as_f64().is_some_and(|rate| rate > json["sent_per_s"].as_f64().unwrap_or(0.0)));
    let seconds = &report.timeline.as_ref().expect("timeline kept").seconds;
    assert_eq!(seconds.iter().map(|second| second.delivered).sum::<u64>(), report.counts.delivered);
    let temp = tempfile::tempdir().expect("temp dir");
    report_dir::write(temp.path(), &report, None).expect("report written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_mode_refuses_a_room_without_subscribers_or_publishers() {
    for rooms in [RoomLoad::new(5, 4), RoomLoad { rooms: 2, subscribers: 10, publishers: 1 }] {
        let config = LoadConfig { rooms: Some(rooms), ..short_run("ws://127.0.0.1:1/v1/ws".to_owned()) };
        let error = loadgen::run(config).await.expect_err("refused before connecting");
        assert!(error.to_string().contains("needs a"), "{error}");
    }
}
