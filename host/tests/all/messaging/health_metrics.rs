//! The five health metrics of seed 001 §4.4 in `/metrics`, each driven by a scripted
//! scenario: one device acks everything, one never acks. `deploy/prometheus/alerts.yml`
//! computes the ratios and percentiles from exactly these series.

use std::time::Duration;

use tokio::time::Instant;

use super::client::Client;
use super::server::Herald;
use super::{WAIT, dm, metric};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_five_health_metrics_follow_what_devices_do() {
    let herald = Herald::with()
        .set("DELIVERY__ACK_TIMEOUT_MS", 300)
        .set("DELIVERY__BACKOFF_MAX_MS", 600)
        .set("DELIVERY__MAX_ATTEMPTS", 3)
        .set("DELIVERY__JITTER", 0)
        .start()
        .await;
    let mut alice = Client::connect(&herald, "alice", "phone").await;
    let mut bob = Client::connect(&herald, "bob", "phone").await; // acks every message
    let mut carol = Client::connect(&herald, "carol", "phone").await; // never acks
    let (to_bob, to_carol) = (dm("alice", "bob"), dm("alice", "carol"));
    for n in 0..5 {
        let sent = alice.send_ok(&to_bob, format!("to bob {n}")).await;
        let message = bob.deliver_of(sent.message_id).await.message.expect("message");
        bob.deliver_ack(&to_bob, message.seq).await;
        let sent = alice.send_ok(&to_carol, format!("to carol {n}")).await;
        carol.deliver_of(sent.message_id).await;
    }

    // Each first push settles once: bob's 5 acked, carol's 5 given up after 3 pushes each.
    let deadline = Instant::now() + WAIT;
    let text = loop {
        let text = herald.get("/metrics", None).await.body;
        let settled = |outcome: &str| metric(&text, &format!("herald_delivery_settled_total{{outcome=\"{outcome}\"}}"));
        if settled("acked") >= 5.0 && settled("given_up") >= 5.0 && text.contains("herald_send_backlog ") {
            break text;
        }
        assert!(Instant::now() < deadline, "the deliveries did not settle:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let value = |name: &str| metric(&text, name);

    // 1. Delivery success rate: acked over all settled first pushes.
    let acked = value("herald_delivery_settled_total{outcome=\"acked\"}");
    let given_up = value("herald_delivery_settled_total{outcome=\"given_up\"}");
    assert_eq!((acked, given_up), (5.0, 5.0), "bob acked all, carol none:\n{text}");
    assert_eq!(value("herald_delivery_pushes_total"), 10.0, "ten first pushes");
    // 2. Retry ratio: carol's messages were each pushed twice more (bob's maybe, on a slow box).
    let redeliveries = value("herald_delivery_redeliveries_total");
    assert!(redeliveries >= 10.0, "carol's unacked messages are retried: {redeliveries}");
    // 3. send→ack latency: one sample per send, in buckets.
    assert_eq!(value("herald_send_ack_seconds_count"), 10.0, "{text}");
    assert_eq!(value("herald_send_ack_seconds_bucket{le=\"+Inf\"}"), 10.0, "{text}");
    assert!(value("herald_send_ack_seconds_sum") > 0.0);
    // 3b. send→deliver-ack latency: one sample per ack covering the newest live push (bob's
    // 5; one fewer when bob's first message raced his connect and came by his backfill,
    // whose messages may be old and are not sampled).
    let samples = value("herald_deliver_ack_seconds_count");
    assert!((4.0..=5.0).contains(&samples), "{samples} samples:\n{text}");
    let within_a_second = value("herald_deliver_ack_seconds_bucket{le=\"1\"}");
    assert_eq!(within_a_second, samples, "bob acked at once:\n{text}");
    // 4. Backlog: nothing in flight once every send is done.
    assert_eq!(value("herald_send_backlog"), 0.0);
    // 5. Connection survival is active over peak: the active count is exported.
    assert_eq!(value("herald_gateway_connections"), 3.0);
}
