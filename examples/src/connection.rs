//! A client connection speaking Herald's v1 protocol over a WebSocket: the handshake with
//! the subprotocol that picks the encoding, the `connect` → `connected` login, and one
//! [`Frame`] per WebSocket message in either direction.
//!
//! Invariants: a [`Connection`] only ever writes frames in the encoding its subprotocol
//! named, and [`Connection::recv`] hides WebSocket control messages (tungstenite answers
//! WebSocket pings itself) so callers see protocol frames and the close, nothing else.
//! Protocol-level `ping` frames are the caller's to answer: only it knows its rid policy.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{FutureExt as _, SinkExt as _, StreamExt as _};
use herald_proto::{
    DecodeLimits, EncodeError, Encoding, FrameError, decode_frame, encode_json, encode_proto,
    v1::{self, Frame, frame::Body},
};
use tokio::net::TcpStream;
use tokio_tungstenite::{
    MaybeTlsStream, WebSocketStream,
    tungstenite::{
        self, Message,
        client::IntoClientRequest as _,
        http::{HeaderValue, header::SEC_WEBSOCKET_PROTOCOL},
        protocol::{CloseFrame, WebSocketConfig, frame::coding::CloseCode},
    },
};

/// Close code a peer reports when the TCP connection ended without a close frame
/// (RFC 6455 reserves 1006 for exactly this; it never travels on the wire).
pub const CLOSE_ABNORMAL: u16 = 1006;

