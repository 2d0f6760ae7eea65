//! Hot reload: atomic swaps under load, failed versions leave the old one serving, the
//! folder watcher, unloading.

use crate::support::poll::poll;
use crate::support::{TestHost, built, install, message, no_quarantine};
use herald_plugin_runtime::{PluginHostConfig, PluginState, types::MessageDecision};
use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

fn swap_in(dir: &Path, krate: &str) {
    // Write beside, then rename: the watcher and readers never see half a file.
    let src = built().guests.join(format!("{}.wasm", krate.replace('-', "_")));
    let tmp = dir.join("echo.wasm.tmp");
    std::fs::copy(src, &tmp).expect("copy");
    std::fs::rename(&tmp, dir.join("echo.wasm")).expect("rename");
}

async fn version(t: &TestHost) -> MessageDecision {
    t.host.message_policy(&message("a", "room:x", "version?")).await
}

fn rewrite(v: &str) -> MessageDecision {
    MessageDecision::Rewrite(v.as_bytes().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swapping_versions_twenty_times_under_load_loses_no_call() {
    // This test is about the swap, not the deadline: on a busy CI box a call compiled
    // beside a reload can take longer than the default 50 ms wall time, and its failure
    // policy would answer Allow. A deadline no healthy call reaches leaves only a gap in
    // the swap to fail it.
    let mut config = no_quarantine();
    config.default_limits.deadline_ms = 10_000;
    let t = TestHost::new(config);
    swap_in(t.path(), "echo-v1");
    t.load().await;
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (host, stop, calls) = (t.host.clone(), stop.clone(), calls.clone());
        workers.push(tokio::spawn(async move {
            let mut seen = std::collections::BTreeSet::new();
            while !stop.load(Ordering::Relaxed) {
                let d = host.message_policy(&message("a", "room:x", "version?")).await;
                match &d {
                    MessageDecision::Rewrite(v) if v == b"echo-v1" || v == b"echo-v2" => {
                        seen.insert(v.clone());
                    }
                    other => return Err(format!("unexpected decision {other:?}")),
                }
                calls.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
            Ok(seen)
        }));
    }
    for i in 0..20 {
        let next = if i % 2 == 0 { "echo-v2" } else { "echo-v1" };
        swap_in(t.path(), next);
        t.host.reload_file(t.path().join("echo.wasm")).await.expect("reloading a good version");
        assert_eq!(version(&t).await, rewrite(next), "swap {i} serves {next}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut seen = std::collections::BTreeSet::new();
    for w in workers {
        match w.await.expect("worker") {
            Ok(versions) => seen.extend(versions),
            Err(why) => panic!("{why}; plugin status: {:?}", t.status("echo")),
        }
    }
    assert!(calls.load(Ordering::Relaxed) > 20, "load ran: {} calls", calls.load(Ordering::Relaxed));
    assert_eq!(seen.len(), 2, "both versions answered");
    let s = t.status("echo");
    assert_eq!((s.failures, s.state), (0, PluginState::Active));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_that_fails_to_load_leaves_the_old_one_serving() {
    let t = TestHost::new(no_quarantine());
    swap_in(t.path(), "echo-v1");
    t.load().await;
    let hash = t.status("echo").content_hash;
    std::fs::write(t.path().join("echo.wasm"), b"\0asm garbage").expect("write");
    let err = t.host.reload_file(t.path().join("echo.wasm")).await;
    assert!(err.is_err_and(|e| e.to_string().contains("not a valid WebAssembly component")));
    assert_eq!(version(&t).await, rewrite("echo-v1"));
    let s = t.status("echo");
    assert_eq!((s.state, s.content_hash.clone()), (PluginState::Active, hash));
    assert!(s.last_load_error.is_some());
    swap_in(t.path(), "echo-v2");
    t.host.reload_file(t.path().join("echo.wasm")).await.expect("reload v2");
    assert_eq!(version(&t).await, rewrite("echo-v2"));
    assert_eq!(t.status("echo").last_load_error, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_reloads_changed_files_and_unloads_deleted_ones() {
    let t = TestHost::new(no_quarantine());
    swap_in(t.path(), "echo-v1");
    t.load().await;
    let _watcher = t.host.watch().expect("watching");
    swap_in(t.path(), "echo-v2");
    let watching = poll().every(Duration::from_millis(50));
    watching
        .until("the watcher to swap in v2", async || {
            let served = version(&t).await;
            if served == rewrite("echo-v2") { Ok(()) } else { Err(format!("{served:?}")) }
        })
        .await;
    // A manifest change reloads too.
    std::fs::write(t.path().join("echo.toml"), "version = \"2.0.0\"").expect("write");
    watching
        .until("the manifest's version to serve", async || {
            let status = t.status("echo");
            if status.version.as_deref() == Some("2.0.0") { Ok(()) } else { Err(format!("{status:?}")) }
        })
        .await;
    std::fs::remove_file(t.path().join("echo.wasm")).expect("remove");
    watching.until("deleting the file to unload the plugin", async || t.host.plugin_status("echo").is_none()).await;
    assert_eq!(version(&t).await, MessageDecision::Allow, "the built-in default answers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_picks_up_new_files_and_keeps_unchanged_ones() {
    let t = TestHost::new(no_quarantine());
    swap_in(t.path(), "echo-v1");
    t.load().await;
    assert_eq!(version(&t).await, rewrite("echo-v1"));
    install(t.path(), "gate", "gate", None);
    let status = t.host.reload().await.expect("reload");
    assert_eq!(status.len(), 2);
    assert_eq!(t.status("echo").calls, 1, "an unchanged plugin keeps its instance and stats");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_change_reuses_the_compiled_code_and_the_new_version_starts_warm() {
    let t = TestHost::new(no_quarantine());
    swap_in(t.path(), "echo-v1");
    t.load().await;
    assert_eq!(t.host.compilations(), 1);
    // Calls on both worker threads at once leave (usually) more than one idle instance.
    let calls: Vec<_> = (0..2)
        .map(|_| {
            let host = t.host.clone();
            tokio::spawn(async move {
                for _ in 0..500 {
                    assert_eq!(host.message_policy(&message("a", "room:x", "hi")).await, MessageDecision::Allow);
                }
            })
        })
        .collect();
    for call in calls {
        call.await.expect("calls");
    }
    let idle_before = t.host.idle_instances("echo");
    assert!(idle_before >= 1);

    // Only the manifest changes: a new version serves (its order shows), compiled code reused.
    std::fs::write(t.path().join("echo.toml"), "version = \"1.1.0\"\norder = 7\n").expect("manifest");
    t.host.reload().await.expect("reload");
    let status = t.status("echo");
    assert_eq!((status.version.as_deref(), status.order), (Some("1.1.0"), Some(7)));
    assert_eq!(t.host.compilations(), 1, "a manifest change compiles nothing");
    assert_eq!(t.host.idle_instances("echo"), idle_before, "the new version starts with as many instances ready");
    assert_eq!(version(&t).await, rewrite("echo-v1"));

    // New component bytes are compiled.
    swap_in(t.path(), "echo-v2");
    t.host.reload().await.expect("reload");
    assert_eq!(t.host.compilations(), 2);
    assert_eq!(version(&t).await, rewrite("echo-v2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_rewritten_in_place_with_its_old_size_and_time_is_read_again() {
    // A manifest change skips reading the unchanged component (its file's identity and
    // times are the same); new bytes must never pass for old ones, even when a copy keeps
    // the size and the modification time.
    let t = TestHost::new(no_quarantine());
    swap_in(t.path(), "echo-v1");
    t.load().await;
    std::fs::write(t.path().join("echo.toml"), "version = \"1.1.0\"\n").expect("manifest");
    t.host.reload().await.expect("reload");
    assert_eq!(t.status("echo").version.as_deref(), Some("1.1.0"));
    let before = t.status("echo").content_hash;

    let file = t.path().join("echo.wasm");
    let modified = std::fs::metadata(&file).and_then(|m| m.modified()).expect("mtime");
    let bytes = std::fs::read(&file).expect("read");
    let at = bytes.windows(7).position(|w| w == b"echo-v1").expect("the answer's bytes are in the component");
    let mut changed = bytes.clone();
    changed[at + 6] = b'9';
    std::fs::write(&file, &changed).expect("rewrite in place");
    std::fs::File::options().write(true).open(&file).and_then(|f| f.set_modified(modified)).expect("set mtime");
    assert_eq!(std::fs::metadata(&file).expect("stat").len(), bytes.len() as u64);

    t.host.reload().await.expect("reload");
    assert_ne!(t.status("echo").content_hash, before);
    assert_eq!(version(&t).await, rewrite("echo-v9"));
}

/// A registry switch holds the calls of the switching plugin's hooks only: while it holds,
/// a call of another hook is answered, one of the plugin's hook waits, and that one is
/// answered by the new version once the hold ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_holds_the_calls_of_the_plugins_hooks_and_no_others() {
    use herald_plugin_runtime::Hook;
    use herald_plugin_runtime::types::{ConnectDecision, ConnectRequest};
    let t = TestHost::new(no_quarantine());
    let wasm = |krate: &str| std::fs::read(built().guests.join(format!("{krate}.wasm"))).expect("a built guest");
    let v1 = t.host.prepare("echo", false, wasm("echo_v1"), "").await.expect("v1 prepares");
    t.host.install("echo", Some(&v1), None).await;
    assert_eq!(version(&t).await, rewrite("echo-v1"));
    let v2 = t.host.prepare("echo", false, wasm("echo_v2"), "").await.expect("v2 prepares");
    assert_eq!(t.host.hooks_of("echo"), [Hook::MessagePolicy]);
    assert_eq!(v2.hooks(), [Hook::MessagePolicy]);

    let hold = t.host.hold(t.host.hooks_of("echo").into_iter().chain(v2.hooks().iter().copied())).await;
    assert_eq!(hold.hooks().collect::<Vec<_>>(), [Hook::MessagePolicy]);
    let held = tokio::spawn({
        let host = t.host.clone();
        async move { host.message_policy(&message("a", "room:x", "version?")).await }
    });
    let connect = ConnectRequest { user: "bob".into(), device: "d".into(), claims: vec![] };
    let answered = tokio::time::timeout(Duration::from_secs(10), t.host.connect(&connect)).await;
    assert_eq!(answered.expect("a call of another hook is not held"), ConnectDecision::Allow(None));
    assert!(!held.is_finished(), "a call of the plugin's hook waits for the switch");

    t.host.install("echo", Some(&v2), None).await;
    drop(hold);
    assert_eq!(held.await.expect("no panic"), rewrite("echo-v2"), "the held call is answered by the new version");
}

/// A new version compiles only the functions that changed: the others' machine code comes
/// from the compile cache, and the version behaves as compiled whole. Without the cache
/// (`compile_cache_mib = 0`) nothing is looked up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_version_compiles_only_the_functions_that_changed() {
    let wasm = |krate: &str| std::fs::read(built().guests.join(format!("{krate}.wasm"))).expect("a built guest");
    let t = TestHost::new(no_quarantine());
    let v1 = t.host.prepare("echo", false, wasm("echo_v1"), "").await.expect("v1 prepares");
    let (hits_v1, compiled_v1) = t.host.compile_cache();
    assert!(compiled_v1 > 0, "the first version compiles its functions");
    t.host.install("echo", Some(&v1), None).await;
    assert_eq!(version(&t).await, rewrite("echo-v1"));

    let v2 = t.host.prepare("echo", false, wasm("echo_v2"), "").await.expect("v2 prepares");
    let (hits, compiled) = t.host.compile_cache();
    let (hits_v2, compiled_v2) = (hits - hits_v1, compiled - compiled_v1);
    assert!(
        hits_v2 > compiled_v2,
        "most of v2's functions come from the cache: {hits_v2} taken, {compiled_v2} compiled"
    );
    t.host.install("echo", Some(&v2), None).await;
    assert_eq!(version(&t).await, rewrite("echo-v2"), "the version built from cached code answers as itself");

    let config = PluginHostConfig { compile_cache_mib: 0, ..no_quarantine() };
    let uncached = TestHost::new(config);
    uncached.host.prepare("echo", false, wasm("echo_v1"), "").await.expect("v1 prepares without a cache");
    assert_eq!(uncached.host.compile_cache(), (0, 0));
}
