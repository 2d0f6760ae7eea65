//! `herald-relay`: a trivial WebSocket relay speaking just enough of Herald's v1 protocol
//! for the load generator and the chat examples — the baseline that makes the cost of
//! Herald's guarantees visible: pairs in `dm:` conversations, and room broadcast (every
//! subscriber of a `room:` gets each message sent to it). See `herald_examples::relay`.

#![forbid(unsafe_code)]
#![allow(clippy::print_stdout, reason = "a command-line program reports on stdout")]

use std::{io::Write as _, net::SocketAddr, process::ExitCode, time::Duration};

use clap::Parser;
use herald_examples::{
    loadgen::relay_process::LISTENING_PREFIX,
    relay::{Relay, RelayConfig},
    target::is_loopback_host,
};

/// A trivial Herald-protocol relay: no persistence, no retries, ids from a counter.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Address to listen on (port 0 picks a free port; the chosen URL is printed).
    #[arg(long, default_value = "127.0.0.1:7171")]
    listen: SocketAddr,
    /// Allow listening on a non-loopback address.
    #[arg(long)]
    allow_remote: bool,
    /// Frames queued per connection before it is closed as a slow consumer (4008).
    #[arg(long, default_value_t = 4096)]
    queue: usize,
    /// Largest accepted frame in bytes (1009 above it).
    #[arg(long, default_value_t = 1_048_576)]
    max_frame_bytes: usize,
    /// Seconds a new connection has to send `connect` (4002 after).
    #[arg(long, default_value_t = 10)]
    connect_timeout_s: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if !args.allow_remote && !is_loopback_host(&args.listen.ip().to_string()) {
        eprintln!("herald-relay: {} is not a loopback address; pass --allow-remote to listen there", args.listen);
        return ExitCode::from(2);
    }
    let config = RelayConfig {
        queue_capacity: args.queue.max(1),
        max_frame_bytes: args.max_frame_bytes,
        connect_timeout: Duration::from_secs(args.connect_timeout_s),
        ..RelayConfig::default()
    };
    let relay = match Relay::bind(args.listen, config).await {
        Ok(relay) => relay,
        Err(error) => {
            eprintln!("herald-relay: cannot listen on {}: {error}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let address = match relay.local_addr() {
        Ok(address) => address,
        Err(error) => {
            eprintln!("herald-relay: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!("{LISTENING_PREFIX}ws://{address}/v1/ws");
    let _ = std::io::stdout().flush();
    relay
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    ExitCode::SUCCESS
}
