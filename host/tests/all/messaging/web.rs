//! The web chat page served at `/` in dev mode: two headless-Chromium pages log in as two
//! users and exchange messages through a real server, by typing and clicking as a person
//! would (element ids from the page's documented hooks).

use std::time::Duration;

use serde_json::Value;

use super::cdp::{Browser, Page, js_string};
use super::server::Herald;

const PAGE_WAIT: Duration = Duration::from_secs(20);

/// Opens the page and logs in as `user`.
async fn log_in(browser: &mut Browser, herald: &Herald, user: &str) -> Page {
    let page = browser.open(&format!("http://127.0.0.1:{}/", herald.port), user).await;
    browser
        .wait_until(
            &page,
            "document.readyState === 'complete' && !!document.getElementById('connect')",
            "the chat page to load (with #connect)",
            PAGE_WAIT,
        )
        .await;
    browser.type_into(&page, "user", user).await;
    browser.click(&page, "connect").await;
    browser
        .wait_until(
            &page,
            "(() => { const s = document.getElementById('status'); return !!s && s.dataset.state === 'connected'; })()",
            &format!("{user} to be connected (#status[data-state=connected])"),
            PAGE_WAIT,
        )
        .await;
    page
}

/// Sends `text` to `peer` from `page`.
async fn say(browser: &mut Browser, page: &Page, peer: &str, text: &str) {
    browser.type_into(page, "peer", peer).await;
    browser.type_into(page, "text", text).await;
    browser.click(page, "send").await;
}

/// Waits for a `.message` in `#messages` whose text contains `text`; returns its data-*
/// attributes.
async fn shown(browser: &mut Browser, page: &Page, text: &str, what: &str) -> Value {
    let script = format!(
        "(() => {{ for (const m of document.querySelectorAll('#messages .message')) {{ \
           const t = m.querySelector('.text'); \
           if ((t ? t.textContent : m.textContent).includes({text})) return Object.assign({{}}, m.dataset); }} \
         return null; }})()",
        text = js_string(text)
    );
    browser.wait_until(page, &script, what, PAGE_WAIT).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_browser_pages_exchange_messages() {
    let herald = Herald::start().await;
    let index = herald.get("/", None).await;
    assert_eq!(index.status, 200, "GET / serves the web chat in dev mode: {index:?}");
    assert!(
        index.header("content-type").is_some_and(|t| t.contains("text/html")),
        "GET / is HTML: {:?}",
        index.headers
    );

    let mut browser = Browser::launch().await;
    let alice = log_in(&mut browser, &herald, "alice").await;
    let bob = log_in(&mut browser, &herald, "bob").await;

    let hello = "hello bob, from alice's browser";
    say(&mut browser, &alice, "bob", hello).await;
    let received = shown(&mut browser, &bob, hello, "bob's page to show alice's message").await;
    let sent = browser
        .wait_until(
            &alice,
            "(() => { const m = [...document.querySelectorAll('#messages .message')].find(m => m.dataset.direction === 'out'); \
             return m && m.dataset.status === 'ok' ? Object.assign({}, m.dataset) : null; })()",
            "alice's message to be acknowledged (data-status=ok)",
            PAGE_WAIT,
        )
        .await;
    assert_eq!(received["sender"], "alice", "{received}");
    assert_eq!(received["conversation"], "dm:alice:bob", "{received}");
    assert_eq!(received["id"], sent["id"], "both pages show the same message id: {sent} vs {received}");
    assert_eq!(received["seq"], sent["seq"], "and the same seq: {sent} vs {received}");

    let reply = "hi alice — bob here ✓";
    say(&mut browser, &bob, "alice", reply).await;
    let back = shown(&mut browser, &alice, reply, "alice's page to show bob's reply").await;
    assert_eq!(back["sender"], "bob", "{back}");
}
