//! The authorization table of the hardening issue, one test per row: a user never reads a
//! conversation they are not in — through `sync`, `history`, HTTP history or `subscribe` —
//! never sends into a group once removed, never moves another device's cursor, and never
//! learns another user's presence with their own token.
//!
//! Rows kept elsewhere: HTTP history of a dm (`http::http_history_is_for_members_only`), a
//! removed member's backfill and cursorless sync
//! (`groups::a_removed_member_is_not_backfilled_the_group_and_still_syncs`), and, in
//! cluster mode, a removal on one node holding on every other
//! (`cluster_nodes::a_member_removed_on_one_node_cannot_send_through_another`).

use herald_proto::v1::frame::Body;
use herald_proto::v1::{self, send_ack::Status};

use super::client::Client;
use super::server::{DEV_KEY, Herald};
use super::{dm, uuid};

/// A server where alice and bob share a dm and the group `inner`, each holding a secret;
/// and mallory, who is in neither.
struct Scene {
    herald: Herald,
    alice: Client,
    mallory: Client,
}

const SECRET: &str = "the launch code is 0000";

async fn scene() -> Scene {
    let herald = Herald::start().await;
    herald.create_group("inner", &["alice", "bob"]).await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    alice.send_ok(&dm("alice", "bob"), SECRET).await;
    alice.send_ok("grp:inner", SECRET).await;
    let mallory = Client::connect(&herald, "mallory", "phone").await;
    Scene { herald, alice, mallory }
}

/// Asserts nothing mallory was sent carries the secret.
fn saw_no_secret(mallory: &Client) {
    let leaked = mallory.kept().iter().any(|frame| format!("{frame:?}").contains("launch code"));
    assert!(!leaked, "mallory must never see the secret: {}", mallory.unclaimed());
}

