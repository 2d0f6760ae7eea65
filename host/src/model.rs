//! The names Herald deals in, validated once at the edge.
//!
//! `UserId`, `DeviceId`, `ConversationId` and `ClientMsgId` can only be built through
//! `parse`, which enforces PROTOCOL.md's rules; code past the edge never re-checks them and
//! never sees a malformed one. Bad input is rejected with a reason a client developer can act
//! on, never silently altered.

use std::fmt;
use std::sync::Arc;

/// Longest user id, device id or conversation name, in bytes (PROTOCOL.md, "Conversations").
pub const MAX_NAME_BYTES: usize = 128;

/// Why an id or name was refused. The message is meant for the client developer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidId {
    #[error("{what} is empty; it must be 1-128 bytes of [A-Za-z0-9._@-]")]
    Empty { what: &'static str },
    #[error("{what} is {len} bytes long; the limit is 128 bytes")]
    TooLong { what: &'static str, len: usize },
    #[error("{what} contains {found:?}; only [A-Za-z0-9._@-] is allowed")]
    BadCharacter { what: &'static str, found: char },
    #[error("conversation {0:?} has no known kind; use dm:<a>:<b>, grp:<id> or room:<name>")]
    UnknownConversationKind(String),
    #[error("dm conversation {0:?} must name two users as dm:<a>:<b> with a < b byte-wise")]
    BadDirect(String),
    #[error("client_msg_id {0:?} is not a UUID (8-4-4-4-12 hex digits)")]
    BadClientMsgId(String),
}

/// Checks one name against `[A-Za-z0-9._@-]{1,128}`.
fn check_name(what: &'static str, name: &str) -> Result<(), InvalidId> {
    if name.is_empty() {
        return Err(InvalidId::Empty { what });
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(InvalidId::TooLong { what, len: name.len() });
    }
    match name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '@' | '-'))) {
        Some(found) => Err(InvalidId::BadCharacter { what, found }),
        None => Ok(()),
    }
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $what:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Validates `raw` against PROTOCOL.md's naming rule.
            ///
            /// # Errors
            /// [`InvalidId`] saying which rule `raw` breaks.
            pub fn parse(raw: &str) -> Result<Self, InvalidId> {
                check_name($what, raw)?;
                Ok(Self(raw.into()))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }
    };
}

const USER_ID: &str = "user id";
const GROUP_ID: &str = "group id";

name_type!(
    /// A user, as named by the token's `sub` (or `dev:<user>` in dev mode).
    UserId,
    USER_ID
);
name_type!(
    /// One of a user's devices; a user may be connected from several at once.
    DeviceId,
    "device id"
);
name_type!(
    /// A group's id, without the `grp:` prefix.
    GroupId,
    GROUP_ID
);

/// The three kinds of conversation, which decide who its members are.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConversationKind {
    /// `dm:<a>:<b>`: exactly the two users, `a < b` byte-wise.
    Direct(UserId, UserId),
    /// `grp:<id>`: members are stored.
    Group(GroupId),
    /// `room:<name>`: whoever is subscribed right now.
    Room(String),
}

/// A conversation id such as `dm:alice:bob`, `grp:team-7` or `room:lobby`.
///
/// Cheap to clone (one shared allocation), hashes and compares as its text.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConversationId(Arc<str>);

impl ConversationId {
    /// Validates a conversation id.
    ///
    /// # Errors
    /// [`InvalidId`] when the prefix is unknown, a name breaks the naming rule, or a `dm:`
    /// does not name two users in byte-wise order.
    pub fn parse(raw: &str) -> Result<Self, InvalidId> {
        Self::check(raw)?;
        Ok(Self(raw.into()))
    }

    /// The conversation between two users, whichever order they are given in.
    pub fn direct(a: &UserId, b: &UserId) -> Result<Self, InvalidId> {
        let (low, high) = if a.as_str() <= b.as_str() { (a, b) } else { (b, a) };
        Self::parse(&format!("dm:{low}:{high}"))
    }

    /// The conversation of a group's members (`grp:<id>`).
    pub fn group(group: &GroupId) -> Self {
        // A valid group id under the `grp:` prefix is a valid conversation id.
        Self(format!("grp:{group}").into())
    }

