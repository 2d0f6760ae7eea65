//! Layered configuration: built-in defaults < config file (TOML) < `HERALD_*` environment
//! variables < command-line flags.
//!
//! Every setting has a default that gives embedded mode: SQLite under the data dir, in-memory
//! state, nothing else to install. Nested keys use `__` in environment variables:
//! `HERALD_STORAGE__URL=postgres://…` sets `[storage] url`. Unknown keys are errors, so a
//! typo never silently falls back to a default.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::MAX_NODE_ID;

mod cluster;
mod edge;
mod ids;
mod intake;
mod registry;
mod tls;

pub use cluster::{ClusterConfig, DEV_CLUSTER_SECRET, Placement};
pub use edge::{ApiConfig, GatewayConfig};
pub use ids::IdsConfig;
pub use intake::IntakeConfig;
pub use registry::PluginRegistryConfig;
pub use tls::TlsConfig;

/// The most `worker_threads` may name: past the cores a machine has, more threads only
/// switch more.
pub const MAX_WORKER_THREADS: usize = 1024;

/// A configuration that cannot be used, with what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    File { path: PathBuf, source: config::ConfigError },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// Everything `herald serve` and `herald migrate` need to know.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address the HTTP and WebSocket server listens on.
    pub listen: SocketAddr,
    /// Where embedded mode keeps its SQLite database (and other local state).
    pub data_dir: PathBuf,
    /// Folder of `.wasm` plugins to load; defaults to `<data_dir>/plugins`.
    pub plugins: Option<PathBuf>,
    /// Dev mode (PROTOCOL.md): loopback only, `dev:<user>` tokens, `dev-key` api key.
    pub dev: bool,
    /// This node's id, 0..=1023, part of every snowflake id. Embedded mode: 0 unless set.
    /// Cluster mode leases a free one unless it is pinned here (`HERALD_NODE_ID`); a pinned
    /// id another live node holds refuses to start.
    pub node_id: Option<u32>,
    /// Threads running this node's tasks; 0 (the default) is one per CPU core. Where
    /// several nodes share a machine, each can be given its share of the cores: three nodes
    /// sharing two cores spend less CPU with one thread each than with two, at the same
    /// latency and throughput (docs/BENCHMARKS.md, "Cluster messaging").
    pub worker_threads: usize,
    /// The database.
    pub storage: StorageConfig,
    /// The seq allocator.
    pub seq: SeqConfig,
    /// Message ids across restarts.
    pub ids: IdsConfig,
    /// The WebSocket edge.
    pub gateway: GatewayConfig,
    /// Push, acks, retries, backfill and pull.
    pub delivery: DeliveryConfig,
    /// HTTP API keys.
    pub api: ApiConfig,
    /// The Wasm plugin runtime: pools, limits, quarantine, and per-plugin overrides under
    /// `[plugin_runtime.plugins.<name>]` (see `sdk/README.md`).
    pub plugin_runtime: herald_plugin_runtime::PluginHostConfig,
    /// The plugin registry in the database: upload size, how nodes follow it.
    pub plugin_registry: PluginRegistryConfig,
    /// Cluster mode: on when `redis_url` is set.
    pub cluster: ClusterConfig,
    /// Intake protection: send and HTTP rates, the backlog cap, connection caps.
    pub intake: IntakeConfig,
    /// TLS on the client listener and node-to-node links: on when `cert_file` is set.
    pub tls: TlsConfig,
}

