//! Who may send to and read a conversation, and who receives it; and the group changes of
//! the HTTP API, which go through here so the cache never serves a stale member list.
//!
//! `dm:` members are the two users it names; `grp:` members are stored (cached here and
//! invalidated when they change); `room:` recipients are whoever is subscribed now, and
//! only a subscribed connection may send to a room.

use std::sync::Arc;

use dashmap::DashMap;

use crate::model::{ConnectionId, ConversationId, ConversationKind, GroupId, UserId};
use crate::routing::rooms::Rooms;
use crate::store::{GroupStore, StoreError};

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

/// Why a group could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum GroupChange {
    #[error("group {0} already exists")]
    Exists(GroupId),
    #[error("there is no group {0}")]
    NoSuchGroup(GroupId),
    #[error("{user} is not a member of grp:{group}")]
    NotMember { group: GroupId, user: UserId },
    #[error("storage unavailable: {0}")]
    Store(StoreError),
}

/// Membership answers, with group members cached.
pub struct Membership {
    store: Arc<dyn GroupStore>,
    rooms: Arc<Rooms>,
    groups: DashMap<GroupId, Arc<Vec<UserId>>>,
}

impl Membership {
    pub fn new(store: Arc<dyn GroupStore>, rooms: Arc<Rooms>) -> Self {
        Self { store, rooms, groups: DashMap::new() }
    }

    /// Creates `group` with `members`.
    ///
    /// # Errors
    /// [`GroupChange::Exists`] when the id is taken, [`GroupChange::Store`] when storage fails.
    pub async fn create_group(&self, group: &GroupId, members: &[UserId], now_ms: u64) -> Result<(), GroupChange> {
        let created = self.store.create_group(group, members, now_ms).await;
        self.groups.remove(group);
        created.map_err(|error| match error {
            StoreError::GroupExists(_) => GroupChange::Exists(group.clone()),
            other => GroupChange::Store(other),
        })
    }

    /// Adds `user` to `group` (already a member: nothing changes).
    ///
    /// # Errors
    /// [`GroupChange::NoSuchGroup`], or [`GroupChange::Store`] when storage fails.
    pub async fn add_member(&self, group: &GroupId, user: &UserId, now_ms: u64) -> Result<(), GroupChange> {
        let added = self.store.add_member(group, user, now_ms).await;
        self.groups.remove(group);
        added.map_err(|error| match error {
            StoreError::NoSuchGroup(_) => GroupChange::NoSuchGroup(group.clone()),
            other => GroupChange::Store(other),
        })
    }

    /// Removes `user` from `group`.
    ///
    /// # Errors
    /// [`GroupChange::NotMember`] when `user` was not a member, [`GroupChange::Store`] when
    /// storage fails.
    pub async fn remove_member(&self, group: &GroupId, user: &UserId) -> Result<(), GroupChange> {
        let removed = self.store.remove_member(group, user).await;
        self.groups.remove(group);
        match removed {
            Ok(true) => Ok(()),
            Ok(false) => Err(GroupChange::NotMember { group: group.clone(), user: user.clone() }),
            Err(error) => Err(GroupChange::Store(error)),
        }
    }

    /// The stored members of a group; `None` when there is no such group.
    ///
    /// # Errors
    /// [`StoreError`] when storage fails.
    pub async fn group_members(&self, group: &GroupId) -> Result<Option<Arc<Vec<UserId>>>, StoreError> {
        if let Some(members) = self.groups.get(group) {
            return Ok(Some(Arc::clone(&members)));
        }
        let Some(members) = self.store.group_members(group).await? else { return Ok(None) };
        let members = Arc::new(members);
        self.groups.insert(group.clone(), Arc::clone(&members));
        Ok(Some(members))
    }

    /// Checks that `user` may send to `conversation`: a member, and for a room, subscribed on
    /// `connection` of this node (`None`: the sender's node checked that before forwarding).
    ///
    /// # Errors
    /// [`Refusal`] naming the rule broken.
    pub async fn check_send(
        &self,
        user: &UserId,
        connection: Option<ConnectionId>,
        conversation: &ConversationId,
    ) -> Result<(), Refusal> {
        if let Some(connection) = connection
            && matches!(conversation.kind(), ConversationKind::Room(_))
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
