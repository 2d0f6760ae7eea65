//! The store's circuit breaker: a database that stops answering (PostgreSQL behind a proxy
//! that holds every byte, as a network partition would) fails batches by their commit
//! timeout until the breaker opens; then sends are answered RETRY at once, without waiting
//! on the database, and the tier steps down. Once the database answers again, the breaker
//! closes by itself, traffic resumes without a restart, and every OK-acked message is
//! stored exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use herald_host::store::Backend;
use herald_proto::v1::send_ack::Status;
use tokio::time::Instant;

use super::client::Client;
use super::server::{DEV_KEY, Herald};
use super::{WAIT, dm, uuid};
use crate::redis_scratch::proxy_to;
use crate::support::poll::poll;
use crate::support::scratch::ScratchDatabase;

/// How long a batch may take before it fails, in this test.
const COMMIT_TIMEOUT: Duration = Duration::from_millis(500);

/// `GET /admin/health`.
async fn health(herald: &Herald) -> serde_json::Value {
    let response = herald.get("/admin/health", Some(DEV_KEY)).await;
    assert_eq!(response.status, 200, "{response:?}");
    response.json()
}

/// The store breaker's state in `/admin/health`.
fn store_breaker(health: &serde_json::Value) -> String {
    let breakers = health["breakers"].as_array().expect("breakers listed");
    let store = breakers.iter().find(|b| b["name"] == "store").expect("the store's breaker is listed");
    store["state"].as_str().expect("a state").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_stops_answering_opens_the_store_breaker_and_traffic_resumes_when_it_is_back() {
    let database =
        ScratchDatabase::create(Backend::Postgres, "herald_b").await.unwrap_or_else(|error| panic!("{error}"));
    let cut = Arc::new(AtomicBool::new(false));
    let (head, rest) = database.url.split_once('@').expect("postgres://user@host:port/db");
    let (address, name) = rest.split_once('/').expect("a database name");
    let proxied = format!("{head}@{}/{name}", proxy_to(address.to_owned(), Arc::clone(&cut)).await);
    let herald = Herald::with()
        .set("STORAGE__URL", proxied)
        .set("STORAGE__GROUP_COMMIT__COMMIT_TIMEOUT_MS", COMMIT_TIMEOUT.as_millis())
        .set("STORAGE__GROUP_COMMIT__BREAKER_FAILURES", 2)
        .set("STORAGE__GROUP_COMMIT__BREAKER_SPAN_MS", 0)
        .set("STORAGE__GROUP_COMMIT__BREAKER_OPEN_MS", 1_000)
        .set("DELIVERY__DEGRADE_INTERVAL_MS", 100)
        // The intake's delay gate would turn sends back first, after the first slow answer,
        // and keep them from the store: this test is about the store's own breaker.
        .set("INTAKE__SEND_DELAY_TARGET_MS", 0)
        .start()
        .await;
    let mut alice = Client::connect(&herald, "alice", "phone").await;
    let conversation = dm("alice", "bob");
    // What the test sent, by client_msg_id, and which were acked OK.
    let mut sent: BTreeMap<String, String> = BTreeMap::new();
    let mut acked_ok: BTreeSet<String> = BTreeSet::new();
    for n in 0..3 {
        let ack = alice.send_ok(&conversation, format!("before {n}")).await;
        sent.insert(ack.client_msg_id.clone(), format!("before {n}"));
        acked_ok.insert(ack.client_msg_id);
    }
    assert_eq!(store_breaker(&health(&herald).await), "closed");

    // The database stops answering. Sends fail by the commit timeout until the breaker
    // opens; from then on a send is answered RETRY without waiting on the database.
    cut.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + WAIT;
    let mut n = 0;
    let fast_retry = loop {
        assert!(Instant::now() < deadline, "sends never got a RETRY faster than the commit timeout");
        let (id, body) = (uuid(), format!("during {n}"));
        n += 1;
        sent.insert(id.clone(), body.clone());
        let asked = Instant::now();
        alice.send_with(&id, &conversation, 1, body.as_bytes()).await;
        let ack = alice.ack_of(&id).await;
        assert_ne!(ack.status(), Status::Ok, "nothing can be stored now: {ack:?}");
        assert_eq!(ack.status(), Status::Retry, "{ack:?}");
        if asked.elapsed() < COMMIT_TIMEOUT {
            break ack;
        }
    };
    assert!(fast_retry.reason.contains("storage unavailable"), "{fast_retry:?}");
    assert!(fast_retry.retry_after_ms > 0, "{fast_retry:?}");

    // The breaker shows as open (or half-open, probing) and the tier has stepped down.
    poll()
        .within(WAIT)
        .every(Duration::from_millis(50))
        .until("the breaker and the tier to show the outage", async || {
            let health = health(&herald).await;
            if store_breaker(&health) != "closed" && health["tier"] != "normal" { Ok(()) } else { Err(health) }
        })
        .await;
    let metrics = herald.get("/metrics", None).await.body;
    assert!(metrics.contains("herald_breaker_opened_total{breaker=\"store\"}"), "counted in /metrics");

    // The database is back: every message not acked OK is resent with its own id until it
    // is (RETRY asks for exactly that), without restarting the node.
    cut.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + WAIT;
    for (id, body) in &sent {
        if acked_ok.contains(id) {
            continue;
        }
        alice.resend_until_stored(id, &conversation, body.as_bytes(), deadline).await;
        acked_ok.insert(id.clone());
    }
    let recovered = "the breaker to close and the tier to recover by themselves";
    poll()
        .within(WAIT)
        .every(Duration::from_millis(50))
        .until(recovered, async || {
            let health = health(&herald).await;
            if store_breaker(&health) == "closed" && health["tier"] == "normal" { Ok(()) } else { Err(health) }
        })
        .await;

    // Every message is stored exactly once, in one seq each.
    let path = format!("/v1/conversations/{conversation}/messages?limit=500");
    let history = herald.get(&path, Some("dev:alice")).await.json();
    let messages = history["messages"].as_array().expect("messages");
    let bodies: Vec<String> = messages
        .iter()
        .map(|m| {
            let bytes =
                base64::Engine::decode(&base64::engine::general_purpose::STANDARD, m["body"].as_str().unwrap_or(""));
            String::from_utf8(bytes.expect("base64 body")).expect("utf-8 body")
        })
        .collect();
    let distinct: BTreeSet<&String> = bodies.iter().collect();
    assert_eq!(distinct.len(), bodies.len(), "no message stored twice: {bodies:?}");
    let expected: BTreeSet<&String> = sent.values().collect();
    assert_eq!(distinct, expected, "every message sent is stored once the database is back");
    drop(herald);
    database.drop_database().await.unwrap_or_else(|error| panic!("{error}"));
}
