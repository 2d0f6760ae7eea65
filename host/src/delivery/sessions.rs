//! The sessions of this node: open ones by connection id and by user, dropped ones parked
//! by user.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dashmap::DashMap;

use super::session::Session;
use crate::maps::shrink_if_sparse;
use crate::model::{ConnectionId, DeviceId, UserId};

/// The sessions of this node's connections, by id and by user, and the dropped ones parked
/// for their device's return (by user).
#[derive(Default)]
pub struct Sessions {
    by_id: DashMap<ConnectionId, Arc<Session>>,
    /// The open connections of each user: a delivery handed over by another node finds its
    /// devices here without asking the route table.
    by_user: DashMap<UserId, Vec<ConnectionId>>,
    parked: DashMap<UserId, Vec<Arc<Session>>>,
    /// How many are parked (so fan-out skips the lookup when none is).
    parked_count: AtomicUsize,
}

impl Sessions {
    pub fn insert(&self, connection: Arc<Session>) {
        self.by_user.entry(connection.user.clone()).or_default().push(connection.id);
        self.by_id.insert(connection.id, connection);
    }

    pub fn remove(&self, id: ConnectionId) {
        let Some((_, session)) = self.by_id.remove(&id) else { return };
        if let Some(mut ids) = self.by_user.get_mut(&session.user) {
            ids.retain(|&other| other != id);
            let now_empty = ids.is_empty();
            drop(ids);
            if now_empty {
                self.by_user.remove_if(&session.user, |_, ids| ids.is_empty());
            }
        }
    }

    /// The open sessions of `user` on this node.
    pub fn of_user(&self, user: &UserId) -> Vec<Arc<Session>> {
        let Some(ids) = self.by_user.get(user) else { return Vec::new() };
        ids.iter().filter_map(|id| self.get(*id)).collect()
    }

    pub fn get(&self, id: ConnectionId) -> Option<Arc<Session>> {
        self.by_id.get(&id).map(|c| Arc::clone(&c))
    }

    /// Every open session.
    pub fn all(&self) -> Vec<Arc<Session>> {
        self.by_id.iter().map(|entry| Arc::clone(entry.value())).collect()
    }

    /// How many are open.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Keeps a dropped connection (already [`Session::park`]ed) for its device's return.
    pub fn park(&self, connection: Arc<Session>) {
        self.parked.entry(connection.user.clone()).or_default().push(connection);
        self.parked_count.fetch_add(1, Ordering::SeqCst);
    }

    /// Takes the parked connection of `user`'s `device`, if there is one.
    pub fn unpark(&self, user: &UserId, device: &DeviceId) -> Option<Arc<Session>> {
        self.take_parked(user, |parked| parked.device == *device)
    }

    /// Forgets `connection` if it is still parked (its grace period is over); returns
    /// whether it was.
    pub fn expire(&self, connection: &Arc<Session>) -> bool {
        self.take_parked(&connection.user, |parked| Arc::ptr_eq(parked, connection)).is_some()
    }

    fn take_parked(&self, user: &UserId, which: impl Fn(&Arc<Session>) -> bool) -> Option<Arc<Session>> {
        let mut devices = self.parked.get_mut(user)?;
        let taken = devices.iter().position(which).map(|at| devices.swap_remove(at));
        let now_empty = devices.is_empty();
        drop(devices);
        if now_empty {
            self.parked.remove_if(user, |_, devices| devices.is_empty());
        }
        if taken.is_some() {
            self.parked_count.fetch_sub(1, Ordering::SeqCst);
        }
        taken
    }

    /// The parked connections of `user` (fan-out notes what they are owed).
    pub fn parked_of(&self, user: &UserId) -> Vec<Arc<Session>> {
        if self.parked_count.load(Ordering::SeqCst) == 0 {
            return Vec::new();
        }
        self.parked.get(user).map(|devices| devices.clone()).unwrap_or_default()
    }

    /// How many are parked.
    pub fn parked_len(&self) -> usize {
        self.parked_count.load(Ordering::SeqCst)
    }

    /// Gives back the room the maps grew to for a crowd that has left.
    pub fn shrink_if_sparse(&self) {
        shrink_if_sparse(&self.by_id);
        shrink_if_sparse(&self.by_user);
        shrink_if_sparse(&self.parked);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{RecordingOutbox, device_id, user_id};

    fn session(id: u64, user: &str, device: &str) -> Arc<Session> {
        Arc::new(Session::new(ConnectionId(id), user_id(user), device_id(device), RecordingOutbox::new() as _))
    }

    fn ids_of(sessions: &Sessions, user: &str) -> Vec<u64> {
        let mut ids: Vec<u64> = sessions.of_user(&user_id(user)).iter().map(|session| session.id.0).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn a_users_open_sessions_are_found_until_each_is_removed() {
        let sessions = Sessions::default();
        sessions.insert(session(1, "bob", "phone"));
        sessions.insert(session(2, "bob", "tablet"));
        sessions.insert(session(3, "carol", "phone"));
        assert_eq!(ids_of(&sessions, "bob"), [1, 2]);
        assert_eq!(ids_of(&sessions, "carol"), [3]);

        sessions.remove(ConnectionId(1));
        assert_eq!(ids_of(&sessions, "bob"), [2]);
        sessions.remove(ConnectionId(2));
        sessions.remove(ConnectionId(2));
        sessions.remove(ConnectionId(9));
        assert!(ids_of(&sessions, "bob").is_empty());
        assert!(!sessions.by_user.contains_key(&user_id("bob")), "no empty entry is left behind");
        assert_eq!(ids_of(&sessions, "carol"), [3]);
    }
}
