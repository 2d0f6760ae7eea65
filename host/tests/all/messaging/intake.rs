//! Intake protection (`[intake]`, OPERATIONS.md): a client over its budget is told RETRY with
//! `retry_after_ms` and loses nothing once it slows down; HTTP callers over their rate get
//! 429 with `Retry-After`; connections over a cap are refused at the upgrade with 503
//! (node full) or 429 (one address's share); client sockets have TCP keepalive.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use herald_proto::v1::send_ack::Status;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite;

use super::client::Client;
use super::server::{DEV_KEY, Herald};
use super::{WAIT, dm, metric, uuid};
use crate::support::poll::poll;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_ten_times_its_budget_gets_retry_and_loses_nothing_once_it_slows_down() {
    let herald =
        Herald::with().set("INTAKE__SENDS_PER_CONNECTION", 20).set("INTAKE__CONNECTION_BURST", 20).start().await;
    let mut alice = Client::connect(&herald, "alice", "phone").await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let conversation = dm("alice", "bob");

    // 200 sends at once: ten times the connection's burst.
    let mut pending: BTreeMap<String, String> = BTreeMap::new();
    for n in 0..200 {
        let (id, body) = (uuid(), format!("message {n}"));
        alice.send_with(&id, &conversation, 1, body.as_bytes()).await;
        pending.insert(id, body);
    }
    let (mut ok, mut retry, mut longest_wait) = (0, 0, 0);
    let mut to_resend = Vec::new();
    for id in pending.keys() {
        let ack = alice.ack_of(id).await;
        match ack.status() {
            Status::Ok => ok += 1,
            Status::Retry => {
                retry += 1;
                assert!(ack.retry_after_ms > 0, "a RETRY from the intake says when: {ack:?}");
                assert!(ack.reason.contains("sends_per_connection"), "and which limit: {ack:?}");
                assert_eq!((ack.message_id, ack.seq), (0, 0), "nothing was stored: {ack:?}");
                longest_wait = longest_wait.max(ack.retry_after_ms);
                to_resend.push(id.clone());
            }
            other => panic!("{}", alice.failure(&format!("unexpected status {other:?}: {ack:?}"))),
        }
    }
    assert!(ok >= 20, "the burst is taken in: {ok} OK");
    assert!(retry >= 50, "a 10× flood is largely told to retry: {retry} RETRY");
    // 20 a second: the next token is never more than 50 ms away.
    assert!(longest_wait <= 50, "retry_after_ms is the bucket's real wait: {longest_wait}");

    // Slowed down to the budget (one send per retry_after_ms), every RETRY goes through.
    for id in &to_resend {
        let deadline = Instant::now() + WAIT;
        loop {
            alice.send_with(id, &conversation, 1, pending[id].as_bytes()).await;
            let ack = alice.ack_of(id).await;
            match ack.status() {
                Status::Ok => break,
                Status::Retry if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(u64::from(ack.retry_after_ms))).await;
                }
                _ => panic!("{}", alice.failure(&format!("a resend at the budget must end OK: {ack:?}"))),
            }
        }
    }

    // Bob has every message exactly once, each with its own seq.
    let delivered = bob.distinct_deliveries(&conversation, 200).await;
    let bodies: HashSet<_> = delivered.iter().map(|m| String::from_utf8_lossy(&m.body).into_owned()).collect();
    let expected: HashSet<_> = pending.values().cloned().collect();
    assert_eq!(bodies, expected, "every message arrives once");
    let seqs: HashSet<_> = delivered.iter().map(|m| m.seq).collect();
    assert_eq!(seqs.len(), 200, "one seq per message: nothing refused was stored");

    let metrics = herald.get("/metrics", None).await.body;
    let refused = metric(&metrics, "herald_intake_refused_total{limit=\"connection\"}");
    assert!(refused >= retry as f64, "the refusals are counted: {refused} < {retry}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_over_the_per_user_rate_is_told_to_retry_on_every_device() {
    let herald = Herald::with()
        .set("INTAKE__SENDS_PER_USER", 1)
        .set("INTAKE__USER_BURST", 5)
        .set("INTAKE__SENDS_PER_CONNECTION", 0)
        .start()
        .await;
    let mut phone = Client::connect(&herald, "alice", "phone").await;
    let mut laptop = Client::connect(&herald, "alice", "laptop").await;
    let conversation = dm("alice", "bob");
    let started = Instant::now();
    let mut acks = Vec::new();
    for n in 0..10 {
        let device = if n % 2 == 0 { &mut phone } else { &mut laptop };
        acks.push(device.send(&conversation, format!("{n}")).await);
    }
    // A burst of 5, then one a second, for the user over both devices.
    let allowed = 5 + started.elapsed().as_secs() as usize + 1;
    let ok = acks.iter().filter(|ack| ack.status() == Status::Ok).count();
    let retried: Vec<_> = acks.iter().filter(|ack| ack.status() == Status::Retry).collect();
    assert!(ok >= 5 && ok <= allowed, "{ok} OK of 10, at most {allowed} allowed: {acks:?}");
    assert_eq!(ok + retried.len(), 10, "{acks:?}");
    assert!(retried.iter().all(|ack| ack.reason.contains("sends_per_user") && ack.retry_after_ms > 0), "{retried:?}");
    // Bob is not alice: his budget is his own.
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    bob.send_ok(&conversation, "bob's own budget").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_callers_over_their_rate_get_429_with_retry_after_and_probes_are_never_limited() {
    let herald = Herald::with().set("INTAKE__HTTP_REQUESTS_PER_IP", 1).set("INTAKE__HTTP_BURST", 3).start().await;
    let mut statuses = Vec::new();
    let mut limited = None;
    for _ in 0..10 {
        let response = herald.get("/admin/health", Some(DEV_KEY)).await;
        statuses.push(response.status);
        if response.status == 429 && limited.is_none() {
            limited = Some(response);
        }
    }
    let limited = limited.unwrap_or_else(|| panic!("10 requests at a rate of 1/s must meet a 429: {statuses:?}"));
    assert_eq!(limited.error_code(), "rate_limited");
    let retry_after: u64 = limited.header("retry-after").expect("Retry-After").parse().expect("seconds");
    assert!((1..=2).contains(&retry_after), "about one token's wait: {retry_after}");
    assert!(limited.json()["error"]["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0), "{}", limited.body);
    assert!(statuses.iter().filter(|&&s| s == 200).count() >= 3, "the burst is served: {statuses:?}");
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(herald.get(path, None).await.status, 200, "{path} answers while the address is limited");
    }
    // A token later, the caller is served again. Waiting exactly what Retry-After said is
    // the check (that it is the whole wait); a wait can only run long, never short.
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    assert_eq!(herald.get("/admin/health", Some(DEV_KEY)).await.status, 200);
}

/// The HTTP answer to a WebSocket upgrade the server refused.
async fn refused_upgrade(herald: &Herald) -> tungstenite::http::Response<Option<Vec<u8>>> {
    match tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(herald.ws_url())).await {
        Ok(Err(tungstenite::Error::Http(response))) => *response,
        Ok(Ok(_)) => panic!("the upgrade must be refused\n{}", herald.log_tail()),
        Ok(Err(error)) => panic!("expected an HTTP refusal, got {error}"),
        Err(_) => panic!("the upgrade hung"),
    }
}

/// Waits until a WebSocket upgrade succeeds again (a closed connection's slot is freed when
/// the server notices the close).
async fn upgrade_succeeds_again(herald: &Herald) {
    let freed = poll().within(WAIT).every(Duration::from_millis(50));
    let upgraded = freed.try_until("a freed slot to take a new connection", async || {
        tokio_tungstenite::connect_async(herald.ws_url()).await.map(drop)
    });
    if let Err(timed_out) = upgraded.await {
        panic!("{timed_out}\n{}", herald.log_tail());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_at_its_connection_cap_answers_503_until_a_connection_closes() {
    let herald = Herald::with().set("INTAKE__MAX_CONNECTIONS", 2).start().await;
    let alice = Client::connect(&herald, "alice", "phone").await;
    let _bob = Client::connect(&herald, "bob", "phone").await;
    let response = refused_upgrade(&herald).await;
    assert_eq!(response.status(), 503);
    assert!(response.headers().get("retry-after").is_some(), "{response:?}");
    let body = String::from_utf8_lossy(response.body().as_deref().unwrap_or_default()).into_owned();
    assert!(body.contains("overloaded") && body.contains("max_connections"), "{body}");
    drop(alice);
    upgrade_succeeds_again(&herald).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_at_its_connection_share_answers_429() {
    let herald = Herald::with().set("INTAKE__MAX_CONNECTIONS_PER_IP", 1).start().await;
    let alice = Client::connect(&herald, "alice", "phone").await;
    let response = refused_upgrade(&herald).await;
    assert_eq!(response.status(), 429);
    let body = String::from_utf8_lossy(response.body().as_deref().unwrap_or_default()).into_owned();
    assert!(body.contains("max_connections_per_ip"), "{body}");
    drop(alice);
    upgrade_succeeds_again(&herald).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_sockets_have_tcp_keepalive() {
    let herald = Herald::with().set("GATEWAY__TCP_KEEPALIVE_MS", 45_000).start().await;
    let _alice = Client::connect(&herald, "alice", "phone").await;
    // ss shows the kernel's keepalive timer on the server's end of the connection once it is
    // idle (while data is in flight it shows the retransmit timer instead).
    let filter = format!("( sport = :{} )", herald.port);
    poll()
        .within(WAIT)
        .every(Duration::from_millis(100))
        .until("a keepalive timer on the server's socket", async || {
            let output = std::process::Command::new("ss").args(["-tnoH", "state", "established", &filter]).output();
            let sockets = String::from_utf8_lossy(&output.expect("ss (iproute2) runs").stdout).into_owned();
            if sockets.contains("timer:(keepalive") { Ok(()) } else { Err(sockets) }
        })
        .await;
}
