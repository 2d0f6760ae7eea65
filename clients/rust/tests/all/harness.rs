//! Test harness: real Herald processes (`HERALD_BIN`), a TCP proxy that can cut or freeze
//! connections, HS256 tokens, an HTTP helper, clients whose events are recorded, and a
//! polling wait. No fixed sleep decides a verdict: tests wait for conditions, with a
//! timeout that fails loudly.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_client::{
    Client, ClientOptions, DisconnectedInfo, Event, GoAwayInfo, HistoryPage, MemorySeqStore, Message, RetryInfo, Sent,
    State,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::HeaderValue;

pub type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The Herald binary: `$HERALD_BIN` (relative to the workspace root), else the debug build
/// of this workspace (`cargo test --workspace` builds it before any test runs). Missing:
/// fail, never skip.
pub fn herald_bin() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let built = || {
        let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
        target.join("debug/herald")
    };
    let bin = std::env::var_os("HERALD_BIN").map_or_else(built, PathBuf::from);
    let bin = if bin.is_absolute() { bin } else { root.join(bin) };
    assert!(bin.exists(), "no Herald binary at {}: build it or set HERALD_BIN to its path", bin.display());
    bin
}

/// Polls `condition` every 10 ms until it holds; panics with `what` after `timeout`.
pub async fn wait_for(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Fails when `future` takes longer than `timeout`.
pub async fn within<T>(what: &str, timeout: Duration, future: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(timeout, future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {timeout:?}: {what}"),
    }
}

/// One Herald node on a data dir; it can be killed and started again on the same port.
pub struct Herald {
    dir: tempfile::TempDir,
    child: Option<Child>,
    pub port: u16,
    dev: bool,
    env: Vec<(String, String)>,
}

impl Herald {
    pub async fn start(dev: bool, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::Builder::new().prefix("herald-client-rs-").tempdir().expect("a temporary dir");
        let env = env.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect();
        let mut herald = Self { dir, child: None, port: 0, dev, env };
        herald.launch().await;
        herald
    }

    pub fn url(&self) -> String {
        format!("ws://127.0.0.1:{}/v1/ws", self.port)
    }

    /// Starts the node again on the same port and data dir.
    pub async fn restart(&mut self) {
        self.launch().await;
    }

    /// SIGKILL, and waits for the exit.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
        }
    }

    /// SIGTERM (a graceful drain: go_away, then close 1012), and waits for the exit.
    pub async fn terminate(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id().expect("a running herald").to_string();
            let status = Command::new("kill").args(["-TERM", &pid]).status().await.expect("kill runs");
            assert!(status.success(), "kill -TERM {pid}");
            within("herald to exit after SIGTERM", Duration::from_secs(60), child.wait()).await.expect("exit status");
        }
    }

    async fn launch(&mut self) {
        let listen_file = self.dir.path().join("listen");
        let _ = std::fs::remove_file(&listen_file);
        let log = std::fs::File::create(self.dir.path().join("stderr.log")).expect("a log file");
        let mut command = Command::new(herald_bin());
        command
            .arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--listen-file")
            .arg(&listen_file)
            .arg("--data-dir")
            .arg(self.dir.path().join("data"));
        if self.dev {
            command.arg("--dev");
        }
        // Only this test's HERALD_* settings: Herald refuses unknown HERALD_* variables.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HERALD_") {
                command.env_remove(key);
            }
        }
        command.env("RUST_LOG", "warn").envs(self.env.iter().map(|(key, value)| (key, value)));
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).kill_on_drop(true);
        let mut child = command.spawn().expect("herald starts");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(text) = std::fs::read_to_string(&listen_file)
                && let Some(port) = text.trim().rsplit(':').next().and_then(|port| port.parse().ok())
            {
                self.port = port;
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("herald exited with {status}:\n{}", self.stderr());
            }
            assert!(Instant::now() < deadline, "herald did not come up:\n{}", self.stderr());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.child = Some(child);
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }

    /// Posts an announcement to `room` (name without `room:`) with the dev API key.
    pub async fn announce(&self, room: &str, content: &str, id: &str) -> String {
        let body = format!(r#"{{"content":"{content}","announcement_id":"{id}"}}"#);
        let (status, answer) = http(self.port, "POST", &format!("/v1/rooms/{room}/announcements"), &body).await;
        assert!(status == 200 || status == 202, "announcement refused: {status} {answer}");
        answer
    }
}

/// A minimal HTTP/1.0 request on loopback: the status and the body.
pub async fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await.expect("connect to herald");
    let request = format!(
        "{method} {path} HTTP/1.0\r\nhost: 127.0.0.1\r\nauthorization: Bearer dev-key\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write the request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.expect("read the answer");
    let status = answer.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body).to_owned();
    (status, body)
}

