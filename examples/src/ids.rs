//! The naming rules of PROTOCOL.md: user, device and room names, conversation ids and the
//! UUID `client_msg_id` of a send.
//!
//! Invariant: every function here is pure, so clients agree with each other (and with the
//! server) on how a conversation is spelled without asking anyone.

use std::fmt::Write as _;

/// Longest user id, device id or name PROTOCOL.md allows, in bytes.
pub const MAX_NAME_BYTES: usize = 128;

/// Whether `name` is a valid user id, device id or room/group name: 1–128 bytes of
/// `[A-Za-z0-9._@-]`.
pub fn is_valid_name(name: &str) -> bool {
    (1..=MAX_NAME_BYTES).contains(&name.len())
        && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'@' | b'-'))
}

/// The direct conversation of two users, `dm:<a>:<b>` with `a < b` byte-wise, so both
/// sides compute the same id.
pub fn dm_conversation(one: &str, other: &str) -> String {
    let (low, high) = if one.as_bytes() <= other.as_bytes() { (one, other) } else { (other, one) };
    format!("dm:{low}:{high}")
}

/// What a conversation id names, parsed from its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConversationKind<'a> {
    /// `dm:<a>:<b>`: the two members.
    Direct(&'a str, &'a str),
    /// `grp:<id>`: a group managed through the HTTP API.
    Group(&'a str),
    /// `room:<name>`: a broadcast room.
    Room(&'a str),
}

/// Parses a conversation id, or `None` if it is not one PROTOCOL.md defines (including a
/// `dm:` whose members are not in byte order, or any name outside the allowed alphabet).
pub fn parse_conversation(conversation: &str) -> Option<ConversationKind<'_>> {
    if let Some(members) = conversation.strip_prefix("dm:") {
        let (low, high) = members.split_once(':')?;
        (is_valid_name(low) && is_valid_name(high) && low.as_bytes() < high.as_bytes())
            .then_some(ConversationKind::Direct(low, high))
    } else if let Some(id) = conversation.strip_prefix("grp:") {
        is_valid_name(id).then_some(ConversationKind::Group(id))
    } else if let Some(name) = conversation.strip_prefix("room:") {
        is_valid_name(name).then_some(ConversationKind::Room(name))
    } else {
        None
    }
}

/// Formats 128 bits as a version-4 (random) UUID string, setting the version and variant
/// bits. Callers supply the bits so they can choose between true randomness
/// ([`random_uuid`]) and a cheap unique sequence ([`ClientMsgIds`]).
pub fn format_uuid_v4(bits: u128) -> String {
    let bits = (bits & !(0xF << 76) & !(0b11 << 62)) | (0x4 << 76) | (0b10 << 62);
    let hex = format!("{bits:032x}");
    let mut out = String::with_capacity(36);
    for (index, part) in [&hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32]].into_iter().enumerate() {
        if index > 0 {
            out.push('-');
        }
        out.push_str(part);
    }
    out
}

/// A fresh random UUID string, for one-off `client_msg_id`s.
pub fn random_uuid() -> String {
    format_uuid_v4(rand::random())
}

/// Generates `client_msg_id`s that are UUID-shaped and unique for one client without
/// drawing randomness per message: a random 64-bit prefix per generator and a counter.
///
/// Use it where sends are hot (the load generator); [`random_uuid`] elsewhere.
#[derive(Debug, Clone)]
pub struct ClientMsgIds {
    /// Random per generator, so two runs or two users never collide.
    prefix: u64,
    /// The next counter value to hand out.
    next: u64,
}

impl ClientMsgIds {
    /// A generator with a random prefix.
    pub fn new() -> Self {
        Self::with_prefix(rand::random())
    }

    /// A generator with a given prefix, for tests.
    pub fn with_prefix(prefix: u64) -> Self {
        Self { prefix, next: 0 }
    }

    /// The next id.
    pub fn next_id(&mut self) -> String {
        let counter = self.next;
        self.next += 1;
        // The counter keeps the low 62 bits: the variant bits above it are overwritten.
        format_uuid_v4((u128::from(self.prefix) << 64) | u128::from(counter))
    }
}

impl Default for ClientMsgIds {
    fn default() -> Self {
        Self::new()
    }
}

/// A short random lowercase-hex tag (`len` characters), e.g. to make load-test user names
/// unique per run.
pub fn random_tag(len: usize) -> String {
    let mut out = String::with_capacity(len);
    while out.len() < len {
        let _ = write!(out, "{:016x}", rand::random::<u64>());
    }
    out.truncate(len);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_protocol_alphabet() {
        assert!(is_valid_name("alice"));
        assert!(is_valid_name("a.b_c@d-e9"));
        assert!(is_valid_name(&"x".repeat(128)));
        assert!(!is_valid_name(""));
        assert!(!is_valid_name(&"x".repeat(129)));
        assert!(!is_valid_name("al ice"));
        assert!(!is_valid_name("a:b"));
        assert!(!is_valid_name("é"));
    }

    #[test]
    fn dm_conversation_orders_members_bytewise() {
        assert_eq!(dm_conversation("bob", "alice"), "dm:alice:bob");
        assert_eq!(dm_conversation("alice", "bob"), "dm:alice:bob");
        // Byte order, not case-insensitive order: 'B' (0x42) < 'a' (0x61).
        assert_eq!(dm_conversation("alice", "Bob"), "dm:Bob:alice");
    }

    #[test]
    fn conversations_parse_by_prefix() {
        assert_eq!(parse_conversation("dm:alice:bob"), Some(ConversationKind::Direct("alice", "bob")));
        assert_eq!(parse_conversation("dm:bob:alice"), None);
        assert_eq!(parse_conversation("dm:alice:alice"), None);
        assert_eq!(parse_conversation("dm:alice"), None);
        assert_eq!(parse_conversation("grp:team"), Some(ConversationKind::Group("team")));
        assert_eq!(parse_conversation("room:lobby"), Some(ConversationKind::Room("lobby")));
        assert_eq!(parse_conversation("room:"), None);
        assert_eq!(parse_conversation("chan:x"), None);
    }

    #[test]
    fn uuids_are_version_4_and_well_formed() {
        for bits in [0, u128::MAX, 0x0123_4567_89ab_cdef_0123_4567_89ab_cdef] {
            let uuid = format_uuid_v4(bits);
            assert_eq!(uuid.len(), 36);
            let groups: Vec<&str> = uuid.split('-').collect();
            assert_eq!(groups.iter().map(|g| g.len()).collect::<Vec<_>>(), [8, 4, 4, 4, 12]);
            assert!(groups[2].starts_with('4'), "{uuid}");
            assert!(matches!(groups[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'), "{uuid}");
        }
    }

    #[test]
    fn client_msg_ids_are_unique_per_generator() {
        let mut ids = ClientMsgIds::with_prefix(7);
        let first = ids.next_id();
        let second = ids.next_id();
        assert_ne!(first, second);
        assert_eq!(ClientMsgIds::with_prefix(7).next_id(), first);
        assert_ne!(ClientMsgIds::with_prefix(8).next_id(), first);
    }

    #[test]
    fn random_tags_have_the_asked_length() {
        assert_eq!(random_tag(6).len(), 6);
        assert_eq!(random_tag(40).len(), 40);
        assert!(random_tag(12).bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
