//! Every body type survives both encodings unchanged.

use std::collections::BTreeSet;

use bytes::Bytes;
use herald_proto::{Encoding, v1};
use prost::Message as _;

use crate::{BIG, decode, encode, samples};

#[test]
fn samples_cover_every_body_type() {
    let names: BTreeSet<_> =
        samples().iter().map(|frame| frame.body.as_ref().expect("samples have bodies").name()).collect();
    assert_eq!(names.len(), 18, "{names:?}");
}

#[test]
fn every_body_round_trips_in_protobuf() {
    for frame in samples() {
        let bytes = encode(&frame, Encoding::Proto);
        assert_eq!(decode(bytes, Encoding::Proto).expect("decodes"), frame);
    }
}

#[test]
fn every_body_round_trips_in_json() {
    for frame in samples() {
        let text = encode(&frame, Encoding::Json);
        let decoded = decode(text.clone(), Encoding::Json);
        let text = String::from_utf8(text).expect("JSON encoding is UTF-8");
        assert_eq!(decoded.expect(&text), frame, "{text}");
    }
}

#[test]
fn json_writes_64_bit_integers_as_strings() {
    for frame in samples() {
        let text = String::from_utf8(encode(&frame, Encoding::Json)).expect("UTF-8");
        if text.contains(&BIG.to_string()) {
            assert!(text.contains(&format!("\"{BIG}\"")), "{text}");
        }
    }
}

#[test]
fn unset_since_seq_stays_unset_and_zero_stays_set() {
    for encoding in [Encoding::Proto, Encoding::Json] {
        for since_seq in [None, Some(0), Some(BIG)] {
            let frame = v1::Frame::new(1, v1::Subscribe { room: "room:lobby".into(), since_seq });
            let Some(v1::frame::Body::Subscribe(subscribe)) =
                decode(encode(&frame, encoding), encoding).expect("decodes").body
            else {
                panic!("not a subscribe");
            };
            assert_eq!(subscribe.since_seq, since_seq, "{encoding:?}");
        }
    }
}

#[test]
fn protobuf_bytes_fields_share_the_input_buffer() {
    let frame = v1::Frame::new(1, v1::Send { body: Bytes::from(vec![7u8; 4096]), ..Default::default() });
    let input = Bytes::from(frame.encode_to_vec());
    let range = input.as_ptr_range();
    let Some(v1::frame::Body::Send(send)) = decode(input.clone(), Encoding::Proto).expect("decodes").body else {
        panic!("not a send");
    };
    assert!(range.contains(&send.body.as_ptr()), "body was copied");
}

#[test]
fn frame_new_accepts_a_body_or_a_message() {
    let ping = v1::Ping { time_ms: 5, reply: false };
    assert_eq!(v1::Frame::new(3, ping), v1::Frame::new(3, v1::frame::Body::Ping(ping)));
    assert_eq!(v1::frame::Body::from(ping).name(), "ping");
}
