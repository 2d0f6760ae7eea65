//! `word-filter`: the Rust word filter, exactly the template `herald plugin new` writes
//! (`src/check.rs`, `LIB_TEMPLATE`; a test there holds the two equal). The Python and
//! JavaScript examples (`guests/`) must answer every case of `tests/all/languages.rs` the
//! way this one does.
use herald_sdk::{
    MessagePolicy, config, log,
    types::{Message, MessageDecision, Rejection},
};
use serde::Deserialize;

/// The `[config]` table of the manifest.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Settings {
    /// Words that get a message rejected.
    blocked_words: Vec<String>,
}

static SETTINGS: config::Cached<Settings> = config::Cached::new();

struct Plugin;

impl MessagePolicy for Plugin {
    fn check_message(message: Message) -> MessageDecision {
        let settings = match SETTINGS.get() {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let text = String::from_utf8_lossy(&message.body).to_lowercase();
        if let Some(word) = settings.blocked_words.iter().find(|w| text.contains(w.as_str())) {
            log::info("blocked a message", &[("sender", &message.sender), ("word", word)]);
            return MessageDecision::Reject(Rejection {
                code: "blocked-word".into(),
                reason: format!("messages may not contain `{word}`"),
                retry_after_ms: None,
            });
        }
        MessageDecision::Allow
    }
}

herald_sdk::export_plugin!(Plugin, hooks: [message_policy]);
