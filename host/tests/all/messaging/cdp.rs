//! Headless Chromium driven over the Chrome DevTools Protocol (flattened sessions on the
//! browser's WebSocket), with nothing but tokio-tungstenite: open pages in separate browser
//! contexts, evaluate JavaScript in them, type and click as a person would, and take
//! screenshots.
//!
//! Chromium comes from Debian's `chromium` package (`/usr/bin/chromium`, or the path in
//! `HERALD_TEST_CHROMIUM`). When it is missing the test fails and says how to install it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::support::poll::poll;

/// A headless Chromium process and a DevTools connection to it; killed on drop.
pub struct Browser {
    child: Child,
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    root: tempfile::TempDir,
}

/// A tab, in a browser context of its own (so pages share no storage).
#[derive(Debug, Clone)]
pub struct Page {
    session: String,
    /// For failure messages.
    pub label: String,
}

impl Browser {
    /// Starts Chromium; panics with the install line when it is not there.
    pub async fn launch() -> Self {
        let binary = std::env::var("HERALD_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
        assert!(
            std::path::Path::new(&binary).exists(),
            "the web page test needs headless Chromium, and {binary} does not exist: install it with \
             `apt-get install -y chromium` (or set HERALD_TEST_CHROMIUM to a Chromium binary)"
        );
        let root = tempfile::tempdir().expect("temp dir for Chromium");
        let profile = root.path().join("profile");
        let log = std::fs::File::create(root.path().join("chromium.log")).expect("Chromium log file");
        let child = Command::new(&binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--no-default-browser-check",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {binary}: {error}"));
        let mut browser_child = ChildGuard(Some(child));
        // Chromium writes the port it chose and the browser's DevTools path to this file.
        let active_port = profile.join("DevToolsActivePort");
        let opened = poll().within(Duration::from_secs(30)).every(Duration::from_millis(50));
        let url = opened.try_until("Chromium to open DevTools", async || {
            if let Some(Ok(Some(status))) = browser_child.0.as_mut().map(Child::try_wait) {
                panic!(
                    "Chromium exited with {status} before opening DevTools\n{}",
                    chromium_log(&root.path().join("chromium.log"))
                );
            }
            let text = std::fs::read_to_string(&active_port).unwrap_or_default();
            let mut lines = text.lines();
            match (lines.next(), lines.next()) {
                (Some(port), Some(path)) => Some(format!("ws://127.0.0.1:{port}{path}")),
                _ => None,
            }
        });
        let url = url
            .await
            .unwrap_or_else(|timed_out| panic!("{timed_out}\n{}", chromium_log(&root.path().join("chromium.log"))));
        let (ws, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .unwrap_or_else(|error| panic!("cannot open the DevTools WebSocket {url}: {error}"));
        let child = browser_child.0.take().expect("child still owned");
        Self { child, ws, next_id: 1, root }
    }

    /// Calls a DevTools method (in a page's session, or on the browser) and returns its
    /// result; a protocol error panics.
    pub async fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let mut command = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            command["sessionId"] = json!(session);
        }
        self.ws.send(Message::text(command.to_string())).await.expect("send a DevTools command");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let message = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("DevTools {method} did not answer within 30 s"))
                .unwrap_or_else(|| panic!("the DevTools connection ended during {method}"))
                .unwrap_or_else(|error| panic!("the DevTools connection failed during {method}: {error}"));
            let Message::Text(text) = message else { continue };
            let reply: Value = serde_json::from_str(text.as_str()).expect("DevTools sends JSON");
            if reply["id"].as_u64() != Some(id) {
                continue; // an event, or another reply
            }
            if let Some(error) = reply.get("error") {
                panic!("DevTools {method} failed: {error}");
            }
            return reply["result"].clone();
        }
    }

    /// Opens `url` in a new tab of a new browser context.
    pub async fn open(&mut self, url: &str, label: &str) -> Page {
        let context = self.call(None, "Target.createBrowserContext", json!({})).await;
        let context = context["browserContextId"].as_str().expect("browserContextId").to_owned();
        let target = self.call(None, "Target.createTarget", json!({ "url": url, "browserContextId": context })).await;
        let target = target["targetId"].as_str().expect("targetId").to_owned();
        let attached = self.call(None, "Target.attachToTarget", json!({ "targetId": target, "flatten": true })).await;
        let session = attached["sessionId"].as_str().expect("sessionId").to_owned();
        Page { session, label: label.to_owned() }
    }

    /// Evaluates `expression` in the page (promises awaited) and returns its value;
    /// `Err` with the exception text if it threw.
    pub async fn eval(&mut self, page: &Page, expression: &str) -> Result<Value, String> {
        let result = self
            .call(
                Some(&page.session),
                "Runtime.evaluate",
                json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
            )
            .await;
        if let Some(exception) = result.get("exceptionDetails") {
            return Err(exception.to_string());
        }
        Ok(result["result"]["value"].clone())
    }

    /// Evaluates `expression` and panics if it throws.
    pub async fn run(&mut self, page: &Page, expression: &str) -> Value {
        match self.eval(page, expression).await {
            Ok(value) => value,
            Err(exception) => panic!("{}: `{expression}` threw {exception}", page.label),
        }
    }

    /// Polls `expression` until it is truthy; returns its value. On timeout, panics with
    /// `what` and the page's own log (`#log`).
    pub async fn wait_until(&mut self, page: &Page, expression: &str, what: &str, timeout: Duration) -> Value {
        let truthy = poll().within(timeout).every(Duration::from_millis(100)).try_until(what, async || {
            let value = self.eval(page, expression).await.unwrap_or(Value::Null);
            let truthy = match &value {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::String(s) => !s.is_empty(),
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::Array(_) | Value::Object(_) => true,
            };
            if truthy { Ok(value) } else { Err(value) }
        });
        match truthy.await {
            Ok(value) => value,
            Err(timed_out) => {
                let log = self
                    .eval(
                        page,
                        "document.getElementById('log') ? document.getElementById('log').innerText : '(no #log)'",
                    )
                    .await
                    .unwrap_or_default();
                let messages = self
                    .eval(page, "document.getElementById('messages') ? document.getElementById('messages').innerText : '(no #messages)'")
                    .await
                    .unwrap_or_default();
                panic!(
                    "{}: {timed_out}\npage log: {log}\npage messages: {messages}\nChromium log:\n{}",
                    page.label,
                    chromium_log(&self.log_path())
                );
            }
        }
    }

    /// Types `value` into the input `#id` (as a person would, with input and change
    /// events).
    pub async fn type_into(&mut self, page: &Page, id: &str, value: &str) {
        let script = format!(
            "(() => {{ const el = document.getElementById({id}); if (!el) throw new Error('no #' + {id}); \
             el.focus(); el.value = {value}; el.dispatchEvent(new Event('input', {{ bubbles: true }})); \
             el.dispatchEvent(new Event('change', {{ bubbles: true }})); return true; }})()",
            id = js_string(id),
            value = js_string(value)
        );
        self.run(page, &script).await;
    }

    /// Clicks `#id` once it is there and enabled.
    pub async fn click(&mut self, page: &Page, id: &str) {
        let enabled = format!(
            "(() => {{ const el = document.getElementById({0}); return !!el && !el.disabled; }})()",
            js_string(id)
        );
        self.wait_until(page, &enabled, &format!("#{id} to be enabled"), Duration::from_secs(20)).await;
        self.run(page, &format!("document.getElementById({}).click(), true", js_string(id))).await;
    }

    /// Renders the page at `width`×`height` CSS pixels (the whole page, if longer) and
    /// writes it to `path` as PNG.
    pub async fn screenshot(&mut self, page: &Page, width: u32, height: u32, path: &std::path::Path) {
        use base64::Engine as _;
        let viewport = json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false });
        self.call(Some(&page.session), "Emulation.setDeviceMetricsOverride", viewport).await;
        let shot = self
            .call(
                Some(&page.session),
                "Page.captureScreenshot",
                json!({ "format": "png", "captureBeyondViewport": true }),
            )
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("a base64 screenshot");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("screenshot folder");
        }
        std::fs::write(path, png).unwrap_or_else(|error| panic!("cannot write {}: {error}", path.display()));
    }

    fn log_path(&self) -> PathBuf {
        self.root.path().join("chromium.log")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kills Chromium if launching fails half-way.
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn chromium_log(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// A JavaScript string literal for `text`.
pub fn js_string(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}
