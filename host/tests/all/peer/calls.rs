//! What a [`PeerBus`] call does: reaches the handler with what was given, keeps one
//! connection's order, shares a link, and fails as its contract says when the peer is
//! slow, gone, restarted, unreachable or refuses it.

use super::*;

#[tokio::test]
async fn every_bus_call_reaches_the_handler_with_exactly_what_was_given() {
    let pair = Pair::start().await;
    let message = Arc::new(message());
    let users = vec![user("bob"), user("carol.d@x-1")];
    let route = Route {
        user: user("bob"),
        device: device("laptop"),
        node: CALLED,
        connection: ConnectionId(u64::MAX),
        connected_at_ms: 5,
        parked: false,
    };
    let request = send_request(12, 0);

    let ack = pair.bus.forward_send(CALLED, request.clone(), queued()).await.expect("forwarded");
    assert_eq!((ack.to, ack.rid, ack.ack), (request.origin.clone(), 12, ack_for(&request)));
    pair.bus.deliver(CALLED, Arc::clone(&message), &users, Addressed::ByRoute).await.expect("delivered");
    pair.bus.publish_room(&[CALLED], Arc::clone(&message)).await.expect("published");
    let ledger = pair.bus.take_over(&route).await.expect("kicked");
    assert_eq!(ledger, Some(handed_ledger()), "the ledger survives its wire form");
    assert_eq!(pair.bus.lowest_in_flight(CALLED, &conversation("dm:alice:bob")).await, Ok(Some(41)));
    assert_eq!(pair.bus.lowest_in_flight(CALLED, &conversation("room:idle")).await, Ok(None));
    pair.bus.deliver(CALLED, Arc::clone(&message), &users, Addressed::Everywhere).await.expect("delivered");
    let announcement = SendRequest { announcement: true, ..send_request(13, 0) };
    pair.bus.forward_send(CALLED, announcement.clone(), queued()).await.expect("forwarded");

    let calls = pair.recorder.calls();
    assert_eq!(calls.len(), 8, "{calls:?}");
    let Recorded::Send(sent) = &calls[0] else { panic!("not a send: {calls:?}") };
    assert_eq!((&sent.origin, sent.rid, &sent.send), (&request.origin, request.rid, &request.send));
    assert!(!sent.announcement, "a client's send: {sent:?}");
    assert!(
        matches!(&calls[1], Recorded::Deliver(m, u, Addressed::ByRoute) if *m == *message && *u == users),
        "{calls:?}"
    );
    assert!(matches!(&calls[2], Recorded::PublishRoom(m) if *m == *message), "{calls:?}");
    assert!(matches!(&calls[3], Recorded::Kick(r, Some(to)) if *r == route && *to == CALLER), "{calls:?}");
    assert!(matches!(&calls[4], Recorded::LowestInFlight(c) if c.as_str() == "dm:alice:bob"), "{calls:?}");
    assert!(matches!(&calls[5], Recorded::LowestInFlight(c) if c.as_str() == "room:idle"), "{calls:?}");
    assert!(
        matches!(&calls[6], Recorded::Deliver(m, u, Addressed::Everywhere) if *m == *message && *u == users),
        "sent to every node, and said so: {calls:?}"
    );
    let Recorded::Send(sent) = &calls[7] else { panic!("not a send: {calls:?}") };
    assert_eq!((sent.rid, &sent.send), (announcement.rid, &announcement.send));
    assert!(sent.announcement, "an announcement arrives as one: {sent:?}");
}

#[tokio::test]
async fn forward_send_returns_the_owners_ack_before_its_fan_out_runs() {
    let mut pair = Pair::start().await;
    pair.recorder.fan_outs.send_replace(false);
    // The fan-out cannot run yet, so the ack did not wait for it.
    let ack = pair.bus.forward_send(CALLED, send_request(5, 0), queued()).await.expect("forwarded");
    assert_eq!(ack.ack.seq, 1_005);
    assert!(pair.watch.fanned_out.try_recv().is_err(), "the fan-out ran while held");
    pair.recorder.fan_outs.send_replace(true);
    let ran = tokio::time::timeout(WAIT, pair.watch.fanned_out.recv()).await.expect("the fan-out runs");
    assert_eq!(ran, Some(5));
}

