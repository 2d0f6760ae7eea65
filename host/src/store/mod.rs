//! Durable storage: messages, seq segments, device cursors, groups and direct conversations.
//!
//! The layers above see storage through one trait per repository ([`repos`] and
//! [`SeqLeases`]); [`Database`] implements them for all three backends — SQLite (embedded
//! mode), MySQL/MariaDB and PostgreSQL (cluster mode) — from the same logical schema
//! (`migrations/<backend>`), and [`GroupCommitter`] writes messages in shared commits. Rust
//! code is shared; only SQL text differs, kept as `&'static str` per dialect in [`sqlite`],
//! [`mysql`] and [`postgres`]. The [`on_backend!`] macro runs one body of code against
//! whichever pool is configured, with that dialect's statements.
//!
//! Nothing here knows about WebSockets, the wire protocol or the pipeline: the store depends
//! only on [`crate::model`] and [`crate::config`].

mod batch;
pub mod conversations;
pub mod cursors;
pub mod group_commit;
pub mod groups;
pub mod id_marks;
mod idle_release;
pub mod latency;
pub mod messages;
pub mod mysql;
pub mod plugin_registry;
pub mod postgres;
pub mod repos;
pub mod reworded;
pub mod seq_lease;
pub mod sqlite;
pub mod wal_sync;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::migrate::{MigrateError, Migrator};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use crate::config::{self, StorageConfig};
use crate::model::{ConversationId, InvalidId};
use wal_sync::WalSync;

pub use batch::Submission;
pub use group_commit::{BatchTotals, GroupCommitter};
pub use id_marks::IdMarks;
pub use latency::LatencyWindow;
pub use plugin_registry::PluginRegistryStore;
pub use repos::*;
pub use seq_lease::{Fence, Lease, LeaseError, LeaseSql, OwnerClaim, SeqLeases, SeqRange};

/// How long the server keeps a transaction of ours open while we send it nothing
/// (PostgreSQL's `idle_in_transaction_session_timeout`, MariaDB's
/// `idle_transaction_timeout`; MySQL has no such setting). Ours never wait on anything
/// but the server, so one idle this long belongs to a process that was paused or cut off
/// mid-commit: the server then ends its session and releases its locks. Without this, a
/// paused former owner holding the shared lock of a commit on a conversation's
/// `session_seq` row held the new owner's seq lease up until it was resumed (found by the
/// paused-owner fault test); with it the new owner waits this long at most, and the
/// zombie's commit fails, as the fence requires.
pub const IDLE_TRANSACTION: Duration = Duration::from_secs(5);

/// [`IDLE_TRANSACTION`] as MariaDB takes it (whole seconds).
const MARIADB_IDLE_TRANSACTION: &str = "SET SESSION idle_transaction_timeout = 5";

/// How long a node waits for another node's migrations on MySQL/MariaDB.
const MIGRATE_LOCK_WAIT: Duration = Duration::from_secs(300);
/// The named lock nodes take in turn to migrate one MySQL/MariaDB database.
const MYSQL_MIGRATE_LOCK: &str = "SELECT GET_LOCK(CONCAT('herald-migrate:', DATABASE()), ?)";
const MYSQL_MIGRATE_UNLOCK: &str = "SELECT RELEASE_LOCK(CONCAT('herald-migrate:', DATABASE()))";

static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/sqlite");
static MYSQL_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/mysql");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("../migrations/postgres");

/// What went wrong in storage, worded for the operator; each maps to one client outcome
/// (a transient error becomes `RETRY`).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unsupported database url {0:?}: use sqlite://, mysql://, mariadb:// or postgres://")]
    UnsupportedUrl(String),
    #[error("cannot create the data directory {path}: {source}")]
    DataDir { path: String, source: std::io::Error },
    /// The driver's error, in the message and not as a source: `{error:#}` (anyhow's chain)
    /// would print it twice, and its own source a third time.
    #[error("database error: {0}")]
    Database(sqlx::Error),
    #[error(
        "{path} is not a healthy SQLite database ({detail}); restore it from a backup, or move it aside \
         to start with an empty one (docs/OPERATIONS.md, \"Backup and restore\")"
    )]
    Damaged { path: String, detail: String },
    #[error("applying migrations failed: {0}")]
    Migrate(#[from] MigrateError),
    #[error("message {id} was not stored: its (conversation, seq) or id is taken by another message")]
    Conflict { id: u64 },
    #[error(
        "message {id} (seq {seq} of {conversation}) was not stored: its seq was leased by node {} at ring epoch {}, \
         but {} owns the conversation now; this node must stop acting as its owner",
        fence.node, fence.epoch, describe_owner(owner)
    )]
    Fenced { id: u64, seq: u64, conversation: ConversationId, fence: Fence, owner: Option<Fence> },
    #[error("group {0} already exists")]
    GroupExists(String),
    #[error("there is no group {0}")]
    NoSuchGroup(String),
    #[error("stored data is not valid: {0}")]
    Corrupt(String),
    #[error("the group-commit writer has stopped; the server is shutting down")]
    Closed,
    #[error("could not make the write durable: {0}")]
    Sync(#[source] SyncFailure),
    #[error("the database is not answering ({0}); retry")]
    Unavailable(String),
}

