//! Opening a link: both ends prove they know `cluster.secret` without sending it, and state
//! the protocol version they speak.
//!
//! ```text
//! called → caller   Challenge {protocol_version, node_id, nonce}
//! caller → called   Hello {protocol_version, node_id, nonce', proof = HMAC(secret, "herald-peer client" ‖ nonce ‖ node_id)}
//! called → caller   Welcome {proof = HMAC(secret, "herald-peer server" ‖ nonce' ‖ node_id)} | Refused {reason, message}
//! ```
//!
//! The nonces are fresh random bytes, so a recorded proof is worth nothing on another link;
//! the labels keep a proof of one side from serving as the other's. Proofs are compared in
//! constant time. A refusal is logged by the called node with the caller's address and
//! claimed node id, never with a proof or the secret.

use std::net::SocketAddr;

use bytes::Bytes;
use herald_proto::peer::v1::{Challenge, Hello, PeerFrame, Refused, Welcome, peer_frame::Body, refused::Reason};
use hmac::{Hmac, KeyInit as _, Mac as _};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite};

use super::frame::{self, FrameError, MAX_HANDSHAKE_FRAME_BYTES};
use super::{PROTOCOL_VERSION, PeerSecret};
use crate::model::NodeId;

/// Random bytes in each nonce.
const NONCE_BYTES: usize = 32;

/// What the caller's proof covers besides the nonce and its node id.
const CALLER_LABEL: &[u8] = b"herald-peer client";

/// What the called node's proof covers besides the nonce and its node id.
const CALLED_LABEL: &[u8] = b"herald-peer server";

/// The keyed MAC over `label ‖ nonce ‖ node`.
fn mac(secret: &PeerSecret, label: &[u8], nonce: &[u8], node: NodeId) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.bytes()).expect("HMAC accepts keys of any length");
    mac.update(label);
    mac.update(nonce);
    mac.update(&node.0.to_be_bytes());
    mac
}

fn prove(secret: &PeerSecret, label: &[u8], nonce: &[u8], node: NodeId) -> Bytes {
    Bytes::copy_from_slice(&mac(secret, label, nonce, node).finalize().into_bytes())
}

/// Whether `proof` is the MAC over `label ‖ nonce ‖ node`, compared in constant time.
fn verify(secret: &PeerSecret, label: &[u8], nonce: &[u8], node: NodeId, proof: &[u8]) -> bool {
    mac(secret, label, nonce, node).verify_slice(proof).is_ok()
}

fn nonce() -> Bytes {
    Bytes::copy_from_slice(&rand::random::<[u8; NONCE_BYTES]>())
}

fn frame(body: Body) -> PeerFrame {
    PeerFrame { body: Some(body) }
}

/// The caller's side: proves this node (`local`) to the node at `address`, which must be
/// `expected`, and checks its proof in turn.
///
/// # Errors
/// Why the link cannot be used, phrased for the operator: the peer refused the secret or
/// the version, it is another node than expected, it could not prove the secret, or the
/// connection failed.
pub(super) async fn introduce<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    address: SocketAddr,
    local: NodeId,
    expected: NodeId,
    secret: &PeerSecret,
) -> Result<(), String> {
    let failed = |error: frame::FrameError| format!("handshake with node {expected} at {address} failed: {error}");
    let challenge = match frame::read(stream, MAX_HANDSHAKE_FRAME_BYTES).await.map_err(failed)?.body {
        Some(Body::Challenge(challenge)) => challenge,
        _ => return Err(format!("{address} does not speak the Herald peer protocol (no challenge)")),
    };
    if challenge.node_id != expected.0 {
        return Err(format!(
            "{address} is node {}, not node {expected}: the address this node has for it is stale",
            challenge.node_id
        ));
    }
    let our_nonce = nonce();
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION,
        node_id: local.0,
        proof: prove(secret, CALLER_LABEL, &challenge.nonce, local),
        nonce: our_nonce.clone(),
    };
    // Sent even when the versions differ, so the called node logs the mismatch too.
    frame::write(stream, &frame(Body::Hello(hello))).await.map_err(failed)?;
    if challenge.protocol_version != PROTOCOL_VERSION {
        return Err(version_mismatch(expected, challenge.protocol_version, local, PROTOCOL_VERSION));
    }
    match frame::read(stream, MAX_HANDSHAKE_FRAME_BYTES).await.map_err(failed)?.body {
        Some(Body::Welcome(Welcome { proof })) if verify(secret, CALLED_LABEL, &our_nonce, expected, &proof) => Ok(()),
        Some(Body::Welcome(_)) => Err(format!(
            "node {expected} at {address} could not prove it knows cluster.secret; set the same cluster.secret on \
             every node"
        )),
        Some(Body::Refused(refused)) => Err(match refused.reason() {
            Reason::Secret => {
                format!("node {expected} refused this node's cluster.secret; set the same cluster.secret on every node")
            }
            _ => format!("node {expected} refused the link: {}", refused.message),
        }),
        _ => Err(format!("node {expected} at {address} broke the handshake (no welcome)")),
    }
}

/// Why the called side did not admit a link.
#[derive(Debug)]
pub(super) enum Rejection {
    /// The caller was told why, then the link closed: a different version or secret, or a
    /// malformed hello. Worth a warning.
    Refused {
        reason: Reason,
        /// The node the caller said it is, if it got that far.
        claimed: Option<NodeId>,
        message: String,
    },
    /// The link broke before a hello (a port probe, a caller that gave up). Not worth one.
    Broken(String),
}