/// What can go wrong on a client connection. Each variant is one outcome a caller can act
/// on: retry later, fix the URL or token, or report a bug in the peer.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// TCP connect or the WebSocket handshake failed.
    #[error("cannot open a WebSocket to {url}: {source}")]
    Open {
        /// The URL dialled.
        url: String,
        /// What tungstenite reported.
        #[source]
        source: Box<tungstenite::Error>,
    },
    /// The server accepted the WebSocket but not our subprotocol.
    #[error("server at {url} answered subprotocol {answered:?}, not {asked}: is it a Herald v1 server?")]
    Subprotocol {
        /// The URL dialled.
        url: String,
        /// The subprotocol we asked for.
        asked: &'static str,
        /// What the server answered, if anything.
        answered: Option<String>,
    },
    /// The WebSocket failed after the handshake.
    #[error("WebSocket error: {0}")]
    WebSocket(#[source] Box<tungstenite::Error>),
    /// The peer closed the connection (or it ended without a close frame: code 1006).
    #[error("connection closed with code {code}{}", if reason.is_empty() { String::new() } else { format!(": {reason}") })]
    Closed {
        /// The WebSocket close code (PROTOCOL.md lists what Herald's codes mean).
        code: u16,
        /// The close reason the peer gave.
        reason: String,
    },
    /// A message that is not a valid frame in this connection's encoding.
    #[error("undecodable frame from the server: {0}")]
    Decode(#[source] FrameError),
    /// A binary message on a JSON connection, or text on a protobuf one.
    #[error("server sent a {got} message on a {encoding:?} connection")]
    WrongMessageType {
        /// `"text"` or `"binary"`.
        got: &'static str,
        /// This connection's encoding.
        encoding: Encoding,
    },
    /// A frame we built cannot be encoded (a bug in the caller).
    #[error("cannot encode frame: {0}")]
    Encode(#[source] EncodeError),
    /// The server answered our `connect` with an `error` frame.
    #[error("server refused connect: {code}: {message}")]
    Refused {
        /// The error code.
        code: String,
        /// The explanation.
        message: String,
    },
    /// The server sent a frame that makes no sense at this point.
    #[error("expected {expected}, got {got}")]
    Unexpected {
        /// What the protocol calls for here.
        expected: &'static str,
        /// The body name of what arrived.
        got: &'static str,
    },
    /// A step did not finish in time.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, &'static str),
}

impl ConnectionError {
    /// The close code if the peer closed the connection.
    pub fn close_code(&self) -> Option<u16> {
        match self {
            Self::Closed { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl From<tungstenite::Error> for ConnectionError {
    fn from(error: tungstenite::Error) -> Self {
        match error {
            tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed => {
                Self::Closed { code: CLOSE_ABNORMAL, reason: "connection already closed".to_owned() }
            }
            other => Self::WebSocket(Box::new(other)),
        }
    }
}

/// What one incoming WebSocket message turned out to be.
#[derive(Debug)]
pub enum Received {
    /// A protocol frame.
    Frame(Frame),
    /// The peer's close frame.
    Closed {
        /// Its close code (1005 when the frame had none).
        code: u16,
        /// Its reason.
        reason: String,
    },
    /// A WebSocket ping or pong, already handled by tungstenite.
    Control,
}

/// Wraps an encoded frame in the WebSocket message type of `encoding`: binary for
/// protobuf, text for JSON.
///
/// # Errors
///
/// [`EncodeError`] if the frame has no JSON spelling (an enum field out of range).
pub fn frame_to_message(frame: &Frame, encoding: Encoding) -> Result<Message, EncodeError> {
    Ok(match encoding {
        Encoding::Proto => Message::Binary(Bytes::from(encode_proto(frame))),
        Encoding::Json => Message::Text(encode_json(frame)?.into()),
    })
}

/// Decodes one WebSocket message of a connection using `encoding`.
///
/// # Errors
///
/// [`ConnectionError::Decode`] for a message that is not a frame,
/// [`ConnectionError::WrongMessageType`] for the other encoding's message type.
pub fn message_to_frame(
    message: Message,
    encoding: Encoding,
    limits: &DecodeLimits,
) -> Result<Received, ConnectionError> {
    let payload: Bytes = match (message, encoding) {
        (Message::Binary(payload), Encoding::Proto) => payload,
        (Message::Text(text), Encoding::Json) => text.into(),
        (Message::Binary(_), Encoding::Json) => {
            return Err(ConnectionError::WrongMessageType { got: "binary", encoding });
        }
        (Message::Text(_), Encoding::Proto) => {
            return Err(ConnectionError::WrongMessageType { got: "text", encoding });
        }
        (Message::Close(frame), _) => {
            return Ok(match frame {
                Some(frame) => Received::Closed { code: frame.code.into(), reason: frame.reason.to_string() },
                None => Received::Closed { code: CloseCode::Status.into(), reason: String::new() },
            });
        }
        (Message::Ping(_) | Message::Pong(_) | Message::Frame(_), _) => {
            return Ok(Received::Control);
        }
    };
    decode_frame(payload, encoding, limits).map(Received::Frame).map_err(ConnectionError::Decode)
}

/// WebSocket settings for clients and the relay: small read buffers, because load tests
/// hold a thousand connections and Herald frames are small, and the protocol's frame limit.
pub fn websocket_config(max_frame_bytes: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(8 * 1024)
        // Small enough to bound memory per connection, large enough that `feed` batches.
        .write_buffer_size(16 * 1024)
        .max_write_buffer_size(16 * 1024 + max_frame_bytes + 1024)
        .max_message_size(Some(max_frame_bytes))
        .max_frame_size(Some(max_frame_bytes))
}

/// A client's WebSocket to a Herald server (or anything that speaks PROTOCOL.md).
///
/// Use [`Connection::open`] then [`Connection::login`]; afterwards [`Connection::send`] and
/// [`Connection::recv`] move frames. For throughput, [`Connection::feed`] several frames and
/// [`Connection::flush`] once.
pub struct Connection {
    /// The WebSocket.
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// Negotiated through the subprotocol; every frame in either direction uses it.
    encoding: Encoding,
    /// Bounds on incoming frames.
    limits: DecodeLimits,
    /// The rid the next request gets; never 0, which PROTOCOL.md reserves for the server.
    next_rid: u32,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("encoding", &self.encoding)
            .field("next_rid", &self.next_rid)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Opens a WebSocket to `url` asking for the subprotocol of `encoding`, within `timeout`.
    ///
    /// # Errors
    ///
    /// [`ConnectionError::Open`] if TCP or the handshake fails,
    /// [`ConnectionError::Subprotocol`] if the server picks another subprotocol, and
    /// [`ConnectionError::Timeout`].
    pub async fn open(url: &str, encoding: Encoding, timeout: Duration) -> Result<Self, ConnectionError> {
        let open_error = |source| ConnectionError::Open { url: url.to_owned(), source: Box::new(source) };
        let mut request = url.into_client_request().map_err(open_error)?;
        request.headers_mut().insert(SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(encoding.subprotocol()));
        let limits = DecodeLimits::default();
        let config = websocket_config(limits.max_frame_bytes);
        let (ws, response) =
            tokio::time::timeout(timeout, tokio_tungstenite::connect_async_with_config(request, Some(config), true))
                .await
                .map_err(|_| ConnectionError::Timeout(timeout, "the WebSocket handshake"))?
                .map_err(open_error)?;
        let answered = response.headers().get(SEC_WEBSOCKET_PROTOCOL).and_then(|value| value.to_str().ok());
        if answered != Some(encoding.subprotocol()) {
            return Err(ConnectionError::Subprotocol {
                url: url.to_owned(),
                asked: encoding.subprotocol(),
                answered: answered.map(str::to_owned),
            });
        }
        Ok(Self { ws, encoding, limits, next_rid: 1 })
    }

    /// The encoding this connection negotiated.
    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    /// A fresh request id: counts up from 1 and skips 0 when it wraps.
    pub fn next_rid(&mut self) -> u32 {
        let rid = self.next_rid;
        self.next_rid = self.next_rid.checked_add(1).unwrap_or(1);
        rid
    }

    /// Authenticates: sends `connect` and waits for `connected`.
    ///
    /// # Errors
    ///
    /// [`ConnectionError::Closed`] if the server closes (4001: bad token, 4003: not
    /// allowed), [`ConnectionError::Refused`] if it answers with an `error` frame,
    /// [`ConnectionError::Unexpected`] for another frame, [`ConnectionError::Timeout`].
    pub async fn login(
        &mut self,
        token: &str,
        device_id: &str,
        client_name: &str,
        timeout: Duration,
    ) -> Result<v1::Connected, ConnectionError> {
        let rid = self.next_rid();
        let connect = v1::Connect {
            token: token.to_owned(),
            device_id: device_id.to_owned(),
            client: Some(v1::ClientInfo {
                name: client_name.to_owned(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
            }),
        };
        self.send(&Frame::new(rid, connect)).await?;
        let wait = async {
            loop {
                let frame = self.recv().await?;
                match frame.body {
                    Some(Body::Connected(connected)) => return Ok(connected),
                    Some(Body::Error(error)) => {
                        return Err(ConnectionError::Refused { code: error.code, message: error.message });
                    }
                    // A server may ping at any time; answering keeps the login alive.
                    Some(Body::Ping(ping)) => {
                        let pong = v1::Pong { time_ms: ping.time_ms };
                        self.send(&Frame::new(frame.rid, pong)).await?;
                    }
                    Some(other) => {
                        return Err(ConnectionError::Unexpected { expected: "connected", got: other.name() });
                    }
                    None => {}
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.map_err(|_| ConnectionError::Timeout(timeout, "connected"))?
    }

    /// Answers the server's `ping` (its frame's `rid`) when it asks for a `pong` (`reply`
    /// set); a ping that does not ask is left unanswered (PROTOCOL.md, "Heartbeats").
    ///
    /// # Errors
    ///
    /// As [`Connection::send`].
    pub async fn answer_ping(&mut self, rid: u32, ping: &v1::Ping) -> Result<(), ConnectionError> {
        if ping.reply {
            self.send(&Frame::new(rid, v1::Pong { time_ms: ping.time_ms })).await?;
        }
        Ok(())
    }

    /// Writes one frame and flushes it.
    ///
    /// # Errors
    ///
    /// [`ConnectionError::Encode`] for a frame with no JSON spelling, otherwise the
    /// WebSocket's error.
    pub async fn send(&mut self, frame: &Frame) -> Result<(), ConnectionError> {
        let message = frame_to_message(frame, self.encoding).map_err(ConnectionError::Encode)?;
        self.ws.send(message).await?;
        Ok(())
    }

    /// Queues one frame without flushing; follow with [`Connection::flush`].
    ///
    /// # Errors
    ///
    /// As [`Connection::send`].
    pub async fn feed(&mut self, frame: &Frame) -> Result<(), ConnectionError> {
        let message = frame_to_message(frame, self.encoding).map_err(ConnectionError::Encode)?;
        self.ws.feed(message).await?;
        Ok(())
    }

    /// Writes out everything queued by [`Connection::feed`].
    ///
    /// # Errors
    ///
    /// The WebSocket's error.
    pub async fn flush(&mut self) -> Result<(), ConnectionError> {
        self.ws.flush().await?;
        Ok(())
    }

    /// Waits for the next protocol frame.
    ///
    /// Cancel-safe: dropping the future loses no frame, so it can sit in a `select!`.
    ///
    /// # Errors
    ///
    /// [`ConnectionError::Closed`] when the peer closes (code 1006 if the TCP connection
    /// just ended), or a decoding or WebSocket error.
    pub async fn recv(&mut self) -> Result<Frame, ConnectionError> {
        loop {
            let message = self.ws.next().await;
            if let Some(frame) = self.accept(message)? {
                return Ok(frame);
            }
        }
    }

    /// The next frame if one is already buffered, without waiting; `None` if none is.
    ///
    /// Lets a caller drain a burst of frames and answer them with one flush.
    pub fn recv_ready(&mut self) -> Option<Result<Frame, ConnectionError>> {
        loop {
            let message = self.ws.next().now_or_never()?;
            match self.accept(message) {
                Ok(Some(frame)) => return Some(Ok(frame)),
                Ok(None) => {}
                Err(error) => return Some(Err(error)),
            }
        }
    }

    /// Turns what the stream yielded into a frame, `None` for control messages.
    fn accept(
        &mut self,
        message: Option<Result<Message, tungstenite::Error>>,
    ) -> Result<Option<Frame>, ConnectionError> {
        let message = match message {
            Some(message) => message?,
            None => {
                return Err(ConnectionError::Closed { code: CLOSE_ABNORMAL, reason: "connection ended".to_owned() });
            }
        };
        match message_to_frame(message, self.encoding, &self.limits)? {
            Received::Frame(frame) => Ok(Some(frame)),
            Received::Closed { code, reason } => Err(ConnectionError::Closed { code, reason }),
            Received::Control => Ok(None),
        }
    }

    /// Closes the WebSocket with `code` and `reason`, waiting at most a second for the
    /// server's answer. Errors are ignored: the connection is going away either way.
    pub async fn close(mut self, code: u16, reason: &str) {
        let frame = CloseFrame { code: CloseCode::from(code), reason: reason.into() };
        let closing = async {
            if self.ws.close(Some(frame)).await.is_ok() {
                while let Some(Ok(_)) = self.ws.next().await {}
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), closing).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_travel_as_binary_or_text_by_encoding() {
        let ping = Frame::new(3, v1::Ping { time_ms: 42, reply: false });
        let limits = DecodeLimits::default();
        for encoding in [Encoding::Proto, Encoding::Json] {
            let message = frame_to_message(&ping, encoding).expect("encodes");
            assert_eq!(message.is_binary(), encoding.is_binary());
            match message_to_frame(message, encoding, &limits).expect("decodes") {
                Received::Frame(frame) => assert_eq!(frame, ping),
                other => panic!("expected a frame, got {other:?}"),
            }
        }
    }

    #[test]
    fn the_other_encodings_message_type_is_refused() {
        let limits = DecodeLimits::default();
        let text = Message::Text(r#"{"rid":1,"ping":{}}"#.into());
        assert!(matches!(
            message_to_frame(text, Encoding::Proto, &limits),
            Err(ConnectionError::WrongMessageType { got: "text", .. })
        ));
        let binary = Message::Binary(Bytes::from_static(b"\x08\x01"));
        assert!(matches!(
            message_to_frame(binary, Encoding::Json, &limits),
            Err(ConnectionError::WrongMessageType { got: "binary", .. })
        ));
    }

    #[test]
    fn close_frames_surface_their_code() {
        let limits = DecodeLimits::default();
        let close = Message::Close(Some(CloseFrame { code: CloseCode::from(4009), reason: "kicked".into() }));
        match message_to_frame(close, Encoding::Proto, &limits).expect("decodes") {
            Received::Closed { code, reason } => {
                assert_eq!(code, 4009);
                assert_eq!(reason, "kicked");
            }
            other => panic!("expected a close, got {other:?}"),
        }
    }
}
