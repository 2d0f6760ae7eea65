//! Framing: one WebSocket message is one [`Frame`], protobuf-encoded under the
//! `herald.v1.proto` subprotocol and canonical JSON under `herald.v1.json`.
//!
//! Invariants kept here, because every byte of input comes from the network:
//! - decoding never panics, whatever the bytes;
//! - the size limit is checked before any parsing, and JSON nesting is checked by a cheap
//!   byte scan before serde sees the text, so hostile input costs one pass at most;
//! - a decoded frame always has a body, so callers can match on it without an `Option`;
//! - every [`FrameError`] maps to exactly one close code ([`FrameError::close_code`]).

use std::sync::OnceLock;

use bytes::Bytes;
use prost::Message as _;

use crate::{SUBPROTOCOL_JSON, SUBPROTOCOL_PROTO, v1::Frame};

/// How frames are written on a connection, chosen by the WebSocket subprotocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Encoding {
    /// Protobuf, one binary WebSocket message per frame (`herald.v1.proto`, the default).
    #[default]
    Proto,
    /// Proto3 canonical JSON, one text WebSocket message per frame (`herald.v1.json`).
    Json,
}

impl Encoding {
    /// The encoding a negotiated subprotocol names, or `None` if it is not one of ours.
    pub fn from_subprotocol(subprotocol: &str) -> Option<Self> {
        match subprotocol {
            SUBPROTOCOL_PROTO => Some(Self::Proto),
            SUBPROTOCOL_JSON => Some(Self::Json),
            _ => None,
        }
    }

    /// The subprotocol that selects this encoding.
    pub fn subprotocol(self) -> &'static str {
        match self {
            Self::Proto => SUBPROTOCOL_PROTO,
            Self::Json => SUBPROTOCOL_JSON,
        }
    }

    /// Whether frames travel as binary WebSocket messages (protobuf) rather than text (JSON).
    pub fn is_binary(self) -> bool {
        matches!(self, Self::Proto)
    }
}

/// Bounds on what [`decode_frame`] accepts, so one client cannot make the server parse
/// unbounded input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Largest accepted frame, in bytes of the WebSocket message (PROTOCOL.md: close 1009
    /// above it). Default 1 MiB.
    pub max_frame_bytes: usize,
    /// Deepest accepted nesting of JSON objects and arrays, the frame's own object counting
    /// as 1. Valid v1 frames need 6; the default, 32, leaves room for new fields. serde_json
    /// refuses more than 128 levels whatever this says.
    pub max_json_depth: usize,
}

impl DecodeLimits {
    /// Default of [`DecodeLimits::max_frame_bytes`]: 1 MiB.
    pub const DEFAULT_MAX_FRAME_BYTES: usize = 1_048_576;
    /// Default of [`DecodeLimits::max_json_depth`].
    pub const DEFAULT_MAX_JSON_DEPTH: usize = 32;
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self { max_frame_bytes: Self::DEFAULT_MAX_FRAME_BYTES, max_json_depth: Self::DEFAULT_MAX_JSON_DEPTH }
    }
}

/// Why an incoming WebSocket message is not a usable frame.
///
/// The messages are written for the client developer who sent it; the gateway sends them
/// as the close reason.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The message is larger than [`DecodeLimits::max_frame_bytes`]; nothing was parsed.
    #[error("frame is {size} bytes, over the limit of {limit} bytes: send smaller message bodies")]
    TooLarge {
        /// Size of the rejected message, in bytes.
        size: usize,
        /// The limit in force.
        limit: usize,
    },
    /// A binary message that is not a protobuf `herald.v1.Frame`.
    #[error("binary frame is not a valid protobuf herald.v1.Frame: {0}")]
    InvalidProtobuf(#[source] prost::DecodeError),
    /// A text message that is not UTF-8.
    #[error(
        "JSON frame is not valid UTF-8 (first bad byte at offset {valid_up_to}): \
         send text frames as UTF-8"
    )]
    InvalidUtf8 {
        /// Length of the valid UTF-8 prefix.
        valid_up_to: usize,
    },
    /// A text message nesting objects and arrays deeper than
    /// [`DecodeLimits::max_json_depth`]; it was not parsed.
    #[error(
        "JSON frame nests objects and arrays more than {limit} levels deep; \
         a herald.v1 frame needs far fewer"
    )]
    TooDeep {
        /// The depth limit in force.
        limit: usize,
    },
    /// A text message that is not a `herald.v1.Frame` in the proto3 canonical JSON mapping.
    #[error(
        "JSON frame is not a valid herald.v1.Frame in canonical JSON ({0}); expected \
         e.g. {{\"rid\":1,\"ping\":{{\"timeMs\":\"0\"}}}}, with 64-bit integers as strings \
         or numbers and bytes as base64"
    )]
    InvalidJson(#[source] serde_json::Error),
    /// A frame that decoded but carries no body (or only a body this version does not know).
    #[error(
        "frame has no body: set exactly one of connect, connected, send, send_ack, deliver, \
         deliver_ack, sync, sync_reply, history, history_reply, subscribe, unsubscribe, \
         subscribed, sync_hint, ping, pong, go_away, error"
    )]
    NoBody,
}

