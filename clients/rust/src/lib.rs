//! Herald's client library for Rust (tokio), with the behaviour of `clients/SPEC.md` — the
//! same as the TypeScript library's, names spelled the Rust way.
//!
//! - [`Client::send`] stores exactly one message per call, whatever happens to the
//!   connection: `RETRY` and reconnects resend it with the same `client_msg_id`.
//! - Incoming messages come through [`Events`] once each, in seq order per conversation;
//!   gaps are filled with `sync` first. A message counts as handled (stored in the
//!   [`SeqStore`], acked) when its [`Delivery`] is dropped, or on [`Client::ack`].
//! - The client reconnects by itself (backoff with full jitter, `go_away` honoured, a silent
//!   server detected), re-joins its rooms from their last seq and catches up.
//!
//! ```no_run
//! use herald_client::{Client, ClientOptions, Event, SendOptions};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let (client, mut events) = Client::connect(ClientOptions::new("ws://127.0.0.1:7070/v1/ws", "dev:alice", "laptop"));
//! let sent = client.send("dm:alice:bob", "hello", SendOptions::default()).await?;
//! println!("stored as seq {}", sent.seq);
//! while let Some(event) = events.next().await {
//!     if let Event::Message(delivery) = event {
//!         println!("{}: {:?}", delivery.sender, delivery.body);
//!     } // dropped: handled, stored and acked
//! }
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

mod backoff;
mod client;
mod core;
mod driver;
mod error;
mod options;
mod order;
mod pacing;
mod store;
mod types;
mod wire;

pub use backoff::BackoffOptions;
pub use client::{Client, Events, uuid_v4};
pub use error::{ClientError, SendError};
pub use options::{AckMode, ClientInfo, ClientOptions, SendOptions, Token, TokenFuture, TokenProvider, TokenReason};
pub use store::{MemorySeqStore, SeqStore};
pub use types::{
    ConnectedInfo, Delivery, DisconnectedInfo, Event, GoAwayInfo, HistoryPage, Message, ResumedInfo, RetryInfo, Sent,
    State, Subscribed, SyncedConversation,
};
pub use wire::Encoding;

/// The rustls this crate speaks `wss://` with, for [`ClientOptions::tls`].
pub use rustls;