/// `[delivery]`: how messages reach devices.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliveryConfig {
    /// A pushed message not acked within this many ms is pushed again; the wait doubles
    /// each attempt (2 s, 4 s, 8 s …). The least ack timeout: a connection whose round
    /// trips are slow or jittery gets a longer one (see `delivery::rtt`).
    pub ack_timeout_ms: u64,
    /// The most a connection's measured round trips may stretch its ack timeout to.
    pub ack_timeout_max_ms: u64,
    /// Cap on the wait between attempts.
    pub backoff_max_ms: u64,
    /// Random extra wait, as a share of the wait (0.3 = 0–30 %).
    pub jitter: f64,
    /// Pushes of one message to one device, the first included (6: the first push and 5
    /// retries, over about a minute at the default waits); then it waits for pull.
    pub max_attempts: u32,
    /// Acked cursors are written to storage at most this often (coalesced). They share the
    /// single SQLite writer with messages: at 100 ms, flushes of a thousand devices' cursors
    /// took about a fifth of its time flat out. A position not yet written still counts at
    /// the device's next backfill on this node, and is written at shutdown; only a crash
    /// loses it, and then the device is pushed again what it had acked.
    pub cursor_flush_ms: u64,
    /// Most messages pushed per conversation when a device connects; the rest by `sync`.
    pub backfill_limit: u32,
    /// Devices backfilled at once on this node, so a reconnect storm cannot flood it.
    pub backfill_concurrency: usize,
    /// Largest `limit` honoured by `sync` and `history`.
    pub max_page: u32,
    /// Most cursors one `sync` may carry (an `error` `limit_exceeded` past it).
    pub max_sync_cursors: usize,
    /// Most rooms one connection may be subscribed to at once (an `error`
    /// `limit_exceeded` past it).
    pub max_rooms_per_connection: usize,
    /// How long a dedup mark lives, in ms (the unique index guards beyond it).
    pub dedup_ttl_ms: u64,
    /// Most dedup marks held in embedded mode; past it the oldest go first (a duplicate of
    /// an evicted one is still caught by the unique index, which answers with the
    /// original's ids). About 100 bytes each (docs/ARCHITECTURE.md, "Memory per dedup mark").
    pub dedup_max_marks: u64,
    /// How often the node samples its health and asks the degrade hook for a tier, in ms.
    pub degrade_interval_ms: u64,
    /// Cluster mode: how long a `deliver` that never reached another node (its link broke
    /// or could not be opened, its breaker is open) is asked again in the background, in
    /// ms (one that went out and was not answered in time is not): first after
    /// 100 ms, the wait doubling to 2 s, while that node is still a member. 0 asks once
    /// only; its devices then get the message at their next sync or reconnect.
    pub hop_retry_for_ms: u64,
    /// Cluster mode: most such deliveries waiting to be asked again at once; past it a
    /// failed one is left to its devices' next sync.
    pub hop_retry_max_pending: usize,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        Self {
            ack_timeout_ms: 2_000,
            ack_timeout_max_ms: 30_000,
            backoff_max_ms: 60_000,
            jitter: 0.3,
            max_attempts: 6,
            cursor_flush_ms: 1_000,
            backfill_limit: 1_000,
            backfill_concurrency: 32,
            max_page: 500,
            max_sync_cursors: 1_000,
            max_rooms_per_connection: 256,
            dedup_ttl_ms: 600_000,
            dedup_max_marks: 100_000,
            degrade_interval_ms: 1_000,
            hop_retry_for_ms: 10_000,
            hop_retry_max_pending: 10_000,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            data_dir: PathBuf::from("herald-data"),
            plugins: None,
            dev: false,
            node_id: None,
            worker_threads: 0,
            storage: StorageConfig::default(),
            seq: SeqConfig::default(),
            ids: IdsConfig::default(),
            gateway: GatewayConfig::default(),
            delivery: DeliveryConfig::default(),
            api: ApiConfig::default(),
            plugin_runtime: herald_plugin_runtime::PluginHostConfig::default(),
            plugin_registry: PluginRegistryConfig::default(),
            cluster: ClusterConfig::default(),
            intake: IntakeConfig::default(),
            tls: TlsConfig::default(),
        }
    }
}

