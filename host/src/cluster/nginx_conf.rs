//! `herald cluster nginx-conf`: an nginx config that sends every user's connections to its
//! home node (`cluster.placement`, OPERATIONS.md "Placement"), built from a live node's
//! `GET /admin/cluster`.
//!
//! The upstream lists the live nodes' client addresses in the order of node ids, with the
//! hash the cluster's placement names, so nginx picks exactly the node Herald computes as
//! the home. `max_fails=0` and `proxy_next_upstream off` keep nginx from quietly sending a
//! user elsewhere while its home is slow or down: another node would serve it, but without
//! the parked session its reconnect should resume. Every request carries the upstream's
//! digest (`X-Herald-Upstream`), so a node can tell when nginx's config is older than the
//! membership.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The least time nginx waits on a quiet connection: above the server's heartbeat and the
/// time the server gives a silent client, so nginx never cuts a connection Herald keeps.
const LEAST_PROXY_TIMEOUT_S: u64 = 120;

/// Devices one nginx worker process can hold: each takes two of its connections and two
/// file descriptors. nginx's default (512 connections) would turn devices away past 256 a
/// worker.
const DEVICES_PER_WORKER: u32 = 16_384;
/// How long the command waits for the node's answer.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read from the node.
const MAX_ANSWER_BYTES: u64 = 4 << 20;

/// What went wrong making the config.
#[derive(Debug, thiserror::Error)]
pub enum NginxConfError {
    #[error("--url must be http://host:port (a node's plain HTTP listener), not {0:?}")]
    Url(String),
    #[error("cannot reach {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("GET /admin/cluster on {url} answered {status}: {body}")]
    Refused { url: String, status: u16, body: String },
    #[error("GET /admin/cluster on {url} gave no usable answer: {reason}")]
    Unusable { url: String, reason: String },
    #[error(
        "the cluster's placement is \"none\": users have no home node to send them to. Set cluster.placement \
         (HERALD_CLUSTER__PLACEMENT) to \"nginx-consistent\" or \"nginx-hash\" on every node first"
    )]
    NoPlacement,
    #[error("the cluster lists no node with a client address; set cluster.client_url on each node")]
    NoNodes,
}

/// The part of `/admin/cluster` the config is made from.
#[derive(Debug, Deserialize)]
pub struct ClusterPlacement {
    /// The ring epoch the upstream was read at.
    #[serde(default)]
    pub epoch: u64,
    pub placement: Placement,
}

/// `/admin/cluster`'s `placement`.
#[derive(Debug, Deserialize)]
pub struct Placement {
    pub mode: String,
    pub digest: String,
    pub upstream: Vec<Server>,
    #[serde(default)]
    pub heartbeat_ms: u64,
}

/// One server of the upstream.
#[derive(Debug, Deserialize)]
pub struct Server {
    pub node: u32,
    pub address: String,
}

/// What the config listens on, besides what the cluster says.
#[derive(Debug, Clone)]
pub struct Frontend {
    /// nginx's `listen` (`80`, `0.0.0.0:8080`, `127.0.0.1:8443 ssl`).
    pub listen: String,
    /// Where the config was read from, for its header comment.
    pub source: String,
}

