//! Picks the web chat page that dev mode serves at `/` (api/mod.rs embeds the file this
//! names in `WEB_CHAT_PAGE_FILE`).
//!
//! The page is built from examples/web by the scripts (`build_web_page` in scripts/lib.sh:
//! npm ci, then esbuild into `target/web/index.html`), never committed; they export
//! `WEB_CHAT_PAGE` with its path before building Herald. Without that variable (a plain
//! `cargo build`) Herald embeds a short page that says how to build the real one, so Rust
//! builds never need Node. The variable's name has no `HERALD_` prefix on purpose: Herald
//! refuses unknown `HERALD_*` variables at start-up, and the scripts' shells keep it set.

use std::path::PathBuf;

const MISSING: &str = "<!doctype html>
<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Herald: no web page in this build</title></head>
<body style=\"font-family: system-ui, sans-serif; max-width: 42rem; margin: 3rem auto\">
<h1>This Herald was built without its web chat page</h1>
<p id=\"web-page-missing\">The page is built from <code>examples/web</code> with Node (npm ci, esbuild).
<code>scripts/run.sh</code> and <code>scripts/test.sh</code> build it and this binary with it. By hand:
<code>scripts/build-web.sh</code>, then build Herald with
<code>WEB_CHAT_PAGE=$PWD/target/web/index.html</code> set.</p>
</body></html>
";

fn main() {
    println!("cargo::rerun-if-env-changed=WEB_CHAT_PAGE");
    let page = match std::env::var_os("WEB_CHAT_PAGE").filter(|path| !path.is_empty()) {
        Some(path) => {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "WEB_CHAT_PAGE names {}, which is not a file: build the page with scripts/build-web.sh, \
                 or unset WEB_CHAT_PAGE to build Herald without it",
                path.display()
            );
            println!("cargo::rerun-if-changed={}", path.display());
            path
        }
        None => {
            let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR for build scripts"));
            let path = out.join("web-page-missing.html");
            std::fs::write(&path, MISSING).expect("the build script can write into OUT_DIR");
            path
        }
    };
    println!("cargo::rustc-env=WEB_CHAT_PAGE_FILE={}", page.display());
}
