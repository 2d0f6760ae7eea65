//! `echo`: one KV read per message (the benchmark's plugin). Body `version?` is answered
//! with a rewrite to the crate's name (`echo-v1` / `echo-v2`), so hot-reload tests can tell
//! which version answered.
use herald_sdk::{
    MessagePolicy, kv,
    types::{Message, MessageDecision},
};

const VERSION: &str = env!("CARGO_PKG_NAME");

struct Echo;

impl MessagePolicy for Echo {
    fn check_message(message: Message) -> MessageDecision {
        let _ = kv::get("k");
        if message.body == b"version?" {
            return MessageDecision::Rewrite(VERSION.as_bytes().to_vec());
        }
        MessageDecision::Allow
    }
}

herald_sdk::export_plugin!(Echo, hooks: [message_policy]);
