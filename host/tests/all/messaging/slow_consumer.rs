//! A client that never reads its socket while a lot is sent to it overflows its bounded
//! send queue and is closed with 4008 — and nobody else on the node notices: not the other
//! chatters, and not the other subscribers of a room it floods.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use herald_proto::Encoding;
use herald_proto::v1::SendAck;
use herald_proto::v1::send_ack::Status;

use super::client::Client;
use super::server::{DEV_KEY, Herald};
use super::{WAIT, dm, uuid};
use crate::support::poll::poll;

pub(super) const SLOW_DEVICE: &str = "never-reads-device";

/// Sends 8 messages of `body` into `conversation` at once (a flooder's own acks must fit
/// its queue of 16) and returns their acks, each OK: a sender is never held back by a slow
/// recipient.
pub(super) async fn send_batch(sender: &mut Client, conversation: &str, body: &[u8]) -> Vec<SendAck> {
    let ids: Vec<String> = (0..8).map(|_| uuid()).collect();
    for id in &ids {
        sender.send_with(id, conversation, 1, body).await;
    }
    let mut acks = Vec::new();
    for id in &ids {
        let ack = sender.ack_of(id).await;
        assert_eq!(ack.status(), Status::Ok, "the sender is never held back by a slow recipient: {ack:?}");
        acks.push(ack);
    }
    acks
}

/// Whether the server has let the slow device go (it is gone from presence).
pub(super) async fn let_go(herald: &Herald) -> bool {
    let presence = herald.get("/v1/users/slow/presence", Some(DEV_KEY)).await;
    presence.status == 200 && !presence.body.contains(SLOW_DEVICE)
}

/// Waits for `slow`'s connection to close and asserts it was closed with 4008; `what`
/// says after what.
pub(super) async fn expect_slow_consumer_closed(slow: &mut Client, what: &str) {
    let closed = slow.expect_closed(WAIT).await;
    assert_eq!(
        closed.code,
        Some(4008),
        "{}",
        slow.failure(&format!("{what} must be closed with 4008, got {closed:?}"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_consumer_is_closed_with_4008_while_others_see_no_stall() {
    let herald = Herald::with().set("GATEWAY__SEND_QUEUE", 16).start().await;
    // From here on `slow` never reads: its socket buffers fill, then its queue.
    let mut slow = Client::connect(&herald, "slow", SLOW_DEVICE).await;
    let mut flood = Client::connect(&herald, "flood", "laptop").await;
    let mut carol = Client::connect(&herald, "carol", "phone").await;
    let mut dave = Client::connect(&herald, "dave", "phone").await;

    // Meanwhile carol and dave keep chatting; each round trip must finish within WAIT.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let chat = {
        let (stop, done) = (stop.clone(), done.clone());
        tokio::spawn(async move {
            let conversation = dm("carol", "dave");
            while !stop.load(Ordering::Relaxed) {
                let n = done.load(Ordering::Relaxed);
                let ack = carol.send_ok(&conversation, format!("round trip {n}")).await;
                let message = dave.deliver_of(ack.message_id).await.message.expect("message");
                assert_eq!(message.body.as_ref(), format!("round trip {n}").as_bytes());
                dave.deliver_ack(&conversation, message.seq).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
            (carol, dave)
        })
    };

    // Flood the slow one with 32 KiB messages, 8 at a time (the flooder's own acks must fit
    // its queue of 16), until the server lets it go (it disappears from presence) or 1000
    // messages (32 MiB) have gone out.
    let conversation = dm("flood", "slow");
    let body = vec![b'x'; 32 * 1024];
    let mut sent = 0;
    while sent < 1000 {
        sent += send_batch(&mut flood, &conversation, &body).await.len();
        if let_go(&herald).await {
            break;
        }
    }
    // While the slow one's socket is still full and unread, the others keep going.
    let before = done.load(Ordering::Relaxed);
    poll()
        .within(WAIT)
        .every(Duration::from_millis(20))
        .until("carol and dave to go on next to the slow consumer", async || {
            assert!(!chat.is_finished(), "the round-trip task ended early (it panicked: see above)");
            let now = done.load(Ordering::Relaxed);
            if now >= before + 3 { Ok(()) } else { Err(format!("{} round trips since, {now} in all", now - before)) }
        })
        .await;

    expect_slow_consumer_closed(&mut slow, &format!("after {sent} messages of 32 KiB the slow consumer")).await;

    stop.store(true, Ordering::Relaxed);
    let (mut carol, mut dave) = chat.await.unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()));
    // And after it.
    let ack = carol.send_ok(&dm("carol", "dave"), "after the flood").await;
    dave.deliver_of(ack.message_id).await;
    // The slow one reconnects and can pull what it missed.
    let mut back = Client::connect(&herald, "slow", SLOW_DEVICE).await;
    let reply = back.sync(&[(&conversation, 0)], 10).await;
    assert!(
        reply.conversations.iter().any(|c| c.conversation == conversation && !c.messages.is_empty()),
        "after reconnecting, sync returns the flood: {} conversations",
        reply.conversations.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_room_subscriber_is_closed_with_4008_while_the_others_get_every_message() {
    const ROOM: &str = "room:arena";
    let herald = Herald::with().set("GATEWAY__SEND_QUEUE", 16).start().await;
    // From here on `slow` never reads.
    let mut slow = Client::connect(&herald, "slow", SLOW_DEVICE).await;
    slow.subscribe(ROOM, None).await;
    let mut others = Vec::new();
    // One of each encoding: the shared frame is encoded once in each.
    for (user, encoding) in [("bob", Encoding::Proto), ("carol", Encoding::Json)] {
        let mut client = Client::connect_with(&herald, encoding, user, "phone").await;
        client.subscribe(ROOM, None).await;
        others.push(client);
    }
    let mut publisher = Client::connect(&herald, "game", "server").await;
    publisher.subscribe(ROOM, None).await; // a room takes messages from its subscribers

    // 32 KiB announcements, 8 at a time, until the slow one is let go or 1000 have gone
    // out; the other subscribers take each batch before the next.
    let body = vec![b'x'; 32 * 1024];
    let (mut sent, mut last) = (0, None);
    while sent < 1000 {
        let mut acks = send_batch(&mut publisher, ROOM, &body).await;
        for client in &mut others {
            for ack in &acks {
                client.deliver_of(ack.message_id).await;
            }
        }
        sent += acks.len();
        last = acks.pop();
        if let_go(&herald).await {
            break;
        }
    }

    expect_slow_consumer_closed(&mut slow, &format!("after {sent} room messages of 32 KiB the slow subscriber")).await;
    // It catches up later, from where it knows it was.
    let last = last.expect("at least one batch");
    let mut back = Client::connect(&herald, "slow", SLOW_DEVICE).await;
    let caught_up = back.subscribe(ROOM, Some(last.seq - 1)).await;
    assert_eq!(caught_up.latest_seq, last.seq);
    assert_eq!(caught_up.messages.iter().map(|m| m.id).collect::<Vec<_>>(), vec![last.message_id]);
}
