//! A short-lived local cache in front of a shared route table (cluster mode).
//!
//! Fan-out asks where every member's devices are for every message; with Redis behind the
//! route table that is one round trip per message. [`CachedRoutes`] keeps each user's
//! routes for a short time (`cluster.route_cache_ms`, 3 s by default) so a busy conversation costs one lookup
//! per user per `ttl` instead.
//!
//! A cached answer must never hide a device that connected: a message stored after a
//! device's backfill read would then reach it only at its next sync. So every change is
//! made known before it can matter:
//! - a login, logout or restore through this node drops the user's entry here at once;
//! - a **login** is also announced to every other node ([`RouteChanges`], over the node
//!   bus) and the login waits for their answers (bounded by the bus deadline) before it
//!   returns — the gateway starts the device's backfill only after that, so a fan-out that
//!   still used an old entry did so for a message stored before the backfill read it;
//! - a lookup that raced with a change does not store what it read: every change bumps a
//!   counter of its users' stripe (users hashed into [`STRIPES`] of them), and a user's
//!   answer read while that stripe's counter moved is used once and not kept (one counter
//!   for the whole node threw away every answer in flight at each login anywhere in the
//!   cluster).
//!
//! Lookups that miss at the same time share one read: a user already being read by another
//! lookup is not read again, the later lookup waits for that answer (a burst of messages to
//! a large group as its members' entries expire would otherwise read every member from Redis
//! once per message). A change of the user detaches the read under way, so a lookup started
//! after a change never takes an answer read before it; a lookup whose read was dropped
//! (its caller went away) leaves those waiting to read the user themselves.
//!
//! A logout elsewhere is not announced. An entry still naming the closed connection costs
//! one delivery: the node that held the connection finds no session for it, removes the
//! route if Redis still has it and announces the change
//! ([`forget_stale`](RouteTable::forget_stale)), so every node drops its entry then, not
//! at the TTL.
//!
//! An entry past its TTL is kept a while longer (`cluster.route_cache_stale_ms`) as the
//! answer of last resort: when the table cannot be read (a lookup past its deadline, Redis
//! down), a lookup whose every missed user still has such an entry is answered from them
//! rather than failing. The failure would send the fan-out to every node, work that grows
//! with the very overload that made the lookup late. Nothing a fresh entry would not hide
//! is hidden: a login announced here dropped the entry, stale or not, so a stale entry is
//! one no announced change has touched since it was read.

use std::hash::BuildHasher as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::join_all;
use moka::sync::Cache;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{Route, RouteError, RouteTable};
use crate::maps::{HashMap, Keyed};
use crate::model::{ConnectionId, DeviceId, NodeId, UserId};

/// Tells the other nodes that users' routes changed, so they drop their cached entries.
#[async_trait]
pub trait RouteChanges: Send + Sync + 'static {
    /// Returns once every other node that could be reached has dropped its entries for
    /// `users` (or its deadline passed).
    async fn routes_changed(&self, users: &[UserId]);
}

/// Hits and misses since start.
#[derive(Debug, Default)]
pub struct CacheCounts {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Misses that waited for another lookup's read of the user rather than reading it.
    pub joined: AtomicU64,
}

impl CacheCounts {
    /// The share of users found in the cache, 0..=1 (1 before any lookup).
    pub fn hit_rate(&self) -> f64 {
        let hits = self.hits.load(Ordering::Relaxed) as f64;
        let total = hits + self.misses.load(Ordering::Relaxed) as f64;
        if total == 0.0 { 1.0 } else { hits / total }
    }
}

/// How many change counters the users are spread over: two users share one with odds of
/// 1 in 1,024, and then a change of one only keeps the other's racing lookup from being
/// stored (8 KiB).
pub const STRIPES: usize = 1_024;

/// Room kept in the map of reads under way after a burst of misses.
const FLIGHTS_KEPT: usize = 256;

/// A user's answer as a read under way will send it: `None` until it is read; `Err` carries
/// why the table could not be read.
type Answer = Option<Result<Arc<[Route]>, RouteError>>;

/// A read of one user under way: its number (told apart from a later read of the same user)
/// and where its answer will appear.
type Flight = (u64, watch::Receiver<Answer>);

/// A user's routes as read (empty: no device connected), and when the read began.
#[derive(Clone)]
struct Entry {
    read_at: Instant,
    routes: Arc<[Route]>,
}

