//! Who may send to and read a conversation, and who receives it.
//!
//! `dm:` members are the two users it names; `grp:` members are stored (cached here and
//! invalidated when the HTTP API changes them); `room:` recipients are whoever is
//! subscribed now, and only a subscribed connection may send to a room.

use std::sync::Arc;

use dashmap::DashMap;

use crate::model::{ConversationId, ConversationKind, GroupId, UserId};
use crate::routing::ConnectionId;
use crate::routing::rooms::Rooms;
use crate::store::{Database, StoreError};

/// Why a user may not send to a conversation (a `REJECTED` reason).
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("{user} is not a member of {conversation}")]
    NotMember { user: String, conversation: String },
    #[error("there is no group {0}")]
    NoSuchGroup(String),
    #[error("subscribe to {0} before sending to it")]
    NotSubscribed(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Membership answers, with group members cached.
pub struct Membership {
    database: Database,
    rooms: Arc<Rooms>,
    groups: DashMap<GroupId, Arc<Vec<UserId>>>,
}

impl Membership {
    pub fn new(database: Database, rooms: Arc<Rooms>) -> Self {
        Self { database, rooms, groups: DashMap::new() }
    }

    /// The stored members of a group; `None` when there is no such group.
    ///
    /// # Errors
    /// [`StoreError`] when storage fails.
    pub async fn group_members(&self, group: &GroupId) -> Result<Option<Arc<Vec<UserId>>>, StoreError> {
        if let Some(members) = self.groups.get(group) {
            return Ok(Some(Arc::clone(&members)));
        }
        let Some(names) = self.database.group_members(group).await? else { return Ok(None) };
        let members: Vec<UserId> = names.iter().filter_map(|name| UserId::parse(name).ok()).collect();
        let members = Arc::new(members);
        self.groups.insert(group.clone(), Arc::clone(&members));
        Ok(Some(members))
    }

    /// Forgets the cached members of `group` (after the API changed them).
    pub fn invalidate(&self, group: &GroupId) {
        self.groups.remove(group);
    }

    /// Checks that `user` (on `connection`) may send to `conversation`: a member, and for
    /// a room, subscribed on this connection.
    ///
    /// # Errors
    /// [`Refusal`] naming the rule broken.
    pub async fn check_send(
        &self,
        user: &UserId,
        connection: ConnectionId,
        conversation: &ConversationId,
    ) -> Result<(), Refusal> {
        if matches!(conversation.kind(), ConversationKind::Room(_))
            && !self.rooms.is_subscribed(conversation, connection)
        {
            return Err(Refusal::NotSubscribed(conversation.to_string()));
        }
        self.check_read(user, conversation).await
    }

    /// Checks that `user` may read `conversation`'s history: a member (rooms are public).
    ///
    /// # Errors
    /// [`Refusal`] naming the rule broken.
    pub async fn check_read(&self, user: &UserId, conversation: &ConversationId) -> Result<(), Refusal> {
        match conversation.kind() {
            ConversationKind::Direct(a, b) if &a == user || &b == user => Ok(()),
            ConversationKind::Direct(..) => Err(not_member(user, conversation)),
            ConversationKind::Group(group) => match self.group_members(&group).await? {
                None => Err(Refusal::NoSuchGroup(group.to_string())),
                Some(members) if members.contains(user) => Ok(()),
                Some(_) => Err(not_member(user, conversation)),
            },
            ConversationKind::Room(_) => Ok(()),
        }
    }
}

fn not_member(user: &UserId, conversation: &ConversationId) -> Refusal {
    Refusal::NotMember { user: user.to_string(), conversation: conversation.to_string() }
}
