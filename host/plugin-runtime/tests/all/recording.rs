//! Record and replay: a plugin's calls recorded while it serves (sampled and bounded), then
//! replayed through the same plugin (no difference) and a changed one (exactly the changed
//! decisions).

use crate::support::poll;
use crate::support::{TestHost, built, install, message, no_quarantine};
use herald_plugin_runtime::{
    CallInput, CallOutput, Hook, PluginError, RecordingError, RecordingOptions, replay, types::MessageDecision,
};
use std::path::Path;

/// Lines of a recording after the header, parsed.
fn records(file: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(file).expect("reading the recording");
    let mut lines = text.lines();
    let header: serde_json::Value = serde_json::from_str(lines.next().expect("a header")).expect("header JSON");
    assert_eq!(header["recording"], 1);
    lines.map(|line| serde_json::from_str(line).expect("record JSON")).collect()
}

/// Stops the recording and waits until the writer thread has written what was queued.
async fn finish(t: &TestHost, name: &str, expected_records: usize) -> std::path::PathBuf {
    let status = t.host.stop_recording(name).expect("a running recording");
    assert_eq!(status.records as usize, expected_records, "{status:?}");
    written_out(&status.file, expected_records).await;
    status.file
}

/// Waits until the writer thread has written the header and `records` records to `file`.
async fn written_out(file: &Path, records: usize) {
    poll::until(&format!("{} written out", file.display()), async || {
        match std::fs::read_to_string(file).map(|text| text.lines().count()).unwrap_or(0) {
            lines if lines == records + 1 => Ok(()),
            lines => Err(format!("{lines} lines")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recording_replays_clean_on_the_same_plugin_and_shows_exactly_the_changed_decisions() {
    let t = TestHost::new(no_quarantine());
    install(t.path(), "echo-v1", "echo", None);
    t.load().await;
    let out = tempfile::tempdir().expect("recordings dir");
    let file = out.path().join("echo.jsonl");
    t.host.start_recording("echo", file.clone(), RecordingOptions::default()).expect("recording starts");
    // A second recording of the same plugin is refused while this one runs.
    let again = t.host.start_recording("echo", out.path().join("again.jsonl"), RecordingOptions::default());
    assert!(matches!(again, Err(RecordingError::AlreadyRecording { .. })), "{again:?}");
    for n in 0..10 {
        let body = if n % 3 == 0 { "version?" } else { "hello" };
        t.host.message_policy(&message("alice", "dm:alice:bob", body)).await;
    }
    let file = finish(&t, "echo", 10).await;
    let lines = records(&file);
    assert_eq!(lines[0]["hook"], "message-policy");
    assert_eq!(lines[0]["output"], serde_json::json!({ "message": { "Rewrite": b"echo-v1".to_vec() } }));
    assert_eq!(lines[1]["output"], serde_json::json!({ "message": "Allow" }));

    let same = replay(built().guests.join("echo_v1.wasm"), &file).await.expect("replay");
    assert_eq!((same.records, same.replayed, same.skipped), (10, 10, 0));
    assert!(same.differences.is_empty(), "{:?}", same.differences);

    let changed = replay(built().guests.join("echo_v2.wasm"), &file).await.expect("replay");
    let lines: Vec<usize> = changed.differences.iter().map(|d| d.line).collect();
    assert_eq!(lines, [2, 5, 8, 11], "the `version?` calls, lines after the header");
    let first = &changed.differences[0];
    assert_eq!(first.call.hook(), Hook::MessagePolicy);
    assert_eq!(first.recorded, CallOutput::Message(MessageDecision::Rewrite(b"echo-v1".to_vec())));
    assert_eq!(first.replayed, CallOutput::Message(MessageDecision::Rewrite(b"echo-v2".to_vec())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recording_is_sampled_bounded_and_can_redact_bodies() {
    let t = TestHost::new(no_quarantine());
    install(t.path(), "echo-v1", "echo", None);
    t.load().await;
    let out = tempfile::tempdir().expect("recordings dir");
    let options = RecordingOptions { every: 2, max_records: 3, redact_bodies: true, ..RecordingOptions::default() };
    t.host.start_recording("echo", out.path().join("sampled.jsonl"), options).expect("recording starts");
    for _ in 0..20 {
        t.host.message_policy(&message("alice", "dm:alice:bob", "secret words")).await;
    }
    let status = t.host.plugin_status("echo").and_then(|s| s.recording).expect("a recording status");
    assert!(!status.active, "it ended at max_records: {status:?}");
    assert_eq!(status.records, 3);
    assert!(status.ended.as_deref().is_some_and(|why| why.contains("max_records")), "{status:?}");
    written_out(&status.file, 3).await;
    let lines = records(&status.file);
    assert_eq!(lines.len(), 3);
    assert!(lines.iter().all(|l| l["input"]["body"] == serde_json::json!([])), "{lines:?}");
    // Bad options and unknown plugins are refused, and nothing is created.
    let zero = RecordingOptions { every: 0, ..RecordingOptions::default() };
    let refused = t.host.start_recording("echo", out.path().join("zero.jsonl"), zero);
    assert!(matches!(refused, Err(RecordingError::BadOptions(ref why)) if why.contains("every")), "{refused:?}");
    let unknown = t.host.start_recording("nope", out.path().join("nope.jsonl"), RecordingOptions::default());
    assert!(matches!(unknown, Err(RecordingError::NotLoaded(_))), "{unknown:?}");
    assert!(!out.path().join("zero.jsonl").exists() && !out.path().join("nope.jsonl").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_skips_hooks_the_plugin_lacks_and_names_the_line_of_a_bad_record() {
    let dir = tempfile::tempdir().expect("dir");
    let header = r#"{"recording":1,"plugin":"x","version":"1","contract":"0.2.0","content_hash":"sha256:00","started_ms":1,"every":1,"redacted_bodies":false}"#;
    let route = CallInput::RouteKey(herald_plugin_runtime::types::RouteRequest {
        command: herald_plugin_runtime::types::CommandKind::Send,
        user: "alice".into(),
        conversation: None,
    });
    let record = serde_json::json!({ "at_ms": 5, "hook": "route-key", "input": route_input(&route), "output": { "route": null } });
    let good = dir.path().join("good.jsonl");
    std::fs::write(&good, format!("{header}\n{record}\n")).expect("write");
    let report = replay(built().guests.join("echo_v1.wasm"), &good).await.expect("replay");
    assert_eq!((report.records, report.replayed, report.skipped), (1, 0, 1));

    let broken = dir.path().join("broken.jsonl");
    std::fs::write(&broken, format!("{header}\n{record}\n{{\"at_ms\": \"soon\"}}\n")).expect("write");
    let error = replay(built().guests.join("echo_v1.wasm"), &broken).await.expect_err("a bad line");
    assert!(matches!(&error, PluginError::Recording { .. }) && error.to_string().contains("line 3"), "{error}");
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").expect("write");
    let error = replay(built().guests.join("echo_v1.wasm"), &empty).await.expect_err("no header");
    assert!(error.to_string().contains("empty"), "{error}");
}

fn route_input(call: &CallInput) -> serde_json::Value {
    serde_json::to_value(call).expect("serializable")["input"].clone()
}
