//! What a line typed into `herald-chat` means.

use crate::ids::{ConversationKind, dm_conversation, is_valid_name, parse_conversation};

/// One typed line, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `/to <user|conversation>`: talk in this conversation from now on.
    To(String),
    /// `/join <room>`: subscribe to a room and talk there.
    Join(String),
    /// `/leave [room]`: unsubscribe (the current room if none is named).
    Leave(Option<String>),
    /// `/history [limit]`: the page of messages before the oldest one shown so far.
    History(Option<u32>),
    /// `/sync`: pull whatever this device has not acknowledged yet.
    Sync,
    /// `/help`.
    Help,
    /// `/quit` (or end of input).
    Quit,
    /// Plain text: send it to the current conversation.
    Text(String),
    /// An empty line.
    Nothing,
    /// A line that cannot be obeyed, with what to tell the user.
    Invalid(String),
}

/// The help text listing the commands.
pub const HELP: &str = "\
commands:
  /to <user>            chat with a user (dm); also /to room:<name>, /to grp:<id>
  /join <room>          subscribe to room:<room> and chat there
  /leave [room]         unsubscribe (default: the current room)
  /history [n]          show n older messages of the current conversation (repeat to page)
  /sync                 pull messages this device has not acknowledged
  /help                 this text
  /quit                 leave (Ctrl-D works too)
anything else is sent to the current conversation";

/// Parses a typed line for user `me`.
pub fn parse_command(line: &str, me: &str) -> Command {
    let line = line.trim_end_matches(['\r', '\n']);
    let Some(rest) = line.strip_prefix('/') else {
        return if line.trim().is_empty() { Command::Nothing } else { Command::Text(line.to_owned()) };
    };
    // `//text` sends a line that starts with a slash.
    if rest.starts_with('/') {
        return Command::Text(rest.to_owned());
    }
    let mut words = rest.split_whitespace();
    let name = words.next().unwrap_or_default();
    let argument = words.next();
    let extra = words.next();
    if extra.is_some() {
        return Command::Invalid(format!("/{name} takes at most one argument"));
    }
    match (name, argument) {
        ("to" | "dm" | "peer", Some(target)) => match resolve_target(me, target) {
            Ok(conversation) => Command::To(conversation),
            Err(message) => Command::Invalid(message),
        },
        ("to" | "dm" | "peer", None) => Command::Invalid("usage: /to <user>".to_owned()),
        ("join" | "subscribe", Some(room)) => match room_id(room) {
            Some(room) => Command::Join(room),
            None => Command::Invalid(format!("`{room}` is not a room name: 1-128 characters of A-Z a-z 0-9 . _ @ -")),
        },
        ("join" | "subscribe", None) => Command::Invalid("usage: /join <room>".to_owned()),
        ("leave" | "unsubscribe", room) => match room.map(room_id) {
            None => Command::Leave(None),
            Some(Some(room)) => Command::Leave(Some(room)),
            Some(None) => Command::Invalid("usage: /leave [room]".to_owned()),
        },
        ("history", None) => Command::History(None),
        ("history", Some(limit)) => match limit.parse() {
            Ok(limit) if limit > 0 => Command::History(Some(limit)),
            _ => Command::Invalid("usage: /history [n], n > 0".to_owned()),
        },
        ("sync", None) => Command::Sync,
        ("help" | "?", _) => Command::Help,
        ("quit" | "exit" | "q", None) => Command::Quit,
        _ => Command::Invalid(format!("unknown command /{name}; /help lists them")),
    }
}

/// The conversation a `/to` target names: a user (the dm with `me`) or a full
/// conversation id.
///
/// # Errors
///
/// What is wrong with the target, for the user.
pub fn resolve_target(me: &str, target: &str) -> Result<String, String> {
    if target.contains(':') {
        return match parse_conversation(target) {
            Some(ConversationKind::Direct(low, high)) if me != low && me != high => {
                Err(format!("you ({me}) are not a member of {target}"))
            }
            Some(_) => Ok(target.to_owned()),
            None => Err(format!("`{target}` is not a conversation: use a user name, room:<name> or grp:<id>")),
        };
    }
    if !is_valid_name(target) {
        return Err(format!("`{target}` is not a user name: 1-128 characters of A-Z a-z 0-9 . _ @ -"));
    }
    if target == me {
        return Err("that is you: pick another user".to_owned());
    }
    Ok(dm_conversation(me, target))
}

