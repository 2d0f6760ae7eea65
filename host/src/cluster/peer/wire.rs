//! The bus's envelopes in their wire form (`herald.peer.v1`), and back.
//!
//! A request from a peer is input like any other: every id is parsed again on arrival
//! ([`Call::decode`]), and a request that names an invalid one, lacks a field or is of a kind
//! this build does not know is refused with a reason, never trusted and never a panic. The
//! client's `Send` frame travels unchanged: the owner's pipeline validates it, as it does a
//! send from a local connection.

use herald_proto::peer::v1 as wire;
use herald_proto::peer::v1::request::Kind as WireKind;

use crate::delivery::wire_message;
use crate::model::{
    ClientMsgId, ConnectionId, ConversationId, DeviceId, DeviceLedger, GroupId, InvalidId, Message, NodeId, UserId,
};
use crate::routing::Route;
use crate::routing::bus::{Addressed, Origin, SendRequest};

/// A request that cannot be carried out as sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum WireError {
    #[error(transparent)]
    Invalid(#[from] InvalidId),
    #[error("the request has no {0}")]
    Missing(&'static str),
    #[error("the request is of a kind this node does not know; is the calling node running a newer Herald?")]
    UnknownKind,
    #[error("a forwarded send must come from the node holding its connection ({origin}), not node {caller}")]
    ForeignOrigin { origin: NodeId, caller: NodeId },
    #[error("the route to kick is on node {route}, not on this node ({local})")]
    ForeignRoute { route: NodeId, local: NodeId },
}

/// A request from a peer, its ids parsed: what the [`PeerHandler`](super::PeerHandler) is
/// asked to do.
#[derive(Debug, Clone)]
pub(super) enum Call {
    Send(SendRequest),
    Deliver(Message, Vec<UserId>, Addressed),
    PublishRoom(Message),
    /// Close the route's connection; with a node, hand its ledger over to that node (the
    /// caller, which holds the device's new connection).
    Kick(Route, Option<NodeId>),
    LowestInFlight(ConversationId),
    RoutesChanged(Vec<UserId>),
    GroupChanged(GroupId),
}

impl Call {
    /// Parses a request's body, sent by node `caller` to node `local`.
    ///
    /// A send's origin must be the caller (the pipeline trusts `origin.node` to say whether
    /// the sender's connection is local) and a kick's route must be on this node.
    ///
    /// # Errors
    /// [`WireError`] naming the invalid id, the missing field, the unknown kind or the
    /// node that does not match.
    pub(super) fn decode(kind: Option<WireKind>, caller: NodeId, local: NodeId) -> Result<Self, WireError> {
        let call = Self::parse(kind, caller)?;
        match &call {
            Self::Send(request) if request.origin.node != caller => {
                Err(WireError::ForeignOrigin { origin: request.origin.node, caller })
            }
            Self::Kick(route, _) if route.node != local => Err(WireError::ForeignRoute { route: route.node, local }),
            _ => Ok(call),
        }
    }

    fn parse(kind: Option<WireKind>, caller: NodeId) -> Result<Self, WireError> {
        Ok(match kind.ok_or(WireError::UnknownKind)? {
            WireKind::ForwardSend(forward) => Self::Send(SendRequest {
                origin: origin_from(forward.origin.ok_or(WireError::Missing("origin"))?)?,
                rid: forward.rid,
                send: forward.send.ok_or(WireError::Missing("send"))?,
                // Absent (false) from a node that predates the field: a send, as it was then.
                announcement: forward.announcement,
            }),
            WireKind::Deliver(deliver) => {
                let message = message_from(deliver.message)?;
                let users = deliver.users.iter().map(|user| UserId::parse(user)).collect::<Result<_, _>>()?;
                let addressed = if deliver.unrouted { Addressed::Everywhere } else { Addressed::ByRoute };
                Self::Deliver(message, users, addressed)
            }
            WireKind::PublishRoom(publish) => Self::PublishRoom(message_from(publish.message)?),
            WireKind::Kick(kick) => Self::Kick(
                route_from(kick.route.ok_or(WireError::Missing("route"))?)?,
                kick.hand_over.then_some(caller),
            ),
            WireKind::LowestInFlight(ask) => Self::LowestInFlight(ConversationId::parse(&ask.conversation)?),
            WireKind::RoutesChanged(changed) => {
                Self::RoutesChanged(changed.users.iter().map(|user| UserId::parse(user)).collect::<Result<_, _>>()?)
            }
            WireKind::GroupChanged(changed) => Self::GroupChanged(GroupId::parse(&changed.group)?),
        })
    }
}

pub(super) fn forward_send(request: &SendRequest) -> WireKind {
    WireKind::ForwardSend(wire::ForwardSend {
        origin: Some(wire::Origin {
            user: request.origin.user.to_string(),
            device: request.origin.device.to_string(),
            node: request.origin.node.0,
            connection: request.origin.connection.0,
        }),
        rid: request.rid,
        send: Some(request.send.clone()),
        announcement: request.announcement,
    })
}

pub(super) fn deliver(message: &Message, users: &[UserId], addressed: Addressed) -> WireKind {
    WireKind::Deliver(wire::Deliver {
        message: Some(stored(message)),
        users: users.iter().map(ToString::to_string).collect(),
        unrouted: addressed == Addressed::Everywhere,
    })
}

pub(super) fn publish_room(message: &Message) -> WireKind {
    WireKind::PublishRoom(wire::PublishRoom { message: Some(stored(message)) })
}

pub(super) fn kick(route: &Route, hand_over: bool) -> WireKind {
    WireKind::Kick(wire::Kick {
        hand_over,
        route: Some(wire::Route {
            user: route.user.to_string(),
            device: route.device.to_string(),
            node: route.node.0,
            connection: route.connection.0,
            connected_at_ms: route.connected_at_ms,
        }),
    })
}

/// A device's ledger as it travels.
pub(crate) fn ledger(ledger: &DeviceLedger) -> wire::Ledger {
    let mut entries: Vec<wire::LedgerEntry> = ledger
        .acked
        .iter()
        .map(|(conversation, &acked_through)| wire::LedgerEntry {
            conversation: conversation.to_string(),
            acked_through,
            read_after: ledger.read_after.get(conversation).copied(),
        })
        .collect();
    let unacked = ledger.read_after.iter().filter(|(conversation, _)| !ledger.acked.contains_key(*conversation));
    entries.extend(unacked.map(|(conversation, &read_after)| wire::LedgerEntry {
        conversation: conversation.to_string(),
        acked_through: 0,
        read_after: Some(read_after),
    }));
    wire::Ledger { entries, since_id: ledger.since_id }
}

/// A handed-over ledger, its conversation ids parsed again.
pub(crate) fn ledger_from(ledger: wire::Ledger) -> Result<DeviceLedger, WireError> {
    let mut parsed = DeviceLedger { since_id: ledger.since_id, ..DeviceLedger::default() };
    for entry in ledger.entries {
        let conversation = ConversationId::parse(&entry.conversation)?;
        if let Some(read_after) = entry.read_after {
            parsed.read_after.insert(conversation.clone(), read_after);
        }
        if entry.acked_through > 0 {
            parsed.acked.insert(conversation, entry.acked_through);
        }
    }
    Ok(parsed)
}

/// A device's ledger as its node saves it in Redis (`SavedLedger`), encoded.
pub(crate) fn encode_saved_ledger(user: &UserId, device: &DeviceId, saved: &DeviceLedger) -> Vec<u8> {
    use prost::Message as _;
    let saved = wire::SavedLedger { user: user.to_string(), device: device.to_string(), ledger: Some(ledger(saved)) };
    saved.encode_to_vec()
}

/// A saved ledger read back, its ids parsed again; `None` when the bytes are not one (left
/// by another build, or damaged), which only costs that device a full backfill.
pub(crate) fn decode_saved_ledger(bytes: &[u8]) -> Option<(UserId, DeviceId, DeviceLedger)> {
    use prost::Message as _;
    let saved = wire::SavedLedger::decode(bytes).ok()?;
    let user = UserId::parse(&saved.user).ok()?;
    let device = DeviceId::parse(&saved.device).ok()?;
    Some((user, device, ledger_from(saved.ledger?).ok()?))
}

pub(super) fn routes_changed(users: &[UserId]) -> WireKind {
    WireKind::RoutesChanged(wire::RoutesChanged { users: users.iter().map(ToString::to_string).collect() })
}

pub(super) fn group_changed(group: &GroupId) -> WireKind {
    WireKind::GroupChanged(wire::GroupChanged { group: group.to_string() })
}

pub(super) fn lowest_in_flight(conversation: &ConversationId) -> WireKind {
    WireKind::LowestInFlight(wire::LowestInFlight { conversation: conversation.to_string() })
}

/// A stored message as it travels: the client's form, plus the idempotency key it lacks.
fn stored(message: &Message) -> wire::StoredMessage {
    wire::StoredMessage { message: Some(wire_message(message)), client_msg_id: message.client_msg_id.to_string() }
}

fn message_from(stored: Option<wire::StoredMessage>) -> Result<Message, WireError> {
    let stored = stored.ok_or(WireError::Missing("message"))?;
    let message = stored.message.ok_or(WireError::Missing("message"))?;
    Ok(Message {
        id: message.id,
        conversation: ConversationId::parse(&message.conversation)?,
        seq: message.seq,
        sender: UserId::parse(&message.sender)?,
        sender_device: DeviceId::parse(&message.sender_device)?,
        client_msg_id: ClientMsgId::parse(&stored.client_msg_id)?,
        kind: message.kind,
        body: message.body,
        sent_at_ms: message.sent_at_ms,
    })
}

fn origin_from(origin: wire::Origin) -> Result<Origin, WireError> {
    Ok(Origin {
        user: UserId::parse(&origin.user)?,
        device: DeviceId::parse(&origin.device)?,
        node: NodeId(origin.node),
        connection: ConnectionId(origin.connection),
    })
}

fn route_from(route: wire::Route) -> Result<Route, WireError> {
    Ok(Route {
        user: UserId::parse(&route.user)?,
        device: DeviceId::parse(&route.device)?,
        node: NodeId(route.node),
        connection: ConnectionId(route.connection),
        connected_at_ms: route.connected_at_ms,
        parked: false,
    })
}

#[cfg(test)]
mod tests {
    use herald_proto::v1;

    use super::*;

    fn message() -> Message {
        Message {
            id: 1 << 40,
            conversation: ConversationId::parse("grp:team-7").expect("valid"),
            seq: 42,
            sender: UserId::parse("alice").expect("valid"),
            sender_device: DeviceId::parse("phone").expect("valid"),
            client_msg_id: ClientMsgId::parse("123e4567-e89b-12d3-a456-426614174000").expect("valid"),
            kind: 3,
            body: bytes::Bytes::from_static(b"\x00\xffhello"),
            sent_at_ms: 1_700_000_000_000,
        }
    }

    fn user(name: &str) -> UserId {
        UserId::parse(name).expect("valid")
    }

    #[test]
    fn every_request_survives_its_wire_form() {
        let message = message();
        let users = vec![user("bob"), user("carol")];
        let route = Route {
            user: user("bob"),
            device: DeviceId::parse("laptop").expect("valid"),
            node: NodeId(3),
            connection: ConnectionId(99),
            connected_at_ms: 5,
            parked: false,
        };
        let conversation = ConversationId::parse("dm:alice:bob").expect("valid");
        for addressed in [Addressed::ByRoute, Addressed::Everywhere] {
            let Ok(Call::Deliver(back, to, how)) =
                Call::decode(Some(deliver(&message, &users, addressed)), NodeId(1), NodeId(3))
            else {
                panic!("not a deliver")
            };
            assert_eq!((back, to, how), (message.clone(), users.clone(), addressed));
        }
        let Ok(Call::PublishRoom(back)) = Call::decode(Some(publish_room(&message)), NodeId(1), NodeId(3)) else {
            panic!("not a publish")
        };
        assert_eq!(back, message);
        let Ok(Call::Kick(back, None)) = Call::decode(Some(kick(&route, false)), NodeId(1), NodeId(3)) else {
            panic!("not a kick")
        };
        assert_eq!(back, route);
        let Ok(Call::Kick(back, Some(to))) = Call::decode(Some(kick(&route, true)), NodeId(1), NodeId(3)) else {
            panic!("not a kick with a hand-over")
        };
        assert_eq!((back, to), (route.clone(), NodeId(1)), "handed over to the caller");
        let Ok(Call::LowestInFlight(back)) = Call::decode(Some(lowest_in_flight(&conversation)), NodeId(1), NodeId(3))
        else {
            panic!("not a lowest_in_flight")
        };
        assert_eq!(back, conversation);
        let request = SendRequest {
            origin: Origin {
                user: user("alice"),
                device: DeviceId::parse("phone").expect("valid"),
                node: NodeId(1),
                connection: ConnectionId(7),
            },
            rid: 12,
            send: v1::Send {
                client_msg_id: "not checked here".to_owned(),
                conversation: conversation.to_string(),
                kind: 1,
                body: bytes::Bytes::from_static(b"hi"),
            },
            announcement: false,
        };
        let Ok(Call::Send(back)) = Call::decode(Some(forward_send(&request)), NodeId(1), NodeId(3)) else {
            panic!("not a send")
        };
        assert!(!back.announcement, "a client's send");
        assert_eq!((back.origin, back.rid, back.send), (request.origin.clone(), request.rid, request.send.clone()));
        let announcement = SendRequest { announcement: true, ..request };
        let Ok(Call::Send(back)) = Call::decode(Some(forward_send(&announcement)), NodeId(1), NodeId(3)) else {
            panic!("not a send")
        };
        assert!(back.announcement, "an announcement stays one across the link");
    }

    #[test]
    fn invalid_ids_missing_fields_and_unknown_kinds_are_refused() {
        let mut bad_user = deliver(&message(), &[user("bob")], Addressed::ByRoute);
        if let WireKind::Deliver(deliver) = &mut bad_user {
            deliver.users.push("not a user".to_owned());
        }
        assert!(matches!(
            Call::decode(Some(bad_user), NodeId(1), NodeId(3)),
            Err(WireError::Invalid(InvalidId::BadCharacter { .. }))
        ));
        let bad_conversation = WireKind::LowestInFlight(wire::LowestInFlight { conversation: "chan:x".to_owned() });
        assert!(matches!(Call::decode(Some(bad_conversation), NodeId(1), NodeId(3)), Err(WireError::Invalid(_))));
        let mut bad_key = publish_room(&message());
        if let WireKind::PublishRoom(publish) = &mut bad_key
            && let Some(stored) = &mut publish.message
        {
            stored.client_msg_id = "nope".to_owned();
        }
        assert!(matches!(
            Call::decode(Some(bad_key), NodeId(1), NodeId(3)),
            Err(WireError::Invalid(InvalidId::BadClientMsgId(_)))
        ));
        let no_message = WireKind::PublishRoom(wire::PublishRoom { message: None });
        assert!(matches!(Call::decode(Some(no_message), NodeId(1), NodeId(3)), Err(WireError::Missing("message"))));
        assert!(matches!(Call::decode(None, NodeId(1), NodeId(3)), Err(WireError::UnknownKind)));
        let route = Route {
            user: user("bob"),
            device: DeviceId::parse("laptop").expect("valid"),
            node: NodeId(9),
            connection: ConnectionId(1),
            connected_at_ms: 0,
            parked: false,
        };
        assert!(matches!(
            Call::decode(Some(kick(&route, true)), NodeId(1), NodeId(3)),
            Err(WireError::ForeignRoute { route: NodeId(9), local: NodeId(3) })
        ));
    }
}