    /// What kind of conversation this is, and so who its members are.
    pub fn kind(&self) -> ConversationKind {
        // Checked at construction: every part is a valid name.
        let raw: &str = &self.0;
        if let Some((a, b)) = raw.strip_prefix("dm:").and_then(|pair| pair.split_once(':')) {
            ConversationKind::Direct(UserId(a.into()), UserId(b.into()))
        } else if let Some(id) = raw.strip_prefix("grp:") {
            ConversationKind::Group(GroupId(id.into()))
        } else {
            ConversationKind::Room(raw.strip_prefix("room:").unwrap_or_default().to_owned())
        }
    }

    /// Validates `raw` without building its parts (a send's conversation is checked on
    /// every frame; its members are looked up only where needed).
    fn check(raw: &str) -> Result<(), InvalidId> {
        if let Some(pair) = raw.strip_prefix("dm:") {
            let (a, b) = pair.split_once(':').ok_or_else(|| InvalidId::BadDirect(raw.to_owned()))?;
            check_name(USER_ID, a)?;
            check_name(USER_ID, b)?;
            if a >= b {
                return Err(InvalidId::BadDirect(raw.to_owned()));
            }
            Ok(())
        } else if let Some(id) = raw.strip_prefix("grp:") {
            check_name(GROUP_ID, id)
        } else if let Some(name) = raw.strip_prefix("room:") {
            check_name("room name", name)
        } else {
            Err(InvalidId::UnknownConversationKind(raw.to_owned()))
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ConversationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ConversationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConversationId({:?})", &*self.0)
    }
}

/// The client's idempotency key for a send: a UUID in its canonical text form.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ClientMsgId(Arc<str>);

impl ClientMsgId {
    /// Accepts `8-4-4-4-12` hex digits, either case (compared as given).
    ///
    /// # Errors
    /// [`InvalidId::BadClientMsgId`] for anything else.
    pub fn parse(raw: &str) -> Result<Self, InvalidId> {
        let groups: Vec<&str> = raw.split('-').collect();
        let lengths_ok = groups.len() == 5 && groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12]);
        if lengths_ok && groups.iter().all(|g| g.bytes().all(|b| b.is_ascii_hexdigit())) {
            Ok(Self(raw.into()))
        } else {
            Err(InvalidId::BadClientMsgId(raw.chars().take(64).collect()))
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ClientMsgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ClientMsgId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClientMsgId({:?})", &*self.0)
    }
}

/// Highest node id: ten bits of every snowflake id name the node that made it.
pub const MAX_NODE_ID: u16 = 1023;

/// 2026-01-01T00:00:00Z in ms since the Unix epoch: the time zero of message ids. 41 bits
/// of milliseconds from here last until 2095.
pub const HERALD_EPOCH_MS: u64 = 1_767_225_600_000;
/// Bits of node id in a message id: 1024 nodes.
pub const NODE_BITS: u32 = 10;
/// Bits of sequence within one millisecond of a message id: 4096 ids per ms per node.
pub const SEQUENCE_BITS: u32 = 12;

/// The node that issued message id `id`, and the millisecond (since the Unix epoch) it was
/// issued in. Defined here, beside the layout, because the store reads it too: it records
/// each node's newest committed id (`ids/snowflake.rs` issues them).
pub fn id_origin(id: u64) -> (NodeId, u64) {
    // Masked to ten bits: the cast cannot truncate.
    let node = ((id >> SEQUENCE_BITS) & u64::from(MAX_NODE_ID)) as u32;
    (NodeId(node), (id >> (NODE_BITS + SEQUENCE_BITS)) + HERALD_EPOCH_MS)
}

/// A node of the cluster (0..=1023, unique among live nodes); part of every message id.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default, serde::Serialize)]
#[serde(transparent)]
pub struct NodeId(pub u32);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A connection, unique on its node for the life of the process.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct ConnectionId(pub u64);

