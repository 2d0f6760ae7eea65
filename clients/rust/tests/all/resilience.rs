//! Conformance scenarios of clients/SPEC.md about the connection itself: draining nodes,
//! silent servers, kicks, hung attempts, and acks that must reach the server.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use herald_client::{MemorySeqStore, SendError, SendOptions, Sent, State};
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::harness::{
    Herald, Proxy, Recorded, TestResult, assert_stored_once, barrier, options, pick_first_subprotocol, text, wait_for,
    within,
};

const DM: &str = "dm:alice:bob";
const LONG: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_away_on_sigterm_loses_nothing() -> TestResult {
    let mut herald = Herald::start(true, &[("HERALD_GATEWAY__GO_AWAY_SPREAD_MS", "1000")]).await;
    let alice = Recorded::connect(options(&herald.url(), "alice", &MemorySeqStore::new()));
    let bob = Recorded::connect(options(&herald.url(), "bob", &MemorySeqStore::new()));
    alice.connected().await;
    bob.connected().await;
    let results: Arc<Mutex<HashMap<String, Sent>>> = Arc::default();
    let next = Arc::new(AtomicUsize::new(0));
    let mut loops = Vec::new();
    for _ in 0..4 {
        let (client, results, next) = (alice.client.clone(), results.clone(), next.clone());
        loops.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= 100 {
                    return;
                }
                let body = format!("g-{i}");
                let sent = client.send(DM, body.clone(), SendOptions::default()).await.expect("the send resolves");
                results.lock().expect("results").insert(body, sent);
            }
        }));
    }
    wait_for("30 sends acked", LONG, || results.lock().expect("results").len() >= 30).await;
    herald.terminate().await;
    let acked = results.lock().expect("results").len();
    assert!(acked < 100, "the drain came in the middle ({acked} of 100 acked)");
    {
        let seen = alice.seen();
        assert_eq!(seen.go_aways.len(), 1, "go_away came before the close");
        assert!(seen.go_aways[0].reconnect_after_ms <= 1000, "within the configured spread");
    }
    herald.restart().await;
    for task in loops {
        within("the 100 sends", LONG, task).await?;
    }
    let results = results.lock().expect("results").clone();
    let history = assert_stored_once(&alice.client, DM, &results).await;
    assert_eq!(history.len(), 100);
    assert_eq!(barrier(&herald, &bob, DM).await, history.iter().map(text).collect::<Vec<_>>());
    alice.client.close().await;
    bob.client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_away_reconnect_url_moves_the_client_to_the_named_node() -> TestResult {
    let herald = Herald::start(true, &[]).await;
    // A draining node: answers `connect` with go_away naming the real node, then closes 1012.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let draining_url = format!("ws://{}/v1/ws", listener.local_addr()?);
    let visits = Arc::new(AtomicUsize::new(0));
    let target = herald.url();
    let stub = tokio::spawn({
        let visits = visits.clone();
        async move {
            while let Ok((stream, _)) = listener.accept().await {
                visits.fetch_add(1, Ordering::SeqCst);
                let Ok(mut socket) = tokio_tungstenite::accept_hdr_async(stream, pick_first_subprotocol).await else {
                    continue;
                };
                while let Some(Ok(message)) = socket.next().await {
                    let WsMessage::Binary(data) = message else { continue };
                    let limits = herald_proto::DecodeLimits::default();
                    let Ok(frame) = herald_proto::decode_frame(data, herald_proto::Encoding::Proto, &limits) else {
                        break;
                    };
                    if !matches!(frame.body, Some(herald_proto::v1::frame::Body::Connect(_))) {
                        continue;
                    }
                    let reason = "server shutting down; reconnect".to_owned();
                    let go_away = herald_proto::v1::GoAway {
                        reason: reason.clone(),
                        reconnect_after_ms: 100,
                        reconnect_url: target.clone(),
                    };
                    let bytes = herald_proto::encode_proto(&herald_proto::v1::Frame::new(0, go_away));
                    let _ = socket.send(WsMessage::Binary(bytes.into())).await;
                    let close = CloseFrame { code: CloseCode::Restart, reason: reason.into() };
                    let _ = socket.send(WsMessage::Close(Some(close))).await;
                    break;
                }
            }
        }
    });
    let alice = Recorded::connect(options(&draining_url, "alice", &MemorySeqStore::new()));
    let sent =
        within("a send through the new node", LONG, alice.client.send(DM, "moved", SendOptions::default())).await?;
    {
        let seen = alice.seen();
        assert_eq!(seen.urls.last(), Some(&herald.url()), "connected to reconnect_url");
        assert_eq!(seen.go_aways.first().and_then(|go_away| go_away.reconnect_url.clone()), Some(herald.url()));
    }
    assert_eq!(visits.load(Ordering::SeqCst), 1, "one visit to the draining node");
    assert_stored_once(&alice.client, DM, &HashMap::from([("moved".to_owned(), sent)])).await;
    alice.client.close().await;
    stub.abort();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_server_is_detected_and_the_send_goes_through_the_new_connection() -> TestResult {
    let herald = Herald::start(true, &[]).await;
    let proxy = Proxy::start(herald.port).await;
    let mut alice_options = options(&proxy.url(), "alice", &MemorySeqStore::new());
    alice_options.dead_after = Duration::from_millis(1_500);
    let alice = Recorded::connect(alice_options);
    alice.connected().await;
    proxy.freeze();
    let sending = tokio::spawn({
        let client = alice.client.clone();
        async move { client.send(DM, "through-a-dead-link", SendOptions::default()).await }
    });
    wait_for("the client gave the silent connection up", Duration::from_secs(10), || {
        !alice.seen().disconnected.is_empty()
    })
    .await;
    assert_eq!(alice.seen().disconnected[0].code, 4000, "closed by the client for silence");
    let sent = within("the send on the new connection", LONG, sending).await??;
    assert_stored_once(&alice.client, DM, &HashMap::from([("through-a-dead-link".to_owned(), sent)])).await;
    alice.client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_go_after_the_handler_and_reach_the_server() -> TestResult {
    let herald = Herald::start(true, &[]).await;
    let alice = Recorded::connect(options(&herald.url(), "alice", &MemorySeqStore::new()));
    let bob =
        Recorded::with_handler_time(options(&herald.url(), "bob", &MemorySeqStore::new()), Duration::from_millis(20));
    bob.connected().await;
    for i in 0..5 {
        alice.client.send(DM, format!("once-{i}"), SendOptions::default()).await?;
    }
    wait_for("bob handled 5", LONG, || bob.texts().len() == 5).await;
    bob.client.close().await;
    // A fresh store: only the server's cursor of this device can keep these from coming back.
    let again = Recorded::connect(options(&herald.url(), "bob", &MemorySeqStore::new()));
    assert_eq!(barrier(&herald, &again, DM).await, Vec::<String>::new());
    alice.client.close().await;
    again.client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kicked_by_the_same_device_elsewhere_is_final() -> TestResult {
    let herald = Herald::start(true, &[]).await;
    let mut phone = options(&herald.url(), "alice", &MemorySeqStore::new());
    phone.device_id = "phone".to_owned();
    let first = Recorded::connect(phone.clone());
    first.connected().await;
    let second = Recorded::connect(phone);
    second.connected().await;
    wait_for("the first client closed", LONG, || first.state() == Some(State::Closed)).await;
    {
        let seen = first.seen();
        assert_eq!(seen.disconnected.first().map(|close| close.code), Some(4009));
        assert_eq!(seen.disconnected[0].reconnect_in, None, "reconnecting would kick the other one back");
    }
    match first.client.send(DM, "too late", SendOptions::default()).await {
        Err(SendError::Abandoned { .. }) => {}
        other => panic!("expected an abandoned send, got {other:?}"),
    }
    assert_eq!(second.state(), Some(State::Connected), "the newer connection stays");
    second.client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_attempt_times_out_and_close_abandons_the_pending_send() -> TestResult {
    // No server: a TCP listener that accepts and never answers the upgrade.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("ws://{}/v1/ws", listener.local_addr()?);
    let held = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            sockets.push(socket);
        }
    });
    let mut alice_options = options(&url, "alice", &MemorySeqStore::new());
    alice_options.connect_timeout = Duration::from_millis(400);
    let alice = Recorded::connect(alice_options);
    let sending = tokio::spawn({
        let client = alice.client.clone();
        async move { client.send(DM, "never", SendOptions::default()).await }
    });
    wait_for("two attempts dropped", LONG, || alice.seen().disconnected.len() >= 2).await;
    for close in alice.seen().disconnected.iter().take(2) {
        assert_eq!(close.code, 4000, "dropped by the client");
        assert!(!close.was_connected && close.reconnect_in.is_some(), "not connected, will reconnect");
    }
    alice.client.close().await;
    match within("the pending send settles", LONG, sending).await? {
        Err(SendError::Abandoned { .. }) => {}
        other => panic!("expected an abandoned send, got {other:?}"),
    }
    held.abort();
    Ok(())
}
