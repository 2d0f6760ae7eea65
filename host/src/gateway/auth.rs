//! Who a client is: HS256 JWTs (`sub` = user id, `exp`/`nbf` checked, `iss`/`aud` when
//! configured) or, in dev mode only, the literal token `dev:<user>`. No other algorithm is
//! accepted (`alg: none`, HS512 and RS256 are refused alike), and a token longer than
//! `gateway.max_token_bytes` is refused before it is decoded.

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::model::{InvalidId, UserId};

/// The HS256 secret of dev mode when none is configured: dev mode listens on loopback only,
/// and a fixed secret keeps tokens valid across restarts while trying things out.
const DEV_SECRET: &str = "herald-dev-mode-secret";

/// Why a token was refused (close 4001 / HTTP 401).
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("token is not valid: {0}")]
    Invalid(String),
    #[error("dev:<user> tokens are accepted in dev mode only")]
    DevTokenOutsideDev,
    #[error("token names an invalid user: {0}")]
    BadUser(#[from] InvalidId),
    #[error("token is longer than {0} bytes")]
    TooLong(usize),
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nbf: Option<u64>,
    // Issued tokens carry them; on a token read they are checked by the validation (`aud`
    // may be a list there), not read into this struct.
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    iss: Option<String>,
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    aud: Option<String>,
}

/// Checks tokens and, in dev mode, issues them.
pub struct Authenticator {
    dev: bool,
    decoding: DecodingKey,
    encoding: EncodingKey,
    validation: Validation,
    max_token_bytes: usize,
}

impl Authenticator {
    /// An authenticator for `secret` (dev mode falls back to a fixed secret).
    ///
    /// # Errors
    /// [`AuthError::Invalid`] when the secret cannot be used as an HMAC key.
    pub fn new(secret: Option<&str>, dev: bool) -> Result<Self, AuthError> {
        let secret = secret.filter(|s| !s.is_empty()).unwrap_or(DEV_SECRET);
        let mut validation = Validation::new(Algorithm::HS256);
        validation.validate_nbf = true;
        validation.leeway = 5;
        validation.required_spec_claims = ["exp", "sub"].iter().map(|s| (*s).to_owned()).collect();
        let key_error = |error: jsonwebtoken::errors::Error| AuthError::Invalid(error.to_string());
        Ok(Self {
            dev,
            decoding: DecodingKey::from_secret(secret.as_bytes()).map_err(key_error)?,
            encoding: EncodingKey::from_secret(secret.as_bytes()).map_err(key_error)?,
            validation,
            max_token_bytes: usize::MAX,
        })
    }

    /// Also requires `iss` to be `issuer` and `aud` to name `audience`, when they are
    /// set, and refuses tokens longer than `max_token_bytes` unread. Without an audience a
    /// token carrying `aud` is refused (RFC 7519 §4.1.3: it is meant for someone else).
    #[must_use]
    pub fn expecting(mut self, issuer: Option<&str>, audience: Option<&str>, max_token_bytes: usize) -> Self {
        if let Some(issuer) = issuer {
            self.validation.set_issuer(&[issuer]);
            self.validation.required_spec_claims.insert("iss".to_owned());
        }
        if let Some(audience) = audience {
            self.validation.set_audience(&[audience]);
            self.validation.required_spec_claims.insert("aud".to_owned());
        }
        self.max_token_bytes = max_token_bytes;
        self
    }

    /// The user a token belongs to.
    ///
    /// # Errors
    /// [`AuthError`] when the token is too long, malformed, badly signed, expired, not yet
    /// valid, from another issuer or for another audience, or a dev token outside dev mode.
    pub fn authenticate(&self, token: &str) -> Result<UserId, AuthError> {
        if token.len() > self.max_token_bytes {
            return Err(AuthError::TooLong(self.max_token_bytes));
        }
        if let Some(user) = token.strip_prefix("dev:") {
            if !self.dev {
                return Err(AuthError::DevTokenOutsideDev);
            }
            return Ok(UserId::parse(user)?);
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|error| AuthError::Invalid(error.to_string()))?;
        Ok(UserId::parse(&data.claims.sub)?)
    }

    /// A token for `user`, valid for `ttl_secs` from `now_secs`.
    ///
    /// # Errors
    /// [`AuthError::Invalid`] if signing fails.
    pub fn issue(&self, user: &UserId, now_secs: u64, ttl_secs: u64) -> Result<String, AuthError> {
        let claims = Claims {
            sub: user.to_string(),
            exp: now_secs + ttl_secs,
            nbf: None,
            iss: self.validation.iss.as_ref().and_then(|set| set.iter().next().cloned()),
            aud: self.validation.aud.as_ref().and_then(|set| set.iter().next().cloned()),
        };
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .map_err(|error| AuthError::Invalid(error.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
    }

    #[test]
    fn issued_tokens_authenticate_and_expired_ones_do_not() {
        let auth = Authenticator::new(Some("s3cret"), false).expect("key");
        let alice = UserId::parse("alice").expect("valid");
        let token = auth.issue(&alice, now(), 60).expect("issue");
        assert_eq!(auth.authenticate(&token).expect("valid"), alice);
        let expired = auth.issue(&alice, now() - 3600, 60).expect("issue");
        assert!(matches!(auth.authenticate(&expired), Err(AuthError::Invalid(_))));
        let other = Authenticator::new(Some("another"), false).expect("key");
        assert!(other.authenticate(&token).is_err(), "a token signed with another secret");
        assert!(auth.authenticate("garbage").is_err());
    }

    #[test]
    fn issuer_audience_and_length_are_checked_when_configured() {
        let alice = UserId::parse("alice").expect("valid");
        let plain = Authenticator::new(Some("s3cret"), false).expect("key");
        let strict = Authenticator::new(Some("s3cret"), false).expect("key").expecting(Some("us"), Some("chat"), 1024);
        let theirs =
            Authenticator::new(Some("s3cret"), false).expect("key").expecting(Some("them"), Some("chat"), 1024);
        let token = strict.issue(&alice, now(), 60).expect("issue");
        assert_eq!(strict.authenticate(&token).expect("iss and aud match"), alice);
        let error = theirs.authenticate(&token).expect_err("another issuer");
        assert!(error.to_string().contains("InvalidIssuer"), "{error}");
        let error = strict.authenticate(&plain.issue(&alice, now(), 60).expect("issue")).expect_err("no iss, no aud");
        assert!(error.to_string().contains("Missing"), "{error}");
        assert!(matches!(plain.authenticate(&token), Err(AuthError::Invalid(_))), "aud for someone else");
        let padded = format!("{token}{}", "A".repeat(1024));
        assert!(matches!(strict.authenticate(&padded), Err(AuthError::TooLong(1024))));
    }

    #[test]
    fn dev_tokens_only_in_dev_mode() {
        assert!(matches!(
            Authenticator::new(Some("x"), false).expect("key").authenticate("dev:bob"),
            Err(AuthError::DevTokenOutsideDev)
        ));
        assert_eq!(Authenticator::new(None, true).expect("key").authenticate("dev:bob").expect("dev").as_str(), "bob");
        assert!(matches!(
            Authenticator::new(None, true).expect("key").authenticate("dev:b b"),
            Err(AuthError::BadUser(_))
        ));
    }
}
