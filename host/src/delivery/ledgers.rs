//! A restarted node takes its devices back: each node saves its devices' ledgers (what
//! each acked and may lack, per conversation) outside itself, at most once a second while
//! it runs and all of them when it shuts down, and restores them on start as parked
//! sessions, so the devices that come back within the reconnect grace are resumed instead
//! of backfilled in full (OPERATIONS.md, "Placement").
//!
//! A saved ledger is true as of the save that wrote it; the node marks each save complete
//! with the time it began. Restored, a ledger carries the lowest message id the node may
//! have missed — from that time, less [`MISSED_MARGIN`] — and the device's backfill also
//! reads every conversation of its that changed from there on
//! ([`restored`](super::restored)). So a ledger up to a save stale (after `kill -9`) costs a
//! few more reads, never a skipped message.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Mutex;

use super::session::Session;
use super::sessions::Sessions;
use crate::clock::WallClock;
use crate::maps::HashMap;
use crate::model::{ConnectionId, DeviceId, DeviceLedger, HERALD_EPOCH_MS, NODE_BITS, SEQUENCE_BITS, UserId};

/// How far before a save's start a message may have been missed: ids are taken before a
/// message commits (a commit may take up to `storage.group_commit.commit_timeout_ms`), and
/// other nodes' clocks, which time their ids, may be behind this one's.
pub const MISSED_MARGIN: Duration = Duration::from_secs(15);

/// Where a node keeps its devices' ledgers while it is down.
#[async_trait]
pub trait LedgerStore: Send + Sync + 'static {
    /// Writes `saved`, removes `removed`, and marks this node's ledgers as true as of
    /// `as_of_ms` (ms since the Unix epoch).
    ///
    /// # Errors
    /// What went wrong, as text for the log; the next save tries again.
    async fn save(&self, saved: Vec<Saved>, removed: Vec<Device>, as_of_ms: u64) -> Result<(), String>;

    /// This node's saved ledgers and the time they were true as of; `None` when none was
    /// ever marked complete.
    ///
    /// # Errors
    /// As [`save`](Self::save).
    async fn load(&self) -> Result<Option<(u64, Vec<Saved>)>, String>;
}

/// A user's device.
pub type Device = (UserId, DeviceId);

/// A device's ledger as saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub user: UserId,
    pub device: DeviceId,
    pub ledger: DeviceLedger,
}

/// Saves this node's ledgers and reads them back after a restart.
pub struct LedgerKeeper {
    store: Arc<dyn LedgerStore>,
    sessions: Arc<Sessions>,
    clock: Arc<dyn WallClock>,
    /// What the store holds: per device, the connection and change count it was saved at.
    /// Held across a save, so two never overlap.
    saved: Mutex<HashMap<Device, Stamp>>,
}

/// Which state of a session a saved ledger is.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp {
    connection: ConnectionId,
    changes: u64,
}

impl Stamp {
    /// Of a ledger read back: no session has it.
    const LOADED: Self = Self { connection: ConnectionId(0), changes: u64::MAX };

    fn of(session: &Session) -> Self {
        Self { connection: session.id, changes: session.changes() }
    }
}

impl LedgerKeeper {
    pub fn new(store: Arc<dyn LedgerStore>, sessions: Arc<Sessions>, clock: Arc<dyn WallClock>) -> Self {
        Self { store, sessions, clock, saved: Mutex::default() }
    }

