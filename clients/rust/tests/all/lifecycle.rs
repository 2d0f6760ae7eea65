//! The client's own edges, against a real Herald: `wss://`, a `close()` that waits for the
//! deliveries in the application's hands, an application that reads its events late (or
//! so late that the server gives up on it), replies larger than a client's frames may be,
//! and what `connect` says the client is.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use herald_client::rustls::pki_types::CertificateDer;
use herald_client::rustls::pki_types::pem::PemObject as _;
use herald_client::rustls::{ClientConfig, RootCertStore};
use herald_client::{Client, ClientInfo, Encoding, Event, MemorySeqStore, SendOptions, State};
use herald_proto::v1::frame::Body;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::harness::{
    Herald, Recorded, TestResult, barrier, history_all, http, options, pick_first_subprotocol, text, wait_for, within,
};

const DM: &str = "dm:alice:bob";
const LONG: Duration = Duration::from_secs(60);

/// The next message event, skipping the others.
async fn next_message(events: &mut herald_client::Events) -> herald_client::Delivery {
    loop {
        match within("a message", LONG, events.next()).await {
            Some(Event::Message(delivery)) => return delivery,
            Some(_) => {}
            None => panic!("the events ended before a message"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wss_with_the_applications_roots_sends_and_receives() -> TestResult {
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
    let dir = tempfile::tempdir()?;
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, made.cert.pem())?;
    std::fs::write(&key, made.signing_key.serialize_pem())?;
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let herald = Herald::start(true, &[("HERALD_TLS__CERT_FILE", &cert), ("HERALD_TLS__KEY_FILE", &key)]).await;
    let url = format!("wss://127.0.0.1:{}/v1/ws", herald.port);

    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(made.cert.pem().as_bytes())?)?;
    let provider = Arc::new(herald_client::rustls::crypto::ring::default_provider());
    let tls = Arc::new(
        ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    let mut alice_options = options(&url, "alice", &MemorySeqStore::new());
    alice_options.tls = Some(tls.clone());
    let mut bob_options = options(&url, "bob", &MemorySeqStore::new());
    bob_options.tls = Some(tls);
    let alice = Recorded::connect(alice_options);
    let bob = Recorded::connect(bob_options);
    bob.connected().await;
    let sent = within("the send over wss", LONG, alice.client.send(DM, "over TLS", SendOptions::default())).await?;
    wait_for("bob got it over wss", LONG, || bob.texts() == ["over TLS"]).await;
    assert_eq!(bob.seen().messages[0].id, sent.message_id);

    // The default roots (the public ones) do not know this certificate: never connected.
    let stranger = Recorded::connect(options(&url, "carol", &MemorySeqStore::new()));
    wait_for("carol's attempt to fail", LONG, || !stranger.seen().disconnected.is_empty()).await;
    assert_eq!(stranger.seen().connected, 0, "a certificate the roots do not know is refused");
    for client in [&alice.client, &bob.client, &stranger.client] {
        client.close().await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_waits_for_the_deliveries_in_hand_and_their_acks_reach_the_server() -> TestResult {
    let herald = Herald::start(true, &[]).await;
    let alice = Recorded::connect(options(&herald.url(), "alice", &MemorySeqStore::new()));
    let (bob, mut events) = Client::connect(options(&herald.url(), "bob", &MemorySeqStore::new()));
    within("bob connected", LONG, bob.connected()).await?;
    alice.client.send(DM, "held while closing", SendOptions::default()).await?;
    let delivery = next_message(&mut events).await;
    assert_eq!(text(&delivery), "held while closing");

    // The application still works on the message when it closes the client.
    let closing = tokio::spawn({
        let bob = bob.clone();
        async move { bob.close().await }
    });
    // Only how sensitive the test is depends on this pause, never whether it passes: a close
    // that did not wait would have closed the socket by now, and the ack would be lost.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(bob.state(), State::Connected, "the client stays connected while a delivery is in hand");
    drop(delivery);
    within("close returns once the delivery is handled", LONG, closing).await?;
    drop(events);

    // A fresh store: only the server's cursor of this device keeps the message from coming back.
    let again = Recorded::connect(options(&herald.url(), "bob", &MemorySeqStore::new()));
    assert_eq!(barrier(&herald, &again, DM).await, Vec::<String>::new(), "the ack went out before the close");
    alice.client.close().await;
    again.client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_gives_up_on_a_delivery_kept_past_the_timeout() -> TestResult {
    let herald = Herald::start(true, &[]).await;
    let alice = Recorded::connect(options(&herald.url(), "alice", &MemorySeqStore::new()));
    let mut bob_options = options(&herald.url(), "bob", &MemorySeqStore::new());
    bob_options.close_timeout = Duration::from_millis(200);
    let (bob, mut events) = Client::connect(bob_options);
    within("bob connected", LONG, bob.connected()).await?;
    alice.client.send(DM, "kept", SendOptions::default()).await?;
    let kept = next_message(&mut events).await;
    within("close returns after its timeout", LONG, bob.close()).await;
    assert_eq!(bob.state(), State::Closed);
    drop(kept);
    alice.client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_read_late_arrive_all_once_in_order() -> TestResult {
    let herald = Herald::start(true, &[]).await;
    let alice = Recorded::connect(options(&herald.url(), "alice", &MemorySeqStore::new()));
    let mut bob_options = options(&herald.url(), "bob", &MemorySeqStore::new());
    bob_options.event_capacity = 4;
    let (bob, mut events) = Client::connect(bob_options);
    within("bob connected", LONG, bob.connected()).await?;
    // Bob's application reads nothing while 60 messages are sent: its channel holds 4.
    let sent: Vec<String> = (0..60).map(|i| format!("late-{i:02}")).collect();
    for body in &sent {
        alice.client.send(DM, body.clone(), SendOptions::default()).await?;
    }
    let mut got = Vec::new();
    while got.len() < sent.len() {
        got.push(text(&next_message(&mut events).await.message));
    }
    assert_eq!(got, sent, "every message once, in order, though read late");
    let stored: Vec<String> = history_all(&alice.client, DM).await.iter().map(text).collect();
    assert_eq!(stored, sent);
    alice.client.close().await;
    bob.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_page_larger_than_a_client_frame_may_be_is_read() -> TestResult {
    // 40 messages of 32 KiB: one page of them is a frame of 1.3 MiB, over the 1 MiB the
    // server takes from a client, though within what it writes.
    let herald = Herald::start(true, &[]).await;
    let alice = Recorded::connect(options(&herald.url(), "alice", &MemorySeqStore::new()));
    let padding = "x".repeat(32 * 1024);
    let mut sent = Vec::new();
    for i in 0..40 {
        sent.push(alice.client.send(DM, format!("big-{i:02} {padding}"), SendOptions::default()).await?.message_id);
    }
    let page = within("a page of 1.3 MiB", LONG, alice.client.history(DM, 0, 100)).await?;
    assert_eq!(page.messages.iter().map(|message| message.id).collect::<Vec<_>>(), sent);
    assert!(alice.seen().disconnected.is_empty(), "answered on the connection that asked");
    alice.client.close().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_the_server_gives_up_on_is_closed_with_4008_and_loses_nothing() -> TestResult {
    // A send queue of 16 frames: once the socket's buffers are full, the 17th push waiting
    // for bob makes the server close his connection as a slow consumer.
    let herald = Herald::start(true, &[("HERALD_GATEWAY__SEND_QUEUE", "16")]).await;
    let alice = Recorded::connect(options(&herald.url(), "alice", &MemorySeqStore::new()));
    let mut bob_options = options(&herald.url(), "bob", &MemorySeqStore::new());
    bob_options.event_capacity = 4;
    let (bob, mut events) = Client::connect(bob_options);
    within("bob connected", LONG, bob.connected()).await?;

    // Bob's application reads nothing while alice sends 32 KiB messages, 8 at a time, until
    // the server lets bob go (a few MiB fill the kernel's buffers first).
    let padding = "x".repeat(32 * 1024);
    let mut sent: Vec<(u64, String)> = Vec::new();
    while !offline(&herald, "bob").await {
        assert!(sent.len() < 1_000, "the server never gave up on bob after {} messages of 32 KiB", sent.len());
        for _ in 0..8 {
            let label = format!("slow-{:04}", sent.len());
            let stored = alice.client.send(DM, format!("{label} {padding}"), SendOptions::default()).await?;
            sent.push((stored.seq, label));
        }
    }
    // Sent once bob was let go: it reaches him only on a new connection, after the close.
    alice.client.send(DM, "the end", SendOptions::default()).await?;

    // Now the application reads on: what the socket held, then the close, then the rest
    // over the new connection.
    let mut got: Vec<(u64, String)> = Vec::new();
    let mut closes = Vec::new();
    loop {
        match within("bob's next event", LONG, events.next()).await {
            Some(Event::Message(delivery)) if text(&delivery) == "the end" => break,
            Some(Event::Message(delivery)) => {
                let label = text(&delivery).split(' ').next().unwrap_or_default().to_owned();
                got.push((delivery.seq, label));
            }
            Some(Event::Disconnected(info)) => closes.push((info.code, info.reconnect_in.is_some())),
            Some(_) => {}
            None => panic!("bob's events ended"),
        }
    }
    assert_eq!(closes.first(), Some(&(4008, true)), "closed as a slow consumer, and reconnecting");
    // Each send was awaited before the next: the order sent is the seq order.
    assert_eq!(got, sent, "every message once, in seq order");
    alice.client.close().await;
    bob.close().await;
    Ok(())
}

/// Whether no device of `user` is connected, as the server's presence says.
async fn offline(herald: &Herald, user: &str) -> bool {
    let (status, body) = http(herald.port, "GET", &format!("/v1/users/{user}/presence"), "").await;
    assert_eq!(status, 200, "presence: {body}");
    body.contains(r#""online":false"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_names_the_client_info_of_the_options_or_the_library() -> TestResult {
    // `client` is informational: Herald shows it nowhere. So a stub stands in for Herald and
    // decodes the first frame of each connection with Herald's own codec.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("ws://{}/v1/ws", listener.local_addr()?);
    let (decoded, mut connects) = tokio::sync::mpsc::unbounded_channel();
    let stub = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let Ok(mut socket) = tokio_tungstenite::accept_hdr_async(stream, pick_first_subprotocol).await else {
                continue;
            };
            let (data, encoding) = match socket.next().await {
                Some(Ok(WsMessage::Binary(data))) => (data, herald_proto::Encoding::Proto),
                Some(Ok(WsMessage::Text(text))) => (bytes::Bytes::from(text), herald_proto::Encoding::Json),
                _ => continue,
            };
            let frame = herald_proto::decode_frame(data, encoding, &herald_proto::DecodeLimits::default());
            let client = match frame.map(|frame| frame.body) {
                Ok(Some(Body::Connect(connect))) => connect.client.map(|client| (client.name, client.version)),
                other => panic!("the first frame is connect, got {other:?}"),
            };
            let _ = decoded.send((encoding, client));
            // Held open, never answered: the client stays on this one attempt until closed.
            tokio::spawn(async move { while socket.next().await.is_some() {} });
        }
    });

    let mut named = options(&url, "alice", &MemorySeqStore::new());
    named.client_info = ClientInfo { name: "acme-chat".to_owned(), version: "2.1.0".to_owned() };
    let mut plain = options(&url, "bob", &MemorySeqStore::new());
    plain.encoding = Encoding::Json;
    for (options, expected) in
        [(named, ("acme-chat", "2.1.0")), (plain, ("herald-client-rust", env!("CARGO_PKG_VERSION")))]
    {
        let encoding = match options.encoding {
            Encoding::Proto => herald_proto::Encoding::Proto,
            Encoding::Json => herald_proto::Encoding::Json,
        };
        let (client, _events) = Client::connect(options);
        let (seen_encoding, seen) = within("the connect frame", LONG, connects.recv()).await.expect("the stub runs");
        assert_eq!(seen_encoding, encoding);
        assert_eq!(seen, Some((expected.0.to_owned(), expected.1.to_owned())), "connect names the client");
        client.close().await;
    }
    stub.abort();
    Ok(())
}
