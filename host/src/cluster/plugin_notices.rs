//! The notice that plugin deployments changed, over Redis pub/sub: every step of a deploy
//! publishes on `<prefix>plugins:deployed`, and each node's subscription wakes its
//! follower (`plugins/follow.rs`) at once instead of at its next poll.
//!
//! The subscription has a connection of its own (a subscribed connection can do nothing
//! else), reconnects after a second when it drops, and counts a reconnection as a notice,
//! since one may have been missed meanwhile. On a Redis Cluster (`redis+cluster://`) nodes
//! do not subscribe — pub/sub would need a connection to a master of the client's own
//! choosing — and follow at their poll (`plugin_registry.poll_ms`) alone; publishing still
//! reaches every subscriber of a single server.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt as _;
use tokio::sync::watch;

use super::{KeyPrefix, RedisConnection};
use crate::plugins::notices::{DeployNotices, LocalNotices};

/// How long a publish may take.
const PUBLISH_LIMIT: Duration = Duration::from_millis(500);
/// The wait before subscribing again after the subscription failed.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);

/// Plugin deploy notices through Redis.
pub struct RedisNotices {
    redis: RedisConnection,
    channel: String,
    /// What this node heard, from Redis or from itself.
    local: Arc<LocalNotices>,
    /// The subscription's task, stopped with the notices: a node that stops (or a test's
    /// node dropped) leaves no connection to Redis behind.
    listener: Option<tokio::task::AbortHandle>,
}

impl Drop for RedisNotices {
    fn drop(&mut self) {
        if let Some(listener) = &self.listener {
            listener.abort();
        }
    }
}

impl RedisNotices {
    /// Starts listening on the Redis at `url` when `subscribe` (and unless it is a Redis
    /// Cluster); publishing needs no subscription.
    pub fn start(redis: RedisConnection, keys: &KeyPrefix, url: &str, subscribe: bool) -> Arc<Self> {
        let channel = format!("{}plugins:deployed", keys.as_str());
        let local = Arc::new(LocalNotices::default());
        let listener = (subscribe && !url.starts_with("redis+cluster://"))
            .then(|| tokio::spawn(listen(url.to_owned(), channel.clone(), Arc::clone(&local))).abort_handle());
        Arc::new(Self { redis, channel, local, listener })
    }
}

async fn listen(url: String, channel: String, local: Arc<LocalNotices>) {
    loop {
        if let Err(error) = subscribed(&url, &channel, &local).await {
            tracing::warn!(%error, "plugin deploy notices: the Redis subscription failed; nodes follow by their poll meanwhile");
        }
        tokio::time::sleep(RESUBSCRIBE_AFTER).await;
    }
}

/// Hears notices until the subscription drops.
async fn subscribed(url: &str, channel: &str, local: &LocalNotices) -> Result<(), String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut pubsub = tokio::time::timeout(PUBLISH_LIMIT * 4, client.get_async_pubsub())
        .await
        .map_err(|_| "no connection in time".to_owned())?
        .map_err(|e| e.to_string())?;
    pubsub.subscribe(channel).await.map_err(|e| e.to_string())?;
    // A notice may have been missed while the subscription was down.
    local.heard();
    let mut messages = pubsub.on_message();
    while messages.next().await.is_some() {
        local.heard();
    }
    Err("the subscription ended".to_owned())
}

#[async_trait]
impl DeployNotices for RedisNotices {
    async fn announce(&self) {
        // This node need not wait for Redis to hear its own notice.
        self.local.heard();
        let command = redis::cmd("PUBLISH").arg(&self.channel).arg("deployed").clone();
        if let Err(error) = self.redis.query::<i64>("publish a plugin deploy notice", PUBLISH_LIMIT, &command).await {
            tracing::warn!(%error, "cannot publish a plugin deploy notice; the other nodes see it at their poll");
        }
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.local.subscribe()
    }
}
