//! Hand-written JSON in the proto3 canonical mapping, as a browser client would send it.

use bytes::Bytes;
use herald_proto::{EncodeError, Encoding, encode_json, encode_proto, v1};

use crate::{BINARY_BODY, decode, encode};

fn send_ack() -> v1::Frame {
    v1::Frame::new(
        7,
        v1::SendAck {
            client_msg_id: "6f1c2b1e-8a4e-4f7e-9a57-1b2c3d4e5f60".into(),
            status: v1::send_ack::Status::Ok.into(),
            message_id: u64::MAX,
            seq: 9_007_199_254_740_993,
            conversation: "dm:alice:bob".into(),
            reason: String::new(),
            retry_after_ms: 0,
        },
    )
}

#[test]
fn lower_camel_case_decodes() {
    let text = r#"{"rid":7,"sendAck":{"clientMsgId":"6f1c2b1e-8a4e-4f7e-9a57-1b2c3d4e5f60",
        "status":"OK","messageId":"18446744073709551615","seq":"9007199254740993",
        "conversation":"dm:alice:bob"}}"#;
    assert_eq!(decode(text, Encoding::Json).expect("decodes"), send_ack());
}

#[test]
fn snake_case_decodes() {
    let text = r#"{"rid":7,"send_ack":{"client_msg_id":"6f1c2b1e-8a4e-4f7e-9a57-1b2c3d4e5f60",
        "status":"OK","message_id":"18446744073709551615","seq":"9007199254740993",
        "conversation":"dm:alice:bob","retry_after_ms":0}}"#;
    assert_eq!(decode(text, Encoding::Json).expect("decodes"), send_ack());
}

#[test]
fn encoding_uses_status_names_and_string_64_bit_integers() {
    let text = String::from_utf8(encode(&send_ack(), Encoding::Json)).expect("UTF-8");
    assert_eq!(
        text,
        r#"{"rid":7,"sendAck":{"clientMsgId":"6f1c2b1e-8a4e-4f7e-9a57-1b2c3d4e5f60","status":"OK","messageId":"18446744073709551615","seq":"9007199254740993","conversation":"dm:alice:bob"}}"#
    );
    for (status, name) in [
        (v1::send_ack::Status::Duplicate, "DUPLICATE"),
        (v1::send_ack::Status::Rejected, "REJECTED"),
        (v1::send_ack::Status::Retry, "RETRY"),
    ] {
        let frame = v1::Frame::new(0, v1::SendAck { status: status.into(), ..Default::default() });
        let text = encode_json(&frame).expect("encodes");
        assert_eq!(text, format!(r#"{{"sendAck":{{"status":"{name}"}}}}"#));
    }
}

#[test]
fn bytes_travel_as_base64() {
    let text = r#"{"rid":1,"send":{"clientMsgId":"m1","conversation":"dm:a:b","kind":3,"body":"/wD+gMMo"}}"#;
    let frame = v1::Frame::new(
        1,
        v1::Send {
            client_msg_id: "m1".into(),
            conversation: "dm:a:b".into(),
            kind: 3,
            body: Bytes::from_static(BINARY_BODY),
        },
    );
    assert_eq!(decode(text, Encoding::Json).expect("decodes"), frame);
    assert_eq!(encode_json(&frame).expect("encodes"), text);
}

#[test]
fn integers_are_accepted_as_numbers_or_strings() {
    let expected = v1::Frame::new(3, v1::DeliverAck { conversation: "grp:g".into(), seq: 12 });
    for text in [
        r#"{"rid":3,"deliverAck":{"conversation":"grp:g","seq":12}}"#,
        r#"{"rid":"3","deliverAck":{"conversation":"grp:g","seq":"12"}}"#,
    ] {
        assert_eq!(decode(text, Encoding::Json).expect(text), expected);
    }
}

#[test]
fn status_is_accepted_as_a_number() {
    let frame = decode(r#"{"sendAck":{"status":2}}"#, Encoding::Json).expect("decodes");
    let Some(v1::frame::Body::SendAck(ack)) = frame.body else {
        panic!("not a send_ack");
    };
    assert_eq!(ack.status(), v1::send_ack::Status::Duplicate);
}

#[test]
fn unknown_fields_and_status_names_are_ignored_for_forward_compatibility() {
    let frame = decode(r#"{"rid":1,"futureField":[1,{"a":2}],"ping":{"timeMs":"5","extra":true}}"#, Encoding::Json)
        .expect("decodes");
    assert_eq!(frame, v1::Frame::new(1, v1::Ping { time_ms: 5, reply: false }));

    let frame = decode(r#"{"sendAck":{"status":"DEFERRED"}}"#, Encoding::Json).expect("decodes");
    let Some(v1::frame::Body::SendAck(ack)) = frame.body else {
        panic!("not a send_ack");
    };
    assert_eq!(ack.status(), v1::send_ack::Status::Unspecified);
}

/// Canonical JSON allows `null` for any field; pbjson accepts it for optional and message
/// fields only, and refuses it for plain scalars (a known pbjson limitation).
#[test]
fn null_means_unset_for_optional_and_message_fields() {
    let frame =
        decode(r#"{"rid":1,"subscribe":{"room":"room:lobby","sinceSeq":null}}"#, Encoding::Json).expect("decodes");
    assert_eq!(frame, v1::Frame::new(1, v1::Subscribe { room: "room:lobby".into(), since_seq: None }));
    let frame = decode(r#"{"connect":{"token":"t","client":null}}"#, Encoding::Json).expect("decodes");
    assert_eq!(frame, v1::Frame::new(0, v1::Connect { token: "t".into(), ..Default::default() }));
}

#[test]
fn an_unnamed_enum_value_cannot_be_written_as_json() {
    let frame = v1::Frame::new(0, v1::SendAck { status: 99, ..Default::default() });
    assert!(matches!(encode_json(&frame), Err(EncodeError::Json(_))));
    assert!(!encode_proto(&frame).is_empty());
}

/// `go_away`'s reconnect URL is `reconnectUrl` in JSON (`reconnect_url` is read too), and
/// left out when empty, so a client of the first version of the frame sees nothing new.
#[test]
fn go_away_names_the_node_to_reconnect_to_as_reconnect_url() {
    let frame = v1::Frame::new(
        0,
        v1::GoAway {
            reason: "server shutting down; reconnect".into(),
            reconnect_after_ms: 1_200,
            reconnect_url: "ws://10.0.0.7:7070/v1/ws".into(),
        },
    );
    let text = r#"{"goAway":{"reason":"server shutting down; reconnect","reconnectAfterMs":1200,"reconnectUrl":"ws://10.0.0.7:7070/v1/ws"}}"#;
    assert_eq!(encode_json(&frame).expect("encodes"), text);
    let snake = r#"{"go_away":{"reason":"server shutting down; reconnect","reconnect_after_ms":1200,
        "reconnect_url":"ws://10.0.0.7:7070/v1/ws"}}"#;
    assert_eq!(decode(snake, Encoding::Json).expect("decodes"), frame);

    let same_address =
        v1::Frame::new(0, v1::GoAway { reason: "bye".into(), reconnect_after_ms: 5, ..Default::default() });
    assert_eq!(encode_json(&same_address).expect("encodes"), r#"{"goAway":{"reason":"bye","reconnectAfterMs":5}}"#);
}
