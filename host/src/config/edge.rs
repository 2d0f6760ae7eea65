//! `[gateway]` and `[api]`: what the node accepts from the outside — WebSocket connections
//! and their tokens, HTTP requests and their keys — and the limits that keep one client
//! from taking more than its share (PROTOCOL.md's close codes and statuses for each).
//! Checked with the rest in [`Config::validate`](super::Config::validate).

use serde::{Deserialize, Serialize};

/// `[gateway]`: WebSocket connections.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// The server writes to each connection at least every this many ms: a `ping` when it
    /// has nothing else to send. Clients take a silence of this plus a margin as a dead
    /// server, so it bounds how soon they notice one.
    pub heartbeat_ms: u64,
    /// A connection from which no frame came for this many ms is closed (1000). The server's
    /// pings ask for a `pong` from three heartbeats before it runs out, so an idle client that
    /// answers stays. It is also how long a route lives in Redis unless its node refreshes
    /// it. At least three heartbeats.
    pub client_timeout_ms: u64,
    /// The first frame must be `connect` within this many ms (close 4002 otherwise).
    pub connect_timeout_ms: u64,
    /// Largest frame accepted, in bytes (close 1009 otherwise).
    pub max_frame_bytes: usize,
    /// Frames queued for one connection before it is closed as a slow consumer (4008).
    pub send_queue: usize,
    /// Each connection's read buffer, in bytes: held for the connection's life (a frame
    /// larger than it grows it to the frame's size). Smaller costs idle connections less
    /// memory and a busy client more reads.
    pub read_buffer_bytes: usize,
    /// HS256 secret for client tokens. Required outside dev mode; dev mode has a fixed one.
    pub jwt_secret: Option<String>,
    /// When set, a token's `iss` claim must be exactly this.
    pub jwt_issuer: Option<String>,
    /// When set, a token's `aud` claim must name this audience. Unset, `aud` is not checked.
    pub jwt_audience: Option<String>,
    /// Longest token accepted, in bytes; a longer one is refused unread (4001 / 401).
    pub max_token_bytes: usize,
    /// Frames (Herald frames and WebSocket pings alike) one connection may send per
    /// second; over it, and its burst, the connection is closed with 4029. 0 turns it off.
    pub frames_per_second: u32,
    /// Frames a connection may send at once above its rate (0: the rate).
    pub frame_burst: u32,
    /// An HTTP request's headers — the WebSocket upgrade's too — must arrive within this
    /// many ms of the connection opening (or of the previous response); else the
    /// connection is closed. Cuts off slow-header clients and sockets that never send.
    pub header_read_timeout_ms: u64,
    /// On shutdown each connection gets `go_away` with a `reconnect_after_ms` drawn from
    /// 0..this, so the clients of a restarted node do not all come back in the same instant.
    pub go_away_spread_ms: u32,
    /// On shutdown `/readyz` answers 503 `draining` for this many ms while the node goes on
    /// serving as before (new connections too); only then does it stop accepting and send
    /// its clients away. Set it above your load balancer's probe interval, so that the
    /// balancer stops sending clients here before the listener closes. 0: at once.
    pub shutdown_delay_ms: u64,
    /// A dropped connection is kept this many ms for its device's return, noting what it is
    /// owed; a device back in time is backfilled only that, not every conversation (a quick
    /// reconnect causes no backfill storm). 0 turns this off.
    pub reconnect_grace_ms: u64,
    /// TCP keepalive on client sockets: probes start after this many ms of silence on the
    /// socket, every 10 s, 3 unanswered close it (a peer gone without a FIN is noticed even
    /// while a write waits). 0 turns it off.
    pub tcp_keepalive_ms: u64,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            heartbeat_ms: 12_000,
            client_timeout_ms: 90_000,
            connect_timeout_ms: 10_000,
            max_frame_bytes: 1 << 20,
            send_queue: 1024,
            read_buffer_bytes: 1024,
            jwt_secret: None,
            jwt_issuer: None,
            jwt_audience: None,
            max_token_bytes: 8 * 1024,
            frames_per_second: 2_000,
            frame_burst: 4_000,
            header_read_timeout_ms: 10_000,
            go_away_spread_ms: 5_000,
            shutdown_delay_ms: 0,
            reconnect_grace_ms: 30_000,
            tcp_keepalive_ms: 60_000,
        }
    }
}

/// Longest `gateway.shutdown_delay_ms` accepted.
const MAX_SHUTDOWN_DELAY_MS: u64 = 600_000;

impl GatewayConfig {
    /// Checks the settings make sense.
    ///
    /// # Errors
    /// A message naming the offending setting.
    pub fn validate(&self) -> Result<(), String> {
        let at_least_one = [
            ("heartbeat_ms", self.heartbeat_ms),
            ("client_timeout_ms", self.client_timeout_ms),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("send_queue", self.send_queue as u64),
            ("header_read_timeout_ms", self.header_read_timeout_ms),
        ];
        if let Some((name, _)) = at_least_one.iter().find(|(_, value)| *value == 0) {
            return Err(format!("gateway.{name} must be at least 1"));
        }
        if self.client_timeout_ms < self.heartbeat_ms.saturating_mul(3) {
            return Err(format!(
                "gateway.client_timeout_ms {} must be at least three heartbeats (3 × gateway.heartbeat_ms {}): the \
                 server asks an idle client for an answer from three heartbeats before its timeout",
                self.client_timeout_ms, self.heartbeat_ms
            ));
        }
        if self.max_frame_bytes < 64 {
            return Err(format!("gateway.max_frame_bytes {} must be at least 64", self.max_frame_bytes));
        }
        if self.read_buffer_bytes < 256 {
            return Err(format!("gateway.read_buffer_bytes {} must be at least 256", self.read_buffer_bytes));
        }
        if self.max_token_bytes < 64 {
            return Err(format!("gateway.max_token_bytes {} must be at least 64", self.max_token_bytes));
        }
        if self.shutdown_delay_ms > MAX_SHUTDOWN_DELAY_MS {
            return Err(format!(
                "gateway.shutdown_delay_ms {} is more than {MAX_SHUTDOWN_DELAY_MS} (10 minutes): a service manager \
                 would kill the node first",
                self.shutdown_delay_ms
            ));
        }
        Ok(())
    }
}

/// `[api]`: keys for server-to-server and admin calls, and the limits of HTTP requests.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiConfig {
    /// Keys game servers and backends use (`Authorization: Bearer <key>`).
    pub keys: Vec<String>,
    /// Keys for `/admin/*`.
    pub admin_keys: Vec<String>,
    /// Largest HTTP request body, in bytes (413 `too_large` otherwise).
    pub max_body_bytes: usize,
    /// An HTTP request (its body read and its answer made) must finish within this many
    /// ms (408 `timeout` otherwise); cuts off clients that trickle a body.
    pub request_timeout_ms: u64,
    /// Most members one group may hold (409 `limit_exceeded` past it).
    pub max_group_members: usize,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            admin_keys: Vec::new(),
            max_body_bytes: 1 << 20,
            request_timeout_ms: 30_000,
            max_group_members: 10_000,
        }
    }
}

impl ApiConfig {
    /// Checks the settings make sense.
    ///
    /// # Errors
    /// A message naming the offending setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_body_bytes < 1024 {
            return Err(format!("api.max_body_bytes {} must be at least 1024", self.max_body_bytes));
        }
        if self.request_timeout_ms == 0 || self.max_group_members == 0 {
            return Err("api.request_timeout_ms and max_group_members must be at least 1".into());
        }
        Ok(())
    }
}
