//! Coalesced cursor writes: acks update memory at once and reach storage in one batch per
//! flush interval — never one transaction per ack.

use std::sync::Mutex;

use crate::maps::HashMap;
use crate::model::{ConversationId, DeviceId, UserId};
use crate::store::CursorStore;
use crate::store::CursorUpdate;

type Key = (UserId, DeviceId, ConversationId);

/// Acked positions waiting to be written.
#[derive(Default)]
pub struct CursorBuffer {
    pending: Mutex<HashMap<Key, u64>>,
}

impl CursorBuffer {
    /// Notes that the device has everything of `conversation` up to `seq`.
    pub fn record(&self, user: &UserId, device: &DeviceId, conversation: &ConversationId, seq: u64) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let position = pending.entry((user.clone(), device.clone(), conversation.clone())).or_default();
        *position = (*position).max(seq);
    }

    /// Writes everything noted so far in one statement; on failure keeps it for next time.
    /// A position stays noted until its write has landed, so [`pending`](Self::pending)
    /// never misses one that storage does not have yet.
    pub async fn flush(&self, store: &dyn CursorStore) {
        let batch: Vec<CursorUpdate> = {
            let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            pending
                .iter()
                .map(|((user, device, conversation), &seq)| CursorUpdate {
                    user: user.clone(),
                    device: device.clone(),
                    conversation: conversation.clone(),
                    seq,
                })
                .collect()
        };
        if batch.is_empty() {
            return;
        }
        if let Err(error) = store.advance_cursors(&batch).await {
            tracing::warn!(%error, cursors = batch.len(), "writing cursors failed; will retry");
            return;
        }
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        for update in batch {
            let key = (update.user, update.device, update.conversation);
            // An ack that moved it on meanwhile is written next time.
            if pending.get(&key).is_some_and(|&seq| seq <= update.seq) {
                pending.remove(&key);
            }
        }
    }

    /// The position noted but not yet written, if any.
    pub fn pending(&self, user: &UserId, device: &DeviceId, conversation: &ConversationId) -> Option<u64> {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.get(&(user.clone(), device.clone(), conversation.clone())).copied()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use async_trait::async_trait;
    use tokio::sync::Notify;

    use super::*;
    use crate::store::StoreError;
    use crate::testkit::{conversation_id, device_id, user_id};

    /// A cursor store whose writes land only when let through, and fail when told to.
    #[derive(Default)]
    struct GatedStore {
        gate: Notify,
        fail: AtomicBool,
        written: Mutex<Vec<u64>>,
    }

    #[async_trait]
    impl CursorStore for GatedStore {
        async fn advance_cursors(&self, updates: &[CursorUpdate]) -> Result<(), StoreError> {
            self.gate.notified().await;
            if self.fail.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable("down".into()));
            }
            self.written.lock().unwrap_or_else(|p| p.into_inner()).extend(updates.iter().map(|u| u.seq));
            Ok(())
        }

        async fn cursors(&self, _: &UserId, _: &DeviceId) -> Result<Vec<(ConversationId, u64)>, StoreError> {
            Ok(Vec::new())
        }
    }

    fn pending_of(buffer: &CursorBuffer) -> Option<u64> {
        buffer.pending(&user_id("bob"), &device_id("phone"), &conversation_id("dm:alice:bob"))
    }

    fn ack(buffer: &CursorBuffer, seq: u64) {
        buffer.record(&user_id("bob"), &device_id("phone"), &conversation_id("dm:alice:bob"), seq);
    }

    /// A reconnecting device's backfill asks `pending` while a flush is writing: the
    /// position must be there or in storage, never in neither.
    #[tokio::test]
    async fn a_position_stays_pending_until_its_write_has_landed() {
        let (buffer, store) = (Arc::new(CursorBuffer::default()), Arc::new(GatedStore::default()));
        ack(&buffer, 4);
        let flush = tokio::spawn({
            let (buffer, store) = (Arc::clone(&buffer), Arc::clone(&store));
            async move { buffer.flush(store.as_ref()).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(pending_of(&buffer), Some(4), "still pending while it is being written");
        ack(&buffer, 6); // acked on meanwhile
        store.gate.notify_one();
        flush.await.expect("flush");
        assert_eq!(*store.written.lock().unwrap_or_else(|p| p.into_inner()), [4]);
        assert_eq!(pending_of(&buffer), Some(6), "the newer position waits for the next flush");

        let flush = tokio::spawn({
            let (buffer, store) = (Arc::clone(&buffer), Arc::clone(&store));
            async move { buffer.flush(store.as_ref()).await }
        });
        store.gate.notify_one();
        flush.await.expect("flush");
        assert_eq!(pending_of(&buffer), None, "written: nothing pending");
    }

    #[tokio::test]
    async fn a_failed_write_keeps_the_position_for_the_next_flush() {
        let (buffer, store) = (CursorBuffer::default(), GatedStore::default());
        ack(&buffer, 3);
        store.fail.store(true, Ordering::SeqCst);
        store.gate.notify_one();
        buffer.flush(&store).await;
        assert_eq!(pending_of(&buffer), Some(3));

        store.fail.store(false, Ordering::SeqCst);
        store.gate.notify_one();
        buffer.flush(&store).await;
        assert_eq!(*store.written.lock().unwrap_or_else(|p| p.into_inner()), [3]);
        assert_eq!(pending_of(&buffer), None);
    }
}
