//! A whole node inside the test process: `herald_host::server::start` on `127.0.0.1:0` in dev
//! mode, with its data dir and an empty plugins folder in a temporary folder (SQLite), and
//! stopped with `RunningServer::shutdown`. No child process, no free-port race: the address
//! is the listener's own. The tests speak the wire protocol through a small WebSocket client
//! (protobuf frames) and HTTP/1.1 over a plain TCP stream.

use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use herald_host::config::Config;
use herald_host::server::{self, RunningServer};
use herald_proto::v1::frame::Body;
use herald_proto::v1::{self, Frame, send_ack::Status};
use herald_proto::{DecodeLimits, Encoding, SUBPROTOCOL_PROTO, decode_frame, encode_frame};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{Bytes, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long to wait for what should happen promptly (generous: two cores, many tests).
const WAIT: Duration = Duration::from_secs(10);

/// A node running in this process.
struct Node {
    server: RunningServer,
    /// Holds the data dir and the plugins folder.
    _root: tempfile::TempDir,
}

impl Node {
    async fn start() -> Self {
        let root = tempfile::tempdir().expect("a temporary folder");
        let plugins = root.path().join("plugins");
        std::fs::create_dir(&plugins).expect("an empty plugins folder");
        let config = Config {
            listen: "127.0.0.1:0".parse().expect("address"),
            data_dir: root.path().join("data"),
            plugins: Some(plugins),
            dev: true,
            ..Config::default()
        };
        let server = tokio::time::timeout(WAIT, server::start(&config))
            .await
            .expect("the server did not start in time")
            .expect("the server starts");
        Self { server, _root: root }
    }

    fn ws_url(&self) -> String {
        format!("ws://{}/v1/ws", self.server.addr)
    }

    async fn shutdown(self) {
        tokio::time::timeout(WAIT, self.server.shutdown()).await.expect("shutdown hung");
    }

    /// One HTTP/1.1 request on a fresh connection; returns the status and the body as JSON.
    async fn http(&self, method: &str, path: &str, bearer: Option<&str>, body: Option<&Value>) -> (u16, Value) {
        let exchange = async {
            let mut stream = TcpStream::connect(self.server.addr).await.expect("connect");
            let payload = body.map(Value::to_string).unwrap_or_default();
            let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n", self.server.addr);
            if let Some(token) = bearer {
                head.push_str(&format!("Authorization: Bearer {token}\r\n"));
            }
            if body.is_some() {
                head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", payload.len()));
            }
            head.push_str("\r\n");
            head.push_str(&payload);
            stream.write_all(head.as_bytes()).await.expect("write the request");
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw).await.expect("read the response");
            raw
        };
        let raw = tokio::time::timeout(WAIT, exchange).await.expect("no HTTP answer in time");
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no end of headers: {text:?}"));
        let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{head:?}"));
        assert!(
            !head.to_ascii_lowercase().contains("transfer-encoding: chunked"),
            "a JSON answer has a length: {head}"
        );
        let json = serde_json::from_str(body).unwrap_or_else(|error| panic!("HTTP {status} body {body:?}: {error}"));
        (status, json)
    }

    /// A dev token for `user` (`POST /v1/dev/token`).
    async fn dev_token(&self, user: &str) -> String {
        let (status, body) = self.http("POST", "/v1/dev/token", None, Some(&serde_json::json!({ "user": user }))).await;
        assert_eq!(status, 200, "{body}");
        body["token"].as_str().expect("a token").to_owned()
    }
}

/// A protobuf WebSocket client of `/v1/ws`, logged in.
struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_rid: u32,
}

/// How the server ended a connection.
#[derive(Debug, PartialEq)]
enum Next {
    Frame(Box<Frame>),
    /// A close frame with this code (`None`: the connection ended without one).
    Closed(Option<u16>),
}

impl Client {
    /// Opens `/v1/ws` offering `herald.v1.proto` and logs in as `user` on `device`.
    async fn connect(node: &Node, user: &str, device: &str) -> Self {
        let mut request = node.ws_url().into_client_request().expect("a request");
        request.headers_mut().insert("Sec-WebSocket-Protocol", HeaderValue::from_static(SUBPROTOCOL_PROTO));
        let (ws, response) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
            .await
            .expect("handshake in time")
            .expect("handshake");
        let chosen = response.headers().get("sec-websocket-protocol").and_then(|v| v.to_str().ok());
        assert_eq!(chosen, Some(SUBPROTOCOL_PROTO));
        let mut client = Self { ws, next_rid: 1 };
        let rid =
            client.send(v1::Connect { token: format!("dev:{user}"), device_id: device.to_owned(), client: None }).await;
        let (reply_rid, connected) = client
            .wait_for("connected", |frame| match &frame.body {
                Some(Body::Connected(connected)) => Some((frame.rid, connected.clone())),
                _ => None,
            })
            .await;
        assert_eq!(reply_rid, rid);
        assert_eq!((connected.user_id.as_str(), connected.device_id.as_str()), (user, device));
        client
    }

    /// Sends a frame with a fresh rid; returns the rid.
    async fn send(&mut self, body: impl Into<Body>) -> u32 {
        let rid = self.next_rid;
        self.next_rid += 1;
        let bytes = encode_frame(&Frame::new(rid, body), Encoding::Proto).expect("encode");
        self.ws.send(Message::Binary(Bytes::from(bytes))).await.expect("send a frame");
        rid
    }

