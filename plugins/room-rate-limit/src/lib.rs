//! `room-rate-limit`: minimum intervals per room and per (room, sender), the 0.4 s / 0.1 s
//! rules of chat servers, for messages (`message-policy`) and announcements
//! (`announce-policy`).
//!
//! Configuration (the plugin's TOML table); the first rule whose pattern matches the
//! conversation applies, conversations no rule matches are not limited:
//!
//! ```toml
//! [[rules]]
//! pattern = "room:*"          # glob over the conversation id
//! room_interval_ms = 400      # at most one message per 400 ms in the room (0 = no limit)
//! sender_interval_ms = 100    # at most one message per 100 ms per sender in the room
//! announce_interval_ms = 100  # announcements into the room (default: room_interval_ms)
//! ```
//!
//! A message over a limit is rejected with code `rate-limited` and `retry-after-ms`; an
//! announcement is deferred (HTTP 429 with `Retry-After`). Limits live in the host's rate
//! limiter, so they hold across every instance and node.
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
    /// Minimum gap between two messages in the room, ms (0 = none).
    #[serde(default)]
    pub room_interval_ms: u64,
    /// Minimum gap between two messages of one sender in the room, ms (0 = none).
    #[serde(default)]
    pub sender_interval_ms: u64,
    /// Minimum gap between two announcements in the room, ms; `room_interval_ms` if unset.
    pub announce_interval_ms: Option<u64>,
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
        let checks = [
            (rule.sender_interval_ms, format!("s:{room}\u{0}{}", message.sender), "you are sending too fast"),
            (rule.room_interval_ms, format!("r:{room}"), "this room is busy"),
        ];
        for (interval_ms, key, why) in checks {
            if interval_ms == 0 {
                continue;
            }
            if let Err(wait) = limiter::min_interval(&key, Duration::from_millis(interval_ms)) {
                counter::add("rate_limited_messages", 1);
                return MessageDecision::Reject(Rejection {
                    code: "rate-limited".to_owned(),
                    reason: format!("{why}: {room} allows one message every {interval_ms} ms"),
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
        let interval_ms = rule.announce_interval_ms.unwrap_or(rule.room_interval_ms);
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

    fn retry_after(decision: &MessageDecision) -> Option<u64> {
        match decision {
            MessageDecision::Reject(r) => r.retry_after_ms,
            _ => None,
        }
    }

    #[test]
    fn second_message_in_a_room_within_its_interval_is_rejected_with_retry_after() {
        let host = FakeHost::new().with_config(CONFIG);
        assert_eq!(send("alice", "room:lobby"), MessageDecision::Allow);
        host.advance_ms(150);
        let second = send("bob", "room:lobby");
        assert_eq!(retry_after(&second), Some(250));
        host.advance_ms(250);
        assert_eq!(send("bob", "room:lobby"), MessageDecision::Allow);
        assert_eq!(host.counter("rate_limited_messages"), 1);
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
        let a = || RoomRateLimit::check_announcement(testkit::announcement("room:lobby", None, "x"));
        assert_eq!(a(), AnnounceDecision::Accept(Acceptance { archive: true }));
        host.advance_ms(300);
        assert_eq!(a(), AnnounceDecision::Defer(700));
        host.advance_ms(700);
        assert_eq!(a(), AnnounceDecision::Accept(Acceptance { archive: true }));
    }

    #[test]
    fn no_config_means_no_limits() {
        let _host = FakeHost::new();
        for _ in 0..3 {
            assert_eq!(send("alice", "room:lobby"), MessageDecision::Allow);
        }
    }

    #[test]
    #[should_panic(expected = "plugin config")]
    fn a_bad_config_fails_the_call() {
        let _host = FakeHost::new().with_config("rules = 3");
        let _ = send("alice", "room:lobby");
    }
}
