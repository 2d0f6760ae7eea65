//! Errors of the Herald client. Each says what happened and what the caller may do next.

/// Why a `send` did not resolve with a stored message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The server refused it (`send_ack` `REJECTED`): validation or policy. Resending it as
    /// is will not pass, except after `retry_after_ms` when a policy gave one.
    #[error("send to {conversation} rejected: {reason}")]
    Rejected {
        /// The server's words (`<code>: <reason>` from a policy plugin).
        reason: String,
        /// The send's id.
        client_msg_id: String,
        /// Where it was going.
        conversation: String,
        /// When a policy says the same send may pass later.
        retry_after_ms: Option<u32>,
    },
    /// The outcome is unknown: the client was closed, or the send's timeout passed, before
    /// a final `send_ack`. Sending again with the same `client_msg_id` settles it safely.
    #[error("send to {conversation} abandoned ({why}); resend with client_msg_id {client_msg_id} to settle it")]
    Abandoned {
        /// What ended the wait.
        why: String,
        /// The send's id.
        client_msg_id: String,
        /// Where it was going.
        conversation: String,
    },
    /// A send with this `client_msg_id` is already under way in this client.
    #[error("a send with client_msg_id {0} is already under way")]
    InProgress(String),
}

/// Errors of requests and of the connection, also reported as [`Event::Error`](crate::Event::Error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// An `error` frame (`code`: `invalid`, `forbidden`, `unavailable`, …).
    #[error("server error {code}: {message}")]
    Server {
        /// The error code.
        code: String,
        /// The server's words.
        message: String,
        /// The request it answers (0: none).
        rid: u32,
    },
    /// The client is closed for good: `close()`, or a close it does not retry (4003, 4009,
    /// 4001 with no way to get a new token).
    #[error("connection closed ({code} {reason})")]
    Closed {
        /// The close code.
        code: u16,
        /// The close reason.
        reason: String,
    },
    /// The token provider failed; the client tries again after a backoff.
    #[error("token provider failed: {0}")]
    Token(String),
    /// A frame the client could not decode or did not expect, or a socket that would not open.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A room was left while its join was waiting.
    #[error("unsubscribed from {0}")]
    Unsubscribed(String),
}
