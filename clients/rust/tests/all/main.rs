//! Every integration test of herald-client in one binary (one link): the conformance
//! scenarios of clients/SPEC.md against real Herald processes (`HERALD_BIN`).

mod conformance;
mod harness;
mod lifecycle;
mod resilience;
