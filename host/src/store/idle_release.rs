//! SQLite's page caches handed back after a burst.
//!
//! A burst fills the writer's page cache to `storage.sqlite_cache_mib` (the unique indexes
//! are written at random places, so most of their pages end up cached), and SQLite keeps a
//! page until the cache needs its room: the memory would stay taken for good. Once no
//! message was committed for `storage.sqlite_idle_release_ms`, every connection's cache is
//! emptied (`PRAGMA shrink_memory`), once per quiet spell, and glibc's malloc, which SQLite
//! allocates from, hands the freed pages back to the OS ([`herald_alloc::trim_c_heap`]:
//! it would keep them otherwise). The commits after it read their pages again from the
//! OS's cache.

use std::time::Duration;

use tokio::time::Instant;

use super::{Database, Pool};

impl Database {
    /// SQLite only: empties every connection's page cache once `committed` (a count of
    /// message commits) has not moved for `idle`, once per quiet spell. Returns at once
    /// elsewhere, or when `idle` is zero.
    pub async fn release_caches_when_idle(self, committed: impl Fn() -> u64 + Send, idle: Duration) {
        let (Pool::Sqlite(reader), Pool::Sqlite(writer)) = (&self.reader, &self.writer) else { return };
        if idle.is_zero() {
            return;
        }
        let mut ticks = tokio::time::interval((idle / 4).max(Duration::from_millis(10)));
        let mut spell = QuietSpell::new(committed(), Instant::now(), idle);
        loop {
            ticks.tick().await;
            if !spell.due(committed(), Instant::now()) {
                continue;
            }
            match shrink_caches(reader, writer).await {
                Ok(connections) => {
                    herald_alloc::trim_c_heap();
                    tracing::debug!(connections, "SQLite's page caches emptied after a quiet spell");
                    metrics::counter!("herald_store_cache_releases_total").increment(1);
                }
                Err(_) if writer.is_closed() => return,
                Err(error) => tracing::warn!(%error, "emptying SQLite's page caches failed"),
            }
        }
    }
}

/// Empties the page cache of the writer and of every idle reader connection (each has its
/// own). Returns how many connections were emptied.
async fn shrink_caches(reader: &sqlx::SqlitePool, writer: &sqlx::SqlitePool) -> Result<usize, sqlx::Error> {
    const SHRINK: &str = "PRAGMA shrink_memory";
    sqlx::query(SHRINK).execute(writer).await?;
    // Held together, so that each acquire hands out another connection.
    let mut idle_readers: Vec<_> = std::iter::from_fn(|| reader.try_acquire()).take(reader.num_idle()).collect();
    for connection in &mut idle_readers {
        sqlx::query(SHRINK).execute(&mut **connection).await?;
    }
    Ok(1 + idle_readers.len())
}

/// Tells when a quiet spell has lasted `idle`: once per spell, and never before the first
/// commit (an empty cache has nothing to hand back).
struct QuietSpell {
    seen: u64,
    since: Instant,
    released: bool,
    idle: Duration,
}

impl QuietSpell {
    fn new(committed: u64, now: Instant, idle: Duration) -> Self {
        Self { seen: committed, since: now, released: true, idle }
    }

    /// Whether to empty the caches now, `committed` being the count of commits at `now`.
    fn due(&mut self, committed: u64, now: Instant) -> bool {
        if committed != self.seen {
            (self.seen, self.since, self.released) = (committed, now, false);
            return false;
        }
        if self.released || now.duration_since(self.since) < self.idle {
            return false;
        }
        self.released = true;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StorageConfig;
    use crate::testkit::poll;

    #[test]
    fn a_quiet_spell_releases_once_and_only_after_commits() {
        let idle = Duration::from_secs(30);
        let start = Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        let mut spell = QuietSpell::new(5, start, idle);
        assert!(!spell.due(5, at(100)), "nothing committed since start: the caches are empty");
        assert!(!spell.due(6, at(101)), "a commit starts a spell");
        assert!(!spell.due(6, at(120)), "not quiet for long enough yet");
        assert!(!spell.due(9, at(125)), "more commits start it again");
        assert!(!spell.due(9, at(154)));
        assert!(spell.due(9, at(155)), "quiet for 30 s");
        assert!(!spell.due(9, at(200)), "once per spell");
        assert!(!spell.due(10, at(201)));
        assert!(spell.due(10, at(231)), "the next spell releases again");
    }

    #[tokio::test]
    async fn every_idle_connection_is_emptied() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("herald.db").display());
        let config = StorageConfig { max_connections: 3, ..StorageConfig::default() };
        let database = Database::connect(&url, &config).await.expect("opened");
        database.migrate().await.expect("migrated");
        let (Pool::Sqlite(reader), Pool::Sqlite(writer)) = (&database.reader, &database.writer) else {
            panic!("an SQLite URL opens SQLite pools")
        };
        // Every reader connection opened and back in the pool (a connection dropped goes back
        // in a task of its own).
        let opened: Vec<_> = futures_util::future::join_all((0..3).map(|_| reader.acquire())).await;
        drop(opened);
        let all_idle = async || {
            poll::until("every reader connection idle", async || match reader.num_idle() {
                3 => Ok(()),
                idle => Err(format!("{idle} of 3")),
            })
            .await
        };
        all_idle().await;
        assert_eq!(shrink_caches(reader, writer).await.expect("shrunk"), 4, "the writer and three readers");
        all_idle().await;
        let busy = reader.acquire().await.expect("a reader");
        assert_eq!(shrink_caches(reader, writer).await.expect("shrunk"), 3, "a reader in use is left alone");
        drop(busy);
    }
}
