//! The terminal chat client's logic, on the `herald-client` library: what a typed line
//! means ([`command`]), and what the chat does with lines and the client's events
//! ([`session`]). The library keeps the protocol's promises (sends stored once across
//! reconnects, messages once and in order, rooms caught up, acks after printing); the
//! binary `herald-chat` only moves lines.

pub mod command;
pub mod session;

pub use command::{Command, parse_command};
pub use session::{ChatSession, describe_event};
