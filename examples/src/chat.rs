//! The terminal chat client's logic: what a typed line means ([`command`]), the state
//! machine that turns lines and frames into output and frames ([`session`]), and the
//! reconnect [`backoff`]. The binary `herald-chat` only moves bytes.

pub mod backoff;
pub mod command;
pub mod session;

pub use backoff::Backoff;
pub use command::{Command, parse_command};
pub use session::{ChatState, Effects};
