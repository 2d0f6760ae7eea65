//! A real `herald serve --dev` process per test: a loopback port the system picks (read from
//! `--listen-file`), temporary data dir, settings through `HERALD_*` environment variables,
//! killed on drop. `kill9` + `restart` reopen the same data dir, for durability tests. Also a
//! tiny HTTP/1.1 client (raw TCP, `Connection: close`), enough for PROTOCOL.md's JSON API.

use std::fs::OpenOptions;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::rustls::pki_types::ServerName;

use crate::support::poll::poll;

/// The API key (and admin key) dev mode accepts.
pub const DEV_KEY: &str = "dev-key";

/// How to start a server.
#[derive(Debug, Clone)]
pub struct Options {
    env: Vec<(String, String)>,
    dev: bool,
    /// The server speaks TLS (`[tls]` set): clients connect with this configuration.
    tls: Option<Arc<ClientConfig>>,
}

impl Default for Options {
    fn default() -> Self {
        Self { env: Vec::new(), dev: true, tls: None }
    }
}

impl Options {
    /// Sets a `HERALD_*` setting, e.g. `("GATEWAY__HEARTBEAT_MS", "200")`.
    pub fn set(mut self, key: &str, value: impl ToString) -> Self {
        self.env.push((format!("HERALD_{key}"), value.to_string()));
        self
    }

    /// The server terminates TLS (set `TLS__CERT_FILE` / `TLS__KEY_FILE` too): HTTP
    /// requests and WebSockets of the harness go over TLS with `client`.
    pub fn tls(mut self, client: Arc<ClientConfig>) -> Self {
        self.tls = Some(client);
        self
    }

    /// Runs without `--dev` (no `dev:` tokens, no `dev-key`, no `/v1/dev/token`).
    pub fn production(mut self) -> Self {
        self.dev = false;
        self
    }

    /// Runs `herald serve` with these settings expecting it to refuse to start: waits for
    /// it to exit (it must, within 30 s, and not with success) and returns what it printed.
    pub async fn refused(self) -> String {
        let root = tempfile::tempdir().expect("temp dir for the server");
        let mut command = Command::new(env!("CARGO_BIN_EXE_herald"));
        command.arg("serve");
        if self.dev {
            command.arg("--dev");
        }
        let mut child = command
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(root.path().join("data"))
            .env_remove("HERALD_CONFIG")
            .env("RUST_LOG", "info,sqlx=warn")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start herald");
        let exited = poll()
            .within(Duration::from_secs(30))
            .every(Duration::from_millis(25))
            .try_until("herald to refuse to start and exit", async || child.try_wait().expect("wait for herald"))
            .await;
        let status = exited.unwrap_or_else(|still_running| {
            let _ = child.kill();
            panic!("herald was expected to refuse to start: {still_running}")
        });
        let mut printed = String::new();
        for stream in [
            child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read>),
            child.stderr.take().map(|s| Box::new(s) as _),
        ]
        .into_iter()
        .flatten()
        {
            let mut stream = stream;
            let _ = stream.read_to_string(&mut printed);
        }
        assert!(!status.success(), "herald was expected to refuse to start, but exited with success:\n{printed}");
        printed
    }

    pub async fn start(self) -> Herald {
        let root = tempfile::tempdir().expect("temp dir for the server");
        let mut herald = Herald { child: None, port: 0, options: self, root };
        herald.spawn().await;
        herald
    }
}

/// A running `herald` process.
pub struct Herald {
    child: Option<Child>,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    options: Options,
    /// Holds `data/` (the data dir, kept across restarts) and `herald.log` (stdout and
    /// stderr of every run, appended).
    root: tempfile::TempDir,
}

impl Herald {
    /// `herald serve --dev` with default settings.
    pub async fn start() -> Self {
        Options::default().start().await
    }

    pub fn with() -> Options {
        Options::default()
    }

    /// `ws://127.0.0.1:<port>/v1/ws` (`wss://` when the server speaks TLS)
    pub fn ws_url(&self) -> String {
        let scheme = if self.options.tls.is_some() { "wss" } else { "ws" };
        format!("{scheme}://127.0.0.1:{}/v1/ws", self.port)
    }

    /// The TLS client configuration, when the server speaks TLS.
    pub fn tls(&self) -> Option<&Arc<ClientConfig>> {
        self.options.tls.as_ref()
    }

    fn data_dir(&self) -> PathBuf {
        self.root.path().join("data")
    }

    /// Where the server's stdout and stderr go (every run appended).
    pub fn log_path(&self) -> PathBuf {
        self.root.path().join("herald.log")
    }

