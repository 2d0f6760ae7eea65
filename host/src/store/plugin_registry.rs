//! The plugin registry's tables (`migrations/*/0005_plugin_registry.sql`): every uploaded
//! version with its component bytes, what each plugin runs (its deployment, with a
//! generation that only grows and at most one deploy pending), the audit trail, and what
//! each node reports of each plugin.
//!
//! The database is the cluster's one arbiter of a deploy: a deploy is begun by setting the
//! plugin's pending deploy only where none is (or the one there is stale), and finished —
//! switched or aborted — by a statement that matches that pending deploy's id, so of two
//! nodes finishing one deploy (the one that began it, and another that found it stale) only
//! one changes anything. Each change writes its audit row in the same transaction.

use async_trait::async_trait;
use sqlx::Row;

use super::{Database, StoreError, on_backend, signed, unsigned};
use crate::model::NodeId;

/// A version to store.
#[derive(Debug, Clone)]
pub struct NewVersion {
    pub name: String,
    pub version: String,
    /// `sha256:<hex>` of `component`.
    pub sha256: String,
    /// The manifest's TOML text; empty when none was given.
    pub manifest: String,
    pub component: Vec<u8>,
    /// The `herald:plugin` contract version the component targets.
    pub contract: String,
    pub uploaded_ms: u64,
    /// The id of the admin key that uploaded it.
    pub uploaded_by: String,
}

/// A stored version, without its bytes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VersionInfo {
    pub name: String,
    pub version: String,
    pub sha256: String,
    pub size: u64,
    pub contract: String,
    pub uploaded_ms: u64,
    pub uploaded_by: String,
}

/// What `put_version` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Put {
    /// Stored now.
    Stored,
    /// The same bytes and manifest were stored under this version already: nothing to do.
    Same,
    /// Another component (or manifest) holds this version: versions are written once.
    Taken { sha256: String },
}

/// A deploy under way (its first phase).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Pending {
    /// Names this deploy in the nodes' reports.
    pub id: String,
    pub version: String,
    /// `active` or `shadow`; empty for a switch that only removes the shadow.
    pub role: String,
    pub since_ms: u64,
    /// Every node prepared it and is asked to hold its hook calls for the switch.
    pub switching: bool,
}

/// What a plugin runs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Deployment {
    pub name: String,
    pub active: Option<String>,
    pub shadow: Option<String>,
    /// What a rollback goes back to.
    pub previous: Option<String>,
    /// JSON: the canary watch of the last promotion.
    pub canary: Option<String>,
    /// Incremented by every switch.
    pub generation: u64,
    pub pending: Option<Pending>,
}

/// The state a switch leaves a plugin in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switch {
    pub active: Option<String>,
    pub shadow: Option<String>,
    pub previous: Option<String>,
    pub canary: Option<String>,
}

/// One row of the audit trail.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Audit {
    pub name: String,
    /// `upload`, `deploy`, `deploy-shadow`, `promote`, `rollback`, or one of them followed
    /// by `-refused` / `-aborted`.
    pub action: String,
    pub from_version: Option<String>,
    pub to_version: Option<String>,
    pub key_id: String,
    pub at_ms: u64,
    /// Why, for a refusal or an abort; the node for an abort.
    pub detail: Option<String>,
}

/// One node's report of one plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReport {
    pub node: NodeId,
    pub name: String,
    /// JSON, as the node wrote it.
    pub report: String,
    pub updated_ms: u64,
}