/// How long entries are used: fresh, then as the answer of last resort.
#[derive(Debug, Clone, Copy)]
pub struct CacheLifetimes {
    /// An entry younger than this answers lookups.
    pub fresh: Duration,
    /// An older one, up to this age, answers only when the table cannot be read (zero:
    /// never).
    pub stale: Duration,
}

/// A [`RouteTable`] that remembers lookups of `inner` for a short time.
pub struct CachedRoutes {
    inner: Arc<dyn RouteTable>,
    /// user → their routes, kept as long as either lifetime.
    entries: Cache<UserId, Entry, Keyed>,
    lifetimes: CacheLifetimes,
    /// Bumped when every entry is dropped; a lookup stores nothing if it moved.
    cleared: AtomicU64,
    /// Bumped by every change of a user of the stripe; a lookup stores a user's answer only
    /// if its stripe's did not move.
    changes: Box<[AtomicU64]>,
    /// Which stripe a user is in.
    striping: Keyed,
    /// Users being read from `inner` now, so a lookup that misses at the same time waits
    /// for that read rather than making its own.
    flights: Mutex<HashMap<UserId, Flight>>,
    /// The number of the next read.
    next_flight: AtomicU64,
    /// Set once the node bus exists (it is built after the route table).
    peers: std::sync::OnceLock<Arc<dyn RouteChanges>>,
    counts: CacheCounts,
}

/// The reads of users one lookup makes for every lookup that joins them. Dropped, it
/// removes them from the flights (unless a change already did): a lookup joining them
/// later reads the users itself, and one waiting on a read never answered does too.
struct Leading<'a> {
    cache: &'a CachedRoutes,
    users: Vec<UserId>,
    numbers: Vec<u64>,
    answers: Vec<watch::Sender<Answer>>,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        let mut flights = self.cache.lock_flights();
        for (user, number) in self.users.iter().zip(&self.numbers) {
            if flights.get(user).is_some_and(|(current, _)| current == number) {
                flights.remove(user);
            }
        }
    }
}

impl CachedRoutes {
    /// Caches lookups of `inner` for their `lifetimes`, at most `capacity` users.
    pub fn new(inner: Arc<dyn RouteTable>, lifetimes: CacheLifetimes, capacity: u64) -> Self {
        let kept = lifetimes.fresh.max(lifetimes.stale);
        let entries = Cache::builder().time_to_live(kept).max_capacity(capacity).build_with_hasher(Keyed::default());
        Self {
            inner,
            entries,
            lifetimes,
            cleared: AtomicU64::new(0),
            changes: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
            striping: Keyed::default(),
            flights: Mutex::default(),
            next_flight: AtomicU64::new(0),
            peers: std::sync::OnceLock::new(),
            counts: CacheCounts::default(),
        }
    }

    /// Where logins are announced to the other nodes (set once; later calls are ignored).
    pub fn announce_to(&self, peers: Arc<dyn RouteChanges>) {
        let _ = self.peers.set(peers);
    }

    /// Drops every entry (the members changed: entries may name a node that is gone).
    pub fn clear(&self) {
        self.cleared.fetch_add(1, Ordering::SeqCst);
        self.entries.invalidate_all();
        self.lock_flights().clear();
    }

    /// Drops the entries of `users` (another node saw them log in), and detaches their reads
    /// under way: a lookup from now on reads them again.
    pub fn invalidate(&self, users: &[UserId]) {
        for user in users {
            self.changes_of(user).fetch_add(1, Ordering::SeqCst);
            self.entries.invalidate(user);
        }
        let mut flights = self.lock_flights();
        for user in users {
            flights.remove(user);
        }
    }

    fn lock_flights(&self) -> std::sync::MutexGuard<'_, HashMap<UserId, Flight>> {
        self.flights.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sorts the users a lookup missed into those it reads itself (now in the flights) and
    /// those another lookup is reading already, with where their answers will appear.
    fn board(&self, missing: Vec<UserId>) -> (Leading<'_>, Vec<(UserId, watch::Receiver<Answer>)>) {
        let mut leading = Leading { cache: self, users: Vec::new(), numbers: Vec::new(), answers: Vec::new() };
        let mut joined = Vec::new();
        let mut flights = self.lock_flights();
        for user in missing {
            if let Some((_, answer)) = flights.get(&user) {
                joined.push((user, answer.clone()));
                continue;
            }
            let number = self.next_flight.fetch_add(1, Ordering::Relaxed);
            let (sender, answer) = watch::channel(None);
            flights.insert(user.clone(), (number, answer));
            leading.users.push(user);
            leading.numbers.push(number);
            leading.answers.push(sender);
        }
        (leading, joined)
    }

