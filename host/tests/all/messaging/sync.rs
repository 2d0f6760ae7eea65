//! Pull: backfill on connect, `sync` (server-side cursors and explicit ones, with
//! `complete_through_seq`), and `history` paging.

use std::time::Duration;

use herald_proto::v1::{self, send_ack::Status};

use super::client::Client;
use super::server::Herald;
use super::{WAIT, dm, uuid};
use crate::support::poll::poll;

/// Sends `count` messages ("<label> <i>") pipelined, and returns their OK acks in order.
async fn send_many(client: &mut Client, conversation: &str, label: &str, count: usize) -> Vec<v1::SendAck> {
    let ids: Vec<String> = (0..count).map(|_| uuid()).collect();
    for (i, id) in ids.iter().enumerate() {
        client.send_with(id, conversation, 1, format!("{label} {i}").as_bytes()).await;
    }
    let mut acks = Vec::new();
    for id in &ids {
        let ack = client.ack_of(id).await;
        assert_eq!(ack.status(), Status::Ok, "{ack:?}");
        acks.push(ack);
    }
    acks
}

fn assert_same_messages(got: &[v1::Message], acks: &[v1::SendAck], what: &str) {
    let got_ids: Vec<(u64, u64)> = got.iter().map(|m| (m.id, m.seq)).collect();
    let want: Vec<(u64, u64)> = acks.iter().map(|a| (a.message_id, a.seq)).collect();
    assert_eq!(got_ids, want, "{what}: (id, seq) of the messages, in order");
}

/// The entry for `conversation` in a sync reply, if any.
fn entry<'a>(reply: &'a v1::SyncReply, conversation: &str) -> Option<&'a v1::ConversationSync> {
    reply.conversations.iter().find(|c| c.conversation == conversation)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_recipient_gets_everything_on_connect_in_order() {
    let herald = Herald::start().await;
    let conversation = dm("alice", "bob");
    Client::connect(&herald, "bob", "phone").await.close().await;

    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let acks = send_many(&mut alice, &conversation, "while you were away", 20).await;

    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let backfill = bob.distinct_deliveries(&conversation, 20).await;
    assert_same_messages(&backfill, &acks, "backfill on connect");
    for (i, message) in backfill.iter().enumerate() {
        assert_eq!(message.body.as_ref(), format!("while you were away {i}").as_bytes());
        assert_eq!(message.sender, "alice");
    }
    bob.deliver_ack(&conversation, acks[19].seq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_with_no_cursors_returns_what_this_device_lacks() {
    let herald = Herald::start().await;
    let conversation = dm("alice", "bob");
    Client::connect(&herald, "bob", "phone").await.close().await;
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let acks = send_many(&mut alice, &conversation, "pull me", 15).await;
    let last = acks[14].seq;

    // Bob comes back and pulls (backfill pushes may arrive too; he acks nothing yet, so the
    // server-side cursor is where it was).
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let reply = bob.sync(&[], 0).await;
    let first =
        entry(&reply, &conversation).unwrap_or_else(|| panic!("sync with no cursors lists {conversation}: {reply:?}"));
    let mut pulled = first.messages.clone();
    let mut through = first.complete_through_seq;
    assert_eq!(first.latest_seq, last, "latest_seq is the conversation's newest seq");
    // The server's default limit may be small: keep pulling from complete_through_seq.
    while through < last {
        let more = bob.sync(&[(&conversation, through)], 0).await;
        let next = entry(&more, &conversation)
            .unwrap_or_else(|| panic!("sync after {through} lists {conversation}: {more:?}"));
        assert!(next.complete_through_seq > through, "complete_through_seq moves forward: {more:?}");
        pulled.extend(next.messages.iter().cloned());
        through = next.complete_through_seq;
    }
    assert_same_messages(&pulled, &acks, "sync from the device's server-side cursor");
    assert!(through >= last, "complete_through_seq covers the newest message");

    // Acknowledged: the server-side cursor moves, and a cursor-less sync has nothing more
    // for this conversation (cursor writes may be coalesced, so poll).
    bob.deliver_ack(&conversation, last).await;
    let acked = format!("a cursor-less sync to return nothing after deliver_ack({last})");
    poll()
        .within(WAIT)
        .every(Duration::from_millis(100))
        .until(&acked, async || {
            let reply = bob.sync(&[], 0).await;
            let left = entry(&reply, &conversation).map(|c| c.messages.len()).unwrap_or(0);
            if left == 0 { Ok(()) } else { Err(format!("{left} messages: {reply:?}")) }
        })
        .await;

    // An explicit cursor is honoured whatever the server-side one says.
    let reply = bob.sync(&[(&conversation, acks[9].seq)], 0).await;
    let tail = entry(&reply, &conversation)
        .unwrap_or_else(|| panic!("sync after seq {} lists {conversation}: {reply:?}", acks[9].seq));
    assert_same_messages(&tail.messages, &acks[10..], "sync from an explicit cursor");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_limit_pages_with_complete_through_seq() {
    let herald = Herald::start().await;
    let conversation = dm("alice", "bob");
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let acks = send_many(&mut alice, &conversation, "page", 12).await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;

    let mut cursor = 0;
    for (page, range) in [(0..5), (5..10), (10..12)].into_iter().enumerate() {
        let reply = bob.sync(&[(&conversation, cursor)], 5).await;
        let got =
            entry(&reply, &conversation).unwrap_or_else(|| panic!("page {page}: {conversation} missing: {reply:?}"));
        assert_same_messages(&got.messages, &acks[range.clone()], &format!("sync page {page} (limit 5)"));
        assert_eq!(got.latest_seq, acks[11].seq, "latest_seq");
        let through = got.complete_through_seq;
        let last_returned = acks[range.end - 1].seq;
        assert!(
            through >= last_returned,
            "page {page}: complete_through_seq {through} < last returned seq {last_returned}"
        );
        if let Some(next) = acks.get(range.end) {
            assert!(
                through < next.seq,
                "page {page}: complete_through_seq {through} claims seq {} it did not return",
                next.seq
            );
        }
        cursor = through;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_pages_backwards_with_has_more() {
    let herald = Herald::start().await;
    let conversation = dm("alice", "bob");
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    let acks = send_many(&mut alice, &conversation, "old", 25).await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;

    let newest = bob.history(&conversation, 0, 10).await;
    assert_eq!(newest.conversation, conversation);
    assert_same_messages(&newest.messages, &acks[15..25], "history before_seq 0 (latest), limit 10");
    assert!(newest.has_more, "15 older messages remain");
    let middle = bob.history(&conversation, acks[15].seq, 10).await;
    assert_same_messages(&middle.messages, &acks[5..15], "history before the 16th message");
    assert!(middle.has_more, "5 older messages remain");
    let oldest = bob.history(&conversation, acks[5].seq, 10).await;
    assert_same_messages(&oldest.messages, &acks[0..5], "history before the 6th message");
    assert!(!oldest.has_more, "nothing older than the first message");
    let empty = bob.history(&conversation, acks[0].seq, 10).await;
    assert!(empty.messages.is_empty() && !empty.has_more, "before the first message: {empty:?}");

    for (i, message) in oldest.messages.iter().chain(&middle.messages).chain(&newest.messages).enumerate() {
        assert_eq!(message.body.as_ref(), format!("old {i}").as_bytes());
        assert_eq!((message.sender.as_str(), message.sender_device.as_str()), ("alice", "laptop"));
    }
    // The sender pages the same conversation too.
    assert_eq!(alice.whole_history(&conversation).await.len(), 25);
}
