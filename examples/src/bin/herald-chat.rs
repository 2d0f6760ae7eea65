//! `herald-chat`: a terminal chat client for Herald. Reads commands and text from stdin,
//! prints incoming messages as `[conversation] sender: text`, acknowledges every deliver,
//! answers pings and reconnects with backoff. See `herald_examples::chat` for the logic;
//! this file only moves lines and frames.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout, reason = "a terminal program talks on stdout")]

use std::{io::BufRead as _, process::ExitCode, time::Duration};

use clap::{Parser, ValueEnum};
use herald_examples::{
    chat::{Backoff, ChatState, Effects},
    connection::{Connection, ConnectionError},
    ids::is_valid_name,
};
use herald_proto::{Encoding, v1};
use tokio::{
    sync::mpsc,
    time::{Instant, sleep_until},
};

/// Terminal chat client for Herald. Type /help once connected.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// The server's WebSocket URL.
    #[arg(long, default_value = "ws://127.0.0.1:7070/v1/ws")]
    url: String,
    /// Your user id.
    #[arg(long)]
    user: String,
    /// This device's id (a second connection with the same user and device replaces this one).
    #[arg(long, default_value = "cli")]
    device: String,
    /// Token to authenticate with (default: `dev:<user>`, for a server in --dev mode).
    #[arg(long)]
    token: Option<String>,
    /// Start talking to this user (same as typing /to <user>).
    #[arg(long)]
    to: Option<String>,
    /// Wire encoding (subprotocol herald.v1.proto or herald.v1.json).
    #[arg(long, value_enum, default_value_t = EncodingArg::Proto)]
    encoding: EncodingArg,
    /// Also print a line when a send is accepted.
    #[arg(long, short)]
    verbose: bool,
    /// Consecutive failed reconnects before giving up.
    #[arg(long, default_value_t = 20)]
    max_reconnects: u32,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum EncodingArg {
    Proto,
    Json,
}

/// How a session ended.
enum SessionEnd {
    /// The user left.
    Quit,
    /// Reconnecting cannot help (bad token, kicked).
    Fatal(String),
    /// The connection was lost; reconnect, after this long if the server said so.
    Lost(String, Option<Duration>),
    /// The server is going away: reconnect after this long, to this URL if it named one.
    Redirected(Option<Duration>, Option<String>),
}

/// How long a time-limited step may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for outstanding `send_ack`s when the user leaves.
const QUIT_GRACE: Duration = Duration::from_secs(3);
/// How much longer than a heartbeat the server may stay silent before it counts as gone:
/// room for a slow network and a busy server.
const DEAD_SERVER_MARGIN: Duration = Duration::from_secs(3);

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if !is_valid_name(&args.user) || !is_valid_name(&args.device) {
        eprintln!("herald-chat: --user and --device must be 1-128 characters of A-Z a-z 0-9 . _ @ -");
        return ExitCode::from(2);
    }
    let encoding = match args.encoding {
        EncodingArg::Proto => Encoding::Proto,
        EncodingArg::Json => Encoding::Json,
    };
    let token = args.token.clone().unwrap_or_else(|| format!("dev:{}", args.user));

    // A plain thread, not tokio's stdin: a read blocked on an open terminal would keep the
    // runtime from shutting down when the user types /quit.
    let (lines_tx, mut lines) = mpsc::channel::<String>(64);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if lines_tx.blocking_send(line).is_err() {
                break;
            }
        }
    });

    let mut chat = ChatState::new(&args.user, args.verbose);
    if let Some(to) = &args.to {
        show(&chat.on_line(&format!("/to {to}"), false));
    }
    let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(10));
    let mut stdin_open = true;
    // Where the next connection goes: --url, or the node a draining server named.
    let mut url = args.url.clone();
    loop {
        let wait = match connect(&args, &url, encoding, &token).await {
            Ok((connection, connected)) => {
                backoff.reset();
                println!(
                    "connected to {url} as {} (device {}); type /help for commands",
                    connected.user_id, connected.device_id
                );
                let end = session(connection, &connected, &mut chat, &mut lines, &mut stdin_open).await;
                match end {
                    SessionEnd::Quit => return ExitCode::SUCCESS,
                    SessionEnd::Fatal(message) => {
                        eprintln!("herald-chat: {message}");
                        return ExitCode::FAILURE;
                    }
                    SessionEnd::Lost(message, wait) => {
                        println!("(disconnected: {message})");
                        wait
                    }
                    SessionEnd::Redirected(wait, to) => {
                        if let Some(to) = to {
                            url = to;
                        }
                        wait
                    }
                }
            }
            Err(error) => {
                // The node a draining server named may be gone too: back to --url.
                url.clone_from(&args.url);
                if let Some(message) = fatal(&error) {
                    eprintln!("herald-chat: {message}");
                    return ExitCode::FAILURE;
                }
                if backoff.attempts() >= args.max_reconnects {
                    eprintln!("herald-chat: giving up after {} attempts: {error}", backoff.attempts());
                    return ExitCode::FAILURE;
                }
                println!("(cannot connect: {error})");
                None
            }
        };
        let delay = wait.unwrap_or_else(|| backoff.next_delay(rand::random()));
        println!("(reconnecting in {:.1}s)", delay.as_secs_f64());
        if wait_offline(delay, &mut chat, &mut lines, &mut stdin_open).await {
            return ExitCode::SUCCESS;
        }
    }
}