    /// The next frame or the close, answering the server's `ping` frames on the way.
    async fn next(&mut self) -> Next {
        loop {
            let message = tokio::time::timeout(WAIT, self.ws.next()).await.expect("nothing came in time");
            match message {
                None | Some(Err(_)) => return Next::Closed(None),
                Some(Ok(Message::Close(close))) => return Next::Closed(close.map(|c| u16::from(c.code))),
                Some(Ok(Message::Binary(bytes))) => {
                    let frame = decode_frame(bytes, Encoding::Proto, &DecodeLimits::default()).expect("decode");
                    if let Some(Body::Ping(ping)) = &frame.body {
                        let time_ms = ping.time_ms;
                        self.send(v1::Pong { time_ms }).await;
                        continue;
                    }
                    return Next::Frame(Box::new(frame));
                }
                Some(Ok(other)) if other.is_text() => panic!("a text message on a protobuf connection: {other:?}"),
                Some(Ok(_)) => {}
            }
        }
    }

    /// The first frame `pick` accepts; frames before it are dropped.
    async fn wait_for<T>(&mut self, what: &str, mut pick: impl FnMut(&Frame) -> Option<T>) -> T {
        loop {
            match self.next().await {
                Next::Frame(frame) => {
                    if let Some(found) = pick(&frame) {
                        return found;
                    }
                }
                Next::Closed(code) => panic!("closed ({code:?}) while waiting for {what}"),
            }
        }
    }

    /// Sends `body` to `conversation`; waits for its ack.
    async fn send_message(&mut self, conversation: &str, body: &str) -> v1::SendAck {
        let client_msg_id = uuid();
        let rid = self
            .send(v1::Send {
                client_msg_id: client_msg_id.clone(),
                conversation: conversation.to_owned(),
                kind: 1,
                body: body.to_owned().into_bytes().into(),
            })
            .await;
        let (reply_rid, ack) = self
            .wait_for("send_ack", |frame| match &frame.body {
                Some(Body::SendAck(ack)) => Some((frame.rid, ack.clone())),
                _ => None,
            })
            .await;
        assert_eq!((reply_rid, ack.client_msg_id.as_str()), (rid, client_msg_id.as_str()));
        ack
    }
}

/// A fresh random UUID (version 4), as clients use for `client_msg_id`.
fn uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_message_is_acked_to_its_sender_and_delivered_to_its_recipient() {
    let node = Node::start().await;
    let mut alice = Client::connect(&node, "alice", "phone").await;
    let mut bob = Client::connect(&node, "bob", "phone").await;

    let ack = alice.send_message("dm:alice:bob", "hello bob").await;

    assert_eq!(ack.status(), Status::Ok, "{ack:?}");
    assert_eq!((ack.seq, ack.conversation.as_str()), (1, "dm:alice:bob"));
    let delivered = bob
        .wait_for("deliver", |frame| match &frame.body {
            Some(Body::Deliver(deliver)) => deliver.message.clone(),
            _ => None,
        })
        .await;
    assert_eq!((delivered.seq, delivered.id), (1, ack.message_id), "the ids alice was acked with");
    assert_eq!((delivered.sender.as_str(), delivered.sender_device.as_str()), ("alice", "phone"));
    assert_eq!(&delivered.body[..], b"hello bob");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_history_says_has_more_only_when_more_than_the_page_remains() {
    let node = Node::start().await;
    let mut alice = Client::connect(&node, "alice", "phone").await;
    let token = node.dev_token("bob").await;
    let limit = 3;
    let path = format!("/v1/conversations/dm:alice:bob/messages?after_seq=0&limit={limit}");
    let mut acked = Vec::new();
    for i in 1..=limit {
        let ack = alice.send_message("dm:alice:bob", &format!("message {i}")).await;
        assert_eq!(ack.status(), Status::Ok);
        acked.push(ack.seq);
    }

    // Exactly a page stored: all of it, and nothing more to read.
    let (status, page) = node.http("GET", &path, Some(&token), None).await;
    assert_eq!(status, 200, "{page}");
    let seqs = |page: &Value| -> Vec<u64> {
        page["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| m["seq"].as_str().and_then(|s| s.parse().ok()).or_else(|| m["seq"].as_u64()).expect("seq"))
            .collect()
    };
    assert_eq!(seqs(&page), acked);
    assert_eq!(page["has_more"], Value::Bool(false), "exactly `limit` stored is not more: {page}");

    // One more stored: the same page, and more to read.
    let ack = alice.send_message("dm:alice:bob", "one more").await;
    assert_eq!(ack.status(), Status::Ok);
    let (status, page) = node.http("GET", &path, Some(&token), None).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(seqs(&page), acked);
    assert_eq!(page["has_more"], Value::Bool(true), "{page}");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_sends_go_away_then_closes_with_1012() {
    let node = Node::start().await;
    let spread = node_go_away_spread();
    let mut alice = Client::connect(&node, "alice", "phone").await;

    let stopping = tokio::spawn(node.shutdown());

    let go_away = match alice.next().await {
        Next::Frame(frame) => match frame.body {
            Some(Body::GoAway(go_away)) => go_away,
            other => panic!("expected go_away first, got {other:?}"),
        },
        Next::Closed(code) => panic!("closed ({code:?}) without a go_away"),
    };
    assert!(go_away.reconnect_after_ms < spread, "{go_away:?}");
    assert_eq!(alice.next().await, Next::Closed(Some(1012)), "then closed as a service restart");
    tokio::time::timeout(WAIT, stopping).await.expect("shutdown in time").expect("shutdown did not panic");
}

/// The `go_away` spread of the default configuration.
fn node_go_away_spread() -> u32 {
    Config::default().gateway.go_away_spread_ms
}
