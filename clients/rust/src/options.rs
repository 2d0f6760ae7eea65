//! How a client is set up: where, who, and the knobs of SPEC.md.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::wire::Encoding;

use crate::backoff::BackoffOptions;
use crate::store::{MemorySeqStore, SeqStore};

/// Why the token provider is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenReason {
    /// The first connection.
    Initial,
    /// The last token was refused (close 4001).
    Expired,
}

/// A boxed future of a token.
pub type TokenFuture = Pin<Box<dyn Future<Output = Result<String, String>> + Send>>;

/// Returns a token (a JWT, or `dev:<user>` against a dev-mode server).
pub trait TokenProvider: Send + Sync {
    /// A token for the next connection; `Err` is reported and retried after a backoff.
    fn token(&self, reason: TokenReason) -> TokenFuture;
}

impl<F, Fut> TokenProvider for F
where
    F: Fn(TokenReason) -> Fut + Send + Sync,
    Fut: Future<Output = Result<String, String>> + Send + 'static,
{
    fn token(&self, reason: TokenReason) -> TokenFuture {
        Box::pin(self(reason))
    }
}

/// A fixed token, or a provider called again after a 4001 close.
#[derive(Clone)]
pub enum Token {
    /// Used as is; a 4001 close is final.
    Fixed(String),
    /// Asked for the first connection and after each 4001.
    Provider(Arc<dyn TokenProvider>),
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fixed(_) => f.write_str("Token::Fixed(..)"),
            Self::Provider(_) => f.write_str("Token::Provider(..)"),
        }
    }
}

impl From<&str> for Token {
    fn from(token: &str) -> Self {
        Self::Fixed(token.to_owned())
    }
}

impl From<String> for Token {
    fn from(token: String) -> Self {
        Self::Fixed(token)
    }
}

impl Token {
    /// A provider from an async closure taking the [`TokenReason`].
    pub fn provider(provider: impl TokenProvider + 'static) -> Self {
        Self::Provider(Arc::new(provider))
    }
}

/// When an incoming message counts as handled (stored and acked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AckMode {
    /// When its [`Delivery`](crate::Delivery) is dropped.
    #[default]
    Auto,
    /// When the application calls [`Client::ack`](crate::Client::ack).
    Manual,
}

/// What the client says it is: the `client` of the `connect` frame. Informational: the
/// server neither checks it nor acts on it, so it may name the application rather than
/// this library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientInfo {
    /// The software's name (default `herald-client-rust`).
    pub name: String,
    /// Its version (default this crate's).
    pub version: String,
}

impl Default for ClientInfo {
    /// This library: `herald-client-rust` and the crate's version.
    fn default() -> Self {
        Self { name: "herald-client-rust".to_owned(), version: env!("CARGO_PKG_VERSION").to_owned() }
    }
}

/// Everything a client needs; [`ClientOptions::new`] fills in SPEC.md's defaults.
#[derive(Clone)]
pub struct ClientOptions {
    /// The WebSocket URL, e.g. `ws://127.0.0.1:7070/v1/ws`.
    pub url: String,
    /// A token, or a provider of tokens.
    pub token: Token,
    /// This device's id: 1–128 bytes of `[A-Za-z0-9._@-]`.
    pub device_id: String,
    /// The subprotocol (default protobuf).
    pub encoding: Encoding,
    /// Where the last handled seq per conversation is kept.
    pub store: Arc<dyn SeqStore>,
    /// When a message counts as handled.
    pub ack: AckMode,
    /// Reconnect backoff (full jitter).
    pub reconnect: BackoffOptions,
    /// Longest silence of the server before it is taken as gone (default 15 s); the client
    /// waits `heartbeat_ms` + 3 s when that is shorter, and pings by itself when it is not.
    pub dead_after: Duration,
    /// From opening the socket to `connected`, before the attempt counts as failed (10 s).
    pub connect_timeout: Duration,
    /// Most sends awaiting their `send_ack` at once (1000); the window halves on RETRY.
    pub max_in_flight_sends: usize,
    /// Frames per second the client writes at most (1,800, under the server's default of
    /// 2,000 past which it closes with 4029); 0: no limit. Acks and pongs are counted, never delayed.
    pub max_frames_per_second: u32,
    /// How long a gap may last without progress before it is pulled with `sync` (250 ms).
    pub gap_timeout: Duration,
    /// Acks are coalesced for this long (25 ms).
    pub ack_delay: Duration,
    /// After each connect, ask where each conversation stands (`sync`, limit 1; default on).
    pub catch_up_on_connect: bool,
    /// Largest send body, refused locally above it (1 MiB less 1 KiB).
    pub max_body_bytes: usize,
    /// Consecutive 4001 closes before the client gives up (3).
    pub max_auth_failures: u32,
    /// Sent in `connect` as its `client` (default: this library's name and version).
    pub client_info: ClientInfo,
    /// TLS for `wss://` URLs: `None` (the default) trusts the Mozilla roots (webpki-roots)
    /// with rustls on ring; give a config of your own for other roots or a client
    /// certificate (`herald_client::rustls` is the version this crate uses).
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// Events waiting in [`Events`](crate::Events) at most (1,024). When the application
    /// does not read them, the client stops reading the socket: the server queues for it,
    /// and past its limit closes the connection (4008, slow consumer); the client then
    /// reconnects and catches up once events are read again. Nothing is lost: messages not
    /// handled are not acked, so the server pushes them again.
    pub event_capacity: usize,
    /// How long [`Client::close`](crate::Client::close) waits for the deliveries already
    /// handed over to be handled, so that their acks go out (5 s).
    pub close_timeout: Duration,
}

impl fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientOptions")
            .field("url", &self.url)
            .field("device_id", &self.device_id)
            .field("encoding", &self.encoding)
            .field("ack", &self.ack)
            .finish_non_exhaustive()
    }
}

impl ClientOptions {
    /// Options with SPEC.md's defaults and an in-memory store.
    pub fn new(url: impl Into<String>, token: impl Into<Token>, device_id: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            token: token.into(),
            device_id: device_id.into(),
            encoding: Encoding::Proto,
            store: Arc::new(MemorySeqStore::new()),
            ack: AckMode::Auto,
            reconnect: BackoffOptions::default(),
            dead_after: Duration::from_secs(15),
            connect_timeout: Duration::from_secs(10),
            max_in_flight_sends: 1_000,
            max_frames_per_second: 1_800,
            gap_timeout: Duration::from_millis(250),
            ack_delay: Duration::from_millis(25),
            catch_up_on_connect: true,
            max_body_bytes: 1_047_552,
            max_auth_failures: 3,
            client_info: ClientInfo::default(),
            tls: None,
            event_capacity: 1_024,
            close_timeout: Duration::from_secs(5),
        }
    }
}

/// Options of one send.
#[derive(Debug, Clone, Default)]
pub struct SendOptions {
    /// Application-defined kind (default 0).
    pub kind: u32,
    /// Reuse an id to settle an earlier send whose outcome is unknown (a UUID).
    pub client_msg_id: Option<String>,
    /// Give up waiting after this long (the message may still be stored).
    pub timeout: Option<Duration>,
}