#[tokio::test]
async fn a_hundred_concurrent_sends_share_one_link_and_each_gets_its_own_ack() {
    let pair = Pair::start().await;
    let relay = Relay::start(pair.served.address).await;
    pair.directory.set(CALLED, relay.address);
    // The first sent takes longest, so answers come back in the reverse order.
    let sends = (0..100u32).map(|rid| {
        let bus = &pair.bus;
        async move { (rid, bus.forward_send(CALLED, send_request(rid, 100 - rid), queued()).await) }
    });
    for (rid, answer) in futures_util::future::join_all(sends).await {
        let ack = answer.unwrap_or_else(|error| panic!("send {rid}: {error}"));
        assert_eq!(ack.rid, rid);
        assert_eq!(ack.ack, ack_for(&send_request(rid, 100 - rid)));
    }
    assert_eq!(relay.connections.load(Ordering::SeqCst), 1, "one link carried every request");
}

/// A connection's sends, each handed over once the one before it was queued (as the
/// pipeline does), are admitted by the called node in the order they were sent, however the
/// tasks answering them are scheduled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_connections_sends_are_admitted_in_the_order_they_were_handed_over() {
    let pair = Pair::start().await;
    let bus = Arc::new(pair.bus);
    let mut answers = Vec::new();
    for rid in 0..200u32 {
        let (queued, on_queued) = tokio::sync::oneshot::channel();
        let bus = Arc::clone(&bus);
        answers.push(tokio::spawn(async move { bus.forward_send(CALLED, send_request(rid, 0), queued).await }));
        on_queued.await.expect("queued");
    }
    for answer in answers {
        answer.await.expect("no panic").expect("answered");
    }
    let admitted: Vec<u32> = pair
        .recorder
        .calls()
        .iter()
        .filter_map(|call| match call {
            Recorded::Send(request) => Some(request.rid),
            _ => None,
        })
        .collect();
    assert_eq!(admitted, (0..200).collect::<Vec<_>>(), "admitted in the order handed over");
}

#[tokio::test]
async fn a_slow_send_does_not_hold_up_a_delivery_on_the_same_link() {
    let mut pair = Pair::start().await;
    pair.recorder.sends.send_replace(false);
    let bus = Arc::new(pair.bus);
    let slow = tokio::spawn({
        let bus = Arc::clone(&bus);
        async move { bus.forward_send(CALLED, send_request(1, 0), queued()).await }
    });
    assert_eq!(tokio::time::timeout(WAIT, pair.watch.started.recv()).await.expect("the send starts"), Some(1));
    bus.deliver(CALLED, Arc::new(message()), &[user("bob")], Addressed::ByRoute)
        .await
        .expect("delivered while the send waits");
    assert!(!slow.is_finished(), "the send was held, yet answered");
    pair.recorder.sends.send_replace(true);
    let ack = slow.await.expect("no panic").expect("the send is answered once released");
    assert_eq!(ack.ack.seq, 1_001);
}

#[tokio::test]
async fn a_caller_with_the_wrong_secret_is_refused_and_the_handler_never_called() {
    let pair = Pair::start_with(secret("not the secret"), timeouts()).await;
    let error = pair.bus.forward_send(CALLED, send_request(1, 0), queued()).await.expect_err("refused");
    assert_failed(&error, CALLED, "cluster.secret");
    // Later calls are refused without another attempt, still saying why.
    let error =
        pair.bus.deliver(CALLED, Arc::new(message()), &[user("bob")], Addressed::ByRoute).await.expect_err("refused");
    assert_failed(&error, CALLED, "cluster.secret");
    assert!(pair.recorder.calls().is_empty(), "{:?}", pair.recorder.calls());
}

