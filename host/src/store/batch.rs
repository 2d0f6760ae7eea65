//! A batch of messages on its way into storage: what is submitted ([`Submission`]), what
//! a backend's write of the batch reports back ([`Written`]) before duplicates are looked
//! up, and the statements the generic insert path (`messages.rs`) and SQLite's
//! (`sqlite.rs`) share. PostgreSQL's one-statement insert (`postgres.rs`) speaks the first two.

use sqlx::{Encode, QueryBuilder, Type};

use super::seq_lease::Fence;
use super::{Sql, signed};
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

/// A multi-row insert of `messages` in the dialect `sql`: its head, one row of nine bound
/// values a message, its tail.
pub(super) fn insert_statement<'m, DB>(sql: &Sql, messages: impl IntoIterator<Item = &'m Message>) -> QueryBuilder<DB>
where
    DB: sqlx::Database,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
    for<'t> &'t str: Encode<'t, DB> + Type<DB>,
    for<'t> &'t [u8]: Encode<'t, DB> + Type<DB>,
{
    let mut insert = QueryBuilder::new(sql.insert_messages);
    insert.push_values(messages, |mut row, m| {
        row.push_bind(signed(m.id))
            .push_bind(m.conversation.as_str())
            .push_bind(signed(m.seq))
            .push_bind(m.sender.as_str())
            .push_bind(m.sender_device.as_str())
            .push_bind(m.client_msg_id.as_str())
            .push_bind(i64::from(m.kind))
            .push_bind(m.body.as_ref())
            .push_bind(signed(m.sent_at_ms));
    });
    insert.push(sql.insert_messages_tail);
    insert
}

/// A query for which of `ids` are stored in `messages`.
pub(super) fn stored_ids<DB>(ids: impl IntoIterator<Item = u64>) -> QueryBuilder<DB>
where
    DB: sqlx::Database,
    i64: for<'t> Encode<'t, DB> + Type<DB>,
{
    let mut read_back = QueryBuilder::new("SELECT id FROM messages WHERE id IN (");
    let mut list = read_back.separated(", ");
    for id in ids {
        list.push_bind(signed(id));
    }
    read_back.push(")");
    read_back
}
