//! `herald-reconnect`: a reconnect storm. N devices, each in C direct conversations it has
//! read to the end, drop at once; one message is sent to each while they are away; then
//! they all reconnect at once. Reports how long until every device had its message, the
//! time per device, how many messages it had read already were pushed again, and which
//! backfill path the server took (`/metrics`).
//!
//! With `--back-url`, the devices come back to another node of the same cluster (as behind
//! a load balancer that picks any node), which takes their parked sessions over from the
//! node they left.
//!
//! `scripts/reconnect-bench.sh` runs it against a server with the reconnect grace period
//! on, then off; `scripts/reconnect-bench.sh cluster` against three nodes, the devices
//! coming back to another node.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout, reason = "a command-line program reports on stdout")]

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use futures_util::future::try_join_all;
use hdrhistogram::Histogram;
use herald_examples::connection::Connection;
use herald_examples::http::{self, authority_of};
use herald_examples::ids::{ClientMsgIds, dm_conversation, random_tag};
use herald_examples::metrics::Scrape;
use herald_examples::storm::read_to_the_end;
use herald_examples::target::check_target;
use herald_proto::Encoding;
use herald_proto::v1::{self, Frame, frame::Body};
use tokio::sync::{Barrier, Semaphore, watch};
use tokio::time::Instant;

/// A reconnect storm against a Herald server in --dev mode.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// The server's WebSocket URL (loopback).
    #[arg(long, default_value = "ws://127.0.0.1:7070/v1/ws")]
    url: String,
    /// Where the devices reconnect: another node of the same cluster (default: --url).
    #[arg(long)]
    back_url: Option<String>,
    /// Devices (one user each).
    #[arg(long, default_value_t = 500)]
    users: usize,
    /// Direct conversations per user (even), each with one message already read.
    #[arg(long, default_value_t = 40)]
    conversations: usize,
    /// Connections opened at once.
    #[arg(long, default_value_t = 128)]
    connect_concurrency: usize,
    /// Names the run in the report.
    #[arg(long, default_value = "herald")]
    label: String,
}

/// Bounds every wait, so a run ends even if the server stops answering.
const WAIT: Duration = Duration::from_secs(60);

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    for url in [Some(&args.url), args.back_url.as_ref()].into_iter().flatten() {
        if let Err(error) = check_target(url, false) {
            eprintln!("herald-reconnect: {error}");
            return ExitCode::from(2);
        }
    }
    if args.users < 2 || args.conversations < 2 || args.conversations % 2 != 0 || args.conversations / 2 >= args.users {
        eprintln!("herald-reconnect: --conversations must be even, at least 2, and --users more than half of it");
        return ExitCode::from(2);
    }
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("herald-reconnect: {error}");
            ExitCode::FAILURE
        }
    }
}

/// What one device saw when it came back.
struct Return {
    /// From the start of the storm to its owed message.
    took: Duration,
    /// Messages it had read already that were pushed again.
    repushed: u64,
}

async fn run(args: &Args) -> Result<(), Error> {
    let prefix = format!("rc{}", random_tag(6));
    let users: Arc<Vec<String>> = Arc::new((0..args.users).map(|n| format!("{prefix}-{n}")).collect());
    let notifier = format!("{prefix}-notifier");
    let permits = Arc::new(Semaphore::new(args.connect_concurrency));
    let set_up = Arc::new(Barrier::new(args.users + 1));
    let (phase, phase_rx) = watch::channel(Phase::SettingUp);

    println!(
        "{}: {} devices, each in {} conversations read to the end, drop at once; one message each while away; all reconnect at once",
        args.label, args.users, args.conversations
    );
    let tasks: Vec<_> = (0..args.users)
        .map(|n| {
            let (users, permits, set_up, phase) =
                (Arc::clone(&users), Arc::clone(&permits), Arc::clone(&set_up), phase_rx.clone());
            let urls =
                Urls { first: args.url.clone(), back: args.back_url.clone().unwrap_or_else(|| args.url.clone()) };
            let (conversations, notifier) = (args.conversations, notifier.clone());
            tokio::spawn(
                async move { device(&urls, &users, n, conversations, &notifier, &permits, &set_up, phase).await },
            )
        })
        .collect();

    // A device that failed never reaches the barrier: its error ends the run instead.
    if tokio::time::timeout(WAIT * 2, set_up.wait()).await.is_err() {
        for task in tasks {
            if task.is_finished() {
                task.await??;
            }
        }
        return Err("the devices did not finish setting up in time".into());
    }
    // Let the acks of the set-up reach the cursors, then drop every device at once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    phase.send_replace(Phase::Away);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = backfills(args).await?;

    // One message to each device while it is away.
    let mut sender = connect(&args.url, &notifier, &permits).await?;
    let mut ids = ClientMsgIds::new();
    let mut unacked = std::collections::HashMap::new();
    for user in users.iter() {
        let send = v1::Send {
            client_msg_id: ids.next_id(),
            conversation: dm_conversation(&notifier, user),
            kind: 1,
            body: "while away".into(),
        };
        let rid = sender.next_rid();
        sender.feed(&Frame::new(rid, send.clone())).await?;
        unacked.insert(rid, send);
    }
    sender.flush().await?;
    let mut acked = 0;
    while acked < users.len() {
        let frame = tokio::time::timeout(WAIT, sender.recv()).await??;
        if let Body::SendAck(ack) = frame.body.ok_or("empty frame")? {
            let send = unacked.remove(&frame.rid).ok_or("an ack of no send")?;
            match ack.status() {
                v1::send_ack::Status::Ok => acked += 1,
                // A busy node: the same send again, when it says.
                v1::send_ack::Status::Retry => {
                    tokio::time::sleep(Duration::from_millis(u64::from(ack.retry_after_ms))).await;
                    let rid = sender.next_rid();
                    sender.send(&Frame::new(rid, send.clone())).await?;
                    unacked.insert(rid, send);
                }
                _ => return Err(format!("a send while away failed: {ack:?}").into()),
            }
        }
    }

    let storm = Instant::now();
    phase.send_replace(Phase::Back(storm));
    let returns: Vec<Return> = try_join_all(tasks).await?.into_iter().collect::<Result<_, _>>()?;
    let all_back = storm.elapsed();
    let after = backfills(args).await?;

    let mut took = Histogram::<u64>::new(3)?;
    for r in &returns {
        took.record(r.took.as_micros() as u64)?;
    }
    let ms = |micros: u64| micros as f64 / 1000.0;
    println!(
        "{}: every device back with its message in {:.0} ms; per device p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms; messages read already pushed again: {}",
        args.label,
        all_back.as_secs_f64() * 1000.0,
        ms(took.value_at_quantile(0.5)),
        ms(took.value_at_quantile(0.9)),
        ms(took.value_at_quantile(0.99)),
        ms(took.max()),
        returns.iter().map(|r| r.repushed).sum::<u64>(),
    );
    println!(
        "{}: backfills during the storm: {} full (every conversation read), {} resumed (only what was owed)",
        args.label,
        after.0 - before.0,
        after.1 - before.1
    );
    Ok(())
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    SettingUp,
    /// Drop the connection.
    Away,
    /// Reconnect; the storm started at this instant.
    Back(Instant),
}