#[tokio::test]
async fn a_node_without_an_address_is_unreachable() {
    let pair = Pair::start().await;
    let nowhere = NodeId(9);
    let message = Arc::new(message());
    assert_eq!(
        pair.bus.forward_send(nowhere, send_request(1, 0), queued()).await.map(|_| ()),
        Err(BusError::Unreachable(nowhere))
    );
    assert_eq!(
        pair.bus.deliver(nowhere, Arc::clone(&message), &[user("bob")], Addressed::ByRoute).await,
        Err(BusError::Unreachable(nowhere))
    );
    let route = Route {
        user: user("bob"),
        device: device("laptop"),
        node: nowhere,
        connection: ConnectionId(1),
        connected_at_ms: 0,
        parked: false,
    };
    assert_eq!(pair.bus.take_over(&route).await, Err(BusError::Unreachable(nowhere)));
    assert_eq!(pair.bus.lowest_in_flight(nowhere, &conversation("grp:x")).await, Err(BusError::Unreachable(nowhere)));
    // The nodes that can be reached still get a room message; the error names only the
    // one that could not be.
    assert_eq!(pair.bus.publish_room(&[nowhere, CALLED], message).await, Err(vec![BusError::Unreachable(nowhere)]));
    assert!(matches!(pair.recorder.calls().as_slice(), [Recorded::PublishRoom(_)]), "{:?}", pair.recorder.calls());
}

#[tokio::test]
async fn publish_room_reaches_every_node_named() {
    let pair = Pair::start().await;
    let (other, _watch) = Recorder::new();
    let third = NodeId(3);
    let served = Served::start(third, secret(SECRET), Arc::clone(&other) as _, timeouts()).await;
    pair.directory.set(third, served.address);
    pair.bus.publish_room(&[CALLED, third], Arc::new(message())).await.expect("published to both");
    for recorder in [&pair.recorder, &other] {
        assert!(matches!(recorder.calls().as_slice(), [Recorded::PublishRoom(m)] if *m == message()));
    }
}

#[tokio::test]
async fn route_and_group_changes_are_announced_to_every_other_live_node_and_waited_for() {
    let pair = Pair::start().await;
    let (other, _watch) = Recorder::new();
    let third = NodeId(3);
    let served = Served::start(third, secret(SECRET), Arc::clone(&other) as _, timeouts()).await;
    pair.directory.set(third, served.address);
    // The caller itself is listed too (as membership lists every member): it is skipped.
    pair.directory.set(CALLER, "127.0.0.1:9".parse().expect("an address"));
    let mut peers = pair.bus.peers();
    peers.sort();
    assert_eq!(peers, vec![CALLED, third], "the other live nodes, not this one");
    let users = vec![user("bob"), user("carol")];
    pair.bus.routes_changed(&users).await;
    let group = GroupId::parse("team").expect("valid");
    pair.bus.group_changed(&group).await;
    for recorder in [&pair.recorder, &other] {
        assert!(
            matches!(recorder.calls().as_slice(), [Recorded::RoutesChanged(u), Recorded::GroupChanged(g)] if *u == users && *g == group),
            "{:?}",
            recorder.calls()
        );
    }
}

/// Holds a send in flight on `pair`'s link, stops the server under it, and checks that the
/// send fails at once — before its deadline — because the link closed.
async fn go_away_mid_request(pair: Pair) -> (PeerBus, Arc<Directory>) {
    let Pair { recorder, mut watch, directory, bus, served } = pair;
    recorder.sends.send_replace(false);
    let bus = Arc::new(bus);
    let started_at = Instant::now();
    let in_flight = tokio::spawn({
        let bus = Arc::clone(&bus);
        async move { bus.forward_send(CALLED, send_request(1, 0), queued()).await }
    });
    assert_eq!(tokio::time::timeout(WAIT, watch.started.recv()).await.expect("the send starts"), Some(1));
    served.stop().await;
    let error = in_flight.await.expect("no panic").expect_err("its peer went away");
    assert!(matches!(&error, BusError::Broken { node: CALLED, .. }), "not failed by the broken link: {error:?}");
    assert!(error.may_have_landed(), "it went out before the link broke");
    assert!(started_at.elapsed() < timeouts().forward_send, "failed only at its deadline");
    recorder.sends.send_replace(true);
    (Arc::into_inner(bus).expect("the call ended"), directory)
}