    /// The last lines the server logged, for failure messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.log_path())
    }

    /// Where the server writes the address it listens on (`--listen-file`).
    fn listen_file(&self) -> PathBuf {
        self.root.path().join("listening")
    }

    /// Starts the process on a port of the system's choosing (`--listen 127.0.0.1:0`), reads
    /// the port from `--listen-file` and waits for `/healthz`: no port is picked here that
    /// another process could take first.
    async fn spawn(&mut self) {
        self.spawn_listening("127.0.0.1:0").await;
    }

    /// Starts the process listening at `listen`.
    async fn spawn_listening(&mut self, listen: &str) {
        let listen_file = self.listen_file();
        match std::fs::remove_file(&listen_file) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => panic!("remove {}: {error}", listen_file.display()),
        }
        let log = OpenOptions::new().create(true).append(true).open(self.log_path()).expect("open the server log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_herald"));
        command.arg("serve");
        if self.options.dev {
            command.arg("--dev");
        }
        command
            .args(["--listen", listen, "--listen-file"])
            .arg(&listen_file)
            .arg("--data-dir")
            .arg(self.data_dir())
            .env_remove("HERALD_CONFIG")
            .env("RUST_LOG", std::env::var("HERALD_TEST_SERVER_LOG").unwrap_or_else(|_| "info,sqlx=warn".into()))
            .envs(self.options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log);
        self.child = Some(command.spawn().expect("start herald"));
        if let Err(why) = self.wait_healthy().await {
            panic!("herald did not start ({why})\n{}", self.log_tail());
        }
    }

    /// Waits (up to 30 s: a start compiles plugins and migrates) for the port in the listen
    /// file, then for a 200 from `/healthz` there; `Err` when the process exits first or
    /// neither comes. Each check answers `Err` for "not yet" and `Ok(Err)` for "never: it
    /// exited".
    async fn wait_healthy(&mut self) -> Result<(), String> {
        let listen_file = self.listen_file();
        let starting = poll().within(Duration::from_secs(30)).every(Duration::from_millis(25));
        self.port = starting
            .try_until("the port in the listen file", async || -> Result<Result<u16, String>, String> {
                if let Some(status) = self.exited() {
                    return Ok(Err(format!("exited with {status}")));
                }
                let text = std::fs::read_to_string(&listen_file).map_err(|error| error.to_string())?;
                let addr: std::net::SocketAddr = text.trim().parse().map_err(|error| format!("{text:?}: {error}"))?;
                Ok(Ok(addr.port()))
            })
            .await??;
        starting
            .try_until("a 200 from /healthz", async || -> Result<Result<(), String>, String> {
                if let Some(status) = self.exited() {
                    return Ok(Err(format!("exited with {status}")));
                }
                match exchange(self.port, self.tls(), "GET", "/healthz", None, None).await {
                    Ok(response) if response.status == 200 => Ok(Ok(())),
                    Ok(response) => Err(format!("HTTP {}", response.status)),
                    Err(error) => Err(error.to_string()),
                }
            })
            .await?
    }

    /// The exit status, once the process has exited (it is then no longer held).
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut().and_then(|child| child.try_wait().ok().flatten())?;
        self.child = None;
        Some(status)
    }

    /// `kill -9`: no shutdown, no flush — what a power cut looks like to the process.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL herald"); // Child::kill is SIGKILL on Unix
            let _ = child.wait();
        }
    }

    /// SIGTERM, as a service manager stops it, and waits (up to 30 s) for the process to
    /// exit; returns whether it exited successfully.
    pub async fn terminate(&mut self) -> bool {
        self.signal("TERM");
        self.wait_exit().await
    }

    /// Waits (up to 30 s) for the process to exit; returns whether it exited successfully.
    pub async fn wait_exit(&mut self) -> bool {
        let mut child = self.child.take().expect("herald is running");
        let exited = poll()
            .within(Duration::from_secs(30))
            .every(Duration::from_millis(20))
            .try_until("herald to exit after SIGTERM", async || child.try_wait().expect("wait for herald"))
            .await;
        exited.unwrap_or_else(|timed_out| panic!("{timed_out}\n{}", self.log_tail())).success()
    }

    /// Sends `signal` (`STOP`, `CONT`, …) to the process, as `kill -<signal>` would.
    pub fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("herald is running");
        let status =
            Command::new("kill").args([format!("-{signal}"), child.id().to_string()]).status().expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|child| matches!(child.try_wait(), Ok(None)))
    }

    /// Starts the server again on the same data dir (on a new port: read `port` again).
    pub async fn restart(&mut self) {
        self.kill9();
        self.spawn().await;
    }

    /// Starts the server again on the same data dir and the same port, as a service
    /// manager restarts it behind a load balancer that lists its address (after a
    /// [`kill9`](Self::kill9) or [`terminate`](Self::terminate); kills it first if running).
    pub async fn restart_in_place(&mut self) {
        self.kill9();
        let listen = format!("127.0.0.1:{}", self.port);
        self.spawn_listening(&listen).await;
    }

    /// An HTTP request; panics only if the server does not answer at all.
    pub async fn request(&self, method: &str, path: &str, auth: Option<&str>, body: Option<&Value>) -> Response {
        self.request_text(method, path, auth, body.map(Value::to_string)).await
    }

    /// An HTTP request with a body given as text (which need not be valid JSON).
    pub async fn request_text(&self, method: &str, path: &str, auth: Option<&str>, body: Option<String>) -> Response {
        match exchange(self.port, self.tls(), method, path, auth, body).await {
            Ok(response) => response,
            Err(error) => panic!("{method} {path}: no HTTP answer: {error}\n{}", self.log_tail()),
        }
    }

    /// The value of the Prometheus sample `series` (name with labels) in `/metrics`, 0 when
    /// absent.
    pub async fn metric(&self, series: &str) -> f64 {
        let metrics = self.get("/metrics", None).await;
        assert_eq!(metrics.status, 200, "{metrics:?}");
        super::metric(&metrics.body, series)
    }

    /// Whether no backfill is under way here (`herald_delivery_backfills_unfinished`): a
    /// connection is resumed from only once its own backfill is over.
    pub async fn backfills_over(&self) -> bool {
        let metrics = self.get("/metrics", None).await;
        metrics.status == 200 && super::metric(&metrics.body, "herald_delivery_backfills_unfinished") == 0.0
    }

    pub async fn get(&self, path: &str, auth: Option<&str>) -> Response {
        self.request("GET", path, auth, None).await
    }

    pub async fn post(&self, path: &str, auth: Option<&str>, body: &Value) -> Response {
        self.request("POST", path, auth, Some(body)).await
    }

    /// `POST /v1/dev/token {"user"}` → the token.
    pub async fn dev_token(&self, user: &str) -> String {
        let response = self.post("/v1/dev/token", None, &serde_json::json!({ "user": user })).await;
        assert_eq!(response.status, 200, "POST /v1/dev/token: {response:?}\n{}", self.log_tail());
        response.json()["token"].as_str().map(str::to_owned).unwrap_or_else(|| panic!("no token in {response:?}"))
    }

    /// `POST /v1/groups {"id","members"}` with the dev api key; the conversation is
    /// `grp:<id>`.
    pub async fn create_group(&self, id: &str, members: &[&str]) {
        let response =
            self.post("/v1/groups", Some(DEV_KEY), &serde_json::json!({ "id": id, "members": members })).await;
        assert!(response.is_success(), "POST /v1/groups {id}: {response:?}\n{}", self.log_tail());
    }
}