/// Why commits could not be made durable (SQLite's shared fsync of the WAL). Cloned to
/// every write the failed fsync was to cover.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SyncFailure {
    #[error("fsync of {path} failed: {source}")]
    Fsync { path: String, source: Arc<std::io::Error> },
    #[error("messages read were committed but not made durable within {0:?}; the writer is stuck or stopped")]
    Stalled(Duration),
}

impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        Self::Database(error)
    }
}

/// Who a `session_seq` row names as owner, for [`StoreError::Fenced`].
fn describe_owner(owner: &Option<Fence>) -> String {
    match owner {
        Some(owner) => format!("node {} (since ring epoch {})", owner.node, owner.epoch),
        None => "no node (its session_seq row is missing)".to_owned(),
    }
}

/// Which SQL dialect a [`Database`] speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    MySql,
    Postgres,
}

impl Backend {
    /// The backend a URL names, by its scheme.
    ///
    /// # Errors
    /// [`StoreError::UnsupportedUrl`] for any other scheme.
    pub fn of_url(url: &str) -> Result<Self, StoreError> {
        let scheme = url.split_once(':').map_or("", |(scheme, _)| scheme);
        match scheme {
            "sqlite" => Ok(Self::Sqlite),
            "mysql" | "mariadb" => Ok(Self::MySql),
            "postgres" | "postgresql" => Ok(Self::Postgres),
            _ => Err(StoreError::UnsupportedUrl(url.to_owned())),
        }
    }
}

/// The SQL statements that differ between dialects. Statements common to all three live
/// beside the code that runs them.
#[derive(Debug)]
pub struct Sql {
    /// Multi-row message insert, up to `VALUES` (rows are pushed by a query builder).
    pub insert_messages: &'static str,
    /// What follows the rows: skip rows that conflict with stored ones.
    pub insert_messages_tail: &'static str,
    /// Whether the driver's affected-row count of that insert is the number of rows
    /// inserted (not so for MySQL, which counts rows found by `ON DUPLICATE KEY UPDATE`).
    pub insert_count_is_exact: bool,
    /// One message by (sender, client_msg_id): the original of a duplicate insert.
    pub message_by_client_id: &'static str,
    /// Messages after a seq, ascending.
    pub messages_after: &'static str,
    /// Messages before a seq, descending (callers reverse).
    pub messages_before: &'static str,
    /// The highest stored seq of a conversation.
    pub latest_seq: &'static str,
    /// Each conversation with messages from an id on, and the lowest seq among them (a
    /// range of the primary key: ids grow with time).
    pub changed_since: &'static str,
    /// How a seq lease is taken, owner fence included.
    pub lease: LeaseSql,
    /// The text before and after the bound list of conversations of a statement that takes
    /// the shared lock of those `session_seq` rows, in sorted order, and reads
    /// `conversation, owner_node, owner_epoch`: the commit's fence check. `None` skips the
    /// check (SQLite: embedded mode, one node, one writer).
    pub lock_owners: Option<(&'static str, &'static str)>,
    /// What follows the rows of `id_marks::RAISE_ID_MARKS`: a row already there keeps
    /// the larger mark.
    pub raise_id_marks_tail: &'static str,
    /// The id high-water mark of a node id (binds: node id), NULL when it has none.
    pub id_mark: &'static str,
    /// Multi-row cursor upsert tail: keeps the larger seq.
    pub upsert_cursors_tail: &'static str,
    /// Cursors of one device.
    pub cursors_of_device: &'static str,
    /// Creates a group (fails on a taken id).
    pub insert_group: &'static str,
    /// Adds a member unless present.
    pub add_member: &'static str,
    /// Removes a member.
    pub remove_member: &'static str,
    /// Counts the groups of an id: 1 when it exists.
    pub group_exists: &'static str,
    /// Members of a group, sorted.
    pub group_members: &'static str,
    /// Groups of a user, sorted.
    pub groups_of_user: &'static str,
    /// Records that a user takes part in a direct conversation (idempotent).
    pub add_user_conversation: &'static str,
    /// The direct conversations of a user.
    pub user_conversations: &'static str,
}

