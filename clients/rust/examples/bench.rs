//! The Rust library's throughput against one local Herald node, the same measurements as the
//! TypeScript library's `npm run bench` so the two can be compared on one machine
//! (`scripts/client-bench.sh` runs both):
//!
//!   HERALD_BIN=target/release/herald cargo run --release -p herald-client --example bench
//!
//! Every send is awaited: a send counts once the server stored it (OK). Two rounds: the
//! server's and the client's default limits (one connection may send 1,000 sends/s,
//! `intake.sends_per_connection`; the client writes at most 1,800 frames/s), then with
//! those limits off, which measures the client and the node themselves.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use herald_client::{Client, ClientOptions, Encoding, Event, MemorySeqStore};
use tokio::process::{Child, Command};

const SEQUENTIAL: usize = 1_000;

struct Round {
    label: &'static str,
    in_flight_total: usize,
    receive_total: usize,
    /// The client's `max_frames_per_second` (0: no limit).
    frames_per_second: u32,
    env: &'static [(&'static str, &'static str)],
    encodings: &'static [(Encoding, &'static str)],
}

/// A dev-mode Herald on a temporary data dir; killed on drop.
struct Herald {
    _dir: tempfile::TempDir,
    _child: Child,
    url: String,
}

impl Herald {
    async fn start(bin: &PathBuf, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("a temporary dir");
        let listen = dir.path().join("listen");
        let mut command = Command::new(bin);
        command.args(["serve", "--dev", "--listen", "127.0.0.1:0", "--listen-file"]).arg(&listen);
        command.arg("--data-dir").arg(dir.path().join("data"));
        // Only this round's HERALD_* settings: Herald refuses unknown HERALD_* variables.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HERALD_") {
                command.env_remove(key);
            }
        }
        command.env("RUST_LOG", "warn").envs(env.iter().copied());
        let child =
            command.stdin(Stdio::null()).stdout(Stdio::null()).kill_on_drop(true).spawn().expect("herald starts");
        let deadline = Instant::now() + Duration::from_secs(30);
        let port: u16 = loop {
            if let Ok(text) = std::fs::read_to_string(&listen)
                && let Some(port) = text.trim().rsplit(':').next().and_then(|port| port.parse().ok())
            {
                break port;
            }
            assert!(Instant::now() < deadline, "herald did not come up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Self { _dir: dir, _child: child, url: format!("ws://127.0.0.1:{port}/v1/ws") }
    }
}

fn options(url: &str, user: &str, device: &str, encoding: Encoding, round: &Round) -> ClientOptions {
    let mut options = ClientOptions::new(url, format!("dev:{user}"), device);
    options.encoding = encoding;
    options.store = Arc::new(MemorySeqStore::new());
    options.max_frames_per_second = round.frames_per_second;
    options
}

