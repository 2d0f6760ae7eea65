//! The notice that plugin deployments changed: sent after every step of a deploy, so each
//! node reads the registry at once rather than at its next poll. A lost notice costs only
//! that wait: every node also reads the registry's generations every
//! `plugin_registry.poll_ms`.
//!
//! Embedded mode: [`LocalNotices`], in the process. Cluster mode: Redis pub/sub
//! (`cluster::plugin_notices`).

use async_trait::async_trait;
use tokio::sync::watch;

/// Sends and hears the notice.
#[async_trait]
pub trait DeployNotices: Send + Sync + 'static {
    /// Tells every node (this one too) to read the registry now. Never fails: a notice
    /// that cannot be sent is logged, and the poll stands in for it.
    async fn announce(&self);
    /// Changes whenever a notice arrives.
    fn subscribe(&self) -> watch::Receiver<u64>;
}

/// The notice within one process.
#[derive(Debug)]
pub struct LocalNotices {
    sent: watch::Sender<u64>,
}

impl Default for LocalNotices {
    fn default() -> Self {
        Self { sent: watch::Sender::new(0) }
    }
}

impl LocalNotices {
    /// Counts a notice heard (from this process or, in cluster mode, from Redis).
    pub fn heard(&self) {
        self.sent.send_modify(|count| *count = count.wrapping_add(1));
    }
}

#[async_trait]
impl DeployNotices for LocalNotices {
    async fn announce(&self) {
        self.heard();
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        self.sent.subscribe()
    }
}
