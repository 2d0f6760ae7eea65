//! The sessions of this node: open ones by connection id and by user, dropped ones parked
//! by user.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::session::Session;
use crate::maps::{DashMap, shrink_if_sparse};
use crate::model::{ConnectionId, DeviceId, UserId};

/// The sessions of this node's connections, by id and by user, and the dropped ones parked
/// for their device's return (by user).
#[derive(Default)]
pub struct Sessions {
    by_id: DashMap<ConnectionId, Arc<Session>>,
    /// Each user's open and parked sessions, in one entry: a device's hand-over from its
    /// dropped connection to its new one (park, remove, insert, unpark) is never seen
    /// half-done by [`Sessions::here`], whose one read finds the old session, the new one
    /// or both.
    by_user: DashMap<UserId, UserSessions>,
    /// How many are parked.
    parked_count: AtomicUsize,
}

/// One user's sessions on this node.
#[derive(Default)]
struct UserSessions {
    open: Vec<Arc<Session>>,
    parked: Vec<Arc<Session>>,
}

impl UserSessions {
    fn is_empty(&self) -> bool {
        self.open.is_empty() && self.parked.is_empty()
    }
}

impl Sessions {
    pub fn insert(&self, connection: Arc<Session>) {
        self.by_user.entry(connection.user.clone()).or_default().open.push(Arc::clone(&connection));
        self.by_id.insert(connection.id, connection);
    }

    pub fn remove(&self, id: ConnectionId) {
        let Some((_, session)) = self.by_id.remove(&id) else { return };
        self.change_user(&session.user, |sessions| sessions.open.retain(|open| open.id != id));
    }

    /// Every session of `user` on this node, open or parked, as one read: a message offered
    /// to each reaches a device that is reconnecting by its old session or its new one.
    pub fn here(&self, user: &UserId) -> Vec<Arc<Session>> {
        let Some(sessions) = self.by_user.get(user) else { return Vec::new() };
        sessions.open.iter().chain(&sessions.parked).cloned().collect()
    }

    /// Whether `connection` of `user` is here, open or parked.
    pub fn holds(&self, user: &UserId, connection: ConnectionId) -> bool {
        self.by_id.contains_key(&connection)
            || self.by_user.get(user).is_some_and(|sessions| sessions.parked.iter().any(|s| s.id == connection))
    }

    /// The session of `connection` of `user`, open or parked.
    pub fn find(&self, user: &UserId, connection: ConnectionId) -> Option<Arc<Session>> {
        self.get(connection).or_else(|| {
            let sessions = self.by_user.get(user)?;
            sessions.parked.iter().find(|session| session.id == connection).cloned()
        })
    }

    pub fn get(&self, id: ConnectionId) -> Option<Arc<Session>> {
        self.by_id.get(&id).map(|c| Arc::clone(&c))
    }

    /// Every session, open or parked.
    pub fn every(&self) -> Vec<Arc<Session>> {
        let mut every = Vec::with_capacity(self.by_id.len() + self.parked_len());
        for sessions in self.by_user.iter() {
            every.extend(sessions.open.iter().chain(&sessions.parked).cloned());
        }
        every
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
        self.by_user.entry(connection.user.clone()).or_default().parked.push(connection);
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
        let taken = self.change_user(user, |sessions| {
            sessions.parked.iter().position(which).map(|at| sessions.parked.swap_remove(at))
        })?;
        if taken.is_some() {
            self.parked_count.fetch_sub(1, Ordering::SeqCst);
        }
        taken
    }

    /// Applies `change` to `user`'s entry, if there is one, and drops the entry once empty.
    fn change_user<T>(&self, user: &UserId, change: impl FnOnce(&mut UserSessions) -> T) -> Option<T> {
        let mut sessions = self.by_user.get_mut(user)?;
        let out = change(&mut sessions);
        let now_empty = sessions.is_empty();
        drop(sessions);
        if now_empty {
            self.by_user.remove_if(user, |_, sessions| sessions.is_empty());
        }
        Some(out)
    }

    /// How many are parked.
    pub fn parked_len(&self) -> usize {
        self.parked_count.load(Ordering::SeqCst)
    }

    /// Gives back the room the maps grew to for a crowd that has left.
    pub fn shrink_if_sparse(&self) {
        shrink_if_sparse(&self.by_id);
        shrink_if_sparse(&self.by_user);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{RecordingOutbox, device_id, user_id};

    fn session(id: u64, user: &str, device: &str) -> Arc<Session> {
        Arc::new(Session::new(ConnectionId(id), user_id(user), device_id(device), RecordingOutbox::new() as _))
    }

    /// The ids of `user`'s sessions here, open and parked, sorted.
    fn ids_of(sessions: &Sessions, user: &str) -> Vec<u64> {
        let mut ids: Vec<u64> = sessions.here(&user_id(user)).iter().map(|session| session.id.0).collect();
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

    /// A device's hand-over from its dropped session to its new one: every step leaves
    /// at least one of them in `here`, and nothing behind once both are gone.
    #[test]
    fn a_reconnecting_device_always_has_a_session_here() {
        let sessions = Sessions::default();
        let old = session(1, "bob", "phone");
        sessions.insert(Arc::clone(&old));
        let here = |sessions: &Sessions| ids_of(sessions, "bob");
        // The gateway's detach: parked before its removal.
        sessions.park(Arc::clone(&old));
        assert_eq!(here(&sessions), [1, 1], "open and parked at once: offered twice, owed once");
        sessions.remove(old.id);
        assert_eq!(here(&sessions), [1]);
        assert!(sessions.get(old.id).is_none() && sessions.is_empty(), "parked is not open");
        // The new connection: registered before it takes over from the parked one.
        sessions.insert(session(2, "bob", "phone"));
        assert_eq!(here(&sessions), [1, 2]);
        assert!(sessions.unpark(&user_id("bob"), &device_id("phone")).is_some_and(|s| Arc::ptr_eq(&s, &old)));
        assert_eq!(here(&sessions), [2]);
        assert_eq!(sessions.parked_len(), 0);
        sessions.remove(ConnectionId(2));
        assert!(here(&sessions).is_empty());
        assert!(!sessions.by_user.contains_key(&user_id("bob")), "no empty entry is left behind");
    }
}
