//! `[intake]`: how much a node takes in before it pushes back. A node-wide rate is worth
//! setting at about 1.2× the expected peak: room for a spike above it, none for one that
//! would put every send behind; off by default, since only the operator knows the peak
//! (docs/decisions/0002). Every rate is per second with a burst on top; 0 turns that limit
//! off. Checked with the rest in
//! [`Config::validate`](super::Config::validate).

use serde::{Deserialize, Serialize};

/// `[intake]`: token buckets on new sends and HTTP requests, and caps on connections.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct IntakeConfig {
    /// New sends one connection may make per second; over it a send is answered RETRY
    /// with `retry_after_ms`.
    pub sends_per_connection: u32,
    /// Sends a connection may make at once above its rate (0: the rate).
    pub connection_burst: u32,
    /// New sends one user may make per second over all their devices.
    pub sends_per_user: u32,
    /// Sends a user may make at once above their rate (0: the rate).
    pub user_burst: u32,
    /// New sends the node takes per second from all its clients: set it to about 1.2× the
    /// expected peak. 0 (the default): no node-wide rate, only the backlog cap below.
    pub sends_per_node: u32,
    /// Sends the node takes at once above its rate (0: the rate).
    pub node_burst: u32,
    /// Sends taken in and not yet done (stored, acked and pushed to every recipient) on
    /// this node; at the cap a new send is answered RETRY. Bounds memory under a spike and
    /// keeps a backed-up node from queueing more. 0: no cap.
    pub max_sends_in_flight: usize,
    /// The wait for its ack, in ms, within which at least one send the node took in must be
    /// answered every 100 ms; when none was over a whole window, the node is queueing more
    /// than it serves just then (Redis or the database slow, an owner node overloaded, the
    /// machine shared), and new sends get RETRY until one is answered within it again. It
    /// acts long before the deadlines further in pass (a forwarded send's 2 s, a delivery
    /// hop's), which would turn the backlog into resends, fan-outs sent to every node and
    /// deliveries left to sync. 0: off.
    pub send_delay_target_ms: u32,
    /// The least wait, in ms, told to a send refused for the node's sake. Over
    /// `sends_per_node`, each turned-back send is given a turn: the first this far off,
    /// the next `1 / sends_per_node` later, and so on, so the clients come back at the
    /// pace the node takes sends in (the bucket's own wait, a fraction of a millisecond,
    /// would bring them all back at once). Over `max_sends_in_flight` or past
    /// `send_delay_target_ms`, a wait between
    /// this and twice this, at random. A connection's or user's own bucket tells its
    /// exact wait.
    pub node_retry_after_ms: u32,
    /// The longest wait, in ms, a send refused over `sends_per_node` is told.
    pub node_retry_after_max_ms: u32,
    /// HTTP requests one client address may make per second (`/healthz`, `/readyz`,
    /// `/metrics` and `/v1/ws` excepted); over it the answer is 429 with `Retry-After`.
    pub http_requests_per_ip: u32,
    /// HTTP requests a client address may make at once above its rate (0: the rate).
    pub http_burst: u32,
    /// WebSocket connections this node holds at most; the next upgrade is answered 503
    /// with `Retry-After`. 0: no cap.
    pub max_connections: usize,
    /// WebSocket connections from one IP address at most; the next is answered 429. Off by
    /// default (0): many clients share an address behind carrier NAT.
    pub max_connections_per_ip: usize,
}

impl Default for IntakeConfig {
    fn default() -> Self {
        Self {
            sends_per_connection: 1_000,
            connection_burst: 2_000,
            sends_per_user: 2_000,
            user_burst: 4_000,
            sends_per_node: 0,
            node_burst: 0,
            max_sends_in_flight: 50_000,
            send_delay_target_ms: 500,
            node_retry_after_ms: 100,
            node_retry_after_max_ms: 10_000,
            http_requests_per_ip: 1_000,
            http_burst: 2_000,
            max_connections: 200_000,
            max_connections_per_ip: 0,
        }
    }
}