/// The called side: challenges the caller and checks its hello. Returns the caller's node
/// id once it proved it knows the secret; otherwise tells it why (when the link still
/// works) and returns why.
///
/// The caller of this function bounds it with [`PeerTimeouts::hello`](super::PeerTimeouts).
pub(super) async fn admit<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    local: NodeId,
    secret: &PeerSecret,
) -> Result<NodeId, Rejection> {
    let refused =
        |reason: Reason, claimed: Option<NodeId>, message: String| Rejection::Refused { reason, claimed, message };
    let our_nonce = nonce();
    let challenge = Challenge { protocol_version: PROTOCOL_VERSION, node_id: local.0, nonce: our_nonce.clone() };
    frame::write(stream, &frame(Body::Challenge(challenge)))
        .await
        .map_err(|error| Rejection::Broken(format!("sending the challenge failed: {error}")))?;
    let hello = match frame::read(stream, MAX_HANDSHAKE_FRAME_BYTES).await {
        Ok(PeerFrame { body: Some(Body::Hello(hello)) }) => hello,
        Ok(_) => {
            return refuse(stream, refused(Reason::Protocol, None, "the first frame is not a hello".to_owned())).await;
        }
        Err(FrameError::Closed) => return Err(Rejection::Broken("closed before its hello".to_owned())),
        Err(error) => return refuse(stream, refused(Reason::Protocol, None, format!("no valid hello: {error}"))).await,
    };
    let caller = NodeId(hello.node_id);
    if hello.protocol_version != PROTOCOL_VERSION {
        let message = version_mismatch(caller, hello.protocol_version, local, PROTOCOL_VERSION);
        return refuse(stream, refused(Reason::Version, Some(caller), message)).await;
    }
    if !verify(secret, CALLER_LABEL, &our_nonce, caller, &hello.proof) {
        let message = format!("node {caller}'s proof does not match this node's cluster.secret");
        return refuse(stream, refused(Reason::Secret, Some(caller), message)).await;
    }
    if hello.nonce.len() != NONCE_BYTES {
        let message = format!("the hello's nonce is not {NONCE_BYTES} bytes");
        return refuse(stream, refused(Reason::Protocol, Some(caller), message)).await;
    }
    let welcome = Welcome { proof: prove(secret, CALLED_LABEL, &hello.nonce, local) };
    frame::write(stream, &frame(Body::Welcome(welcome)))
        .await
        .map_err(|error| Rejection::Broken(format!("sending the welcome failed: {error}")))?;
    Ok(caller)
}

/// Tells the caller why it is refused (best effort: it may be gone) and returns the refusal.
async fn refuse<S: AsyncWrite + Unpin, T>(stream: &mut S, rejection: Rejection) -> Result<T, Rejection> {
    if let Rejection::Refused { reason, message, .. } = &rejection {
        let refused = Refused { reason: (*reason).into(), message: message.clone() };
        let _ = frame::write(stream, &frame(Body::Refused(refused))).await;
    }
    Err(rejection)
}

fn version_mismatch(peer: NodeId, theirs: u32, local: NodeId, ours: u32) -> String {
    format!(
        "node {peer} speaks peer protocol version {theirs} and node {local} version {ours}; run one Herald release \
         on every node of a cluster"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(text: &str) -> PeerSecret {
        PeerSecret::new(text).expect("not empty")
    }

    #[test]
    fn a_proof_holds_only_for_its_secret_nonce_node_and_side() {
        let nonce = [7u8; NONCE_BYTES];
        let proof = prove(&secret("s3cret"), CALLER_LABEL, &nonce, NodeId(4));
        assert!(verify(&secret("s3cret"), CALLER_LABEL, &nonce, NodeId(4), &proof));
        assert!(!verify(&secret("other"), CALLER_LABEL, &nonce, NodeId(4), &proof));
        assert!(!verify(&secret("s3cret"), CALLER_LABEL, &[8u8; NONCE_BYTES], NodeId(4), &proof));
        assert!(!verify(&secret("s3cret"), CALLER_LABEL, &nonce, NodeId(5), &proof));
        assert!(!verify(&secret("s3cret"), CALLED_LABEL, &nonce, NodeId(4), &proof));
        assert!(!verify(&secret("s3cret"), CALLER_LABEL, &nonce, NodeId(4), &proof[..16]));
    }

    #[tokio::test]
    async fn both_sides_agree_on_a_shared_secret_and_refuse_a_different_one() {
        let address: SocketAddr = "127.0.0.1:7071".parse().expect("an address");
        for (caller_secret, accepted) in [("same", true), ("different", false)] {
            let (mut caller, mut called) = tokio::io::duplex(4096);
            let called_side = tokio::spawn(async move { admit(&mut called, NodeId(2), &secret("same")).await });
            let opened = introduce(&mut caller, address, NodeId(1), NodeId(2), &secret(caller_secret)).await;
            let admitted = called_side.await.expect("no panic");
            if accepted {
                assert_eq!(opened, Ok(()));
                assert_eq!(admitted.expect("admitted"), NodeId(1));
            } else {
                assert!(opened.expect_err("refused").contains("cluster.secret"));
                let rejection = admitted.expect_err("refused");
                assert!(
                    matches!(rejection, Rejection::Refused { reason: Reason::Secret, claimed: Some(NodeId(1)), .. }),
                    "{rejection:?}"
                );
            }
        }
    }

    #[tokio::test]
    async fn a_caller_expecting_another_node_stops_before_proving_anything() {
        let address: SocketAddr = "127.0.0.1:7071".parse().expect("an address");
        let (mut caller, mut called) = tokio::io::duplex(4096);
        tokio::spawn(async move { admit(&mut called, NodeId(9), &secret("same")).await });
        let error = introduce(&mut caller, address, NodeId(1), NodeId(2), &secret("same")).await.expect_err("stale");
        assert!(error.contains("is node 9, not node 2"), "{error}");
    }
}
