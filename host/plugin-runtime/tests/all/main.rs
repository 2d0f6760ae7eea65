//! Integration tests of the plugin runtime, in one binary (one link). Guest plugins are
//! real components: `support` builds the first-party plugins and the test guests
//! (`tests/guests/`) for wasm32-wasip2 once per run.

mod chains;
mod contract;
mod first_party;
mod hostile;
mod languages;
mod recording;
mod reload;
mod shadow;
mod support;
