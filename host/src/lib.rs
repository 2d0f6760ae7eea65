//! The Herald server: a WebSocket gateway, the message pipeline, delivery, storage and the
//! Wasm plugin runtime, in one binary that runs embedded (SQLite + memory) or as a cluster.
//!
//! See ARCHITECTURE.md for how the modules fit together; each folder is one part of it.
#![forbid(unsafe_code)]

pub mod api;
pub mod breaker;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod delivery;
pub mod gateway;
pub mod health;
pub mod ids;
pub mod maps;
pub mod membership;
pub mod model;
pub mod node;
pub mod pipeline;
pub mod plugins;
pub mod routing;
pub mod server;
pub mod store;
pub mod telemetry;
#[cfg(test)]
mod testkit;
pub mod tls;
