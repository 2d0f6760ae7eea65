//! `sync` on messages stored in SQLite through the pipeline: what a reply claims complete.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use herald_proto::v1;

use crate::testkit::{Kit, RecordingOutbox, request, settle, uuid};

const DM: &str = "dm:alice:bob";

/// A message stored while a sync reads is either in the reply or above its
/// `complete_through_seq`: a device skips every seq at or below it that the reply lacks, so
/// one claimed complete and not returned would never reach it.
#[tokio::test]
async fn a_message_stored_during_a_sync_is_never_claimed_complete_without_being_returned() {
    let kit = Kit::new().await;
    kit.send_ok("alice", "phone", DM, "message 1").await;
    let session = kit.attach("bob", "phone", RecordingOutbox::new()).await;
    let pipeline = Arc::clone(&kit.pipeline);
    let sent = Arc::new(AtomicBool::new(false));
    kit.reads.after_each_read(Arc::new(move || {
        let (pipeline, sent) = (Arc::clone(&pipeline), Arc::clone(&sent));
        Box::pin(async move {
            if !sent.swap(true, Ordering::SeqCst) {
                settle(pipeline.admit(request("alice", "phone", DM, &uuid(), "message 2")).await).await;
            }
        })
    }));

    let reply = kit
        .delivery
        .sync(&session, v1::Sync { cursors: vec![v1::Cursor { conversation: DM.to_owned(), seq: 0 }], limit: 100 })
        .await
        .expect("sync");

    let [conversation] = reply.conversations.as_slice() else { panic!("one conversation: {reply:?}") };
    let returned: Vec<u64> = conversation.messages.iter().map(|message| message.seq).collect();
    assert_eq!(kit.stored(DM).await.len(), 2, "message 2 was stored during the sync");
    for seq in 1..=conversation.complete_through_seq {
        assert!(
            returned.contains(&seq),
            "seq {seq} is claimed complete (through {}) but not returned ({returned:?})",
            conversation.complete_through_seq
        );
    }
    assert!(conversation.complete_through_seq >= 1, "what was stored before the sync is complete");
}
