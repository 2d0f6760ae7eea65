//! `herald-chat`: a terminal chat client for Herald, on the `herald-client` library. Reads
//! commands and text from stdin, prints incoming messages as `[conversation] sender: text`.
//! The library reconnects, resends, orders, catches rooms up and acks (each message once it
//! is printed); `herald_examples::chat` turns lines and events into calls and output, and
//! this file only moves lines.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout, reason = "a terminal program talks on stdout")]

use std::{io::BufRead as _, process::ExitCode, time::Duration};

use clap::{Parser, ValueEnum};
use herald_client::{BackoffOptions, Client, ClientOptions, Encoding, Event, Events};
use herald_examples::{
    chat::{ChatSession, describe_event, session::Flow},
    ids::is_valid_name,
};
use tokio::sync::mpsc;

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
    /// Also print a line when a send is stored.
    #[arg(long, short)]
    verbose: bool,
    /// Consecutive failed connection attempts before giving up.
    #[arg(long, default_value_t = 20)]
    max_reconnects: u32,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum EncodingArg {
    Proto,
    Json,
}

/// How long to wait for typed messages to be stored when the user leaves.
const QUIT_GRACE: Duration = Duration::from_secs(3);

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if !is_valid_name(&args.user) || !is_valid_name(&args.device) {
        eprintln!("herald-chat: --user and --device must be 1-128 characters of A-Z a-z 0-9 . _ @ -");
        return ExitCode::from(2);
    }
    let token = args.token.clone().unwrap_or_else(|| format!("dev:{}", args.user));
    let mut options = ClientOptions::new(args.url.clone(), token, args.device.clone());
    options.encoding = match args.encoding {
        EncodingArg::Proto => Encoding::Proto,
        EncodingArg::Json => Encoding::Json,
    };
    // A person is waiting: retry sooner than the library's default for unattended apps.
    options.reconnect =
        BackoffOptions { initial_delay: Duration::from_millis(250), max_delay: Duration::from_secs(10) };

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

    let (client, mut events) = Client::connect(options);
    let (printer, mut printed) = mpsc::unbounded_channel::<String>();
    let mut chat = ChatSession::new(client, &args.user, args.verbose, printer);
    if let Some(to) = &args.to {
        chat.on_line(&format!("/to {to}"));
    }
    let mut failed_attempts = 0_u32;
    loop {
        tokio::select! {
            line = lines.recv() => match line {
                Some(line) => if chat.on_line(&line) == Flow::Quit { break },
                None => break, // end of input: leave once the typed messages are stored
            },
            Some(line) = printed.recv() => println!("{line}"),
            event = events.next() => {
                let Some(event) = event else {
                    // The library closed the client for good (a refused token, a kick).
                    flush(&mut printed);
                    return ExitCode::FAILURE;
                };
                for line in describe_event(&event) {
                    println!("{line}");
                }
                match &event {
                    Event::Connected(_) => failed_attempts = 0,
                    Event::Disconnected(info) if !info.was_connected && info.reconnect_in.is_some() => {
                        failed_attempts += 1;
                        if failed_attempts >= args.max_reconnects {
                            eprintln!("herald-chat: giving up after {failed_attempts} attempts");
                            chat.finish(Duration::ZERO).await;
                            return ExitCode::FAILURE;
                        }
                    }
                    _ => {}
                }
                // `event` (a delivery, say) is dropped here, after printing: then it is acked.
            }
        }
    }
    let unsettled = {
        let finishing = chat.finish(QUIT_GRACE);
        tokio::pin!(finishing);
        loop {
            tokio::select! {
                unsettled = &mut finishing => break unsettled,
                Some(line) = printed.recv() => println!("{line}"),
                Some(event) = next_event(&mut events) => {
                    for line in describe_event(&event) {
                        println!("{line}");
                    }
                }
            }
        }
    };
    flush(&mut printed);
    if unsettled > 0 {
        println!("({unsettled} message(s) not acknowledged)");
    }
    ExitCode::SUCCESS
}

async fn next_event(events: &mut Events) -> Option<Event> {
    events.next().await
}

/// Prints what the session's tasks left.
fn flush(printed: &mut mpsc::UnboundedReceiver<String>) {
    while let Ok(line) = printed.try_recv() {
        println!("{line}");
    }
}
