//! `gate`: a connect policy (deny `mallory`, map `alias` to `alice`) and a message policy
//! that rejects bodies containing `secret` and appends `+gate` to the others, so a chain of
//! two gates shows that a rewrite feeds the next plugin.
use herald_sdk::{Connect, MessagePolicy, types::*};

struct Gate;

impl Connect for Gate {
    fn authorize(request: ConnectRequest) -> ConnectDecision {
        match request.user.as_str() {
            "mallory" => ConnectDecision::Deny("mallory is banned".into()),
            "alias" => ConnectDecision::Allow(Some("alice".into())),
            _ => ConnectDecision::Allow(None),
        }
    }
}

impl MessagePolicy for Gate {
    fn check_message(message: Message) -> MessageDecision {
        if message.body.windows(6).any(|w| w == b"secret") {
            return MessageDecision::Reject(Rejection {
                code: "secret".into(),
                reason: "no secrets".into(),
                retry_after_ms: None,
            });
        }
        let mut body = message.body;
        body.extend_from_slice(b"+gate");
        MessageDecision::Rewrite(body)
    }
}

herald_sdk::export_plugin!(Gate, hooks: [connect, message_policy]);
