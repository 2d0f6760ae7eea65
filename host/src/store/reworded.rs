//! Migrations whose comments were reworded after they shipped.
//!
//! sqlx records a checksum of each migration's whole text, comments included, and refuses
//! to start against a database whose recorded checksum differs from the file's
//! (`VersionMismatch`): the guard against a migration edited after it ran. A comment is no
//! part of the schema, though, and rewording one must not strand the databases that applied
//! the old text. So each rewording is listed here with the checksum of the text as it
//! shipped; before migrating, a database that recorded exactly that checksum gets the
//! current one. Any other difference is still refused, as sqlx would.
//!
//! Reword a migration only in its comments, and add its old checksum here
//! (`sha384sum migrations/<backend>/<file>` before the edit).

use std::borrow::Cow;

use sqlx::migrate::Migrator;

use super::{Backend, Pool, StoreError};

/// One migration reworded after it shipped.
struct Reworded {
    backend: Backend,
    version: i64,
    /// The SHA-384 of its text as shipped, in hex.
    shipped: &'static str,
}

const REWORDED: &[Reworded] = &[
    // 0003_session_seq_owner: its first comment cited a tracker no reader has.
    Reworded {
        backend: Backend::Sqlite,
        version: 3,
        shipped: "e7aa03e558d64f265a964a3030010ef1f19f9bee112c13b91799f5fa7187e2c4214a1d77f87751f0ecc9ec944696ead4",
    },
    Reworded {
        backend: Backend::MySql,
        version: 3,
        shipped: "de6d6f973549c08241fe018afe7cb3744ac2f15f39eba5ad25d10a35855bba2571380de54a45a817f693ec33f61df6f9",
    },
    Reworded {
        backend: Backend::Postgres,
        version: 3,
        shipped: "de6d6f973549c08241fe018afe7cb3744ac2f15f39eba5ad25d10a35855bba2571380de54a45a817f693ec33f61df6f9",
    },
];

/// The reworded migrations of `backend`: each version with the checksum of its text as
/// shipped, which a database that applied it then recorded.
pub fn shipped(backend: Backend) -> impl Iterator<Item = (i64, Vec<u8>)> {
    REWORDED
        .iter()
        .filter(move |reworded| reworded.backend == backend)
        .filter_map(|reworded| Some((reworded.version, hex_bytes(reworded.shipped)?)))
}

/// For every reworded migration of `backend` that the database recorded with its shipped
/// checksum, records the current one instead. Idempotent, and harmless where the
/// migration never ran.
///
/// # Errors
/// [`StoreError`] when the database cannot be read or written.
pub(super) async fn accept_rewording(pool: &Pool, migrator: &Migrator, backend: Backend) -> Result<(), StoreError> {
    let changes: Vec<(i64, Vec<u8>, Cow<'static, [u8]>)> = shipped(backend)
        .filter_map(|(version, shipped)| {
            let current = migrator.iter().find(|migration| migration.version == version)?;
            (shipped.as_slice() != current.checksum.as_ref()).then(|| (version, shipped, current.checksum.clone()))
        })
        .collect();
    if changes.is_empty() {
        return Ok(());
    }
    // The table is sqlx's, and only sqlx creates it, under its migration lock: nodes
    // starting together on a new database would race to create it (PostgreSQL refuses the
    // second CREATE TABLE IF NOT EXISTS). A database without it has nothing to rewrite, and
    // an UPDATE racing another node's migration is harmless.
    let table = &migrator.table_name;
    macro_rules! rewrite {
        ($pool:expr, $exists:literal, $update:literal) => {{
            let (exists,): (i64,) =
                sqlx::query_as(sqlx::AssertSqlSafe(format!($exists, table = table))).fetch_one($pool).await?;
            if exists == 1 {
                for (version, shipped, current) in &changes {
                    sqlx::query(sqlx::AssertSqlSafe(format!($update, table = table)))
                        .bind(current.as_ref())
                        .bind(*version)
                        .bind(shipped.as_slice())
                        .execute($pool)
                        .await?;
                }
            }
        }};
    }
    match pool {
        Pool::Sqlite(pool) => rewrite!(
            pool,
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{table}')",
            "UPDATE {table} SET checksum = ? WHERE version = ? AND checksum = ?"
        ),
        Pool::MySql(pool) => rewrite!(
            pool,
            "SELECT CAST(EXISTS (SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE() \
             AND table_name = '{table}') AS SIGNED)",
            "UPDATE {table} SET checksum = ? WHERE version = ? AND checksum = ?"
        ),
        Pool::Postgres(pool) => rewrite!(
            pool,
            "SELECT CAST(CASE WHEN to_regclass('{table}') IS NULL THEN 0 ELSE 1 END AS BIGINT)",
            "UPDATE {table} SET checksum = $1 WHERE version = $2 AND checksum = $3"
        ),
    }
    Ok(())
}

/// The bytes a hex string spells; `None` if it is not hex.
fn hex_bytes(hex: &str) -> Option<Vec<u8>> {
    (0..hex.len()).step_by(2).map(|at| u8::from_str_radix(hex.get(at..at + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use sha2::{Digest, Sha384};

    #[test]
    fn every_listed_checksum_is_a_sha384_in_hex() {
        for reworded in REWORDED {
            let bytes = hex_bytes(reworded.shipped).expect("hex");
            assert_eq!(bytes.len(), 48, "version {} on {:?}", reworded.version, reworded.backend);
        }
    }

    /// The checksums listed are those of the texts as they shipped: the current text with
    /// its first line as it was then.
    #[test]
    fn the_shipped_checksums_are_those_of_the_shipped_texts() {
        let texts = [
            (Backend::Sqlite, include_str!("../../../migrations/sqlite/0003_session_seq_owner.sql")),
            (Backend::MySql, include_str!("../../../migrations/mysql/0003_session_seq_owner.sql")),
            (Backend::Postgres, include_str!("../../../migrations/postgres/0003_session_seq_owner.sql")),
        ];
        for (backend, text) in texts {
            let as_shipped = text.replacen("(cluster mode)", "(cluster mode, issue 13)", 1);
            assert_ne!(as_shipped, text, "{backend:?}: the reworded line is there");
            let listed: Vec<_> = shipped(backend).collect();
            assert_eq!(listed, [(3, Sha384::digest(as_shipped.as_bytes()).to_vec())], "{backend:?}");
        }
    }
}
