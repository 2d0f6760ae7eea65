//! `Delivery::backfill` on messages stored in SQLite through the pipeline: what a device
//! that connects is pushed, which conversations are read for it, and when it goes live.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use super::session::Session;
use crate::model::DeviceLedger;
use crate::store::{CursorStore, CursorUpdate};
use crate::testkit::{Kit, RecordingOutbox, WAIT, conversation_id, device_id, request, settle, user_id, uuid};

const DM: &str = "dm:alice:bob";

/// Runs a session's backfill to its end.
async fn backfill(kit: &Kit, session: &Arc<Session>) {
    tokio::time::timeout(WAIT, kit.delivery.backfill(Arc::clone(session), super::backfill::Unfinished::count()))
        .await
        .expect("backfill hung");
}

/// Which conversations delivery read.
fn conversations_read(kit: &Kit) -> BTreeSet<String> {
    kit.reads.reads().into_iter().map(|(conversation, _)| conversation.to_string()).collect()
}

#[tokio::test]
async fn a_new_session_is_pushed_what_follows_its_cursor_in_order_then_goes_live() {
    let kit = Kit::new().await;
    let n = 5;
    for i in 1..=n {
        kit.send_ok("alice", "phone", DM, &format!("message {i}")).await;
    }
    let update =
        CursorUpdate { user: user_id("bob"), device: device_id("phone"), conversation: conversation_id(DM), seq: 1 };
    kit.database.advance_cursors(&[update]).await.expect("write the cursor");
    let outbox = RecordingOutbox::new();
    let session = kit.attach("bob", "phone", Arc::clone(&outbox)).await;
    assert!(!session.is_live());

    backfill(&kit, &session).await;

    let expected: Vec<(String, u64)> = (2..=n).map(|seq| (DM.to_owned(), seq)).collect();
    assert_eq!(outbox.delivered_seqs(), expected, "exactly what follows the cursor, oldest first");
    let bodies: Vec<String> =
        outbox.delivered().iter().map(|m| String::from_utf8(m.body.to_vec()).expect("utf-8")).collect();
    assert_eq!(bodies.first().map(String::as_str), Some("message 2"));
    assert!(session.is_live(), "live pushes go through once backfill is over");
}

/// A conversation busy enough to be offered a new message during every read backfill makes
/// of it: each still reaches the device in seq order, no live push overtaking an older
/// message still to come from storage.
#[tokio::test]
async fn a_conversation_offered_a_message_during_every_read_is_pushed_in_order() {
    const SENDS: u32 = 12;
    let kit = Kit::new().await;
    kit.send_ok("alice", "phone", DM, "message 1").await;
    let outbox = RecordingOutbox::new();
    let session = kit.attach("bob", "phone", Arc::clone(&outbox)).await;
    let pipeline = Arc::clone(&kit.pipeline);
    let sent = Arc::new(AtomicU32::new(1));
    kit.reads.after_each_read(Arc::new(move || {
        let (pipeline, sent) = (Arc::clone(&pipeline), Arc::clone(&sent));
        Box::pin(async move {
            let n = sent.fetch_add(1, Ordering::SeqCst) + 1;
            if n <= SENDS {
                let body = format!("message {n}");
                settle(pipeline.admit(request("alice", "phone", DM, &uuid(), &body)).await).await;
            }
        })
    }));

    backfill(&kit, &session).await;

    let expected: Vec<(String, u64)> = (1..=u64::from(SENDS)).map(|seq| (DM.to_owned(), seq)).collect();
    assert_eq!(outbox.delivered_seqs(), expected, "every message once, in seq order");
    assert!(session.is_live());
}

