//! What the soak's tasks share: who is where (the user each client slot is, online or
//! not), the groups created so far, the rooms of the moment, new names as they are needed,
//! and the traffic counters.
//!
//! Invariant: the soak only remembers a bounded recent past (the last groups, one user per
//! slot, the rooms of the current period), so the server sees users, groups and rooms keep
//! appearing and old ones go quiet: per-user and per-conversation state on the server is
//! created all the time and must be forgotten as fast.

use std::{
    collections::VecDeque,
    sync::{
        Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::ids::random_tag;

/// Groups the soak keeps sending to; older ones go quiet.
const RECENT_GROUPS: usize = 40;

/// One group the soak created, with the members it believes it has.
#[derive(Debug, Clone)]
pub(super) struct Group {
    /// The id, without `grp:`.
    pub id: String,
    /// Its members as of the last change the soak made.
    pub members: Vec<String>,
}

/// A client slot's identity: a user and one of its devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Identity {
    /// The user id.
    pub user: String,
    /// The device id.
    pub device: String,
}

/// One client slot.
#[derive(Debug)]
struct Slot {
    identity: Identity,
    online: bool,
    /// When the slot's user was made.
    born: Instant,
}

/// The traffic counters, shared by every task.
#[derive(Debug, Default)]
pub struct Counters {
    /// Successful logins.
    pub connects: AtomicU64,
    /// Connection or login attempts that failed.
    pub connect_failures: AtomicU64,
    /// Connections the server closed or lost unexpectedly.
    pub lost: AtomicU64,
    /// Connections ended by churn (a client's lifetime was over).
    pub churned: AtomicU64,
    /// Connections dropped by a reconnect storm.
    pub storm_drops: AtomicU64,
    /// Users that appeared after the start.
    pub new_users: AtomicU64,
    /// Devices that appeared after the start (for users already seen).
    pub new_devices: AtomicU64,
    /// `send` frames written.
    pub sent: AtomicU64,
    /// `send_ack` OK or DUPLICATE.
    pub acked: AtomicU64,
    /// `send_ack` REJECTED (room pacing, a group member just removed).
    pub rejected: AtomicU64,
    /// `send_ack` RETRY.
    pub retried: AtomicU64,
    /// `deliver` frames received.
    pub delivered: AtomicU64,
    /// `sync_reply`, `history_reply` and `subscribed` answers.
    pub pulls: AtomicU64,
    /// `error` frames received.
    pub errors: AtomicU64,
    /// Announcements accepted (202/200).
    pub announced: AtomicU64,
    /// Announcements paced (429).
    pub announce_paced: AtomicU64,
    /// Groups created.
    pub groups: AtomicU64,
    /// Member changes (PUT/DELETE) answered 204.
    pub member_changes: AtomicU64,
    /// HTTP calls answered with an unexpected status, or not at all.
    pub http_failures: AtomicU64,
}

impl Counters {
    /// Adds one to `counter`.
    pub(super) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The current value of `counter`.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The shared state of one soak run.
#[derive(Debug)]
pub(super) struct World {
    /// Prefix of every name of this run, so runs against one server do not mix.
    pub prefix: String,
    /// Per slot: its current identity, whether it is connected, and when its user was new.
    slots: Mutex<Vec<Slot>>,
    /// The last groups created, newest last.
    groups: Mutex<VecDeque<Group>>,
    /// Next number for a new user, device or group name.
    next_name: AtomicU64,
    /// How long one generation of rooms lasts before new names replace it.
    room_period: Duration,
    /// Rooms per generation.
    rooms: usize,
    /// The counters.
    pub counters: Counters,
}

impl World {
    /// A world of `slots` clients, user `i` in slot `i`, each with device `d0`.
    pub fn new(slots: usize, rooms: usize, room_period: Duration) -> Self {
        let prefix = format!("soak{}", random_tag(6));
        let now = Instant::now();
        let count = slots;
        let slots = (0..count).map(|i| Slot {
            identity: Identity { user: format!("{prefix}-u{i}"), device: "d0".into() },
            online: false,
            born: now,
        });
        Self {
            slots: Mutex::new(slots.collect()),
            groups: Mutex::new(VecDeque::new()),
            next_name: AtomicU64::new(count as u64),
            room_period,
            rooms: rooms.max(1),
            counters: Counters::default(),
            prefix,
        }
    }

    fn slots(&self) -> MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn groups(&self) -> MutexGuard<'_, VecDeque<Group>> {
        self.groups.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn next_number(&self) -> u64 {
        self.next_name.fetch_add(1, Ordering::Relaxed)
    }

    /// The identity slot `slot` has now.
    pub fn identity(&self, slot: usize) -> Identity {
        self.slots()[slot].identity.clone()
    }

    /// How long ago slot `slot`'s user was made.
    pub fn user_age(&self, slot: usize) -> Duration {
        self.slots()[slot].born.elapsed()
    }

    /// Marks slot `slot` connected or not.
    pub fn set_online(&self, slot: usize, online: bool) {
        self.slots()[slot].online = online;
    }

    /// How many slots are connected.
    pub fn online(&self) -> usize {
        self.slots().iter().filter(|slot| slot.online).count()
    }

    /// Gives slot `slot` a brand-new user (with device `d0`).
    pub fn new_user(&self, slot: usize) {
        let user = format!("{}-u{}", self.prefix, self.next_number());
        self.slots()[slot] =
            Slot { identity: Identity { user, device: "d0".into() }, online: false, born: Instant::now() };
        Counters::bump(&self.counters.new_users);
    }

    /// Gives slot `slot` a new device of the user it has.
    pub fn new_device(&self, slot: usize) {
        let device = format!("d{}", self.next_number());
        self.slots()[slot].identity.device = device;
        Counters::bump(&self.counters.new_devices);
    }

    /// A random user among the slots' current ones other than `me` (online or not: a
    /// message to an offline user waits for its backfill).
    pub fn random_peer(&self, me: &str) -> Option<String> {
        let slots = self.slots();
        let at = rand::random_range(0..slots.len());
        // The slot after a slot of `me` is another user's unless `me` holds every slot.
        (0..slots.len()).map(|step| &slots[(at + step) % slots.len()].identity.user).find(|user| *user != me).cloned()
    }

    /// `count` distinct current users, for a new group's members.
    pub fn random_users(&self, count: usize) -> Vec<String> {
        let slots = self.slots();
        let mut users: Vec<String> = Vec::with_capacity(count);
        for _ in 0..count * 3 {
            if users.len() == count {
                break;
            }
            let user = &slots[rand::random_range(0..slots.len())].identity.user;
            if !users.contains(user) {
                users.push(user.clone());
            }
        }
        users
    }

    /// A fresh group id.
    pub fn new_group_id(&self) -> String {
        format!("{}-g{}", self.prefix, self.next_number())
    }

    /// Remembers a created group; the oldest beyond [`RECENT_GROUPS`] is forgotten.
    pub fn add_group(&self, group: Group) {
        let mut groups = self.groups();
        groups.push_back(group);
        while groups.len() > RECENT_GROUPS {
            groups.pop_front();
        }
    }

    /// A random recent group.
    pub fn random_group(&self) -> Option<Group> {
        let groups = self.groups();
        (!groups.is_empty()).then(|| groups[rand::random_range(0..groups.len())].clone())
    }

    /// Records a member change the server accepted.
    pub fn change_member(&self, id: &str, user: &str, added: bool) {
        if let Some(group) = self.groups().iter_mut().find(|group| group.id == id) {
            group.members.retain(|member| member != user);
            if added {
                group.members.push(user.to_owned());
            }
        }
    }

    /// The conversation of a random recent group `user` belongs to.
    pub fn group_of(&self, user: &str) -> Option<String> {
        let groups = self.groups();
        let mine: Vec<&Group> = groups.iter().filter(|group| group.members.iter().any(|m| m == user)).collect();
        (!mine.is_empty()).then(|| format!("grp:{}", mine[rand::random_range(0..mine.len())].id))
    }

    /// The room names of the generation running `elapsed` into the soak: a new set every
    /// room period, so rooms keep appearing and old ones go quiet.
    pub fn rooms_at(&self, elapsed: Duration) -> Vec<String> {
        let generation = elapsed.as_millis() / self.room_period.as_millis().max(1);
        (0..self.rooms).map(|k| format!("{}-r{generation}-{k}", self.prefix)).collect()
    }

    /// One random room of the generation running `elapsed` into the soak (its name without
    /// the `room:` prefix).
    pub fn random_room(&self, elapsed: Duration) -> String {
        let rooms = self.rooms_at(elapsed);
        rooms[rand::random_range(0..rooms.len())].clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_bounded_and_track_members() {
        let world = World::new(4, 2, Duration::from_secs(60));
        for n in 0..RECENT_GROUPS + 5 {
            world.add_group(Group { id: format!("g{n}"), members: vec!["a".into(), "b".into()] });
        }
        assert_eq!(world.groups().len(), RECENT_GROUPS);
        assert_eq!(world.groups()[0].id, "g5");
        world.change_member("g5", "c", true);
        world.change_member("g5", "a", false);
        assert_eq!(world.groups()[0].members, ["b", "c"]);
        assert_eq!(world.group_of("nobody"), None);
    }

    #[test]
    fn rooms_change_every_period_and_identities_every_churn() {
        let world = World::new(3, 2, Duration::from_secs(60));
        assert_eq!(world.rooms_at(Duration::from_secs(10)), world.rooms_at(Duration::from_secs(59)));
        assert_ne!(world.rooms_at(Duration::from_secs(59)), world.rooms_at(Duration::from_secs(61)));
        let first = world.identity(1);
        world.new_device(1);
        assert_eq!(world.identity(1).user, first.user);
        assert_ne!(world.identity(1).device, first.device);
        world.new_user(1);
        assert_ne!(world.identity(1).user, first.user);
        assert!(world.random_peer(&world.identity(0).user).is_some());
    }
}
