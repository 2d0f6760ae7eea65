//! The admin page at `/admin`, in headless Chromium against a real server with a plugin
//! loaded: without the right key it shows no data; with it, the plugin with its version and
//! calls, the tier and why, the store's breaker, and charts that move while messages flow;
//! the reload button reloads the plugins. A plugin with a shadow shows how the shadow's
//! decisions differ, and its Promote button makes the shadow serve, watched as a canary.
//! The plugin registry's section shows each version's state on each node and the audit
//! trail.
//! Screenshots are kept as test artifacts (`target/test-artifacts/admin-page*.png`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;

use super::cdp::{Browser, Page, js_string};
use super::client::Client;
use super::hostile::guest;
use super::plugin_registry::{ECHO_V1, ECHO_V2, cli, push};
use super::plugins::install;
use super::server::{DEV_KEY, Herald};

const PAGE_WAIT: Duration = Duration::from_secs(20);

/// Where the screenshot goes: `target/test-artifacts/` of the workspace (or of
/// `CARGO_TARGET_DIR`).
fn artifact(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"), PathBuf::from);
    target.join("test-artifacts").join(name)
}

/// A browser on `herald`'s admin page, once its login form is there.
async fn open_admin_page(herald: &Herald) -> (Browser, Page) {
    let mut browser = Browser::launch().await;
    let page = browser.open(&format!("http://127.0.0.1:{}/admin", herald.port), "admin").await;
    browser
        .wait_until(
            &page,
            "document.readyState === 'complete' && !!document.getElementById('key')",
            "the login form",
            PAGE_WAIT,
        )
        .await;
    (browser, page)
}

/// Logs in with `key` through the page's form.
async fn log_in(browser: &mut Browser, page: &Page, key: &str) {
    browser.type_into(page, "key", key).await;
    browser.click(page, "login").await;
}

/// Whether the page shows no data: the dashboard hidden and no plugin rows.
async fn shows_nothing(browser: &mut Browser, page: &Page) -> bool {
    let shown = browser
        .run(page, "[document.getElementById('dashboard').hidden, document.querySelectorAll('#plugins tr').length]")
        .await;
    shown == serde_json::json!([true, 0])
}

/// The numbers a chart (`svg#id`) shows: how many points, the latest, the largest, and its
/// line's coordinates.
async fn chart(browser: &mut Browser, page: &Page, id: &str) -> (u64, f64, f64, String) {
    let script = format!(
        "(() => {{ const svg = document.getElementById({0}); const line = svg.querySelector('polyline'); \
         return [Number(svg.dataset.points || 0), Number(svg.dataset.last || 0), Number(svg.dataset.max || 0), \
         line ? line.getAttribute('points') : '']; }})()",
        js_string(id)
    );
    let value = browser.run(page, &script).await;
    (
        value[0].as_u64().unwrap_or(0),
        value[1].as_f64().unwrap_or(0.0),
        value[2].as_f64().unwrap_or(0.0),
        value[3].as_str().unwrap_or_default().to_owned(),
    )
}

