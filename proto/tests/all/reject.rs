//! Input that is not a usable frame is refused with an error that says why, never a panic.

use bytes::Bytes;
use herald_proto::{DecodeLimits, Encoding, FrameError, decode_frame, encode_proto, v1};

use crate::decode;

fn big_send(body_len: usize) -> v1::Frame {
    v1::Frame::new(
        1,
        v1::Send {
            client_msg_id: "m".into(),
            conversation: "dm:a:b".into(),
            kind: 1,
            body: Bytes::from(vec![b'x'; body_len]),
        },
    )
}

#[test]
fn oversize_frames_are_refused_before_parsing() {
    for encoding in [Encoding::Proto, Encoding::Json] {
        let input = herald_proto::encode_frame(&big_send(1 << 20), encoding).expect("encodes");
        let size = input.len();
        let error = decode(input, encoding).expect_err("too large");
        assert!(matches!(error, FrameError::TooLarge { size: s, limit: 1_048_576 } if s == size), "{error:?}");
        assert_eq!(error.close_code(), 1009);
        assert!(error.to_string().contains("over the limit of 1048576 bytes"), "{error}");
    }
}

#[test]
fn size_limit_is_inclusive_and_checked_first() {
    let limits = DecodeLimits { max_frame_bytes: 8, ..DecodeLimits::default() };
    // Not even JSON, yet refused for its size: nothing was parsed.
    let error = decode_frame(&b"123456789"[..], Encoding::Json, &limits).expect_err("too large");
    assert!(matches!(error, FrameError::TooLarge { size: 9, limit: 8 }), "{error:?}");

    let ping = encode_proto(&v1::Frame::new(1, v1::Ping { time_ms: 1, reply: false }));
    let limits = DecodeLimits { max_frame_bytes: ping.len(), ..DecodeLimits::default() };
    assert!(decode_frame(ping, Encoding::Proto, &limits).is_ok());
}

#[test]
fn garbage_is_not_protobuf() {
    let error = decode(&[0xffu8; 16][..], Encoding::Proto).expect_err("garbage");
    assert!(matches!(error, FrameError::InvalidProtobuf(_)), "{error:?}");
    assert_eq!(error.close_code(), 4010);
    assert!(error.to_string().starts_with("binary frame is not a valid protobuf"), "{error}");
}

#[test]
fn truncated_protobuf_is_refused() {
    let whole = encode_proto(&big_send(100));
    for cut in [1, 10, 50] {
        let error = decode(whole[..whole.len() - cut].to_vec(), Encoding::Proto).expect_err("truncated");
        assert!(matches!(error, FrameError::InvalidProtobuf(_)), "{error:?}");
    }
}

#[test]
fn garbage_is_not_json() {
    for text in ["not json", "", "{", r#"{"rid":1}{"rid":2}"#, r#"{"rid":"seven"}"#, "[]"] {
        let error = decode(text, Encoding::Json).expect_err(text);
        assert!(matches!(error, FrameError::InvalidJson(_)), "{text}: {error:?}");
        assert!(error.to_string().contains("canonical JSON"), "{error}");
    }
}

#[test]
fn two_bodies_in_json_are_refused() {
    let error = decode(r#"{"ping":{},"pong":{}}"#, Encoding::Json).expect_err("two bodies");
    assert!(matches!(error, FrameError::InvalidJson(_)), "{error:?}");
}

#[test]
fn invalid_utf8_json_is_refused() {
    let error = decode(&b"{\"rid\":1,\"ping\":{\"timeMs\":\"\xff\"}}"[..], Encoding::Json).expect_err("not UTF-8");
    assert!(matches!(error, FrameError::InvalidUtf8 { valid_up_to: 27 }), "{error:?}");
    assert!(error.to_string().contains("UTF-8"), "{error}");
}

#[test]
fn deeply_nested_json_is_refused_before_parsing() {
    let error = decode("[".repeat(10_000), Encoding::Json).expect_err("too deep");
    assert!(matches!(error, FrameError::TooDeep { limit: 32 }), "{error:?}");
    assert_eq!(error.close_code(), 4010);

    // Hidden in a field the decoder would otherwise skip.
    let nested = |depth: usize| format!(r#"{{"rid":1,"ping":{{"x":{}{}}}}}"#, "[".repeat(depth), "]".repeat(depth));
    // The frame and the ping object are two levels: 30 arrays make 32, the limit.
    assert!(decode(nested(30), Encoding::Json).is_ok());
    let error = decode(nested(31), Encoding::Json).expect_err("too deep");
    assert!(matches!(error, FrameError::TooDeep { limit: 32 }), "{error:?}");
}

#[test]
fn brackets_inside_strings_do_not_count_as_depth() {
    let text = format!(r#"{{"rid":1,"send":{{"conversation":"{}\"{}"}}}}"#, "[".repeat(100), "{".repeat(100));
    assert!(decode(text, Encoding::Json).is_ok());
}

#[test]
fn frames_without_a_body_are_refused() {
    let cases: [(&[u8], Encoding); 5] = [
        (b"", Encoding::Proto),
        (&[0x08, 0x07], Encoding::Proto), // rid = 7 and nothing else
        (b"{}", Encoding::Json),
        (br#"{"rid":5}"#, Encoding::Json),
        (br#"{"rid":5,"teleport":{"to":"mars"}}"#, Encoding::Json), // a body we do not know
    ];
    for (input, encoding) in cases {
        let error = decode(input.to_vec(), encoding).expect_err("no body");
        assert!(matches!(error, FrameError::NoBody), "{input:?}: {error:?}");
        assert_eq!(error.close_code(), 4010);
        assert!(error.to_string().contains("send_ack"), "{error}");
    }
}
