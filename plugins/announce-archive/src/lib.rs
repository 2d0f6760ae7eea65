//! `announce-archive` (`announce-policy`): which rooms' announcements are kept in history,
//! and each `announcement_id` accepted once.
//!
//! ```toml
//! archive = ["room:news-*", "room:lobby"]  # globs; announcements elsewhere are delivered
//!                                          # live but not archived (default: ["*"])
//! remember_ids_s = 86400                   # how long an announcement id is remembered
//! ```
//!
//! The id is remembered with the host KV's atomic set-if-absent, so a retried or doubled
//! POST is answered `duplicate` on every node. Run this plugin *after* rate limiting
//! (`order` in the manifest): an id is remembered when this plugin accepts it.
#![deny(unsafe_code)]

use herald_sdk::{
    AnnouncePolicy, config, counter, kv, pattern,
    types::{Acceptance, AnnounceDecision, Announcement},
};
use serde::Deserialize;
use std::time::Duration;

/// The plugin's configuration.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Globs over the room id whose announcements are archived.
    #[serde(default = "archive_everything")]
    pub archive: Vec<String>,
    /// How long an announcement id is remembered, seconds.
    #[serde(default = "one_day")]
    pub remember_ids_s: u64,
}

fn archive_everything() -> Vec<String> {
    vec!["*".to_owned()]
}

fn one_day() -> u64 {
    86_400
}

static SETTINGS: config::Cached<Settings> = config::Cached::new();

/// The plugin.
pub struct AnnounceArchive;

impl AnnouncePolicy for AnnounceArchive {
    fn check_announcement(announcement: Announcement) -> AnnounceDecision {
        let settings = match SETTINGS.get() {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        if let Some(id) = &announcement.announcement_id {
            let key = format!("id:{}\u{0}{id}", announcement.room);
            let ttl = Duration::from_secs(settings.remember_ids_s.max(1));
            if !kv::set_if_absent(&key, b"1", Some(ttl)) {
                counter::add("duplicate_announcements", 1);
                return AnnounceDecision::Duplicate;
            }
        }
        let archive = pattern::first_match(&settings.archive, &announcement.room).is_some();
        AnnounceDecision::Accept(Acceptance { archive })
    }
}

herald_sdk::export_plugin!(AnnounceArchive, hooks: [announce_policy]);

#[cfg(test)]
mod tests {
    use super::*;
    use herald_sdk::testkit::{self, FakeHost};

    fn check(room: &str, id: Option<&str>) -> AnnounceDecision {
        AnnounceArchive::check_announcement(testkit::announcement(room, id, "maintenance at 10:00"))
    }

    const ARCHIVED: AnnounceDecision = AnnounceDecision::Accept(Acceptance { archive: true });
    const LIVE_ONLY: AnnounceDecision = AnnounceDecision::Accept(Acceptance { archive: false });

    #[test]
    fn only_matching_rooms_are_archived() {
        let _host = FakeHost::new().with_config(r#"archive = ["room:news-*", "room:lobby"]"#);
        assert_eq!(check("room:news-eu", None), ARCHIVED);
        assert_eq!(check("room:lobby", None), ARCHIVED);
        assert_eq!(check("room:s12-chat", None), LIVE_ONLY);
    }

    #[test]
    fn without_config_everything_is_archived() {
        let _host = FakeHost::new();
        assert_eq!(check("room:any", None), ARCHIVED);
    }

    #[test]
    fn an_announcement_id_is_accepted_once_per_room() {
        let host = FakeHost::new();
        assert_eq!(check("room:lobby", Some("a-1")), ARCHIVED);
        assert_eq!(check("room:lobby", Some("a-1")), AnnounceDecision::Duplicate);
        assert_eq!(check("room:other", Some("a-1")), ARCHIVED);
        assert_eq!(check("room:lobby", Some("a-2")), ARCHIVED);
        assert_eq!(host.counter("duplicate_announcements"), 1);
    }

    #[test]
    fn ids_are_forgotten_after_the_configured_time() {
        let host = FakeHost::new().with_config("remember_ids_s = 60");
        assert_eq!(check("room:lobby", Some("a-1")), ARCHIVED);
        host.advance_ms(59_999);
        assert_eq!(check("room:lobby", Some("a-1")), AnnounceDecision::Duplicate);
        host.advance_ms(1);
        assert_eq!(check("room:lobby", Some("a-1")), ARCHIVED);
    }
}
