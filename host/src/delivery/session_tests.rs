//! The session's ledger: pushes, claims, parking and hand-overs.

use super::*;

/// An outbox that takes every frame and drops it.
struct Sink;

#[async_trait]
impl Outbox for Sink {
    fn push(&self, _frame: Frame) -> bool {
        true
    }
    async fn push_waiting(&self, _frame: Frame) -> bool {
        true
    }
    fn is_closed(&self) -> bool {
        false
    }
}

fn connection() -> Session {
    let user = UserId::parse("bob").expect("user");
    let device = DeviceId::parse("phone").expect("device");
    Session::new(ConnectionId(1), user, device, Arc::new(Sink))
}

#[test]
fn a_conversation_owing_messages_stays_closed_to_live_pushes_until_they_are_read() {
    let connection = Arc::new(connection());
    let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
    let grp = ConversationId::parse("grp:team").expect("conversation");
    assert!(connection.offer(&dm, 3).into_push().is_none(), "offered during backfill: owed");
    assert!(connection.offer(&dm, 4).into_push().is_none());

    let owed = connection.go_live_except_owed().expect("noted");
    assert_eq!(owed, [(dm.clone(), 3)].into_iter().collect(), "read from the lowest seq owed");
    assert!(connection.offer(&grp, 1).into_push().is_some(), "a conversation that owes nothing is live");
    assert!(connection.offer(&dm, 5).into_push().is_none(), "a later message is owed too, not pushed ahead of 3 and 4");

    let owed = connection.go_live_except_owed().expect("noted");
    assert_eq!(owed, [(dm.clone(), 5)].into_iter().collect(), "still held while 5 is read");
    assert!(connection.offer(&dm, 6).into_push().is_none());
    assert_eq!(connection.go_live_except_owed().expect("noted"), [(dm.clone(), 6)].into_iter().collect());
    assert!(connection.go_live_except_owed().expect("noted").is_empty(), "nothing new owed: live everywhere");
    assert!(connection.offer(&dm, 7).into_push().is_some(), "pushed live from now on");
}

#[test]
fn too_many_conversations_owed_keep_the_whole_session_closed() {
    let connection = Arc::new(connection());
    for n in 0..=MAX_OWED_CONVERSATIONS {
        let conversation = ConversationId::parse(&format!("grp:g{n}")).expect("conversation");
        assert!(connection.offer(&conversation, 1).into_push().is_none());
    }
    assert!(connection.go_live_except_owed().is_none(), "the noted set is incomplete: read everything");
    assert!(!connection.is_live());
    assert!(connection.go_live_except_owed().expect("noted").is_empty());
    assert!(connection.is_live());
}

#[test]
fn a_message_backfill_pushed_is_not_pushed_again_by_a_late_fan_out() {
    let connection = connection();
    let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
    // Backfill reads seq 5 between its commit and its fan-out, and pushes it.
    assert!(connection.claim_push(&dm, 5));
    connection.end_claims();
    // The fan-out of 5 comes after backfill ended: skipped, once.
    assert!(!connection.claim_push(&dm, 5));
    assert!(connection.claim_push(&dm, 6), "a later message goes out");
}

#[test]
fn while_backfilling_the_first_push_wins() {
    let connection = connection();
    let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
    assert!(connection.claim_push(&dm, 3), "live pushes first");
    assert!(!connection.claim_push(&dm, 3), "backfill then skips it");
    connection.end_claims();
    assert!(connection.claim_push(&dm, 4));
}

#[test]
fn an_acked_message_is_never_pushed_by_a_late_fan_out() {
    let connection = connection();
    let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
    assert!(connection.claim_push(&dm, 5));
    connection.end_claims();
    // The device acks 5 (dropping the claim) before the fan-out of 5 arrives.
    connection.record_ack(&dm, 5);
    assert!(!connection.claim_push(&dm, 5));
    assert!(connection.claim_push(&dm, 6));
}

fn connection_of(id: u64) -> Arc<Session> {
    Arc::new(Session::new(
        ConnectionId(id),
        UserId::parse("bob").expect("user"),
        DeviceId::parse("phone").expect("device"),
        Arc::new(Sink),
    ))
}

/// A connection whose backfill is over and that took live pushes.
fn settled(id: u64) -> Arc<Session> {
    let connection = connection_of(id);
    connection.go_live();
    connection.end_claims();
    connection
}

