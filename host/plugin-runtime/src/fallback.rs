//! Built-in defaults: the answer of each hook when no plugin gives one, and the `default`
//! failure policy. [`Fallback`] is the seam; the runtime ships [`BuiltinDefaults`], the
//! behaviour ARCHITECTURE.md §4 prescribes, which the host uses as it is.

use crate::types::{
    Acceptance, AnnounceDecision, Announcement, CommandKind, ConnectDecision, ConnectRequest, Health, Message,
    MessageDecision, RouteRequest, Tier,
};

/// The host's own decision for each hook.
pub trait Fallback: Send + Sync + 'static {
    /// Decision for a message no plugin decided.
    fn message_policy(&self, message: &Message) -> MessageDecision;
    /// Decision for an announcement no plugin decided.
    fn announce_policy(&self, announcement: &Announcement) -> AnnounceDecision;
    /// Routing key when no plugin has an opinion.
    fn route_key(&self, request: &RouteRequest) -> String;
    /// Tier when no plugin decided.
    fn degrade(&self, health: &Health) -> Tier;
    /// Decision for a connection no plugin decided (its token is already valid).
    fn connect(&self, request: &ConnectRequest) -> ConnectDecision;
}

/// ARCHITECTURE.md §4's safe defaults: messages allowed; announcements accepted and
/// archived (never lost); route key = the conversation for sends, the user otherwise;
/// tier normal; connections with a valid token allowed.
#[derive(Debug, Default, Clone, Copy)]
pub struct BuiltinDefaults;

impl Fallback for BuiltinDefaults {
    fn message_policy(&self, _message: &Message) -> MessageDecision {
        MessageDecision::Allow
    }

    fn announce_policy(&self, _announcement: &Announcement) -> AnnounceDecision {
        AnnounceDecision::Accept(Acceptance { archive: true })
    }

    fn route_key(&self, request: &RouteRequest) -> String {
        match (request.command, &request.conversation) {
            (CommandKind::Send | CommandKind::Announce, Some(conversation)) => conversation.clone(),
            _ => request.user.clone(),
        }
    }

    fn degrade(&self, _health: &Health) -> Tier {
        Tier::Normal
    }

    fn connect(&self, _request: &ConnectRequest) -> ConnectDecision {
        ConnectDecision::Allow(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_key_is_the_conversation_for_sends_and_the_user_otherwise() {
        let req = |command, conversation: Option<&str>| RouteRequest {
            command,
            user: "alice".into(),
            conversation: conversation.map(str::to_owned),
        };
        assert_eq!(BuiltinDefaults.route_key(&req(CommandKind::Send, Some("room:a"))), "room:a");
        assert_eq!(BuiltinDefaults.route_key(&req(CommandKind::Sync, Some("room:a"))), "alice");
        assert_eq!(BuiltinDefaults.route_key(&req(CommandKind::Send, None)), "alice");
    }
}