    /// Reads the users `leading` holds from `inner`, keeps each answer unless a change
    /// raced with the read, and sends it to the lookups that joined.
    async fn read(&self, leading: &Leading<'_>) -> Result<HashMap<UserId, Vec<Route>>, RouteError> {
        if leading.users.is_empty() {
            return Ok(HashMap::default());
        }
        let cleared = self.cleared.load(Ordering::SeqCst);
        let before: Vec<u64> = leading.users.iter().map(|user| self.changes_of(user).load(Ordering::SeqCst)).collect();
        let read_at = Instant::now();
        let mut looked_up = match self.inner.devices_of(&leading.users).await {
            Ok(looked_up) => looked_up,
            Err(error) => {
                for answer in &leading.answers {
                    answer.send_replace(Some(Err(error.clone())));
                }
                return Err(error);
            }
        };
        let none_cleared = self.cleared.load(Ordering::SeqCst) == cleared;
        let mut found = HashMap::with_capacity_and_hasher(leading.users.len(), Default::default());
        for ((user, before), answer) in leading.users.iter().zip(before).zip(&leading.answers) {
            let routes = looked_up.remove(user).unwrap_or_default();
            let shared: Arc<[Route]> = routes.clone().into();
            if none_cleared && self.changes_of(user).load(Ordering::SeqCst) == before {
                self.entries.insert(user.clone(), Entry { read_at, routes: Arc::clone(&shared) });
            }
            answer.send_replace(Some(Ok(shared)));
            if !routes.is_empty() {
                found.insert(user.clone(), routes);
            }
        }
        Ok(found)
    }

    /// Waits for the answers other lookups are reading; users whose read was dropped
    /// unanswered are read here.
    async fn wait(
        &self,
        joined: Vec<(UserId, watch::Receiver<Answer>)>,
    ) -> Result<HashMap<UserId, Vec<Route>>, RouteError> {
        let mut found = HashMap::default();
        if joined.is_empty() {
            return Ok(found);
        }
        self.counts.joined.fetch_add(joined.len() as u64, Ordering::Relaxed);
        metrics::counter!("herald_route_cache_joined_total").increment(joined.len() as u64);
        let answers = join_all(joined.into_iter().map(|(user, mut answer)| async move {
            let answer = answer.wait_for(Option::is_some).await.ok().and_then(|answer| answer.clone());
            (user, answer)
        }))
        .await;
        let mut orphans = Vec::new();
        for (user, answer) in answers {
            match answer {
                Some(Ok(routes)) if routes.is_empty() => {}
                Some(Ok(routes)) => {
                    found.insert(user, routes.to_vec());
                }
                Some(Err(error)) => return Err(error),
                None => orphans.push(user),
            }
        }
        if !orphans.is_empty() {
            found.extend(self.inner.devices_of(&orphans).await?);
        }
        Ok(found)
    }

    /// The change counter of `user`'s stripe.
    fn changes_of(&self, user: &UserId) -> &AtomicU64 {
        &self.changes[(self.striping.hash_one(user) % STRIPES as u64) as usize]
    }

    /// Drops the entries of `users` here and on every other node, waiting for their answers
    /// (routes written behind the cache's back: a login, routes restored after Redis lost
    /// its data).
    pub async fn announce(&self, users: &[UserId]) {
        self.invalidate(users);
        if let Some(peers) = self.peers.get() {
            peers.routes_changed(users).await;
        }
    }

    /// The answer of last resort when the table cannot be read: every user's entry, fresh
    /// or past its TTL, or `None` when one has none (never read, or dropped by a change
    /// since) or entries are never used stale.
    fn last_resort(&self, users: &[UserId]) -> Option<HashMap<UserId, Vec<Route>>> {
        if self.lifetimes.stale.is_zero() {
            return None;
        }
        let mut kept = HashMap::with_capacity_and_hasher(users.len(), Default::default());
        for user in users {
            let entry = self.entries.get(user)?;
            if !entry.routes.is_empty() {
                kept.insert(user.clone(), entry.routes.to_vec());
            }
        }
        Some(kept)
    }