impl FrameError {
    /// The WebSocket close code PROTOCOL.md assigns to this error: 1009 (message too big)
    /// for [`FrameError::TooLarge`], 4010 (protocol error) for everything else.
    pub fn close_code(&self) -> u16 {
        match self {
            Self::TooLarge { .. } => 1009,
            _ => 4010,
        }
    }
}

/// Why a frame could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// JSON has no spelling for a value, in practice an enum field holding a number that
    /// is not one of its named values (e.g. a `send_ack.status` of 99).
    #[error("frame cannot be written as canonical JSON: {0}")]
    Json(#[source] serde_json::Error),
}

/// Decodes one WebSocket message into a frame that has a body.
///
/// Pass the message's payload as [`Bytes`] (or anything that converts into it without a
/// copy, such as a `Vec<u8>`): protobuf `bytes` fields then share its buffer instead of
/// being copied. The encoding is the connection's, not guessed from the payload.
///
/// # Errors
///
/// [`FrameError::TooLarge`] if the payload exceeds `limits.max_frame_bytes` (checked before
/// parsing); [`FrameError::InvalidProtobuf`], [`FrameError::InvalidUtf8`],
/// [`FrameError::TooDeep`] or [`FrameError::InvalidJson`] if it does not parse;
/// [`FrameError::NoBody`] if it parses to a frame without a body.
pub fn decode_frame(input: impl Into<Bytes>, encoding: Encoding, limits: &DecodeLimits) -> Result<Frame, FrameError> {
    let input = input.into();
    if input.len() > limits.max_frame_bytes {
        return Err(FrameError::TooLarge { size: input.len(), limit: limits.max_frame_bytes });
    }
    let frame = match encoding {
        Encoding::Proto => Frame::decode(input).map_err(FrameError::InvalidProtobuf)?,
        Encoding::Json => decode_json(&input, limits.max_json_depth)?,
    };
    if frame.body.is_none() {
        return Err(FrameError::NoBody);
    }
    Ok(frame)
}

fn decode_json(input: &[u8], max_depth: usize) -> Result<Frame, FrameError> {
    let text =
        std::str::from_utf8(input).map_err(|error| FrameError::InvalidUtf8 { valid_up_to: error.valid_up_to() })?;
    if exceeds_depth(input, max_depth) {
        return Err(FrameError::TooDeep { limit: max_depth });
    }
    serde_json::from_str(text).map_err(FrameError::InvalidJson)
}

