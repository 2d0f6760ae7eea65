//! `route-key` (`route-key` hook): route a game's rooms by shard prefix, so every room of a
//! shard lands on one node: `room:s12-lobby` and `room:s12-trade` → key `shard:s12`.
//!
//! ```toml
//! prefix = "room:"        # conversations this applies to
//! separator = "-"         # the shard id runs from the prefix to the first separator
//! shard = "s*"            # glob the shard id must match (else: no opinion)
//! key_prefix = "shard:"   # the key is key_prefix + shard id
//! ```
//!
//! Conversations that do not fit answer `None`: the built-in default (the conversation for
//! sends, the user otherwise) routes them.
#![deny(unsafe_code)]

use herald_sdk::{RouteKey, config, pattern, types::RouteRequest};
use serde::Deserialize;

/// The plugin's configuration.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Conversations this applies to start with this.
    pub prefix: String,
    /// Ends the shard id.
    pub separator: String,
    /// Glob the shard id must match.
    pub shard: String,
    /// Prepended to the shard id to make the key.
    pub key_prefix: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            prefix: "room:".to_owned(),
            separator: "-".to_owned(),
            shard: "s*".to_owned(),
            key_prefix: "shard:".to_owned(),
        }
    }
}

static SETTINGS: config::Cached<Settings> = config::Cached::new();

/// The shard of `conversation` under `settings`, if it has one.
fn shard_of<'a>(settings: &Settings, conversation: &'a str) -> Option<&'a str> {
    let rest = conversation.strip_prefix(settings.prefix.as_str())?;
    let (shard, name) = rest.split_once(settings.separator.as_str())?;
    (!shard.is_empty() && !name.is_empty() && pattern::matches(&settings.shard, shard)).then_some(shard)
}

/// The plugin.
pub struct ShardRouteKey;

impl RouteKey for ShardRouteKey {
    fn route_key(request: RouteRequest) -> Option<String> {
        let settings = match SETTINGS.get() {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let conversation = request.conversation.as_deref()?;
        shard_of(&settings, conversation).map(|shard| format!("{}{shard}", settings.key_prefix))
    }
}

herald_sdk::export_plugin!(ShardRouteKey, hooks: [route_key]);

#[cfg(test)]
mod tests {
    use super::*;
    use herald_sdk::{
        testkit::{self, FakeHost},
        types::CommandKind,
    };

    fn key(command: CommandKind, conversation: Option<&str>) -> Option<String> {
        ShardRouteKey::route_key(testkit::route_request(command, "alice", conversation))
    }

    #[test]
    fn rooms_of_a_shard_share_one_key() {
        let _host = FakeHost::new();
        assert_eq!(key(CommandKind::Send, Some("room:s12-lobby")).as_deref(), Some("shard:s12"));
        assert_eq!(key(CommandKind::Subscribe, Some("room:s12-trade")).as_deref(), Some("shard:s12"));
        assert_eq!(key(CommandKind::Announce, Some("room:s3-lobby")).as_deref(), Some("shard:s3"));
    }

    #[test]
    fn other_conversations_get_no_opinion() {
        let _host = FakeHost::new();
        assert_eq!(key(CommandKind::Send, Some("room:lobby")), None);
        assert_eq!(key(CommandKind::Send, Some("room:x12-lobby")), None);
        assert_eq!(key(CommandKind::Send, Some("room:s12-")), None);
        assert_eq!(key(CommandKind::Send, Some("dm:alice:bob")), None);
        assert_eq!(key(CommandKind::Sync, None), None);
    }

    #[test]
    fn the_layout_comes_from_config() {
        let _host =
            FakeHost::new().with_config("prefix = \"grp:\"\nseparator = \".\"\nshard = \"*\"\nkey_prefix = \"realm/\"");
        assert_eq!(key(CommandKind::Send, Some("grp:eu.guild-7")).as_deref(), Some("realm/eu"));
        assert_eq!(key(CommandKind::Send, Some("room:s1-lobby")), None);
    }
}
