//! Conformance scenarios of clients/SPEC.md, against real Herald processes. Each test starts
//! its own node with a temporary data dir; it is killed when the test ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herald_client::{
    Client, ClientOptions, Encoding, MemorySeqStore, SendError, SendOptions, Sent, State, Token, TokenReason,
};

use crate::harness::{
    Herald, Proxy, Recorded, TestResult, assert_stored_once, barrier, history_all, jwt, options, text, wait_for, within,
};

const DM: &str = "dm:alice:bob";
const LONG: Duration = Duration::from_secs(60);

/// Sends `count` messages `prefix-i` from `workers` concurrent loops, each send awaited;
/// `on_result` sees each result as it comes.
async fn send_all(
    client: &Client,
    prefix: &str,
    count: usize,
    workers: usize,
    on_result: Arc<dyn Fn(String, Sent) + Send + Sync>,
) {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let (client, next, prefix, on_result) = (client.clone(), next.clone(), prefix.to_owned(), on_result.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= count {
                    return;
                }
                let body = format!("{prefix}-{i}");
                let sent = client.send(DM, body.clone(), SendOptions::default()).await.expect("the send resolves");
                on_result(body, sent);
            }
        }));
    }
    for task in tasks {
        task.await.expect("a send loop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_resolves_with_ids_and_duplicates_keep_the_original_ones() -> TestResult {
    let herald = Herald::start(true, &[]).await;
    let alice = Recorded::connect(options(&herald.url(), "alice", &MemorySeqStore::new()));
    let options = SendOptions { client_msg_id: Some(herald_client::uuid_v4()), ..SendOptions::default() };
    let first = within("the send", LONG, alice.client.send(DM, "once", options.clone())).await?;
    assert!(first.message_id > 0 && first.seq > 0 && !first.duplicate);
    assert_eq!(first.conversation, DM);
    let again = within("the same client_msg_id again", LONG, alice.client.send(DM, "once", options)).await?;
    assert!(again.duplicate, "the second resolves DUPLICATE");
    assert_eq!((again.message_id, again.seq), (first.message_id, first.seq), "with the original ids");
    let history = history_all(&alice.client, DM).await;
    assert_eq!(history.iter().map(text).collect::<Vec<_>>(), ["once"], "one message stored");
    alice.client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_send_is_a_typed_error_with_the_reason() -> TestResult {
    let herald = Herald::start(true, &[]).await;
    let alice = Recorded::connect(options(&herald.url(), "alice", &MemorySeqStore::new()));
    for conversation in ["dm:bob:alice", "room:never-joined"] {
        match within("the refused send", LONG, alice.client.send(conversation, "no", SendOptions::default())).await {
            Err(SendError::Rejected { reason, conversation: to, .. }) => {
                assert!(!reason.is_empty(), "a reason is given");
                assert_eq!(to, conversation);
            }
            other => panic!("{conversation}: expected a rejection, got {other:?}"),
        }
    }
    alice.client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_resend_stored_once() -> TestResult {
    // Ten sends a second per connection (burst 5): a burst of 30 meets RETRY honestly, from the intake.
    let herald =
        Herald::start(true, &[("HERALD_INTAKE__SENDS_PER_CONNECTION", "10"), ("HERALD_INTAKE__CONNECTION_BURST", "5")])
            .await;
    let mut alice_options = options(&herald.url(), "alice", &MemorySeqStore::new());
    alice_options.encoding = Encoding::Json;
    let alice = Recorded::connect(alice_options);
    let sends = (0..30).map(|i| {
        let client = alice.client.clone();
        async move { (format!("r-{i}"), client.send(DM, format!("r-{i}"), SendOptions::default()).await) }
    });
    let results = within("30 sends", LONG, futures_util::future::join_all(sends)).await;
    let results: HashMap<String, Sent> =
        results.into_iter().map(|(body, sent)| (body, sent.expect("each send resolves"))).collect();
    {
        let seen = alice.seen();
        assert!(!seen.retries.is_empty(), "the server answered RETRY");
        assert!(seen.retries.iter().all(|retry| retry.retry_after_ms > 0), "each RETRY said how long to wait");
    }
    assert_eq!(results.len(), 30);
    let history = assert_stored_once(&alice.client, DM, &results).await;
    assert_eq!(history.len(), 30);
    alice.client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_sends_each_send_resolves_once_and_is_stored_once() -> TestResult {
    let mut herald = Herald::start(true, &[]).await;
    let alice = Recorded::connect(options(&herald.url(), "alice", &MemorySeqStore::new()));
    let bob = Recorded::connect(options(&herald.url(), "bob", &MemorySeqStore::new()));
    alice.connected().await;
    bob.connected().await;
    let results: Arc<Mutex<HashMap<String, Sent>>> = Arc::default();
    let resolved_twice = Arc::new(Mutex::new(false));
    let record = {
        let (results, twice) = (results.clone(), resolved_twice.clone());
        Arc::new(move |body: String, sent: Sent| {
            let mut results = results.lock().expect("results");
            if results.insert(body, sent).is_some() {
                *twice.lock().expect("flag") = true;
            }
        })
    };
    let sending = tokio::spawn({
        let client = alice.client.clone();
        async move { send_all(&client, "k", 200, 4, record).await }
    });
    wait_for("40 sends acked", LONG, || results.lock().expect("results").len() >= 40).await;
    herald.kill().await;
    let acked_at_kill = results.lock().expect("results").len();
    assert!(acked_at_kill < 200, "the kill came in the middle ({acked_at_kill} of 200 acked)");
    herald.restart().await;
    within("the 200 sends after the restart", LONG, sending).await?;
    assert!(!*resolved_twice.lock().expect("flag"), "no send resolved twice");
    let results = results.lock().expect("results").clone();
    assert_eq!(results.len(), 200);
    let history = assert_stored_once(&alice.client, DM, &results).await;
    assert_eq!(history.len(), 200);
    // Bob's view: every message once, in seq order, across the crash (whose seqs have gaps).
    let received = barrier(&herald, &bob, DM).await;
    assert_eq!(received, history.iter().map(text).collect::<Vec<_>>());
    alice.client.close().await;
    bob.client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_messages_arrive_once_in_order_and_a_reload_replays_nothing() -> TestResult {
    let herald = Herald::start(true, &[]).await;
    let proxy = Proxy::start(herald.port).await;
    let store = MemorySeqStore::new();
    let bob = Recorded::connect(options(&proxy.url(), "bob", &store));
    let alice = Recorded::connect(options(&herald.url(), "alice", &MemorySeqStore::new()));
    for i in 0..5 {
        alice.client.send(DM, format!("before-{i}"), SendOptions::default()).await?;
        // Bob's own messages take seqs between Alice's: they must not stall his order.
        if i % 2 == 0 {
            bob.client.send(DM, format!("own-{i}"), SendOptions::default()).await?;
        }
    }
    wait_for("bob got the first 5", LONG, || bob.texts().len() == 5).await;

    proxy.cut();
    wait_for("bob noticed the outage", LONG, || bob.state() != Some(State::Connected)).await;
    for i in 0..30 {
        alice.client.send(DM, format!("offline-{i}"), SendOptions::default()).await?;
    }
    proxy.resume();
    wait_for("bob resumed", LONG, || bob.seen().resumed == 1).await;

    let expected: Vec<String> =
        (0..5).map(|i| format!("before-{i}")).chain((0..30).map(|i| format!("offline-{i}"))).collect();
    assert_eq!(barrier(&herald, &bob, DM).await, expected);
    assert_eq!(bob.seen().resumed, 1, "resumed once");

    // A reload: a new client on the same device and store resumes, replaying nothing.
    bob.client.close().await;
    for i in 0..10 {
        alice.client.send(DM, format!("reloaded-{i}"), SendOptions::default()).await?;
    }
    let reloaded = Recorded::connect(options(&herald.url(), "bob", &store));
    assert_eq!(barrier(&herald, &reloaded, DM).await, (0..10).map(|i| format!("reloaded-{i}")).collect::<Vec<_>>());
    alice.client.close().await;
    reloaded.client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_announcement_posted_while_away_arrives_after_the_reconnect() -> TestResult {
    let herald = Herald::start(true, &[]).await;
    let proxy = Proxy::start(herald.port).await;
    let store = MemorySeqStore::new();
    let json = |url: &str| {
        let mut options = options(url, "bob", &store);
        options.encoding = Encoding::Json;
        options
    };
    let bob = Recorded::connect(json(&proxy.url()));
    within("subscribe", LONG, bob.client.subscribe("room:lobby")).await?;
    let posted = herald.announce("lobby", "a1", "a1").await;
    assert!(posted.contains(r#""archived":true"#), "announcements are archived (history for catch-up)");
    wait_for("a1 live", LONG, || bob.texts().contains(&"a1".to_owned())).await;

    proxy.cut();
    wait_for("bob noticed the outage", LONG, || bob.state() != Some(State::Connected)).await;
    herald.announce("lobby", "a2", "a2").await;
    herald.announce("lobby", "a3", "a3").await;
    proxy.resume();
    assert_eq!(barrier(&herald, &bob, "room:lobby").await, ["a1", "a2", "a3"]);

    // A reloaded client joins again from its stored seq: what came meanwhile, nothing older.
    bob.client.close().await;
    herald.announce("lobby", "a4", "a4").await;
    let reloaded = Recorded::connect(json(&herald.url()));
    within("subscribe again", LONG, reloaded.client.subscribe("lobby")).await?;
    assert_eq!(barrier(&herald, &reloaded, "room:lobby").await, ["a4"]);
    reloaded.client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_token_is_refreshed_through_the_provider_without_losing_a_send() -> TestResult {
    let secret = "conformance-test-secret-0123456789abcdef";
    let herald = Herald::start(false, &[("HERALD_GATEWAY__JWT_SECRET", secret)]).await;
    let proxy = Proxy::start(herald.port).await;
    let reasons: Arc<Mutex<Vec<TokenReason>>> = Arc::default();
    let expires: Arc<Mutex<u64>> = Arc::default();
    let provider = {
        let (reasons, expires) = (reasons.clone(), expires.clone());
        move |reason: TokenReason| {
            reasons.lock().expect("reasons").push(reason);
            let (token, exp) = jwt(secret, "alice", 1);
            *expires.lock().expect("exp") = exp;
            async move { Ok::<_, String>(token) }
        }
    };
    let mut alice_options = options(&proxy.url(), "alice", &MemorySeqStore::new());
    alice_options.token = Token::provider(provider);
    let alice = Recorded::connect(alice_options);
    alice.connected().await;
    let first =
        within("the first send", LONG, alice.client.send(DM, "with-the-first-token", SendOptions::default())).await?;

    proxy.cut();
    wait_for("alice noticed the outage", LONG, || alice.state() != Some(State::Connected)).await;
    // The server allows 5 s of clock leeway: wait until the token is surely expired.
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |at| at.as_secs());
    wait_for("the token expired", Duration::from_secs(15), || now() > *expires.lock().expect("exp") + 6).await;
    let sending = tokio::spawn({
        let client = alice.client.clone();
        async move { client.send(DM, "after-expiry", SendOptions::default()).await }
    });
    proxy.resume();
    let second = within("the send after the refresh", LONG, sending).await??;

    assert!(alice.seen().disconnected.iter().any(|close| close.code == 4001), "the stale token was refused with 4001");
    assert_eq!(*reasons.lock().expect("reasons"), [TokenReason::Initial, TokenReason::Expired]);
    let results = HashMap::from([("with-the-first-token".to_owned(), first), ("after-expiry".to_owned(), second)]);
    assert_stored_once(&alice.client, DM, &results).await;
    alice.client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_first_token_is_replaced_through_the_provider() -> TestResult {
    let herald = Herald::start(true, &[]).await;
    let calls: Arc<Mutex<Vec<TokenReason>>> = Arc::default();
    let provider = {
        let calls = calls.clone();
        move |reason: TokenReason| {
            calls.lock().expect("calls").push(reason);
            let token = if reason == TokenReason::Initial { "not-a-token" } else { "dev:alice" };
            async move { Ok::<_, String>(token.to_owned()) }
        }
    };
    let mut alice_options: ClientOptions = options(&herald.url(), "alice", &MemorySeqStore::new());
    alice_options.token = Token::provider(provider);
    let alice = Recorded::connect(alice_options);
    let sent =
        within("a send through the refreshed token", LONG, alice.client.send(DM, "hi", SendOptions::default())).await?;
    assert!(sent.seq > 0);
    assert!(alice.seen().disconnected.iter().any(|close| close.code == 4001));
    assert_eq!(*calls.lock().expect("calls"), [TokenReason::Initial, TokenReason::Expired]);
    alice.client.close().await;
    Ok(())
}
