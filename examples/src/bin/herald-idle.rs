//! `herald-idle`: many connected devices that do nothing. Each logs in, then only reads,
//! answering the server's pings as told (`--answer asked`: those with `reply`, as
//! PROTOCOL.md says; `--answer all`: every one, as clients of the earlier contract did),
//! for `--duration`. Reports the frames that crossed and the longest silence any device
//! heard from the server: the bound on how soon a client notices a dead server.
//!
//! `scripts/heartbeat-bench.sh` runs it beside the server and reads the server's CPU.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout, reason = "a command-line program reports on stdout")]

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use herald_examples::connection::Connection;
use herald_examples::ids::random_tag;
use herald_examples::target::check_target;
use herald_proto::Encoding;
use herald_proto::v1::{self, Frame, frame::Body};
use tokio::sync::{Barrier, Semaphore};
use tokio::time::Instant;

/// Idle devices against a Herald server in --dev mode.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// The server's WebSocket URL (loopback).
    #[arg(long, default_value = "ws://127.0.0.1:7070/v1/ws")]
    url: String,
    /// Devices (one user each), each on its own connection.
    #[arg(long, default_value_t = 1000)]
    devices: usize,
    /// How long they stay connected once all are, in seconds.
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Which server pings are answered with a pong.
    #[arg(long, value_enum, default_value_t = Answer::Asked)]
    answer: Answer,
    /// Connections opened at once.
    #[arg(long, default_value_t = 128)]
    connect_concurrency: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Answer {
    /// Pings with `reply` set (PROTOCOL.md).
    Asked,
    /// Every ping.
    All,
}

/// Bounds the connect and login of one device.
const STEP: Duration = Duration::from_secs(30);

/// What the devices saw, summed.
#[derive(Default)]
struct Tally {
    pings: AtomicU64,
    asked: AtomicU64,
    pongs: AtomicU64,
    other_frames: AtomicU64,
    /// Devices whose connection ended before the hold did.
    lost: AtomicUsize,
    /// The longest silence from the server any device heard while held, in ms.
    longest_silence_ms: AtomicU64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(error) = check_target(&args.url, false) {
        eprintln!("herald-idle: {error}");
        return ExitCode::FAILURE;
    }
    let tag = random_tag(6);
    let tally = Arc::new(Tally::default());
    let opening = Arc::new(Semaphore::new(args.connect_concurrency.max(1)));
    // Everyone connected, then the hold starts for all at once.
    let ready = Arc::new(Barrier::new(args.devices + 1));
    let hold = Duration::from_secs(args.duration);
    let mut devices = Vec::with_capacity(args.devices);
    for n in 0..args.devices {
        let (url, tag, tally, opening, ready) =
            (args.url.clone(), tag.clone(), Arc::clone(&tally), Arc::clone(&opening), Arc::clone(&ready));
        devices.push(tokio::spawn(async move {
            let connection = {
                let _permit = opening.acquire().await;
                open(&url, &format!("idle-{tag}-{n}")).await
            };
            ready.wait().await;
            match connection {
                Ok(connection) => idle(connection, hold, args.answer, &tally).await.map_err(|error| error.to_string()),
                Err(error) => Err(error),
            }
        }));
    }
    let started = Instant::now();
    ready.wait().await;
    eprintln!(
        "herald-idle: {} devices connected in {:.1} s; holding {hold:?}",
        args.devices,
        started.elapsed().as_secs_f64()
    );
    let mut failures = Vec::new();
    for device in devices {
        match device.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => failures.push(error),
            Err(error) => failures.push(error.to_string()),
        }
    }
    let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    println!(
        "{}",
        serde_json::json!({
            "devices": args.devices,
            "seconds": args.duration,
            "answer": format!("{:?}", args.answer).to_lowercase(),
            "pings": read(&tally.pings),
            "asked": read(&tally.asked),
            "pongs": read(&tally.pongs),
            "other_frames": read(&tally.other_frames),
            "lost": tally.lost.load(Ordering::Relaxed),
            "failed": failures.len(),
            "longest_silence_ms": read(&tally.longest_silence_ms),
        })
    );
    if let Some(first) = failures.first() {
        eprintln!("herald-idle: {} devices failed; the first: {first}", failures.len());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

async fn open(url: &str, user: &str) -> Result<Connection, String> {
    let mut connection = Connection::open(url, Encoding::Proto, STEP).await.map_err(|error| error.to_string())?;
    connection.login(&format!("dev:{user}"), "idle", "herald-idle", STEP).await.map_err(|error| error.to_string())?;
    Ok(connection)
}

/// Reads for `hold`, answering pings as told; notes the longest silence heard.
async fn idle(
    mut connection: Connection,
    hold: Duration,
    answer: Answer,
    tally: &Tally,
) -> Result<(), herald_examples::connection::ConnectionError> {
    let end = Instant::now() + hold;
    let mut heard = Instant::now();
    let mut longest = Duration::ZERO;
    loop {
        let frame = tokio::select! {
            frame = connection.recv() => frame,
            () = tokio::time::sleep_until(end) => break,
        };
        let now = Instant::now();
        longest = longest.max(now - heard);
        heard = now;
        match frame {
            Ok(Frame { rid, body: Some(Body::Ping(ping)) }) => {
                tally.pings.fetch_add(1, Ordering::Relaxed);
                tally.asked.fetch_add(u64::from(ping.reply), Ordering::Relaxed);
                if ping.reply || answer == Answer::All {
                    connection.send(&Frame::new(rid, v1::Pong { time_ms: ping.time_ms })).await?;
                    tally.pongs.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(_) => _ = tally.other_frames.fetch_add(1, Ordering::Relaxed),
            Err(error) => {
                tally.lost.fetch_add(1, Ordering::Relaxed);
                return Err(error);
            }
        }
    }
    longest = longest.max(Instant::now() - heard);
    let ms = u64::try_from(longest.as_millis()).unwrap_or(u64::MAX);
    tally.longest_silence_ms.fetch_max(ms, Ordering::Relaxed);
    connection.close(1000, "done").await;
    Ok(())
}
