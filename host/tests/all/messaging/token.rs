//! HS256 JSON Web Tokens (RFC 7519), made by hand so tests can forge every kind of bad one.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit as _, Mac as _};
use serde_json::{Value, json};
use sha2::{Sha256, Sha512};

use super::client::now_ms;

/// Seconds since the Unix epoch.
pub fn now_s() -> i64 {
    i64::try_from(now_ms() / 1000).expect("time fits i64")
}

/// A JWT with `header` and `claims`, signed HS256 with `secret`.
pub fn sign_with_header(secret: &[u8], header: &Value, claims: &Value) -> String {
    sign_text(secret, &header.to_string(), &claims.to_string())
}

/// A JWT from header and claims as exact JSON text, signed HS256 with `secret`.
fn sign_text(secret: &[u8], header: &str, claims: &str) -> String {
    let signing_input = format!("{}.{}", URL_SAFE_NO_PAD.encode(header), URL_SAFE_NO_PAD.encode(claims));
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(signing_input.as_bytes());
    let signature = mac.finalize().into_bytes();
    format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(signature))
}

/// A JWT with `header` and `claims`, signed HS512 with `secret` (a valid token of an
/// algorithm the server is not configured for).
pub fn sign_hs512_with_header(secret: &[u8], header: &Value, claims: &Value) -> String {
    let signing_input =
        format!("{}.{}", URL_SAFE_NO_PAD.encode(header.to_string()), URL_SAFE_NO_PAD.encode(claims.to_string()));
    let mut mac = Hmac::<Sha512>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(signing_input.as_bytes());
    format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes()))
}

/// An HS256 JWT with `claims`.
pub fn sign(secret: &[u8], claims: &Value) -> String {
    sign_with_header(secret, &json!({ "alg": "HS256", "typ": "JWT" }), claims)
}

/// A valid token for `user`, expiring in an hour.
pub fn valid(secret: &[u8], user: &str) -> String {
    sign(secret, &json!({ "sub": user, "iat": now_s(), "exp": now_s() + 3600 }))
}

/// An unsigned token (`alg: none`), which must never be accepted.
pub fn unsigned(user: &str) -> String {
    format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(json!({ "alg": "none", "typ": "JWT" }).to_string()),
        URL_SAFE_NO_PAD.encode(json!({ "sub": user, "exp": now_s() + 3600 }).to_string())
    )
}

#[test]
fn hs256_signature_matches_a_known_answer() {
    // jwt.io's HS256 example token.
    let token = sign_text(
        b"your-256-bit-secret",
        r#"{"alg":"HS256","typ":"JWT"}"#,
        r#"{"sub":"1234567890","name":"John Doe","iat":1516239022}"#,
    );
    assert_eq!(
        token,
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.\
         eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.\
         SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
    );
}