impl Drop for Herald {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The last lines of a server log, for failure messages.
pub fn log_tail(path: &Path) -> String {
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(path) {
        let _ = file.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(40);
    format!("--- herald log (last {} lines) ---\n{}", lines.len() - start, lines[start..].join("\n"))
}

/// An HTTP response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The body as JSON; panics with the body when it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|error| panic!("HTTP {} body is not JSON ({error}): {:?}", self.status, self.body))
    }

    /// Asserts PROTOCOL.md's error shape `{"error":{"code","message"}}` with both non-empty,
    /// and returns the code.
    pub fn error_code(&self) -> String {
        let json = self.json();
        let code = json["error"]["code"].as_str().unwrap_or_default().to_owned();
        let message = json["error"]["message"].as_str().unwrap_or_default();
        assert!(
            !code.is_empty() && !message.is_empty(),
            "HTTP {} error body must be {{\"error\":{{\"code\",\"message\"}}}} with both set, got {}",
            self.status,
            self.body
        );
        code
    }
}

/// One HTTP/1.1 request over a fresh connection.
pub async fn http(
    port: u16,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: Option<String>,
) -> Result<Response, String> {
    exchange(port, None, method, path, auth, body).await
}

/// One HTTP/1.1 request over a fresh connection, over TLS with `tls` when given.
pub async fn exchange(
    port: u16,
    tls: Option<&Arc<ClientConfig>>,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: Option<String>,
) -> Result<Response, String> {
    let exchange = async {
        let tcp = TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| e.to_string())?;
        match tls {
            None => talk(tcp, port, method, path, auth, body).await,
            Some(config) => {
                let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
                let stream = tokio_rustls::TlsConnector::from(Arc::clone(config))
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("tls handshake: {e}"))?;
                talk(stream, port, method, path, auth, body).await
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(15), exchange).await.map_err(|_| "timed out after 15 s".to_owned())?
}

async fn talk(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    port: u16,
    method: &str,
    path: &str,
    auth: Option<&str>,
    body: Option<String>,
) -> Result<Response, String> {
    let payload = body.clone().unwrap_or_default();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    if let Some(token) = auth {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    if body.is_some() {
        head.push_str("Content-Type: application/json\r\n");
    }
    if body.is_some() || matches!(method, "POST" | "PUT") {
        head.push_str(&format!("Content-Length: {}\r\n", payload.len()));
    }
    head.push_str("\r\n");
    head.push_str(&payload);
    stream.write_all(head.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    if let Err(error) = stream.read_to_end(&mut raw).await {
        // A TLS peer that closes without close_notify: the response is whole all the same.
        if error.kind() != std::io::ErrorKind::UnexpectedEof || raw.is_empty() {
            return Err(error.to_string());
        }
    }
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> Result<Response, String> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no end of headers")?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or("empty response")?;
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        body = dechunk(&body)?;
    }
    Ok(Response { status, headers, body: String::from_utf8_lossy(&body).into_owned() })
}

fn dechunk(mut data: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n").ok_or("bad chunk header")?;
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| format!("bad chunk size {size_text:?}: {e}"))?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size {
            return Err("truncated chunk".into());
        }
        out.extend_from_slice(&data[..size]);
        data = data.get(size + 2..).unwrap_or_default();
    }
}
