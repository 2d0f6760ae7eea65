//! The retry timers, seen through what a device is pushed: an unacked push comes again
//! after its ack timeout, attempt after attempt, until the attempts are used up; an acked
//! one never does; and a push stops waiting as soon as an ack covers it or its connection
//! closes, not at the end of its wait.

use std::time::Duration;

use herald_proto::v1::frame::Body;

use crate::config::DeliveryConfig;
use crate::testkit::poll::poll;
use crate::testkit::{Kit, Options, RecordingOutbox, WAIT, conversation_id, message};

/// Delivery with an ack timeout of `ack_timeout_ms` (no jitter, no growth) and three pushes.
fn kit_options(ack_timeout_ms: u64) -> Options {
    let delivery = DeliveryConfig {
        ack_timeout_ms,
        ack_timeout_max_ms: ack_timeout_ms,
        backoff_max_ms: ack_timeout_ms,
        jitter: 0.0,
        max_attempts: 3,
        ..DeliveryConfig::default()
    };
    Options { delivery, ..Options::default() }
}

/// The `attempt` of each `deliver` frame taken, in order.
fn attempts(outbox: &RecordingOutbox) -> Vec<u32> {
    outbox
        .frames()
        .into_iter()
        .filter_map(|frame| match frame.body {
            Some(Body::Deliver(deliver)) => Some(deliver.attempt),
            _ => None,
        })
        .collect()
}

/// Waits until `done` holds, looking every 2 ms (the retry timers here are tens of ms);
/// panics after [`WAIT`].
async fn wait_until(what: &str, done: impl Fn() -> bool) {
    poll().within(WAIT).every(Duration::from_millis(2)).until(what, async || done()).await;
}

#[tokio::test]
async fn an_unacked_push_comes_again_until_its_attempts_are_used_up() {
    let kit = Kit::with(kit_options(20)).await;
    let (_, bob) = kit.connect("bob", "phone").await;

    kit.delivery.fan_out(message("dm:alice:bob", 1, "alice", "phone")).await;

    wait_until("three pushes, then none pending", || attempts(&bob).len() >= 3 && kit.delivery.pending_retries() == 0)
        .await;
    assert_eq!(attempts(&bob), [1, 2, 3], "the first push and two retries, numbered");
    assert!(bob.delivered().iter().all(|message| message.seq == 1));
}

/// An ack timeout no test waits out: a push settled within [`WAIT`] was settled by its ack
/// or its connection's close, not by its timer.
const NEVER_DUE_MS: u64 = 600_000;

#[tokio::test]
async fn an_acked_push_is_settled_at_once_and_never_pushed_again() {
    let kit = Kit::with(kit_options(NEVER_DUE_MS)).await;
    let (bob_session, bob) = kit.connect("bob", "phone").await;

    kit.delivery.fan_out(message("dm:alice:bob", 1, "alice", "phone")).await;
    wait_until("the push waits for its ack", || kit.delivery.pending_retries() == 1).await;
    kit.delivery.ack(&bob_session, &conversation_id("dm:alice:bob"), 1).await;

    wait_until("its timer is taken out by the ack", || kit.delivery.pending_retries() == 0).await;
    assert_eq!(attempts(&bob), [1], "acked: pushed once");
}

#[tokio::test]
async fn an_ack_settles_the_pushes_it_covers_and_no_others() {
    let kit = Kit::with(kit_options(NEVER_DUE_MS)).await;
    let (bob_session, _bob) = kit.connect("bob", "phone").await;
    for seq in 1..=3 {
        kit.delivery.fan_out(message("dm:alice:bob", seq, "alice", "phone")).await;
    }
    kit.delivery.fan_out(message("dm:bob:carol", 1, "carol", "phone")).await;
    wait_until("four pushes wait", || kit.delivery.pending_retries() == 4).await;

    kit.delivery.ack(&bob_session, &conversation_id("dm:alice:bob"), 2).await;
    wait_until("seqs 1 and 2 settled", || kit.delivery.pending_retries() == 2).await;
    // An ack that moves nothing settles nothing.
    kit.delivery.ack(&bob_session, &conversation_id("dm:alice:bob"), 1).await;
    kit.delivery.ack(&bob_session, &conversation_id("dm:alice:bob"), 3).await;
    wait_until("seq 3 settled", || kit.delivery.pending_retries() == 1).await;
    assert_eq!(kit.delivery.pending_retries(), 1, "the other conversation's push still waits");
}

#[tokio::test]
async fn a_closed_connections_pushes_are_settled_at_once() {
    let kit = Kit::with(kit_options(NEVER_DUE_MS)).await;
    let (bob_session, _bob) = kit.connect("bob", "phone").await;
    let (_carol_session, _carol) = kit.connect("carol", "phone").await;
    kit.delivery.fan_out(message("dm:alice:bob", 1, "alice", "phone")).await;
    kit.delivery.fan_out(message("dm:alice:carol", 1, "alice", "phone")).await;
    wait_until("both pushes wait", || kit.delivery.pending_retries() == 2).await;

    kit.drop_within_grace(&bob_session).await;

    wait_until("bob's push is settled", || kit.delivery.pending_retries() == 1).await;
}
