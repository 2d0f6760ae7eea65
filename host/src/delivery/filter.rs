//! Per-recipient filtering: who of a message's recipients must not get it (the
//! `deliver-filter` plugin hook, ARCHITECTURE.md §4). The message stays stored; a dropped
//! recipient does not get it by any path — push, backfill, `sync`, `history`, room
//! catch-up — while everyone else does.
//!
//! Delivery asks once per message per batch of recipients (the members of a group or
//! direct conversation on the owner, each node's share of a room's subscribers, the one
//! user reading), and never about the sender: a sender's own devices get what it sent.

use std::collections::HashSet;

use async_trait::async_trait;

use crate::model::{Message, UserId};

/// Decides which recipients of a message are dropped.
#[async_trait]
pub trait RecipientFilter: Send + Sync {
    /// Whether a filter is in force; when not, delivery skips the rest at no cost.
    fn active(&self) -> bool;

    /// Of `recipients` (never the sender), those who must not get `message`.
    async fn dropped(&self, message: &Message, recipients: &[UserId]) -> HashSet<UserId>;
}