/// `[storage]`: which database, and how writes are batched.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// `sqlite://path`, `mysql://…` / `mariadb://…` or `postgres://…`. Unset: SQLite at
    /// `<data_dir>/herald.db`.
    pub url: Option<String>,
    /// Connections in the pool.
    pub max_connections: u32,
    /// How long to wait for a connection before failing the call.
    #[serde(rename = "connect_timeout_ms", with = "millis")]
    pub connect_timeout: Duration,
    /// SQLite's `synchronous` pragma: `full` (an OK survives power loss) or `normal`
    /// (survives a process crash; faster).
    pub sqlite_synchronous: SqliteSynchronous,
    /// SQLite page cache per connection, in MiB.
    pub sqlite_cache_mib: u32,
    /// SQLite copies the WAL into the database in the background this often, in ms. Each
    /// checkpoint ends with an fsync of the database file, which holds up the WAL fsyncs
    /// that acknowledge sends: more often means smaller ones (after a burst, at 5,000
    /// msgs/s: p999 15-33 ms at 250 ms, 32-52 ms at 1 s).
    pub sqlite_checkpoint_ms: u64,
    /// Once no message was committed for this long, in ms, SQLite's page caches are emptied
    /// (`PRAGMA shrink_memory`), so the memory a burst filled them with goes back; the next
    /// commits read their pages again from the OS's cache. `0` keeps them full.
    pub sqlite_idle_release_ms: u64,
    /// Backstop: a commit checkpoints by itself once the WAL holds this many pages
    /// (only when the background checkpoints fall behind).
    pub sqlite_wal_autocheckpoint_pages: u32,
    /// SQLite page size in bytes (a power of two, 512..=65536), used when the database file
    /// is created; an existing file keeps the size it was made with.
    pub sqlite_page_size: u32,
    /// Run SQLite's `quick_check` when opening the database, so a damaged file is refused
    /// at start with what is wrong instead of failing sends later. It reads every page:
    /// about a second per GiB.
    pub sqlite_quick_check: bool,
    /// Group commit of message inserts.
    pub group_commit: GroupCommitConfig,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            url: None,
            max_connections: 8,
            connect_timeout: Duration::from_secs(5),
            sqlite_synchronous: SqliteSynchronous::Full,
            sqlite_cache_mib: 64,
            sqlite_checkpoint_ms: 250,
            sqlite_idle_release_ms: 30_000,
            sqlite_wal_autocheckpoint_pages: 65_536,
            sqlite_page_size: 8192,
            sqlite_quick_check: true,
            group_commit: GroupCommitConfig::default(),
        }
    }
}

/// SQLite durability level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSynchronous {
    /// Every message commit is made durable (an fsync of the WAL, off SQLite's writer
    /// thread, shared by the commits that end meanwhile) before any sender hears OK, and
    /// before any reader is shown its rows.
    Full,
    /// fsync at checkpoints only.
    Normal,
}

/// `[storage.group_commit]`: concurrent inserts share one transaction.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct GroupCommitConfig {
    /// Most rows committed by one transaction (1..=8192).
    pub max_batch: usize,
    /// Batches written at once. Unset: 1 for SQLite and PostgreSQL, 2 for MariaDB/MySQL.
    pub writers: Option<usize>,
    /// Inserts waiting for a batch before callers are slowed down.
    pub queue: usize,
    /// A batch not committed within this many ms fails (its senders get RETRY; a late
    /// commit is harmless: the resend is answered DUPLICATE with the stored ids).
    pub commit_timeout_ms: u64,
    /// The store's circuit breaker: this many rows failed or timed out in a row, over at
    /// least `breaker_span_ms`, open it for `breaker_open_ms`, during which sends are
    /// answered RETRY at once instead of queueing into a database that does not answer;
    /// then it lets a batch through to probe. The tier is at least `offline-only` while it
    /// is not closed.
    pub breaker_failures: u32,
    pub breaker_span_ms: u64,
    pub breaker_open_ms: u64,
}

impl Default for GroupCommitConfig {
    fn default() -> Self {
        Self {
            max_batch: 8192,
            writers: None,
            queue: 65_536,
            commit_timeout_ms: 5_000,
            breaker_failures: 10,
            breaker_span_ms: 1_000,
            breaker_open_ms: 5_000,
        }
    }
}

impl GroupCommitConfig {
    /// The store breaker's settings.
    pub fn breaker(&self) -> crate::breaker::BreakerConfig {
        crate::breaker::BreakerConfig {
            failures: self.breaker_failures.max(1),
            span: std::time::Duration::from_millis(self.breaker_span_ms),
            open_for: std::time::Duration::from_millis(self.breaker_open_ms),
        }
    }
}

/// Settings given as command-line flags; they win over everything else.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub plugins: Option<PathBuf>,
    pub dev: bool,
}

impl Config {
    /// Builds the configuration from defaults, `file`, the process environment and `flags`.
    ///
    /// # Errors
    /// [`ConfigError`] when the file cannot be read or parsed, a key is unknown, or a value
    /// is out of range.
    pub fn load(file: Option<&Path>, flags: &Overrides) -> Result<Self, ConfigError> {
        Self::load_from(file, std::env::vars(), flags)
    }

