//! Integration tests of herald-proto, in one binary to save link time.

mod json;
mod props;
mod reject;
mod round_trip;

use bytes::Bytes;
use herald_proto::{DecodeLimits, Encoding, FrameError, decode_frame, encode_frame, v1};

/// Larger than 2^53, so a JSON number could not carry it exactly.
const BIG: u64 = (1 << 60) + 7;

/// Not UTF-8, so it can only travel as bytes (base64 in JSON).
const BINARY_BODY: &[u8] = &[0xff, 0x00, 0xfe, 0x80, 0xc3, 0x28];

fn decode(input: impl Into<Bytes>, encoding: Encoding) -> Result<v1::Frame, FrameError> {
    decode_frame(input, encoding, &DecodeLimits::default())
}

fn encode(frame: &v1::Frame, encoding: Encoding) -> Vec<u8> {
    encode_frame(frame, encoding).expect("every sample frame has a JSON spelling")
}

fn message(seq: u64) -> v1::Message {
    v1::Message {
        id: BIG + seq,
        conversation: "grp:team-7".into(),
        seq,
        sender: "alice".into(),
        sender_device: "phone@1".into(),
        kind: 42,
        body: Bytes::from_static(BINARY_BODY),
        sent_at_ms: 1_700_000_000_123,
    }
}

/// One frame of every body type, every field set to a non-default value.
fn samples() -> Vec<v1::Frame> {
    use v1::*;
    vec![
        Frame::new(
            1,
            Connect {
                token: "dev:alice".into(),
                device_id: "phone@1".into(),
                client: Some(ClientInfo { name: "herald-sdk-rust".into(), version: "0.1.0".into() }),
            },
        ),
        Frame::new(
            1,
            Connected {
                user_id: "alice".into(),
                device_id: "phone@1".into(),
                node_id: 3,
                session_id: "s-9f2".into(),
                heartbeat_ms: 25_000,
                server_time_ms: BIG,
                client_timeout_ms: 90_000,
            },
        ),
        Frame::new(
            2,
            Send {
                client_msg_id: "6f1c2b1e-8a4e-4f7e-9a57-1b2c3d4e5f60".into(),
                conversation: "dm:alice:bob".into(),
                kind: 7,
                body: Bytes::from_static(BINARY_BODY),
            },
        ),
        Frame::new(
            2,
            SendAck {
                client_msg_id: "6f1c2b1e-8a4e-4f7e-9a57-1b2c3d4e5f60".into(),
                status: send_ack::Status::Retry.into(),
                message_id: u64::MAX,
                seq: BIG,
                conversation: "dm:alice:bob".into(),
                reason: "storage busy".into(),
                retry_after_ms: 250,
            },
        ),
        Frame::new(0, Deliver { message: Some(message(9)), attempt: 2 }),
        Frame::new(3, DeliverAck { conversation: "grp:team-7".into(), seq: BIG }),
        Frame::new(
            4,
            Sync {
                cursors: vec![
                    Cursor { conversation: "grp:team-7".into(), seq: BIG },
                    Cursor { conversation: "dm:alice:bob".into(), seq: 1 },
                ],
                limit: 100,
            },
        ),
        Frame::new(
            4,
            SyncReply {
                conversations: vec![ConversationSync {
                    conversation: "grp:team-7".into(),
                    messages: vec![message(10), message(12)],
                    complete_through_seq: 12,
                    latest_seq: BIG,
                }],
            },
        ),
        Frame::new(5, History { conversation: "room:lobby".into(), before_seq: BIG, limit: 50 }),
        Frame::new(
            5,
            HistoryReply { conversation: "room:lobby".into(), messages: vec![message(3), message(4)], has_more: true },
        ),
        Frame::new(6, Subscribe { room: "room:lobby".into(), since_seq: Some(BIG) }),
        // `since_seq` set to zero is not the same as unset: it asks for the whole history.
        Frame::new(6, Subscribe { room: "room:lobby".into(), since_seq: Some(0) }),
        Frame::new(6, Subscribe { room: "room:lobby".into(), since_seq: None }),
        Frame::new(7, Unsubscribe { room: "room:lobby".into() }),
        Frame::new(6, Subscribed { room: "room:lobby".into(), latest_seq: BIG, messages: vec![message(BIG)] }),
        Frame::new(0, SyncHint { conversation: "grp:team-7".into(), latest_seq: BIG }),
        Frame::new(8, Ping { time_ms: BIG, reply: true }),
        Frame::new(8, Pong { time_ms: BIG }),
        Frame::new(
            0,
            GoAway {
                reason: "draining for upgrade".into(),
                reconnect_after_ms: 1_500,
                reconnect_url: "wss://node-2.chat.example.com/v1/ws".into(),
            },
        ),
        Frame::new(
            0,
            Error { code: "not_a_member".into(), message: "you are not a member of grp:team-7".into(), rid: 9 },
        ),
    ]
}
