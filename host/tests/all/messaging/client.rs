//! A test client for `/v1/ws`, written from PROTOCOL.md: one WebSocket, one encoding
//! (protobuf or canonical JSON), request ids counting up from 1.
//!
//! Frames that arrive while the test waits for something else are kept (in arrival order)
//! and offered to the next wait, so a test can ask for "the send_ack of X" and then "the
//! deliver of Y" without caring how the server interleaved them. Server `ping` frames are
//! counted, not kept, and those that ask (`reply`) are answered with a `pong` as
//! PROTOCOL.md says (unless `answer_pings` is off). A wait that fails panics with what it wanted, what did arrive instead, and the
//! tail of the server's log.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt as _, StreamExt as _};
use herald_proto::v1::frame::Body;
use herald_proto::v1::{self, Frame, send_ack::Status};
use herald_proto::{DecodeLimits, Encoding, decode_frame, encode_json, encode_proto};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Bytes, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::WAIT;
use super::server::{Herald, log_tail};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How a connection ended, as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    /// The close frame's code; `None` when the connection ended without one.
    pub code: Option<u16>,
    /// The close frame's reason, or what ended the connection.
    pub reason: String,
}

/// Why a wait did not get what it wanted.
#[derive(Debug)]
pub enum WaitError {
    Timeout,
    Closed(Closed),
}

impl std::fmt::Display for WaitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Timeout => write!(f, "timed out"),
            Self::Closed(closed) => write!(f, "connection closed: code {:?}, {:?}", closed.code, closed.reason),
        }
    }
}

/// A WebSocket client of `/v1/ws`.
pub struct Client {
    ws: Ws,
    /// Protobuf (binary messages) or canonical JSON (text messages).
    pub encoding: Encoding,
    /// `user/device`, for failure messages.
    label: String,
    next_rid: u32,
    /// Frames received but not yet claimed by a wait, oldest first.
    stash: VecDeque<Frame>,
    /// Every text message received, verbatim (JSON connections), to check the wire spelling.
    pub raw_texts: Vec<String>,
    /// Protocol-level `ping` frames received from the server.
    pub server_pings: Vec<Frame>,
    /// WebSocket-level ping control frames received (tungstenite answers those itself).
    pub ws_pings: usize,
    /// Answer the server `ping` frames that ask with `pong` (on by default, as PROTOCOL.md asks).
    pub answer_pings: bool,
    closed: Option<Closed>,
    /// The `connected` reply, once logged in.
    pub connected: Option<v1::Connected>,
    server_log: PathBuf,
}

impl Client {
    /// Opens a WebSocket offering `encoding`'s subprotocol, and checks the server chose it.
    pub async fn open(herald: &Herald, encoding: Encoding) -> Self {
        let (client, chosen) = Self::open_offering(herald, Some(encoding.subprotocol())).await;
        assert_eq!(
            chosen.as_deref(),
            Some(encoding.subprotocol()),
            "the server must select the offered subprotocol {}",
            encoding.subprotocol()
        );
        Self { encoding, ..client }
    }

    /// Opens a WebSocket offering `subprotocol` (or none); returns the client (protobuf
    /// encoding) and the subprotocol the server selected.
    pub async fn open_offering(herald: &Herald, subprotocol: Option<&str>) -> (Self, Option<String>) {
        Self::open_at(herald, &herald.ws_url(), subprotocol).await
    }

