//! The `deliver-filter` hook (contract 0.2.0): a recipient the plugin drops never gets the
//! message — not pushed live, not backfilled on reconnect, not in `sync`, `history` or a
//! room's catch-up — while everyone else gets it, and the message stays stored.
//!
//! The plugin is the runtime's test guest `block-list` (`host/plugin-runtime/tests/guests`,
//! built by scripts/test.sh into `target/plugin-guests`), configured so that bob has
//! blocked alice.

use super::client::Client;
use super::hostile::guest;
use super::rooms::kept_deliver_of;
use super::server::Herald;

const GROUP: &str = "grp:team";
const ROOM: &str = "room:lobby";

async fn herald_where_bob_blocked_alice() -> (Herald, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("plugins dir");
    std::fs::copy(guest("block_list"), dir.path().join("block-list.wasm")).expect("copy block-list");
    std::fs::write(dir.path().join("block-list.toml"), "[config.blocks]\nbob = [\"alice\"]\n").expect("manifest");
    let herald = Herald::with().set("PLUGINS", dir.path().display()).start().await;
    (herald, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_recipient_never_gets_a_group_message_by_any_path_while_the_others_do() {
    let (herald, _plugins) = herald_where_bob_blocked_alice().await;
    herald.create_group("team", &["alice", "bob", "carol"]).await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let mut carol = Client::connect(&herald, "carol", "phone").await;

    // Live push: carol gets alice's message; bob gets carol's, which came after it, and
    // never alice's (a group's pushes reach a device in seq order).
    let blocked = alice.send_ok(GROUP, "from alice").await;
    let fine = carol.send_ok(GROUP, "from carol").await;
    assert_eq!(carol.deliver_of(blocked.message_id).await.message.map(|m| m.sender).as_deref(), Some("alice"));
    let got = bob.deliver_in(GROUP).await.message.expect("a message");
    assert_eq!((got.id, got.sender.as_str()), (fine.message_id, "carol"), "bob's first push is carol's");
    assert!(!kept_deliver_of(&bob, blocked.message_id));
    // Alice's own other devices are never filtered.
    let mut alice_phone = Client::connect(&herald, "alice", "phone").await;
    let synced = alice_phone.sync(&[(GROUP, 0)], 100).await;
    assert_eq!(synced.conversations[0].messages.len(), 2, "{synced:?}");

    // Pull: bob's sync and history hold carol's message alone, and sync still says it is
    // complete through the newest seq, so his device does not wait for the gap.
    let synced = bob.sync(&[(GROUP, 0)], 100).await;
    let conversation = &synced.conversations[0];
    let seqs: Vec<u64> = conversation.messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, [fine.seq], "{synced:?}");
    assert_eq!(conversation.complete_through_seq, fine.seq);
    let history = bob.whole_history(GROUP).await;
    assert_eq!(history.iter().map(|m| m.id).collect::<Vec<_>>(), [fine.message_id]);
    // Carol's history has both: the message is stored, not removed.
    assert_eq!(carol.whole_history(GROUP).await.len(), 2);

    // Backfill: bob is away while alice and carol write; back, he is pushed carol's only.
    bob.deliver_ack(GROUP, fine.seq).await;
    bob.close().await;
    let blocked_again = alice.send_ok(GROUP, "alice again").await;
    let fine_again = carol.send_ok(GROUP, "carol again").await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let got = bob.deliver_in(GROUP).await.message.expect("a message");
    assert_eq!(got.id, fine_again.message_id, "backfill skips alice's message");
    assert!(!kept_deliver_of(&bob, blocked_again.message_id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_room_subscriber_misses_only_the_blocked_senders_messages() {
    let (herald, _plugins) = herald_where_bob_blocked_alice().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let mut carol = Client::connect(&herald, "carol", "phone").await;
    for client in [&mut alice, &mut bob, &mut carol] {
        client.subscribe(ROOM, None).await;
    }
    let blocked = alice.send_ok(ROOM, "alice to the room").await;
    let fine = carol.send_ok(ROOM, "carol to the room").await;
    assert_eq!(carol.deliver_of(blocked.message_id).await.message.map(|m| m.seq), Some(blocked.seq));
    let got = bob.deliver_in(ROOM).await.message.expect("a message");
    assert_eq!(got.id, fine.message_id, "bob's first room message is carol's");
    assert!(!kept_deliver_of(&bob, blocked.message_id));

    // A late subscriber's catch-up is filtered the same way.
    let mut late_bob = Client::connect(&herald, "bob", "tablet").await;
    let caught_up = late_bob.subscribe(ROOM, Some(0)).await;
    assert_eq!(caught_up.messages.iter().map(|m| m.id).collect::<Vec<_>>(), [fine.message_id], "{caught_up:?}");
    let mut late_carol = Client::connect(&herald, "carol", "tablet").await;
    assert_eq!(late_carol.subscribe(ROOM, Some(0)).await.messages.len(), 2);
}