/// Sends `request` and expects an `error` frame with `code` for it.
async fn refused(client: &mut Client, request: impl Into<Body>, code: &str, what: &str) {
    let rid = client.send_frame(request).await;
    match client.try_reply(rid, what, |_| None::<()>).await {
        Err(error) => assert_eq!(error.code, code, "{what}: {error:?}"),
        Ok(()) => unreachable!("the pick takes no reply"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_does_not_read_a_dm_or_group_the_user_is_not_in() {
    let Scene { mut mallory, herald: _running, .. } = scene().await;
    let cursor = |conversation: &str| v1::Cursor { conversation: conversation.to_owned(), seq: 0 };
    for conversation in [dm("alice", "bob"), "grp:inner".to_owned(), "grp:no-such-group".to_owned()] {
        let request = v1::Sync { cursors: vec![cursor(&conversation)], limit: 100 };
        refused(&mut mallory, request, "forbidden", &format!("sync of {conversation}")).await;
    }
    // One foreign cursor among her own fails the whole request: nothing is half-answered.
    let mixed = v1::Sync { cursors: vec![cursor(&dm("bob", "mallory")), cursor("grp:inner")], limit: 100 };
    refused(&mut mallory, mixed, "forbidden", "sync of her dm and a foreign group").await;
    let own = mallory.sync(&[], 100).await;
    assert!(own.conversations.is_empty(), "her cursorless sync lists nothing of theirs: {own:?}");
    saw_no_secret(&mallory);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_does_not_read_a_dm_or_group_the_user_is_not_in() {
    let Scene { mut mallory, herald: _running, .. } = scene().await;
    for conversation in [dm("alice", "bob"), "grp:inner".to_owned()] {
        let request = v1::History { conversation: conversation.clone(), before_seq: 0, limit: 100 };
        refused(&mut mallory, request, "forbidden", &format!("history of {conversation}")).await;
    }
    saw_no_secret(&mallory);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_history_does_not_read_a_group_the_user_is_not_in() {
    let Scene { herald, .. } = scene().await;
    let token = herald.dev_token("mallory").await;
    for path in ["/v1/conversations/grp:inner/messages", "/v1/conversations/grp:no-such-group/messages"] {
        let response = herald.get(path, Some(&token)).await;
        assert_eq!(response.status, 403, "GET {path} as mallory: {response:?}");
        assert_eq!(response.error_code(), "forbidden");
        assert!(!response.body.contains("launch code"), "{response:?}");
    }
    let member = herald.get("/v1/conversations/grp:inner/messages", Some(&herald.dev_token("bob").await)).await;
    assert_eq!(member.status, 200, "a member reads it: {member:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_does_not_open_a_dm_or_group() {
    let Scene { mut mallory, mut alice, herald: _running } = scene().await;
    for conversation in [dm("alice", "bob"), "grp:inner".to_owned()] {
        let request = v1::Subscribe { room: conversation.clone(), since_seq: Some(0) };
        refused(&mut mallory, request, "invalid", &format!("subscribe to {conversation}")).await;
    }
    // Nothing was opened: the next secret is not pushed to her either.
    alice.send_ok("grp:inner", "the launch code changed").await;
    let marker = alice.send_ok(&dm("alice", "mallory"), "marker").await;
    mallory.deliver_of(marker.message_id).await;
    saw_no_secret(&mallory);
}

/// Removal takes effect at once, also for a send the removed member made before it and
/// resends after (a `RETRY` the client holds on to): the resend is refused, not stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_member_cannot_send_into_the_group_not_even_a_send_queued_before() {
    let herald = Herald::with().set("INTAKE__SENDS_PER_CONNECTION", 1).set("INTAKE__CONNECTION_BURST", 1).start().await;
    herald.create_group("crew", &["alice", "carol"]).await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let mut carol = Client::connect(&herald, "carol", "phone").await;
    let first = carol.send_ok("grp:crew", "still here").await;
    alice.deliver_of(first.message_id).await;
    let queued = uuid();
    carol.send_with(&queued, "grp:crew", 1, b"sent before the removal").await;
    let ack = carol.ack_of(&queued).await;
    assert_eq!(ack.status(), Status::Retry, "over her budget: told to come back: {ack:?}");

    let removed = herald.request("DELETE", "/v1/groups/crew/members/carol", Some(DEV_KEY), None).await;
    assert_eq!(removed.status, 204, "{removed:?}");
    let mut resent = ack;
    for _ in 0..10 {
        tokio::time::sleep(std::time::Duration::from_millis(resent.retry_after_ms.into())).await;
        carol.send_with(&queued, "grp:crew", 1, b"sent before the removal").await;
        resent = carol.ack_of(&queued).await;
        if resent.status() != Status::Retry {
            break;
        }
    }
    assert_eq!(resent.status(), Status::Rejected, "the resend after her removal: {resent:?}");
    assert!(resent.reason.contains("not a member"), "{resent:?}");
    let history = alice.whole_history("grp:crew").await;
    assert_eq!(history.len(), 1, "only her first message is stored: {history:?}");
}

/// `deliver_ack` moves the acking device's own cursor: not another device's of the same
/// user, and nothing at all for a user outside the conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_ack_moves_only_the_acking_devices_own_cursor() {
    // No reconnect grace: the phone's return is backfilled from its stored cursor.
    let mut herald = Herald::with().set("GATEWAY__RECONNECT_GRACE_MS", 0).start().await;
    let conversation = dm("alice", "bob");
    let phone = Client::connect(&herald, "alice", "phone").await;
    phone.close().await;
    let mut tablet = Client::connect(&herald, "alice", "tablet").await;
    let mut mallory = Client::connect(&herald, "mallory", "phone").await;
    let mut bob = Client::connect(&herald, "bob", "laptop").await;
    let mut sent = Vec::new();
    for n in 0..3 {
        sent.push(bob.send_ok(&conversation, format!("message {n}")).await);
    }
    let newest = sent.last().expect("three sends").seq;
    tablet.deliver_of(sent[2].message_id).await;
    tablet.deliver_ack(&conversation, newest).await;
    mallory.deliver_ack(&conversation, newest).await;
    // A ping round trip orders each ack before what follows: taken in, not written yet.
    tablet.ping().await;
    mallory.ping().await;
    let sent_ids: Vec<u64> = sent.iter().map(|ack| ack.message_id).collect();
    let phone_lacks_all_three = async |herald: &Herald| {
        let mut phone = Client::connect(herald, "alice", "phone").await;
        let backfill = phone.distinct_deliveries(&conversation, 3).await;
        let ids: Vec<u64> = backfill.iter().map(|m| m.id).collect();
        phone.close().await;
        ids
    };
    assert_eq!(phone_lacks_all_three(&herald).await, sent_ids, "the phone lacks all three (acks taken in)");
    let hers = mallory.sync(&[], 100).await;
    assert!(hers.conversations.is_empty(), "her ack recorded no cursor of theirs: {hers:?}");
    saw_no_secret(&mallory);

    // And once the acks are written: a clean stop writes every cursor noted, so after the
    // restart only what storage holds counts.
    assert!(herald.terminate().await, "a clean stop\n{}", herald.log_tail());
    herald.restart().await;
    assert_eq!(phone_lacks_all_three(&herald).await, sent_ids, "the phone lacks all three (acks written)");
    let mut mallory = Client::connect(&herald, "mallory", "phone").await;
    let hers = mallory.sync(&[], 100).await;
    assert!(hers.conversations.is_empty(), "her ack wrote no cursor of theirs: {hers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_takes_an_api_key_not_a_users_token() {
    let herald = Herald::start().await;
    let _bob = Client::connect(&herald, "bob", "phone").await;
    let alice = herald.dev_token("alice").await;
    for token in [alice.as_str(), "dev:alice", "dev:bob"] {
        let response = herald.get("/v1/users/bob/presence", Some(token)).await;
        assert_eq!(response.status, 401, "presence with a user's token {token:?}: {response:?}");
        assert!(!response.body.contains("phone"), "{response:?}");
    }
    let response = herald.get("/v1/users/bob/presence", Some(DEV_KEY)).await;
    assert_eq!(response.json()["online"], true, "the api key may ask: {response:?}");
}
