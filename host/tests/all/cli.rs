//! The `herald` binary as a user runs it: `migrate`, `serve` with `/healthz`, and clear
//! errors for bad configuration.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::poll::poll;

fn herald() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_herald"));
    command.env_remove("HERALD_CONFIG").env("RUST_LOG", "warn");
    command
}

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn migrate_creates_the_embedded_database() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("nested/data");
    let output = herald().args(["migrate", "--data-dir"]).arg(&data).output().expect("run herald");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(data.join("herald.db").exists());
    assert!(String::from_utf8_lossy(&output.stderr).contains("up to date"));
    // Again: a no-op.
    let again = herald().args(["migrate", "--data-dir"]).arg(&data).output().expect("run herald");
    assert!(again.status.success());
}

#[test]
fn serve_answers_healthz_and_readyz() {
    let dir = tempfile::tempdir().expect("temp dir");
    let listen_file = dir.path().join("listening");
    let child = herald()
        .args(["serve", "--dev", "--listen", "127.0.0.1:0", "--listen-file"])
        .arg(&listen_file)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .stdout(Stdio::null())
        .spawn()
        .expect("start herald");
    let mut server = Server(child);
    // The port the system picked, written once herald accepts connections.
    let starting = poll().within(Duration::from_secs(30)).every(Duration::from_millis(50));
    let port = starting.until_blocking("herald to write the address it listens on", || {
        if let Ok(Some(status)) = server.0.try_wait() {
            panic!("herald exited with {status} before listening");
        }
        let text = std::fs::read_to_string(&listen_file).map_err(|error| error.to_string())?;
        text.trim().parse::<SocketAddr>().map(|addr| addr.port()).map_err(|error| format!("{text:?}: {error}"))
    });
    let health = http_get(port, "/healthz").expect("healthz once listening");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let ready = http_get(port, "/readyz").expect("readyz");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let missing = http_get(port, "/nope").expect("404");
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    assert!(missing.contains(r#"{"error":{"code":"not_found""#), "{missing}");
}

#[test]
fn bad_configuration_is_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("herald.toml");
    std::fs::write(&config, "node_id = 5000\n").expect("write config");
    let output = herald().args(["serve", "--config"]).arg(&config).output().expect("run herald");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("node_id 5000 is out of range"), "{stderr}");

    let output = herald()
        .args(["migrate", "--data-dir"])
        .arg(dir.path())
        .env("HERALD_STORAGE__URL", "redis://127.0.0.1/")
        .output()
        .expect("run herald");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("unsupported database url"));
}

/// Dev mode accepts `dev:<user>` tokens and `dev-key`: it must never face a network.
#[test]
fn dev_mode_on_a_non_loopback_address_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let output = herald()
        .args(["serve", "--dev", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("run herald");
    assert!(!output.status.success(), "herald --dev on 0.0.0.0 must not start");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("dev mode listens on loopback only"), "{stderr}");
}

