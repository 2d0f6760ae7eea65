//! `room-rate-limit`: how fast messages (`message-policy`) and announcements
//! (`announce-policy`) may go into a room. Its defaults are the announcement note's: each
//! player one message every 400 ms in a room, announcements one every 100 ms per room, and
//! no cap on a room's chat as a whole unless one is configured.
//!
//! The limit is each player's own because a room-wide 400 ms lets a whole room of players
//! say 2.5 messages a second *together*: in a busy room nearly every message is turned back
//! though no one sends fast. Announcements have a budget of their own, per room, and the
//! host judges them by `announce-policy` alone — on whichever node they are posted — so they
//! never spend a player's budget or the room's, and chat never delays them.
//!
//! Configuration (the plugin's TOML table); the first rule whose pattern matches the
//! conversation applies, conversations no rule matches are not limited. A key left out takes
//! the default shown:
//!
//! ```toml
//! [[rules]]
//! pattern = "room:*"          # glob over the conversation id
//! sender_interval_ms = 400    # each sender: at most one message per 400 ms in the room (0 = no limit)
//! announce_interval_ms = 100  # announcements: at most one per 100 ms into the room (0 = no limit)
//! room_interval_ms = 0        # every sender of the room together (0 = no room-wide cap)
//! ```
//!
//! A message over a limit is rejected with code `rate-limited` and `retry-after-ms` (the
//! client sees `REJECTED` with `retry_after_ms`); an announcement is deferred (HTTP 429 with
//! `Retry-After`). Limits live in the host's rate limiter, so they hold across every
//! instance and node.
#![deny(unsafe_code)]

use herald_sdk::{
    AnnouncePolicy, MessagePolicy, config, counter, limiter, pattern,
    types::{Acceptance, AnnounceDecision, Announcement, Message, MessageDecision, Rejection},
};
use serde::Deserialize;
use std::time::Duration;

/// The plugin's configuration.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Rules, first match wins.
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// One rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Glob over the conversation id.
    pub pattern: String,
    /// Minimum gap between two messages of one sender in the room, ms (0 = none).
    #[serde(default = "default_sender_interval_ms")]
    pub sender_interval_ms: u64,
    /// Minimum gap between two announcements in the room, ms (0 = none).
    #[serde(default = "default_announce_interval_ms")]
    pub announce_interval_ms: u64,
    /// Minimum gap between two messages in the room from anyone, ms (0 = none): a cap on the
    /// room's chat as a whole, for a room that must stay readable however many talk.
    #[serde(default)]
    pub room_interval_ms: u64,
}

/// One message per player every 0.4 s in a room: the note's figure, and chat servers'.
const fn default_sender_interval_ms() -> u64 {
    400
}

/// One announcement every 0.1 s per room: the note's figure once announcements no longer
/// went through a player's 0.4 s.
const fn default_announce_interval_ms() -> u64 {
    100
}

static SETTINGS: config::Cached<Settings> = config::Cached::new();

fn rule_for<'a>(settings: &'a Settings, conversation: &str) -> Option<&'a Rule> {
    settings.rules.iter().find(|r| pattern::matches(&r.pattern, conversation))
}