/// Connects and logs `user` in, at most `permits` handshakes at once.
async fn connect(url: &str, user: &str, permits: &Semaphore) -> Result<Connection, Error> {
    let _permit = permits.acquire().await?;
    let mut connection = Connection::open(url, Encoding::Proto, WAIT).await?;
    connection.login(&format!("dev:{user}"), "device", "herald-reconnect", WAIT).await?;
    Ok(connection)
}

/// Where a device connects first, and where it comes back.
struct Urls {
    first: String,
    back: String,
}

/// One device: sets up its conversations, drops when told, comes back when told.
#[allow(clippy::too_many_arguments, reason = "one task's whole setting")]
async fn device(
    urls: &Urls,
    users: &[String],
    n: usize,
    conversations: usize,
    notifier: &str,
    permits: &Semaphore,
    set_up: &Barrier,
    mut phase: watch::Receiver<Phase>,
) -> Result<Return, Error> {
    let me = &users[n];
    let mut connection = connect(&urls.first, me, permits).await?;
    read_to_the_end(&mut connection, users, n, conversations, WAIT).await?;
    set_up.wait().await;
    phase.wait_for(|phase| matches!(phase, Phase::Away)).await?;
    drop(connection); // no close frame: the socket just goes, as on a network switch

    let storm = match *phase.wait_for(|phase| matches!(phase, Phase::Back(_))).await? {
        Phase::Back(storm) => storm,
        _ => unreachable!("waited for Back"),
    };
    let mut connection = connect(&urls.back, me, permits).await?;
    let owed = dm_conversation(notifier, me);
    let mut repushed = 0;
    loop {
        if let Some(Body::Deliver(deliver)) = tokio::time::timeout(WAIT, connection.recv()).await??.body {
            let message = deliver.message.ok_or("deliver without a message")?;
            connection
                .send(&Frame::new(0, v1::DeliverAck { conversation: message.conversation.clone(), seq: message.seq }))
                .await?;
            if message.conversation == owed {
                let took = storm.elapsed();
                connection.close(1000, "done").await;
                return Ok(Return { took, repushed });
            }
            repushed += 1;
        }
    }
}

/// `herald_delivery_backfills_total` for the full and the resumed path, from the `/metrics`
/// of the node(s) the devices connect to, together.
async fn backfills(args: &Args) -> Result<(u64, u64), Error> {
    let mut urls = vec![&args.url];
    urls.extend(args.back_url.as_ref().filter(|back| **back != args.url));
    let (mut full, mut resumed) = (0, 0);
    for url in urls {
        let authority = authority_of(url).ok_or("no host in the URL")?;
        let answer = http::request(&authority, "GET", "/metrics", None, None, WAIT).await?;
        let scrape = Scrape::parse(&answer.body);
        let count =
            |path: &str| scrape.value("herald_delivery_backfills_total", &[("path", path)]).unwrap_or(0.0) as u64;
        full += count("full");
        resumed += count("resumed");
    }
    Ok((full, resumed))
}
