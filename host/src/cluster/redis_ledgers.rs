//! The devices' ledgers in Redis ([`LedgerStore`]), so that a restarted node takes its
//! devices back.
//!
//! Keys (see [`KeyPrefix::ledgers`]): each node's ledgers are spread over
//! [`LEDGER_SLOTS`] hashes named by its client address (`host:port`, which a restart keeps)
//! and a slot (CRC32 of the user id), so one save writes only the slots that changed and
//! the hashes spread over a Redis Cluster's shards; beside them the time the node's
//! ledgers were last all true. Everything lives [`KEPT`] from its last write: the ledgers of
//! a node that never comes back lapse, and a device whose ledger lapsed is backfilled in
//! full, as one whose node never saved it.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::try_join_all;

use super::connection::RedisConnection;
use super::peer::{decode_saved_ledger, encode_saved_ledger};
use super::{KeyPrefix, RedisTimeouts};
use crate::delivery::ledgers::{Device, LedgerStore, Saved};
use crate::maps::HashMap;
use crate::model::UserId;

/// How many hashes hold one node's ledgers.
pub const LEDGER_SLOTS: u32 = 64;

/// How long saved ledgers are kept after their last write.
pub const KEPT: Duration = Duration::from_secs(24 * 3600);

/// One node's ledgers in Redis, found by the address its clients reach it at.
pub struct RedisLedgers {
    redis: RedisConnection,
    keys: KeyPrefix,
    timeouts: RedisTimeouts,
    /// This node's client address (`host:port`).
    client: String,
}

impl RedisLedgers {
    pub fn new(redis: RedisConnection, keys: KeyPrefix, timeouts: RedisTimeouts, client: String) -> Self {
        Self { redis, keys, timeouts, client }
    }

    /// The client address the ledgers are saved under.
    pub fn client(&self) -> &str {
        &self.client
    }

    fn slot(user: &UserId) -> u32 {
        crc32fast::hash(user.as_str().as_bytes()) % LEDGER_SLOTS
    }

    fn field((user, device): &Device) -> String {
        format!("{user}|{device}")
    }
}

#[async_trait]
impl LedgerStore for RedisLedgers {
    async fn save(&self, saved: Vec<Saved>, removed: Vec<Device>, as_of_ms: u64) -> Result<(), String> {
        let mut writes: BTreeMap<u32, Vec<(String, Vec<u8>)>> = BTreeMap::new();
        for entry in &saved {
            let value = encode_saved_ledger(&entry.user, &entry.device, &entry.ledger);
            let field = Self::field(&(entry.user.clone(), entry.device.clone()));
            writes.entry(Self::slot(&entry.user)).or_default().push((field, value));
        }
        let mut removals: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for device in &removed {
            removals.entry(Self::slot(&device.0)).or_default().push(Self::field(device));
        }
        let kept = KEPT.as_millis() as u64;
        // One pipeline per slot (one key each: a Redis Cluster routes it whole), all sent at
        // once on the multiplexed connection.
        let slots: std::collections::BTreeSet<u32> = writes.keys().chain(removals.keys()).copied().collect();
        let calls = slots.into_iter().map(|slot| {
            let key = self.keys.ledgers(&self.client, slot);
            let mut pipe = redis::pipe();
            if let Some(fields) = writes.get(&slot) {
                pipe.cmd("HSET").arg(&key).arg(fields).ignore();
            }
            if let Some(fields) = removals.get(&slot) {
                pipe.cmd("HDEL").arg(&key).arg(fields).ignore();
            }
            pipe.cmd("PEXPIRE").arg(&key).arg(kept).ignore();
            let mut handle = self.redis.handle();
            async move { pipe.query_async::<()>(&mut handle).await }
        });
        self.redis.guarded("ledger save", self.timeouts.write, try_join_all(calls)).await.map_err(|e| e.to_string())?;
        // Only once every ledger is written does the mark say they are true as of then.
        let mut mark = redis::cmd("SET");
        mark.arg(self.keys.ledgers_as_of(&self.client)).arg(as_of_ms).arg("PX").arg(kept);
        self.redis.query::<()>("ledger save", self.timeouts.write, &mark).await.map_err(|e| e.to_string())
    }

    async fn load(&self) -> Result<Option<(u64, Vec<Saved>)>, String> {
        let mut mark = redis::cmd("GET");
        mark.arg(self.keys.ledgers_as_of(&self.client));
        let as_of: Option<u64> =
            self.redis.query("ledger load", self.timeouts.write, &mark).await.map_err(|e| e.to_string())?;
        let Some(as_of) = as_of else { return Ok(None) };
        let reads = (0..LEDGER_SLOTS).map(|slot| {
            let mut read = redis::cmd("HGETALL");
            read.arg(self.keys.ledgers(&self.client, slot));
            let mut handle = self.redis.handle();
            async move { read.query_async::<HashMap<String, Vec<u8>>>(&mut handle).await }
        });
        let slots = self
            .redis
            .guarded("ledger load", self.timeouts.write, try_join_all(reads))
            .await
            .map_err(|e| e.to_string())?;
        let mut all = Vec::new();
        let mut unreadable = 0usize;
        for (_, value) in slots.into_iter().flatten() {
            match decode_saved_ledger(&value) {
                Some((user, device, ledger)) => all.push(Saved { user, device, ledger }),
                None => unreadable += 1,
            }
        }
        if unreadable > 0 {
            tracing::warn!(
                unreadable,
                "saved ledgers that could not be read are left out; those devices get a full backfill"
            );
        }
        Ok(Some((as_of, all)))
    }
}