/// `pairs` senders each sending to a partner who acks every delivery, until `stop`; each
/// task returns how many it sent.
async fn traffic(herald: &Herald, pairs: usize, stop: &Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<u64>> {
    let mut tasks = Vec::new();
    for pair in 0..pairs {
        let (from, to) = (format!("sender{pair}"), format!("reader{pair}"));
        let conversation = super::dm(&from, &to);
        let mut sender = Client::connect(herald, &from, "phone").await;
        let mut reader = Client::connect(herald, &to, "phone").await;
        let stop = Arc::clone(stop);
        tasks.push(tokio::spawn(async move {
            let mut sent = 0;
            while !stop.load(Ordering::Relaxed) {
                sender.send_ok(&conversation, format!("message {sent}")).await;
                let deliver = reader.deliver_in(&conversation).await;
                let seq = deliver.message.expect("a deliver carries its message").seq;
                reader.deliver_ack(&conversation, seq).await;
                reader.forget_unclaimed();
                sent += 1;
            }
            sent
        }));
    }
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_page_shows_plugins_tier_breakers_and_live_charts_only_with_the_admin_key() {
    let plugins = install(&["room-rate-limit"]);
    let herald = Herald::with().set("PLUGINS", plugins.path().display()).start().await;

    // No key, no data: the page is static, and every endpoint it calls wants the key.
    let page_html = herald.get("/admin", None).await;
    assert_eq!(page_html.status, 200);
    assert!(page_html.body.contains("Herald admin") && !page_html.body.contains("room-rate-limit"));
    assert!(page_html.header("content-security-policy").is_some_and(|csp| csp.contains("default-src 'none'")));
    for endpoint in ["/admin/series", "/admin/health", "/admin/plugins", "/admin/cluster"] {
        assert_eq!(herald.get(endpoint, None).await.status, 401, "{endpoint} without a key");
        assert_eq!(herald.get(endpoint, Some("dev-kez")).await.status, 401, "{endpoint} with a wrong key");
    }

    let (mut browser, page) = open_admin_page(&herald).await;

    // A wrong key: refused, and nothing shown.
    log_in(&mut browser, &page, "dev-kez").await;
    let refused = browser
        .wait_until(
            &page,
            "document.getElementById('login-error').textContent",
            "the refusal of a wrong key",
            PAGE_WAIT,
        )
        .await;
    assert!(refused.as_str().is_some_and(|text| text.contains("refused")), "{refused}");
    assert!(shows_nothing(&mut browser, &page).await, "no data without the right key");

    // The right key: the plugin, the tier and why, the store's breaker, this node.
    log_in(&mut browser, &page, DEV_KEY).await;
    let version = browser
        .wait_until(
            &page,
            "(() => { const row = document.querySelector('#plugins tr[data-plugin=\"room-rate-limit\"]'); \
             return row ? row.dataset.version : ''; })()",
            "the room-rate-limit plugin's row",
            PAGE_WAIT,
        )
        .await;
    assert_eq!(version, "0.1.0", "the version of plugins/room-rate-limit/plugin.toml");
    let row =
        browser.run(&page, "document.querySelector('#plugins tr[data-plugin=\"room-rate-limit\"]').innerText").await;
    let row = row.as_str().unwrap_or_default();
    assert!(row.contains("message-policy") && row.contains("active"), "hooks and state shown: {row}");
    let tier = browser
        .wait_until(&page, "document.getElementById('tier-reason').textContent.includes('degrade hook') && document.getElementById('tier').dataset.tier", "the tier and its reason", PAGE_WAIT)
        .await;
    assert_eq!(tier, "normal");
    let store =
        browser.run(&page, "document.querySelector('#breakers tr[data-breaker=\"store\"]').dataset.state").await;
    assert_eq!(store, "closed");
    let node = browser.run(&page, "document.getElementById('node-summary').textContent").await;
    assert!(node.as_str().is_some_and(|text| text.contains("embedded mode")), "{node}");

    // Load: the charts move. Messages per second and the send→deliver p99 rise from
    // nothing, the connections chart counts the clients, and the lines change.
    let (_, _, quiet_max, quiet_line) = chart(&mut browser, &page, "chart-messages").await;
    assert_eq!(quiet_max, 0.0, "no messages before the load");
    let stop = Arc::new(AtomicBool::new(false));
    let senders = traffic(&herald, 4, &stop).await;
    browser
        .wait_until(
            &page,
            "Number(document.getElementById('chart-messages').dataset.last) > 0 && \
             Number(document.getElementById('chart-deliver-p99').dataset.max) > 0 && \
             Number(document.getElementById('chart-connections').dataset.last) >= 8",
            "the charts to show the load (messages/s, deliver p99, 8 connections)",
            PAGE_WAIT,
        )
        .await;
    let (points, last, _, busy_line) = chart(&mut browser, &page, "chart-messages").await;
    assert!(points >= 2 && last > 0.0, "{points} points, last {last}");
    assert_ne!(busy_line, quiet_line, "the messages chart's line moved");
    // One more sample later, the line has moved again.
    browser
        .wait_until(
            &page,
            &format!(
                "document.querySelector('#chart-messages polyline').getAttribute('points') !== {}",
                js_string(&busy_line)
            ),
            "the messages chart to move on",
            PAGE_WAIT,
        )
        .await;
    stop.store(true, Ordering::Relaxed);
    let mut sent = 0;
    for sender in senders {
        sent += sender.await.expect("a sender");
    }
    assert!(sent > 0);

    // The reload button reloads the folder and says so.
    browser.click(&page, "reload").await;
    let reloaded = browser
        .wait_until(
            &page,
            "(() => { const t = document.getElementById('reload-result').textContent; return t.startsWith('reloaded') ? t : ''; })()",
            "the reload result",
            PAGE_WAIT,
        )
        .await;
    assert!(reloaded.as_str().is_some_and(|text| text.contains("reloaded 1 plugin")), "{reloaded}");
    let calls = browser
        .run(&page, "Number(document.querySelector('#plugins tr[data-plugin=\"room-rate-limit\"] td:nth-child(5)').textContent)")
        .await;
    assert!(calls.as_f64().is_some(), "calls shown after the reload: {calls}");

    let path = artifact("admin-page.png");
    browser.screenshot(&page, 1280, 1000, &path).await;
    let png = std::fs::read(&path).expect("the screenshot");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a real screenshot at {}", path.display());

    // Log out: the data is gone from the page.
    browser.click(&page, "logout").await;
    assert!(shows_nothing(&mut browser, &page).await, "no data after logging out");
}

/// The kind of difference the word-filter shadow finds beside echo on a blocked word.
const BLOCKED: &str = "message-policy: allow → reject blocked-word";

/// A JavaScript expression for the row of plugin `name` (`tr[data-plugin]`).
fn plugin_row(name: &str) -> String {
    format!("document.querySelector('#plugins tr[data-plugin=' + JSON.stringify({}) + ']')", js_string(name))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_page_shows_a_shadows_differences_and_its_buttons_promote_or_discard_it() {
    // echo 1.0.0 allows everything; its shadow, word-filter as 2.0.0, rejects "spam".
    let dir = tempfile::tempdir().expect("plugins dir");
    std::fs::copy(guest("echo_v1"), dir.path().join("echo.wasm")).expect("copy echo-v1");
    std::fs::write(dir.path().join("echo.toml"), "version = \"1.0.0\"\n").expect("echo manifest");
    std::fs::copy(guest("word_filter"), dir.path().join("echo.shadow.wasm")).expect("copy word-filter");
    std::fs::write(dir.path().join("echo.shadow.toml"), "version = \"2.0.0\"\n[config]\nblocked_words = [\"spam\"]\n")
        .expect("shadow manifest");
    let herald = Herald::with().set("PLUGINS", dir.path().display()).start().await;
    let recording = herald.post("/admin/plugins/echo/recording", Some(DEV_KEY), &json!({})).await;
    assert_eq!(recording.status, 200, "{}", recording.body);

    // The active version lets it through; the shadow would have rejected it.
    let mut alice = Client::connect(&herald, "alice", "laptop").await;
    alice.send_ok("dm:alice:bob", "buy spam now").await;

    let (mut browser, page) = open_admin_page(&herald).await;
    log_in(&mut browser, &page, DEV_KEY).await;

    // The shadow's sub-row: the difference by kind, counted, its example's input shown.
    let difference = format!(
        "document.querySelector('tr.shadow-row[data-shadow-of=\"echo\"] li[data-kind=' + JSON.stringify({}) + ']')",
        js_string(BLOCKED)
    );
    let count = browser
        .wait_until(
            &page,
            &format!("(() => {{ const item = {difference}; return item ? Number(item.dataset.count) : 0; }})()"),
            "the shadow's sub-row to count a blocked-word difference",
            PAGE_WAIT,
        )
        .await;
    assert!(count.as_f64().is_some_and(|count| count >= 1.0), "{count}");
    let item = browser.run(&page, &format!("{difference}.textContent")).await;
    let item = item.as_str().unwrap_or_default();
    assert!(item.contains(&format!("{BLOCKED} ×")), "the kind and its count: {item}");
    assert!(item.contains("buy spam now"), "the first example's body as text: {item}");
    let shadow = browser.run(&page, "document.querySelector('tr.shadow-row[data-shadow-of=\"echo\"]').innerText").await;
    let shadow = shadow.as_str().unwrap_or_default();
    assert!(shadow.contains("2.0.0") && shadow.contains("differed 1"), "the shadow's version and tally: {shadow}");

    // The plugin's own row: its version, its contract and its recording.
    let row = plugin_row("echo");
    let active = browser
        .run(
            &page,
            &format!(
                "(() => {{ const row = {row}; return [row.dataset.version, row.dataset.hash, row.innerText]; }})()"
            ),
        )
        .await;
    assert_eq!(active[0], "1.0.0", "{active}");
    let old_hash = active[1].as_str().unwrap_or_default().to_owned();
    let text = active[2].as_str().unwrap_or_default();
    assert!(text.contains("contract 0."), "the contract version: {text}");
    let recorded = browser
        .wait_until(
            &page,
            "(() => { const line = document.getElementById('recording-echo'); \
             return line && line.dataset.recording === 'active' && Number(line.dataset.records) >= 1 ? line.innerText : ''; })()",
            "the recording line to count the send",
            PAGE_WAIT,
        )
        .await;
    assert!(recorded.as_str().is_some_and(|text| text.contains(".jsonl")), "the recording's file: {recorded}");

    // Unfolded, the example stays open across the page's redraws.
    browser.run(&page, &format!("{difference}.querySelector('summary').click(), true")).await;
    let drawn = browser.run(&page, "document.getElementById('updated').textContent").await;
    browser
        .wait_until(
            &page,
            &format!(
                "document.getElementById('updated').textContent !== {} && {difference}.querySelector('details').open",
                js_string(drawn.as_str().unwrap_or_default())
            ),
            "a redraw with the example still unfolded",
            PAGE_WAIT,
        )
        .await;
    let path = artifact("admin-page-shadow.png");
    browser.screenshot(&page, 1280, 1000, &path).await;
    let png = std::fs::read(&path).expect("the screenshot");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a real screenshot at {}", path.display());

    // Promote: the row shows the shadow's version serving, watched as a canary, and the
    // shadow's sub-row is gone.
    browser.click(&page, "promote-echo").await;
    let canary = browser
        .wait_until(
            &page,
            &format!(
                "(() => {{ const row = {row}; const badge = document.getElementById('canary-echo'); \
                 return row && row.dataset.version === '2.0.0' && row.dataset.hash !== {} && badge \
                 && !document.querySelector('tr.shadow-row') ? badge.dataset.canary : ''; }})()",
                js_string(&old_hash)
            ),
            "the promoted version in echo's row with its canary badge",
            PAGE_WAIT,
        )
        .await;
    assert!(canary == "watching" || canary == "passed", "the canary's state: {canary}");
    let result = browser.run(&page, "document.getElementById('shadow-result-echo').textContent").await;
    assert!(result.as_str().is_some_and(|text| text.starts_with("promoted 2.0.0")), "{result}");

    // The button did promote: the former shadow decides now.
    let reason = alice.send_rejected("dm:alice:bob", "more spam").await;
    assert!(reason.contains("blocked-word"), "{reason}");

    // Discard: a new shadow (echo-v1 again, as 3.0.0) shows up, and the button removes it —
    // its sub-row from the page, its files from the folder — while 2.0.0 keeps serving.
    std::fs::copy(guest("echo_v1"), dir.path().join("echo.shadow.wasm")).expect("copy echo-v1");
    std::fs::write(dir.path().join("echo.shadow.toml"), "version = \"3.0.0\"\n").expect("shadow manifest");
    browser
        .wait_until(
            &page,
            "(() => { const sub = document.querySelector('tr.shadow-row[data-shadow-of=\"echo\"]'); \
             return !!sub && sub.dataset.version === '3.0.0'; })()",
            "the new shadow's sub-row",
            PAGE_WAIT,
        )
        .await;
    browser.click(&page, "discard-echo").await;
    let discarded = browser
        .wait_until(
            &page,
            "(() => { const t = document.getElementById('shadow-result-echo'); \
             return !document.querySelector('tr.shadow-row') && t ? t.textContent : ''; })()",
            "the shadow's sub-row gone and the button's result",
            PAGE_WAIT,
        )
        .await;
    assert!(discarded.as_str().is_some_and(|text| text.starts_with("discarded the shadow")), "{discarded}");
    assert!(!dir.path().join("echo.shadow.wasm").exists(), "the shadow's component is removed");
    let version = browser.run(&page, &format!("{row}.dataset.version")).await;
    assert_eq!(version, "2.0.0", "the promoted version still serves");
}

/// The registry's section: each version of a plugin with its state on this node (active,
/// shadow), and the audit trail, newest first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_page_shows_the_registrys_versions_on_each_node_and_its_history() {
    let herald = Herald::with().set("PLUGIN_REGISTRY__POLL_MS", 200).start().await;
    push(&herald, "echo_v1", ECHO_V1);
    cli(&herald, &["deploy", "echo", "1.0.0"]).expect("deploy 1.0.0");
    push(&herald, "echo_v2", ECHO_V2);
    cli(&herald, &["deploy", "echo", "2.0.0", "--shadow"]).expect("deploy 2.0.0 as shadow");
    let node = herald.get("/admin/cluster", Some(DEV_KEY)).await.json()["this_node"].to_string();

    let (mut browser, page) = open_admin_page(&herald).await;
    log_in(&mut browser, &page, DEV_KEY).await;
    // Versions and node ids are plain (digits and dots): safe inside the selector's quotes.
    let cell = |version: &str| {
        format!(
            "document.querySelector('.registry-plugin[data-plugin=\"echo\"] tr[data-version=\"{version}\"] \
             td[data-node=\"{node}\"]')"
        )
    };
    let states = browser
        .wait_until(
            &page,
            &format!(
                "(() => {{ const a = {}, b = {}; return a && b && a.dataset.state === 'active' \
                 && b.dataset.state === 'shadow' ? [a.dataset.state, b.dataset.state] : null; }})()",
                cell("1.0.0"),
                cell("2.0.0")
            ),
            "both versions with their state on this node",
            PAGE_WAIT,
        )
        .await;
    assert_eq!(states, json!(["active", "shadow"]));
    let actions = browser
        .run(
            &page,
            "[...document.querySelectorAll('.registry-plugin[data-plugin=\"echo\"] table.history tr[data-action]')]\
             .map((row) => row.dataset.action)",
        )
        .await;
    assert_eq!(actions, json!(["deploy-shadow", "upload", "deploy", "upload"]), "newest first");
    browser.screenshot(&page, 1280, 1400, &artifact("admin-page-registry.png")).await;
}
