//! Fuzz targets: every kind of input Herald takes from outside, as a function of bytes. A
//! target panics only on a bug — a decoder or parser that panics, a round trip that does
//! not hold, a request answered 500 — and returns normally for any input it refuses.
//!
//! | target | what it reads |
//! |---|---|
//! | [`frame_proto`] | a WebSocket binary message as a protobuf `Frame` |
//! | [`frame_json`] | a WebSocket text message as a JSON `Frame` |
//! | [`token`] | a `connect` token or HTTP bearer token (JWT or `dev:<user>`) |
//! | [`config`] | a config file (TOML) and `HERALD_*` variables |
//! | [`manifest`] | a plugin's manifest (`NAME.toml`) |
//! | [`http_api`] | an HTTP request (method, path, key or token, JSON body) against the real router |
//! | [`plugin_imports`] | a plugin's host calls: KV keys and values of every size, rate-limiter arguments |
//!
//! `tests/corpus.rs` runs each target over `fuzz/corpus/<target>/`, `fuzz/regressions/<target>/`
//! and a few thousand mutations of them on every test run; `scripts/fuzz.sh` fuzzes them with
//! libFuzzer (`fuzz_targets/`). See `fuzz/README.md`.

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use herald_host::config::{Config, Overrides};
use herald_host::gateway::auth::Authenticator;
use herald_plugin_runtime::{Clock, Limits, Manifest, ManualClock, MemoryKv, MemoryLimiter, PluginKv, RateLimiter};
use herald_proto::{DecodeLimits, Encoding, decode_frame, encode_json, encode_proto};

/// The secret, issuer and audience the [`token`] target's authenticator expects.
pub const TOKEN_SECRET: &str = "fuzz-secret-0123456789abcdef";
pub const TOKEN_ISSUER: &str = "https://id.example";
pub const TOKEN_AUDIENCE: &str = "herald";

/// A fuzz target: panics on a bug, returns for any other input.
pub type Target = fn(&[u8]);

/// Every target, by name (the names of `fuzz/corpus/<name>/` and of the libFuzzer binaries).
pub const TARGETS: [(&str, Target); 7] = [
    ("frame_proto", frame_proto),
    ("frame_json", frame_json),
    ("token", token),
    ("config", config),
    ("manifest", manifest),
    ("http_api", http_api),
    ("plugin_imports", plugin_imports),
];

/// Re-decoding is not limited by size: a frame under the limit in one encoding may be over
/// it in the other.
fn unlimited() -> DecodeLimits {
    DecodeLimits { max_frame_bytes: usize::MAX, ..DecodeLimits::default() }
}

/// A decoded frame survives both encodings unchanged (JSON: unless an enum holds a number
/// with no name).
fn round_trips(frame: &herald_proto::v1::Frame) {
    let again = decode_frame(encode_proto(frame), Encoding::Proto, &unlimited())
        .unwrap_or_else(|error| panic!("{frame:?} re-encoded as protobuf does not decode: {error}"));
    assert_eq!(&again, frame, "protobuf round trip");
    let json = match encode_json(frame) {
        Ok(json) => json,
        // Protobuf enums are open: a number with no name decodes, but pbjson writes no
        // JSON for it (codec.rs says so; the writer logs and drops such a frame).
        Err(error) if error.to_string().contains("Invalid variant") => return,
        Err(error) => panic!("{frame:?} does not encode as JSON: {error}"),
    };
    let again = decode_frame(json.clone().into_bytes(), Encoding::Json, &unlimited())
        .unwrap_or_else(|error| panic!("{frame:?} as JSON {json} does not decode: {error}"));
    assert_eq!(&again, frame, "JSON round trip of {json}");
}

/// A binary WebSocket message: decoded as the gateway decodes it; what decodes survives
/// both encodings.
pub fn frame_proto(data: &[u8]) {
    if let Ok(frame) = decode_frame(Bytes::copy_from_slice(data), Encoding::Proto, &DecodeLimits::default()) {
        round_trips(&frame);
    }
}

/// A text WebSocket message: decoded as the gateway decodes it (nesting limit, UTF-8
/// check, canonical JSON mapping); what decodes survives both encodings.
pub fn frame_json(data: &[u8]) {
    if let Ok(frame) = decode_frame(Bytes::copy_from_slice(data), Encoding::Json, &DecodeLimits::default()) {
        round_trips(&frame);
    }
}

