//! A batch of messages on its way into storage: what is submitted ([`Submission`]) and what
//! a backend's write of the batch reports back ([`Written`]), before duplicates are looked
//! up. The generic insert path (`messages.rs`) and PostgreSQL's one-statement insert
//! (`postgres.rs`) both speak these.

use super::seq_lease::Fence;
use crate::maps::{HashMap, HashSet};
use crate::model::Message;

/// A message to store, with the fence of the lease its seq came from.
#[derive(Debug, Clone)]
pub struct Submission {
    /// The message, ids and seq set.
    pub message: Message,
    /// `Some`: store it only while its conversation's owner is still this fence's (server
    /// backends; SQLite does not check). `None`: store it unchecked.
    pub fence: Option<Fence>,
}

impl From<Message> for Submission {
    /// An unfenced message.
    fn from(message: Message) -> Self {
        Self { message, fence: None }
    }
}

/// What a batch's write did, before duplicates are looked up.
pub(super) struct Written {
    /// Ids of the rows stored by it.
    pub inserted: HashSet<i64>,
    /// Rows refused by the fence check, by their place in the batch, with the owner found.
    pub fenced: HashMap<usize, Option<Fence>>,
    /// SQLite: the commit's number, to make durable.
    pub sync: Option<u64>,
}
