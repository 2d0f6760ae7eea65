//! Property tests: hostile bytes never panic the decoders; generated frames round-trip.

use bytes::Bytes;
use herald_proto::{Encoding, v1};
use proptest::prelude::*;

use crate::{decode, encode};

fn send_frame() -> impl Strategy<Value = v1::Frame> {
    (any::<u32>(), any::<String>(), any::<String>(), any::<u32>(), proptest::collection::vec(any::<u8>(), 0..256))
        .prop_map(|(rid, client_msg_id, conversation, kind, body)| {
            v1::Frame::new(rid, v1::Send { client_msg_id, conversation, kind, body: Bytes::from(body) })
        })
}

fn deliver_frame() -> impl Strategy<Value = v1::Frame> {
    (any::<[u64; 3]>(), any::<u32>(), any::<String>(), proptest::collection::vec(any::<u8>(), 0..64)).prop_map(
        |([id, seq, sent_at_ms], attempt, sender, body)| {
            v1::Frame::new(
                0,
                v1::Deliver {
                    message: Some(v1::Message {
                        id,
                        conversation: "grp:g".into(),
                        seq,
                        sender,
                        sender_device: "d".into(),
                        kind: attempt,
                        body: Bytes::from(body),
                        sent_at_ms,
                    }),
                    attempt,
                },
            )
        },
    )
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let _ = decode(input.clone(), Encoding::Proto);
        let _ = decode(input, Encoding::Json);
    }

    #[test]
    fn json_like_text_never_panics(input in r#"[\[\]{}",:\\ a-zA-Z0-9_.-]{0,300}"#) {
        let _ = decode(input, Encoding::Json);
    }

    #[test]
    fn mangled_frames_never_panic(frame in send_frame(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        for encoding in [Encoding::Proto, Encoding::Json] {
            let mut input = encode(&frame, encoding);
            if !input.is_empty() {
                let at = at.index(input.len());
                input[at] = byte;
                let _ = decode(input.clone(), encoding);
                input.truncate(at);
                let _ = decode(input, encoding);
            }
        }
    }

    #[test]
    fn send_frames_round_trip(frame in send_frame()) {
        for encoding in [Encoding::Proto, Encoding::Json] {
            let decoded = decode(encode(&frame, encoding), encoding);
            prop_assert_eq!(decoded.ok(), Some(frame.clone()));
        }
    }

    #[test]
    fn deliver_frames_round_trip(frame in deliver_frame()) {
        for encoding in [Encoding::Proto, Encoding::Json] {
            let decoded = decode(encode(&frame, encoding), encoding);
            prop_assert_eq!(decoded.ok(), Some(frame.clone()));
        }
    }
}
