//! Throwaway databases for tests and benchmarks: a fresh, empty database on any backend,
//! dropped again when done.
//!
//! MariaDB/MySQL and PostgreSQL are reached through an admin URL (by default the machine's
//! local servers and their `test` database, overridable with `HERALD_TEST_MYSQL_URL` /
//! `HERALD_TEST_POSTGRES_URL`); a new database is created beside it. SQLite gets a file in
//! a temporary folder.
//!
//! Shared by the integration tests (`tests/all/support.rs`) and the storage benchmark
//! (`benches/storage.rs`), each of which includes this file as a module of its own.

use herald_host::store::{Backend, StoreError};
use sqlx::Connection;

/// Default admin URL for MariaDB/MySQL.
pub const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306/test";
/// Default admin URL for PostgreSQL.
pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A database that exists only until [`drop_database`](Self::drop_database).
#[derive(Debug)]
pub struct ScratchDatabase {
    /// URL to connect to it.
    pub url: String,
    /// Which backend it is on.
    pub backend: Backend,
    name: String,
    admin_url: String,
    /// Keeps the SQLite file's folder alive.
    _dir: Option<tempfile::TempDir>,
}

/// Why a scratch database could not be made, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ScratchError {
    #[error(
        "{backend} is required at {url} but cannot be reached ({source}); start it (scripts/test.sh does) or set {variable}"
    )]
    Unreachable { backend: &'static str, url: String, variable: &'static str, source: sqlx::Error },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot create a temporary folder: {0}")]
    TempDir(#[from] std::io::Error),
}

impl ScratchDatabase {
    /// Creates an empty database named `<prefix>_<pid>_<random>` on `backend`.
    ///
    /// # Errors
    /// [`ScratchError::Unreachable`] when the server is down, naming how to fix it.
    pub async fn create(backend: Backend, prefix: &str) -> Result<Self, ScratchError> {
        let name = format!("{prefix}_{}_{:08x}", std::process::id(), rand_u32());
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir()?;
                let url = format!("sqlite://{}", dir.path().join("herald.db").display());
                Ok(Self { url, backend, name, admin_url: String::new(), _dir: Some(dir) })
            }
            Backend::MySql | Backend::Postgres => {
                let admin_url = admin_url(backend);
                run_admin(backend, &admin_url, &format!("CREATE DATABASE {name}")).await?;
                let url = replace_database(&admin_url, &name);
                Ok(Self { url, backend, name, admin_url, _dir: None })
            }
        }
    }

    /// Drops the database (SQLite: deletes the folder).
    ///
    /// # Errors
    /// When the server cannot be reached to drop it.
    pub async fn drop_database(self) -> Result<(), ScratchError> {
        match self.backend {
            Backend::Sqlite => Ok(()),
            Backend::MySql => {
                run_admin(self.backend, &self.admin_url, &format!("DROP DATABASE IF EXISTS {}", self.name)).await
            }
            Backend::Postgres => {
                let drop = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
                run_admin(self.backend, &self.admin_url, &drop).await
            }
        }
    }
}

fn admin_url(backend: Backend) -> String {
    let (variable, default) = match backend {
        Backend::MySql => ("HERALD_TEST_MYSQL_URL", DEFAULT_MYSQL_URL),
        _ => ("HERALD_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL),
    };
    std::env::var(variable).unwrap_or_else(|_| default.to_owned())
}

/// Runs one administrative statement (names are generated here, never user input).
async fn run_admin(backend: Backend, url: &str, statement: &str) -> Result<(), ScratchError> {
    let statement = sqlx::AssertSqlSafe(statement.to_owned());
    let unreachable = |source| match backend {
        Backend::MySql => ScratchError::Unreachable {
            backend: "MariaDB/MySQL",
            url: url.to_owned(),
            variable: "HERALD_TEST_MYSQL_URL",
            source,
        },
        _ => ScratchError::Unreachable {
            backend: "PostgreSQL",
            url: url.to_owned(),
            variable: "HERALD_TEST_POSTGRES_URL",
            source,
        },
    };
    match backend {
        Backend::MySql => {
            let mut connection = sqlx::MySqlConnection::connect(url).await.map_err(unreachable)?;
            sqlx::raw_sql(statement).execute(&mut connection).await.map_err(StoreError::from)?;
            connection.close().await.map_err(StoreError::from)?;
        }
        Backend::Postgres => {
            let mut connection = sqlx::PgConnection::connect(url).await.map_err(unreachable)?;
            sqlx::raw_sql(statement).execute(&mut connection).await.map_err(StoreError::from)?;
            connection.close().await.map_err(StoreError::from)?;
        }
        Backend::Sqlite => {}
    }
    Ok(())
}

/// `scheme://auth@host:port/olddb?params` → the same URL naming `database`.
fn replace_database(url: &str, database: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(base, query)| (base, Some(query)));
    let path_start = base.find("://").map_or(0, |i| i + 3);
    let cut = base[path_start..].find('/').map_or(base.len(), |i| path_start + i);
    let mut out = format!("{}/{database}", &base[..cut]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    hasher.finish() as u32
}

#[test]
fn database_name_is_replaced_keeping_the_rest() {
    assert_eq!(replace_database("mysql://root@127.0.0.1:3306/test", "x"), "mysql://root@127.0.0.1:3306/x");
    assert_eq!(replace_database("postgres://u:p@h/test?sslmode=disable", "x"), "postgres://u:p@h/x?sslmode=disable");
    assert_eq!(replace_database("postgres://h", "x"), "postgres://h/x");
}