#[tokio::test]
async fn a_peer_going_away_fails_its_requests_at_once_and_a_restarted_peer_is_reached_again() {
    let (bus, directory) = go_away_mid_request(Pair::start().await).await;
    // The node comes back on another port, and the next call reaches it there.
    let (recorder, _watch) = Recorder::new();
    let restarted = Served::start(CALLED, secret(SECRET), Arc::clone(&recorder) as _, timeouts()).await;
    directory.set(CALLED, restarted.address);
    bus.deliver(CALLED, Arc::new(message()), &[user("bob")], Addressed::ByRoute)
        .await
        .expect("the restarted node answers");
    assert!(matches!(recorder.calls().as_slice(), [Recorded::Deliver(..)]), "{:?}", recorder.calls());
}

#[tokio::test]
async fn a_peer_restarted_on_the_same_address_is_reached_again() {
    let pair = Pair::start().await;
    let address = pair.served.address;
    let (bus, _directory) = go_away_mid_request(pair).await;
    let (recorder, _watch) = Recorder::new();
    // The port was released by this test's own server a moment ago; take it again.
    let listener = TcpListener::bind(address).await.expect("the port is free again");
    let (_stop, stopped) = watch::channel(false);
    tokio::spawn(
        PeerServer::new(CALLED, secret(SECRET), Arc::clone(&recorder) as _, timeouts()).serve(listener, stopped),
    );
    bus.deliver(CALLED, Arc::new(message()), &[user("bob")], Addressed::ByRoute).await.expect("reconnected");
    assert!(matches!(recorder.calls().as_slice(), [Recorded::Deliver(..)]), "{:?}", recorder.calls());
}

/// The kind of the socket error somewhere in `error`'s chain of sources.
fn socket_error(error: &BusError) -> Option<std::io::ErrorKind> {
    std::iter::successors(Some(error as &dyn std::error::Error), |error| error.source())
        .find_map(|error| error.downcast_ref::<std::io::Error>())
        .map(std::io::Error::kind)
}

#[tokio::test]
async fn failed_connects_back_off_and_a_new_address_is_tried_at_once() {
    let slow_retries =
        PeerTimeouts { reconnect_min: Duration::from_secs(600), reconnect_max: Duration::from_secs(600), ..timeouts() };
    let pair = Pair::start_with(secret(SECRET), slow_retries).await;
    let vacant = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a port");
        listener.local_addr().expect("bound")
    };
    pair.directory.set(CALLED, vacant);
    let error = pair.bus.lowest_in_flight(CALLED, &conversation("grp:x")).await.expect_err("nobody listens");
    assert_failed(&error, CALLED, "cannot connect");
    assert_eq!(socket_error(&error), Some(std::io::ErrorKind::ConnectionRefused), "the cause is kept: {error}");
    let error = pair.bus.lowest_in_flight(CALLED, &conversation("grp:x")).await.expect_err("backing off");
    assert_failed(&error, CALLED, "next attempt in");
    assert_eq!(socket_error(&error), Some(std::io::ErrorKind::ConnectionRefused), "the last attempt's cause too");
    pair.directory.set(CALLED, pair.served.address);
    assert_eq!(pair.bus.lowest_in_flight(CALLED, &conversation("grp:x")).await, Ok(Some(41)));
}

#[tokio::test]
async fn a_silent_peer_costs_one_deadline_then_calls_fail_at_once() {
    // Accepts TCP (the kernel's backlog does) but never says a word.
    let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind a port");
    let quick = PeerTimeouts {
        request: Duration::from_millis(300),
        reconnect_min: Duration::from_secs(600),
        reconnect_max: Duration::from_secs(600),
        ..timeouts()
    };
    let pair = Pair::start_with(secret(SECRET), quick).await;
    pair.directory.set(CALLED, silent.local_addr().expect("bound"));
    let error = pair.bus.lowest_in_flight(CALLED, &conversation("grp:x")).await.expect_err("no challenge comes");
    assert_failed(&error, CALLED, "did not answer lowest_in_flight within 300ms");
    let error = pair.bus.lowest_in_flight(CALLED, &conversation("grp:x")).await.expect_err("backing off");
    assert_failed(&error, CALLED, "did not finish in time; next attempt in");
    pair.directory.set(CALLED, pair.served.address);
    assert_eq!(pair.bus.lowest_in_flight(CALLED, &conversation("grp:x")).await, Ok(Some(41)));
}