static AUTHENTICATORS: LazyLock<[Authenticator; 2]> = LazyLock::new(|| {
    let strict = Authenticator::new(Some(TOKEN_SECRET), false)
        .unwrap_or_else(|error| panic!("the fuzz secret is a key: {error}"))
        .expecting(Some(TOKEN_ISSUER), Some(TOKEN_AUDIENCE), 8 * 1024);
    let dev = Authenticator::new(None, true).unwrap_or_else(|error| panic!("dev mode's secret is a key: {error}"));
    [strict, dev]
});

/// A token, as `connect` and `Authorization: Bearer` hand it over, to a production
/// authenticator (issuer and audience set) and a dev-mode one.
pub fn token(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for authenticator in AUTHENTICATORS.iter() {
        if let Ok(user) = authenticator.authenticate(&text) {
            assert!(!user.as_str().is_empty(), "an accepted token names a user");
        }
    }
}

/// Where the [`config`] target writes the file it loads.
static CONFIG_FILE: LazyLock<(tempfile::TempDir, PathBuf)> = LazyLock::new(|| {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("a temp dir: {error}"));
    let file = dir.path().join("herald.toml");
    (dir, file)
});

/// A config file, and the same text read as `KEY=VALUE` lines of `HERALD_*` variables:
/// either loads into a configuration that validates, or is refused with an error.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (_, file) = &*CONFIG_FILE;
    if std::fs::write(file, text.as_bytes()).is_ok()
        && let Ok(config) = Config::load_from(Some(file), Vec::new(), &Overrides::default())
    {
        assert!(config.validate().is_ok(), "a loaded config validates");
    }
    let env: Vec<(String, String)> = text
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (format!("HERALD_{}", key.trim()), value.to_owned()))
        .collect();
    if let Ok(config) = Config::load_from(None, env, &Overrides::default()) {
        assert!(config.validate().is_ok(), "a loaded config validates");
    }
}

/// A plugin manifest: parsed, its limits applied and its config table rendered, as loading
/// a plugin does.
pub fn manifest(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(manifest) = Manifest::parse(text) else { return };
    let limits = manifest.limits.apply(Limits::default());
    let _ = (limits.deadline(), limits.memory_bytes(), manifest.config.to_string());
}

/// Runs a future of an in-memory back end, which answers on its first poll.
fn now<T>(future: impl Future<Output = T>) -> T {
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(value) => value,
        Poll::Pending => panic!("an in-memory back end did not answer at once"),
    }
}

/// Reads a fuzz input as a sequence of values.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(first)
    }

    fn u64(&mut self) -> u64 {
        let mut value = [0u8; 8];
        for slot in &mut value {
            *slot = self.byte().unwrap_or(0);
        }
        u64::from_le_bytes(value)
    }

    /// A string of up to 255 bytes taken from the input, or, when the length byte's top
    /// bit is set, a long one (up to 64 KiB) made by repeating one character.
    fn string(&mut self) -> String {
        let length = self.byte().unwrap_or(0);
        if length & 0x80 != 0 {
            let repeat = usize::from(self.byte().unwrap_or(0)) << 8 | usize::from(length & 0x7f);
            return "k".repeat(repeat);
        }
        let take = usize::from(length).min(self.0.len());
        let (text, rest) = self.0.split_at(take);
        self.0 = rest;
        String::from_utf8_lossy(text).into_owned()
    }

    /// A value of any size up to 2 MiB (past the KV's value limit).
    fn value(&mut self) -> Vec<u8> {
        let size = usize::try_from(self.u64() % (2 << 20)).unwrap_or(0);
        vec![self.byte().unwrap_or(0); size]
    }

    fn ttl(&mut self) -> Option<Duration> {
        let raw = self.u64();
        (raw & 1 == 1).then(|| Duration::from_millis(raw >> 1))
    }
}