/// The registry's storage.
#[async_trait]
pub trait PluginRegistryStore: Send + Sync + 'static {
    /// Stores a version (and its audit row) unless its (name, version) is taken.
    async fn put_version(&self, version: &NewVersion, audit: &Audit) -> Result<Put, StoreError>;
    /// A version's SHA-256 and manifest, without its bytes (a node with the bytes cached).
    async fn manifest(&self, name: &str, version: &str) -> Result<Option<(String, String)>, StoreError>;
    /// A version's component bytes, SHA-256 and manifest.
    async fn component(&self, name: &str, version: &str) -> Result<Option<(String, Vec<u8>, String)>, StoreError>;
    /// Every stored version (of `name` only, when given), without bytes.
    async fn versions(&self, name: Option<&str>) -> Result<Vec<VersionInfo>, StoreError>;
    /// Every plugin's deployment.
    async fn deployments(&self) -> Result<Vec<Deployment>, StoreError>;
    /// Begins a deploy: false when another one is pending and began at or after
    /// `stale_before_ms`.
    async fn begin_deploy(&self, name: &str, pending: &Pending, stale_before_ms: u64) -> Result<bool, StoreError>;
    /// Moves the deploy `pending_id` to its switching phase (at `now_ms`); false when it is
    /// no longer pending.
    async fn switching(&self, name: &str, pending_id: &str, now_ms: u64) -> Result<bool, StoreError>;
    /// Finishes the deploy `pending_id`: switches to `switch` (incrementing the generation)
    /// or, with `None`, aborts it; writes `audit` with it. False when that deploy is no
    /// longer pending (finished by someone else).
    async fn finish_deploy(
        &self,
        name: &str,
        pending_id: &str,
        switch: Option<&Switch>,
        audit: &Audit,
    ) -> Result<bool, StoreError>;
    /// Sets the canary JSON of `name` while its generation is still `generation`.
    async fn set_canary(&self, name: &str, generation: u64, canary: &str) -> Result<bool, StoreError>;
    /// Writes an audit row on its own (a refused upload).
    async fn record(&self, audit: &Audit) -> Result<(), StoreError>;
    /// The audit trail of `name`, oldest first, at most `limit` rows (the newest).
    async fn history(&self, name: &str, limit: u32) -> Result<Vec<Audit>, StoreError>;
    /// Replaces `node`'s report of `name`.
    async fn report(&self, report: &NodeReport) -> Result<(), StoreError>;
    /// Every node's reports.
    async fn reports(&self) -> Result<Vec<NodeReport>, StoreError>;
}

/// The statements, with `?` placeholders (SQLite, MySQL/MariaDB) or `$n` (PostgreSQL).
struct Statements {
    insert_version: &'static str,
    version_by_name: &'static str,
    component: &'static str,
    versions: &'static str,
    versions_of: &'static str,
    create_deployment: &'static str,
    begin: &'static str,
    switch: &'static str,
    abort: &'static str,
    switching: &'static str,
    set_canary: &'static str,
    insert_audit: &'static str,
    history: &'static str,
    upsert_report: &'static str,
}

const DEPLOYMENTS: &str = "SELECT name, active_version, shadow_version, previous_version, canary, generation, pending_id, pending_version, pending_as, pending_since_ms, pending_phase FROM plugin_deployments ORDER BY name";
const REPORTS: &str = "SELECT node_id, name, report, updated_ms FROM plugin_node_reports ORDER BY node_id, name";

const QUESTION: Statements = Statements {
    insert_version: "INSERT INTO plugin_versions (name, version, sha256, manifest, component, size, contract, uploaded_ms, uploaded_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    version_by_name: "SELECT sha256, manifest FROM plugin_versions WHERE name = ? AND version = ?",
    component: "SELECT sha256, component, manifest FROM plugin_versions WHERE name = ? AND version = ?",
    versions: "SELECT name, version, sha256, size, contract, uploaded_ms, uploaded_by FROM plugin_versions ORDER BY name, uploaded_ms, version",
    versions_of: "SELECT name, version, sha256, size, contract, uploaded_ms, uploaded_by FROM plugin_versions WHERE name = ? ORDER BY uploaded_ms, version",
    create_deployment: "INSERT INTO plugin_deployments (name, generation, updated_ms) VALUES (?, 0, ?) ON CONFLICT (name) DO NOTHING",
    begin: "UPDATE plugin_deployments SET pending_id = ?, pending_version = ?, pending_as = ?, pending_since_ms = ?, pending_phase = NULL, updated_ms = ? WHERE name = ? AND (pending_id IS NULL OR pending_since_ms < ?)",
    switch: "UPDATE plugin_deployments SET active_version = ?, shadow_version = ?, previous_version = ?, canary = ?, generation = generation + 1, pending_id = NULL, pending_version = NULL, pending_as = NULL, pending_since_ms = NULL, pending_phase = NULL, updated_ms = ? WHERE name = ? AND pending_id = ?",
    abort: "UPDATE plugin_deployments SET pending_id = NULL, pending_version = NULL, pending_as = NULL, pending_since_ms = NULL, pending_phase = NULL, updated_ms = ? WHERE name = ? AND pending_id = ?",
    switching: "UPDATE plugin_deployments SET pending_phase = 'switching', updated_ms = ? WHERE name = ? AND pending_id = ?",
    set_canary: "UPDATE plugin_deployments SET canary = ? WHERE name = ? AND generation = ?",
    insert_audit: "INSERT INTO plugin_audit (name, action, from_version, to_version, key_id, at_ms, detail) VALUES (?, ?, ?, ?, ?, ?, ?)",
    history: "SELECT name, action, from_version, to_version, key_id, at_ms, detail FROM (SELECT * FROM plugin_audit WHERE name = ? ORDER BY id DESC LIMIT ?) AS newest ORDER BY id",
    upsert_report: "INSERT INTO plugin_node_reports (node_id, name, report, updated_ms) VALUES (?, ?, ?, ?) ON CONFLICT (node_id, name) DO UPDATE SET report = excluded.report, updated_ms = excluded.updated_ms",
};

