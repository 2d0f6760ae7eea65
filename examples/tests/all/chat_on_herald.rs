//! `herald-chat` against a real Herald: the debug `herald` binary of this workspace
//! (`HERALD_BIN` picks another) in embedded mode on a temporary SQLite file, with dev tokens.
//! What is asserted is what the people at the terminals see.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::STEP;

/// One Herald node on a data dir of its own, stopped when dropped.
struct Herald {
    dir: tempfile::TempDir,
    _process: Child,
    port: u16,
}

impl Herald {
    /// `herald serve --dev` on port 0; waits for the port it reports.
    async fn start() -> Self {
        let dir = tempfile::Builder::new().prefix("herald-chat-").tempdir().expect("a temporary dir");
        let listen_file = dir.path().join("listen");
        let log = std::fs::File::create(dir.path().join("stderr.log")).expect("a log file");
        let mut command = Command::new(herald_bin());
        command
            .args(["serve", "--dev", "--listen", "127.0.0.1:0", "--listen-file"])
            .arg(&listen_file)
            .arg("--data-dir")
            .arg(dir.path().join("data"));
        // Herald refuses HERALD_* variables it does not know, such as HERALD_BIN.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HERALD_") {
                command.env_remove(key);
            }
        }
        command.env("RUST_LOG", "warn").stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).kill_on_drop(true);
        let mut process = command.spawn().expect("herald starts");
        let log = || std::fs::read_to_string(dir.path().join("stderr.log")).unwrap_or_default();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let port = loop {
            if let Ok(text) = std::fs::read_to_string(&listen_file)
                && let Some(port) = text.trim().rsplit(':').next().and_then(|port| port.parse().ok())
            {
                break port;
            }
            if let Ok(Some(status)) = process.try_wait() {
                panic!("herald exited with {status}:\n{}", log());
            }
            assert!(tokio::time::Instant::now() < deadline, "herald did not come up:\n{}", log());
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Self { dir, _process: process, port }
    }

    fn url(&self) -> String {
        format!("ws://127.0.0.1:{}/v1/ws", self.port)
    }
}

impl Drop for Herald {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default();
            eprintln!("herald's log:\n{log}");
        }
    }
}

/// The Herald binary: `$HERALD_BIN` (relative to the workspace root), else the debug build
/// of this workspace. Missing: fail, never skip.
fn herald_bin() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let built = || {
        let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
        target.join("debug/herald")
    };
    let bin = std::env::var_os("HERALD_BIN").map_or_else(built, PathBuf::from);
    let bin = if bin.is_absolute() { bin } else { root.join(bin) };
    assert!(
        bin.exists(),
        "no Herald binary at {}: build it (cargo build -p herald-host --bin herald) or set HERALD_BIN to its path",
        bin.display()
    );
    bin
}

/// A `herald-chat` process: what is typed into it and what it prints.
struct Chat {
    process: Child,
    input: Option<ChildStdin>,
    output: Lines<BufReader<ChildStdout>>,
}

impl Chat {
    /// Starts `herald-chat` for `user` (device `cli`, dev token) and waits until it connected.
    async fn start(herald: &Herald, user: &str, extra: &[&str]) -> Self {
        let mut process = Command::new(env!("CARGO_BIN_EXE_herald-chat"))
            .args(["--url", &herald.url(), "--user", user])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("herald-chat starts");
        let input = process.stdin.take();
        let output = BufReader::new(process.stdout.take().expect("stdout")).lines();
        let mut chat = Self { process, input, output };
        chat.until("connected to").await;
        chat
    }

    async fn type_lines(&mut self, lines: &str) {
        let input = self.input.as_mut().expect("stdin still open");
        input.write_all(lines.as_bytes()).await.expect("type into herald-chat");
    }

    /// Every line printed up to and including the first one that contains `needle`; fails
    /// after [`STEP`].
    async fn until(&mut self, needle: &str) -> Vec<String> {
        let mut printed = Vec::new();
        let found = tokio::time::timeout(STEP, async {
            while let Some(line) = self.output.next_line().await.expect("stdout readable") {
                let found = line.contains(needle);
                printed.push(line);
                if found {
                    return true;
                }
            }
            false
        })
        .await;
        match found {
            Ok(true) => printed,
            Ok(false) => panic!("herald-chat ended before printing {needle:?}; it printed {printed:#?}"),
            Err(_) => panic!("herald-chat did not print {needle:?} within {STEP:?}; it printed {printed:#?}"),
        }
    }

    /// Types `/quit` and waits for the exit.
    async fn quit(mut self) -> ExitStatus {
        self.type_lines("/quit\n").await;
        drop(self.input.take());
        tokio::time::timeout(STEP, self.process.wait()).await.expect("herald-chat exits on /quit").expect("status")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_terminal_clients_chat_through_herald() {
    let herald = Herald::start().await;
    let mut bob = Chat::start(&herald, "bob", &[]).await;
    let mut alice = Chat::start(&herald, "alice", &["--encoding", "json"]).await;

    alice.type_lines("/to bob\nhello from alice\n").await;
    let printed = bob.until("hello from alice").await;
    assert_eq!(printed.last().map(String::as_str), Some("[dm:alice:bob] alice: hello from alice"));

    bob.type_lines("/to alice\nhi alice\n").await;
    let printed = alice.until("hi alice").await;
    assert_eq!(printed.last().map(String::as_str), Some("[dm:alice:bob] bob: hi alice"));

    assert!(alice.quit().await.success());
    assert!(bob.quit().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_sent_while_bob_is_away_shows_when_he_starts_and_nothing_read_shows_again() {
    let herald = Herald::start().await;
    let mut bob = Chat::start(&herald, "bob", &[]).await;
    // --verbose: alice's terminal confirms each message once the server stored it.
    let mut alice = Chat::start(&herald, "alice", &["--to", "bob", "--verbose"]).await;
    alice.type_lines("read before leaving\n").await;
    alice.until("(sent to dm:alice:bob as seq").await;
    bob.until("alice: read before leaving").await;
    assert!(bob.quit().await.success());

    alice.type_lines("sent while you were away\n").await;
    alice.until("(sent to dm:alice:bob as seq").await;

    // Bob starts herald-chat again, on the same device: the message is waiting for him. Shown
    // in seq order, a replay of the message he had read would come before it.
    let mut bob = Chat::start(&herald, "bob", &[]).await;
    let printed = bob.until("sent while you were away").await;
    assert_eq!(printed.last().map(String::as_str), Some("[dm:alice:bob] alice: sent while you were away"));
    assert!(
        !printed.iter().any(|line| line.contains("read before leaving")),
        "a message read before leaving is not shown again: {printed:#?}"
    );
    assert!(alice.quit().await.success());
    assert!(bob.quit().await.success());
}
