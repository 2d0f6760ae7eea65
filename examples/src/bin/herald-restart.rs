//! `herald-restart`: a node restarted behind nginx, as a deploy restarts it. N devices
//! connect through nginx (`?user=`), each in C direct conversations it has read to the end;
//! a notifier on another node keeps sending to random devices (`--traffic-rate`) the whole
//! time. Then `--stop` runs (e.g. a SIGTERM to one node, or kill -9); the devices that node
//! held notice it; the notifier sends each of them one more message while the node is down;
//! `--start` brings the node back at the same address; and those devices all reconnect
//! through nginx at once. Reports how long until every one of them had that message (it
//! comes after everything else the notifier sent it, in the same conversation), the bytes
//! of every `deliver` they were pushed meanwhile, how many messages they had read already
//! were pushed again, and which backfill path the restarted node took (`/metrics`).
//!
//! `scripts/reconnect-bench.sh restart` runs it against three nodes behind a real nginx,
//! with the restarted node's restore of its devices (`cluster.restore_devices`) on, then off.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout, reason = "a command-line program reports on stdout")]

use std::collections::{HashMap, HashSet, VecDeque};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
use herald_proto::v1::{self, Frame, frame::Body};
use herald_proto::{Encoding, encode_proto};
use tokio::sync::{Barrier, Semaphore, mpsc, watch};
use tokio::time::Instant;

/// A node restart behind nginx against a Herald cluster in --dev mode.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// nginx's WebSocket URL (loopback); each device adds `?user=<its user>`.
    #[arg(long)]
    url: String,
    /// A node that is not restarted, where the notifier connects (its WebSocket URL).
    #[arg(long)]
    notifier_url: String,
    /// The restarted node's HTTP address (`http://127.0.0.1:PORT`), for its `/metrics`.
    #[arg(long)]
    metrics_url: String,
    /// Stops the node (run by `sh -c`; returns once the process has exited).
    #[arg(long)]
    stop: String,
    /// Starts it again at the same address (`sh -c`; returns once it serves).
    #[arg(long)]
    start: String,
    /// Devices (one user each) connecting through nginx; about 1/n of them land on the
    /// restarted node.
    #[arg(long, default_value_t = 3000)]
    users: usize,
    /// Direct conversations per user (even), each with one message already read.
    #[arg(long, default_value_t = 20)]
    conversations: usize,
    /// Messages a second the notifier sends to random devices the whole time. With the
    /// marking (1,000 a second at most) it stays under the server's limit of frames a
    /// second on one connection (`gateway.frames_per_second`, 2,000 by default).
    #[arg(long, default_value_t = 200)]
    traffic_rate: u32,
    /// Devices connecting and setting up at once.
    #[arg(long, default_value_t = 128)]
    connect_concurrency: usize,
    /// Devices reconnecting at once after the restart.
    #[arg(long, default_value_t = 128)]
    reconnect_concurrency: usize,
    /// Seconds between the set-up and the restart, with only the traffic going: most of a
    /// device's conversations are quiet when its node restarts.
    #[arg(long, default_value_t = 20)]
    settle_secs: u64,
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
    // The metrics address is checked as the WebSocket URL of the same host would be.
    let metrics_host = args.metrics_url.replacen("http", "ws", 1);
    for url in [&args.url, &args.notifier_url, &metrics_host] {
        if let Err(error) = check_target(url, false) {
            eprintln!("herald-restart: {error}");
            return ExitCode::from(2);
        }
    }
    if args.connect_concurrency == 0 || args.reconnect_concurrency == 0 {
        eprintln!("herald-restart: --connect-concurrency and --reconnect-concurrency must be at least 1");
        return ExitCode::from(2);
    }
    if args.users < 2 || args.conversations < 2 || args.conversations % 2 != 0 || args.conversations / 2 >= args.users {
        eprintln!("herald-restart: --conversations must be even, at least 2, and --users more than half of it");
        return ExitCode::from(2);
    }
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("herald-restart: {error}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    SettingUp,
    /// The node is being stopped: a device whose connection ends reports it.
    Stopping,
    /// Reconnect (the devices that dropped); the storm started at this instant.
    Back(Instant),
    /// Every device that dropped is back: the others stop too.
    Done,
}

/// What one device saw.
#[derive(Default)]
struct Seen {
    /// It was on the restarted node.
    dropped: bool,
    /// From the node's return to the message sent while it was down.
    took: Duration,
    /// Messages it had read already that were pushed again after it came back.
    repushed: u64,
}

