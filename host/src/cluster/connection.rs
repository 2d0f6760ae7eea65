//! The connection every Redis-backed seam of a node shares, and the one rule all of them
//! follow: no call to Redis without a deadline.
//!
//! [`RedisConnection`] wraps `redis`'s `ConnectionManager`: one multiplexed TCP connection
//! (concurrent commands are pipelined on it, so many lookups cost one round trip of
//! latency) that reconnects in the background after an I/O error. Cloning it is cheap and
//! shares the connection. Redis Cluster (`redis+cluster://…`) is not connected here yet: it
//! needs the `cluster-async` feature and a second variant behind this type; the keys and
//! scripts of the seams are already designed for it (module doc of [`crate::cluster`]).
//!
//! The manager reconnects after I/O errors only, not after calls that ran out of time: a
//! connection that silently stopped answering is left to the circuit breaker cluster mode
//! still needs (N consecutive timeouts → open, then a fresh connection).

use std::future::Future;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, RedisError, ScriptInvocation};

use crate::routing::RouteError;

/// A Redis call that failed or did not answer in time.
#[derive(Debug, thiserror::Error)]
pub enum RedisFailure {
    #[error("cannot connect to Redis at {url}: {reason}; check that it runs and that cluster.redis_url names it")]
    Connect { url: String, reason: String },
    #[error("Redis did not answer {what} within {limit:?}")]
    Timeout { what: &'static str, limit: Duration },
    #[error("Redis failed {what}: {source}")]
    Command {
        what: &'static str,
        #[source]
        source: RedisError,
    },
}

impl From<RedisFailure> for RouteError {
    fn from(failure: RedisFailure) -> Self {
        RouteError(failure.to_string())
    }
}

/// A shared connection to Redis (one server, or a primary behind a proxy).
#[derive(Clone)]
pub struct RedisConnection {
    /// Multiplexed and reconnecting; each clone shares the same socket.
    manager: ConnectionManager,
}

impl RedisConnection {
    /// Connects to the Redis at `url` (`redis://[user:password@]host:port/db`), waiting at
    /// most `connect_timeout` for the first connection.
    ///
    /// # Errors
    /// [`RedisFailure::Connect`] when the URL is not valid or Redis cannot be reached in
    /// time; the message names the URL without its password.
    pub async fn connect(url: &str, connect_timeout: Duration) -> Result<Self, RedisFailure> {
        let failed = |reason: String| RedisFailure::Connect { url: redact(url), reason };
        let client = redis::Client::open(url).map_err(|error| failed(error.to_string()))?;
        // One plain attempt first: the manager retries with backoff, which would hide why
        // Redis cannot be reached (refused, wrong password) behind a bare timeout.
        let probe = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(connect_timeout));
        match tokio::time::timeout(connect_timeout, client.get_multiplexed_async_connection_with_config(&probe)).await {
            Ok(Ok(_probe)) => {}
            Ok(Err(error)) => return Err(failed(error.to_string())),
            Err(_) => return Err(failed(format!("no connection within {connect_timeout:?}"))),
        }
        // Every call through this type carries its own deadline (`within`), so the manager's
        // response timeout is left off; its connection timeout bounds each (re)connect.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(None)
            .set_max_delay(Duration::from_secs(2));
        match tokio::time::timeout(connect_timeout, ConnectionManager::new_with_config(client, config)).await {
            Ok(Ok(manager)) => Ok(Self { manager }),
            Ok(Err(error)) => Err(failed(error.to_string())),
            Err(_) => Err(failed(format!("no connection within {connect_timeout:?}"))),
        }
    }

    /// Runs one command, at most `limit` long.
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        what: &'static str,
        limit: Duration,
        command: &Cmd,
    ) -> Result<T, RedisFailure> {
        let mut connection = self.manager.clone();
        within(what, limit, command.query_async(&mut connection)).await
    }

    /// Runs one script (loading it first if Redis does not know it), at most `limit` long.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        what: &'static str,
        limit: Duration,
        script: &ScriptInvocation<'_>,
    ) -> Result<T, RedisFailure> {
        let mut connection = self.manager.clone();
        within(what, limit, script.invoke_async(&mut connection)).await
    }

    /// A handle on the shared connection, for composing several concurrent calls under one
    /// deadline with [`within`].
    pub(crate) fn handle(&self) -> ConnectionManager {
        self.manager.clone()
    }
}

/// Awaits `call` for at most `limit`; an error or the deadline becomes a [`RedisFailure`]
/// naming `what`.
pub(crate) async fn within<T>(
    what: &'static str,
    limit: Duration,
    call: impl Future<Output = Result<T, RedisError>>,
) -> Result<T, RedisFailure> {
    match tokio::time::timeout(limit, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(RedisFailure::Command { what, source }),
        Err(_) => Err(RedisFailure::Timeout { what, limit }),
    }
}

/// `url` without the password, for messages and logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}***{}", &url[..scheme + 3], &url[at..]),
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(redact("redis://user:secret@10.0.0.1:6379/0"), "redis://***@10.0.0.1:6379/0");
        assert_eq!(redact("redis://127.0.0.1:6379/0"), "redis://127.0.0.1:6379/0");
    }
}