/// A pool of the configured backend.
#[derive(Clone, Debug)]
pub enum Pool {
    Sqlite(SqlitePool),
    MySql(MySqlPool),
    Postgres(PgPool),
}

/// Runs `$body` against a [`Pool`] (`database.reader` or `database.writer`), with `$pool`
/// bound to the driver's pool and `$sql` to that dialect's [`Sql`]. The body is compiled
/// once per backend, so it may use each driver's concrete types.
#[macro_export]
#[doc(hidden)]
macro_rules! on_backend {
    ($pool_expr:expr, |$pool:ident, $sql:ident| $body:expr) => {
        match &$pool_expr {
            $crate::store::Pool::Sqlite($pool) => {
                let $sql = &$crate::store::sqlite::SQL;
                $body
            }
            $crate::store::Pool::MySql($pool) => {
                let $sql = &$crate::store::mysql::SQL;
                $body
            }
            $crate::store::Pool::Postgres($pool) => {
                let $sql = &$crate::store::postgres::SQL;
                $body
            }
        }
    };
}
pub(crate) use on_backend;

/// Handle to the database, cheap to clone. It implements every repository trait but
/// [`MessageWriter`], which the [`GroupCommitter`] in front of it implements.
#[derive(Clone, Debug)]
pub struct Database {
    /// Connections for reads.
    pub reader: Pool,
    /// Connections for writes. For SQLite this is one connection of its own: SQLite takes
    /// one writer at a time anyway, and a connection that did the last write keeps its page
    /// cache, where rotating writes over a pool makes each connection re-read the pages
    /// another one changed. Elsewhere it is the same pool as `reader`.
    pub writer: Pool,
    /// SQLite with `sqlite_synchronous = "full"`: makes message commits durable after they
    /// return, off the writer's thread (see [`wal_sync`]).
    pub(crate) wal: Option<Arc<WalSync>>,
    /// The id marks this process committed, so commits they cover skip raising them.
    pub(crate) raised_marks: Arc<id_marks::RaisedMarks>,
}

/// What an SQLite error says about the file, when it says it is not a database or is
/// corrupt (SQLITE_NOTADB, SQLITE_CORRUPT).
fn sqlite_damage(error: &sqlx::Error) -> Option<String> {
    let database = error.as_database_error()?;
    // Extended codes keep the primary code in their low byte (SQLITE_CORRUPT_INDEX is 779).
    let primary = database.code()?.parse::<u32>().ok()? & 0xff;
    matches!(primary, 11 | 26).then(|| database.message().to_owned())
}