/// Devices connected for the set-up, and those that finished it.
static CONNECTED: AtomicU64 = AtomicU64::new(0);
static SET_UP: AtomicU64 = AtomicU64::new(0);

/// Bytes of every `deliver` pushed to the devices that came back, after they did.
static BYTES_PUSHED: AtomicU64 = AtomicU64::new(0);

async fn run(args: &Args) -> Result<(), Error> {
    let prefix = format!("rs{}", random_tag(6));
    let users: Arc<Vec<String>> = Arc::new((0..args.users).map(|n| format!("{prefix}-{n}")).collect());
    let notifier = format!("{prefix}-notifier");
    let permits = Arc::new(Semaphore::new(args.connect_concurrency));
    let set_up = Arc::new(Barrier::new(args.users + 1));
    let (phase, phase_rx) = watch::channel(Phase::SettingUp);
    let (dropped_tx, mut dropped_rx) = mpsc::unbounded_channel::<usize>();

    println!(
        "{}: {} devices through nginx, each in {} conversations read to the end; {} msgs/s to random devices throughout; one node restarted",
        args.label, args.users, args.conversations, args.traffic_rate
    );
    let tasks: Vec<_> = (0..args.users)
        .map(|n| {
            let (users, permits, set_up, phase, dropped) =
                (Arc::clone(&users), Arc::clone(&permits), Arc::clone(&set_up), phase_rx.clone(), dropped_tx.clone());
            let (url, conversations, notifier) = (args.url.clone(), args.conversations, notifier.clone());
            tokio::spawn(async move {
                device(&url, &users, n, conversations, &notifier, &permits, &set_up, phase, dropped).await
            })
        })
        .collect();
    drop(dropped_tx);
    // Thousands of devices set up on a small box can take minutes: the wait ends when no
    // device finished setting up for a whole WAIT, and says how far it got meanwhile.
    let everyone = set_up.wait();
    tokio::pin!(everyone);
    let (mut last, mut progress_at) = (0, Instant::now());
    let mut report = tokio::time::interval(Duration::from_secs(10));
    let stalled = loop {
        tokio::select! {
            _ = &mut everyone => break false,
            _ = report.tick() => {
                let (connected, done) = (CONNECTED.load(Ordering::Relaxed), SET_UP.load(Ordering::Relaxed));
                if connected + done > last {
                    (last, progress_at) = (connected + done, Instant::now());
                    eprintln!("{}: {connected} of {} devices connected, {done} set up", args.label, args.users);
                } else if progress_at.elapsed() >= WAIT {
                    break true;
                }
            }
        }
    };
    if stalled {
        for task in tasks {
            if task.is_finished() {
                task.await??;
            }
        }
        let (connected, done) = (CONNECTED.load(Ordering::Relaxed), SET_UP.load(Ordering::Relaxed));
        return Err(format!(
            "the set-up made no progress for {} s ({connected} of {} devices connected, {done} set up)",
            WAIT.as_secs(),
            args.users
        )
        .into());
    }
    // The acks of the set-up reach the cursors and a save of the ledgers.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (notify, notify_rx) = mpsc::unbounded_channel();
    let notifying = notifier_loop(
        Connection::open(&args.notifier_url, Encoding::Proto, WAIT).await?,
        notifier.clone(),
        Arc::clone(&users),
        args.traffic_rate,
        notify_rx,
    );
    let sender =
        tokio::spawn(
            async move { notifying.await.map_err(|error| -> Error { format!("the notifier: {error}").into() }) },
        );
    tokio::time::sleep(Duration::from_secs(args.settle_secs)).await;

    phase.send_replace(Phase::Stopping);
    shell(&args.stop).await?;
    // The devices of the stopped node see their connections end at once (loopback).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut dropped = Vec::new();
    while let Ok(n) = dropped_rx.try_recv() {
        dropped.push(n);
    }
    if dropped.is_empty() {
        return Err("no device was on the stopped node".into());
    }
    let (marked, marked_rx) = tokio::sync::oneshot::channel();
    notify.send((dropped.clone(), marked))?;
    match marked_rx.await {
        Ok(answer) => answer?,
        // The notifier stopped: its own error says why.
        Err(_) => return Err(sender.await?.err().unwrap_or_else(|| "the notifier stopped".into())),
    }

    shell(&args.start).await?;
    // Every set-up permit is back by now (the devices are all set up).
    if args.reconnect_concurrency > args.connect_concurrency {
        permits.add_permits(args.reconnect_concurrency - args.connect_concurrency);
    } else {
        permits.forget_permits(args.connect_concurrency - args.reconnect_concurrency);
    }
    let storm = Instant::now();
    phase.send_replace(Phase::Back(storm));
    // Those that dropped finish when back; the others when told, after them.
    let mut seen = Vec::new();
    let mut others = Vec::new();
    let dropped_set: HashSet<usize> = dropped.iter().copied().collect();
    for (n, task) in tasks.into_iter().enumerate() {
        if dropped_set.contains(&n) { seen.push(task) } else { others.push(task) }
    }
    let back: Vec<Seen> = try_join_all(seen).await?.into_iter().collect::<Result<_, _>>()?;
    let all_back = storm.elapsed();
    phase.send_replace(Phase::Done);
    try_join_all(others).await?.into_iter().collect::<Result<Vec<_>, _>>()?;
    drop(notify);
    sender.await??;
    // A new process: its counters are this run's.
    let (after, timings) = backfills(&args.metrics_url).await?;

    let mut took = Histogram::<u64>::new(3)?;
    for device in back.iter().filter(|device| device.dropped) {
        took.record(device.took.as_micros() as u64)?;
    }
    let ms = |micros: u64| micros as f64 / 1000.0;
    println!(
        "{}: {} devices on the restarted node, every one caught up {:.0} ms after it was back; per device p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        args.label,
        dropped.len(),
        all_back.as_secs_f64() * 1000.0,
        ms(took.value_at_quantile(0.5)),
        ms(took.value_at_quantile(0.99)),
        ms(took.max()),
    );
    println!(
        "{}: pushed to them after the restart: {:.1} KiB of deliver frames; messages read already pushed again: {}",
        args.label,
        BYTES_PUSHED.load(Ordering::Relaxed) as f64 / 1024.0,
        back.iter().map(|device| device.repushed).sum::<u64>(),
    );
    println!(
        "{}: backfills on the restarted node: {} full (every conversation read), {} resumed (only what was owed)",
        args.label, after.0, after.1
    );
    println!("{}: where a login's time went on the restarted node (p50 / p99 ms): {timings}", args.label);
    Ok(())
}

