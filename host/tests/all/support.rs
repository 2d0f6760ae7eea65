//! Test databases: a fresh one per test, on each backend (see `tests/scratch`). A backend
//! that cannot be reached fails the test with a message saying how to start it — never a
//! silent skip. And `poll`, the one way every test waits for a condition (`tests/poll`).

#[path = "../poll/mod.rs"]
pub mod poll;
#[path = "../scratch/mod.rs"]
pub mod scratch;

use herald_host::config::StorageConfig;
use herald_host::store::{Backend, Database};
use scratch::ScratchDatabase;

/// A database created for one test; call [`TestDb::drop_database`] at the end.
pub struct TestDb {
    pub database: Database,
    scratch: ScratchDatabase,
}

impl TestDb {
    pub async fn new(backend: Backend) -> Self {
        let scratch = ScratchDatabase::create(backend, "herald_t").await.unwrap_or_else(|error| panic!("{error}"));
        let database =
            Database::connect(&scratch.url, &StorageConfig::default()).await.expect("connect to the test database");
        Self { database, scratch }
    }

    /// Opens another pool on the same database (as another node would).
    pub async fn another_node(&self) -> Database {
        Database::connect(&self.scratch.url, &StorageConfig::default()).await.expect("connect again")
    }

    pub async fn drop_database(self) {
        self.database.close().await;
        self.scratch.drop_database().await.expect("drop the test database");
    }
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
