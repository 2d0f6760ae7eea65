//! Per-recipient filtering: who of a message's recipients must not get it (the
//! `deliver-filter` plugin hook, ARCHITECTURE.md §4). The message stays stored; a dropped
//! recipient does not get it by any path — push, backfill, `sync`, `history`, room
//! catch-up — while everyone else does.
//!
//! Delivery asks once per message per batch of recipients (the members of a group or
//! direct conversation on the owner, each node's share of a room's subscribers, the one
//! user reading), and never about the sender: a sender's own devices get what it sent.

use async_trait::async_trait;

use crate::maps::HashSet;
use crate::model::{Message, UserId};
use crate::plugins::{Hook, PluginHost, types};

/// Decides which recipients of a message are dropped.
#[async_trait]
pub trait RecipientFilter: Send + Sync {
    /// Whether a filter is in force; when not, delivery skips the rest at no cost.
    fn active(&self) -> bool;

    /// Of `recipients` (never the sender), those who must not get `message`.
    async fn dropped(&self, message: &Message, recipients: &[UserId]) -> HashSet<UserId>;
}

/// The `deliver-filter` hook as delivery's [`RecipientFilter`]: one call per batch of
/// recipients, only when a plugin exports the hook.
#[async_trait::async_trait]
impl RecipientFilter for PluginHost {
    fn active(&self) -> bool {
        self.has_hook(Hook::DeliverFilter)
    }

    async fn dropped(&self, message: &Message, recipients: &[UserId]) -> HashSet<UserId> {
        let delivery = types::Delivery {
            conversation: message.conversation.to_string(),
            seq: message.seq,
            sender: message.sender.to_string(),
            kind: message.kind,
            body: message.body.to_vec(),
            recipients: recipients.iter().map(ToString::to_string).collect(),
        };
        let dropped = self.deliver_filter(&delivery).await;
        if dropped.is_empty() {
            return HashSet::default();
        }
        recipients.iter().filter(|user| dropped.contains(user.as_str())).cloned().collect()
    }
}