/// Runs `command` with `sh -c`; an error unless it exits with 0.
async fn shell(command: &str) -> Result<(), Error> {
    let status = tokio::process::Command::new("sh").arg("-c").arg(command).status().await?;
    if !status.success() {
        return Err(format!("`{command}` failed: {status}").into());
    }
    Ok(())
}

/// Most marking sends (and sends due again after a RETRY) a second.
const MARK_RATE: u32 = 1000;

/// Devices to send one message each, and where to answer once every one is stored.
type MarkRequest = (Vec<usize>, tokio::sync::oneshot::Sender<Result<(), String>>);

/// The notifier: sends to random devices at `rate` a second, and when asked, one message
/// to each of the devices named, answering once each is stored.
async fn notifier_loop(
    mut connection: Connection,
    notifier: String,
    users: Arc<Vec<String>>,
    rate: u32,
    mut asked: mpsc::UnboundedReceiver<MarkRequest>,
) -> Result<(), Error> {
    connection.login(&format!("dev:{notifier}"), "device", "herald-restart", WAIT).await?;
    let mut ids = ClientMsgIds::new();
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
    // Sends by request id until stored; a RETRY is sent again with the same id.
    let mut unacked: HashMap<u32, v1::Send> = HashMap::new();
    let mut marking: Option<(usize, tokio::sync::oneshot::Sender<Result<(), String>>)> = None;
    let mut marks: HashSet<u32> = HashSet::new();
    // Sends turned back with RETRY, due again after their wait: the loop goes on reading
    // meanwhile (a notifier that stopped reading would be closed as a slow consumer).
    let (again_tx, mut again_rx) = mpsc::unbounded_channel::<(v1::Send, bool)>();
    // The messages marking the devices of the stopped node, and the sends due again, go
    // out at most MARK_RATE a second: with the traffic, within the server's frame limit.
    let mut queued: VecDeque<(v1::Send, bool)> = VecDeque::new();
    let mut pace = tokio::time::interval(Duration::from_secs(1) / MARK_RATE);
    pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            Some(again) = again_rx.recv() => queued.push_back(again),
            _ = pace.tick(), if !queued.is_empty() => {
                let Some((send, mark)) = queued.pop_front() else { continue };
                let rid = connection.next_rid();
                connection.send(&Frame::new(rid, send.clone())).await?;
                unacked.insert(rid, send);
                if mark {
                    marks.insert(rid);
                }
            }
            _ = ticks.tick(), if rate > 0 => {
                let to = &users[rand::random_range(0..users.len())];
                let send = v1::Send { client_msg_id: ids.next_id(), conversation: dm_conversation(&notifier, to), kind: 1, body: "traffic".into() };
                let rid = connection.next_rid();
                connection.send(&Frame::new(rid, send.clone())).await?;
                unacked.insert(rid, send);
            }
            request = asked.recv() => {
                let Some((devices, answer)) = request else { return Ok(()) };
                for n in &devices {
                    let send = v1::Send { client_msg_id: ids.next_id(), conversation: dm_conversation(&notifier, &users[*n]), kind: 1, body: "while the node was down".into() };
                    queued.push_back((send, true));
                }
                marking = Some((devices.len(), answer));
            }
            frame = connection.recv() => {
                let frame = frame?;
                let Some(Body::SendAck(ack)) = frame.body else { continue };
                let Some(send) = unacked.remove(&frame.rid) else { continue };
                let mark = marks.remove(&frame.rid);
                match ack.status() {
                    v1::send_ack::Status::Ok | v1::send_ack::Status::Duplicate => {
                        if mark && let Some((left, _)) = &mut marking {
                            *left -= 1;
                            if *left == 0 && let Some((_, answer)) = marking.take() {
                                let _ = answer.send(Ok(()));
                            }
                        }
                    }
                    // The node down may own the conversation until the others see it gone.
                    v1::send_ack::Status::Retry => {
                        let wait = Duration::from_millis(u64::from(ack.retry_after_ms).clamp(10, 500));
                        let again = again_tx.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(wait).await;
                            let _ = again.send((send, mark));
                        });
                    }
                    _ => return Err(format!("a notifier send failed: {ack:?}").into()),
                }
            }
        }
    }
}