#[test]
fn a_parked_connection_notes_offers_and_its_successor_resumes_with_exactly_what_is_owed() {
    let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
    let grp = ConversationId::parse("grp:team").expect("conversation");
    let read = ConversationId::parse("dm:bob:carol").expect("conversation");
    let old = settled(1);
    // Pushed and acked: 3 of read, 4..=5 of dm; pushed and not acked: 6 of dm.
    for (conversation, seq) in [(&read, 3), (&dm, 4), (&dm, 5), (&dm, 6)] {
        assert!(old.offer(conversation, seq).into_push().is_some_and(|to| Arc::ptr_eq(&to, &old)));
    }
    old.record_ack(&read, 3);
    old.record_ack(&dm, 5);
    assert!(old.park());
    assert!(
        old.offer(&grp, 9).into_push().is_none() && old.offer(&grp, 8).into_push().is_none(),
        "parked: noted, not pushed"
    );
    assert!(old.offer(&dm, 7).into_push().is_none());

    let new = connection_of(2);
    assert!(new.resume_from(&old));
    let resume = new.take_resume().expect("resumed");
    let expected: BTreeMap<ConversationId, u64> = [(dm.clone(), 5), (grp.clone(), 7)].into_iter().collect();
    assert_eq!(resume, expected, "from the ack on, and from the lowest seq offered while parked");
    assert_eq!(new.acked_through(&read), 3, "acks carried over");

    // An offer that still reaches the old connection goes to the new one: owed while it
    // is not live, pushed once it is.
    assert!(old.offer(&grp, 10).into_push().is_none());
    assert_eq!(new.go_live().expect("complete").get(&grp), Some(&10));
    new.end_claims();
    assert!(old.offer(&grp, 11).into_push().is_some_and(|to| Arc::ptr_eq(&to, &new)));
    assert!(!new.resume_from(&old) && !connection_of(3).resume_from(&old), "taken over once");
}

#[test]
fn a_connection_handed_over_to_another_node_passes_every_later_offer_there() {
    let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
    let grp = ConversationId::parse("grp:team").expect("conversation");
    let old = settled(1);
    for seq in [4, 5] {
        assert!(old.offer(&dm, seq).into_push().is_some());
    }
    old.record_ack(&dm, 4);
    assert!(old.park());
    assert!(old.offer(&grp, 9).into_push().is_none(), "parked: owed");

    let ledger = old.hand_over(NodeId(2)).expect("complete");
    assert_eq!(ledger.acked, [(dm.clone(), 4)].into_iter().collect(), "its acks");
    assert_eq!(ledger.read_after, [(dm.clone(), 4), (grp.clone(), 8)].into_iter().collect(), "what it may lack");
    assert!(matches!(old.offer(&grp, 10), Offered::Forward(NodeId(2))), "passed on, not owed here");
    assert!(old.offer(&dm, 4).into_push().is_none(), "acked: nothing to pass on");
    assert!(old.hand_over(NodeId(3)).is_none(), "handed over once");
    assert!(matches!(old.offer(&grp, 11), Offered::Forward(NodeId(2))), "to the first taker");

    // An open connection handed over is kept when it closes, to pass offers on.
    let open = settled(3);
    assert!(open.hand_over(NodeId(2)).is_some());
    assert!(open.park());
    assert!(matches!(open.offer(&dm, 6), Offered::Forward(NodeId(2))));
}

#[test]
fn two_ledgers_resumed_from_read_from_the_lower_position_and_keep_the_higher_ack() {
    let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
    let grp = ConversationId::parse("grp:team").expect("conversation");
    let new = connection_of(9);
    new.resume_with(DeviceLedger {
        acked: [(dm.clone(), 4)].into_iter().collect(),
        read_after: [(dm.clone(), 4)].into_iter().collect(),
        since_id: None,
    });
    new.resume_with(DeviceLedger {
        acked: [(dm.clone(), 2)].into_iter().collect(),
        read_after: [(dm.clone(), 2), (grp.clone(), 7)].into_iter().collect(),
        since_id: None,
    });
    assert_eq!(new.acked_through(&dm), 4);
    let expected: BTreeMap<ConversationId, u64> = [(dm.clone(), 2), (grp, 7)].into_iter().collect();
    assert_eq!(new.take_resume(), Some(expected));
    new.resume_with(DeviceLedger::default());
    new.backfill_in_full();
    assert_eq!(new.take_resume(), None, "a full backfill after all");
}