/// A message fan-out never offered the session (a route read from a cache before the login
/// reached it) is found by backfill's last look; a newer one offered during that look still
/// reaches the device after it, oldest first.
#[tokio::test]
async fn a_message_the_last_look_finds_is_pushed_before_one_offered_during_it() {
    let kit = Kit::new().await;
    let carol = "dm:bob:carol";
    kit.send_ok("carol", "phone", carol, "hi bob").await;
    let outbox = RecordingOutbox::new();
    let session = kit.attach("bob", "phone", Arc::clone(&outbox)).await;
    let (pipeline, sessions, reads) = (Arc::clone(&kit.pipeline), Arc::clone(&kit.sessions), Arc::clone(&kit.reads));
    let (unoffered, offered) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let bob = Arc::clone(&session);
    kit.reads.after_each_read(Arc::new(move || {
        let (pipeline, sessions, reads, bob) =
            (Arc::clone(&pipeline), Arc::clone(&sessions), Arc::clone(&reads), Arc::clone(&bob));
        let (unoffered, offered) = (Arc::clone(&unoffered), Arc::clone(&offered));
        Box::pin(async move {
            let last = reads.reads().last().map(|(conversation, _)| conversation.to_string());
            if last.as_deref() == Some(carol) && !unoffered.swap(true, Ordering::SeqCst) {
                // While the first pass reads: stored, and never offered to bob.
                sessions.remove(bob.id);
                settle(pipeline.admit(request("alice", "phone", DM, &uuid(), "never offered")).await).await;
                sessions.insert(Arc::clone(&bob));
            } else if last.as_deref() == Some(DM) && !offered.swap(true, Ordering::SeqCst) {
                // While the last look reads it: offered.
                settle(pipeline.admit(request("alice", "phone", DM, &uuid(), "offered")).await).await;
            }
        })
    }));

    backfill(&kit, &session).await;

    let in_dm: Vec<u64> = outbox.delivered_seqs().into_iter().filter(|(c, _)| c == DM).map(|(_, seq)| seq).collect();
    assert_eq!(in_dm, vec![1, 2], "oldest first");
    assert!(session.is_live());
}

#[tokio::test]
async fn backfill_skips_what_the_device_sent_itself() {
    let kit = Kit::new().await;
    kit.send_ok("alice", "phone", DM, "from alice").await;
    kit.send_ok("bob", "phone", DM, "from this very device").await;
    kit.send_ok("bob", "laptop", DM, "from bob's other device").await;
    let outbox = RecordingOutbox::new();
    let session = kit.attach("bob", "phone", Arc::clone(&outbox)).await;

    backfill(&kit, &session).await;

    assert_eq!(outbox.delivered_seqs(), vec![(DM.to_owned(), 1), (DM.to_owned(), 3)]);
    assert!(session.is_live());
}

#[tokio::test]
async fn a_resumed_session_reads_only_the_conversations_it_is_owed() {
    let kit = Kit::new().await;
    let carol = "dm:bob:carol";
    let (old, old_outbox) = kit.connect("bob", "phone").await;
    // Live pushes the device took and acked, in two conversations.
    for body in ["one", "two"] {
        kit.send_ok("alice", "phone", DM, body).await;
    }
    kit.send_ok("carol", "phone", carol, "hi bob").await;
    assert_eq!(old_outbox.delivered().len(), 3, "pushed live: {:?}", old_outbox.delivered_seqs());
    kit.delivery.ack(&old, &conversation_id(DM), 2).await;
    kit.delivery.ack(&old, &conversation_id(carol), 1).await;
    // It drops; while it is away a message of one conversation comes.
    kit.drop_within_grace(&old).await;
    kit.send_ok("alice", "phone", DM, "three").await;
    assert_eq!(old_outbox.delivered().len(), 3, "nothing pushed while parked");

    let outbox = RecordingOutbox::new();
    let back = kit.attach("bob", "phone", Arc::clone(&outbox)).await;
    let parked = kit.sessions.unpark(&back.user, &back.device).expect("parked");
    assert!(back.resume_from(&parked), "its ledger knows all the device may lack");
    kit.reads.clear();

    backfill(&kit, &back).await;

    assert_eq!(outbox.delivered_seqs(), vec![(DM.to_owned(), 3)]);
    assert_eq!(conversations_read(&kit), BTreeSet::from([DM.to_owned()]), "{carol} is not read: nothing is owed there");
    assert!(back.is_live());
}