    /// Saves every `every` until the node stops.
    pub async fn keep_saving(self: Arc<Self>, every: Duration) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Err(error) = self.save().await {
                tracing::warn!(%error, "could not save the devices' ledgers; trying again");
            }
        }
    }

    /// Saves the ledgers of every session, open or parked, that changed since the last
    /// save, and removes those of devices gone or whose session no longer knows all its
    /// device may lack.
    ///
    /// # Errors
    /// The store's, as text; nothing is counted as saved then.
    pub async fn save(&self) -> Result<(), String> {
        let mut saved = self.saved.lock().await;
        let as_of_ms = self.clock.now_ms();
        let mut now: HashMap<Device, Stamp> = HashMap::default();
        let mut writes = Vec::new();
        for session in self.sessions.every() {
            let device = (session.user.clone(), session.device.clone());
            let stamp = Stamp::of(&session);
            if saved.get(&device) == Some(&stamp) {
                now.insert(device, stamp);
                continue;
            }
            // Another session of the device (its new connection, or its old one that this
            // one took over from) may say more: a device is kept if any says all.
            if let Some(ledger) = session.snapshot() {
                writes.push(Saved { user: device.0.clone(), device: device.1.clone(), ledger });
                now.insert(device, stamp);
            }
        }
        let removed: Vec<Device> = saved.keys().filter(|device| !now.contains_key(*device)).cloned().collect();
        // Written even when nothing changed: the mark moves on, so that after a crash only
        // what changed since this moment is read again.
        let (written, gone) = (writes.len(), removed.len());
        self.store.save(writes, removed, as_of_ms).await?;
        tracing::debug!(written, removed = gone, "devices' ledgers saved");
        metrics::counter!("herald_delivery_ledger_saves_total").increment(1);
        metrics::gauge!("herald_delivery_ledgers_saved").set(now.len() as f64);
        *saved = now;
        Ok(())
    }

    /// The ledgers saved before this node (re)started, each marked with the lowest message
    /// id the node may have missed for it; `keep` picks those to restore (the devices this
    /// node is the home of), and the others are removed at the next save.
    ///
    /// # Errors
    /// The store's, as text.
    pub async fn load(&self, keep: impl Fn(&UserId) -> bool) -> Result<Vec<Saved>, String> {
        let Some((as_of_ms, all)) = self.store.load().await? else { return Ok(Vec::new()) };
        let since_id = lowest_id_at(as_of_ms.saturating_sub(MISSED_MARGIN.as_millis() as u64));
        let mut saved = self.saved.lock().await;
        let mut kept = Vec::new();
        for mut entry in all {
            saved.insert((entry.user.clone(), entry.device.clone()), Stamp::LOADED);
            if keep(&entry.user) {
                entry.ledger.since_id = Some(entry.ledger.since_id.map_or(since_id, |own| own.min(since_id)));
                kept.push(entry);
            }
        }
        Ok(kept)
    }
}

