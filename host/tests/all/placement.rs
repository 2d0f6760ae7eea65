//! Herald's home nodes against a real nginx: for many random users, the node Herald
//! computes (`routing::placement::Homes`) is the upstream nginx picks, with `hash $arg_user
//! consistent;` and with plain `hash $arg_user;`, over 3, 4 and 7 servers listed as
//! `herald cluster nginx-conf` lists them. The servers are tiny HTTP listeners of this test;
//! nginx names the one it picked in a header.

use std::collections::HashMap;

use herald_host::config::Placement;
use herald_host::model::NodeId;
use herald_host::routing::placement::Homes;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::nginx::Nginx;

/// Requests in flight at once.
const CONNECTIONS: usize = 8;

/// A listener answering every request with an empty 200 and closing.
async fn upstream_server() -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind an upstream");
    let address = listener.local_addr().expect("addr").to_string();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(read) => request.extend_from_slice(&buffer[..read]),
                    }
                }
                let answer = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    (address, task)
}

fn config(hash: &str, servers: &[String]) -> String {
    let lines: String = servers.iter().map(|s| format!("        server {s} max_fails=0;\n")).collect();
    format!(
        "worker_processes 1;
events {{ worker_connections 1024; }}
http {{
    upstream herald {{
        {hash}
{lines}    }}
    server {{
        listen LISTEN;
        # One client connection asks for thousands of picks.
        keepalive_requests 1000000;
        location / {{
            proxy_pass http://herald;
            proxy_next_upstream off;
            add_header X-Upstream $upstream_addr always;
        }}
    }}
}}
"
    )
}

/// A user id of the kind clients send: letters, digits and `._-@`, 1 to 24 characters.
fn random_user() -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-@";
    let len = 1 + rand::random::<u32>() as usize % 24;
    (0..len).map(|_| CHARS[rand::random::<u32>() as usize % CHARS.len()] as char).collect()
}

/// Asks nginx (keep-alive) which upstream it picks for each of `users`.
async fn nginx_picks(port: u16, users: Vec<String>) -> Vec<(String, String)> {
    let mut connection = BufReader::new(TcpStream::connect(("127.0.0.1", port)).await.expect("connect to nginx"));
    let mut picks = Vec::with_capacity(users.len());
    for user in users {
        let request = format!("GET /?user={user} HTTP/1.1\r\nHost: placement\r\n\r\n");
        connection.get_mut().write_all(request.as_bytes()).await.expect("request");
        let (mut upstream, mut length, mut status) = (None, 0usize, String::new());
        loop {
            let mut line = String::new();
            let read = connection.read_line(&mut line).await.expect("answer");
            assert!(read > 0, "nginx closed the connection");
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if status.is_empty() {
                status = line.to_owned();
            }
            let lower = line.to_ascii_lowercase();
            if let Some(value) = lower.strip_prefix("x-upstream:") {
                upstream = Some(value.trim().to_owned());
            } else if let Some(value) = lower.strip_prefix("content-length:") {
                length = value.trim().parse().expect("content length");
            }
        }
        let mut body = vec![0u8; length];
        connection.read_exact(&mut body).await.expect("body");
        assert!(status.contains(" 200 "), "nginx answered {status} for user {user:?}");
        let upstream = upstream.unwrap_or_else(|| panic!("no X-Upstream for user {user:?}"));
        picks.push((user, upstream));
    }
    picks
}

async fn herald_homes_are_nginx_picks(placement: Placement, servers: usize, users: usize) {
    let mut upstreams = Vec::new();
    for _ in 0..servers {
        upstreams.push(upstream_server().await);
    }
    let addresses: Vec<String> = upstreams.iter().map(|(address, _)| address.clone()).collect();
    let hash = match placement {
        Placement::NginxConsistent => "hash $arg_user consistent;",
        Placement::NginxHash => "hash $arg_user;",
        Placement::None => unreachable!("no nginx mode"),
    };
    let nginx = Nginx::start(&config(hash, &addresses)).await;
    // Node ids out of step with the positions: Herald orders the upstream by node id.
    let upstream: Vec<(NodeId, String)> =
        addresses.iter().enumerate().map(|(i, a)| (NodeId(10 * i as u32 + 3), a.clone())).collect();
    let homes = Homes::new(placement, upstream.clone());
    let address_of: HashMap<NodeId, String> = upstream.into_iter().collect();
    let all: Vec<String> = (0..users).map(|_| random_user()).collect();
    let mut batches = Vec::new();
    for chunk in all.chunks(users.div_ceil(CONNECTIONS)) {
        batches.push(tokio::spawn(nginx_picks(nginx.port, chunk.to_vec())));
    }
    let (mut checked, mut used) = (0usize, std::collections::BTreeSet::new());
    for batch in batches {
        for (user, picked) in batch.await.expect("a batch") {
            let home = homes.home(&user).unwrap_or_else(|| panic!("no home for {user:?}"));
            assert_eq!(
                address_of[&home],
                picked,
                "{placement} over {servers} servers: user {user:?} has home {home} but nginx picked {picked}\n{}",
                nginx.logs()
            );
            used.insert(picked);
            checked += 1;
        }
    }
    assert_eq!((checked, used.len()), (users, servers), "every user checked, every server used");
    for (_, task) in upstreams {
        task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_homes_are_nginx_consistent_hash_picks_for_3_4_and_7_servers() {
    for servers in [3, 4, 7] {
        herald_homes_are_nginx_picks(Placement::NginxConsistent, servers, 10_000).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_homes_are_nginx_plain_hash_picks_for_3_4_and_7_servers() {
    for servers in [3, 4, 7] {
        herald_homes_are_nginx_picks(Placement::NginxHash, servers, 10_000).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_homes_are_nginx_picks_for_100_000_users_over_7_servers_in_both_modes() {
    for placement in [Placement::NginxConsistent, Placement::NginxHash] {
        herald_homes_are_nginx_picks(placement, 7, 100_000).await;
    }
}
