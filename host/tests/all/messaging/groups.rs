//! Groups managed over HTTP; a group message reaches every member's devices, online now or
//! later, and membership changes take effect.

use herald_proto::v1::frame::Body;

use super::client::Client;
use super::server::{DEV_KEY, Herald};

const GROUP: &str = "grp:team";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_message_reaches_every_member_and_membership_changes_apply() {
    let herald = Herald::start().await;
    // erin is a member who is offline for now (her device has been seen before).
    Client::connect(&herald, "erin", "phone").await.close().await;
    herald.create_group("team", &["alice", "bob", "carol", "erin"]).await;

    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let mut bob_phone = Client::connect(&herald, "bob", "phone").await;
    let mut bob_tablet = Client::connect(&herald, "bob", "tablet").await;
    let mut carol = Client::connect(&herald, "carol", "phone").await;
    let mut dave = Client::connect(&herald, "dave", "phone").await;

    let hello = alice.send_ok(GROUP, "hi team").await;
    assert_eq!(hello.conversation, GROUP);
    for member in [&mut bob_phone, &mut bob_tablet, &mut carol] {
        let message = member.deliver_of(hello.message_id).await.message.expect("message");
        assert_eq!((message.conversation.as_str(), message.seq, message.sender.as_str()), (GROUP, hello.seq, "alice"));
        assert_eq!(message.body.as_ref(), b"hi team");
        member.deliver_ack(GROUP, message.seq).await;
    }
    dave.send_rejected(GROUP, "can I join?").await;

    // Add dave.
    let added = herald.request("PUT", "/v1/groups/team/members/dave", Some(DEV_KEY), None).await;
    assert!(added.is_success(), "PUT member: {added:?}");
    let from_dave = dave.send_ok(GROUP, "thanks for having me").await;
    for member in [&mut alice, &mut bob_phone, &mut carol] {
        member.deliver_of(from_dave.message_id).await;
    }

    // Remove carol.
    let removed = herald.request("DELETE", "/v1/groups/team/members/carol", Some(DEV_KEY), None).await;
    assert!(removed.is_success(), "DELETE member: {removed:?}");
    carol.send_rejected(GROUP, "am I still in?").await;
    let after = alice.send_ok(GROUP, "carol has left").await;
    dave.deliver_of(after.message_id).await;
    bob_phone.deliver_of(after.message_id).await;
    let marker = alice.send_ok(&super::dm("alice", "carol"), "marker").await;
    carol.deliver_of(marker.message_id).await;
    assert!(
        !carol.kept().iter().any(|f| matches!(&f.body, Some(Body::Deliver(d)) if d.message.as_ref().is_some_and(|m| m.id == after.message_id))),
        "carol is no longer a member: {}",
        carol.unclaimed()
    );

    // erin comes online and gets the group's messages, in order.
    let mut erin = Client::connect(&herald, "erin", "phone").await;
    let backfill = erin.distinct_deliveries(GROUP, 3).await;
    let ids: Vec<u64> = backfill.iter().map(|m| m.id).collect();
    assert_eq!(ids, vec![hello.message_id, from_dave.message_id, after.message_id], "erin's backfill");
}

/// A cursor outlives a removal from the group: the removed member's device must not be
/// backfilled the group's new messages, and its cursorless `sync` must still answer (for
/// the conversations it may read), not fail as forbidden.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_member_is_not_backfilled_the_group_and_still_syncs() {
    // No reconnect grace: carol's return takes the full backfill, from her cursors.
    let herald = Herald::with().set("GATEWAY__RECONNECT_GRACE_MS", 0).start().await;
    herald.create_group("crew", &["alice", "carol"]).await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let mut carol = Client::connect(&herald, "carol", "phone").await;
    let before = alice.send_ok("grp:crew", "before").await;
    let seen = carol.deliver_of(before.message_id).await.message.expect("message");
    carol.deliver_ack("grp:crew", seen.seq).await;
    let dm = super::dm("alice", "carol");
    let hello = alice.send_ok(&dm, "hello carol").await;
    carol.deliver_of(hello.message_id).await;
    carol.close().await;

    let removed = herald.request("DELETE", "/v1/groups/crew/members/carol", Some(DEV_KEY), None).await;
    assert!(removed.is_success(), "DELETE member: {removed:?}");
    let secret = alice.send_ok("grp:crew", "after carol left").await;

    let mut carol = Client::connect(&herald, "carol", "phone").await;
    let reply = carol.sync(&[], 100).await;
    let names: Vec<&str> = reply.conversations.iter().map(|c| c.conversation.as_str()).collect();
    assert!(names.contains(&dm.as_str()), "her dm is still hers: {names:?}");
    assert!(!names.contains(&"grp:crew"), "the group she left is not in her sync: {names:?}");
    // What must not happen: the backfill pushing the group's new message. Backfill of a
    // handful of messages takes milliseconds; the window is generous.
    let marker = alice.send_ok(&dm, "marker").await;
    carol.deliver_of(marker.message_id).await;
    let leaked = carol
        .try_wait_for(std::time::Duration::from_millis(500), |frame| match &frame.body {
            Some(Body::Deliver(d)) if d.message.as_ref().is_some_and(|m| m.id == secret.message_id) => Some(()),
            _ => None,
        })
        .await;
    assert!(leaked.is_err(), "carol left the group; its new message must not reach her: {}", carol.unclaimed());
}