async fn connect(
    args: &Args,
    url: &str,
    encoding: Encoding,
    token: &str,
) -> Result<(Connection, v1::Connected), ConnectionError> {
    let mut connection = Connection::open(url, encoding, STEP_TIMEOUT).await?;
    let connected = connection.login(token, &args.device, "herald-chat", STEP_TIMEOUT).await?;
    Ok((connection, connected))
}

/// The message for errors that reconnecting cannot fix.
fn fatal(error: &ConnectionError) -> Option<String> {
    match error {
        ConnectionError::Closed { code: 4001, reason } => Some(format!(
            "the server refused the token (4001: {reason}); for a --dev server use dev:<user>, \
             otherwise pass --token"
        )),
        ConnectionError::Closed { code: 4003, reason } => Some(format!("not allowed to connect (4003: {reason})")),
        ConnectionError::Closed { code: 4009, .. } => {
            Some("kicked (4009): the same user and device connected elsewhere; use another --device".to_owned())
        }
        ConnectionError::Refused { .. } => Some(error.to_string()),
        _ => None,
    }
}

/// Runs one connected session until the user leaves or the connection ends.
async fn session(
    mut connection: Connection,
    connected: &v1::Connected,
    chat: &mut ChatState,
    lines: &mut mpsc::Receiver<String>,
    stdin_open: &mut bool,
) -> SessionEnd {
    // The server writes at least once a heartbeat; a silence longer than that and a margin
    // for the network means it is gone (PROTOCOL.md, "Heartbeats").
    let dead_after = Duration::from_millis(u64::from(connected.heartbeat_ms.max(1000))) + DEAD_SERVER_MARGIN;
    let mut last_heard = Instant::now();
    let mut retries: Vec<(Instant, String)> = Vec::new();
    let mut quit_by: Option<Instant> = (!*stdin_open).then(|| Instant::now() + QUIT_GRACE);

    let effects = chat.on_connected();
    if let Some(end) = apply(&mut connection, effects, &mut retries, &mut quit_by).await {
        return end;
    }
    loop {
        if let Some(deadline) = quit_by
            && (chat.pending_sends() == 0 || Instant::now() >= deadline)
        {
            if chat.pending_sends() > 0 {
                println!("({} message(s) not acknowledged)", chat.pending_sends());
            }
            connection.close(1000, "bye").await;
            return SessionEnd::Quit;
        }
        let next_retry = retries.iter().map(|(due, _)| *due).min();
        let effects = tokio::select! {
            received = connection.recv() => match received {
                Ok(frame) => {
                    last_heard = Instant::now();
                    chat.on_frame(frame)
                }
                Err(error) => {
                    return match fatal(&error) {
                        Some(message) => SessionEnd::Fatal(message),
                        None => SessionEnd::Lost(error.to_string(), None),
                    };
                }
            },
            line = lines.recv(), if *stdin_open => match line {
                Some(line) => chat.on_line(&line, true),
                None => {
                    *stdin_open = false;
                    Effects { quit: true, ..Effects::default() }
                }
            },
            () = sleep_until(last_heard + dead_after) => {
                return SessionEnd::Lost(format!("the server was silent for {} s", dead_after.as_secs()), None);
            },
            () = sleep_until(next_retry.unwrap_or(last_heard + dead_after)), if next_retry.is_some() => {
                let now = Instant::now();
                let due: Vec<String> = retries
                    .iter()
                    .filter(|(at, _)| *at <= now)
                    .map(|(_, id)| id.clone())
                    .collect();
                retries.retain(|(at, _)| *at > now);
                let mut effects = Effects::default();
                for id in due {
                    effects.send.extend(chat.resend(&id).send);
                }
                effects
            },
            () = sleep_until(quit_by.unwrap_or(last_heard + dead_after)), if quit_by.is_some() => Effects::default(),
        };
        if let Some(end) = apply(&mut connection, effects, &mut retries, &mut quit_by).await {
            return end;
        }
    }
}

/// Prints what `effects` says and writes its frames; `Some` if the session must end.
async fn apply(
    connection: &mut Connection,
    effects: Effects,
    retries: &mut Vec<(Instant, String)>,
    quit_by: &mut Option<Instant>,
) -> Option<SessionEnd> {
    show(&effects);
    for frame in &effects.send {
        if let Err(error) = connection.feed(frame).await {
            return Some(SessionEnd::Lost(error.to_string(), None));
        }
    }
    if !effects.send.is_empty()
        && let Err(error) = connection.flush().await
    {
        return Some(SessionEnd::Lost(error.to_string(), None));
    }
    let now = Instant::now();
    retries.extend(effects.retry.into_iter().map(|(wait, id)| (now + wait, id)));
    if effects.quit && quit_by.is_none() {
        *quit_by = Some(now + QUIT_GRACE);
    }
    effects.reconnect_after.map(|wait| SessionEnd::Redirected(Some(wait), effects.reconnect_url))
}

/// Waits `delay` before reconnecting while still taking typed lines; `true` if the user
/// left meanwhile.
async fn wait_offline(
    delay: Duration,
    chat: &mut ChatState,
    lines: &mut mpsc::Receiver<String>,
    stdin_open: &mut bool,
) -> bool {
    let deadline = Instant::now() + delay;
    loop {
        tokio::select! {
            () = sleep_until(deadline) => return false,
            line = lines.recv(), if *stdin_open => match line {
                Some(line) => {
                    let effects = chat.on_line(&line, false);
                    show(&effects);
                    if effects.quit {
                        return true;
                    }
                }
                None => {
                    *stdin_open = false;
                    return chat.pending_sends() == 0;
                }
            },
        }
    }
}

fn show(effects: &Effects) {
    for line in &effects.print {
        println!("{line}");
    }
}
