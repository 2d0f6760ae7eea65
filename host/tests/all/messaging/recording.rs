//! Record and replay end to end: a scripted session's plugin calls recorded through the
//! admin API, then `herald plugin replay` run on the recording against the same plugin
//! (clean, exit 0) and a changed one (exactly the changed decisions, exit non-zero).

use std::process::Command;

use serde_json::json;

use super::client::Client;
use super::hostile::guest;
use super::server::Herald;
use crate::support::poll;

fn replay(plugin: &str, recording: &str) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_herald"))
        .env("RUST_LOG", "warn")
        .args(["plugin", "replay"])
        .arg(guest(plugin))
        .arg(recording)
        .output()
        .expect("running herald plugin replay");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_session_replays_clean_on_its_plugin_and_shows_the_changes_of_another() {
    let dir = tempfile::tempdir().expect("plugins dir");
    std::fs::copy(guest("echo_v1"), dir.path().join("echo.wasm")).expect("copy echo");
    let herald = Herald::with().set("PLUGINS", dir.path().display()).start().await;

    let unknown = herald.post("/admin/plugins/nope/recording", Some("dev-key"), &json!({})).await;
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    let no_key = herald.post("/admin/plugins/echo/recording", None, &json!({})).await;
    assert_eq!(no_key.status, 401, "{}", no_key.body);
    let bad = herald.post("/admin/plugins/echo/recording", Some("dev-key"), &json!({ "every": 0 })).await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    let started = herald.post("/admin/plugins/echo/recording", Some("dev-key"), &json!({ "every": 1 })).await;
    assert_eq!(started.status, 200, "{}", started.body);
    let file = started.json()["recording"]["file"].as_str().expect("the recording's file").to_owned();
    let twice = herald.post("/admin/plugins/echo/recording", Some("dev-key"), &json!({})).await;
    assert_eq!(twice.status, 409, "{}", twice.body);

    // The scripted session: six sends, two of which the plugin rewrites.
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    for body in ["hi", "version?", "how are you", "version?", "bye", "later"] {
        alice.send_ok("dm:alice:bob", body).await;
    }
    let stopped = herald.request("DELETE", "/admin/plugins/echo/recording", Some("dev-key"), None).await;
    assert_eq!(stopped.status, 200, "{}", stopped.body);
    assert_eq!(stopped.json()["recording"]["records"], 6, "{}", stopped.body);
    let gone = herald.request("DELETE", "/admin/plugins/echo/recording", Some("dev-key"), None).await;
    assert_eq!(gone.status, 404, "{}", gone.body);
    // The writer thread writes out what was queued after the stop.
    poll::until("the header and six records written out", async || {
        match std::fs::read_to_string(&file).map(|text| text.lines().count()).unwrap_or(0) {
            7 => Ok(()),
            lines => Err(format!("{lines} lines")),
        }
    })
    .await;

    let (ok, stdout, stderr) = replay("echo_v1", &file);
    assert!(ok, "the same plugin replays clean:\n{stdout}\n{stderr}");
    assert!(stdout.contains("6 replayed, 0 skipped") && stdout.contains("0 differ"), "{stdout}");

    let (ok, stdout, stderr) = replay("echo_v2", &file);
    assert!(!ok, "a changed plugin fails the replay:\n{stdout}");
    assert!(stdout.contains("2 differ"), "{stdout}");
    assert_eq!(stdout.matches("\nline ").count(), 2, "{stdout}");
    assert!(stderr.contains("2 of 6 replayed decisions differ"), "{stderr}");
}
