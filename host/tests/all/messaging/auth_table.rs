//! The authentication table of the hardening issue, one test per row: every kind of bad
//! token is refused with 4001 over WebSocket (and 401 over HTTP where the row is about
//! HTTP), and the admin endpoints take only an admin key, byte for byte.
//!
//! Rows kept elsewhere: dev tokens and `dev-key` outside dev mode
//! (`gateway::without_dev_mode_dev_tokens_and_the_dev_key_are_refused`), dev mode on a
//! non-loopback address (`cli::dev_mode_on_a_non_loopback_address_is_refused_at_start`).

use herald_proto::Encoding;
use serde_json::json;

use super::client::Client;
use super::server::Herald;
use super::token::{self, now_s};

const SECRET: &[u8] = b"auth-table-secret-0123456789abcdef";

fn secret() -> String {
    String::from_utf8(SECRET.to_vec()).expect("ASCII secret")
}

async fn server() -> Herald {
    Herald::with().production().set("GATEWAY__JWT_SECRET", secret()).start().await
}

/// Logs in with `token`; expects 4001 and a close reason containing `reason`.
async fn refused(herald: &Herald, token: &str, reason: &str) {
    let mut client = Client::open(herald, Encoding::Proto).await;
    if let Ok(connected) = client.login(token, "phone").await {
        panic!("the server accepted the token as {connected:?}\n{}", herald.log_tail());
    }
    let closed = client.expect_close_code(4001, reason).await;
    assert!(closed.reason.contains(reason), "close reason {:?} should say {reason:?}", closed.reason);
}

/// Logs in with `token` and expects to be connected as `user`.
async fn accepted(herald: &Herald, token: &str, user: &str) {
    let mut client = Client::open(herald, Encoding::Proto).await;
    let connected = client.login(token, "phone").await.unwrap_or_else(|why| panic!("{why}\n{}", herald.log_tail()));
    assert_eq!(connected.user_id, user);
}

fn claims(user: &str) -> serde_json::Value {
    json!({ "sub": user, "iat": now_s(), "exp": now_s() + 3600 })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsigned_token_alg_none_is_refused() {
    refused(&server().await, &token::unsigned("alice"), "token is not valid").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hs512_token_signed_with_the_right_secret_is_refused() {
    let header = json!({ "alg": "HS512", "typ": "JWT" });
    refused(&server().await, &token::sign_hs512_with_header(SECRET, &header, &claims("alice")), "token is not valid")
        .await;
}

/// Algorithm confusion: a token claiming RS256 whose "signature" is an HMAC keyed with the
/// server's secret, which a verifier that trusts the header's `alg` might check the wrong
/// way. Only HS256 is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rs256_token_is_refused_when_hs256_is_configured() {
    let header = json!({ "alg": "RS256", "typ": "JWT" });
    refused(&server().await, &token::sign_with_header(SECRET, &header, &claims("alice")), "token is not valid").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_refused() {
    let expired = json!({ "sub": "alice", "iat": now_s() - 7200, "exp": now_s() - 3600 });
    refused(&server().await, &token::sign(SECRET, &expired), "ExpiredSignature").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_not_yet_valid_is_refused() {
    let not_yet = json!({ "sub": "alice", "nbf": now_s() + 3600, "exp": now_s() + 7200 });
    refused(&server().await, &token::sign(SECRET, &not_yet), "ImmatureSignature").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_without_sub_is_refused() {
    refused(&server().await, &token::sign(SECRET, &json!({ "exp": now_s() + 3600 })), "token is not valid").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_another_issuer_is_refused_when_one_is_configured() {
    let herald = Herald::with()
        .production()
        .set("GATEWAY__JWT_SECRET", secret())
        .set("GATEWAY__JWT_ISSUER", "https://id.example")
        .start()
        .await;
    let mut theirs = claims("alice");
    theirs["iss"] = json!("https://evil.example");
    refused(&herald, &token::sign(SECRET, &theirs), "InvalidIssuer").await;
    refused(&herald, &token::sign(SECRET, &claims("alice")), "Missing").await;
    let mut ours = claims("alice");
    ours["iss"] = json!("https://id.example");
    accepted(&herald, &token::sign(SECRET, &ours), "alice").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_for_another_audience_is_refused_when_one_is_configured() {
    let herald = Herald::with()
        .production()
        .set("GATEWAY__JWT_SECRET", secret())
        .set("GATEWAY__JWT_AUDIENCE", "herald-chat")
        .start()
        .await;
    let mut theirs = claims("alice");
    theirs["aud"] = json!("billing");
    refused(&herald, &token::sign(SECRET, &theirs), "InvalidAudience").await;
    refused(&herald, &token::sign(SECRET, &claims("alice")), "Missing").await;
    let mut ours = claims("alice");
    ours["aud"] = json!(["herald-chat", "analytics"]);
    accepted(&herald, &token::sign(SECRET, &ours), "alice").await;
}

/// A validly signed token padded to 64 KiB is refused unread, over WebSocket and HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_64_kib_is_refused() {
    let herald = server().await;
    let mut padded = claims("alice");
    padded["pad"] = json!("x".repeat(48 * 1024));
    let token = token::sign(SECRET, &padded);
    assert!(token.len() >= 64 * 1024, "{} bytes", token.len());
    refused(&herald, &token, "token is longer than 8192 bytes").await;
    let history = herald.get("/v1/conversations/dm:alice:bob/messages", Some(&token)).await;
    assert_eq!(history.status, 401, "{history:?}");
    assert!(history.body.contains("longer than 8192 bytes"), "{history:?}");
    // The same claims without the padding pass: the length is what was refused.
    accepted(&herald, &token::valid(SECRET, "alice"), "alice").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_take_only_an_admin_key_byte_for_byte() {
    let admin_key = "admin-key-0123456789abcdef";
    // Lists of keys are set in the config file (the environment takes single values).
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("herald.toml");
    let toml = format!("[api]\nkeys = [\"game-server-key-0123456789\"]\nadmin_keys = [\"{admin_key}\"]\n");
    std::fs::write(&file, toml).expect("write the config file");
    let herald =
        Herald::with().production().set("GATEWAY__JWT_SECRET", secret()).set("CONFIG", file.display()).start().await;
    let mut one_byte_off = admin_key.as_bytes().to_vec();
    *one_byte_off.last_mut().expect("not empty") ^= 1;
    let one_byte_off = String::from_utf8(one_byte_off).expect("ASCII");
    let user_token = token::valid(SECRET, "alice");
    for path in ["/admin/health", "/admin/plugins", "/admin/cluster", "/admin/series"] {
        for (key, what) in [
            (None, "no key"),
            (Some("game-server-key-0123456789"), "an api key that is not an admin key"),
            (Some(one_byte_off.as_str()), "an admin key differing in its last byte"),
            (Some(&admin_key[..admin_key.len() - 1]), "a prefix of the admin key"),
            (Some(user_token.as_str()), "a user's token"),
        ] {
            let response = herald.get(path, key).await;
            assert_eq!(response.status, 401, "GET {path} with {what}: {response:?}");
            assert_eq!(response.error_code(), "unauthorized", "GET {path} with {what}");
        }
        let response = herald.get(path, Some(admin_key)).await;
        assert_eq!(response.status, 200, "GET {path} with the admin key: {response:?}");
    }
    let reload = herald.request("POST", "/admin/plugins/reload", Some(&one_byte_off), None).await;
    assert_eq!(reload.status, 401, "{reload:?}");
}
