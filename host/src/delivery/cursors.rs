//! Coalesced cursor writes: acks update memory at once and reach storage in one batch per
//! flush interval — never one transaction per ack.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::model::{ConversationId, DeviceId, UserId};
use crate::store::CursorStore;
use crate::store::cursors::CursorUpdate;

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
    pub async fn flush(&self, store: &dyn CursorStore) {
        let batch: Vec<CursorUpdate> = {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            pending
                .drain()
                .map(|((user, device, conversation), seq)| CursorUpdate { user, device, conversation, seq })
                .collect()
        };
        if batch.is_empty() {
            return;
        }
        if let Err(error) = store.advance_cursors(&batch).await {
            tracing::warn!(%error, cursors = batch.len(), "writing cursors failed; will retry");
            for update in batch {
                self.record(&update.user, &update.device, &update.conversation, update.seq);
            }
        }
    }

    /// The position noted but not yet written, if any.
    pub fn pending(&self, user: &UserId, device: &DeviceId, conversation: &ConversationId) -> Option<u64> {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.get(&(user.clone(), device.clone(), conversation.clone())).copied()
    }
}
