//! Disk full: SQLite on a small tmpfs that fills up mid-traffic. A send
//! is answered RETRY while nothing can be written — never OK without a row —, the node
//! stays up, and once space is freed the same sends go through and every OK-acked message
//! is stored exactly once, also after a `kill -9` and a restart.
//!
//! Mounting a tmpfs needs root (CAP_SYS_ADMIN), which the test machine and CI have; without
//! it the test fails saying so, it does not skip.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use herald_proto::v1::send_ack::Status;
use tokio::time::Instant;

use super::client::Client;
use super::server::Herald;
use super::{WAIT, dm, uuid};

/// A tmpfs of `bytes` mounted on a temporary directory, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(bytes: u64) -> Self {
        let dir = tempfile::tempdir().expect("a mount point");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes},mode=0700"), "herald-disk-full"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            mounted.status.success(),
            "this test mounts a small tmpfs to fill it, which needs root (CAP_SYS_ADMIN): {}",
            String::from_utf8_lossy(&mounted.stderr)
        );
        Self { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a file until the file system is full; returns its path.
    fn fill(&self) -> PathBuf {
        let filler = self.path().join("filler");
        let mut file = std::fs::File::create(&filler).expect("create the filler");
        let chunk = vec![0xA5u8; 64 * 1024];
        loop {
            if let Err(error) = file.write_all(&chunk).and_then(|()| file.sync_all()) {
                assert_eq!(error.raw_os_error(), Some(28), "the tmpfs must fill up (ENOSPC), not {error}");
                break;
            }
        }
        // Whatever a short write left: fill the last bytes one at a time.
        while file.write_all(&[0]).and_then(|()| file.sync_all()).is_ok() {}
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// Every message of `conversation`, as (client-visible body → count), through HTTP history.
async fn stored(herald: &Herald, conversation: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    let mut after = 0u64;
    loop {
        let path = format!("/v1/conversations/{conversation}/messages?after_seq={after}&limit=200");
        let page = herald.get(&path, Some("dev:alice")).await;
        assert_eq!(page.status, 200, "{page:?}");
        let page = page.json();
        let messages = page["messages"].as_array().expect("messages").clone();
        if messages.is_empty() {
            return counts;
        }
        for message in &messages {
            let body = base64::Engine::decode(
                &base64::engine::general_purpose::STANDARD,
                message["body"].as_str().unwrap_or_default(),
            )
            .expect("base64 body");
            // The label is the body's first line; the rest is padding.
            let label = String::from_utf8_lossy(&body).lines().next().unwrap_or_default().to_owned();
            *counts.entry(label).or_insert(0) += 1;
            let seq = message["seq"].as_str().and_then(|seq| seq.parse::<u64>().ok()).expect("a seq");
            after = after.max(seq);
        }
    }
}

/// A body of about 16 KiB whose first line is `label`.
fn body(label: &str) -> Vec<u8> {
    let mut body = format!("{label}\n").into_bytes();
    body.resize(16 * 1024, b'.');
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_retry_never_ok_and_traffic_resumes_once_space_is_freed() {
    let disk = Tmpfs::mount(8 * 1024 * 1024);
    let mut herald = Herald::with()
        .set("STORAGE__URL", format!("sqlite://{}", disk.path().join("herald.db").display()))
        .start()
        .await;
    let mut alice = Client::connect(&herald, "alice", "phone").await;
    let conversation = dm("alice", "bob");
    // Label by client_msg_id, and the ids acked OK.
    let mut sent: BTreeMap<String, String> = BTreeMap::new();
    let mut acked_ok: BTreeSet<String> = BTreeSet::new();
    let send = async |alice: &mut Client, sent: &mut BTreeMap<String, String>, label: String| {
        let id = uuid();
        sent.insert(id.clone(), label.clone());
        alice.send_with(&id, &conversation, 1, &body(&label)).await;
        alice.ack_of(&id).await
    };
    for n in 0..5 {
        let ack = send(&mut alice, &mut sent, format!("before {n}")).await;
        assert_eq!(ack.status(), Status::Ok, "{ack:?}");
        acked_ok.insert(ack.client_msg_id);
    }

    // The disk fills up. Sends go on until the database can write no more: each answer is
    // OK (written: the WAL had room) or RETRY, and RETRY must come.
    let filler = disk.fill();
    let mut retries = 0;
    for n in 0..2_000 {
        let ack = send(&mut alice, &mut sent, format!("full {n}")).await;
        match ack.status() {
            Status::Ok => {
                acked_ok.insert(ack.client_msg_id);
            }
            Status::Retry => {
                assert!(ack.retry_after_ms > 0, "RETRY says when to come back: {ack:?}");
                retries += 1;
                if retries == 20 {
                    break;
                }
            }
            other => panic!("{}", alice.failure(&format!("a full disk must answer RETRY, not {other:?}: {ack:?}"))),
        }
    }
    assert_eq!(retries, 20, "sends into a full disk must be answered RETRY\n{}", herald.log_tail());
    let health = herald.get("/healthz", None).await;
    assert_eq!(health.status, 200, "the node stays up while the disk is full: {health:?}");
    // Never OK without a row: every send acked OK so far is stored, read while still full.
    let stored_while_full = stored(&herald, &conversation).await;
    for id in &acked_ok {
        let label = &sent[id];
        assert_eq!(stored_while_full.get(label), Some(&1), "{label} was acked OK, so it must be stored once");
    }

    // Space is freed: every send not acked OK goes through when resent with its own id.
    std::fs::remove_file(&filler).expect("free the space");
    let deadline = Instant::now() + WAIT;
    for (id, label) in &sent {
        if acked_ok.contains(id) {
            continue;
        }
        alice.resend_until_stored(id, &conversation, &body(label), deadline).await;
    }

    // Every message is stored exactly once; what was acked OK survives a kill -9 too.
    let expected: BTreeMap<String, usize> = sent.values().map(|label| (label.clone(), 1)).collect();
    assert_eq!(stored(&herald, &conversation).await, expected, "each message stored once");
    drop(alice);
    herald.restart().await;
    assert_eq!(stored(&herald, &conversation).await, expected, "and still there after kill -9 and a restart");
}
