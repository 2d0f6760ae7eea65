//! Writes the seed corpus of the targets whose inputs are made with code (frames, tokens,
//! plugin host calls) into `fuzz/corpus/`. The seeds are committed; run this only when the
//! formats change: `cargo test -p herald-fuzz --test seeds -- --ignored`.

use std::path::Path;

use herald_proto::v1::{self, Frame};
use herald_proto::{encode_json, encode_proto};

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    std::fs::create_dir_all(&dir).expect("create the corpus folder");
    std::fs::write(dir.join(name), bytes).expect("write a seed");
}

fn frames() -> Vec<(&'static str, Frame)> {
    let message = v1::Message {
        id: 54_901_761_638_400_000,
        conversation: "dm:alice:bob".into(),
        seq: 7,
        sender: "alice".into(),
        sender_device: "phone".into(),
        kind: 1,
        body: b"hello bob".to_vec().into(),
        sent_at_ms: 1_780_315_200_000,
    };
    vec![
        ("connect", Frame::new(1, v1::Connect { token: "dev:alice".into(), device_id: "phone".into(), client: None })),
        (
            "send",
            Frame::new(
                2,
                v1::Send {
                    client_msg_id: "01972b4e-8c00-7a3e-9f1d-3c5e6a7b8c9d".into(),
                    conversation: "dm:alice:bob".into(),
                    kind: 1,
                    body: b"hello".to_vec().into(),
                },
            ),
        ),
        ("deliver_ack", Frame::new(3, v1::DeliverAck { conversation: "grp:team".into(), seq: 41 })),
        (
            "sync",
            Frame::new(
                4,
                v1::Sync {
                    cursors: vec![
                        v1::Cursor { conversation: "dm:alice:bob".into(), seq: 3 },
                        v1::Cursor { conversation: "grp:team".into(), seq: 0 },
                    ],
                    limit: 50,
                },
            ),
        ),
        ("history", Frame::new(5, v1::History { conversation: "room:lobby".into(), before_seq: 90, limit: 10 })),
        ("subscribe", Frame::new(6, v1::Subscribe { room: "room:lobby".into(), since_seq: Some(12) })),
        ("unsubscribe", Frame::new(7, v1::Unsubscribe { room: "room:lobby".into() })),
        ("ping", Frame::new(8, v1::Ping { time_ms: 1_780_315_200_000, reply: false })),
        (
            "send_ack",
            Frame::new(
                2,
                v1::SendAck {
                    client_msg_id: "01972b4e-8c00-7a3e-9f1d-3c5e6a7b8c9d".into(),
                    status: v1::send_ack::Status::Retry as i32,
                    conversation: "dm:alice:bob".into(),
                    reason: "over sends_per_connection".into(),
                    retry_after_ms: 250,
                    ..v1::SendAck::default()
                },
            ),
        ),
        ("deliver", Frame::new(0, v1::Deliver { message: Some(message), attempt: 2 })),
    ]
}

#[test]
#[ignore = "writes fuzz/corpus; run by hand when the formats change"]
fn write_seed_corpus() {
    for (name, frame) in frames() {
        write("frame_proto", name, &encode_proto(&frame));
        write("frame_json", name, encode_json(&frame).expect("JSON").as_bytes());
    }
    write("frame_json", "snake_case", br#"{"rid":9,"deliver_ack":{"conversation":"dm:alice:bob","seq":"3"}}"#);
    write(
        "frame_json",
        "numbers_and_nulls",
        br#"{"rid":10,"send":{"clientMsgId":"x","conversation":"room:a","kind":4294967295,"body":null}}"#,
    );
    write("frame_json", "deep", format!("{}{}", "[".repeat(40), "]".repeat(40)).as_bytes());

    let header = r#"{"alg":"HS256","typ":"JWT"}"#;
    let claims = format!(
        r#"{{"sub":"alice","iss":"{}","aud":["{}","other"],"exp":4102444800,"nbf":0}}"#,
        herald_fuzz::TOKEN_ISSUER,
        herald_fuzz::TOKEN_AUDIENCE
    );
    write("token", "valid_shape", jwt(header, &claims).as_bytes());
    write("token", "alg_none", jwt(r#"{"alg":"none"}"#, r#"{"sub":"alice","exp":4102444800}"#).as_bytes());
    write("token", "dev", b"dev:alice");
    write("token", "dev_bad_user", b"dev:al ice\0");

    // Op bytes for plugin_imports: set, get, increment, rate-limit (with NaN), clock, delete.
    let mut ops = Vec::new();
    ops.extend_from_slice(&[1, 3, b'a', b'b', b'c']);
    ops.extend_from_slice(&16u64.to_le_bytes());
    ops.push(b'v');
    ops.extend_from_slice(&0u64.to_le_bytes());
    ops.extend_from_slice(&[0, 3, b'a', b'b', b'c']);
    ops.extend_from_slice(&[3, 1, b'n']);
    ops.extend_from_slice(&5u64.to_le_bytes());
    ops.extend_from_slice(&1001u64.to_le_bytes());
    ops.extend_from_slice(&[5, 1, b'r']);
    ops.extend_from_slice(&f64::NAN.to_bits().to_le_bytes());
    ops.extend_from_slice(&3u64.to_le_bytes());
    ops.extend_from_slice(&[5, 1, b'r']);
    ops.extend_from_slice(&2.5f64.to_bits().to_le_bytes());
    ops.extend_from_slice(&1u64.to_le_bytes());
    ops.extend_from_slice(&[6, 0]);
    ops.extend_from_slice(&500u64.to_le_bytes());
    ops.extend_from_slice(&[4, 3, b'a', b'b', b'c']);
    write("plugin_imports", "mixed", &ops);
    write("plugin_imports", "long_key", &[0x81, 0x80, 0x02]);
}

fn jwt(header: &str, claims: &str) -> String {
    // Signature bytes do not matter to the fuzzer: the shape does.
    format!("{}.{}.c2lnbmF0dXJl", base64url(header.as_bytes()), base64url(claims.as_bytes()))
}

fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}