/// A TCP proxy in front of a node: `cut()` drops every connection and refuses new ones until
/// `resume()` (a network outage with the server up).
pub struct Proxy {
    pub port: u16,
    refusing: Arc<AtomicBool>,
    pipes: Arc<Mutex<Vec<Pipe>>>,
    server: AbortHandle,
}

/// One proxied connection: its two copy tasks and whether it forwards.
struct Pipe {
    tasks: [AbortHandle; 2],
    frozen: Arc<AtomicBool>,
}

impl Proxy {
    pub async fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().expect("its address").port();
        let refusing = Arc::new(AtomicBool::new(false));
        let pipes: Arc<Mutex<Vec<Pipe>>> = Arc::default();
        let (flag, list) = (refusing.clone(), pipes.clone());
        let server = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if flag.load(Ordering::SeqCst) {
                    continue; // dropped: refused
                }
                let Ok(upstream) = TcpStream::connect(("127.0.0.1", target)).await else { continue };
                let frozen = Arc::new(AtomicBool::new(false));
                let (client_read, client_write) = client.into_split();
                let (upstream_read, upstream_write) = upstream.into_split();
                let tasks = [
                    tokio::spawn(forward(client_read, upstream_write, frozen.clone())).abort_handle(),
                    tokio::spawn(forward(upstream_read, client_write, frozen.clone())).abort_handle(),
                ];
                list.lock().expect("the pipes").push(Pipe { tasks, frozen });
            }
        })
        .abort_handle();
        Self { port, refusing, pipes, server }
    }

    pub fn url(&self) -> String {
        format!("ws://127.0.0.1:{}/v1/ws", self.port)
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.refusing.store(true, Ordering::SeqCst);
        for pipe in self.pipes.lock().expect("the pipes").drain(..) {
            for task in pipe.tasks {
                task.abort();
            }
        }
    }

    pub fn resume(&self) {
        self.refusing.store(false, Ordering::SeqCst);
    }

    /// Stops forwarding on the open connections without closing them (a peer that died
    /// without a word); new connections are served.
    pub fn freeze(&self) {
        for pipe in self.pipes.lock().expect("the pipes").iter() {
            pipe.frozen.store(true, Ordering::SeqCst);
        }
    }
}

/// Copies one direction; while frozen, reads and drops (no back-pressure, no close).
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if !frozen.load(Ordering::SeqCst) && to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.server.abort();
    }
}

/// An HS256 JWT for `sub`, expiring `ttl_seconds` from now; returns it and its `exp`.
pub fn jwt(secret: &str, sub: &str, ttl_seconds: u64) -> (String, u64) {
    use hmac::{KeyInit as _, Mac as _};
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs();
    let exp = now + ttl_seconds;
    let header = base64url(br#"{"alg":"HS256","typ":"JWT"}"#);
    let claims = base64url(format!(r#"{{"sub":"{sub}","exp":{exp}}}"#).as_bytes());
    let unsigned = format!("{header}.{claims}");
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(unsigned.as_bytes());
    let signature = base64url(&mac.finalize().into_bytes());
    (format!("{unsigned}.{signature}"), exp)
}

fn base64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, byte)| n | (u32::from(*byte) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

/// What a client's events showed so far.
#[derive(Default)]
pub struct Seen {
    pub messages: Vec<Message>,
    pub state: Option<State>,
    pub connected: usize,
    /// The URL of each connection.
    pub urls: Vec<String>,
    pub resumed: usize,
    pub disconnected: Vec<DisconnectedInfo>,
    pub retries: Vec<RetryInfo>,
    pub go_aways: Vec<GoAwayInfo>,
    pub errors: Vec<String>,
}

/// A client whose events are read by a task of its own: every message is handled (dropped)
/// as soon as it is recorded.
pub struct Recorded {
    pub client: Client,
    pub seen: Arc<Mutex<Seen>>,
}

impl Recorded {
    pub fn connect(options: ClientOptions) -> Self {
        Self::with_handler_time(options, Duration::ZERO)
    }

    /// Each message is held for `handling` before it is recorded and dropped (handled): a
    /// slow handler.
    pub fn with_handler_time(options: ClientOptions, handling: Duration) -> Self {
        let (client, mut events) = Client::connect(options);
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let record = seen.clone();
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                if let Event::Message(delivery) = &event
                    && !handling.is_zero()
                {
                    tokio::time::sleep(handling).await;
                    record.lock().expect("the record").messages.push(delivery.message.clone());
                    continue;
                }
                let mut seen = record.lock().expect("the record");
                match event {
                    Event::State(state) => seen.state = Some(state),
                    Event::Connected(info) => {
                        seen.connected += 1;
                        seen.urls.push(info.url);
                    }
                    Event::Disconnected(info) => seen.disconnected.push(info),
                    Event::Resumed(_) => seen.resumed += 1,
                    Event::GoAway(info) => seen.go_aways.push(info),
                    Event::Retry(info) => seen.retries.push(info),
                    Event::Message(delivery) => seen.messages.push(delivery.message.clone()),
                    Event::Error(error) => seen.errors.push(error.to_string()),
                }
            }
        });
        Self { client, seen }
    }

    pub fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().expect("the record")
    }

    pub fn texts(&self) -> Vec<String> {
        self.seen().messages.iter().map(text).collect()
    }

    pub fn state(&self) -> Option<State> {
        self.seen().state
    }

    pub async fn connected(&self) {
        wait_for("connected", Duration::from_secs(20), || self.state() == Some(State::Connected)).await;
    }
}

