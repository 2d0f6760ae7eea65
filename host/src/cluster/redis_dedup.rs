//! Dedup marks in Redis: one string per (sender, client_msg_id), shared by every node, since
//! a client's retry may reach another owner after a ring change.
//!
//! `dedup:{u:<user>}:<client_msg_id>` is `pending` while the send is in flight (taken with
//! `SET … NX PX`), then `stored|<message_id>|<seq>|<conversation>` once it is stored; a
//! cancelled send deletes its `pending` mark so the retry is processed.
//!
//! A `pending` mark lives [`MarkLifetimes::pending_ttl`] (short), a stored one
//! [`MarkLifetimes::ttl`] from when it was stored: a node that dies mid-send leaves a
//! `pending` mark no one will complete or cancel, and the short TTL bounds how long retries
//! of that send are told to wait, rather than the whole dedup window. Completing therefore
//! sets the TTL anew (`SET … XX PX ttl`) instead of keeping the pending one.
//!
//! A duplicate that finds `pending` waits for the original by reading the mark every 20 ms,
//! for at most [`MarkLifetimes::wait_for_original`]: the stored ids, or
//! `OriginalFailed` once the mark is gone (cancelled, or expired), or `OriginalAbandoned`
//! past the wait. Either error answers `RETRY`.
//!
//! **Redis unavailable.** [`DedupMarks`] cannot fail, and a send must neither be blocked nor
//! silently swallowed because Redis is slow. So a mark that cannot be taken counts as
//! [`Mark::Fresh`] (logged): the send goes on, and a duplicate is caught by the unique index
//! on (sender, client_msg_id) in storage, the final guard in every mode, which answers it
//! with the original's ids. A failed complete or cancel is logged: the mark then expires by
//! its TTL, and the unique index again guards the gap. The same guard covers the races a
//! mark without an owner token allows (an expired `pending` mark taken by a retry while the
//! original still runs).

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use redis::Script;

use super::connection::RedisConnection;
use super::{KeyPrefix, RedisTimeouts};
use crate::model::{ClientMsgId, ConversationId, UserId};
use crate::pipeline::SendError;
use crate::pipeline::dedup::{DedupMarks, Mark, Original, Outcome};
use crate::telemetry::Throttle;

/// How often a duplicate reads the mark of the original it waits for.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// The value of a mark whose send is in flight.
const PENDING: &str = "pending";

/// KEYS[1] the mark; ARGV[1] the pending TTL in ms. Takes the mark and returns nil, or
/// returns the value of the mark someone holds.
static TRY_MARK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('SET', KEYS[1], 'pending', 'NX', 'PX', ARGV[1]) then return false end
         return redis.call('GET', KEYS[1])",
    )
});

/// KEYS[1] the mark. Deletes it only while it is pending (a stored mark stays).
static CANCEL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('GET', KEYS[1]) == 'pending' then return redis.call('DEL', KEYS[1]) end
         return 0",
    )
});

/// How long marks live and how long a duplicate waits for its original.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MarkLifetimes {
    /// A stored mark answers duplicates this long (`delivery.dedup_ttl_ms`).
    pub ttl: Duration,
    /// A pending mark lives this long if its send never ends (its node died); longer than
    /// any send takes.
    pub pending_ttl: Duration,
    /// The longest a duplicate waits for a pending original before answering `RETRY`.
    pub wait_for_original: Duration,
}

impl MarkLifetimes {
    /// Stored marks live `ttl`; pending ones at most 10 s (never longer than `ttl`); a
    /// duplicate waits at most 5 s. A send takes milliseconds to store, and a forwarded one
    /// gives up after 2 s, so 10 s is long past any live original; a pending mark left by a
    /// node that died holds its retries up that long at most (the unique index in storage
    /// catches a duplicate let through after that).
    pub fn with_ttl(ttl: Duration) -> Self {
        Self { ttl, pending_ttl: ttl.min(Duration::from_secs(10)), wait_for_original: Duration::from_secs(5) }
    }
}

/// The cluster dedup marks: strings in Redis with a TTL.
pub struct RedisDedup {
    /// Shared with the node's other Redis seams.
    redis: RedisConnection,
    /// Names the keys; separates deployments and tests sharing one Redis.
    keys: KeyPrefix,
    /// Taking a mark and waiting get `lookup`; complete and cancel get `write`.
    timeouts: RedisTimeouts,
    /// How long marks live.
    lifetimes: MarkLifetimes,
}

impl RedisDedup {
    /// Dedup marks on `redis`, under `keys`, each call bounded by `timeouts`.
    pub fn new(redis: RedisConnection, keys: KeyPrefix, timeouts: RedisTimeouts, lifetimes: MarkLifetimes) -> Self {
        Self { redis, keys, timeouts, lifetimes }
    }
}