const DOLLAR: Statements = Statements {
    insert_version: "INSERT INTO plugin_versions (name, version, sha256, manifest, component, size, contract, uploaded_ms, uploaded_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    version_by_name: "SELECT sha256, manifest FROM plugin_versions WHERE name = $1 AND version = $2",
    component: "SELECT sha256, component, manifest FROM plugin_versions WHERE name = $1 AND version = $2",
    versions: "SELECT name, version, sha256, size, contract, uploaded_ms, uploaded_by FROM plugin_versions ORDER BY name, uploaded_ms, version",
    versions_of: "SELECT name, version, sha256, size, contract, uploaded_ms, uploaded_by FROM plugin_versions WHERE name = $1 ORDER BY uploaded_ms, version",
    create_deployment: "INSERT INTO plugin_deployments (name, generation, updated_ms) VALUES ($1, 0, $2) ON CONFLICT (name) DO NOTHING",
    begin: "UPDATE plugin_deployments SET pending_id = $1, pending_version = $2, pending_as = $3, pending_since_ms = $4, pending_phase = NULL, updated_ms = $5 WHERE name = $6 AND (pending_id IS NULL OR pending_since_ms < $7)",
    switch: "UPDATE plugin_deployments SET active_version = $1, shadow_version = $2, previous_version = $3, canary = $4, generation = generation + 1, pending_id = NULL, pending_version = NULL, pending_as = NULL, pending_since_ms = NULL, pending_phase = NULL, updated_ms = $5 WHERE name = $6 AND pending_id = $7",
    abort: "UPDATE plugin_deployments SET pending_id = NULL, pending_version = NULL, pending_as = NULL, pending_since_ms = NULL, pending_phase = NULL, updated_ms = $1 WHERE name = $2 AND pending_id = $3",
    switching: "UPDATE plugin_deployments SET pending_phase = 'switching', updated_ms = $1 WHERE name = $2 AND pending_id = $3",
    set_canary: "UPDATE plugin_deployments SET canary = $1 WHERE name = $2 AND generation = $3",
    insert_audit: "INSERT INTO plugin_audit (name, action, from_version, to_version, key_id, at_ms, detail) VALUES ($1, $2, $3, $4, $5, $6, $7)",
    history: "SELECT name, action, from_version, to_version, key_id, at_ms, detail FROM (SELECT * FROM plugin_audit WHERE name = $1 ORDER BY id DESC LIMIT $2) AS newest ORDER BY id",
    upsert_report: "INSERT INTO plugin_node_reports (node_id, name, report, updated_ms) VALUES ($1, $2, $3, $4) ON CONFLICT (node_id, name) DO UPDATE SET report = excluded.report, updated_ms = excluded.updated_ms",
};

