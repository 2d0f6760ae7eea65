//! The word filter in Rust (`tests/guests/word-filter`), Python (`guests/python`) and
//! JavaScript (`guests/javascript`), each loaded into a real host with the same manifest,
//! gives the same answer to every case of one table: the other languages implement the
//! contract exactly as the Rust SDK does.
//!
//! The Python and JavaScript components are built by `scripts/lib.sh`'s
//! `build_language_guests` (which installs componentize-py and jco from the project's pinned
//! files under `target/language-guests`); this test runs it once per test run, and fails,
//! saying so, when it cannot.

use crate::support::{TestHost, built, message};
use herald_plugin_runtime::{
    PluginHostConfig, PluginState,
    types::{Message, MessageDecision, Rejection},
};
use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

/// One word filter: a language and its built component.
pub struct Guest {
    /// For failure messages.
    pub language: &'static str,
    /// The component.
    pub wasm: PathBuf,
}

/// The folder `build_language_guests` writes the Python and JavaScript components to.
fn language_guests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/language-guests")
}

/// Runs `build_language_guests` once per test run (a no-op when the components are newer
/// than their sources) and panics, naming the script, when it fails.
fn build_language_guests() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let out = Command::new("bash")
            .args(["-c", ". scripts/lib.sh && build_language_guests"])
            .current_dir(&root)
            .output()
            .expect("running bash to build the Python and JavaScript guests");
        let dir = language_guests_dir();
        assert!(
            out.status.success(),
            "building the Python and JavaScript word filters failed; run \
             `bash -c '. scripts/lib.sh && build_language_guests'` (scripts/test.sh does) and fix what it \
             reports (it needs python3 with venv, node and npm, and PyPI and npm reachable):\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for file in ["word_filter_py.wasm", "word_filter_js.wasm"] {
            assert!(
                dir.join(file).is_file(),
                "{} is missing after build_language_guests; run `bash -c '. scripts/lib.sh && build_language_guests'`",
                dir.join(file).display()
            );
        }
        dir
    })
}

/// The three word filters: Rust, Python, JavaScript.
pub fn word_filters() -> Vec<Guest> {
    let languages = build_language_guests();
    vec![
        Guest { language: "Rust", wasm: built().guests.join("word_filter.wasm") },
        Guest { language: "Python", wasm: languages.join("word_filter_py.wasm") },
        Guest { language: "JavaScript", wasm: languages.join("word_filter_js.wasm") },
    ]
}

/// The manifest all three load with (`tests/guests/word-filter/plugin.toml`, which says why
/// `memory_mib` is 64).
pub const MANIFEST: &str = include_str!("../guests/word-filter/plugin.toml");

/// Loads `guest` as `word-filter` with `manifest` into a fresh host.
async fn load(guest: &Guest, manifest: &str) -> TestHost {
    let t = TestHost::new(PluginHostConfig::default());
    std::fs::copy(&guest.wasm, t.path().join("word-filter.wasm"))
        .unwrap_or_else(|e| panic!("copying {} ({}): {e}", guest.wasm.display(), guest.language));
    std::fs::write(t.path().join("word-filter.toml"), manifest).expect("writing the manifest");
    t.load().await;
    let status = t.status("word-filter");
    assert_eq!(status.state, PluginState::Active, "the {} word filter did not load: {status:?}", guest.language);
    t
}

fn blocked(word: &str) -> MessageDecision {
    MessageDecision::Reject(Rejection {
        code: "blocked-word".into(),
        reason: format!("messages may not contain `{word}`"),
        retry_after_ms: None,
    })
}

fn bytes(body: &[u8]) -> Message {
    Message { body: body.to_vec(), ..message("alice", "room:lobby", "") }
}

/// The behaviour every word filter must show, with `MANIFEST`'s config.
fn cases() -> Vec<(&'static str, Message, MessageDecision)> {
    vec![
        ("a blocked word is rejected", message("alice", "room:lobby", "buy spam now"), blocked("spam")),
        ("matching ignores case", message("alice", "room:lobby", "Buy SPAM Now"), blocked("spam")),
        ("a word inside another matches", message("bob", "dm:alice:bob", "scammers"), blocked("scam")),
        ("the first configured word wins", message("alice", "room:lobby", "scam and spam"), blocked("spam")),
        ("a clean message is allowed", message("alice", "room:lobby", "hello there"), MessageDecision::Allow),
        ("an empty body is allowed", message("alice", "room:lobby", ""), MessageDecision::Allow),
        ("non-ASCII words match case-insensitively", message("alice", "room:lobby", "VIELE GRÜẞE"), blocked("grüße")),
        (
            "invalid UTF-8 around a blocked word is replaced, the word still matches",
            bytes(b"\xff\xfe spam \xc3\x28"),
            blocked("spam"),
        ),
        ("an invalid byte inside a word breaks it", bytes(b"sp\xffam sc\x80am"), MessageDecision::Allow),
        ("a body of invalid bytes only is allowed", bytes(&[0xc0, 0xff, 0xfe, 0x80]), MessageDecision::Allow),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_javascript_word_filters_answer_every_case_as_the_rust_one_does() {
    for guest in word_filters() {
        let t = load(&guest, MANIFEST).await;
        for (case, message, expected) in cases() {
            let decision = t.host.message_policy(&message).await;
            assert_eq!(decision, expected, "{} word filter: {case}", guest.language);
        }
        // Each call on a fresh instance too: configuration is read per instance.
        for (case, message, expected) in cases().into_iter().take(3) {
            assert!(t.host.drain_pool("word-filter"));
            let decision = t.host.message_policy(&message).await;
            assert_eq!(decision, expected, "{} word filter, fresh instance: {case}", guest.language);
        }
        let status = t.status("word-filter");
        assert_eq!(status.failures, 0, "{} word filter failed calls: {status:?}", guest.language);
        assert_eq!(status.calls, cases().len() as u64 + 3, "{}: {status:?}", guest.language);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_blocked_words_every_word_filter_allows_everything() {
    // No `[config]` at all: `config()` answers an empty document. (Each load compiles the
    // component again, tens of MiB for Python and JavaScript, so the cases share one.)
    let no_config = r#"
name = "word-filter"
[limits]
memory_mib = 64
deadline_ms = 1000
"#;
    for guest in word_filters() {
        let t = load(&guest, no_config).await;
        for body in ["buy spam now", "SCAM", "grüße", ""] {
            let decision = t.host.message_policy(&message("alice", "room:lobby", body)).await;
            assert_eq!(decision, MessageDecision::Allow, "{} word filter without config: {body:?}", guest.language);
        }
        assert_eq!(t.status("word-filter").failures, 0, "{}", guest.language);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_python_and_javascript_examples_load_with_their_manifests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for guest in word_filters().into_iter().skip(1) {
        let folder = if guest.language == "Python" { "guests/python" } else { "guests/javascript" };
        let manifest = std::fs::read_to_string(root.join(folder).join("word-filter/plugin.toml"))
            .unwrap_or_else(|e| panic!("reading {folder}/word-filter/plugin.toml: {e}"));
        let t = load(&guest, &manifest).await;
        let decision = t.host.message_policy(&message("alice", "room:lobby", "a SCAM")).await;
        assert_eq!(decision, blocked("scam"), "{} example with its own manifest", guest.language);
        assert_eq!(t.host.message_policy(&message("alice", "room:lobby", "hi")).await, MessageDecision::Allow);
    }
}