    /// [`load`](Self::load) with the environment given explicitly (for tests).
    ///
    /// # Errors
    /// As [`load`](Self::load).
    pub fn load_from(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        flags: &Overrides,
    ) -> Result<Self, ConfigError> {
        let mut builder = config::Config::builder();
        if let Some(path) = file {
            builder = builder.add_source(config::File::from(path).format(config::FileFormat::Toml));
        }
        // HERALD_CONFIG names the file and HERALD_TEST_* belong to the test suite; neither is
        // a setting.
        let settings: HashMap<String, String> = env
            .into_iter()
            .filter(|(key, _)| key.starts_with("HERALD_") && key != "HERALD_CONFIG" && !key.starts_with("HERALD_TEST_"))
            .collect();
        builder = builder.add_source(
            config::Environment::with_prefix("HERALD")
                .prefix_separator("_")
                .separator("__")
                .try_parsing(true)
                .source(Some(settings)),
        );
        let layered = builder.build().map_err(|source| match file {
            Some(path) => ConfigError::File { path: path.to_owned(), source },
            None => ConfigError::Invalid(source.to_string()),
        })?;
        let mut config: Config = layered.try_deserialize().map_err(|error| ConfigError::Invalid(error.to_string()))?;

        if let Some(listen) = flags.listen {
            config.listen = listen;
        }
        if let Some(dir) = &flags.data_dir {
            config.data_dir.clone_from(dir);
        }
        if let Some(dir) = &flags.plugins {
            config.plugins = Some(dir.clone());
        }
        config.dev |= flags.dev;
        config.validate()?;
        Ok(config)
    }

    /// Checks the settings make sense together (done by [`load_from`](Self::load_from); a
    /// config built in code is checked when the node opens).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the offending setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(node_id) = self.node_id.filter(|&id| id > u32::from(MAX_NODE_ID)) {
            return Err(ConfigError::Invalid(format!(
                "node_id {node_id} is out of range; it must be 0..={MAX_NODE_ID}"
            )));
        }
        if self.worker_threads > MAX_WORKER_THREADS {
            return Err(ConfigError::Invalid(format!(
                "worker_threads {} is more than {MAX_WORKER_THREADS}; 0 means one per CPU core",
                self.worker_threads
            )));
        }
        self.validate_cluster()?;
        if self.dev && !self.listen.ip().is_loopback() {
            return Err(ConfigError::Invalid(format!(
                "dev mode listens on loopback only, but listen is {}; drop --dev or listen on 127.0.0.1",
                self.listen
            )));
        }
        let batch = self.storage.group_commit.max_batch;
        if !(1..=8192).contains(&batch) {
            return Err(ConfigError::Invalid(format!("storage.group_commit.max_batch {batch} must be 1..=8192")));
        }
        if self.storage.group_commit.writers == Some(0) || self.storage.group_commit.queue == 0 {
            return Err(ConfigError::Invalid("storage.group_commit.writers and .queue must be at least 1".into()));
        }
        let page = self.storage.sqlite_page_size;
        if !(512..=65_536).contains(&page) || !page.is_power_of_two() {
            return Err(ConfigError::Invalid(format!(
                "storage.sqlite_page_size {page} must be a power of two from 512 to 65536"
            )));
        }
        if self.storage.max_connections == 0 {
            return Err(ConfigError::Invalid("storage.max_connections must be at least 1".into()));
        }
        self.gateway.validate().map_err(ConfigError::Invalid)?;
        self.api.validate().map_err(ConfigError::Invalid)?;
        self.tls.validate().map_err(ConfigError::Invalid)?;
        let d = &self.delivery;
        if d.ack_timeout_ms == 0 || d.max_attempts == 0 || !(0.0..=1.0).contains(&d.jitter) || d.max_page == 0 {
            return Err(ConfigError::Invalid(
                "delivery.ack_timeout_ms, max_attempts and max_page must be at least 1, jitter in [0, 1]".into(),
            ));
        }
        if d.backfill_concurrency == 0
            || d.cursor_flush_ms == 0
            || d.degrade_interval_ms == 0
            || d.max_sync_cursors == 0
            || d.max_rooms_per_connection == 0
        {
            return Err(ConfigError::Invalid(
                "delivery.backfill_concurrency, cursor_flush_ms, degrade_interval_ms, max_sync_cursors and \
                 max_rooms_per_connection must be at least 1"
                    .into(),
            ));
        }
        self.ids.validate().map_err(ConfigError::Invalid)?;
        self.plugin_registry.validate().map_err(ConfigError::Invalid)?;
        self.seq.validate().map_err(ConfigError::Invalid)
    }

    /// The `[cluster]` settings, when cluster mode is on.
    fn validate_cluster(&self) -> Result<(), ConfigError> {
        let cluster = &self.cluster;
        if !cluster.enabled() {
            return Ok(());
        }
        let url = self.database_url();
        if !(url.starts_with("postgres") || url.starts_with("mysql") || url.starts_with("mariadb")) {
            return Err(ConfigError::Invalid(format!(
                "cluster mode (cluster.redis_url) needs a database every node shares, but storage.url is {}; \
                 set storage.url (HERALD_STORAGE__URL) to a mysql://, mariadb:// or postgres:// URL. SQLite is a \
                 file of one node: a second node would allocate the same seqs",
                if self.storage.url.is_some() { url.as_str() } else { "unset (SQLite under the data dir)" }
            )));
        }
        if cluster.secret(self.dev).is_none() {
            return Err(ConfigError::Invalid(
                "cluster.secret is required in cluster mode outside dev mode (HERALD_CLUSTER__SECRET); set the same \
                 secret on every node: it authenticates node-to-node links"
                    .into(),
            ));
        }
        if !(300..=60_000).contains(&cluster.lease_ttl_ms) {
            return Err(ConfigError::Invalid(format!(
                "cluster.lease_ttl_ms {} must be 300..=60000 (the default, 3000, lets a dead node's conversations \
                 move within about 3 s)",
                cluster.lease_ttl_ms
            )));
        }
        if !(1..=1000).contains(&cluster.breaker_failures)
            || cluster.breaker_span_ms > 60_000
            || !(100..=600_000).contains(&cluster.breaker_open_ms)
        {
            return Err(ConfigError::Invalid(format!(
                "cluster.breaker_failures {} must be 1..=1000, cluster.breaker_span_ms {} 0..=60000 and \
                 cluster.breaker_open_ms {} 100..=600000 (the defaults, 10, 1000 and 5000: ten failures in a row \
                 over at least 1 s open a breaker for 5 s)",
                cluster.breaker_failures, cluster.breaker_span_ms, cluster.breaker_open_ms
            )));
        }
        if !(1..=1000).contains(&cluster.virtual_nodes) {
            return Err(ConfigError::Invalid(format!(
                "cluster.virtual_nodes {} must be 1..=1000",
                cluster.virtual_nodes
            )));
        }
        if cluster.placement != Placement::None && cluster.client_url.is_none() && self.listen.ip().is_unspecified() {
            return Err(ConfigError::Invalid(format!(
                "cluster.placement = {:?} lists every node in nginx's upstream by the address clients reach it at, \
                 but listen is the wildcard {} and cluster.client_url is unset; set cluster.client_url \
                 (HERALD_CLUSTER__CLIENT_URL) to this node's ws:// URL as nginx reaches it",
                cluster.placement.name(),
                self.listen
            )));
        }
        cluster.check_links(self.dev, self.tls.enabled()).map_err(ConfigError::Invalid)
    }

    /// The database URL, defaulting to SQLite under the data dir.
    pub fn database_url(&self) -> String {
        match &self.storage.url {
            Some(url) => url.clone(),
            None => format!("sqlite://{}", self.data_dir.join("herald.db").display()),
        }
    }

    /// The folder plugins are loaded from.
    pub fn plugins_dir(&self) -> PathBuf {
        self.plugins.clone().unwrap_or_else(|| self.data_dir.join("plugins"))
    }
}

