//! Where the client keeps the last seq it handled in each conversation, so that a restarted
//! client resumes instead of replaying history: rooms are re-joined from it (`since_seq`),
//! and messages at or below it are not emitted again.
//!
//! The interface is synchronous on purpose: it is read on the receive path. A store backed
//! by something slow should load its values before the client starts and write behind.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The last handled seq per key (`<user>/<device>/<conversation>`).
pub trait SeqStore: Send + Sync {
    /// The stored seq for `key`, if any.
    fn get(&self, key: &str) -> Option<u64>;
    /// Stores `seq` for `key`; called with increasing seqs per key.
    fn set(&self, key: &str, seq: u64);
}

/// Keeps seqs in memory: shared by the clients of one process that hold a clone, lost on exit.
#[derive(Debug, Clone, Default)]
pub struct MemorySeqStore {
    seqs: Arc<Mutex<HashMap<String, u64>>>,
}

impl MemorySeqStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl SeqStore for MemorySeqStore {
    fn get(&self, key: &str) -> Option<u64> {
        // A poisoned lock only means a panic elsewhere; the map itself is still whole.
        self.seqs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(key).copied()
    }

    fn set(&self, key: &str, seq: u64) {
        self.seqs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key.to_owned(), seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_their_seqs() {
        let store = MemorySeqStore::new();
        let other = store.clone();
        assert_eq!(store.get("alice/phone/dm:alice:bob"), None);
        other.set("alice/phone/dm:alice:bob", 7);
        assert_eq!(store.get("alice/phone/dm:alice:bob"), Some(7));
    }
}
