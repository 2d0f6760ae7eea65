//! TLS without a proxy: `[tls]` makes the client listener speak TLS —
//! `wss://` and `https://` end to end with a certificate the test makes, a renewed
//! certificate picked up without a restart, a broken renewal ignored, a pair that does not
//! load refused at start; and node-to-node links over TLS in cluster mode, or in plain
//! text off loopback only where the network is declared private.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_rustls::rustls::client::Resumption;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use herald_host::store::Backend;

use super::WAIT;
use super::client::Client;
use super::nodes::Nodes;
use super::server::{Herald, exchange};
use super::token;
use crate::support::poll::poll;

/// A self-signed certificate for 127.0.0.1 and localhost, as PEM: (certificate, key).
fn make_certificate() -> (String, String) {
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .expect("make a certificate");
    (made.cert.pem(), made.signing_key.serialize_pem())
}

/// A client that trusts `certificate` (PEM) only.
fn trusting(certificate: &str) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    let der = CertificateDer::from_pem_slice(certificate.as_bytes()).expect("PEM certificate");
    roots.add(der).expect("a root");
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    // Every connection verifies the certificate it is shown (a resumed session would not).
    config.resumption = Resumption::disabled();
    Arc::new(config)
}

/// Writes `contents` to `path` the way a renewal tool does: a new file renamed over it.
fn replace(path: &Path, contents: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, contents).expect("write the new file");
    std::fs::rename(&next, path).expect("rename it over the old");
}

struct Files {
    _dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
}

fn files(certificate: &str, key: &str) -> Files {
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, certificate).expect("write the certificate");
    std::fs::write(&key_path, key).expect("write the key");
    Files { _dir: dir, cert, key: key_path }
}

async fn start(files: &Files, client: Arc<ClientConfig>) -> Herald {
    Herald::with()
        .set("TLS__CERT_FILE", files.cert.display())
        .set("TLS__KEY_FILE", files.key.display())
        .set("TLS__RELOAD_CHECK_MS", 100)
        .tls(client)
        .start()
        .await
}

/// Whether a TLS client trusting `client` gets `/healthz` answered.
async fn healthz(herald: &Herald, client: &Arc<ClientConfig>) -> Result<u16, String> {
    exchange(herald.port, Some(client), "GET", "/healthz", None, None).await.map(|response| response.status)
}

#[tokio::test]
async fn wss_and_https_work_end_to_end_and_plain_http_gets_no_answer() {
    let (certificate, key) = make_certificate();
    let files = files(&certificate, &key);
    let client = trusting(&certificate);
    let herald = start(&files, Arc::clone(&client)).await;
    assert!(herald.ws_url().starts_with("wss://"));

    let mut alice = Client::connect(&herald, "alice", "phone").await;
    let mut bob = Client::connect(&herald, "bob", "phone").await;
    let ack = alice.send_ok("dm:alice:bob", "over tls").await;
    let message = bob.deliver_in("dm:alice:bob").await.message.expect("a message");
    assert_eq!((message.id, message.body.as_ref()), (ack.message_id, b"over tls".as_ref()), "over wss");

    let history = herald.get("/v1/conversations/dm:alice:bob/messages", Some("dev:bob")).await;
    assert_eq!(history.status, 200, "the JSON API answers over https: {history:?}");
    assert!(history.body.contains(&ack.message_id.to_string()), "{history:?}");

    // A plain-text request to the TLS port is not served.
    let plain = super::server::http(herald.port, "GET", "/healthz", None, None).await;
    assert!(
        plain.is_err() || plain.as_ref().is_ok_and(|r| r.status != 200),
        "plain HTTP must not be served: {plain:?}"
    );
    // Nor is a client that does not trust the certificate.
    let (other, _) = make_certificate();
    let refused = healthz(&herald, &trusting(&other)).await;
    assert!(refused.is_err(), "a client trusting another certificate must fail its handshake: {refused:?}");
}