    /// Hits and misses so far.
    pub fn counts(&self) -> &CacheCounts {
        &self.counts
    }
}

#[async_trait]
impl RouteTable for CachedRoutes {
    async fn login(&self, route: Route) -> Result<Option<Route>, RouteError> {
        let user = route.user.clone();
        self.invalidate(std::slice::from_ref(&user));
        let replaced = self.inner.login(route).await;
        self.announce(std::slice::from_ref(&user)).await;
        replaced
    }

    async fn logout(
        &self,
        user: &UserId,
        device: &DeviceId,
        node: NodeId,
        connection: ConnectionId,
    ) -> Result<bool, RouteError> {
        let removed = self.inner.logout(user, device, node, connection).await;
        self.invalidate(std::slice::from_ref(user));
        removed
    }

    async fn park(
        &self,
        user: &UserId,
        device: &DeviceId,
        node: NodeId,
        connection: ConnectionId,
    ) -> Result<bool, RouteError> {
        let parked = self.inner.park(user, device, node, connection).await;
        self.invalidate(std::slice::from_ref(user));
        parked
    }

    async fn devices_of(&self, users: &[UserId]) -> Result<HashMap<UserId, Vec<Route>>, RouteError> {
        let mut found = HashMap::with_capacity_and_hasher(users.len(), Default::default());
        let mut missing = Vec::new();
        for user in users {
            match self.entries.get(user) {
                Some(entry) if entry.read_at.elapsed() < self.lifetimes.fresh => {
                    if !entry.routes.is_empty() {
                        found.insert(user.clone(), entry.routes.to_vec());
                    }
                }
                _ => missing.push(user.clone()),
            }
        }
        let (hits, misses) = ((users.len() - missing.len()) as u64, missing.len() as u64);
        self.counts.hits.fetch_add(hits, Ordering::Relaxed);
        self.counts.misses.fetch_add(misses, Ordering::Relaxed);
        metrics::counter!("herald_route_cache_hits_total").increment(hits);
        metrics::counter!("herald_route_cache_misses_total").increment(misses);
        if missing.is_empty() {
            return Ok(found);
        }
        let (leading, joined) = self.board(missing);
        let (read, waited) = tokio::join!(self.read(&leading), self.wait(joined));
        drop(leading);
        match read.and_then(|read| Ok((read, waited?))) {
            Ok((read, waited)) => {
                found.extend(read);
                found.extend(waited);
                Ok(found)
            }
            Err(error) => {
                let kept = self.last_resort(users).ok_or(error)?;
                metrics::counter!("herald_route_cache_stale_total").increment(misses);
                Ok(kept)
            }
        }
    }

    async fn restore(&self, route: Route) -> Result<bool, RouteError> {
        let user = route.user.clone();
        let wrote = self.inner.restore(route).await;
        self.invalidate(std::slice::from_ref(&user));
        wrote
    }

    /// The node that sent the delivery read the stale route from its cache (or Redis still
    /// held it): it is removed, and every node drops its entry, so the next message looks
    /// the user up again.
    async fn forget_stale(&self, route: &Route) -> Result<bool, RouteError> {
        let removed = self.inner.logout(&route.user, &route.device, route.node, route.connection).await;
        self.announce(std::slice::from_ref(&route.user)).await;
        removed
    }

    fn held_here(&self) -> usize {
        usize::try_from(self.entries.entry_count()).unwrap_or(usize::MAX) + self.inner.held_here()
    }

    async fn last_left(&self, user: &UserId) -> Result<Option<u64>, RouteError> {
        self.inner.last_left(user).await
    }

