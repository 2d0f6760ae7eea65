//! Invariants 1–3 across a crash: every message acked OK survives `kill -9`, nothing is
//! stored twice (resending the same client_msg_ids returns the original ids), and seq never
//! goes backwards after restart.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use herald_proto::v1::{self, frame::Body, send_ack::Status};

use super::client::{Client, WaitError};
use super::server::Herald;
use super::{dm, uuid};

const TOTAL: usize = 200;
const ACKED_FIRST: usize = 40;
const KILL_AFTER: usize = 60;

fn body(i: usize) -> String {
    format!("durable {i}")
}

/// Index of the message whose body is `durable <i>`.
fn index_of(message: &v1::Message) -> usize {
    std::str::from_utf8(&message.body)
        .ok()
        .and_then(|text| text.strip_prefix("durable "))
        .and_then(|i| i.parse().ok())
        .unwrap_or_else(|| panic!("a message nobody sent: {message:?}"))
}

/// Checks history holds each acked message with its ids, and no message twice; returns the
/// history by index.
fn check_history(
    history: &[v1::Message],
    acked: &HashMap<usize, v1::SendAck>,
    when: &str,
) -> HashMap<usize, v1::Message> {
    for pair in history.windows(2) {
        assert!(
            pair[0].seq < pair[1].seq,
            "{when}: history ascends strictly by seq: {} then {}",
            pair[0].seq,
            pair[1].seq
        );
    }
    let mut by_index: HashMap<usize, v1::Message> = HashMap::new();
    for message in history {
        let i = index_of(message);
        if let Some(earlier) = by_index.insert(i, message.clone()) {
            panic!("{when}: message {i} is stored twice: {earlier:?} and {message:?}");
        }
    }
    let mut missing: Vec<usize> = acked.keys().copied().filter(|i| !by_index.contains_key(i)).collect();
    missing.sort_unstable();
    assert!(missing.is_empty(), "{when}: messages acked OK but lost: {missing:?}");
    for (i, ack) in acked {
        let stored = &by_index[i];
        assert_eq!(
            (stored.id, stored.seq),
            (ack.message_id, ack.seq),
            "{when}: message {i} keeps the ids its ack gave"
        );
    }
    by_index
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acked_message_survives_kill_9_and_resends_are_duplicates() {
    let mut herald = Herald::start().await;
    let conversation = dm("alice", "bob");
    let ids: Vec<String> = (0..TOTAL).map(|_| uuid()).collect();
    let index: HashMap<String, usize> = ids.iter().enumerate().map(|(i, id)| (id.clone(), i)).collect();
    let mut acked: HashMap<usize, v1::SendAck> = HashMap::new();

    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    // Some messages fully acked while nothing else is going on…
    for (i, id) in ids.iter().enumerate().take(ACKED_FIRST) {
        alice.send_with(id, &conversation, 1, body(i).as_bytes()).await;
    }
    for (i, id) in ids.iter().enumerate().take(ACKED_FIRST) {
        let ack = alice.ack_of(id).await;
        assert_eq!(ack.status(), Status::Ok, "{ack:?}");
        acked.insert(i, ack);
    }
    // …then a burst, and kill -9 in the middle of it.
    for (i, id) in ids.iter().enumerate().skip(ACKED_FIRST) {
        alice.send_with(id, &conversation, 1, body(i).as_bytes()).await;
    }
    let mut ok_in_burst = 0;
    while ok_in_burst < KILL_AFTER {
        let ack = alice
            .wait_for("send_acks of the burst", super::WAIT, |frame| match &frame.body {
                Some(Body::SendAck(ack)) => Some(ack.clone()),
                _ => None,
            })
            .await;
        if ack.status() == Status::Ok {
            ok_in_burst += 1;
            acked.insert(index[&ack.client_msg_id], ack);
        }
    }
    herald.kill9();
    // Acks already on their way before the kill are promises too.
    loop {
        let more = alice
            .try_wait_for(Duration::from_secs(5), |frame| match &frame.body {
                Some(Body::SendAck(ack)) => Some(ack.clone()),
                _ => None,
            })
            .await;
        match more {
            Ok(ack) if ack.status() == Status::Ok => {
                acked.insert(index[&ack.client_msg_id], ack);
            }
            Ok(_) => {}
            Err(WaitError::Closed(_)) => break,
            Err(WaitError::Timeout) => panic!("the connection to a killed server did not end"),
        }
    }
    drop(alice);

    herald.restart().await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let history = bob.whole_history(&conversation).await;
    check_history(&history, &acked, "after kill -9");

    // Resend everything with the same client_msg_ids.
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    for (i, id) in ids.iter().enumerate() {
        alice.send_with(id, &conversation, 1, body(i).as_bytes()).await;
    }
    let mut final_acks: HashMap<usize, v1::SendAck> = HashMap::new();
    for (i, id) in ids.iter().enumerate() {
        let mut ack = alice.ack_of(id).await;
        while ack.status() == Status::Retry {
            alice.send_with(id, &conversation, 1, body(i).as_bytes()).await;
            ack = alice.ack_of(id).await;
        }
        if let Some(original) = acked.get(&i) {
            assert_eq!(ack.status(), Status::Duplicate, "message {i} was acked OK before the crash: {ack:?}");
            assert_eq!((ack.message_id, ack.seq), (original.message_id, original.seq), "message {i}: the original ids");
        } else {
            assert!(matches!(ack.status(), Status::Ok | Status::Duplicate), "message {i}: {ack:?}");
        }
        final_acks.insert(i, ack);
    }
    let history = bob.whole_history(&conversation).await;
    let stored = check_history(&history, &final_acks, "after resending");
    assert_eq!(stored.len(), TOTAL, "every message stored exactly once");
    let unique_ids: HashSet<u64> = history.iter().map(|m| m.id).collect();
    assert_eq!(unique_ids.len(), TOTAL, "message ids are unique");

    // Seq never goes backwards across the crash.
    let highest = history.iter().map(|m| m.seq).max().unwrap_or(0);
    let fresh = alice.send_ok(&conversation, "after the crash").await;
    assert!(fresh.seq > highest, "a new message's seq {} is above every earlier one ({highest})", fresh.seq);

    // A second crash right after an OK loses nothing either.
    herald.kill9();
    herald.restart().await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let history = bob.whole_history(&conversation).await;
    assert_eq!(history.len(), TOTAL + 1);
    assert_eq!(history.last().map(|m| (m.id, m.seq)), Some((fresh.message_id, fresh.seq)));
}