/// `room:<name>` for `name` or `room:<name>`; `None` if the name is not valid.
pub fn room_id(room: &str) -> Option<String> {
    let name = room.strip_prefix("room:").unwrap_or(room);
    is_valid_name(name).then(|| format!("room:{name}"))
}

/// How a message body shows in a terminal: its UTF-8 text with control characters made
/// visible (so a peer cannot move the cursor or recolour the screen), or a size note for
/// binary bodies.
pub fn display_body(body: &[u8], kind: u32) -> String {
    match std::str::from_utf8(body) {
        Ok(text) => text.chars().map(|c| if c.is_control() { '\u{FFFD}' } else { c }).collect(),
        Err(_) => format!("<{} bytes of binary, kind {kind}>", body.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_is_sent() {
        assert_eq!(parse_command("hello there\n", "alice"), Command::Text("hello there".to_owned()));
        assert_eq!(parse_command("   ", "alice"), Command::Nothing);
        assert_eq!(parse_command("//not a command", "alice"), Command::Text("/not a command".to_owned()));
    }

    #[test]
    fn to_picks_the_dm_in_byte_order() {
        assert_eq!(parse_command("/to bob", "alice"), Command::To("dm:alice:bob".to_owned()));
        assert_eq!(parse_command("/to alice", "bob"), Command::To("dm:alice:bob".to_owned()));
        assert_eq!(parse_command("/to room:lobby", "bob"), Command::To("room:lobby".to_owned()));
        assert!(matches!(parse_command("/to bob", "bob"), Command::Invalid(_)));
        assert!(matches!(parse_command("/to b b", "a"), Command::Invalid(_)));
        assert!(matches!(parse_command("/to dm:carol:dave", "alice"), Command::Invalid(_)));
        assert!(matches!(parse_command("/to", "alice"), Command::Invalid(_)));
    }

    #[test]
    fn rooms_accept_bare_or_prefixed_names() {
        assert_eq!(parse_command("/join lobby", "a"), Command::Join("room:lobby".to_owned()));
        assert_eq!(parse_command("/join room:lobby", "a"), Command::Join("room:lobby".to_owned()));
        assert!(matches!(parse_command("/join lob:by", "a"), Command::Invalid(_)));
        assert_eq!(parse_command("/leave", "a"), Command::Leave(None));
        assert_eq!(parse_command("/leave lobby", "a"), Command::Leave(Some("room:lobby".to_owned())));
    }

    #[test]
    fn history_takes_an_optional_positive_limit() {
        assert_eq!(parse_command("/history", "a"), Command::History(None));
        assert_eq!(parse_command("/history 5", "a"), Command::History(Some(5)));
        assert!(matches!(parse_command("/history 0", "a"), Command::Invalid(_)));
        assert!(matches!(parse_command("/history x", "a"), Command::Invalid(_)));
    }

    #[test]
    fn other_commands() {
        assert_eq!(parse_command("/sync", "a"), Command::Sync);
        assert_eq!(parse_command("/help", "a"), Command::Help);
        assert_eq!(parse_command("/quit", "a"), Command::Quit);
        assert!(matches!(parse_command("/frobnicate", "a"), Command::Invalid(_)));
    }

    #[test]
    fn bodies_are_shown_safely() {
        assert_eq!(display_body(b"hi there", 1), "hi there");
        assert_eq!(display_body(b"evil\x1b[2J", 1), "evil\u{FFFD}[2J");
        assert_eq!(display_body(&[0xff, 0xfe], 7), "<2 bytes of binary, kind 7>");
    }
}
