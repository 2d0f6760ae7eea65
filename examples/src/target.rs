//! The loopback guard: load tools here only ever send traffic to this machine unless the
//! operator says otherwise with `--allow-remote`.
//!
//! The check looks at the URL's host as written and never resolves names: `localhost` (and
//! `*.localhost`) and literal loopback addresses (`127.0.0.0/8`, `[::1]`) pass; any other
//! name or address is refused, because a name could resolve anywhere.

use std::net::IpAddr;

use tokio_tungstenite::tungstenite::http::Uri;

/// Why a URL is not an acceptable target.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TargetError {
    /// The URL does not parse or has no host.
    #[error("`{0}` is not a WebSocket URL: use e.g. ws://127.0.0.1:7070/v1/ws")]
    Invalid(String),
    /// The scheme is not `ws` or `wss`.
    #[error("`{0}` must start with ws:// or wss://")]
    Scheme(String),
    /// The host is not a loopback address.
    #[error(
        "`{0}` is not a loopback address; load tools only target this machine \
         (127.0.0.0/8, [::1], localhost) unless given --allow-remote"
    )]
    NotLoopback(String),
}

/// Checks that `url` is a `ws://` or `wss://` URL; unless `allow_remote`, also that its host
/// is loopback.
///
/// # Errors
///
/// [`TargetError`] saying which rule the URL breaks.
pub fn check_target(url: &str, allow_remote: bool) -> Result<(), TargetError> {
    let uri: Uri = url.parse().map_err(|_| TargetError::Invalid(url.to_owned()))?;
    match uri.scheme_str() {
        Some("ws" | "wss") => {}
        _ => return Err(TargetError::Scheme(url.to_owned())),
    }
    let host = uri.host().ok_or_else(|| TargetError::Invalid(url.to_owned()))?;
    if allow_remote || is_loopback_host(host) { Ok(()) } else { Err(TargetError::NotLoopback(url.to_owned())) }
}

/// Whether a host as written in a URL (`127.0.0.1`, `[::1]`, `localhost`) is loopback,
/// without resolving it.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(address) = host.parse::<IpAddr>() {
        return address.is_loopback();
    }
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    host == "localhost" || host.ends_with(".localhost")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_targets_pass() {
        for url in [
            "ws://127.0.0.1:7070/v1/ws",
            "ws://127.8.9.10/v1/ws",
            "ws://[::1]:7070/v1/ws",
            "ws://localhost:7070/v1/ws",
            "wss://LocalHost/v1/ws",
            "ws://app.localhost:1/v1/ws",
        ] {
            assert_eq!(check_target(url, false), Ok(()), "{url}");
        }
    }

    #[test]
    fn remote_targets_need_the_flag() {
        for url in [
            "ws://10.0.0.1:7070/v1/ws",
            "ws://192.168.1.2/v1/ws",
            "ws://example.com/v1/ws",
            "ws://localhost.example.com/v1/ws",
            "ws://[::2]/v1/ws",
        ] {
            assert!(matches!(check_target(url, false), Err(TargetError::NotLoopback(_))), "{url}");
            assert_eq!(check_target(url, true), Ok(()), "{url}");
        }
    }

    #[test]
    fn non_websocket_urls_are_refused() {
        assert!(matches!(check_target("http://127.0.0.1/", true), Err(TargetError::Scheme(_))));
        assert!(matches!(check_target("not a url", true), Err(TargetError::Invalid(_) | TargetError::Scheme(_))));
    }
}