/// Connects `user` through nginx, at most `permits` handshakes at once.
async fn connect(url: &str, user: &str, permits: &Semaphore) -> Result<Connection, Error> {
    let _permit = permits.acquire().await?;
    open(url, user).await
}

/// Connects `user` through nginx and logs in.
async fn open(url: &str, user: &str) -> Result<Connection, Error> {
    let mut connection = Connection::open(&format!("{url}?user={user}"), Encoding::Proto, WAIT).await?;
    connection.login(&format!("dev:{user}"), "device", "herald-restart", WAIT).await?;
    Ok(connection)
}

/// What a device does with a frame while it waits: acks a `deliver`, answers a `ping`
/// that asks (the server closes a client silent past its timeout).
async fn take(connection: &mut Connection, frame: Frame) -> Result<(), Error> {
    match frame.body {
        Some(Body::Deliver(deliver)) => _ = ack(connection, deliver).await?,
        Some(Body::Ping(ping)) => connection.answer_ping(frame.rid, &ping).await?,
        _ => {}
    }
    Ok(())
}

/// Acks a `deliver`; returns its message.
async fn ack(connection: &mut Connection, deliver: v1::Deliver) -> Result<v1::Message, Error> {
    let message = deliver.message.ok_or("deliver without a message")?;
    let seq = message.seq;
    connection.send(&Frame::new(0, v1::DeliverAck { conversation: message.conversation.clone(), seq })).await?;
    Ok(message)
}

