//! Shared code of the Herald examples: a small WebSocket client for the v1 protocol
//! ([`connection`]), the naming rules of PROTOCOL.md ([`ids`]), the loopback guard the load
//! tools obey ([`target`]), a minimal client of the HTTP API ([`http`]) and a reader of its
//! `/metrics` ([`metrics`]), the reconnect benchmarks' set-up ([`storm`]), and the libraries behind the binaries — the baseline
//! [`relay`], the [`loadgen`], the [`soak`] test and the terminal [`chat`] client — kept
//! here so integration tests can run them in-process.
//!
//! Everything is written from `PROTOCOL.md` alone, as a third-party client would be: these
//! examples must keep working against any server that follows it, not only Herald.

#![forbid(unsafe_code)]

pub mod chat;
pub mod connection;
pub mod duration;
pub mod http;
pub mod ids;
pub mod loadgen;
pub mod metrics;
pub mod relay;
pub mod soak;
pub mod storm;
pub mod target;

pub use connection::{Connection, ConnectionError};