/// Node-to-node links off loopback without `[tls]` would carry frames in plain text: the
/// node refuses before it reaches Redis, the database or the peer port, saying what to set.
#[test]
fn cluster_links_off_loopback_without_tls_are_refused_at_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let node = |plaintext_peers: Option<&str>| {
        let mut command = herald();
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path())
            .env("HERALD_GATEWAY__JWT_SECRET", "a-test-secret-of-some-length")
            // Nothing listens on port 1: a node past validation fails there, at once.
            .env("HERALD_CLUSTER__REDIS_URL", "redis://127.0.0.1:1/0")
            .env("HERALD_STORAGE__URL", "postgres://herald@127.0.0.1:1/herald")
            .env("HERALD_STORAGE__CONNECT_TIMEOUT_MS", "500")
            .env("HERALD_CLUSTER__SECRET", "a-cluster-secret")
            .env("HERALD_CLUSTER__PEER_LISTEN", "0.0.0.0:0");
        if let Some(value) = plaintext_peers {
            command.env("HERALD_CLUSTER__PLAINTEXT_PEERS", value);
        }
        command.output().expect("run herald")
    };
    let refused = node(None);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "herald must not start:\n{stderr}");
    for needed in
        ["links would cross the network in plain text", "HERALD_TLS__CERT_FILE", "HERALD_CLUSTER__PLAINTEXT_PEERS"]
    {
        assert!(stderr.contains(needed), "{needed:?} missing in:\n{stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");

    // The opt-out passes validation; this node then stops at the database it cannot reach.
    let opted_out = node(Some("true"));
    let stderr = String::from_utf8_lossy(&opted_out.stderr);
    assert!(!opted_out.status.success(), "no database to start with:\n{stderr}");
    assert!(!stderr.contains("plain text") && !stderr.contains("invalid configuration"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A data dir whose database file is damaged — not a database at all, or an SQLite file
/// with garbage pages — is refused at start naming the file and what to do, without a panic.
#[test]
fn a_damaged_sqlite_file_is_refused_at_start_with_a_clear_message() {
    let healthy = tempfile::tempdir().expect("temp dir");
    let output = herald().args(["migrate", "--data-dir"]).arg(healthy.path()).output().expect("run herald");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let file = healthy.path().join("herald.db");
    let mut bytes = std::fs::read(&file).expect("the migrated database");
    assert!(bytes.len() > 8192 * 2, "several pages: {}", bytes.len());
    // Keep the header page; overwrite the rest with a pattern no b-tree page has.
    for byte in &mut bytes[8192..] {
        *byte = 0xA5;
    }
    std::fs::write(&file, &bytes).expect("damage the file");

    let garbage = tempfile::tempdir().expect("temp dir");
    std::fs::write(garbage.path().join("herald.db"), vec![0x5A; 100_000]).expect("write garbage");

    for (dir, what) in [(&healthy, "garbage pages"), (&garbage, "not a database")] {
        let output = herald()
            .args(["serve", "--dev", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path())
            .output()
            .expect("run herald");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{what}: herald must not start:\n{stderr}");
        assert!(stderr.contains("is not a healthy SQLite database"), "{what}: {stderr}");
        assert!(stderr.contains("herald.db") && stderr.contains("restore it from a backup"), "{what}: {stderr}");
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    }
}

/// `herald plugin new` as a user runs it from an installed binary: the crate it writes
/// carries the SDK (no path into this checkout), builds for wasm32-wasip2, and loads.
#[test]
fn plugin_new_writes_a_crate_that_builds_anywhere_and_loads() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Named apart from every test guest: it is built into the guests' target folder.
    let out =
        herald().args(["plugin", "new", "my-first-plugin", "--dir"]).arg(dir.path()).output().expect("plugin new");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let root = dir.path().join("my-first-plugin");
    let cargo_toml = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    assert!(cargo_toml.contains(r#"herald-sdk = { path = "herald-sdk" }"#), "{cargo_toml}");
    let checkout = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("checkout");
    for file in ["Cargo.toml", "herald-sdk/Cargo.toml", "herald-sdk/build.rs"] {
        let text = std::fs::read_to_string(root.join(file)).expect(file);
        assert!(!text.contains(&*checkout.to_string_lossy()), "{file} names this checkout: {text}");
    }
    // Moved elsewhere, as a clone on another machine would be, it still builds.
    let moved = dir.path().join("elsewhere");
    std::fs::rename(&root, &moved).expect("move");
    let target = checkout.join("target/plugin-guests");
    let build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--target", "wasm32-wasip2", "--manifest-path"])
        .arg(moved.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("cargo build");
    assert!(build.status.success(), "the scaffold does not build:\n{}", String::from_utf8_lossy(&build.stderr));
    let wasm = target.join("wasm32-wasip2/release/my_first_plugin.wasm");
    let check = herald().args(["plugin", "check"]).arg(&wasm).output().expect("plugin check");
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    let report: serde_json::Value = serde_json::from_slice(&check.stdout).expect("check prints JSON");
    assert_eq!(report["hooks"], serde_json::json!(["message-policy"]), "{report}");
    assert_eq!(report["contract_version"], herald_plugin_runtime::CONTRACT_VERSION, "{report}");

    // An SDK location that does not hold the SDK is refused, and nothing is written.
    let out = herald()
        .args(["plugin", "new", "other", "--dir"])
        .arg(dir.path())
        .arg("--sdk-path")
        .arg(dir.path().join("no-sdk-here"))
        .output()
        .expect("plugin new");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("herald-sdk not found at"), "{stderr}");
    assert!(!dir.path().join("other").exists());
}