/// A plugin's host calls in sequence: KV reads, writes, increments and deletes with keys
/// and values of every size and any TTL, rate-limiter checks with any rate (NaN, infinite,
/// negative, subnormal) and burst, and the clock moving on. The KV must read back what it
/// just stored.
pub fn plugin_imports(data: &[u8]) {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let kv = MemoryKv::new(Arc::clone(&clock) as Arc<dyn Clock>);
    let limiter = MemoryLimiter::with_max_buckets(Arc::clone(&clock) as Arc<dyn Clock>, 64);
    let mut input = Input(data);
    while let Some(op) = input.byte() {
        let scope = if op & 0x80 == 0 { "room-rate-limit" } else { "announce-archive" };
        let key = input.string();
        match op % 7 {
            0 => _ = now(kv.get(scope, &key)),
            1 => {
                let (value, ttl) = (input.value(), input.ttl());
                if now(kv.set(scope, &key, value.clone(), ttl)).is_ok() && ttl.is_none() {
                    let read = now(kv.get(scope, &key));
                    assert_eq!(read.ok().flatten().as_deref(), Some(value.as_slice()), "read back what was set");
                }
            }
            2 => _ = now(kv.set_if_absent(scope, &key, input.value(), input.ttl())),
            3 => _ = now(kv.increment(scope, &key, i64::from_le_bytes(input.u64().to_le_bytes()), input.ttl())),
            4 => {
                if now(kv.delete(scope, &key)).is_ok() {
                    assert_eq!(now(kv.get(scope, &key)).ok().flatten(), None, "a deleted key is gone");
                }
            }
            5 => {
                let per_second = f64::from_bits(input.u64());
                let burst = u32::try_from(input.u64() & u64::from(u32::MAX)).unwrap_or(u32::MAX);
                _ = now(limiter.check(scope, &key, per_second, burst));
            }
            _ => clock.advance_ms(input.u64() % 100_000_000),
        }
    }
}

/// The HTTP API of one embedded node (dev mode, SQLite in a temp dir), called in process.
struct Api {
    runtime: tokio::runtime::Runtime,
    router: axum::Router,
    _data: tempfile::TempDir,
}

static API: LazyLock<Api> = LazyLock::new(|| {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap_or_else(|error| panic!("a runtime: {error}"));
    let data = tempfile::tempdir().unwrap_or_else(|error| panic!("a temp dir: {error}"));
    let config = Config { dev: true, data_dir: data.path().to_owned(), ..Config::default() };
    // No listener: the fuzzer calls the router directly; embedded mode uses the address only
    // to name itself.
    let listening = config.listen;
    let node = runtime
        .block_on(herald_host::node::Node::open(config, listening))
        .unwrap_or_else(|error| panic!("an embedded node: {error}"));
    let router = herald_host::api::router(node);
    Api { runtime, router, _data: data }
});

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "DELETE", "PATCH"];
const CREDENTIALS: [Option<&str>; 5] = [None, Some("dev-key"), Some("dev:alice"), Some("dev:mallory"), Some("garbage")];

/// An HTTP request: the first byte picks the method, the second the credentials, then the
/// path (up to a newline) and the body. A request the HTTP layer would refuse (a path that
/// is not a URI) is skipped; every other is answered without a panic, never with a 500,
/// and every error in PROTOCOL.md's JSON shape.
pub fn http_api(data: &[u8]) {
    use tower_service::Service as _;
    let mut input = Input(data);
    let method = METHODS[usize::from(input.byte().unwrap_or(0)) % METHODS.len()];
    let credentials = CREDENTIALS[usize::from(input.byte().unwrap_or(0)) % CREDENTIALS.len()];
    let rest = input.0;
    let split = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
    let path = String::from_utf8_lossy(&rest[..split]);
    let body = rest.get(split + 1..).unwrap_or_default().to_vec();
    let path = if path.starts_with('/') { path.into_owned() } else { format!("/{path}") };
    let mut request = axum::http::Request::builder().method(method).uri(&path);
    if let Some(credentials) = credentials {
        request = request.header("authorization", format!("Bearer {credentials}"));
    }
    let Ok(request) = request.header("content-type", "application/json").body(axum::body::Body::from(body)) else {
        return;
    };
    let api = &*API;
    let mut router = api.router.clone();
    let (status, body) = api.runtime.block_on(async move {
        let response = router.call(request).await.unwrap_or_else(|never| match never {});
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 16 << 20).await.unwrap_or_default();
        (status, body)
    });
    let text = String::from_utf8_lossy(&body);
    assert!(status != 500 || text.contains("reload_failed"), "{method} {path}: 500 {text}");
    // PROTOCOL.md leaves two answers to the framework: 405, and `/v1/ws` without the
    // upgrade headers (plain text).
    let framework = status == 405 || path.split('?').next() == Some("/v1/ws");
    if (status.is_client_error() || status.is_server_error()) && !body.is_empty() && !framework {
        let error: serde_json::Value = serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("{method} {path}: {status} with a body that is not JSON ({e}): {text}"));
        assert!(
            error["error"]["code"].is_string() && error["error"]["message"].is_string(),
            "{method} {path}: {status} {text} is not PROTOCOL.md's error shape"
        );
    }
}
