//! The five health metrics (docs/decisions/0003) in `/metrics`, each driven by a scripted
//! scenario: one device acks everything, one never acks; then the send queues, slow-consumer
//! closes and messages stored as owner, driven by a device that never reads.
//! `deploy/prometheus/alerts.yml` computes the ratios and percentiles from exactly these
//! series.

use std::time::Duration;

use super::client::Client;
use super::server::Herald;
use super::slow_consumer::{SLOW_DEVICE, expect_slow_consumer_closed, let_go, send_batch};
use super::{WAIT, dm, metric};
use crate::support::poll::poll;

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
    let text = poll()
        .within(WAIT)
        .every(Duration::from_millis(100))
        .until("the deliveries to settle", async || {
            let text = herald.get("/metrics", None).await.body;
            let settled =
                |outcome: &str| metric(&text, &format!("herald_delivery_settled_total{{outcome=\"{outcome}\"}}"));
            if settled("acked") >= 5.0 && settled("given_up") >= 5.0 && text.contains("herald_send_backlog ") {
                Ok(text)
            } else {
                Err(text)
            }
        })
        .await;
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

/// Whether `name` is a series of its own in the Prometheus text (at any value, 0 too).
fn exported(text: &str, name: &str) -> bool {
    text.lines().any(|line| line.split_whitespace().next() == Some(name))
}

/// `/metrics` once `ready` holds of it; fails after [`WAIT`] with `what` and the text.
async fn metrics_once(herald: &Herald, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let exported = poll().within(WAIT).every(Duration::from_millis(20)).try_until(what, async || {
        let text = herald.get("/metrics", None).await.body;
        if ready(&text) { Ok(text) } else { Err(text) }
    });
    exported.await.unwrap_or_else(|timed_out| panic!("{timed_out}\n{}", herald.log_tail()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn send_queue_depth_slow_consumer_closes_and_owned_load_are_exported() {
    const LIMIT: u32 = 256;
    let herald =
        Herald::with().set("GATEWAY__SEND_QUEUE", LIMIT).set("DELIVERY__DEGRADE_INTERVAL_MS", 20).start().await;
    // From here on `slow` never reads: its socket buffers fill, then its send queue.
    let mut slow = Client::connect(&herald, "slow", SLOW_DEVICE).await;
    let mut flood = Client::connect(&herald, "flood", "laptop").await;

    // Before any message or close, every series the alerts read is there at its idle value:
    // the counters from the start (a node without them would drop out of the alerts), the
    // depths from a health sample taken once the connects' own frames are written.
    let text = metrics_once(&herald, "no health sample found the queues empty", |text| {
        exported(text, "herald_gateway_send_queue_max_frames")
            && metric(text, "herald_gateway_send_queue_max_frames") == 0.0
    })
    .await;
    for counter in ["herald_gateway_slow_consumers_total", "herald_pipeline_messages_stored_total"] {
        assert!(exported(&text, counter), "{counter} is exported before its first event:\n{text}");
        assert_eq!(metric(&text, counter), 0.0, "{counter}");
    }
    assert_eq!(metric(&text, "herald_gateway_send_queue_limit_frames"), f64::from(LIMIT), "gateway.send_queue");
    assert_eq!(metric(&text, "herald_gateway_send_queue_p99_frames"), 0.0, "{text}");

    // Flood the slow one with 64 KiB messages until a health sample finds its queue
    // growing. Each batch is followed by a look at /metrics for a few sample intervals;
    // after its socket buffers are full, the queue takes 256 / 8 = 32 batches to overflow,
    // so a sample late by far more than that still finds it between 1 and the limit.
    let conversation = dm("flood", "slow");
    let body = vec![b'x'; 64 * 1024];
    let mut sent = 0;
    let (deepest, p99, text) = 'flood: loop {
        assert!(sent < 2000, "after {sent} messages of 64 KiB no sample saw a queue\n{}", herald.log_tail());
        sent += send_batch(&mut flood, &conversation, &body).await.len();
        for _look in 0..5 {
            let text = herald.get("/metrics", None).await.body;
            let deepest = metric(&text, "herald_gateway_send_queue_max_frames");
            if deepest > 0.0 {
                break 'flood (deepest, metric(&text, "herald_gateway_send_queue_p99_frames"), text);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    assert!(deepest <= f64::from(LIMIT), "a queue never holds more than its limit: {deepest}\n{text}");
    assert!(p99 <= deepest, "the p99 ({p99}) is at most the deepest ({deepest})");
    assert_eq!(metric(&text, "herald_gateway_slow_consumers_total"), 0.0, "not closed yet:\n{text}");

    // On until it overflows and is closed with 4008: one slow-consumer close, and once it
    // is gone the deepest queue is the flooder's, which reads everything.
    while sent < 2000 && !let_go(&herald).await {
        sent += send_batch(&mut flood, &conversation, &body).await.len();
    }
    expect_slow_consumer_closed(&mut slow, &format!("after {sent} messages of 64 KiB the slow consumer")).await;
    let text = metrics_once(&herald, "the closed queue stayed in the depths", |text| {
        metric(text, "herald_gateway_slow_consumers_total") >= 1.0
            && metric(text, "herald_gateway_send_queue_max_frames") == 0.0
    })
    .await;
    assert_eq!(metric(&text, "herald_gateway_slow_consumers_total"), 1.0, "one connection overflowed:\n{text}");
    assert_eq!(metric(&text, "herald_gateway_send_queue_p99_frames"), 0.0);
    // The load-share alert's series: every message this node stored as its conversation's
    // owner, one per OK ack.
    assert_eq!(metric(&text, "herald_pipeline_messages_stored_total"), sent as f64, "{text}");
}