/// One device: sets up its conversations, takes what it is sent, and when its node goes
/// away reports it and comes back through nginx once told.
#[allow(clippy::too_many_arguments, reason = "one task's whole setting")]
async fn device(
    url: &str,
    users: &[String],
    n: usize,
    conversations: usize,
    notifier: &str,
    permits: &Semaphore,
    set_up: &Barrier,
    mut phase: watch::Receiver<Phase>,
    dropped: mpsc::UnboundedSender<usize>,
) -> Result<Seen, Error> {
    let me = &users[n];
    // A permit for the whole set-up, not only the handshake: thousands of devices starting
    // their conversations at once would be a burst of new conversations no small box
    // stores in time.
    let permit = permits.acquire().await?;
    let mut connection = open(url, me).await?;
    CONNECTED.fetch_add(1, Ordering::Relaxed);
    read_to_the_end(&mut connection, users, n, conversations, WAIT).await?;
    SET_UP.fetch_add(1, Ordering::Relaxed);
    drop(permit);
    // Waiting for the others can take longer than the server's client timeout: the device
    // goes on answering, as an idle client would.
    let others_set_up = set_up.wait();
    tokio::pin!(others_set_up);
    loop {
        tokio::select! {
            _ = &mut others_set_up => break,
            frame = connection.recv() => take(&mut connection, frame?).await?,
        }
    }
    // Until the node goes or the run ends: take the traffic.
    loop {
        tokio::select! {
            frame = connection.recv() => {
                let taken = match frame {
                    Ok(frame) => take(&mut connection, frame).await,
                    Err(error) => Err(error.into()),
                };
                // Reading or answering, either can be where a device sees its node go.
                match taken {
                    Ok(()) => {}
                    Err(_) if matches!(*phase.borrow(), Phase::Stopping) => break,
                    Err(error) => return Err(format!("{me} lost its connection before the restart: {error}").into()),
                }
            }
            changed = phase.changed() => {
                changed?;
                if matches!(*phase.borrow(), Phase::Done) {
                    connection.close(1000, "done").await;
                    return Ok(Seen::default());
                }
            }
        }
    }
    dropped.send(n)?;
    let storm = match *phase.wait_for(|phase| matches!(phase, Phase::Back(_))).await? {
        Phase::Back(storm) => storm,
        _ => unreachable!("waited for Back"),
    };
    // nginx may still refuse for a moment: try again, as a client with backoff would.
    let mut connection = loop {
        match connect(url, me, permits).await {
            Ok(connection) => break connection,
            Err(_) if storm.elapsed() < WAIT => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(error) => return Err(error),
        }
    };
    let notified = dm_conversation(notifier, me);
    let mut repushed = 0;
    let lost = |error: Error| -> Error { format!("{me} back after the restart: {error}").into() };
    loop {
        let frame = tokio::time::timeout(WAIT, connection.recv()).await.map_err(|error| lost(error.into()))?;
        let frame = frame.map_err(|error| lost(error.into()))?;
        if let Some(Body::Deliver(_)) = &frame.body {
            BYTES_PUSHED.fetch_add(encode_proto(&frame).len() as u64, Ordering::Relaxed);
        }
        if let Some(Body::Ping(ping)) = &frame.body {
            connection.answer_ping(frame.rid, ping).await.map_err(|error| lost(error.into()))?;
        }
        if let Some(Body::Deliver(deliver)) = frame.body {
            let message = ack(&mut connection, deliver).await.map_err(lost)?;
            if message.conversation != notified {
                repushed += 1; // a set-up conversation: read before the restart
            } else if message.body.as_ref() == b"while the node was down" {
                let took = storm.elapsed();
                connection.close(1000, "done").await;
                return Ok(Seen { dropped: true, took, repushed });
            }
        }
    }
}

/// `herald_delivery_backfills_total` for the full and the resumed path, from the `/metrics`
/// at `url`, and the steps of a login there: the route written to Redis and told to the
/// other nodes, a backfill's wait for its permit, its first pass, and its last check with
/// the catching up until live (p50 / p99 of the node's summaries).
async fn backfills(url: &str) -> Result<((u64, u64), String), Error> {
    let authority = authority_of(url).ok_or("no host in the URL")?;
    let answer = http::request(&authority, "GET", "/metrics", None, None, WAIT).await?;
    let scrape = Scrape::parse(&answer.body);
    let count = |path: &str| scrape.value("herald_delivery_backfills_total", &[("path", path)]).unwrap_or(0.0) as u64;
    let quantiles = |name: &str, labels: &[(&str, &str)]| {
        let at = |quantile: &str| {
            let mut labels = labels.to_vec();
            labels.push(("quantile", quantile));
            scrape.value(name, &labels).map_or_else(|| "-".to_owned(), |seconds| format!("{:.1}", seconds * 1000.0))
        };
        format!("{} / {}", at("0.5"), at("0.99"))
    };
    let mut timings = vec![
        format!("route login {}", quantiles("herald_redis_call_seconds", &[("what", "route login")])),
        format!(
            "login told to the other nodes {}",
            quantiles("herald_cluster_peer_request_seconds", &[("kind", "routes_changed")])
        ),
    ];
    for path in ["resumed", "full"] {
        for part in ["waiting", "reading", "checking"] {
            let labels = [("path", path), ("part", part)];
            timings.push(format!("{path} backfill {part} {}", quantiles("herald_delivery_backfill_seconds", &labels)));
        }
    }
    Ok(((count("full"), count("resumed")), timings.join(", ")))
}