#[tokio::test]
async fn a_renewed_certificate_is_used_by_new_connections_without_a_restart() {
    let (old_certificate, old_key) = make_certificate();
    let files = files(&old_certificate, &old_key);
    let old = trusting(&old_certificate);
    let herald = start(&files, Arc::clone(&old)).await;
    let mut alice = Client::connect(&herald, "alice", "phone").await;
    assert_eq!(healthz(&herald, &old).await, Ok(200));

    // A broken renewal (half a certificate) is ignored: the old one stays in use. Once the
    // server has read it (it logs that it does not load), the old one must still serve.
    replace(&files.cert, &old_certificate[..old_certificate.len() / 2]);
    let read = poll()
        .within(WAIT)
        .every(Duration::from_millis(50))
        .try_until("the broken renewal to be read", async || herald.log_tail().contains("does not load"));
    if let Err(timed_out) = read.await {
        panic!("{timed_out}\n{}", herald.log_tail());
    }
    assert_eq!(healthz(&herald, &old).await, Ok(200), "the certificate in use is kept\n{}", herald.log_tail());

    let (new_certificate, new_key) = make_certificate();
    let new = trusting(&new_certificate);
    replace(&files.key, &new_key);
    replace(&files.cert, &new_certificate);
    let renewed =
        poll().within(WAIT).every(Duration::from_millis(50)).try_until("the new certificate to be used", async || {
            match healthz(&herald, &new).await {
                Ok(200) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        });
    if let Err(timed_out) = renewed.await {
        panic!("{timed_out}\n{}", herald.log_tail());
    }
    assert!(healthz(&herald, &old).await.is_err(), "new connections get the new certificate only");

    // The connection opened before the renewal goes on.
    let ack = alice.send_ok("dm:alice:bob", "still here").await;
    assert!(ack.message_id > 0);
}

#[test]
fn a_certificate_or_key_that_does_not_load_refuses_to_start() {
    let (certificate, key) = make_certificate();
    let (other_certificate, _) = make_certificate();
    let cases = [
        (
            "the key of another certificate",
            other_certificate.as_str(),
            key.as_str(),
            "does not belong to the certificate",
        ),
        ("no certificate", "not a certificate", key.as_str(), "holds no certificate"),
        ("no key", certificate.as_str(), "not a key", "no private key"),
    ];
    for (what, certificate, key, expected) in cases {
        let files = files(certificate, key);
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(["serve", "--dev", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(files.cert.parent().expect("dir"))
            .env("HERALD_TLS__CERT_FILE", &files.cert)
            .env("HERALD_TLS__KEY_FILE", &files.key)
            .env_remove("HERALD_CONFIG")
            .output()
            .expect("run herald");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{what}: herald must not start:\n{stderr}");
        assert!(stderr.contains(expected), "{what}: expected {expected:?} in:\n{stderr}");
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    }
}

/// Cluster mode: two nodes sharing one certificate link over TLS (each trusts the other's
/// certificate because it is its own: `tls.ca_file` defaults to `tls.cert_file`), and a
/// message crosses from one to the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_link_over_tls_and_carry_a_message_across() {
    let (certificate, key) = make_certificate();
    let files = files(&certificate, &key);
    let (cert, key) = (files.cert.display().to_string(), files.key.display().to_string());
    let extra = [("TLS__CERT_FILE", cert.as_str()), ("TLS__KEY_FILE", key.as_str())];
    let nodes = Nodes::start_configured(2, Backend::Postgres, &extra, Some(trusting(&certificate))).await;
    let mut alice = Client::connect(&nodes.nodes[0], "alice", "phone").await;
    let mut bob = Client::connect(&nodes.nodes[1], "bob", "phone").await;
    // Whichever node owns the conversation, one of the two messages crosses a link each
    // way (a forwarded send, or a delivery to a device on the other node).
    let there = alice.send_ok("dm:alice:bob", "across").await;
    bob.deliver_of(there.message_id).await;
    let back = bob.send_ok("dm:alice:bob", "and back").await;
    alice.deliver_of(back.message_id).await;
    let logs = nodes.log_tails();
    assert!(logs.contains("peer link open"), "the nodes linked\n{logs}");
    assert!(!logs.contains("tls handshake"), "no TLS handshake failed\n{logs}");
    nodes.stop().await;
}

/// Off loopback, links need `[tls]` or `cluster.plaintext_peers` (a node with neither is
/// refused at start, `cli.rs`). Two production nodes accepting links on the wildcard
/// address, configured by `extra`, link and carry a message each way.
async fn link_off_loopback(extra: &[(&str, &str)], client: Option<Arc<ClientConfig>>) -> String {
    const JWT_SECRET: &[u8] = b"off-loopback-test-secret-0123456";
    let dir = tempfile::tempdir().expect("temp dir");
    // /admin/cluster, which the harness polls for members, takes an admin key outside dev mode.
    let file = dir.path().join("herald.toml");
    std::fs::write(&file, format!("[api]\nadmin_keys = [\"{}\"]\n", super::server::DEV_KEY)).expect("write config");
    let mut nodes = Nodes::start_configured(0, Backend::Postgres, &[], None).await;
    for _ in 0..2 {
        let mut options = nodes
            .options()
            .production()
            .set("CONFIG", file.display())
            .set("GATEWAY__JWT_SECRET", String::from_utf8_lossy(JWT_SECRET))
            .set("CLUSTER__SECRET", "off-loopback-cluster-secret")
            .set("CLUSTER__PEER_LISTEN", "0.0.0.0:0");
        for (key, value) in extra {
            options = options.set(key, value);
        }
        if let Some(client) = &client {
            options = options.tls(Arc::clone(client));
        }
        nodes.nodes.push(options.start().await);
    }
    nodes.wait_for_members(2).await;
    let mut alice = Client::open(&nodes.nodes[0], herald_proto::Encoding::Proto).await;
    alice.login(&token::valid(JWT_SECRET, "alice"), "phone").await.unwrap_or_else(|why| panic!("{why}"));
    let mut bob = Client::open(&nodes.nodes[1], herald_proto::Encoding::Proto).await;
    bob.login(&token::valid(JWT_SECRET, "bob"), "phone").await.unwrap_or_else(|why| panic!("{why}"));
    let there = alice.send_ok("dm:alice:bob", "across").await;
    bob.deliver_of(there.message_id).await;
    let back = bob.send_ok("dm:alice:bob", "and back").await;
    alice.deliver_of(back.message_id).await;
    // Whole logs: the start-up lines are asked about, which the tails may have lost.
    let logs: String =
        nodes.nodes.iter().map(|node| std::fs::read_to_string(node.log_path()).unwrap_or_default()).collect();
    assert!(logs.contains("peer link open"), "the nodes linked\n{}", nodes.log_tails());
    nodes.stop().await;
    logs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_off_loopback_link_over_tls() {
    let (certificate, key) = make_certificate();
    let files = files(&certificate, &key);
    let (cert, key) = (files.cert.display().to_string(), files.key.display().to_string());
    // The nodes advertise the wildcard address, which no certificate names: they verify
    // each other by name instead.
    let extra =
        [("TLS__CERT_FILE", cert.as_str()), ("TLS__KEY_FILE", key.as_str()), ("TLS__PEER_SERVER_NAME", "localhost")];
    let logs = link_off_loopback(&extra, Some(trusting(&certificate))).await;
    // The start-up line's `links` field (the log's colours sit between key and value).
    assert!(logs.contains("\"tls\""), "{logs}");
    assert!(!logs.contains("tls handshake") && !logs.contains("plain text"), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_off_loopback_link_in_plain_text_only_when_declared_private() {
    let logs = link_off_loopback(&[("CLUSTER__PLAINTEXT_PEERS", "true")], None).await;
    assert!(logs.contains("node-to-node links leave loopback in plain text"), "warned at start\n{logs}");
}