/// Reads `GET /admin/cluster` from the node at `url` (`http://host:port`) with `key`.
///
/// # Errors
/// [`NginxConfError`] naming what failed: a URL that is not `http://`, a node that cannot
/// be reached or refuses the key, an answer without placement.
pub async fn fetch(url: &str, key: &str) -> Result<ClusterPlacement, NginxConfError> {
    let authority = url
        .strip_prefix("http://")
        .map(|rest| rest.trim_end_matches('/'))
        .filter(|rest| !rest.is_empty() && !rest.contains('/'))
        .ok_or_else(|| NginxConfError::Url(url.to_owned()))?;
    let unreachable = |reason: String| NginxConfError::Unreachable { url: url.to_owned(), reason };
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(authority).await?;
        let request = format!(
            "GET /admin/cluster HTTP/1.1\r\nHost: {authority}\r\nAuthorization: Bearer {key}\r\n\
             Accept: application/json\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.take(MAX_ANSWER_BYTES).read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(FETCH_TIMEOUT, exchange)
        .await
        .map_err(|_| unreachable(format!("no answer within {FETCH_TIMEOUT:?}")))?
        .map_err(|error| unreachable(error.to_string()))?;
    let (status, body) = split_answer(&answer)
        .ok_or_else(|| NginxConfError::Unusable { url: url.to_owned(), reason: "not an HTTP/1.1 answer".into() })?;
    if status != 200 {
        let body = String::from_utf8_lossy(&body).chars().take(500).collect();
        return Err(NginxConfError::Refused { url: url.to_owned(), status, body });
    }
    serde_json::from_slice(&body)
        .map_err(|error| NginxConfError::Unusable { url: url.to_owned(), reason: error.to_string() })
}

/// The status and body of an HTTP/1.1 answer (a chunked body decoded).
fn split_answer(answer: &[u8]) -> Option<(u16, Vec<u8>)> {
    let end = answer.windows(4).position(|window| window == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&answer[..end]).ok()?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let body = &answer[end + 4..];
    let chunked = head.lines().any(|line| {
        let line = line.to_ascii_lowercase();
        line.starts_with("transfer-encoding:") && line.contains("chunked")
    });
    if !chunked {
        return Some((status, body.to_vec()));
    }
    let (mut decoded, mut rest) = (Vec::new(), body);
    loop {
        let line_end = rest.windows(2).position(|window| window == b"\r\n")?;
        let size_text = std::str::from_utf8(&rest[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some((status, decoded));
        }
        let chunk = rest.get(line_end + 2..line_end + 2 + size)?;
        decoded.extend_from_slice(chunk);
        rest = rest.get(line_end + 4 + size..)?;
    }
}

/// The nginx config for `cluster`.
///
/// # Errors
/// [`NginxConfError::NoPlacement`] when the cluster has no placement,
/// [`NginxConfError::NoNodes`] when no node has a client address.
pub fn render(cluster: &ClusterPlacement, frontend: &Frontend) -> Result<String, NginxConfError> {
    let placement = &cluster.placement;
    let hash = match placement.mode.as_str() {
        "nginx-consistent" => "hash $arg_user consistent;",
        "nginx-hash" => "hash $arg_user;",
        _ => return Err(NginxConfError::NoPlacement),
    };
    if placement.upstream.is_empty() {
        return Err(NginxConfError::NoNodes);
    }
    // Four heartbeats: the node writes to every connection at least once a heartbeat, so a
    // live connection is never that quiet on the node's side.
    let timeout = (placement.heartbeat_ms.saturating_mul(4) / 1000).max(LEAST_PROXY_TIMEOUT_S);
    let digest = &placement.digest;
    let mut servers = String::new();
    for server in &placement.upstream {
        let _ = writeln!(servers, "        server {} max_fails=0;  # node {}", server.address, server.node);
    }
    Ok(format!(
        "# Generated by `herald cluster nginx-conf` from {source} (ring epoch {epoch}).
# Placement {mode}: nginx sends each user's connections (`/v1/ws?user=<user>`) to its home
# node, the node Herald computes from the same upstream. Generate it again and reload nginx
# (`nginx -s reload`) whenever a node joins or leaves; until then `GET /admin/cluster` on the
# nodes shows placement.nginx_matches = false.
# Upstream digest: {digest}

worker_processes auto;
# A WebSocket holds two connections in a worker (the client's and the node's), each a file
# descriptor: room for {devices} devices a worker process.
worker_rlimit_nofile {descriptors};

events {{
    worker_connections {connections};
}}

http {{
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        ''      close;
    }}

    upstream herald {{
        # The order of the servers is part of the hash: keep them in node id order.
        {hash}
{servers}    }}

    server {{
        listen {listen};

        location / {{
            proxy_pass http://herald;
            # Never move a user to another node behind Herald's back: a device must reach
            # its home, where its parked session waits, or fail and retry.
            proxy_next_upstream off;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Herald-Upstream {digest};
            proxy_connect_timeout 5s;
            proxy_read_timeout {timeout}s;
            proxy_send_timeout {timeout}s;
            proxy_buffering off;
            add_header X-Herald-Upstream-Digest {digest} always;
        }}
    }}
}}
",
        source = frontend.source,
        epoch = cluster.epoch,
        mode = placement.mode,
        listen = frontend.listen,
        devices = DEVICES_PER_WORKER,
        connections = 2 * DEVICES_PER_WORKER,
        // The connections' descriptors and room for the worker's own (logs, listeners).
        descriptors = 2 * DEVICES_PER_WORKER + 1024,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(mode: &str, servers: &[&str]) -> ClusterPlacement {
        let upstream = servers
            .iter()
            .enumerate()
            .map(|(node, address)| Server { node: node as u32, address: (*address).to_owned() })
            .collect();
        let placement = Placement { mode: mode.into(), digest: "0123abcd".into(), upstream, heartbeat_ms: 10_000 };
        ClusterPlacement { epoch: 7, placement }
    }

    fn frontend() -> Frontend {
        Frontend { listen: "80".into(), source: "http://10.0.0.1:7070".into() }
    }

    #[test]
    fn the_config_lists_the_nodes_in_order_and_never_moves_a_user_quietly() {
        let text =
            render(&cluster("nginx-consistent", &["10.0.0.1:7070", "10.0.0.2:7070"]), &frontend()).expect("rendered");
        for line in [
            "hash $arg_user consistent;",
            "server 10.0.0.1:7070 max_fails=0;  # node 0\n        server 10.0.0.2:7070 max_fails=0;  # node 1",
            "proxy_next_upstream off;",
            "proxy_set_header Upgrade $http_upgrade;",
            "proxy_set_header X-Herald-Upstream 0123abcd;",
            "proxy_read_timeout 120s;",
            "proxy_send_timeout 120s;",
            "listen 80;",
        ] {
            assert!(text.contains(line), "{line:?} missing in:\n{text}");
        }
        // Thousands of devices a worker, each two connections and two descriptors.
        let number = |directive: &str| -> u32 {
            let line = text.lines().find(|line| line.trim_start().starts_with(directive)).expect(directive);
            line.trim().trim_start_matches(directive).trim().trim_end_matches(';').parse().expect("a number")
        };
        let connections = number("worker_connections");
        assert!(connections >= 2 * 10_000, "worker_connections {connections} holds under 10,000 devices");
        assert!(number("worker_rlimit_nofile") > connections, "a descriptor for each connection:\n{text}");
        let plain = render(&cluster("nginx-hash", &["10.0.0.1:7070"]), &frontend()).expect("rendered");
        assert!(plain.contains("hash $arg_user;"), "{plain}");
    }

    #[test]
    fn no_config_without_placement_or_nodes() {
        let error = render(&cluster("none", &["10.0.0.1:7070"]), &frontend()).expect_err("no placement");
        assert!(error.to_string().contains("HERALD_CLUSTER__PLACEMENT"), "{error}");
        assert!(matches!(render(&cluster("nginx-hash", &[]), &frontend()), Err(NginxConfError::NoNodes)));
    }

    #[test]
    fn an_answer_is_split_whether_chunked_or_not() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(split_answer(plain), Some((200, b"{}".to_vec())));
        let chunked =
            b"HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(split_answer(chunked), Some((401, b"abcde".to_vec())));
        assert_eq!(split_answer(b"garbage"), None);
    }
}
