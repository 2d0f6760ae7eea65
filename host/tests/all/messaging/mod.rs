//! End-to-end messaging, written from PROTOCOL.md alone: every test starts a real
//! `herald serve --dev` process on a loopback port of the system's choosing (it says which
//! in its `--listen-file`) with a temporary data dir, and talks to it the way a third-party
//! client would — WebSocket frames over `/v1/ws`, JSON over HTTP, and a headless Chromium
//! for the admin page.
//!
//! Helpers: [`server`] (spawn, kill -9, restart, HTTP), [`client`] (a WebSocket client that
//! keeps frames it was not waiting for), [`raw`] (a hand-rolled WebSocket for what a polite
//! client cannot do: stay silent, never answer pings), [`token`] (HS256 JWTs), [`cdp`]
//! (Chromium over the DevTools protocol).
//!
//! Rules the tests keep: no sleep is an assertion (wait for the thing with
//! `support::poll`, with a generous deadline); the only fixed windows are for "this must *not* happen", and they are a
//! multiple of the interval involved; assertions name what PROTOCOL.md promises (ids, order,
//! bodies, close codes) and print the server's log tail when the server misbehaves.

mod cdp;
mod client;
mod nodes;
mod raw;
mod server;
mod token;
mod world;

mod admin_page;
mod auth_table;
mod authz_table;
mod behaviour;
mod chat;
mod cluster_faults;
mod cluster_nodes;
mod deliver_filter;
mod delivery;
mod disk_full;
mod durability;
mod gateway;
mod groups;
mod health_metrics;
mod heartbeat;
mod hostile;
mod http;
mod intake;
mod limits;
mod placement;
mod placement_restart;
mod plugin_registry;
mod plugins;
mod reconnect;
mod recording;
mod room_limits;
mod rooms;
mod shadow;
mod slow_consumer;
mod store_breaker;
mod sync;
mod tls;
mod validation;
mod web;

use std::time::Duration;

/// How long to wait for something that should happen promptly. Generous on purpose: CI's
/// two cores run several servers at once.
pub const WAIT: Duration = Duration::from_secs(15);

/// A fresh random UUID (version 4), as clients use for `client_msg_id`.
pub fn uuid() -> String {
    let bytes: [u8; 16] = rand::random();
    let mut b = bytes;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

/// The direct conversation of two users: `dm:<a>:<b>` with `a < b` byte-wise.
pub fn dm(a: &str, b: &str) -> String {
    if a < b { format!("dm:{a}:{b}") } else { format!("dm:{b}:{a}") }
}

/// The value of a metric line `name value` in Prometheus text, 0 when absent.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines().find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse().ok())).unwrap_or(0.0)
}