#[async_trait]
impl DedupMarks for RedisDedup {
    async fn try_mark(&self, sender: &UserId, client_msg_id: &ClientMsgId, _conversation: &ConversationId) -> Mark {
        let key = self.keys.dedup(sender, client_msg_id);
        let mut take = TRY_MARK.prepare_invoke();
        take.key(&key).arg(millis(self.lifetimes.pending_ttl));
        let held: Option<String> = match self.redis.invoke("dedup mark", self.timeouts.lookup, &take).await {
            Ok(held) => held,
            Err(failure) => {
                static NOT_TAKEN: Throttle = Throttle::new();
                if let Some(suppressed) = NOT_TAKEN.allow() {
                    tracing::warn!(%sender, %client_msg_id, %failure, suppressed, "dedup mark not taken; the unique index guards this send");
                }
                return Mark::Fresh;
            }
        };
        match held.as_deref().map(decode) {
            None => Mark::Fresh,
            Some(Some(State::Pending)) => Mark::InFlight(self.original(key)),
            Some(Some(State::Stored(outcome))) => Mark::Stored(outcome),
            Some(None) => {
                tracing::warn!(%sender, %client_msg_id, "unreadable dedup mark; the unique index guards this send");
                Mark::Fresh
            }
        }
    }

    async fn complete(&self, sender: &UserId, client_msg_id: &ClientMsgId, outcome: Outcome) {
        let mut store = redis::cmd("SET");
        store
            .arg(self.keys.dedup(sender, client_msg_id))
            .arg(encode(&outcome))
            .arg("XX")
            .arg("PX")
            .arg(millis(self.lifetimes.ttl));
        if let Err(failure) = self.redis.query::<()>("dedup complete", self.timeouts.write, &store).await {
            static NOT_COMPLETED: Throttle = Throttle::new();
            if let Some(suppressed) = NOT_COMPLETED.allow() {
                tracing::warn!(%sender, %client_msg_id, %failure, suppressed, "dedup mark not completed; it expires by its TTL");
            }
        }
    }

    async fn cancel(&self, sender: &UserId, client_msg_id: &ClientMsgId) {
        let mut cancel = CANCEL.prepare_invoke();
        cancel.key(self.keys.dedup(sender, client_msg_id));
        if let Err(failure) = self.redis.invoke::<()>("dedup cancel", self.timeouts.write, &cancel).await {
            static NOT_CANCELLED: Throttle = Throttle::new();
            if let Some(suppressed) = NOT_CANCELLED.allow() {
                tracing::warn!(%sender, %client_msg_id, %failure, suppressed, "dedup mark not cancelled; it expires by its TTL");
            }
        }
    }
}

impl RedisDedup {
    /// The outcome of the send holding the mark at `key`, read every [`POLL_EVERY`].
    fn original(&self, key: String) -> Original {
        let redis = self.redis.clone();
        let (limit, wait) = (self.timeouts.lookup, self.lifetimes.wait_for_original);
        Box::pin(async move {
            let mut read = redis::cmd("GET");
            read.arg(&key);
            let poll = async {
                let mut every = tokio::time::interval(POLL_EVERY);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    every.tick().await;
                    match redis.query::<Option<String>>("dedup wait", limit, &read).await {
                        Ok(None) => return Err(SendError::OriginalFailed),
                        Ok(Some(value)) => match decode(&value) {
                            Some(State::Pending) => {}
                            Some(State::Stored(outcome)) => return Ok(outcome),
                            None => return Err(SendError::OriginalFailed),
                        },
                        // Redis blinked: read again until the wait runs out.
                        Err(failure) => tracing::debug!(%failure, "waiting for an original send"),
                    }
                }
            };
            tokio::time::timeout(wait, poll).await.unwrap_or(Err(SendError::OriginalAbandoned))
        })
    }
}

/// What a mark says.
enum State {
    Pending,
    Stored(Outcome),
}

fn encode(outcome: &Outcome) -> String {
    format!("stored|{}|{}|{}", outcome.message_id, outcome.seq, outcome.conversation)
}

/// Reads a mark back; `None` when it is neither pending nor a stored outcome.
fn decode(value: &str) -> Option<State> {
    if value == PENDING {
        return Some(State::Pending);
    }
    let mut parts = value.strip_prefix("stored|")?.splitn(3, '|');
    let message_id = parts.next()?.parse().ok()?;
    let seq = parts.next()?.parse().ok()?;
    let conversation = ConversationId::parse(parts.next()?).ok()?;
    Some(State::Stored(Outcome { message_id, seq, conversation }))
}

/// A duration as the whole milliseconds Redis takes, at least 1 (`PX 0` is an error).
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_read_back_as_written() {
        let outcome = Outcome {
            message_id: 7_000_000_000_001,
            seq: 12,
            conversation: ConversationId::parse("dm:ann:bob").expect("valid"),
        };
        let Some(State::Stored(read)) = decode(&encode(&outcome)) else { panic!("a stored mark") };
        assert_eq!(read, outcome);
        assert!(matches!(decode("pending"), Some(State::Pending)));
        assert!(decode("stored|1|x|dm:ann:bob").is_none());
        assert!(decode("something else").is_none());
    }

    #[test]
    fn pending_marks_never_outlive_stored_ones() {
        assert_eq!(MarkLifetimes::with_ttl(Duration::from_millis(200)).pending_ttl, Duration::from_millis(200));
        assert_eq!(MarkLifetimes::with_ttl(Duration::from_secs(600)).pending_ttl, Duration::from_secs(10));
        assert_eq!(millis(Duration::ZERO), 1);
    }
}
