//! The link's raw frames, as a broken or hostile peer speaks them: malformed requests,
//! oversized or garbled frames, another protocol version, a wrong proof, no hello.

use super::*;

/// Opens a link to `address` as node `node` with `secret`, speaking `version`; returns the
/// stream and the called node's answer to the hello.
async fn raw_link(address: SocketAddr, node: NodeId, secret: &str, version: u32) -> (TcpStream, Option<Body>) {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let Some(Body::Challenge(challenge)) = read_frame(&mut stream).await else { panic!("no challenge") };
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    mac.update(b"herald-peer client");
    mac.update(&challenge.nonce);
    mac.update(&node.0.to_be_bytes());
    let proof = Bytes::copy_from_slice(&mac.finalize().into_bytes());
    let hello = wire::Hello { protocol_version: version, node_id: node.0, proof, nonce: Bytes::from_static(&[2; 32]) };
    write_frame(&mut stream, Body::Hello(hello)).await;
    let answer = read_frame(&mut stream).await;
    (stream, answer)
}

fn request(id: u64, kind: Option<wire::request::Kind>) -> Body {
    Body::Request(wire::Request { id, kind })
}

#[tokio::test]
async fn malformed_requests_are_answered_with_a_failure_and_the_link_stays_open() {
    let pair = Pair::start().await;
    let (mut stream, welcome) = raw_link(pair.served.address, CALLER, SECRET, PROTOCOL_VERSION).await;
    assert!(matches!(welcome, Some(Body::Welcome(_))), "{welcome:?}");

    let stored = wire::StoredMessage {
        message: Some(v1::Message {
            id: 1,
            conversation: "grp:x".to_owned(),
            seq: 1,
            sender: "alice".to_owned(),
            sender_device: "phone".to_owned(),
            ..v1::Message::default()
        }),
        client_msg_id: "123e4567-e89b-12d3-a456-426614174000".to_owned(),
    };
    let bad_user = wire::Deliver {
        message: Some(stored),
        users: vec!["bob".to_owned(), "not a user".to_owned()],
        unrouted: false,
    };
    let bad_conversation = wire::LowestInFlight { conversation: "chan:general".to_owned() };
    let no_route = wire::Kick { route: None, hand_over: true };
    // A send claiming to come from a connection on another node than the caller.
    let mut foreign = send_request(1, 0);
    foreign.origin.node = NodeId(7);
    let foreign = wire::ForwardSend {
        origin: Some(wire::Origin {
            user: foreign.origin.user.to_string(),
            device: foreign.origin.device.to_string(),
            node: foreign.origin.node.0,
            connection: foreign.origin.connection.0,
        }),
        rid: foreign.rid,
        send: Some(foreign.send),
        announcement: false,
    };
    for (id, kind) in [
        (1, Some(wire::request::Kind::Deliver(bad_user))),
        (2, Some(wire::request::Kind::LowestInFlight(bad_conversation))),
        (3, Some(wire::request::Kind::Kick(no_route))),
        (4, None),
        (5, Some(wire::request::Kind::ForwardSend(foreign))),
    ] {
        write_frame(&mut stream, request(id, kind)).await;
        let Some(Body::Response(response)) = read_frame(&mut stream).await else { panic!("no response to {id}") };
        assert_eq!(response.id, id);
        let Some(wire::response::Outcome::Failure(failure)) = response.outcome else { panic!("{id} was accepted") };
        assert_eq!(failure.code(), wire::failure::Code::BadRequest, "{}", failure.message);
        if id == 1 {
            assert!(failure.message.contains("user id contains ' '"), "{}", failure.message);
        }
    }
    let good = wire::LowestInFlight { conversation: "room:lobby".to_owned() };
    write_frame(&mut stream, request(6, Some(wire::request::Kind::LowestInFlight(good)))).await;
    let Some(Body::Response(response)) = read_frame(&mut stream).await else { panic!("the link closed") };
    assert_eq!(response.outcome, Some(wire::response::Outcome::InFlight(wire::InFlight { seq: Some(41) })));
    assert!(matches!(pair.recorder.calls().as_slice(), [Recorded::LowestInFlight(_)]), "{:?}", pair.recorder.calls());
}

#[tokio::test]
async fn an_oversized_or_garbled_frame_closes_the_link() {
    let pair = Pair::start().await;
    let oversized = 5u32 * 1024 * 1024;
    for bytes in [oversized.to_be_bytes().to_vec(), vec![0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff]] {
        let (mut stream, welcome) = raw_link(pair.served.address, CALLER, SECRET, PROTOCOL_VERSION).await;
        assert!(matches!(welcome, Some(Body::Welcome(_))), "{welcome:?}");
        stream.write_all(&bytes).await.expect("written");
        assert_eq!(read_frame(&mut stream).await, None, "the link stayed open after {bytes:?}");
    }
    // A frame that is not a request, on an open link.
    let (mut stream, _) = raw_link(pair.served.address, CALLER, SECRET, PROTOCOL_VERSION).await;
    write_frame(&mut stream, Body::Welcome(wire::Welcome { proof: Bytes::new() })).await;
    assert_eq!(read_frame(&mut stream).await, None);
    assert!(pair.recorder.calls().is_empty());
}

#[tokio::test]
async fn a_caller_speaking_another_protocol_version_is_refused_naming_both() {
    let pair = Pair::start().await;
    let (mut stream, answer) = raw_link(pair.served.address, CALLER, SECRET, 99).await;
    let Some(Body::Refused(refused)) = answer else { panic!("accepted: {answer:?}") };
    assert_eq!(refused.reason(), wire::refused::Reason::Version);
    assert!(refused.message.contains("version 99") && refused.message.contains(&format!("version {PROTOCOL_VERSION}")));
    assert_eq!(read_frame(&mut stream).await, None, "the link is closed after a refusal");
}

#[tokio::test]
async fn a_wrong_proof_is_refused_on_the_wire() {
    let pair = Pair::start().await;
    let (mut stream, answer) = raw_link(pair.served.address, CALLER, "guessed", PROTOCOL_VERSION).await;
    let Some(Body::Refused(refused)) = answer else { panic!("accepted: {answer:?}") };
    assert_eq!(refused.reason(), wire::refused::Reason::Secret);
    assert!(!refused.message.contains(SECRET));
    assert_eq!(read_frame(&mut stream).await, None);
}

#[tokio::test]
async fn a_caller_that_sends_no_hello_is_dropped() {
    let quick_hello = PeerTimeouts { hello: Duration::from_millis(200), ..timeouts() };
    let pair = Pair::start_with(secret(SECRET), quick_hello).await;
    let mut stream = TcpStream::connect(pair.served.address).await.expect("connect");
    assert!(matches!(read_frame(&mut stream).await, Some(Body::Challenge(_))));
    assert_eq!(read_frame(&mut stream).await, None, "the silent link was kept");
}