/// MySQL/MariaDB have no `ON CONFLICT`: the statements of `QUESTION` they cannot share.
const MYSQL_CREATE_DEPLOYMENT: &str = "INSERT INTO plugin_deployments (name, generation, updated_ms) VALUES (?, 0, ?) ON DUPLICATE KEY UPDATE name = name";
const MYSQL_UPSERT_REPORT: &str = "INSERT INTO plugin_node_reports (node_id, name, report, updated_ms) VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE report = VALUES(report), updated_ms = VALUES(updated_ms)";

/// The statements of `$pool`'s dialect.
macro_rules! statements {
    ($pool:expr) => {
        match &$pool {
            super::Pool::Postgres(_) => &DOLLAR,
            _ => &QUESTION,
        }
    };
}

/// The statement that creates a plugin's deployment row unless it is there. It must not
/// fail on a row already there: on PostgreSQL a failed statement aborts the transaction it
/// is in, the upload's.
fn create_deployment(pool: &super::Pool) -> &'static str {
    upsert(pool, MYSQL_CREATE_DEPLOYMENT, |sql| sql.create_deployment)
}

/// The statement that writes a node's report of a plugin, replacing the one before.
fn upsert_report(pool: &super::Pool) -> &'static str {
    upsert(pool, MYSQL_UPSERT_REPORT, |sql| sql.upsert_report)
}

/// An upsert of `pool`'s dialect: `mysql` on MySQL/MariaDB, which have no `ON CONFLICT`,
/// else the statement `of` picks from the dialect's statements.
fn upsert(pool: &super::Pool, mysql: &'static str, of: fn(&Statements) -> &'static str) -> &'static str {
    match pool {
        super::Pool::MySql(_) => mysql,
        _ => of(statements!(pool)),
    }
}

/// Whether `error` is a unique-key violation (the row is there already).
fn is_duplicate(error: &sqlx::Error) -> bool {
    error.as_database_error().is_some_and(|database| database.is_unique_violation())
}

fn info_of<R: Row>(row: &R) -> Result<VersionInfo, StoreError>
where
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> &'r str: sqlx::ColumnIndex<R>,
{
    Ok(VersionInfo {
        name: row.try_get("name")?,
        version: row.try_get("version")?,
        sha256: row.try_get("sha256")?,
        size: unsigned(row.try_get("size")?, "plugin_versions.size")?,
        contract: row.try_get("contract")?,
        uploaded_ms: unsigned(row.try_get("uploaded_ms")?, "plugin_versions.uploaded_ms")?,
        uploaded_by: row.try_get("uploaded_by")?,
    })
}

fn deployment_of<R: Row>(row: &R) -> Result<Deployment, StoreError>
where
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> &'r str: sqlx::ColumnIndex<R>,
{
    let pending_id: Option<String> = row.try_get("pending_id")?;
    let pending = match pending_id {
        Some(id) => Some(Pending {
            id,
            version: row.try_get::<Option<String>, _>("pending_version")?.unwrap_or_default(),
            role: row.try_get::<Option<String>, _>("pending_as")?.unwrap_or_default(),
            since_ms: unsigned(row.try_get::<Option<i64>, _>("pending_since_ms")?.unwrap_or(0), "pending_since_ms")?,
            switching: row.try_get::<Option<String>, _>("pending_phase")?.as_deref() == Some("switching"),
        }),
        None => None,
    };
    Ok(Deployment {
        name: row.try_get("name")?,
        active: row.try_get("active_version")?,
        shadow: row.try_get("shadow_version")?,
        previous: row.try_get("previous_version")?,
        canary: row.try_get("canary")?,
        generation: unsigned(row.try_get("generation")?, "plugin_deployments.generation")?,
        pending,
    })
}

fn audit_of<R: Row>(row: &R) -> Result<Audit, StoreError>
where
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> &'r str: sqlx::ColumnIndex<R>,
{
    Ok(Audit {
        name: row.try_get("name")?,
        action: row.try_get("action")?,
        from_version: row.try_get("from_version")?,
        to_version: row.try_get("to_version")?,
        key_id: row.try_get("key_id")?,
        at_ms: unsigned(row.try_get("at_ms")?, "plugin_audit.at_ms")?,
        detail: row.try_get("detail")?,
    })
}