    /// As [`open_offering`](Self::open_offering), at `url` (a proxy in front of `herald`,
    /// or `herald`'s own URL with a query), failures showing `herald`'s log.
    pub async fn open_at(herald: &Herald, url: &str, subprotocol: Option<&str>) -> (Self, Option<String>) {
        let mut request = url.into_client_request().expect("ws request");
        if let Some(protocol) = subprotocol {
            request
                .headers_mut()
                .insert("Sec-WebSocket-Protocol", HeaderValue::from_str(protocol).expect("header value"));
        }
        let connector = herald.tls().map(|config| tokio_tungstenite::Connector::Rustls(std::sync::Arc::clone(config)));
        let connecting = tokio_tungstenite::connect_async_tls_with_config(request, None, false, connector);
        let opened = tokio::time::timeout(WAIT, connecting).await;
        let (ws, response) = match opened {
            Ok(Ok(pair)) => pair,
            Ok(Err(error)) => panic!("WebSocket handshake with {url} failed: {error}\n{}", herald.log_tail()),
            Err(_) => panic!("WebSocket handshake with {url} timed out\n{}", herald.log_tail()),
        };
        let chosen = response.headers().get("sec-websocket-protocol").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let client = Self {
            ws,
            encoding: Encoding::Proto,
            label: "(not logged in)".into(),
            next_rid: 1,
            stash: VecDeque::new(),
            raw_texts: Vec::new(),
            server_pings: Vec::new(),
            ws_pings: 0,
            answer_pings: true,
            closed: None,
            connected: None,
            server_log: herald.log_path(),
        };
        (client, chosen)
    }

    /// Opens a protobuf connection and logs in as `user` on `device` with a dev token.
    pub async fn connect(herald: &Herald, user: &str, device: &str) -> Self {
        Self::connect_with(herald, Encoding::Proto, user, device).await
    }

    /// Opens a connection of `encoding` and logs in as `user` on `device` with a dev token.
    pub async fn connect_with(herald: &Herald, encoding: Encoding, user: &str, device: &str) -> Self {
        let mut client = Self::open(herald, encoding).await;
        let connected = client
            .login(&format!("dev:{user}"), device)
            .await
            .unwrap_or_else(|why| panic!("{user}/{device} could not log in: {why}\n{}", herald.log_tail()));
        assert_eq!(connected.user_id, user, "connected.user_id");
        assert_eq!(connected.device_id, device, "connected.device_id");
        client
    }

    /// Sends `connect` and waits for `connected`; `Err` says what came instead.
    pub async fn login(&mut self, token: &str, device: &str) -> Result<v1::Connected, String> {
        let rid = self
            .send_frame(v1::Connect {
                token: token.to_owned(),
                device_id: device.to_owned(),
                client: Some(v1::ClientInfo { name: "herald-e2e-tests".into(), version: "1".into() }),
            })
            .await;
        let outcome = self
            .try_wait_for(WAIT, |frame| match &frame.body {
                Some(Body::Connected(connected)) => Some(Ok((frame.rid, connected.clone()))),
                Some(Body::Error(error)) => Some(Err(format!("error frame {error:?}"))),
                _ => None,
            })
            .await;
        match outcome {
            Ok(Ok((reply_rid, connected))) => {
                assert_eq!(reply_rid, rid, "connected must echo the rid of connect");
                self.label = format!("{}/{}", connected.user_id, connected.device_id);
                self.connected = Some(connected.clone());
                Ok(connected)
            }
            Ok(Err(why)) => Err(why),
            Err(why) => Err(why.to_string()),
        }
    }

    /// The next request id.
    pub fn rid(&mut self) -> u32 {
        let rid = self.next_rid;
        self.next_rid += 1;
        rid
    }

    /// Sends a frame with a fresh rid; returns the rid.
    pub async fn send_frame(&mut self, body: impl Into<Body>) -> u32 {
        let rid = self.rid();
        self.send_framed(Frame::new(rid, body)).await;
        rid
    }

    /// Sends a whole frame as built.
    pub async fn send_framed(&mut self, frame: Frame) {
        let message = match self.encoding {
            Encoding::Proto => Message::Binary(Bytes::from(encode_proto(&frame))),
            Encoding::Json => Message::text(encode_json(&frame).expect("frame encodes as JSON")),
        };
        self.send_message(message).await;
    }