/// Whether `json` opens more than `max_depth` objects and arrays at once, counting only
/// brackets outside string literals. It does not validate: malformed text is serde's to
/// reject; this only guarantees serde never recurses deeper than `max_depth`.
fn exceeds_depth(json: &[u8], max_depth: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &byte in json {
        if in_string {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == b'"' {
                in_string = false;
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max_depth {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Encodes a frame for a connection of the given encoding: protobuf bytes, or canonical
/// JSON as UTF-8 text.
///
/// Use [`encode_json`] instead when the caller needs a `String` for a text message, and
/// [`encode_proto`] when only protobuf is possible (it cannot fail).
///
/// # Errors
///
/// [`EncodeError::Json`] for [`Encoding::Json`] if a field has no JSON spelling (an enum
/// field holding an unnamed number). Protobuf encoding never fails.
pub fn encode_frame(frame: &Frame, encoding: Encoding) -> Result<Vec<u8>, EncodeError> {
    match encoding {
        Encoding::Proto => Ok(encode_proto(frame)),
        Encoding::Json => encode_json(frame).map(String::into_bytes),
    }
}

/// Encodes a frame as protobuf, for a binary WebSocket message.
pub fn encode_proto(frame: &Frame) -> Vec<u8> {
    frame.encode_to_vec()
}

/// Encodes a frame in the proto3 canonical JSON mapping, for a text WebSocket message:
/// lowerCamelCase names, 64-bit integers as strings, bytes as base64, enums by name, and
/// fields at their default value left out.
///
/// # Errors
///
/// [`EncodeError::Json`] if a field has no JSON spelling (an enum field holding a number
/// that is not one of its named values).
pub fn encode_json(frame: &Frame) -> Result<String, EncodeError> {
    serde_json::to_string(frame).map_err(EncodeError::Json)
}

/// A frame written to many connections (a room message to its subscribers), encoded at
/// most once per encoding however many connections it goes to: the first writer that needs
/// an encoding makes it, every other one shares its buffer.
#[derive(Debug)]
pub struct SharedFrame {
    frame: Frame,
    proto: OnceLock<Bytes>,
    /// `None` when the frame has no JSON spelling (then every writer gets the error).
    json: OnceLock<Option<Bytes>>,
}

impl SharedFrame {
    pub fn new(frame: Frame) -> Self {
        Self { frame, proto: OnceLock::new(), json: OnceLock::new() }
    }

    pub fn frame(&self) -> &Frame {
        &self.frame
    }

    /// The frame in `encoding`: encoded by the first caller, shared with the others (a
    /// cheap clone of one buffer).
    ///
    /// # Errors
    ///
    /// As [`encode_frame`]: [`EncodeError::Json`] if the frame has no JSON spelling.
    pub fn encoded(&self, encoding: Encoding) -> Result<Bytes, EncodeError> {
        match encoding {
            Encoding::Proto => Ok(self.proto.get_or_init(|| encode_proto(&self.frame).into()).clone()),
            Encoding::Json => match self.json.get_or_init(|| encode_json(&self.frame).ok().map(Bytes::from)) {
                Some(text) => Ok(text.clone()),
                None => encode_json(&self.frame).map(Bytes::from),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_nested_brackets() {
        assert!(!exceeds_depth(br#"{"a":[{"b":[]}]}"#, 4));
        assert!(exceeds_depth(br#"{"a":[{"b":[]}]}"#, 3));
        assert!(!exceeds_depth(b"[][][][][]", 1));
    }

    #[test]
    fn depth_ignores_brackets_inside_strings() {
        assert!(!exceeds_depth(br#"{"a":"[[[[{{{{"}"#, 1));
        assert!(!exceeds_depth(br#"{"a":"\"[[[[\\"}"#, 1));
        // An escaped backslash ends the escape: the quote after it closes the string.
        assert!(exceeds_depth(br#"{"a":"\\",[[]]}"#, 2));
    }

    #[test]
    fn depth_survives_unbalanced_closers() {
        assert!(!exceeds_depth(b"]]]]}}}}", 0));
        assert!(exceeds_depth(b"]]]][[", 1));
    }

    #[test]
    fn subprotocols_round_trip() {
        for encoding in [Encoding::Proto, Encoding::Json] {
            assert_eq!(Encoding::from_subprotocol(encoding.subprotocol()), Some(encoding));
        }
        assert_eq!(Encoding::from_subprotocol("herald.v2.proto"), None);
        assert_eq!(Encoding::default(), Encoding::Proto);
    }

    #[test]
    fn only_too_large_closes_with_1009() {
        assert_eq!(FrameError::TooLarge { size: 2, limit: 1 }.close_code(), 1009);
        assert_eq!(FrameError::NoBody.close_code(), 4010);
        assert_eq!(FrameError::TooDeep { limit: 1 }.close_code(), 4010);
    }

    #[test]
    fn a_shared_frame_is_encoded_once_per_encoding_as_it_would_be_alone() {
        let message = crate::v1::Message { id: 7, conversation: "room:lobby".into(), seq: 3, ..Default::default() };
        let frame = Frame::new(0, crate::v1::Deliver { message: Some(message), attempt: 1 });
        let shared = SharedFrame::new(frame.clone());
        for encoding in [Encoding::Proto, Encoding::Json] {
            let first = shared.encoded(encoding).expect("encodes");
            let again = shared.encoded(encoding).expect("encodes");
            assert_eq!(first.as_ref(), encode_frame(&frame, encoding).expect("encodes").as_slice(), "{encoding:?}");
            assert_eq!(first.as_ptr(), again.as_ptr(), "{encoding:?}: one buffer, shared");
        }
        assert_eq!(shared.frame(), &frame);
    }
}
