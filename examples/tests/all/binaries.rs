//! The shipped binaries, end to end: two `herald-chat` processes talk through a relay, and
//! `herald-loadgen --compare-relay` runs against `herald-relay` processes, pairs and rooms.

use std::process::Stdio;

use herald_examples::relay::{Relay, RelayConfig};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines},
    process::{ChildStdout, Command},
};

use crate::STEP;

/// Reads lines until one contains `needle`; fails after [`STEP`].
async fn wait_for_line(lines: &mut Lines<BufReader<ChildStdout>>, needle: &str) -> String {
    let found = tokio::time::timeout(STEP, async {
        while let Some(line) = lines.next_line().await.expect("stdout readable") {
            if line.contains(needle) {
                return Some(line);
            }
        }
        None
    })
    .await
    .unwrap_or_else(|_| panic!("no line containing {needle:?} within {STEP:?}"));
    found.unwrap_or_else(|| panic!("stdout ended before a line containing {needle:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_terminal_clients_chat_through_the_relay() {
    let relay = Relay::spawn_local(RelayConfig::default()).await.expect("relay binds");
    let chat = env!("CARGO_BIN_EXE_herald-chat");

    let mut bob = Command::new(chat)
        .args(["--url", &relay.url(), "--user", "bob"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("herald-chat starts");
    let mut bob_out = BufReader::new(bob.stdout.take().expect("stdout")).lines();
    wait_for_line(&mut bob_out, "connected to").await;

    let mut alice = Command::new(chat)
        .args(["--url", &relay.url(), "--user", "alice", "--encoding", "json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("herald-chat starts");
    let mut alice_in = alice.stdin.take().expect("stdin");
    let mut alice_out = BufReader::new(alice.stdout.take().expect("stdout")).lines();
    wait_for_line(&mut alice_out, "connected to").await;
    alice_in.write_all(b"/to bob\nhello from alice\n").await.expect("type into alice");

    let line = wait_for_line(&mut bob_out, "hello from alice").await;
    assert_eq!(line, "[dm:alice:bob] alice: hello from alice");

    let mut bob_in = bob.stdin.take().expect("stdin");
    bob_in.write_all(b"/to alice\nhi alice\n/quit\n").await.expect("type into bob");
    let line = wait_for_line(&mut alice_out, "hi alice").await;
    assert_eq!(line, "[dm:alice:bob] bob: hi alice");

    // End of input: alice leaves once her sends are acknowledged.
    drop(alice_in);
    let status = tokio::time::timeout(STEP, alice.wait()).await.expect("alice exits").expect("status");
    assert!(status.success());
    let status = tokio::time::timeout(STEP, bob.wait()).await.expect("bob exits on /quit").expect("status");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadgen_compares_against_a_relay_process() {
    let relay_bin = env!("CARGO_BIN_EXE_herald-relay");
    // The "server" under test is a relay process too; --compare-relay starts another.
    let mut server = Command::new(relay_bin)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("herald-relay starts");
    let mut server_out = BufReader::new(server.stdout.take().expect("stdout")).lines();
    let line = wait_for_line(&mut server_out, "listening on").await;
    let url = line.rsplit(' ').next().expect("url").to_owned();

    let temp = tempfile::tempdir().expect("temp dir");
    let report = temp.path().join("report");
    let output = tokio::time::timeout(
        STEP * 3,
        Command::new(env!("CARGO_BIN_EXE_herald-loadgen"))
            .args(["--url", &url, "--users", "10", "--duration", "1s", "--warmup", "0s"])
            .args(["--quiet", "--compare-relay", "--relay-bin", relay_bin])
            .arg("--report")
            .arg(&report)
            .output(),
    )
    .await
    .expect("loadgen finishes")
    .expect("loadgen runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let last = stdout.lines().last().expect("output");
    let json: serde_json::Value = serde_json::from_str(last).expect("last line is JSON");
    assert!(json["herald"]["delivered_per_s"].as_f64().is_some_and(|r| r > 0.0), "{json}");
    assert!(json["relay"]["delivered_per_s"].as_f64().is_some_and(|r| r > 0.0), "{json}");
    assert!(json["ratio"]["delivered_per_s"].as_f64().is_some_and(|r| r > 0.0), "{json}");
    assert!(stdout.contains("herald/relay: throughput x"), "{stdout}");

    // --report: the run's page and charts, the relay's beside them.
    for file in ["index.html", "throughput.svg", "latency.svg", "relay/index.html", "relay/latency.svg"] {
        assert!(report.join(file).is_file(), "{file} written");
    }
    let summary = std::fs::read_to_string(report.join("summary.json")).expect("summary.json");
    let summary: serde_json::Value = serde_json::from_str(&summary).expect("summary is JSON");
    assert_eq!(summary["parameters"]["users"], 10);
    assert!(summary["relay"]["ratio"]["delivered_per_s"].as_f64().is_some_and(|r| r > 0.0), "{summary}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("report: "), "{stderr}");
}

#[tokio::test]
async fn loadgen_refuses_remote_targets() {
    let output = Command::new(env!("CARGO_BIN_EXE_herald-loadgen"))
        .args(["--url", "ws://192.0.2.1:7070/v1/ws", "--quiet"])
        .output()
        .await
        .expect("loadgen runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not a loopback address"), "{stderr}");
    let output = Command::new(env!("CARGO_BIN_EXE_herald-loadgen"))
        .args(["--url", "ws://192.0.2.1:7070/v1/ws", "--rooms", "1", "--subscribers", "10", "--quiet"])
        .output()
        .await
        .expect("loadgen runs");
    assert_eq!(output.status.code(), Some(2), "room mode refuses a remote target too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadgen_room_mode_compares_against_the_relays_broadcast() {
    let relay = Relay::spawn_local(RelayConfig::default()).await.expect("relay binds");
    let output = tokio::time::timeout(
        STEP * 3,
        Command::new(env!("CARGO_BIN_EXE_herald-loadgen"))
            .args(["--url", &relay.url(), "--rooms", "2", "--subscribers", "20", "--publish-rate", "200"])
            .args(["--duration", "1s", "--warmup", "0s", "--quiet", "--compare-relay"])
            .args(["--relay-bin", env!("CARGO_BIN_EXE_herald-relay")])
            .output(),
    )
    .await
    .expect("loadgen finishes")
    .expect("loadgen runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().expect("output")).expect("JSON");
    for run in ["herald", "relay"] {
        assert_eq!(json[run]["rooms"]["missing_deliveries"], 0, "{json}");
        // 200 msg/s into rooms of 10 subscribers: about 2,000 deliveries a second.
        let rate = json[run]["delivered_per_s"].as_f64().unwrap_or(0.0);
        assert!((1500.0..=2500.0).contains(&rate), "{run}: {rate} deliveries/s: {json}");
    }
    assert!(json["ratio"]["delivered_per_s"].as_f64().is_some_and(|r| r > 0.5), "{json}");
    assert!(stdout.contains("herald/relay: throughput x"), "{stdout}");
}