/// Most segments ever kept leased ahead of the one in use. Only a conversation whose
/// segments last well under `prefetch_ahead` gets near it: 256 segments of 1000 cover 29 ms
/// at 8.7 M seqs/s (the renewals bench's tight loop), longer than the SQLite stalls seen
/// there; 64 covered 7 ms and was outlasted. A crash skips at most this many segments.
pub const MAX_PREFETCH: usize = 256;

/// Tuning of the allocator; `[seq]` in the config file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SeqConfig {
    /// Smallest segment, used for quiet conversations (bounds what a crash wastes).
    pub min_step: u64,
    /// Largest segment, used for the hottest conversations.
    pub max_step: u64,
    /// How long a segment should last; the step adapts towards it.
    #[serde(rename = "segment_lifetime_ms", with = "millis")]
    pub segment_lifetime: Duration,
    /// Fraction of a segment used before the next one is leased in the background.
    pub prefetch_at: f64,
    /// Segments kept leased ahead of the one in use (at least 1). More than one absorbs a
    /// lease that is slow now and then (a busy database, a descheduled thread) without a
    /// caller waiting, at the cost of more seqs skipped when the node stops.
    pub prefetch_segments: usize,
    /// When a conversation's segments last less than this (a hot one whose step is capped
    /// at `max_step`, or one whose step is still growing), more segments are kept ahead,
    /// enough for this long at its current pace (at most 256): a lease that is slow now and
    /// then is then absorbed however hot the conversation. More seqs are skipped on a crash.
    #[serde(rename = "prefetch_ahead_ms", with = "millis")]
    pub prefetch_ahead: Duration,
    /// A conversation no seq was taken from for this long (up to twice as long) is
    /// forgotten: its memory is freed and the rest of its leased segments skipped (a gap).
    /// Zero keeps every conversation a node ever served in memory.
    #[serde(rename = "evict_idle_ms", with = "millis")]
    pub evict_idle: Duration,
}

