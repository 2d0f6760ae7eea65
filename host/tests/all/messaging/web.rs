//! The web chat page served at `/` in dev mode. The page itself (examples/web, on the
//! TypeScript client) is built by the scripts and tested in headless Chromium by
//! examples/web/run-tests.sh; here only that Herald serves what its build embedded: the
//! page, or, in a build without it (no `WEB_CHAT_PAGE`, see host/build.rs), a page that
//! says how to build it.

use super::server::Herald;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_mode_serves_the_web_chat_page_at_the_root() {
    let herald = Herald::start().await;
    let index = herald.get("/", None).await;
    assert_eq!(index.status, 200, "GET / serves the web chat in dev mode: {index:?}");
    assert!(
        index.header("content-type").is_some_and(|t| t.contains("text/html")),
        "GET / is HTML: {:?}",
        index.headers
    );
    let built = index.body.contains("id=\"connect\"");
    let hint = index.body.contains("web-page-missing") && index.body.contains("scripts/build-web.sh");
    assert!(
        built || hint,
        "GET / is the chat page or says how to build it: {}",
        &index.body[..index.body.len().min(400)]
    );
}