    /// Sends one WebSocket message as is (for garbage and oversize frames).
    pub async fn send_message(&mut self, message: Message) {
        if let Err(error) = self.ws.send(message).await {
            // The server may already have closed; the next wait reports how.
            if self.closed.is_none() {
                self.closed = Some(Closed { code: None, reason: format!("write failed: {error}") });
            }
        }
    }

    /// Reads one frame from the socket (not from the stash); server pings are answered
    /// and recorded, not returned.
    async fn read_one(&mut self, deadline: Instant) -> Result<Frame, WaitError> {
        loop {
            if let Some(frame) = self.read_any(deadline).await? {
                return Ok(frame);
            }
        }
    }

    /// Reads one frame from the socket: `None` for a server ping (answered and recorded).
    async fn read_any(&mut self, deadline: Instant) -> Result<Option<Frame>, WaitError> {
        loop {
            if let Some(closed) = &self.closed {
                return Err(WaitError::Closed(closed.clone()));
            }
            let message = match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Err(_) => return Err(WaitError::Timeout),
                Ok(None) => {
                    self.closed = Some(Closed { code: None, reason: "connection ended without a close frame".into() });
                    continue;
                }
                Ok(Some(Err(error))) => {
                    self.closed = Some(Closed { code: None, reason: format!("connection failed: {error}") });
                    continue;
                }
                Ok(Some(Ok(message))) => message,
            };
            let limits = DecodeLimits { max_frame_bytes: 64 << 20, ..DecodeLimits::default() };
            let frame = match message {
                Message::Binary(bytes) => {
                    assert_eq!(
                        self.encoding,
                        Encoding::Proto,
                        "{}: the server sent a binary message on a JSON connection",
                        self.label
                    );
                    decode_frame(bytes, Encoding::Proto, &limits)
                }
                Message::Text(text) => {
                    assert_eq!(
                        self.encoding,
                        Encoding::Json,
                        "{}: the server sent a text message on a protobuf connection",
                        self.label
                    );
                    self.raw_texts.push(text.as_str().to_owned());
                    decode_frame(Bytes::copy_from_slice(text.as_bytes()), Encoding::Json, &limits)
                }
                Message::Ping(_) => {
                    self.ws_pings += 1;
                    continue;
                }
                Message::Close(frame) => {
                    self.closed = Some(match frame {
                        Some(frame) => {
                            Closed { code: Some(u16::from(frame.code)), reason: frame.reason.as_str().to_owned() }
                        }
                        None => Closed { code: None, reason: "close frame without a code".into() },
                    });
                    continue;
                }
                Message::Pong(_) | Message::Frame(_) => continue,
            };
            let frame =
                frame.unwrap_or_else(|error| panic!("{}: the server sent an undecodable frame: {error}", self.label));
            if let Some(Body::Ping(ping)) = &frame.body {
                if self.answer_pings && ping.reply {
                    let rid = frame.rid;
                    self.send_framed(Frame::new(rid, v1::Pong { time_ms: ping.time_ms })).await;
                }
                self.server_pings.push(frame);
                return Ok(None);
            }
            return Ok(Some(frame));
        }
    }

    /// Waits up to `timeout` for the first frame (kept or new) that `pick` accepts.
    pub async fn try_wait_for<T>(
        &mut self,
        timeout: Duration,
        mut pick: impl FnMut(&Frame) -> Option<T>,
    ) -> Result<T, WaitError> {
        for index in 0..self.stash.len() {
            if let Some(found) = pick(&self.stash[index]) {
                self.stash.remove(index);
                return Ok(found);
            }
        }
        let deadline = Instant::now() + timeout;
        loop {
            let frame = self.read_one(deadline).await?;
            if let Some(found) = pick(&frame) {
                return Ok(found);
            }
            self.stash.push_back(frame);
        }
    }

    /// [`try_wait_for`](Self::try_wait_for) that panics with a full account on failure.
    pub async fn wait_for<T>(&mut self, what: &str, timeout: Duration, pick: impl FnMut(&Frame) -> Option<T>) -> T {
        match self.try_wait_for(timeout, pick).await {
            Ok(found) => found,
            Err(why) => panic!("{}", self.failure(&format!("waited {timeout:?} for {what}: {why}"))),
        }
    }

    /// A failure message: what went wrong, what was received instead, the server log.
    pub fn failure(&self, what: &str) -> String {
        format!("{}: {what}\nunclaimed frames: {}\n{}", self.label, self.unclaimed(), log_tail(&self.server_log))
    }

    /// A short description of the kept frames.
    pub fn unclaimed(&self) -> String {
        if self.stash.is_empty() {
            return "none".into();
        }
        let shown: Vec<String> = self.stash.iter().take(20).map(describe).collect();
        let more = self.stash.len().saturating_sub(20);
        format!("[{}]{}", shown.join(", "), if more > 0 { format!(" and {more} more") } else { String::new() })
    }

    /// The kept frames, oldest first.
    pub fn kept(&self) -> Vec<Frame> {
        self.stash.iter().cloned().collect()
    }

    /// Drops every kept frame.
    pub fn forget_unclaimed(&mut self) {
        self.stash.clear();
    }

    /// Waits for the reply of type `pick` to request `rid`; an `error` frame for that rid
    /// panics with the server's code and message. Checks the reply echoes the rid.
    pub async fn reply<T>(&mut self, rid: u32, what: &str, mut pick: impl FnMut(&Body) -> Option<T>) -> T {
        match self.try_reply(rid, what, &mut pick).await {
            Ok(found) => found,
            Err(error) => panic!(
                "{}",
                self.failure(&format!("{what} (rid {rid}) failed: error {:?}: {}", error.code, error.message))
            ),
        }
    }

    /// Like [`reply`](Self::reply), but an `error` frame for `rid` is returned as `Err`.
    pub async fn try_reply<T>(
        &mut self,
        rid: u32,
        what: &str,
        mut pick: impl FnMut(&Body) -> Option<T>,
    ) -> Result<T, v1::Error> {
        let (frame_rid, found) = self
            .wait_for(&format!("{what} (reply to rid {rid})"), WAIT, |frame| {
                let body = frame.body.as_ref()?;
                if let Body::Error(error) = body
                    && (frame.rid == rid || error.rid == rid)
                {
                    return Some((frame.rid, Err(error.clone())));
                }
                pick(body).map(|found| (frame.rid, Ok(found)))
            })
            .await;
        if found.is_ok() {
            assert_eq!(frame_rid, rid, "{}: the {what} must echo the request's rid", self.label);
        }
        found
    }

    // --- sending messages ----------------------------------------------------------------

    /// Sends `send` without waiting; returns the rid.
    pub async fn send_with(&mut self, client_msg_id: &str, conversation: &str, kind: u32, body: &[u8]) -> u32 {
        self.send_frame(v1::Send {
            client_msg_id: client_msg_id.to_owned(),
            conversation: conversation.to_owned(),
            kind,
            body: body.to_vec().into(),
        })
        .await
    }

    /// Waits for the `send_ack` of `client_msg_id`.
    pub async fn ack_of(&mut self, client_msg_id: &str) -> v1::SendAck {
        let what = format!("send_ack of {client_msg_id}");
        self.wait_for(&what, WAIT, |frame| match &frame.body {
            Some(Body::SendAck(ack)) if ack.client_msg_id == client_msg_id => Some(ack.clone()),
            _ => None,
        })
        .await
    }

    /// Sends a message (kind 1, a fresh client_msg_id) and returns its `send_ack`, whatever
    /// the status.
    pub async fn send(&mut self, conversation: &str, body: impl AsRef<[u8]>) -> v1::SendAck {
        let id = super::uuid();
        self.send_with(&id, conversation, 1, body.as_ref()).await;
        self.ack_of(&id).await
    }

    /// Sends a message and asserts it was accepted (`OK`, ids set).
    pub async fn send_ok(&mut self, conversation: &str, body: impl AsRef<[u8]>) -> v1::SendAck {
        let ack = self.send(conversation, body).await;
        assert_eq!(ack.status(), Status::Ok, "{}", self.failure(&format!("send to {conversation} not OK: {ack:?}")));
        assert!(ack.message_id != 0 && ack.seq != 0, "an OK send_ack carries the message id and seq: {ack:?}");
        ack
    }

    /// Resends `client_msg_id` (kind 1, `body`) until it is stored (`OK` or `DUPLICATE`),
    /// waiting as each `RETRY` says; returns that ack. Panics on any other answer, or on a
    /// `RETRY` past `deadline`.
    pub async fn resend_until_stored(
        &mut self,
        client_msg_id: &str,
        conversation: &str,
        body: &[u8],
        deadline: Instant,
    ) -> v1::SendAck {
        let (ack, _) = self.resend_while_retry(client_msg_id, conversation, body, deadline).await;
        match ack.status() {
            Status::Ok | Status::Duplicate => ack,
            _ => panic!("{}", self.failure(&format!("the resend of {client_msg_id} must be stored: {ack:?}"))),
        }
    }

    /// Sends `client_msg_id` (kind 1, `body`) and sends it again, waiting as each `RETRY`
    /// says, until the answer is not `RETRY` or `deadline` has passed. Returns the last
    /// answer and when the attempt it answers was sent: the decided one, or the first when
    /// the answer is `DUPLICATE` (an earlier attempt was stored).
    pub async fn resend_while_retry(
        &mut self,
        client_msg_id: &str,
        conversation: &str,
        body: &[u8],
        deadline: Instant,
    ) -> (v1::SendAck, Instant) {
        let first = Instant::now();
        loop {
            let sent = Instant::now();
            self.send_with(client_msg_id, conversation, 1, body).await;
            let ack = self.ack_of(client_msg_id).await;
            match ack.status() {
                Status::Retry if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(u64::from(ack.retry_after_ms).clamp(20, 1_000))).await;
                }
                Status::Duplicate => return (ack, first),
                _ => return (ack, sent),
            }
        }
    }

    /// Sends a message and asserts it was REJECTED with a reason; returns the reason.
    pub async fn send_rejected(&mut self, conversation: &str, body: impl AsRef<[u8]>) -> String {
        let ack = self.send(conversation, body).await;
        assert_eq!(
            ack.status(),
            Status::Rejected,
            "{}",
            self.failure(&format!("a send to {conversation:?} must be REJECTED, got {ack:?}"))
        );
        assert!(!ack.reason.is_empty(), "a REJECTED send_ack must say why: {ack:?}");
        ack.reason
    }

    // --- receiving messages --------------------------------------------------------------

    /// The next `deliver` of `conversation`.
    pub async fn deliver_in(&mut self, conversation: &str) -> v1::Deliver {
        let what = format!("a deliver in {conversation}");
        self.wait_for(&what, WAIT, |frame| match &frame.body {
            Some(Body::Deliver(deliver))
                if deliver.message.as_ref().is_some_and(|m| m.conversation == conversation) =>
            {
                Some(deliver.clone())
            }
            _ => None,
        })
        .await
    }

    /// The next `deliver` of message `id`.
    pub async fn deliver_of(&mut self, id: u64) -> v1::Deliver {
        let what = format!("a deliver of message {id}");
        self.wait_for(&what, WAIT, |frame| match &frame.body {
            Some(Body::Deliver(deliver)) if deliver.message.as_ref().is_some_and(|m| m.id == id) => {
                Some(deliver.clone())
            }
            _ => None,
        })
        .await
    }

    /// The first `count` distinct messages delivered in `conversation`, in arrival order
    /// (redeliveries of a message already seen are skipped).
    pub async fn distinct_deliveries(&mut self, conversation: &str, count: usize) -> Vec<v1::Message> {
        let mut seen: Vec<v1::Message> = Vec::new();
        while seen.len() < count {
            let deliver = self.deliver_in(conversation).await;
            let message = deliver.message.expect("deliver carries a message");
            if !seen.iter().any(|m| m.id == message.id) {
                seen.push(message);
            }
        }
        seen
    }

    /// Cumulative `deliver_ack`.
    pub async fn deliver_ack(&mut self, conversation: &str, seq: u64) {
        self.send_frame(v1::DeliverAck { conversation: conversation.to_owned(), seq }).await;
    }

    // --- requests ------------------------------------------------------------------------

    pub async fn sync(&mut self, cursors: &[(&str, u64)], limit: u32) -> v1::SyncReply {
        let cursors = cursors
            .iter()
            .map(|(conversation, seq)| v1::Cursor { conversation: (*conversation).to_owned(), seq: *seq })
            .collect();
        let rid = self.send_frame(v1::Sync { cursors, limit }).await;
        self.reply(rid, "sync_reply", |body| match body {
            Body::SyncReply(reply) => Some(reply.clone()),
            _ => None,
        })
        .await
    }

    pub async fn history(&mut self, conversation: &str, before_seq: u64, limit: u32) -> v1::HistoryReply {
        let rid = self.send_history(conversation, before_seq, limit).await;
        self.reply(rid, "history_reply", |body| match body {
            Body::HistoryReply(reply) => Some(reply.clone()),
            _ => None,
        })
        .await
    }

    pub async fn send_history(&mut self, conversation: &str, before_seq: u64, limit: u32) -> u32 {
        self.send_frame(v1::History { conversation: conversation.to_owned(), before_seq, limit }).await
    }

    /// Pages backwards through the whole conversation; returns it ascending by seq.
    pub async fn whole_history(&mut self, conversation: &str) -> Vec<v1::Message> {
        let mut all: Vec<v1::Message> = Vec::new();
        let mut before = 0;
        for _page in 0..10_000 {
            let page = self.history(conversation, before, 100).await;
            let mut messages = page.messages;
            if let Some(first) = messages.first() {
                before = first.seq;
            }
            let empty = messages.is_empty();
            messages.append(&mut all);
            all = messages;
            if !page.has_more || empty {
                return all;
            }
        }
        panic!("history of {conversation} did not end after 10000 pages");
    }

    pub async fn subscribe(&mut self, room: &str, since_seq: Option<u64>) -> v1::Subscribed {
        let rid = self.send_frame(v1::Subscribe { room: room.to_owned(), since_seq }).await;
        self.reply(rid, "subscribed", |body| match body {
            Body::Subscribed(subscribed) => Some(subscribed.clone()),
            _ => None,
        })
        .await
    }

    /// `unsubscribe` (which has no reply), then a ping round trip so the server has
    /// processed it before the test goes on.
    pub async fn unsubscribe(&mut self, room: &str) {
        self.send_frame(v1::Unsubscribe { room: room.to_owned() }).await;
        self.ping().await;
    }

    /// A `ping` with a unique time; waits for the matching `pong` (which must echo the rid).
    pub async fn ping(&mut self) -> v1::Pong {
        let time_ms = now_ms() + u64::from(self.next_rid);
        let rid = self.send_frame(v1::Ping { time_ms, reply: false }).await;
        let pong = self
            .wait_for("pong", WAIT, |frame| match &frame.body {
                Some(Body::Pong(pong)) if pong.time_ms == time_ms => Some((frame.rid, *pong)),
                _ => None,
            })
            .await;
        assert_eq!(pong.0, rid, "{}: a pong must echo its ping's rid", self.label);
        pong.1
    }

    /// Reads until the server sends a protocol `ping` frame; returns it. Panics, saying so,
    /// if only WebSocket-level pings came.
    pub async fn wait_for_server_ping(&mut self, timeout: Duration) -> Frame {
        let seen = self.server_pings.len();
        let deadline = Instant::now() + timeout;
        while self.server_pings.len() == seen {
            match self.read_any(deadline).await {
                Ok(Some(frame)) => self.stash.push_back(frame),
                Ok(None) => {}
                Err(why) => panic!(
                    "{}",
                    self.failure(&format!(
                        "waited {timeout:?} for a ping frame from the server: {why} \
                         ({} WebSocket-level pings came; PROTOCOL.md's heartbeat is the ping frame)",
                        self.ws_pings
                    ))
                ),
            }
        }
        self.server_pings[seen].clone()
    }

    // --- closing -------------------------------------------------------------------------

    /// Waits for the server to close the connection; frames before the close are kept.
    pub async fn expect_closed(&mut self, timeout: Duration) -> Closed {
        let deadline = Instant::now() + timeout;
        loop {
            match self.read_one(deadline).await {
                Ok(frame) => self.stash.push_back(frame),
                Err(WaitError::Closed(closed)) => return closed,
                Err(WaitError::Timeout) => {
                    panic!(
                        "{}",
                        self.failure(&format!("expected the server to close the connection within {timeout:?}"))
                    )
                }
            }
        }
    }

    /// Asserts the server closes the connection with `code`.
    pub async fn expect_close_code(&mut self, code: u16, why: &str) -> Closed {
        let closed = self.expect_closed(WAIT).await;
        assert_eq!(
            closed.code,
            Some(code),
            "{}",
            self.failure(&format!("{why}: expected close {code}, got {closed:?}"))
        );
        closed
    }

    /// Reads for `window` and panics if a frame matching `bad` arrives (kept frames count).
    pub async fn assert_quiet(&mut self, window: Duration, what: &str, mut bad: impl FnMut(&Frame) -> bool) {
        if let Some(frame) = self.stash.iter().find(|f| bad(f)) {
            panic!("{}", self.failure(&format!("{what}: got {}", describe(frame))));
        }
        let deadline = Instant::now() + window;
        loop {
            match self.read_one(deadline).await {
                Ok(frame) if bad(&frame) => panic!("{}", self.failure(&format!("{what}: got {}", describe(&frame)))),
                Ok(frame) => self.stash.push_back(frame),
                Err(WaitError::Timeout) => return,
                Err(WaitError::Closed(closed)) => {
                    panic!("{}", self.failure(&format!("{what}: the connection closed: {closed:?}")))
                }
            }
        }
    }

    /// A normal close (1000), then waits briefly for the server's close reply.
    pub async fn close(mut self) {
        let _ = self.ws.close(Some(CloseFrame { code: CloseCode::Normal, reason: "bye".into() })).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.read_one(deadline).await.is_ok() {}
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or_default()
}

/// One line about a frame, for failure messages.
pub fn describe(frame: &Frame) -> String {
    let body = match &frame.body {
        Some(Body::Deliver(d)) => match &d.message {
            Some(m) => format!("deliver({} seq {} id {} attempt {})", m.conversation, m.seq, m.id, d.attempt),
            None => "deliver(no message)".into(),
        },
        Some(Body::SendAck(a)) => {
            format!("send_ack({:?} {} seq {} id {} {:?})", a.status(), a.conversation, a.seq, a.message_id, a.reason)
        }
        Some(Body::Error(e)) => format!("error({:?}: {:?}, rid {})", e.code, e.message, e.rid),
        Some(Body::SyncHint(h)) => format!("sync_hint({} latest {})", h.conversation, h.latest_seq),
        Some(Body::GoAway(g)) => format!("go_away({:?})", g.reason),
        Some(body) => body.name().to_owned(),
        None => "(no body)".into(),
    };
    format!("{body}#{}", frame.rid)
}