/// Binds an audit row to `insert_audit` and runs it on `$executor`.
macro_rules! insert_audit {
    ($sql:expr, $audit:expr, $executor:expr) => {
        sqlx::query($sql.insert_audit)
            .bind(&$audit.name)
            .bind(&$audit.action)
            .bind(&$audit.from_version)
            .bind(&$audit.to_version)
            .bind(&$audit.key_id)
            .bind(signed($audit.at_ms))
            .bind(&$audit.detail)
            .execute($executor)
            .await
    };
}

#[async_trait]
impl PluginRegistryStore for Database {
    async fn put_version(&self, v: &NewVersion, audit: &Audit) -> Result<Put, StoreError> {
        let sql = statements!(self.writer);
        on_backend!(self.writer, |pool, _dialect| {
            let mut transaction = pool.begin().await?;
            let inserted = sqlx::query(sql.insert_version)
                .bind(&v.name)
                .bind(&v.version)
                .bind(&v.sha256)
                .bind(&v.manifest)
                .bind(&v.component)
                .bind(signed(v.component.len() as u64))
                .bind(&v.contract)
                .bind(signed(v.uploaded_ms))
                .bind(&v.uploaded_by)
                .execute(&mut *transaction)
                .await;
            match inserted {
                Ok(_) => {
                    // A deployment row from the first upload on, so a deploy can begin by
                    // updating it.
                    sqlx::query(create_deployment(&self.writer))
                        .bind(&v.name)
                        .bind(signed(v.uploaded_ms))
                        .execute(&mut *transaction)
                        .await?;
                    insert_audit!(sql, audit, &mut *transaction)?;
                    transaction.commit().await?;
                    Ok(Put::Stored)
                }
                Err(error) if is_duplicate(&error) => {
                    transaction.rollback().await?;
                    let row = sqlx::query(sql.version_by_name).bind(&v.name).bind(&v.version).fetch_one(pool).await?;
                    let (sha256, manifest): (String, String) = (row.try_get("sha256")?, row.try_get("manifest")?);
                    Ok(if sha256 == v.sha256 && manifest == v.manifest { Put::Same } else { Put::Taken { sha256 } })
                }
                Err(error) => Err(error.into()),
            }
        })
    }

    async fn manifest(&self, name: &str, version: &str) -> Result<Option<(String, String)>, StoreError> {
        let sql = statements!(self.reader);
        on_backend!(self.reader, |pool, _dialect| {
            let row = sqlx::query(sql.version_by_name).bind(name).bind(version).fetch_optional(pool).await?;
            match row {
                Some(row) => Ok(Some((row.try_get("sha256")?, row.try_get("manifest")?))),
                None => Ok(None),
            }
        })
    }

    async fn component(&self, name: &str, version: &str) -> Result<Option<(String, Vec<u8>, String)>, StoreError> {
        let sql = statements!(self.reader);
        on_backend!(self.reader, |pool, _dialect| {
            let row = sqlx::query(sql.component).bind(name).bind(version).fetch_optional(pool).await?;
            match row {
                Some(row) => Ok(Some((row.try_get("sha256")?, row.try_get("component")?, row.try_get("manifest")?))),
                None => Ok(None),
            }
        })
    }

    async fn versions(&self, name: Option<&str>) -> Result<Vec<VersionInfo>, StoreError> {
        let sql = statements!(self.reader);
        on_backend!(self.reader, |pool, _dialect| {
            let rows = match name {
                Some(name) => sqlx::query(sql.versions_of).bind(name).fetch_all(pool).await?,
                None => sqlx::query(sql.versions).fetch_all(pool).await?,
            };
            rows.iter().map(info_of).collect()
        })
    }

    async fn deployments(&self) -> Result<Vec<Deployment>, StoreError> {
        on_backend!(self.reader, |pool, _dialect| {
            let rows = sqlx::query(DEPLOYMENTS).fetch_all(pool).await?;
            rows.iter().map(deployment_of).collect()
        })
    }

