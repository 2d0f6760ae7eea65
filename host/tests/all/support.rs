//! Test databases: a fresh one per test, on each backend.
//!
//! MariaDB and PostgreSQL are reached at `HERALD_TEST_MYSQL_URL` /
//! `HERALD_TEST_POSTGRES_URL` (defaults: the machine's local servers, database `test`).
//! A backend that cannot be reached fails the test with a message saying how to start it —
//! never a silent skip.

use herald_host::config::StorageConfig;
use herald_host::store::{Backend, Database};
use sqlx::Connection;

pub const DEFAULT_MYSQL: &str = "mysql://root@127.0.0.1:3306/test";
pub const DEFAULT_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A database created for one test; call [`TestDb::drop_database`] at the end.
pub struct TestDb {
    pub url: String,
    pub database: Database,
    backend: Backend,
    name: String,
    admin_url: String,
    _dir: Option<tempfile::TempDir>,
}

fn unique_name() -> String {
    format!("herald_t_{}_{:08x}", std::process::id(), rand::random::<u32>())
}

impl TestDb {
    pub async fn new(backend: Backend) -> Self {
        Self::with_config(backend, &StorageConfig::default()).await
    }

    pub async fn with_config(backend: Backend, config: &StorageConfig) -> Self {
        let name = unique_name();
        let (url, admin_url, dir) = match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}", dir.path().join("herald.db").display());
                (url, String::new(), Some(dir))
            }
            Backend::MySql => {
                let admin = std::env::var("HERALD_TEST_MYSQL_URL").unwrap_or_else(|_| DEFAULT_MYSQL.into());
                let mut connection = sqlx::MySqlConnection::connect(&admin).await.unwrap_or_else(|error| {
                    panic!("MariaDB/MySQL is required at {admin} ({error}); start it with scripts/test.sh or set HERALD_TEST_MYSQL_URL")
                });
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&mut connection)
                    .await
                    .expect("create test database");
                connection.close().await.ok();
                (replace_database(&admin, &name), admin, None)
            }
            Backend::Postgres => {
                let admin = std::env::var("HERALD_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_POSTGRES.into());
                let mut connection = sqlx::PgConnection::connect(&admin).await.unwrap_or_else(|error| {
                    panic!("PostgreSQL is required at {admin} ({error}); start it with scripts/test.sh or set HERALD_TEST_POSTGRES_URL")
                });
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&mut connection)
                    .await
                    .expect("create test database");
                connection.close().await.ok();
                (replace_database(&admin, &name), admin, None)
            }
        };
        let database = Database::connect(&url, config).await.expect("connect to the test database");
        Self { url, database, backend, name, admin_url, _dir: dir }
    }

    /// Opens another pool on the same database (as another node would).
    pub async fn another_node(&self) -> Database {
        Database::connect(&self.url, &StorageConfig::default()).await.expect("connect again")
    }

    pub async fn drop_database(self) {
        self.database.close().await;
        let drop = sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {}", self.name));
        match self.backend {
            Backend::Sqlite => {}
            Backend::MySql => {
                let mut connection = sqlx::MySqlConnection::connect(&self.admin_url).await.expect("admin connection");
                sqlx::raw_sql(drop).execute(&mut connection).await.expect("drop test database");
            }
            Backend::Postgres => {
                let mut connection = sqlx::PgConnection::connect(&self.admin_url).await.expect("admin connection");
                let drop = sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
                sqlx::raw_sql(drop).execute(&mut connection).await.expect("drop test database");
            }
        }
    }
}

/// `scheme://auth@host:port/olddb?params` → same URL naming `database`.
fn replace_database(url: &str, database: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let slash = base.rfind('/').expect("url has a database path");
    let mut out = format!("{}/{database}", &base[..slash]);
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

/// Generates one `#[tokio::test]` per backend for each `async fn(Backend)` scenario.
#[macro_export]
macro_rules! on_every_backend {
    ($($scenario:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() { super::$scenario(herald_host::store::Backend::Sqlite).await }
            )*
        }
        mod mysql {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() { super::$scenario(herald_host::store::Backend::MySql).await }
            )*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() { super::$scenario(herald_host::store::Backend::Postgres).await }
            )*
        }
    };
}
