//! One trait per hook. A plugin implements the ones it needs and lists them in
//! [`export_plugin!`](crate::export_plugin).
//!
//! Hooks are associated functions (no `self`): Herald keeps a pool of instances of the
//! plugin and may call any of them, so nothing a hook keeps in memory is shared between
//! calls reliably. Keep state in [`kv`](crate::kv), which the host shares across instances
//! (and, in cluster mode, across nodes).

use crate::types::{
    AnnounceDecision, Announcement, ConnectDecision, ConnectRequest, Delivery, Health, Message, MessageDecision,
    RouteRequest, Tier,
};

/// Decides whether a message is stored (WIT `message-policy`).
///
/// Runs on the conversation's owner node before the message gets its sequence number. With
/// several plugins, they run in the configured order: the first `Reject` wins and a
/// `Rewrite` feeds the next plugin the new body.
pub trait MessagePolicy {
    /// Allow, reject or rewrite `message`.
    fn check_message(message: Message) -> MessageDecision;
}

/// Decides whether an announcement is delivered now, later or not again, and whether it
/// is archived in the room's history (WIT `announce-policy`).
///
/// `Defer(ms)` becomes HTTP 429 with `Retry-After`; `Duplicate` means this
/// `announcement_id` was accepted before. With several plugins the first `Defer` or
/// `Duplicate` wins and the announcement is archived only if every plugin accepted it with
/// `archive: true`, so a plugin with no opinion on archiving answers `archive: true`.
pub trait AnnouncePolicy {
    /// Accept, defer or flag `announcement` as a duplicate.
    fn check_announcement(announcement: Announcement) -> AnnounceDecision;
}

/// Chooses the key the cluster ring hashes to find a command's owner node (WIT
/// `route-key`).
///
/// `None` means no opinion: the next plugin or the built-in default (the conversation for
/// sends, the user otherwise) decides. Keys must be stable: a key that changes moves the
/// conversation to another owner.
pub trait RouteKey {
    /// The routing key for `request`, or `None`.
    fn route_key(request: RouteRequest) -> Option<String>;
}

/// Chooses the delivery tier from the node's health (WIT `degrade`). With several plugins
/// the most degraded tier wins.
pub trait Degrade {
    /// The tier for `health`.
    fn choose_tier(health: Health) -> Tier;
}

/// Authorizes a connection whose token is valid (WIT `connect`). The first `Deny` wins;
/// `Allow(Some(id))` replaces the session's user id.
pub trait Connect {
    /// Allow or deny `request`.
    fn authorize(request: ConnectRequest) -> ConnectDecision;
}

/// Drops recipients of a stored message without touching the message (WIT
/// `deliver-filter`, contract 0.2.0): block lists, muted rooms, age ratings.
///
/// Called once per message per batch of recipients — each node's share of a room's
/// subscribers, a group's members, the one user reading history — on push, backfill and
/// every pull alike, so a dropped recipient never gets the message by any path while the
/// others do. The sender is never among the recipients. With several plugins, a recipient
/// any of them drops is dropped. Keep it cheap: in a room of 10,000 it sees 10,000 ids.
pub trait DeliverFilter {
    /// The user ids (from `delivery.recipients`) who must not get the message; empty: all
    /// of them get it.
    fn filter_recipients(delivery: Delivery) -> Vec<String>;
}