#[test]
fn a_connection_whose_backfill_never_finished_is_not_resumed_from() {
    let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
    let old = connection_of(1);
    assert!(!old.park(), "it may not know all its device lacks");
    let new = connection_of(2);
    assert!(!new.resume_from(&old));
    assert!(new.take_resume().is_none(), "a full backfill");
    // Offers still move on to the new connection.
    assert!(old.offer(&dm, 4).into_push().is_none());
    assert_eq!(new.go_live().expect("complete").get(&dm), Some(&4));
}

#[test]
fn too_many_conversations_offered_before_going_live_make_backfill_read_everything() {
    let connection = connection_of(1);
    for n in 0..=MAX_OWED_CONVERSATIONS {
        let conversation = ConversationId::parse(&format!("grp:g{n}")).expect("conversation");
        assert!(connection.offer(&conversation, 1).into_push().is_none(), "not live yet");
    }
    assert!(connection.go_live().is_none(), "the noted set is incomplete");
    connection.end_claims();
    assert!(connection.park(), "once live, it starts afresh");
    assert!(connection_of(2).resume_from(&connection));
}

#[test]
fn too_many_owed_conversations_fall_back_to_a_full_backfill() {
    let old = settled(1);
    assert!(old.park());
    for n in 0..=MAX_OWED_CONVERSATIONS {
        let conversation = ConversationId::parse(&format!("grp:g{n}")).expect("conversation");
        assert!(old.offer(&conversation, 1).into_push().is_none());
    }
    assert!(!connection_of(2).resume_from(&old));
}

/// A ledger saved while the device was connected, restored after a restart: a new
/// connection of the device resumes from it as from a parked session, reading what it
/// lacked, what was offered while it was away, and what changed since the save.
#[test]
fn a_restored_ledger_resumes_its_device_where_the_saved_one_stood() {
    let dm = ConversationId::parse("dm:alice:bob").expect("conversation");
    let grp = ConversationId::parse("grp:crew").expect("conversation");
    let old = Arc::new(connection());
    old.skip_backfill();
    assert!(matches!(old.offer(&dm, 3), Offered::Push(_)));
    assert!(matches!(old.offer(&dm, 4), Offered::Push(_)));
    let before = old.changes();
    old.record_ack(&dm, 3);
    assert!(old.changes() > before, "an ack changes the ledger");
    let unchanged = old.changes();
    old.record_ack(&dm, 2);
    assert_eq!(old.changes(), unchanged, "an older ack does not");
    let mut saved = old.snapshot().expect("complete");
    assert_eq!(saved.acked, [(dm.clone(), 3)].into_iter().collect());
    assert_eq!(saved.read_after, [(dm.clone(), 3)].into_iter().collect(), "4 was pushed, not acked");
    assert!(old.snapshot().is_some(), "a snapshot takes nothing over");
    saved.since_id = Some(77);

    let restored = Arc::new(Session::restored(ConnectionId(9), old.user.clone(), old.device.clone(), saved));
    assert!(restored.is_closed(), "nothing can be pushed to a connection gone with the restart");
    assert!(restored.offer(&grp, 8).into_push().is_none(), "owed while parked");
    let new = Arc::new(Session::new(ConnectionId(10), old.user.clone(), old.device.clone(), Arc::new(Sink)));
    assert!(new.resume_from(&restored));
    assert_eq!(new.acked_through(&dm), 3);
    assert_eq!(new.take_resume(), Some([(dm.clone(), 3), (grp, 7)].into_iter().collect()));
    assert_eq!(new.since(), Some(77), "what changed since the save is read too");
    new.clear_since();
    assert_eq!(new.since(), None);
}

#[test]
fn a_session_still_backfilling_or_taken_over_has_no_snapshot() {
    let session = Arc::new(connection());
    assert!(session.snapshot().is_none(), "backfill not over");
    session.skip_backfill();
    assert!(session.snapshot().is_some());
    assert!(session.hand_over(NodeId(2)).is_some());
    assert!(session.snapshot().is_none(), "its device went on elsewhere");
}