impl Database {
    /// Opens a pool for `url` (creating the SQLite file and its folder if needed). Does not
    /// migrate; call [`migrate`](Self::migrate).
    ///
    /// # Errors
    /// [`StoreError`] when the URL is not understood or the database cannot be reached.
    pub async fn connect(url: &str, config: &StorageConfig) -> Result<Self, StoreError> {
        let mut wal = None;
        let (reader, writer) = match Backend::of_url(url)? {
            Backend::Sqlite => {
                let options = SqliteConnectOptions::from_str(url)?
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .page_size(config.sqlite_page_size)
                    // No commit fsyncs: message commits are made durable afterwards, off the
                    // writer's thread (see `wal_sync`). A seq lease, a cursor or a membership
                    // row written before a durable commit is made durable by it, and losing
                    // one written after costs nothing but a redelivery or a gap.
                    .synchronous(SqliteSynchronous::Normal)
                    .busy_timeout(Duration::from_secs(10))
                    .foreign_keys(true)
                    // The unique indexes are written at random places; keep their pages
                    // cached rather than re-read from the OS.
                    .pragma("cache_size", format!("-{}", config.sqlite_cache_mib * 1024))
                    // A multi-row write that could abort halfway keeps a statement journal
                    // (to undo just that statement); on disk it costs a write() per page
                    // touched. Message inserts avoid it (`INSERT OR IGNORE`); cursor upserts
                    // still keep one. It is scratch data: keep it in memory.
                    .pragma("temp_store", "memory")
                    // Checkpoints run in the background (see `checkpoint_periodically`),
                    // not inside a commit, where copying the WAL into the database and
                    // fsyncing it would stall every send waiting on that commit. This cap
                    // is only the backstop for when the background checkpoints fall behind.
                    .pragma("wal_autocheckpoint", config.sqlite_wal_autocheckpoint_pages.to_string());
                let database_file = options.get_filename().to_owned();
                if let Some(parent) = options.get_filename().parent()
                    && !parent.as_os_str().is_empty()
                {
                    std::fs::create_dir_all(parent)
                        .map_err(|source| StoreError::DataDir { path: parent.display().to_string(), source })?;
                }
                // A local file cannot drop a connection the way a server can: pinging each
                // connection before handing it out only adds a round trip to every query.
                let damaged =
                    |detail: String| StoreError::Damaged { path: database_file.display().to_string(), detail };
                let writer = SqlitePoolOptions::new()
                    .test_before_acquire(false)
                    // A transaction that failed part-way (a full disk, say) may have been
                    // rolled back by SQLite itself; the driver's ROLLBACK then fails and it
                    // still counts the connection as inside a transaction, so the next one
                    // would open a savepoint that never commits: acked, never stored. Such a
                    // connection is closed when released, never reused.
                    .after_release(|connection, _| {
                        Box::pin(async move { Ok(!sqlx::Connection::is_in_transaction(connection)) })
                    })
                    .max_connections(1)
                    .acquire_timeout(config.connect_timeout)
                    .connect_with(options.clone())
                    .await
                    .map_err(|error| match sqlite_damage(&error) {
                        Some(detail) => damaged(detail),
                        None => StoreError::Database(error),
                    })?;
                if config.sqlite_quick_check {
                    let findings: Vec<String> = sqlx::query_scalar("PRAGMA quick_check(5)")
                        .fetch_all(&writer)
                        .await
                        .map_err(|error| sqlite_damage(&error).map_or(StoreError::Database(error), damaged))?;
                    if findings.iter().any(|finding| finding != "ok") {
                        return Err(damaged(findings.join("; ")));
                    }
                }
                let reader = SqlitePoolOptions::new()
                    .test_before_acquire(false)
                    .max_connections(config.max_connections)
                    .acquire_timeout(config.connect_timeout)
                    .connect_with(options)
                    .await?;
                // Message commits are made durable by syncing the WAL file: only when there
                // is one (an in-memory database has none, and nothing to make durable).
                let journal: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(&writer).await?;
                if config.sqlite_synchronous == config::SqliteSynchronous::Full && journal.eq_ignore_ascii_case("wal") {
                    wal = Some(Arc::new(WalSync::new(&database_file)));
                }
                (Pool::Sqlite(reader), Pool::Sqlite(writer))
            }
            Backend::MySql => {
                let url = url.replacen("mariadb://", "mysql://", 1);
                let options = MySqlConnectOptions::from_str(&url)?;
                let pool = Pool::MySql(
                    MySqlPoolOptions::new()
                        .max_connections(config.max_connections)
                        .acquire_timeout(config.connect_timeout)
                        .after_connect(|connection, _| {
                            Box::pin(async move {
                                // MariaDB's name for it; MySQL has none and refuses the
                                // variable, which changes nothing there.
                                if let Err(error) = sqlx::Executor::execute(connection, MARIADB_IDLE_TRANSACTION).await
                                {
                                    tracing::debug!(%error, "no idle-transaction timeout on this server");
                                }
                                Ok(())
                            })
                        })
                        .connect_with(options)
                        .await?,
                );
                (pool.clone(), pool)
            }
            Backend::Postgres => {
                let idle = IDLE_TRANSACTION.as_millis().to_string();
                let options =
                    PgConnectOptions::from_str(url)?.options([("idle_in_transaction_session_timeout", idle.as_str())]);
                let pool = Pool::Postgres(
                    PgPoolOptions::new()
                        .max_connections(config.max_connections)
                        .acquire_timeout(config.connect_timeout)
                        .connect_with(options)
                        .await?,
                );
                (pool.clone(), pool)
            }
        };
        Ok(Self { reader, writer, wal, raised_marks: Arc::default() })
    }

    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        match self.writer {
            Pool::Sqlite(_) => Backend::Sqlite,
            Pool::MySql(_) => Backend::MySql,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }

    /// Applies the migrations this database lacks; a no-op when it is up to date. Returns
    /// the number of migrations the schema is made of.
    ///
    /// # Errors
    /// [`StoreError::Migrate`] when a migration fails or the database has migrations this
    /// binary does not know (a newer Herald ran against it).
    pub async fn migrate(&self) -> Result<usize, StoreError> {
        let migrator = match self.writer {
            Pool::Sqlite(_) => &SQLITE_MIGRATIONS,
            Pool::MySql(_) => &MYSQL_MIGRATIONS,
            Pool::Postgres(_) => &POSTGRES_MIGRATIONS,
        };
        reworded::accept_rewording(&self.writer, migrator, self.backend()).await?;
        match &self.writer {
            Pool::Sqlite(pool) => SQLITE_MIGRATIONS.run(pool).await?,
            Pool::MySql(pool) => {
                // sqlx's own lock asks `GET_LOCK` to wait for ever with a negative timeout,
                // which MariaDB answers at once without the lock: nodes starting together
                // on a new database would apply the same migration twice. A named lock of
                // Herald's own, held on a connection of its own, covers the whole run.
                let mut holder = pool.acquire().await?;
                let (got,): (Option<i64>,) = sqlx::query_as(MYSQL_MIGRATE_LOCK)
                    .bind(MIGRATE_LOCK_WAIT.as_secs())
                    .fetch_one(&mut *holder)
                    .await?;
                if got != Some(1) {
                    return Err(StoreError::Unavailable(format!(
                        "another node held the migration lock for {} s",
                        MIGRATE_LOCK_WAIT.as_secs()
                    )));
                }
                let run = MYSQL_MIGRATIONS.run(pool).await;
                // A lock left held ends with its connection, so a failed release is dropped.
                if sqlx::query(MYSQL_MIGRATE_UNLOCK).execute(&mut *holder).await.is_err() {
                    holder.detach();
                }
                run?;
            }
            Pool::Postgres(pool) => POSTGRES_MIGRATIONS.run(pool).await?,
        }
        Ok(migrator.iter().count())
    }

    /// SQLite only: copies the WAL into the database every `every`, off the commit path
    /// (`PASSIVE`: it never blocks readers or the writer). Returns at once elsewhere.
    pub async fn checkpoint_periodically(self, every: Duration) {
        let Pool::Sqlite(pool) = &self.reader else { return };
        let mut ticks = tokio::time::interval(every);
        loop {
            ticks.tick().await;
            if let Err(error) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(pool).await {
                if pool.is_closed() {
                    return; // shut down: closing the database checkpoints it
                }
                tracing::warn!(%error, "WAL checkpoint failed");
            }
        }
    }

    /// Closes every connection, waiting for those in use.
    pub async fn close(&self) {
        on_backend!(self.reader, |pool, _sql| pool.close().await);
        on_backend!(self.writer, |pool, _sql| pool.close().await);
    }
}

#[async_trait]
impl StoreProbe for Database {
    async fn ping(&self) -> bool {
        on_backend!(self.reader, |pool, _sql| sqlx::query("SELECT 1").execute(pool).await.is_ok())
    }
}

/// Rows per multi-row statement: at 9 parameters a row (a message; a cursor has 4) this
/// stays far below every driver's limit on bound parameters (SQLite 32,766; MySQL and
/// PostgreSQL 65,535). Larger batches are split into several statements of one transaction.
pub(crate) const ROWS_PER_STATEMENT: usize = 256;

/// Converts a stored signed BIGINT back to the unsigned value Herald wrote.
pub(crate) fn unsigned(value: i64, column: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError::Corrupt(format!("{column} is negative: {value}")))
}

/// Converts an unsigned value to the signed BIGINT every backend stores. Snowflake ids,
/// seqs and timestamps stay below 2^63, so this only saturates on nonsense input.
pub(crate) fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Parses a stored id read back as part of a row that cannot do without it.
///
/// # Errors
/// [`StoreError::Corrupt`] naming the column and the value.
pub(crate) fn parse_stored<T>(
    text: &str,
    column: &str,
    parse: impl FnOnce(&str) -> Result<T, InvalidId>,
) -> Result<T, StoreError> {
    parse(text).map_err(|error| StoreError::Corrupt(format!("{column} {text:?}: {error}")))
}

/// Parses a list of stored ids, leaving out (with a warning) any that is not valid, so one
/// bad row does not fail a read that is useful without it.
pub(crate) fn parse_each<T>(values: Vec<String>, column: &str, parse: impl Fn(&str) -> Result<T, InvalidId>) -> Vec<T> {
    values
        .into_iter()
        .filter_map(|text| match parse_stored(&text, column, &parse) {
            Ok(id) => Some(id),
            Err(error) => {
                tracing::warn!(%error, "skipping a stored id");
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::StoreError;

    #[test]
    fn a_database_error_is_told_once_in_a_full_chain() {
        let error = anyhow::Error::from(StoreError::from(sqlx::Error::PoolTimedOut));
        let told = format!("{error:#}");
        let driver = sqlx::Error::PoolTimedOut.to_string();
        assert_eq!(told.matches(&driver).count(), 1, "{told}");
        assert!(told.starts_with("database error: "), "{told}");
    }
}