    fn shrink_if_sparse(&self) {
        self.inner.shrink_if_sparse();
        let mut flights = self.lock_flights();
        if crate::maps::is_sparse(flights.len(), flights.capacity(), FLIGHTS_KEPT) {
            flights.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::MemoryRouteTable;
    use crate::routing::tests::route;

    fn user(name: &str) -> UserId {
        UserId::parse(name).expect("valid")
    }

    /// Fresh for a minute, never used stale.
    const MINUTE: CacheLifetimes = CacheLifetimes { fresh: Duration::from_secs(60), stale: Duration::ZERO };

    /// Records what was announced.
    #[derive(Default)]
    struct Announced(Arc<Mutex<Vec<UserId>>>);

    #[async_trait]
    impl RouteChanges for Announced {
        async fn routes_changed(&self, users: &[UserId]) {
            self.0.lock().expect("not poisoned").extend_from_slice(users);
        }
    }

    #[tokio::test]
    async fn lookups_are_served_from_the_cache_until_a_change_drops_them() {
        let shared: Arc<dyn RouteTable> = Arc::new(MemoryRouteTable::default());
        let cached = CachedRoutes::new(Arc::clone(&shared), MINUTE, 1000);
        let announced = Arc::new(Mutex::new(Vec::new()));
        cached.announce_to(Arc::new(Announced(Arc::clone(&announced))));

        cached.login(route("ann", "phone", 1, 1)).await.expect("login");
        assert_eq!(*announced.lock().expect("lock"), vec![user("ann")], "a login is announced to the other nodes");
        let first = cached.devices_of(&[user("ann"), user("bob")]).await.expect("lookup");
        assert_eq!(first[&user("ann")].len(), 1);
        assert!(!first.contains_key(&user("bob")), "bob has no device");
        assert_eq!(
            (cached.counts().hits.load(Ordering::Relaxed), cached.counts().misses.load(Ordering::Relaxed)),
            (0, 2)
        );

        // Another node logs a device in behind this cache's back: still the cached answer...
        shared.login(route("ann", "laptop", 2, 7)).await.expect("login elsewhere");
        shared.login(route("bob", "phone", 2, 8)).await.expect("login elsewhere");
        let cached_answer = cached.devices_of(&[user("ann"), user("bob")]).await.expect("lookup");
        assert_eq!(cached_answer[&user("ann")].len(), 1, "served from the cache");
        assert!(!cached_answer.contains_key(&user("bob")), "an empty answer is cached too");
        assert_eq!(cached.counts().hits.load(Ordering::Relaxed), 2);
        // ...until that node's announcement arrives.
        cached.invalidate(&[user("ann"), user("bob")]);
        let fresh = cached.devices_of(&[user("ann"), user("bob")]).await.expect("lookup");
        assert_eq!((fresh[&user("ann")].len(), fresh[&user("bob")].len()), (2, 1));

        // A logout through this node drops the entry at once.
        cached
            .logout(&user("bob"), &DeviceId::parse("phone").expect("valid"), NodeId(2), ConnectionId(8))
            .await
            .expect("logout");
        assert!(!cached.devices_of(&[user("bob")]).await.expect("lookup").contains_key(&user("bob")));
    }

    #[tokio::test]
    async fn a_stale_route_is_removed_and_announced_so_every_node_looks_again() {
        let shared: Arc<dyn RouteTable> = Arc::new(MemoryRouteTable::default());
        let cached = CachedRoutes::new(Arc::clone(&shared), MINUTE, 1000);
        let announced = Arc::new(Mutex::new(Vec::new()));
        cached.announce_to(Arc::new(Announced(Arc::clone(&announced))));
        let (gone, newer) = (route("dan", "phone", 1, 4), route("dan", "phone", 1, 5));
        shared.login(gone.clone()).await.expect("login");
        assert_eq!(cached.devices_of(&[user("dan")]).await.expect("lookup")[&user("dan")], vec![gone.clone()]);

        assert!(cached.forget_stale(&gone).await.expect("forget"), "still in the table: removed");
        assert_eq!(*announced.lock().expect("lock"), vec![user("dan")], "every other node drops its entry");
        assert!(cached.devices_of(&[user("dan")]).await.expect("lookup").is_empty(), "and this one did");

        // A newer connection of the device is never removed by a stale finding of the old.
        shared.login(newer.clone()).await.expect("login");
        assert!(!cached.forget_stale(&gone).await.expect("forget"));
        assert_eq!(cached.devices_of(&[user("dan")]).await.expect("lookup")[&user("dan")], vec![newer]);
    }

    /// A table whose lookups wait until told, so a change can land mid-lookup.
    struct Slow {
        inner: MemoryRouteTable,
        gate: tokio::sync::Notify,
        /// Users read so far.
        reads: std::sync::atomic::AtomicUsize,
    }

    #[async_trait]
    impl RouteTable for Slow {
        async fn login(&self, route: Route) -> Result<Option<Route>, RouteError> {
            self.inner.login(route).await
        }
        async fn logout(&self, u: &UserId, d: &DeviceId, n: NodeId, c: ConnectionId) -> Result<bool, RouteError> {
            self.inner.logout(u, d, n, c).await
        }
        async fn devices_of(&self, users: &[UserId]) -> Result<HashMap<UserId, Vec<Route>>, RouteError> {
            self.reads.fetch_add(users.len(), Ordering::SeqCst);
            let answer = self.inner.devices_of(users).await;
            self.gate.notified().await;
            answer
        }
        async fn restore(&self, route: Route) -> Result<bool, RouteError> {
            self.inner.restore(route).await
        }
        async fn last_left(&self, user: &UserId) -> Result<Option<u64>, RouteError> {
            self.inner.last_left(user).await
        }
    }

    /// A cache over a [`Slow`] table, for a minute.
    fn slow_cache() -> (Arc<Slow>, Arc<CachedRoutes>) {
        let slow = Arc::new(Slow {
            inner: MemoryRouteTable::default(),
            gate: tokio::sync::Notify::new(),
            reads: Default::default(),
        });
        let cached = Arc::new(CachedRoutes::new(Arc::clone(&slow) as _, MINUTE, 1000));
        (slow, cached)
    }

    /// Starts a lookup of cy through `cached` and lets it run until it waits at the table's
    /// gate, so that a change can land while it is under way.
    async fn cy_looked_up_meanwhile(cached: &Arc<CachedRoutes>) -> Lookup {
        let lookup = tokio::spawn({
            let cached = Arc::clone(cached);
            async move { cached.devices_of(&[user("cy")]).await }
        });
        tokio::task::yield_now().await;
        lookup
    }

    /// cy logs in on another node, which announces it to this one.
    async fn cy_logs_in_elsewhere(slow: &Slow, cached: &CachedRoutes) {
        slow.inner.login(route("cy", "phone", 2, 3)).await.expect("login");
        cached.invalidate(&[user("cy")]);
    }

    #[tokio::test]
    async fn an_answer_read_while_a_change_landed_is_not_kept() {
        let (slow, cached) = slow_cache();
        let lookup = cy_looked_up_meanwhile(&cached).await;
        // cy logs in on another node while the lookup (which read "no device") is under way.
        cy_logs_in_elsewhere(&slow, &cached).await;
        slow.gate.notify_one();
        let stale = lookup.await.expect("no panic").expect("lookup");
        assert!(stale.is_empty(), "the racing lookup answers what it read");
        slow.gate.notify_one();
        let fresh = cached.devices_of(&[user("cy")]).await.expect("lookup");
        assert_eq!(fresh[&user("cy")].len(), 1, "but did not keep it: the next lookup reads the table again");
    }

    /// A change of another user (one of another stripe) says nothing about the answer read
    /// meanwhile, which is kept.
    #[tokio::test]
    async fn an_answer_read_while_another_user_changed_is_kept() {
        let (slow, cached) = slow_cache();
        slow.inner.login(route("cy", "phone", 2, 3)).await.expect("login");
        let other = (0..)
            .map(|n| user(&format!("other{n}")))
            .find(|other| !std::ptr::eq(cached.changes_of(other), cached.changes_of(&user("cy"))))
            .expect("a user of another stripe");
        let lookup = cy_looked_up_meanwhile(&cached).await;
        cached.invalidate(&[other]);
        slow.gate.notify_one();
        assert_eq!(lookup.await.expect("no panic").expect("lookup")[&user("cy")].len(), 1);
        let misses = cached.counts().misses.load(Ordering::Relaxed);

        // Answered from the cache: the table's lookups wait for the gate, which stays shut.
        let again = tokio::time::timeout(Duration::from_secs(5), cached.devices_of(&[user("cy")]))
            .await
            .expect("answered from the cache, not the table")
            .expect("lookup");
        assert_eq!(again[&user("cy")].len(), 1);
        assert_eq!(cached.counts().misses.load(Ordering::Relaxed), misses, "a hit: the answer was kept");
    }

    #[tokio::test]
    async fn clearing_keeps_no_answer_read_meanwhile() {
        let (slow, cached) = slow_cache();
        let lookup = cy_looked_up_meanwhile(&cached).await;
        cached.clear();
        slow.gate.notify_one();
        lookup.await.expect("no panic").expect("lookup");
        let misses = cached.counts().misses.load(Ordering::Relaxed);
        slow.gate.notify_one();
        cached.devices_of(&[user("cy")]).await.expect("lookup");
        assert_eq!(cached.counts().misses.load(Ordering::Relaxed), misses + 1, "looked up again");
    }

    type Lookup = tokio::task::JoinHandle<Result<HashMap<UserId, Vec<Route>>, RouteError>>;

    /// cy has a device, and two lookups of cy wait at the table's gate, one after the other.
    async fn connected_cy_looked_up_twice() -> (Arc<Slow>, Arc<CachedRoutes>, Lookup, Lookup) {
        let (slow, cached) = slow_cache();
        slow.inner.login(route("cy", "phone", 2, 3)).await.expect("login");
        let first = cy_looked_up_meanwhile(&cached).await;
        let second = cy_looked_up_meanwhile(&cached).await;
        (slow, cached, first, second)
    }

    #[tokio::test]
    async fn lookups_that_miss_together_read_the_table_once() {
        let (slow, cached, first, second) = connected_cy_looked_up_twice().await;
        slow.gate.notify_one();
        for lookup in [first, second] {
            assert_eq!(lookup.await.expect("no panic").expect("lookup")[&user("cy")].len(), 1, "both answered");
        }
        assert_eq!(slow.reads.load(Ordering::SeqCst), 1, "the second waited for the first's read");
        assert_eq!(cached.counts().joined.load(Ordering::Relaxed), 1);
        assert_eq!(cached.counts().misses.load(Ordering::Relaxed), 2, "both missed the cache");
    }

    /// A lookup that starts after a change of the user must see it: it does not take the
    /// answer of a read that began before.
    #[tokio::test]
    async fn a_lookup_after_a_change_does_not_wait_for_a_read_from_before_it() {
        let (slow, cached) = slow_cache();
        let before = cy_looked_up_meanwhile(&cached).await;
        cy_logs_in_elsewhere(&slow, &cached).await;
        let after = cy_looked_up_meanwhile(&cached).await;
        slow.gate.notify_one();
        slow.gate.notify_one();
        assert!(before.await.expect("no panic").expect("lookup").is_empty(), "read before the login");
        assert_eq!(after.await.expect("no panic").expect("lookup")[&user("cy")].len(), 1, "read after it");
        assert_eq!((slow.reads.load(Ordering::SeqCst), cached.counts().joined.load(Ordering::Relaxed)), (2, 0));
    }

    /// The lookup reading a user went away (its caller was dropped): the one waiting for
    /// that read reads the user itself rather than waiting for ever.
    #[tokio::test]
    async fn a_lookup_waiting_for_a_dropped_read_reads_the_user_itself() {
        let (slow, cached, reader, waiter) = connected_cy_looked_up_twice().await;
        reader.abort();
        assert!(reader.await.expect_err("aborted").is_cancelled());
        tokio::task::yield_now().await;
        slow.gate.notify_one();
        let answer = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("answered, not left waiting")
            .expect("no panic")
            .expect("lookup");
        assert_eq!(answer[&user("cy")].len(), 1);
        assert_eq!(cached.counts().joined.load(Ordering::Relaxed), 1, "the waiter had joined the dropped read");
        assert_eq!(slow.reads.load(Ordering::SeqCst), 2, "read again by the waiter");
    }

    /// A table that cannot be read fails every lookup waiting for the read, not only the
    /// one that made it.
    #[tokio::test]
    async fn a_failed_read_fails_the_lookups_waiting_for_it() {
        struct Down(tokio::sync::Notify);
        #[async_trait]
        impl RouteTable for Down {
            async fn login(&self, _: Route) -> Result<Option<Route>, RouteError> {
                Ok(None)
            }
            async fn logout(&self, _: &UserId, _: &DeviceId, _: NodeId, _: ConnectionId) -> Result<bool, RouteError> {
                Ok(false)
            }
            async fn devices_of(&self, _: &[UserId]) -> Result<HashMap<UserId, Vec<Route>>, RouteError> {
                self.0.notified().await;
                Err(RouteError::new("redis is down"))
            }
            async fn restore(&self, _: Route) -> Result<bool, RouteError> {
                Ok(false)
            }
            async fn last_left(&self, _: &UserId) -> Result<Option<u64>, RouteError> {
                Ok(None)
            }
        }
        let down = Arc::new(Down(tokio::sync::Notify::new()));
        let cached = Arc::new(CachedRoutes::new(Arc::clone(&down) as _, MINUTE, 1000));
        let first = cy_looked_up_meanwhile(&cached).await;
        let second = cy_looked_up_meanwhile(&cached).await;
        down.0.notify_one();
        for lookup in [first, second] {
            let error = lookup.await.expect("no panic").expect_err("the table is down");
            assert_eq!(error.cause().to_string(), "redis is down", "every joined lookup gets the one read's error");
        }
        assert_eq!(cached.counts().joined.load(Ordering::Relaxed), 1);
    }

    /// A table that fails every lookup while told to.
    #[derive(Default)]
    struct Flaky {
        inner: MemoryRouteTable,
        down: std::sync::atomic::AtomicBool,
    }

    #[async_trait]
    impl RouteTable for Flaky {
        async fn login(&self, route: Route) -> Result<Option<Route>, RouteError> {
            self.inner.login(route).await
        }
        async fn logout(&self, u: &UserId, d: &DeviceId, n: NodeId, c: ConnectionId) -> Result<bool, RouteError> {
            self.inner.logout(u, d, n, c).await
        }
        async fn devices_of(&self, users: &[UserId]) -> Result<HashMap<UserId, Vec<Route>>, RouteError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(RouteError::new("lookup past its deadline"));
            }
            self.inner.devices_of(users).await
        }
        async fn restore(&self, route: Route) -> Result<bool, RouteError> {
            self.inner.restore(route).await
        }
        async fn last_left(&self, user: &UserId) -> Result<Option<u64>, RouteError> {
            self.inner.last_left(user).await
        }
    }

