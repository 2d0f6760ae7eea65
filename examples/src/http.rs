//! A minimal HTTP/1.0 client for the tools' calls to a Herald server's HTTP API on this
//! machine: one request per TCP connection, an optional bearer key and JSON body, the whole
//! answer read until the server closes.
//!
//! Why not a real client library: the tools call a handful of JSON endpoints and `/metrics`
//! on loopback. HTTP/1.0 keeps the answer simple to read (no chunked encoding, no
//! keep-alive), and the crate needs no TLS or connection pool.

use std::time::Duration;

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
};
use tokio_tungstenite::tungstenite::http::Uri;

/// What can go wrong with one request.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// TCP connect, write or read failed.
    #[error("HTTP request to {authority} failed: {source}")]
    Io {
        /// The `host:port` dialled.
        authority: String,
        /// What the socket reported.
        #[source]
        source: std::io::Error,
    },
    /// The answer is not an HTTP response.
    #[error("the answer from {0} is not an HTTP response")]
    Malformed(String),
    /// No complete answer in time.
    #[error("no answer from {0} within {1:?}")]
    Timeout(String, Duration),
}

/// An HTTP answer: its status code and its body as text (lossily decoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body.
    pub body: String,
}

impl Response {
    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// The `host:port` of a `ws://` or `http://` URL (port 80 when the URL names none), for
/// the HTTP API of the server behind a WebSocket URL.
pub fn authority_of(url: &str) -> Option<String> {
    let uri: Uri = url.parse().ok()?;
    let host = uri.host()?;
    Some(format!("{host}:{}", uri.port_u16().unwrap_or(80)))
}

/// Sends one request to `authority` (`host:port`) and reads the whole answer, within
/// `timeout`. `bearer` goes in `Authorization: Bearer …`; `json`, when given, is the body,
/// sent as `application/json`.
///
/// # Errors
///
/// [`HttpError`]: the socket failed, the answer is not HTTP, or it took too long. A non-2xx
/// status is not an error: it is in the [`Response`].
pub async fn request(
    authority: &str,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    json: Option<&str>,
    timeout: Duration,
) -> Result<Response, HttpError> {
    let io = |source| HttpError::Io { authority: authority.to_owned(), source };
    let exchange = async {
        let mut stream = TcpStream::connect(authority).await.map_err(io)?;
        let mut head = format!("{method} {path} HTTP/1.0\r\nHost: {authority}\r\n");
        if let Some(key) = bearer {
            head.push_str(&format!("Authorization: Bearer {key}\r\n"));
        }
        let body = json.unwrap_or_default();
        if json.is_some() {
            head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        head.push_str(body);
        stream.write_all(head.as_bytes()).await.map_err(io)?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.map_err(io)?;
        parse_response(&answer).ok_or_else(|| HttpError::Malformed(authority.to_owned()))
    };
    tokio::time::timeout(timeout, exchange).await.map_err(|_| HttpError::Timeout(authority.to_owned(), timeout))?
}

/// Splits a raw HTTP response into its status and body.
fn parse_response(raw: &[u8]) -> Option<Response> {
    let end_of_head = raw.windows(4).position(|window| window == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end_of_head]).ok()?;
    let status_line = head.lines().next()?;
    let mut parts = status_line.split_whitespace();
    if !parts.next()?.starts_with("HTTP/") {
        return None;
    }
    let status = parts.next()?.parse().ok()?;
    let body = String::from_utf8_lossy(&raw[end_of_head + 4..]).into_owned();
    Some(Response { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_come_from_websocket_urls() {
        assert_eq!(authority_of("ws://127.0.0.1:7095/v1/ws").as_deref(), Some("127.0.0.1:7095"));
        assert_eq!(authority_of("ws://localhost/v1/ws").as_deref(), Some("localhost:80"));
        assert_eq!(authority_of("ws://[::1]:7070/v1/ws").as_deref(), Some("[::1]:7070"));
        assert_eq!(authority_of("not a url"), None);
    }

    #[test]
    fn responses_split_into_status_and_body() {
        let raw = b"HTTP/1.0 201 Created\r\ncontent-type: application/json\r\n\r\n{\"id\":\"team\"}";
        assert_eq!(parse_response(raw), Some(Response { status: 201, body: "{\"id\":\"team\"}".to_owned() }));
        assert_eq!(parse_response(b"HTTP/1.1 204 No Content\r\n\r\n").map(|r| r.status), Some(204));
        assert_eq!(parse_response(b"garbage"), None);
        assert_eq!(parse_response(b"SSH-2.0 x\r\n\r\n"), None);
    }
}