/// A device whose ledger was restored after a restart is read in the conversations its
/// ledger owes and those storage says changed since the save; its last look (for what
/// fan-out never offered) reads again only a conversation changed past what was read, so
/// with nothing new stored each is read once.
#[tokio::test]
async fn a_restored_session_reads_each_conversation_once_when_nothing_new_came() {
    let kit = Kit::new().await;
    let carol = "dm:bob:carol";
    kit.send_ok("carol", "phone", carol, "before the save").await;
    kit.send_ok("alice", "phone", DM, "after the save").await;
    let since_id = kit.stored(DM).await[0].id;
    let ledger = DeviceLedger {
        acked: BTreeMap::new(),
        read_after: BTreeMap::from([(conversation_id(carol), 0)]),
        since_id: Some(since_id),
    };
    let restored = Arc::new(Session::restored(kit.connection_id(), user_id("bob"), device_id("phone"), ledger));
    let outbox = RecordingOutbox::new();
    let session = kit.attach("bob", "phone", Arc::clone(&outbox)).await;
    assert!(session.resume_from(&restored));
    kit.reads.clear();

    backfill(&kit, &session).await;

    let mut reads: Vec<String> =
        kit.reads.reads().into_iter().map(|(conversation, _)| conversation.to_string()).collect();
    reads.sort();
    assert_eq!(reads, [DM.to_owned(), carol.to_owned()], "each read once");
    let delivered: BTreeSet<(String, u64)> = outbox.delivered_seqs().into_iter().collect();
    assert_eq!(delivered, BTreeSet::from([(DM.to_owned(), 1), (carol.to_owned(), 1)]));
    assert!(session.is_live());
    assert_eq!(session.since(), None, "what changed since the save is read");
}

#[tokio::test]
async fn a_full_backfill_reads_every_conversation_of_the_user() {
    // The counterpart of the resumed case: without a ledger to resume from, every
    // conversation is read (so the test above tells the two paths apart).
    let kit = Kit::new().await;
    kit.send_ok("alice", "phone", DM, "one").await;
    kit.send_ok("carol", "phone", "dm:bob:carol", "hi bob").await;
    let outbox = RecordingOutbox::new();
    let session = kit.attach("bob", "phone", Arc::clone(&outbox)).await;

    backfill(&kit, &session).await;

    assert_eq!(conversations_read(&kit), BTreeSet::from([DM.to_owned(), "dm:bob:carol".to_owned()]));
    let delivered: BTreeSet<(String, u64)> = outbox.delivered_seqs().into_iter().collect();
    assert_eq!(delivered, BTreeSet::from([(DM.to_owned(), 1), ("dm:bob:carol".to_owned(), 1)]));
}

#[tokio::test]
async fn a_session_whose_outbox_closes_stops_without_going_live() {
    let kit = Kit::new().await;
    for i in 1..=5 {
        kit.send_ok("alice", "phone", DM, &format!("message {i}")).await;
    }
    // The device goes away after two frames.
    let outbox = RecordingOutbox::closing_after(2);
    let session = kit.attach("bob", "phone", Arc::clone(&outbox)).await;

    backfill(&kit, &session).await;

    assert_eq!(outbox.delivered_seqs(), vec![(DM.to_owned(), 1), (DM.to_owned(), 2)]);
    assert!(!session.is_live(), "a closed session never goes live");
    assert!(!session.park(), "nor may it be resumed from: its backfill never finished");
}

/// An ack not yet written (cursors reach storage once per flush) counts for the device's
/// next connection, also when storage has no cursor of that conversation at all.
#[tokio::test]
async fn an_ack_not_yet_written_counts_for_the_devices_next_backfill() {
    let kit = Kit::new().await;
    for i in 1..=3 {
        kit.send_ok("alice", "phone", DM, &format!("message {i}")).await;
    }
    let (first, _) = kit.connect("bob", "phone").await;
    kit.delivery.ack(&first, &conversation_id(DM), 2).await;
    assert!(kit.database.cursors(&user_id("bob"), &device_id("phone")).await.expect("cursors").is_empty());
    kit.sessions.remove(first.id);
    let outbox = RecordingOutbox::new();
    let session = kit.attach("bob", "phone", Arc::clone(&outbox)).await;

    backfill(&kit, &session).await;

    assert_eq!(outbox.delivered_seqs(), vec![(DM.to_owned(), 3)], "only what follows the ack");
}