    /// Past its TTL an entry is read again while the table answers, and used as it was
    /// when the table cannot be read, as long as every user missed has one.
    #[tokio::test(start_paused = true)]
    async fn entries_past_their_ttl_answer_only_when_the_table_cannot_be_read() {
        let table = Arc::new(Flaky::default());
        let lifetimes = CacheLifetimes { fresh: Duration::from_secs(3), stale: Duration::from_secs(60) };
        let cached = CachedRoutes::new(Arc::clone(&table) as _, lifetimes, 1000);
        table.login(route("ann", "phone", 2, 1)).await.expect("login");
        cached.devices_of(&[user("ann"), user("bob")]).await.expect("looked up and kept");

        tokio::time::advance(Duration::from_secs(4)).await;
        table.login(route("ann", "laptop", 3, 2)).await.expect("a login whose announcement is still to come");
        let again = cached.devices_of(&[user("ann")]).await.expect("read again");
        assert_eq!(again[&user("ann")].len(), 2, "past its TTL the entry is read again");

        tokio::time::advance(Duration::from_secs(4)).await;
        table.down.store(true, Ordering::SeqCst);
        let stale = cached.devices_of(&[user("ann"), user("bob")]).await.expect("answered from stale entries");
        assert_eq!(stale[&user("ann")].len(), 2, "as last read");
        assert!(!stale.contains_key(&user("bob")), "bob had no device then");

        let error = cached.devices_of(&[user("ann"), user("cy")]).await.expect_err("cy was never read");
        assert!(error.cause().to_string().contains("deadline"), "{error}");
        cached.invalidate(&[user("ann")]);
        cached.devices_of(&[user("ann")]).await.expect_err("an announced change drops the stale entry too");
    }

    /// With no stale lifetime an entry past its TTL is never used.
    #[tokio::test(start_paused = true)]
    async fn without_a_stale_lifetime_a_failed_read_fails() {
        let table = Arc::new(Flaky::default());
        let lifetimes = CacheLifetimes { fresh: Duration::from_secs(3), stale: Duration::ZERO };
        let cached = CachedRoutes::new(Arc::clone(&table) as _, lifetimes, 1000);
        table.login(route("ann", "phone", 2, 1)).await.expect("login");
        cached.devices_of(&[user("ann")]).await.expect("looked up and kept");
        tokio::time::advance(Duration::from_secs(4)).await;
        table.down.store(true, Ordering::SeqCst);
        cached.devices_of(&[user("ann")]).await.expect_err("no stale answer");
    }
}