/// The lowest snowflake id a node may issue at `unix_ms`.
fn lowest_id_at(unix_ms: u64) -> u64 {
    unix_ms.saturating_sub(HERALD_EPOCH_MS) << (NODE_BITS + SEQUENCE_BITS)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex as StdMutex;

    use super::*;
    use crate::clock::ManualClock;
    use crate::ids::snowflake::decompose;
    use crate::model::ConversationId;
    use crate::testkit::{RecordingOutbox, device_id, user_id};

    /// The store as a map, counting the ledgers written (a unit test of the keeper's logic;
    /// Redis's side is tested by the cluster tests).
    #[derive(Default)]
    struct Kept {
        saved: StdMutex<BTreeMap<Device, DeviceLedger>>,
        as_of: StdMutex<Option<u64>>,
        written: StdMutex<usize>,
    }

    #[async_trait]
    impl LedgerStore for Kept {
        async fn save(&self, saved: Vec<Saved>, removed: Vec<Device>, as_of_ms: u64) -> Result<(), String> {
            let mut map = self.saved.lock().expect("lock");
            *self.written.lock().expect("lock") += saved.len();
            for entry in saved {
                map.insert((entry.user, entry.device), entry.ledger);
            }
            for device in removed {
                map.remove(&device);
            }
            *self.as_of.lock().expect("lock") = Some(as_of_ms);
            Ok(())
        }

        async fn load(&self) -> Result<Option<(u64, Vec<Saved>)>, String> {
            let map = self.saved.lock().expect("lock");
            let all = map.iter().map(|((user, device), ledger)| Saved {
                user: user.clone(),
                device: device.clone(),
                ledger: ledger.clone(),
            });
            Ok(self.as_of.lock().expect("lock").map(|as_of| (as_of, all.collect())))
        }
    }

    fn live(id: u64, user: &str) -> Arc<Session> {
        let session =
            Arc::new(Session::new(ConnectionId(id), user_id(user), device_id("phone"), RecordingOutbox::new() as _));
        session.skip_backfill();
        session
    }

    #[tokio::test]
    async fn a_ledger_is_written_when_it_changed_and_removed_when_its_device_is_gone() {
        let (store, sessions) = (Arc::new(Kept::default()), Arc::new(Sessions::default()));
        let clock = Arc::new(ManualClock::new(HERALD_EPOCH_MS + 60_000));
        let keeper = LedgerKeeper::new(Arc::clone(&store) as _, Arc::clone(&sessions), clock.clone() as _);
        let dm = ConversationId::parse("dm:ann:bob").expect("conversation");
        let (ann, bob) = (live(1, "ann"), live(2, "bob"));
        let still_backfilling =
            Arc::new(Session::new(ConnectionId(3), user_id("cy"), device_id("phone"), RecordingOutbox::new() as _));
        for session in [&ann, &bob, &still_backfilling] {
            sessions.insert(Arc::clone(session));
        }
        assert!(ann.offer(&dm, 5).into_push().is_some());
        keeper.save().await.expect("saved");
        assert_eq!(*store.written.lock().expect("lock"), 2, "cy does not know all it may lack yet");
        let saved = store.saved.lock().expect("lock").clone();
        assert_eq!(saved[&(user_id("ann"), device_id("phone"))].read_after, [(dm.clone(), 4)].into_iter().collect());

        clock.advance(1_000);
        keeper.save().await.expect("saved");
        assert_eq!(*store.written.lock().expect("lock"), 2, "nothing changed: nothing written");
        assert_eq!(*store.as_of.lock().expect("lock"), Some(HERALD_EPOCH_MS + 61_000), "the mark moves on");

        ann.record_ack(&dm, 5);
        sessions.remove(bob.id);
        keeper.save().await.expect("saved");
        assert_eq!(*store.written.lock().expect("lock"), 3, "ann's ack rewrote hers");
        let saved = store.saved.lock().expect("lock").clone();
        assert_eq!(saved.keys().cloned().collect::<Vec<_>>(), [(user_id("ann"), device_id("phone"))]);
        assert!(saved[&(user_id("ann"), device_id("phone"))].read_after.is_empty());
    }

    #[tokio::test]
    async fn a_restart_restores_the_devices_kept_each_marked_with_what_it_may_have_missed() {
        let store = Arc::new(Kept::default());
        let as_of = HERALD_EPOCH_MS + 3_600_000;
        let ledger = |since_id| DeviceLedger { since_id, ..DeviceLedger::default() };
        let saved = [
            ((user_id("ann"), device_id("phone")), ledger(None)),
            ((user_id("bob"), device_id("phone")), ledger(Some(7))),
            ((user_id("cy"), device_id("phone")), ledger(None)),
        ];
        store.saved.lock().expect("lock").extend(saved);
        *store.as_of.lock().expect("lock") = Some(as_of);
        let sessions = Arc::new(Sessions::default());
        let keeper =
            LedgerKeeper::new(Arc::clone(&store) as _, Arc::clone(&sessions), Arc::new(ManualClock::new(as_of)));
        let restored = keeper.load(|user| user.as_str() != "cy").await.expect("loaded");
        let floor = lowest_id_at(as_of - MISSED_MARGIN.as_millis() as u64);
        let since: Vec<(&str, Option<u64>)> =
            restored.iter().map(|entry| (entry.user.as_str(), entry.ledger.since_id)).collect();
        assert_eq!(since, [("ann", Some(floor)), ("bob", Some(7))], "an older mark is kept");
        keeper.save().await.expect("saved");
        assert!(store.saved.lock().expect("lock").is_empty(), "no session holds them yet: all removed");
    }

    #[test]
    fn the_lowest_id_of_a_moment_is_below_every_id_issued_then() {
        let at = HERALD_EPOCH_MS + 86_400_000;
        let lowest = lowest_id_at(at);
        assert_eq!(decompose(lowest).unix_ms, at);
        assert_eq!(decompose(lowest - 1).unix_ms, at - 1, "one less is of the millisecond before");
        assert_eq!(lowest_id_at(0), 0, "a clock before the epoch names every id");
    }
}