impl fmt::Display for ConnectionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A message with its ids: what the pipeline stores, storage reads back and delivery pushes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Snowflake id.
    pub id: u64,
    pub conversation: ConversationId,
    /// Seq within the conversation (0: an announcement that was not archived).
    pub seq: u64,
    pub sender: UserId,
    pub sender_device: DeviceId,
    /// The sender's idempotency key.
    pub client_msg_id: ClientMsgId,
    /// Application-defined kind.
    pub kind: u32,
    pub body: bytes::Bytes,
    /// Wall time the owner accepted it, in ms since the Unix epoch.
    pub sent_at_ms: u64,
}

impl Message {
    /// Whether `user`'s `device` sent it (and so has it already).
    pub fn is_from(&self, user: &UserId, device: &DeviceId) -> bool {
        &self.sender == user && &self.sender_device == device
    }
}

/// Where a device stood on a connection it left, per conversation: the highest seq it acked,
/// and, for a conversation it may lack messages of, the seq after which to read. The
/// connection that takes over reads only those conversations, from there (reconnect grace,
/// on this node or handed over by another).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceLedger {
    pub acked: std::collections::BTreeMap<ConversationId, u64>,
    pub read_after: std::collections::BTreeMap<ConversationId, u64>,
    /// Set on a ledger restored after its node restarted: the node heard nothing from the
    /// message with this id on (it was down, or its last save of the ledger was older), so
    /// the connection that takes over also reads every conversation of the device that
    /// changed since, which only storage knows.
    pub since_id: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_protocol_alphabet() {
        assert!(UserId::parse("alice.b_c@d-e9").is_ok());
        assert_eq!(UserId::parse(""), Err(InvalidId::Empty { what: "user id" }));
        assert!(matches!(UserId::parse("a b"), Err(InvalidId::BadCharacter { found: ' ', .. })));
        assert!(matches!(UserId::parse("é"), Err(InvalidId::BadCharacter { .. })));
        assert!(UserId::parse(&"x".repeat(128)).is_ok());
        assert!(matches!(UserId::parse(&"x".repeat(129)), Err(InvalidId::TooLong { len: 129, .. })));
    }

    #[test]
    fn direct_conversations_need_two_users_in_order() {
        let c = ConversationId::parse("dm:alice:bob").expect("valid dm");
        assert!(matches!(c.kind(), ConversationKind::Direct(a, b) if a.as_str() == "alice" && b.as_str() == "bob"));
        for bad in ["dm:bob:alice", "dm:alice:alice", "dm:alice", "dm::bob", "dm:a:b:c"] {
            assert!(ConversationId::parse(bad).is_err(), "{bad} accepted");
        }
        let a = UserId::parse("zed").expect("valid");
        let b = UserId::parse("amy").expect("valid");
        assert_eq!(ConversationId::direct(&a, &b).expect("valid").as_str(), "dm:amy:zed");
    }

    #[test]
    fn a_group_s_conversation_is_its_id_under_grp() {
        let team = GroupId::parse("team-7").expect("valid");
        let conversation = ConversationId::group(&team);
        assert_eq!(conversation, ConversationId::parse("grp:team-7").expect("valid"));
        assert!(matches!(conversation.kind(), ConversationKind::Group(group) if group == team));
    }

    #[test]
    fn groups_and_rooms_parse() {
        assert!(matches!(ConversationId::parse("grp:team-7").map(|c| c.kind()), Ok(ConversationKind::Group(_))));
        assert!(matches!(ConversationId::parse("room:lobby").map(|c| c.kind()), Ok(ConversationKind::Room(_))));
        assert!(matches!(ConversationId::parse("chan:x"), Err(InvalidId::UnknownConversationKind(_))));
        assert!(ConversationId::parse("room:").is_err());
        assert!(ConversationId::parse("grp:a/b").is_err());
    }

    #[test]
    fn client_msg_ids_are_uuids() {
        assert!(ClientMsgId::parse("123e4567-e89b-12d3-a456-426614174000").is_ok());
        assert!(ClientMsgId::parse("123E4567-E89B-12D3-A456-426614174000").is_ok());
        for bad in [
            "",
            "123e4567e89b12d3a456426614174000",
            "123e4567-e89b-12d3-a456-42661417400g",
            "123e4567-e89b-12d3-a456-4266141740000",
        ] {
            assert!(ClientMsgId::parse(bad).is_err(), "{bad} accepted");
        }
    }
}