impl Default for SeqConfig {
    fn default() -> Self {
        Self {
            min_step: 16,
            max_step: 8192,
            segment_lifetime: Duration::from_secs(10),
            prefetch_at: 0.5,
            prefetch_segments: 2,
            prefetch_ahead: Duration::from_millis(50),
            evict_idle: Duration::from_secs(300),
        }
    }
}

impl SeqConfig {
    /// Checks the bounds make sense together.
    ///
    /// # Errors
    /// A message naming the offending setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.min_step == 0 || self.min_step > self.max_step {
            return Err(format!(
                "seq.min_step ({}) must be at least 1 and at most seq.max_step ({})",
                self.min_step, self.max_step
            ));
        }
        if self.prefetch_segments == 0 || self.prefetch_segments > MAX_PREFETCH {
            return Err(format!("seq.prefetch_segments ({}) must be 1..={MAX_PREFETCH}", self.prefetch_segments));
        }
        if !(0.0..1.0).contains(&self.prefetch_at) {
            return Err(format!("seq.prefetch_at ({}) must be in [0, 1)", self.prefetch_at));
        }
        Ok(())
    }
}

/// Serde for a `Duration` written as whole milliseconds.
pub mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes whole milliseconds.
    ///
    /// # Errors
    /// Whatever the serializer reports.
    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(u64::try_from(value.as_millis()).unwrap_or(u64::MAX))
    }

    /// Reads whole milliseconds.
    ///
    /// # Errors
    /// When the value is not a non-negative integer.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn defaults_give_embedded_mode() {
        let config = Config::load_from(None, env(&[]), &Overrides::default()).expect("defaults load");
        assert_eq!(config.database_url(), "sqlite://herald-data/herald.db");
        assert_eq!(config.plugins_dir(), PathBuf::from("herald-data/plugins"));
        assert_eq!(config.worker_threads, 0, "one thread per core");
    }

    #[test]
    fn flags_beat_env_beat_file() {
        let mut file = tempfile::NamedTempFile::with_suffix(".toml").expect("temp file");
        writeln!(
            file,
            "listen = \"127.0.0.1:9001\"\ndata_dir = \"/from/file\"\nnode_id = 3\n[storage]\nmax_connections = 3\n[seq]\nmin_step = 2"
        )
        .expect("write");
        let vars = env(&[
            ("HERALD_DATA_DIR", "/from/env"),
            ("HERALD_STORAGE__MAX_CONNECTIONS", "5"),
            ("HERALD_WORKER_THREADS", "1"),
            ("HERALD_CONFIG", "ignored.toml"),
            ("HERALD_TEST_POSTGRES_URL", "ignored"),
            ("OTHER", "ignored"),
        ]);
        let flags = Overrides { data_dir: Some("/from/flag".into()), ..Overrides::default() };
        let config = Config::load_from(Some(file.path()), vars, &flags).expect("loads");
        assert_eq!(config.listen.port(), 9001, "file beats default");
        assert_eq!(config.node_id, Some(3));
        assert_eq!(config.worker_threads, 1, "a setting of the top level, from the environment");
        assert_eq!(config.storage.max_connections, 5, "env beats file");
        assert_eq!(config.seq.min_step, 2);
        assert_eq!(config.data_dir, PathBuf::from("/from/flag"), "flag beats env");
    }

    #[test]
    fn bad_settings_are_refused_with_the_key_named() {
        let error = Config::load_from(None, env(&[("HERALD_NODE_ID", "4096")]), &Overrides::default())
            .expect_err("node id out of range");
        assert!(error.to_string().contains("node_id 4096"), "{error}");
        let error = Config::load_from(None, env(&[("HERALD_WORKER_THREADS", "5000")]), &Overrides::default())
            .expect_err("more threads than any machine has cores");
        assert!(error.to_string().contains("worker_threads 5000"), "{error}");
        let error = Config::load_from(None, env(&[("HERALD_WORKER_THREADS", "-1")]), &Overrides::default())
            .expect_err("a negative count");
        assert!(error.to_string().contains("worker_threads"), "{error}");

        let error =
            Config::load_from(None, env(&[("HERALD_LISTNE", "x")]), &Overrides::default()).expect_err("unknown key");
        assert!(error.to_string().contains("listne"), "{error}");

        let flags =
            Overrides { listen: Some("0.0.0.0:7070".parse().expect("addr")), dev: true, ..Overrides::default() };
        let error = Config::load_from(None, env(&[]), &flags).expect_err("dev on a public address");
        assert!(error.to_string().contains("loopback"), "{error}");

        let error =
            Config::load_from(None, env(&[("HERALD_STORAGE__SQLITE_PAGE_SIZE", "3000")]), &Overrides::default())
                .expect_err("page size not a power of two");
        assert!(error.to_string().contains("sqlite_page_size 3000"), "{error}");
        let error = Config::load_from(None, env(&[("HERALD_SEQ__PREFETCH_SEGMENTS", "0")]), &Overrides::default())
            .expect_err("no prefetch");
        assert!(error.to_string().contains("prefetch_segments (0)"), "{error}");
        let error =
            Config::load_from(None, env(&[("HERALD_GATEWAY__SHUTDOWN_DELAY_MS", "3600000")]), &Overrides::default())
                .expect_err("an hour's shutdown delay");
        assert!(error.to_string().contains("gateway.shutdown_delay_ms 3600000"), "{error}");
        let error =
            Config::load_from(None, env(&[("HERALD_GATEWAY__CLIENT_TIMEOUT_MS", "20000")]), &Overrides::default())
                .expect_err("a client timeout of two heartbeats");
        assert!(
            error.to_string().contains("gateway.client_timeout_ms 20000 must be at least three heartbeats"),
            "{error}"
        );
    }

    #[test]
    fn placement_is_one_of_three_names_and_needs_an_address_nginx_can_dial() {
        let cluster = [
            ("HERALD_CLUSTER__REDIS_URL", "redis://127.0.0.1:6379/0"),
            ("HERALD_STORAGE__URL", "postgres://postgres@127.0.0.1/test"),
            ("HERALD_CLUSTER__SECRET", "s3cret"),
        ];
        let config = Config::load_from(None, env(&cluster), &Overrides::default()).expect("defaults");
        assert_eq!(config.cluster.placement, Placement::None);
        let placed = [&cluster[..], &[("HERALD_CLUSTER__PLACEMENT", "nginx-consistent")]].concat();
        let config = Config::load_from(None, env(&placed), &Overrides::default()).expect("nginx-consistent");
        assert_eq!(config.cluster.placement, Placement::NginxConsistent);
        let unknown = [&cluster[..], &[("HERALD_CLUSTER__PLACEMENT", "round-robin")]].concat();
        let error = Config::load_from(None, env(&unknown), &Overrides::default()).expect_err("unknown placement");
        for named in ["\"none\"", "\"nginx-consistent\"", "\"nginx-hash\"", "\"round-robin\""] {
            assert!(error.to_string().contains(named), "{named} missing in: {error}");
        }
        let wildcard = Overrides { listen: Some("0.0.0.0:7070".parse().expect("addr")), ..Overrides::default() };
        let error = Config::load_from(None, env(&placed), &wildcard).expect_err("no address for nginx");
        assert!(error.to_string().contains("HERALD_CLUSTER__CLIENT_URL"), "{error}");
        let named = [&placed[..], &[("HERALD_CLUSTER__CLIENT_URL", "ws://10.0.0.5:7070/v1/ws")]].concat();
        assert!(Config::load_from(None, env(&named), &wildcard).is_ok(), "a client URL names the address");
    }

    #[test]
    fn cluster_mode_is_chosen_by_redis_url_and_refuses_what_cannot_work() {
        let embedded = Config::load_from(None, env(&[]), &Overrides::default()).expect("defaults");
        assert!(!embedded.cluster.enabled(), "no redis_url: embedded mode");
        assert_eq!(embedded.node_id, None, "unpinned");

        let redis = ("HERALD_CLUSTER__REDIS_URL", "redis://127.0.0.1:6379/0");
        let error = Config::load_from(None, env(&[redis]), &Overrides::default()).expect_err("SQLite in a cluster");
        assert!(error.to_string().contains("needs a database every node shares"), "{error}");

        let postgres = ("HERALD_STORAGE__URL", "postgres://postgres@127.0.0.1/test");
        let error = Config::load_from(None, env(&[redis, postgres]), &Overrides::default()).expect_err("no secret");
        assert!(error.to_string().contains("cluster.secret is required"), "{error}");

        let dev = Overrides { dev: true, ..Overrides::default() };
        let config = Config::load_from(None, env(&[redis, postgres, ("HERALD_NODE_ID", "7")]), &dev).expect("dev");
        assert!(config.cluster.enabled());
        assert_eq!(config.cluster.secret(config.dev), Some(DEV_CLUSTER_SECRET), "dev mode has a secret of its own");
        assert_eq!(config.cluster.advertise(), config.cluster.peer_listen, "advertise defaults to peer_listen");
        assert_eq!((config.node_id, config.cluster.peer_listen.port()), (Some(7), 7071));

        let mut vars = env(&[
            redis,
            ("HERALD_STORAGE__URL", "mariadb://root@127.0.0.1/test"),
            ("HERALD_CLUSTER__SECRET", "s3cret"),
            ("HERALD_CLUSTER__PEER_LISTEN", "0.0.0.0:7171"),
            ("HERALD_CLUSTER__ADVERTISE", "10.0.0.5:7171"),
        ]);
        let error = Config::load_from(None, vars.clone(), &Overrides::default()).expect_err("plain-text links");
        assert!(error.to_string().contains("HERALD_CLUSTER__PLAINTEXT_PEERS=true"), "{error}");
        let tls = env(&[("HERALD_TLS__CERT_FILE", "/etc/herald/cert.pem"), ("HERALD_TLS__KEY_FILE", "/k.pem")]);
        let config = Config::load_from(None, [vars.clone(), tls].concat(), &Overrides::default()).expect("over TLS");
        assert!(config.tls.enabled() && !config.cluster.plaintext_peers);
        vars.extend(env(&[("HERALD_CLUSTER__PLAINTEXT_PEERS", "true")]));
        let config = Config::load_from(None, vars, &Overrides::default()).expect("a node on a private network");
        assert!(config.cluster.plaintext_peers);
        assert_eq!(config.cluster.advertise().to_string(), "10.0.0.5:7171");
        assert_eq!(config.cluster.secret(false), Some("s3cret"));

        let error =
            Config::load_from(None, env(&[redis, postgres, ("HERALD_CLUSTER__PEER_LISTEN", "0.0.0.0:7171")]), &dev)
                .expect_err("dev mode links on loopback only");
        assert!(error.to_string().contains("loopback"), "{error}");
        let error = Config::load_from(None, env(&[redis, postgres, ("HERALD_CLUSTER__LEASE_TTL_MS", "100")]), &dev)
            .expect_err("a lease too short to renew");
        assert!(error.to_string().contains("cluster.lease_ttl_ms 100"), "{error}");
        let error = Config::load_from(None, env(&[redis, postgres, ("HERALD_CLUSTER__BREAKER_FAILURES", "0")]), &dev)
            .expect_err("a breaker that opens before any failure");
        assert!(error.to_string().contains("cluster.breaker_failures 0"), "{error}");
        let vars = env(&[
            redis,
            postgres,
            ("HERALD_CLUSTER__BREAKER_FAILURES", "3"),
            ("HERALD_CLUSTER__BREAKER_OPEN_MS", "250"),
        ]);
        let breaker = Config::load_from(None, vars, &dev).expect("a breaker setting").cluster.breaker();
        assert_eq!(
            (breaker.failures, breaker.span, breaker.open_for),
            (3, Duration::from_secs(1), Duration::from_millis(250))
        );
    }

    #[test]
    fn seq_durations_are_read_in_milliseconds_under_their_documented_keys() {
        let vars = env(&[
            ("HERALD_SEQ__SEGMENT_LIFETIME_MS", "2500"),
            ("HERALD_SEQ__PREFETCH_AHEAD_MS", "20"),
            ("HERALD_SEQ__EVICT_IDLE_MS", "0"),
        ]);
        let config = Config::load_from(None, vars, &Overrides::default()).expect("loads");
        assert_eq!(config.seq.segment_lifetime, Duration::from_millis(2500));
        assert_eq!(config.seq.prefetch_ahead, Duration::from_millis(20));
        assert!(config.seq.evict_idle.is_zero(), "0 turns eviction off");
    }
}
