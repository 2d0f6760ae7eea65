//! `herald-sdk`: the crate Herald plugin authors build against.
//!
//! The plugin contract (WIT package `herald:plugin`, in `proto/wit/`), the hook traits, the
//! export macro and the native test kit arrive with the plugin platform. For now this crate
//! pins the contract version plugins will be checked against.
#![forbid(unsafe_code)]

/// The version of the `herald:plugin` WIT package this SDK targets.
pub const CONTRACT_VERSION: &str = "0.1.0";
