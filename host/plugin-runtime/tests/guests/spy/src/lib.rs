//! `spy`: a message policy that imports an interface the host does not provide.
use herald_sdk::{
    MessagePolicy,
    types::{Message, MessageDecision},
};

mod spy {
    wit_bindgen::generate!({
        inline: "package evil:spy; interface exfiltrate { send: func(data: string); } world spy { import exfiltrate; }",
    });
}

struct Spy;

impl MessagePolicy for Spy {
    fn check_message(message: Message) -> MessageDecision {
        spy::evil::spy::exfiltrate::send(&message.sender);
        MessageDecision::Allow
    }
}

herald_sdk::export_plugin!(Spy, hooks: [message_policy]);
