//! Reconnect grace (ARCHITECTURE.md §3): a device back soon after its connection dropped
//! resumes where it was — it gets what it had not acked and what was sent meanwhile, and its
//! backfill reads only those conversations instead of every conversation of the user.

use std::time::Duration;

use herald_proto::v1;

use super::client::Client;
use super::dm;
use super::server::{DEV_KEY, Herald};
use crate::support::poll;

/// Waits until the server has let `user`'s `device` go (it is gone from presence).
async fn wait_until_offline(herald: &Herald, user: &str, device: &str) {
    poll::until(&format!("{user}/{device} to go offline"), async || {
        let presence = herald.get(&format!("/v1/users/{user}/presence"), Some(DEV_KEY)).await;
        if presence.status == 200 && !presence.body.contains(device) { Ok(()) } else { Err(format!("{presence:?}")) }
    })
    .await;
}

/// The bodies of the next `count` distinct messages pushed in `conversation`, by seq.
async fn bodies(client: &mut Client, conversation: &str, count: usize) -> Vec<String> {
    let messages = client.distinct_deliveries(conversation, count).await;
    messages.iter().map(|message| String::from_utf8_lossy(&message.body).into_owned()).collect()
}

/// Bob is in three conversations, all read. Then one message is pushed and not acked, his
/// connection drops, and two conversations get messages while he is away.
async fn bob_drops_with_messages_owed(herald: &Herald) -> (Client, Client) {
    let mut alice = Client::connect(herald, "alice", "laptop").await;
    let mut carol = Client::connect(herald, "carol", "laptop").await;
    let mut bob = Client::connect(herald, "bob", "phone").await;
    for (sender, conversation) in [(&mut alice, dm("alice", "bob")), (&mut carol, dm("bob", "carol"))] {
        let ack = sender.send_ok(&conversation, "read already").await;
        bob.deliver_of(ack.message_id).await;
        bob.deliver_ack(&conversation, ack.seq).await;
    }
    let quiet = Client::connect(herald, "dave", "laptop").await.send_ok(&dm("bob", "dave"), "read already").await;
    bob.deliver_of(quiet.message_id).await;
    bob.deliver_ack(&dm("bob", "dave"), quiet.seq).await;

    let unacked = alice.send_ok(&dm("alice", "bob"), "pushed, not acked").await;
    bob.deliver_of(unacked.message_id).await;
    // The acks above reach the server before the drop: a ping answered after them.
    bob.ping().await;
    poll::until("bob's backfill to end", async || herald.backfills_over().await).await;
    drop(bob);
    wait_until_offline(herald, "bob", "phone").await;

    alice.send_ok(&dm("alice", "bob"), "while away 1").await;
    alice.send_ok(&dm("alice", "bob"), "while away 2").await;
    carol.send_ok(&dm("bob", "carol"), "while away 3").await;
    (alice, carol)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_back_within_the_grace_period_gets_what_it_lacks_from_a_resumed_backfill() {
    let herald = Herald::with().set("GATEWAY__RECONNECT_GRACE_MS", 60_000).start().await;
    let (_alice, _carol) = bob_drops_with_messages_owed(&herald).await;
    let full_before = herald.metric(r#"herald_delivery_backfills_total{path="full"}"#).await;

    let mut bob = Client::connect(&herald, "bob", "phone").await;
    assert_eq!(
        bodies(&mut bob, &dm("alice", "bob"), 3).await,
        ["pushed, not acked", "while away 1", "while away 2"],
        "the unacked message and the ones sent while away, in order"
    );
    assert_eq!(bodies(&mut bob, &dm("bob", "carol"), 1).await, ["while away 3"]);
    bob.assert_quiet(Duration::from_millis(300), "nothing already acked is pushed again", |frame| {
        matches!(&frame.body, Some(v1::frame::Body::Deliver(deliver))
            if deliver.message.as_ref().is_some_and(|message| message.body.as_ref() == b"read already"))
    })
    .await;

    assert_eq!(herald.metric(r#"herald_gateway_reconnects_total{resumed="yes"}"#).await, 1.0);
    assert_eq!(herald.metric(r#"herald_delivery_backfills_total{path="resumed"}"#).await, 1.0);
    assert_eq!(
        herald.metric(r#"herald_delivery_backfills_total{path="full"}"#).await,
        full_before,
        "the reconnect read only the owed conversations"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_grace_period_a_device_gets_a_full_backfill_and_still_everything() {
    let herald = Herald::with().set("GATEWAY__RECONNECT_GRACE_MS", 200).start().await;
    let (_alice, _carol) = bob_drops_with_messages_owed(&herald).await;
    // The grace is over once the server has let the parked session go, not once 200 ms have
    // passed here. Both gauges are set together, from the live counts: only alice's and
    // carol's connections open means bob's drop has been counted, and no session parked
    // then means his (and dave's) expired.
    poll::until("the parked sessions to expire", async || {
        let (open, parked) =
            (herald.metric("herald_gateway_connections").await, herald.metric("herald_gateway_parked").await);
        if (open, parked) == (2.0, 0.0) { Ok(()) } else { Err(format!("{open} connections, {parked} parked")) }
    })
    .await;
    let full_before = herald.metric(r#"herald_delivery_backfills_total{path="full"}"#).await;

    let mut bob = Client::connect(&herald, "bob", "phone").await;
    assert_eq!(bodies(&mut bob, &dm("alice", "bob"), 3).await, ["pushed, not acked", "while away 1", "while away 2"]);
    assert_eq!(bodies(&mut bob, &dm("bob", "carol"), 1).await, ["while away 3"]);
    assert_eq!(herald.metric(r#"herald_delivery_backfills_total{path="full"}"#).await, full_before + 1.0);
    assert_eq!(herald.metric(r#"herald_delivery_backfills_total{path="resumed"}"#).await, 0.0);
}