    async fn begin_deploy(&self, name: &str, pending: &Pending, stale_before_ms: u64) -> Result<bool, StoreError> {
        let sql = statements!(self.writer);
        on_backend!(self.writer, |pool, _dialect| {
            let done = sqlx::query(sql.begin)
                .bind(&pending.id)
                .bind(&pending.version)
                .bind(&pending.role)
                .bind(signed(pending.since_ms))
                .bind(signed(pending.since_ms))
                .bind(name)
                .bind(signed(stale_before_ms))
                .execute(pool)
                .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    async fn switching(&self, name: &str, pending_id: &str, now_ms: u64) -> Result<bool, StoreError> {
        let sql = statements!(self.writer);
        let now = signed(now_ms);
        on_backend!(self.writer, |pool, _dialect| {
            let done = sqlx::query(sql.switching).bind(now).bind(name).bind(pending_id).execute(pool).await?;
            Ok(done.rows_affected() == 1)
        })
    }

    async fn finish_deploy(
        &self,
        name: &str,
        pending_id: &str,
        switch: Option<&Switch>,
        audit: &Audit,
    ) -> Result<bool, StoreError> {
        let sql = statements!(self.writer);
        on_backend!(self.writer, |pool, _dialect| {
            let mut transaction = pool.begin().await?;
            let done = match switch {
                Some(to) => {
                    sqlx::query(sql.switch)
                        .bind(&to.active)
                        .bind(&to.shadow)
                        .bind(&to.previous)
                        .bind(&to.canary)
                        .bind(signed(audit.at_ms))
                        .bind(name)
                        .bind(pending_id)
                        .execute(&mut *transaction)
                        .await?
                }
                None => {
                    sqlx::query(sql.abort)
                        .bind(signed(audit.at_ms))
                        .bind(name)
                        .bind(pending_id)
                        .execute(&mut *transaction)
                        .await?
                }
            };
            if done.rows_affected() != 1 {
                transaction.rollback().await?;
                return Ok(false);
            }
            insert_audit!(sql, audit, &mut *transaction)?;
            transaction.commit().await?;
            Ok(true)
        })
    }

    async fn set_canary(&self, name: &str, generation: u64, canary: &str) -> Result<bool, StoreError> {
        let sql = statements!(self.writer);
        on_backend!(self.writer, |pool, _dialect| {
            let done =
                sqlx::query(sql.set_canary).bind(canary).bind(name).bind(signed(generation)).execute(pool).await?;
            Ok(done.rows_affected() == 1)
        })
    }

    async fn record(&self, audit: &Audit) -> Result<(), StoreError> {
        let sql = statements!(self.writer);
        on_backend!(self.writer, |pool, _dialect| {
            insert_audit!(sql, audit, pool)?;
            Ok(())
        })
    }

    async fn history(&self, name: &str, limit: u32) -> Result<Vec<Audit>, StoreError> {
        let sql = statements!(self.reader);
        on_backend!(self.reader, |pool, _dialect| {
            let rows = sqlx::query(sql.history).bind(name).bind(i64::from(limit)).fetch_all(pool).await?;
            rows.iter().map(audit_of).collect()
        })
    }

    async fn report(&self, report: &NodeReport) -> Result<(), StoreError> {
        let sql = upsert_report(&self.writer);
        // One upsert, no transaction: a delete and an insert in one took gap locks on
        // MariaDB, and two nodes writing their reports at once deadlocked.
        on_backend!(self.writer, |pool, _dialect| {
            sqlx::query(sql)
                .bind(i64::from(report.node.0))
                .bind(&report.name)
                .bind(&report.report)
                .bind(signed(report.updated_ms))
                .execute(pool)
                .await?;
            Ok(())
        })
    }

    async fn reports(&self) -> Result<Vec<NodeReport>, StoreError> {
        on_backend!(self.reader, |pool, _dialect| {
            let rows = sqlx::query(REPORTS).fetch_all(pool).await?;
            rows.iter()
                .map(|row| {
                    let node: i64 = row.try_get("node_id")?;
                    let node = u32::try_from(node)
                        .map_err(|_| StoreError::Corrupt(format!("plugin_node_reports.node_id {node}")))?;
                    Ok(NodeReport {
                        node: NodeId(node),
                        name: row.try_get("name")?,
                        report: row.try_get("report")?,
                        updated_ms: unsigned(row.try_get("updated_ms")?, "plugin_node_reports.updated_ms")?,
                    })
                })
                .collect()
        })
    }
}
