//! Who may send to and read a conversation, and who receives it; and the group changes of
//! the HTTP API, which go through here so the cache never serves a stale member list.
//!
//! `dm:` members are the two users it names; `grp:` members are stored (cached here and
//! invalidated when they change); `room:` recipients are whoever is subscribed now, and
//! only a subscribed connection may send to a room.
//!
//! A change made through this node is announced to every other node of a cluster over the
//! bus, which drop their cached list before the change is answered: a member removed on
//! one node can send through no other. A node out of reach at that moment lets its list
//! expire (`cache_ttl`).
//!
//! The cache is bounded: at most [`MAX_CACHED_MEMBERS`] members over all its lists, and a
//! list unused for the idle time (`seq.evict_idle`) is forgotten, so a node that sees a
//! stream of new groups keeps only the ones in use.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use moka::sync::Cache;

use crate::maps::Keyed;
use crate::model::{ConnectionId, ConversationId, ConversationKind, GroupId, UserId};
use crate::routing::bus::NodeBus;
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
    #[error("grp:{group} would have more than {max} members, the most a group may hold (api.max_group_members)")]
    Full { group: GroupId, max: usize },
    #[error("storage unavailable: {0}")]
    Store(StoreError),
}

/// Membership answers, with group members cached.
pub struct Membership {
    store: Arc<dyn GroupStore>,
    rooms: Arc<Rooms>,
    /// Where changes are announced to the other nodes.
    bus: Arc<dyn NodeBus>,
    /// Member lists read from the store; each weighs its member count.
    groups: Cache<GroupId, Arc<Vec<UserId>>, Keyed>,
    /// Bumped by every drop of a cached list: a read that started before it must not
    /// cache what it read.
    generation: AtomicU64,
    /// Most members a group may hold.
    max_members: usize,
    /// Additions on this node one at a time, so two cannot both take the last place.
    /// (Nodes of a cluster adding to one group at the same instant may still pass the
    /// limit by one each.)
    adding: tokio::sync::Mutex<()>,
}

/// Most members held in the cache over all its lists (a list weighs its members, plus one).
pub const MAX_CACHED_MEMBERS: u64 = 1 << 20;

/// How long the group cache trusts a list, and when it forgets one.
#[derive(Clone, Copy, Debug)]
pub struct CachePolicy {
    /// How long a cached list is trusted (`None`: until a change drops it).
    pub ttl: Option<Duration>,
    /// A list unused this long is forgotten (zero: only the bound forgets lists).
    pub idle: Duration,
}

impl Membership {
    pub fn new(
        store: Arc<dyn GroupStore>,
        rooms: Arc<Rooms>,
        bus: Arc<dyn NodeBus>,
        cache: CachePolicy,
        max_members: usize,
    ) -> Self {
        let mut groups = Cache::builder().max_capacity(MAX_CACHED_MEMBERS).weigher(|_, members: &Arc<Vec<UserId>>| {
            u32::try_from(members.len()).unwrap_or(u32::MAX).saturating_add(1)
        });
        if let Some(ttl) = cache.ttl {
            groups = groups.time_to_live(ttl);
        }
        if !cache.idle.is_zero() {
            groups = groups.time_to_idle(cache.idle);
        }
        Self {
            store,
            rooms,
            bus,
            groups: groups.build_with_hasher(Keyed::default()),
            generation: AtomicU64::new(0),
            max_members,
            adding: tokio::sync::Mutex::new(()),
        }
    }

    /// Drops the cached member list of `group` (it changed, here or on another node).
    pub fn forget(&self, group: &GroupId) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.groups.invalidate(group);
    }

    /// How many member lists are cached. Does the cache's pending upkeep first: expired
    /// lists are counted (and held) until it runs, which on an idle node is never.
    pub fn cached_lists(&self) -> u64 {
        self.groups.run_pending_tasks();
        self.groups.entry_count()
    }

    /// After a change is stored: drops the list here, then on every other node.
    async fn changed(&self, group: &GroupId) {
        self.forget(group);
        self.bus.group_changed(group).await;
    }

    /// Creates `group` with `members`.
    ///
    /// # Errors
    /// [`GroupChange::Exists`] when the id is taken, [`GroupChange::Full`] for more members
    /// than a group may hold, [`GroupChange::Store`] when storage fails.
    pub async fn create_group(&self, group: &GroupId, members: &[UserId], now_ms: u64) -> Result<(), GroupChange> {
        if members.len() > self.max_members {
            return Err(GroupChange::Full { group: group.clone(), max: self.max_members });
        }
        let created = self.store.create_group(group, members, now_ms).await;
        // No node holds a list of a group that did not exist: nothing to announce.
        self.forget(group);
        created.map_err(|error| match error {
            StoreError::GroupExists(_) => GroupChange::Exists(group.clone()),
            other => GroupChange::Store(other),
        })
    }

    /// Adds `user` to `group` (already a member: nothing changes).
    ///
    /// # Errors
    /// [`GroupChange::NoSuchGroup`], [`GroupChange::Full`] when the group holds as many
    /// members as it may, or [`GroupChange::Store`] when storage fails.
    pub async fn add_member(&self, group: &GroupId, user: &UserId, now_ms: u64) -> Result<(), GroupChange> {
        let _one_at_a_time = self.adding.lock().await;
        match self.store.group_members(group).await {
            Ok(None) => return Err(GroupChange::NoSuchGroup(group.clone())),
            Ok(Some(members)) if members.len() >= self.max_members && !members.contains(user) => {
                return Err(GroupChange::Full { group: group.clone(), max: self.max_members });
            }
            Ok(Some(_)) => {}
            Err(error) => return Err(GroupChange::Store(error)),
        }
        let added = self.store.add_member(group, user, now_ms).await;
        self.changed(group).await;
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
        if !matches!(removed, Ok(false)) {
            self.changed(group).await;
        }
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
        if let Some(cached) = self.groups.get(group) {
            return Ok(Some(cached));
        }
        let generation = self.generation.load(Ordering::SeqCst);
        let Some(members) = self.store.group_members(group).await? else { return Ok(None) };
        let members = Arc::new(members);
        if self.generation.load(Ordering::SeqCst) == generation {
            self.groups.insert(group.clone(), Arc::clone(&members));
            // A change dropped the lists while this one went in: it may be older than it.
            if self.generation.load(Ordering::SeqCst) != generation {
                self.groups.invalidate(group);
            }
        }
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