/// Options for `user` (dev token) with quick reconnects: the backoff itself is unit-tested.
pub fn options(url: &str, user: &str, store: &MemorySeqStore) -> ClientOptions {
    let mut options = ClientOptions::new(url, format!("dev:{user}"), "test");
    options.store = Arc::new(store.clone());
    options.reconnect.initial_delay = Duration::from_millis(50);
    options.reconnect.max_delay = Duration::from_millis(500);
    options
}

pub fn text(message: &Message) -> String {
    String::from_utf8_lossy(&message.body).into_owned()
}

/// Every message of a conversation, ascending, paging backwards with `history`.
pub async fn history_all(client: &Client, conversation: &str) -> Vec<Message> {
    let mut pages: Vec<Vec<Message>> = Vec::new();
    let mut before = 0;
    loop {
        let page: HistoryPage = within("history", Duration::from_secs(30), client.history(conversation, before, 500))
            .await
            .expect("history");
        let first = page.messages.first().map(|message| message.seq);
        pages.insert(0, page.messages);
        match first {
            Some(seq) if page.has_more => before = seq,
            _ => break,
        }
    }
    pages.concat()
}

/// Asserts the history holds each body exactly once, with the ids its send resolved with.
pub async fn assert_stored_once(client: &Client, conversation: &str, results: &HashMap<String, Sent>) -> Vec<Message> {
    let history = history_all(client, conversation).await;
    for (body, sent) in results {
        let stored: Vec<&Message> = history.iter().filter(|message| text(message) == *body).collect();
        assert_eq!(stored.len(), 1, "{body} is stored once");
        assert_eq!(stored[0].id, sent.message_id, "{body}: the send resolved with the stored id");
        assert_eq!(stored[0].seq, sent.seq, "{body}: the send resolved with the stored seq");
    }
    history
}

/// Waits until `receiver` got a marker sent last (by another device of alice), then returns
/// its texts before it: nothing sent before the marker can still be on its way.
pub async fn barrier(herald: &Herald, receiver: &Recorded, conversation: &str) -> Vec<String> {
    let marker = format!("marker-{}", herald_client::uuid_v4());
    if let Some(room) = conversation.strip_prefix("room:") {
        herald.announce(room, &marker, &marker).await;
    } else {
        let store = MemorySeqStore::new();
        let mut sender_options = options(&herald.url(), "alice", &store);
        sender_options.device_id = "marker".to_owned();
        let sender = Recorded::connect(sender_options);
        within(
            "the marker's send",
            Duration::from_secs(30),
            sender.client.send(conversation, marker.clone(), Default::default()),
        )
        .await
        .expect("the marker is stored");
        sender.client.close().await;
    }
    wait_for(&format!("the marker in {conversation}"), Duration::from_secs(30), || receiver.texts().contains(&marker))
        .await;
    let mut texts = receiver.texts();
    assert_eq!(texts.last(), Some(&marker), "nothing arrives after the marker");
    texts.pop();
    texts
}

/// A stub server's handshake: answers with the first subprotocol offered, as Herald would.
#[allow(clippy::result_large_err, reason = "the signature of tungstenite's handshake callback")]
pub fn pick_first_subprotocol(request: &Request, mut response: Response) -> Result<Response, ErrorResponse> {
    if let Some(offered) = request.headers().get("sec-websocket-protocol") {
        let first = offered.to_str().unwrap_or("").split(',').next().unwrap_or("").trim().to_owned();
        if let Ok(value) = HeaderValue::from_str(&first) {
            response.headers_mut().insert("sec-websocket-protocol", value);
        }
    }
    Ok(response)
}