/// `total` sends from `in_flight` loops, each send awaited; sends per second.
async fn send_many(client: &Client, conversation: &str, total: usize, in_flight: usize) -> f64 {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let loops: Vec<_> = (0..in_flight)
        .map(|_| {
            let (client, next, conversation) = (client.clone(), next.clone(), conversation.to_owned());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= total {
                        return;
                    }
                    client.send(conversation.as_str(), format!("bench-{i}"), Default::default()).await.expect("stored");
                }
            })
        })
        .collect();
    for task in loops {
        task.await.expect("a send loop");
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// Reads a client's events in the background, counting retries; the messages are dropped
/// (handled) as they come.
fn drain(mut events: herald_client::Events, retries: Arc<AtomicUsize>) {
    tokio::spawn(async move {
        while let Some(event) = events.next().await {
            if let Event::Retry(_) = event {
                retries.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
}

async fn sends(herald: &Herald, encoding: Encoding, label: &str, round: &Round) {
    let (alice, events) = Client::connect(options(&herald.url, "alice", &format!("bench-{label}"), encoding, round));
    let retries = Arc::new(AtomicUsize::new(0));
    drain(events, retries.clone());
    alice.connected().await.expect("connected");
    let conversation = format!("dm:alice:bob-{label}");
    send_many(&alice, &conversation, 50, 1).await; // warm up
    let mut latencies = Vec::with_capacity(SEQUENTIAL);
    let started = Instant::now();
    for i in 0..SEQUENTIAL {
        let at = Instant::now();
        alice.send(conversation.as_str(), format!("seq-{i}"), Default::default()).await.expect("stored");
        latencies.push(at.elapsed().as_secs_f64() * 1000.0);
    }
    let rate = SEQUENTIAL as f64 / started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let quantile = |q: f64| latencies[((q * latencies.len() as f64) as usize).min(latencies.len() - 1)];
    println!(
        "  {label}: sequential {rate:.0} sends/s (p50 {:.2} ms, p99 {:.2} ms, {SEQUENTIAL} sends)",
        quantile(0.5),
        quantile(0.99)
    );
    for in_flight in [16, 256] {
        retries.store(0, Ordering::SeqCst);
        let per_second = send_many(&alice, &conversation, round.in_flight_total, in_flight).await;
        let retried = match retries.load(Ordering::SeqCst) {
            0 => String::new(),
            n => format!(", {n} RETRY answers waited out"),
        };
        println!("  {label}: {in_flight} in flight {per_second:.0} sends/s ({} sends{retried})", round.in_flight_total);
    }
    alice.close().await;
}

async fn receive(herald: &Herald, encoding: Encoding, label: &str, round: &Round) {
    let total = round.receive_total;
    let receiver = format!("carol-{label}");
    let (carol, mut events) = Client::connect(options(&herald.url, &receiver, "bench", encoding, round));
    let (alice, alice_events) =
        Client::connect(options(&herald.url, "alice", &format!("sender-{label}"), encoding, round));
    drain(alice_events, Arc::default());
    carol.connected().await.expect("connected");
    alice.connected().await.expect("connected");
    let counting = tokio::spawn(async move {
        let (mut count, mut first, mut last) = (0, None, Instant::now());
        while count < total {
            match events.next().await {
                Some(Event::Message(_)) => {
                    count += 1;
                    first.get_or_insert_with(Instant::now);
                    last = Instant::now();
                }
                Some(_) => {}
                None => break,
            }
        }
        (count, first.unwrap_or(last), last)
    });
    let started = Instant::now();
    let conversation = format!("dm:alice:{receiver}");
    send_many(&alice, &conversation, total, 256).await;
    let (count, first, last) = tokio::time::timeout(Duration::from_secs(120), counting)
        .await
        .expect("every message received within 2 minutes")
        .expect("the counting task");
    assert_eq!(count, total, "every message received");
    let per_second = total as f64 / last.duration_since(first).as_secs_f64();
    println!(
        "  {label}: received {per_second:.0} msgs/s, handled and acked in order ({total} messages; all in {:.2} s from the first send)",
        last.duration_since(started).as_secs_f64()
    );
    alice.close().await;
    carol.close().await;
}

#[tokio::main]
async fn main() {
    let bin = PathBuf::from(std::env::var_os("HERALD_BIN").unwrap_or_else(|| "target/release/herald".into()));
    assert!(bin.exists(), "no Herald binary at {}: build it or set HERALD_BIN", bin.display());
    let rounds = [
        Round {
            label: "default limits",
            in_flight_total: 5_000,
            receive_total: 5_000,
            frames_per_second: 1_800,
            env: &[],
            encodings: &[(Encoding::Proto, "proto")],
        },
        Round {
            label: "limits off",
            in_flight_total: 10_000,
            receive_total: 20_000,
            frames_per_second: 0,
            env: &[
                ("HERALD_INTAKE__SENDS_PER_CONNECTION", "0"),
                ("HERALD_INTAKE__SENDS_PER_USER", "0"),
                ("HERALD_GATEWAY__FRAMES_PER_SECOND", "0"),
            ],
            encodings: &[(Encoding::Proto, "proto"), (Encoding::Json, "json")],
        },
    ];
    for round in &rounds {
        let herald = Herald::start(&bin, round.env).await;
        println!("one Herald node ({}), {}:", bin.display(), round.label);
        for (encoding, label) in round.encodings {
            sends(&herald, *encoding, label, round).await;
            receive(&herald, *encoding, label, round).await;
        }
    }
}