#[tokio::test]
async fn a_peer_that_keeps_timing_out_opens_its_breaker_then_calls_fail_at_once_until_it_answers_again() {
    let quick = PeerTimeouts { forward_send: Duration::from_millis(200), ..timeouts() };
    let mut pair = Pair::start_with(secret(SECRET), quick).await;
    pair.bus = PeerBus::new(CALLER, secret(SECRET), Arc::clone(&pair.directory) as _, quick)
        .with_breakers(BreakerConfig { failures: 3, span: Duration::ZERO, open_for: Duration::from_millis(300) });
    let breaker_of = |bus: &PeerBus| {
        let breakers = bus.breakers();
        assert_eq!(breakers.len(), 1, "one peer called: {breakers:?}");
        assert_eq!(breakers[0].name, format!("peer:{CALLED}"));
        breakers[0].clone()
    };
    assert_eq!(pair.bus.lowest_in_flight(CALLED, &conversation("grp:x")).await, Ok(Some(41)), "the link is open");
    // The peer reads each send, but never answers (an overloaded or stuck node).
    pair.recorder.sends.send_replace(false);
    for rid in 1..=3 {
        let error = pair.bus.forward_send(CALLED, send_request(rid, 0), queued()).await.expect_err("no answer");
        assert_late(&error, CALLED, "did not answer forward_send within 200ms");
    }
    assert_eq!(breaker_of(&pair.bus).state, BreakerState::Open);
    let error = pair.bus.forward_send(CALLED, send_request(4, 0), queued()).await.expect_err("not even sent");
    assert_failed(&error, CALLED, "circuit breaker is open");
    let sends = pair.recorder.calls().iter().filter(|call| matches!(call, Recorded::Send(_))).count();
    assert_eq!(sends, 3, "the refused call never reached the peer");

    // The peer answers again: the first call after the open period goes through (over a
    // fresh link) and closes the breaker.
    pair.recorder.sends.send_replace(true);
    let ack = poll()
        .within(WAIT)
        .every(Duration::from_millis(50))
        .until("the peer to be asked again", async || {
            pair.bus.forward_send(CALLED, send_request(5, 0), queued()).await.map_err(|error| format!("{error:?}"))
        })
        .await;
    assert_eq!(ack.ack, ack_for(&send_request(5, 0)));
    let status = breaker_of(&pair.bus);
    assert_eq!((status.state, status.opened), (BreakerState::Closed, 1));
    assert!(status.refused >= 1, "{status:?}");
}

#[tokio::test]
async fn a_peer_that_cannot_prove_the_secret_or_is_another_node_is_not_used() {
    for (answering, proof, expected) in [
        (CALLED, Bytes::from_static(&[0; 32]), "could not prove it knows cluster.secret"),
        (NodeId(5), Bytes::new(), "is node 5, not node 2"),
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a port");
        let directory = Arc::new(Directory::default());
        directory.set(CALLED, listener.local_addr().expect("bound"));
        let impostor = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("a caller");
            let nonce = Bytes::from_static(&[1; 32]);
            let challenge = wire::Challenge { protocol_version: PROTOCOL_VERSION, node_id: answering.0, nonce };
            write_frame(&mut stream, Body::Challenge(challenge)).await;
            if let Some(Body::Hello(_)) = read_frame(&mut stream).await {
                write_frame(&mut stream, Body::Welcome(wire::Welcome { proof })).await;
            }
            stream
        });
        let bus = PeerBus::new(CALLER, secret(SECRET), directory as _, timeouts());
        let error =
            bus.deliver(CALLED, Arc::new(message()), &[user("bob")], Addressed::ByRoute).await.expect_err("not used");
        assert_failed(&error, CALLED, expected);
        drop(impostor.await);
    }
}

// Raw frames: the link as a broken or hostile peer speaks it.

/// A TCP relay in front of a server that counts the connections passing through it.
struct Relay {
    address: SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl Relay {
    async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a port");
        let address = listener.local_addr().expect("bound");
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&connections);
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut outbound = TcpStream::connect(target).await.expect("the target listens");
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        });
        Self { address, connections }
    }
}
