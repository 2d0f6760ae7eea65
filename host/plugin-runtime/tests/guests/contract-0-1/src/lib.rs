//! `contract-0-1`: a plugin as herald-sdk 0.1 built it, kept to show that a host on a newer
//! contract still loads and runs it unchanged. Built straight from the frozen contract
//! (`proto/wit-0.1.0`, what that SDK embedded) with wit-bindgen, as that SDK did: it imports
//! `herald:plugin/host@0.1.0` and exports `herald:plugin/message-policy@0.1.0`.
//!
//! Body `count?` is rewritten to how many messages it has seen (a KV counter: the host
//! imports work); body `forbidden` is rejected; anything else is allowed.
wit_bindgen::generate!({
    path: "../../../../../proto/wit-0.1.0",
    world: "message-policy-plugin",
});

use exports::herald::plugin::message_policy::Guest;
use herald::plugin::{
    host,
    types::{Message, MessageDecision, Rejection},
};

struct Old;

impl Guest for Old {
    fn check(message: Message) -> MessageDecision {
        let seen = host::kv_increment("seen", 1, None);
        match message.body.as_slice() {
            b"count?" => MessageDecision::Rewrite(seen.to_string().into_bytes()),
            b"forbidden" => MessageDecision::Reject(Rejection {
                code: "old-contract".into(),
                reason: "refused by a 0.1.0 plugin".into(),
                retry_after_ms: None,
            }),
            _ => MessageDecision::Allow,
        }
    }
}

export!(Old);