fn wait_ms(wait: Duration) -> u64 {
    u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The plugin.
pub struct RoomRateLimit;

impl MessagePolicy for RoomRateLimit {
    fn check_message(message: Message) -> MessageDecision {
        // A configuration that does not parse fails the call: the operator sees the error
        // in the plugin's status and the hook's failure policy answers meanwhile.
        let settings = match SETTINGS.get() {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let Some(rule) = rule_for(&settings, &message.conversation) else {
            return MessageDecision::Allow;
        };
        let room = &message.conversation;
        // The sender's own limit first: a sender over it is turned back before it takes
        // anything from the room's budget, so one fast sender cannot crowd the others out.
        let checks = [
            (
                rule.sender_interval_ms,
                format!("s:{room}\u{0}{}", message.sender),
                "you are sending too fast",
                "each sender",
            ),
            (rule.room_interval_ms, format!("r:{room}"), "this room is busy", "all its senders together"),
        ];
        for (interval_ms, key, why, whom) in checks {
            if interval_ms == 0 {
                continue;
            }
            if let Err(wait) = limiter::min_interval(&key, Duration::from_millis(interval_ms)) {
                counter::add("rate_limited_messages", 1);
                return MessageDecision::Reject(Rejection {
                    code: "rate-limited".to_owned(),
                    reason: format!("{why}: {room} allows {whom} one message every {interval_ms} ms"),
                    retry_after_ms: Some(wait_ms(wait)),
                });
            }
        }
        MessageDecision::Allow
    }
}

impl AnnouncePolicy for RoomRateLimit {
    fn check_announcement(announcement: Announcement) -> AnnounceDecision {
        let settings = match SETTINGS.get() {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let accept = AnnounceDecision::Accept(Acceptance { archive: true });
        let Some(rule) = rule_for(&settings, &announcement.room) else {
            return accept;
        };
        let interval_ms = rule.announce_interval_ms;
        if interval_ms == 0 {
            return accept;
        }
        match limiter::min_interval(&format!("a:{}", announcement.room), Duration::from_millis(interval_ms)) {
            Ok(()) => accept,
            Err(wait) => {
                counter::add("deferred_announcements", 1);
                AnnounceDecision::Defer(wait_ms(wait))
            }
        }
    }
}

herald_sdk::export_plugin!(RoomRateLimit, hooks: [message_policy, announce_policy]);

#[cfg(test)]
mod tests {
    use super::*;
    use herald_sdk::testkit::{self, FakeHost};

    /// The `[config]` of the manifest as shipped, as the host hands it to the plugin.
    fn shipped_config() -> String {
        let manifest = include_str!("../plugin.toml");
        let (_, config) = manifest.split_once("\n[config]\n").expect("plugin.toml has a [config] table");
        config.replace("[[config.rules]]", "[[rules]]")
    }

    const CONFIG: &str = r#"
        [[rules]]
        pattern = "room:quiet-*"
        room_interval_ms = 0
        sender_interval_ms = 0

        [[rules]]
        pattern = "room:*"
        room_interval_ms = 400
        sender_interval_ms = 100
        announce_interval_ms = 1000
    "#;

    fn send(sender: &str, room: &str) -> MessageDecision {
        RoomRateLimit::check_message(testkit::message(sender, room, "hi"))
    }

    fn announce(room: &str) -> AnnounceDecision {
        RoomRateLimit::check_announcement(testkit::announcement(room, None, "news"))
    }

    fn retry_after(decision: &MessageDecision) -> Option<u64> {
        match decision {
            MessageDecision::Reject(r) => r.retry_after_ms,
            _ => None,
        }
    }

    const ACCEPTED: AnnounceDecision = AnnounceDecision::Accept(Acceptance { archive: true });

    #[test]
    fn the_shipped_manifest_limits_each_player_not_the_room() {
        let host = FakeHost::new().with_config(&shipped_config());
        // Fifty players each sending every 0.5 s: every message goes through.
        for round in 0..3 {
            for player in 0..50 {
                assert_eq!(send(&format!("player{player}"), "room:plaza"), MessageDecision::Allow, "round {round}");
            }
            host.advance_ms(500);
        }
        // One sending every 0.3 s is turned back each time it is early, told how long to wait.
        let hasty: Vec<Option<u64>> = (0..5)
            .map(|n| {
                if n > 0 {
                    host.advance_ms(300);
                }
                retry_after(&send("hasty", "room:plaza"))
            })
            .collect();
        assert_eq!(hasty, [None, Some(100), None, Some(100), None]);
        assert_eq!(host.counter("rate_limited_messages"), 2);
    }

    #[test]
    fn the_shipped_manifest_paces_announcements_per_room_apart_from_the_chat() {
        let host = FakeHost::new().with_config(&shipped_config());
        assert_eq!(announce("room:plaza"), ACCEPTED);
        // Players talking do not hold announcements up, nor announcements the players.
        for player in 0..20 {
            assert_eq!(send(&format!("player{player}"), "room:plaza"), MessageDecision::Allow);
        }
        host.advance_ms(60);
        assert_eq!(announce("room:plaza"), AnnounceDecision::Defer(40));
        assert_eq!(announce("room:other"), ACCEPTED, "each room has its own pace");
        host.advance_ms(40);
        assert_eq!(announce("room:plaza"), ACCEPTED);
        assert_eq!(host.counter("deferred_announcements"), 1);
    }

    #[test]
    fn a_rule_naming_only_a_pattern_has_the_notes_defaults() {
        let host = FakeHost::new().with_config("[[rules]]\npattern = \"room:*\"\n");
        assert_eq!(send("alice", "room:lobby"), MessageDecision::Allow);
        assert_eq!(send("bob", "room:lobby"), MessageDecision::Allow, "no room-wide cap");
        assert_eq!(retry_after(&send("alice", "room:lobby")), Some(400), "400 ms per sender");
        assert_eq!(announce("room:lobby"), ACCEPTED);
        assert_eq!(announce("room:lobby"), AnnounceDecision::Defer(100), "100 ms per room");
        host.advance_ms(400);
        assert_eq!(send("alice", "room:lobby"), MessageDecision::Allow);
    }

    #[test]
    fn a_configured_room_cap_paces_every_sender_together() {
        let host = FakeHost::new().with_config(CONFIG);
        assert_eq!(send("alice", "room:lobby"), MessageDecision::Allow);
        host.advance_ms(150);
        let second = send("bob", "room:lobby");
        assert_eq!(retry_after(&second), Some(250));
        let MessageDecision::Reject(rejection) = &second else { panic!("{second:?}") };
        assert_eq!(rejection.code, "rate-limited");
        assert!(rejection.reason.contains("all its senders together"), "{rejection:?}");
        host.advance_ms(250);
        assert_eq!(send("bob", "room:lobby"), MessageDecision::Allow);
        assert_eq!(host.counter("rate_limited_messages"), 1);
    }

    #[test]
    fn a_sender_over_its_own_limit_takes_nothing_from_the_room() {
        let host = FakeHost::new()
            .with_config("[[rules]]\npattern = \"room:*\"\nsender_interval_ms = 400\nroom_interval_ms = 100\n");
        assert_eq!(send("alice", "room:lobby"), MessageDecision::Allow);
        host.advance_ms(200);
        let early = send("alice", "room:lobby");
        assert_eq!(retry_after(&early), Some(200));
        let MessageDecision::Reject(rejection) = &early else { panic!("{early:?}") };
        assert!(rejection.reason.contains("each sender"), "{rejection:?}");
        assert_eq!(send("bob", "room:lobby"), MessageDecision::Allow, "the room's budget is still there");
    }

    #[test]
    fn one_sender_is_paced_separately_from_the_room() {
        let host = FakeHost::new()
            .with_config("[[rules]]\npattern = \"room:*\"\nroom_interval_ms = 0\nsender_interval_ms = 100\n");
        assert_eq!(send("alice", "room:lobby"), MessageDecision::Allow);
        assert_eq!(send("bob", "room:lobby"), MessageDecision::Allow);
        assert_eq!(retry_after(&send("alice", "room:lobby")), Some(100));
        host.advance_ms(100);
        assert_eq!(send("alice", "room:lobby"), MessageDecision::Allow);
    }

    #[test]
    fn rooms_do_not_share_limits_and_unmatched_conversations_are_free() {
        let _host = FakeHost::new().with_config(CONFIG);
        assert_eq!(send("alice", "room:a"), MessageDecision::Allow);
        assert_eq!(send("alice", "room:b"), MessageDecision::Allow);
        for _ in 0..5 {
            assert_eq!(send("alice", "dm:alice:bob"), MessageDecision::Allow);
            assert_eq!(send("alice", "room:quiet-1"), MessageDecision::Allow);
        }
    }

    #[test]
    fn announcements_are_deferred_by_the_room_announce_interval() {
        let host = FakeHost::new().with_config(CONFIG);
        assert_eq!(announce("room:lobby"), ACCEPTED);
        host.advance_ms(300);
        assert_eq!(announce("room:lobby"), AnnounceDecision::Defer(700));
        host.advance_ms(700);
        assert_eq!(announce("room:lobby"), ACCEPTED);
    }

    #[test]
    fn no_config_means_no_limits() {
        let _host = FakeHost::new();
        for _ in 0..3 {
            assert_eq!(send("alice", "room:lobby"), MessageDecision::Allow);
            assert_eq!(announce("room:lobby"), ACCEPTED);
        }
    }

    #[test]
    #[should_panic(expected = "plugin config")]
    fn a_bad_config_fails_the_call() {
        let _host = FakeHost::new().with_config("rules = 3");
        let _ = send("alice", "room:lobby");
    }
}
