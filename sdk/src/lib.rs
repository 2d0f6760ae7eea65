//! `herald-sdk`: the crate Herald plugin authors build against.
//!
//! A Herald plugin is a WebAssembly component that implements one or more *hooks* — the
//! points where Herald asks for a policy decision (see `proto/wit/herald-plugin.wit`, the
//! contract, and ARCHITECTURE.md §4). With this crate a plugin is plain Rust:
//!
//! ```ignore
//! use herald_sdk::{types::*, MessagePolicy};
//!
//! struct NoShouting;
//!
//! impl MessagePolicy for NoShouting {
//!     fn check_message(message: Message) -> MessageDecision {
//!         let lower = String::from_utf8_lossy(&message.body).to_lowercase();
//!         MessageDecision::Rewrite(lower.into_bytes())
//!     }
//! }
//!
//! herald_sdk::export_plugin!(NoShouting, hooks: [message_policy]);
//! ```
//!
//! * [`types`] — the contract's data types, re-exported with docs.
//! * [`MessagePolicy`], [`AnnouncePolicy`], [`RouteKey`], [`Degrade`], [`Connect`] — one
//!   trait per hook; implement only the ones you need and list them in [`export_plugin!`].
//! * [`kv`], [`limiter`], [`clock`], [`log`], [`counter`], [`config`] — the plugin's only
//!   capabilities, served by the host.
//! * [`pattern`] — the glob matching first-party plugins use for room rules.
//! * [`testkit`] (native targets) — a fake host, so `cargo test` runs the plugin's logic
//!   without Wasm.
//!
//! Build with `cargo build --target wasm32-wasip2 --release`; the `.wasm` file is the
//! component Herald loads. See `sdk/README.md` for the walk-through.
// `unsafe_code` is denied for the whole crate (see Cargo.toml) and allowed only on the
// generated `__private::bindings` module, whose FFI glue needs it.

mod capabilities;
mod hooks;
pub mod pattern;
#[cfg(not(target_arch = "wasm32"))]
pub mod testkit;

pub use capabilities::{clock, config, counter, kv, limiter, log};
pub use hooks::{AnnouncePolicy, Connect, Degrade, DeliverFilter, MessagePolicy, RouteKey};

/// The version of the `herald:plugin` WIT package this SDK targets (the `package` line of
/// `wit/herald-plugin.wit`). A Herald host serves every contract version up to its own, so
/// a plugin built with this SDK loads on any host whose contract is this version or newer.
pub const CONTRACT_VERSION: &str = env!("HERALD_CONTRACT_VERSION");

/// The contract's data types (WIT interface `herald:plugin/types`).
///
/// Generated from the WIT by `wit-bindgen`; every type implements `Clone`, `Debug` and
/// `PartialEq`.
pub mod types {
    pub use crate::__private::bindings::herald::plugin::types::{
        Acceptance, AnnounceDecision, Announcement, CommandKind, ConnectDecision, ConnectRequest, Delivery, Health,
        LimitDecision, LogLevel, Message, MessageDecision, Rejection, RouteRequest, Tier,
    };
}

/// Implementation details used by the macros. Not part of the public API.
#[doc(hidden)]
pub mod __private {
    pub use wit_bindgen;

    /// Bindings for the host imports and the shared types, generated from the contract.
    // The generated glue needs `unsafe` (FFI with the host); nothing else in the SDK does.
    #[allow(unsafe_code, missing_docs, clippy::all)]
    pub mod bindings {
        wit_bindgen::generate!({
            path: "wit",
            world: "guest-imports",
            generate_unused_types: true,
            // Serde: the test kit reads recordings (`testkit::Recording`).
            additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
        });
    }

    /// Called by every exported hook before the plugin's code: routes panic messages to the
    /// host's log so a failing plugin says why in Herald's status.
    pub fn enter() {
        #[cfg(target_arch = "wasm32")]
        {
            static HOOK: std::sync::Once = std::sync::Once::new();
            HOOK.call_once(|| {
                // Straight to the host's `log` import (what `log::error` calls), so this
                // module, which the capabilities are built on, does not depend on them.
                std::panic::set_hook(Box::new(|info| {
                    bindings::herald::plugin::host::log(
                        bindings::herald::plugin::types::LogLevel::Error,
                        &format!("plugin panicked: {info}"),
                        &[],
                    );
                }));
            });
        }
    }
}

include!(concat!(env!("OUT_DIR"), "/generate_hook.rs"));

/// Exports a plugin type's hooks so Herald can call them.
///
/// List the hooks the type implements (each needs its trait: `message_policy` →
/// [`MessagePolicy`], `announce_policy` → [`AnnouncePolicy`], `route_key` → [`RouteKey`],
/// `degrade` → [`Degrade`], `connect` → [`Connect`], `deliver_filter` → [`DeliverFilter`]). The component then exports exactly
/// those interfaces, and Herald discovers them when it loads the file.
///
/// Invoke it once, at the crate root of a `cdylib` crate that depends on `herald-sdk`
/// under that name. On native targets (for `cargo test`) it only checks that the traits
/// are implemented; the Wasm glue is generated for `wasm32` alone.
///
/// ```ignore
/// herald_sdk::export_plugin!(MyPlugin, hooks: [message_policy, announce_policy]);
/// ```
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ident, hooks: [$($hook:ident),+ $(,)?] $(,)?) => {
        $( $crate::__herald_export_hook!($hook, $plugin); )+
    };
}

/// One hook of [`export_plugin!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __herald_export_hook {
    (message_policy, $plugin:ident) => {
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        mod __herald_message_policy {
            $crate::__herald_generate_hook!("message-policy-plugin");
        }
        #[cfg(target_arch = "wasm32")]
        impl __herald_message_policy::exports::herald::plugin::message_policy::Guest for $plugin {
            fn check(message: $crate::types::Message) -> $crate::types::MessageDecision {
                $crate::__private::enter();
                <$plugin as $crate::MessagePolicy>::check_message(message)
            }
        }
        #[cfg(target_arch = "wasm32")]
        __herald_message_policy::export!($plugin with_types_in __herald_message_policy);
        const _: fn() = || {
            fn implements<T: $crate::MessagePolicy>() {}
            implements::<$plugin>();
        };
    };
    (announce_policy, $plugin:ident) => {
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        mod __herald_announce_policy {
            $crate::__herald_generate_hook!("announce-policy-plugin");
        }
        #[cfg(target_arch = "wasm32")]
        impl __herald_announce_policy::exports::herald::plugin::announce_policy::Guest for $plugin {
            fn check(announcement: $crate::types::Announcement) -> $crate::types::AnnounceDecision {
                $crate::__private::enter();
                <$plugin as $crate::AnnouncePolicy>::check_announcement(announcement)
            }
        }
        #[cfg(target_arch = "wasm32")]
        __herald_announce_policy::export!($plugin with_types_in __herald_announce_policy);
        const _: fn() = || {
            fn implements<T: $crate::AnnouncePolicy>() {}
            implements::<$plugin>();
        };
    };
    (route_key, $plugin:ident) => {
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        mod __herald_route_key {
            $crate::__herald_generate_hook!("route-key-plugin");
        }
        #[cfg(target_arch = "wasm32")]
        impl __herald_route_key::exports::herald::plugin::route_key::Guest for $plugin {
            fn route_key(request: $crate::types::RouteRequest) -> Option<String> {
                $crate::__private::enter();
                <$plugin as $crate::RouteKey>::route_key(request)
            }
        }
        #[cfg(target_arch = "wasm32")]
        __herald_route_key::export!($plugin with_types_in __herald_route_key);
        const _: fn() = || {
            fn implements<T: $crate::RouteKey>() {}
            implements::<$plugin>();
        };
    };
    (degrade, $plugin:ident) => {
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        mod __herald_degrade {
            $crate::__herald_generate_hook!("degrade-plugin");
        }
        #[cfg(target_arch = "wasm32")]
        impl __herald_degrade::exports::herald::plugin::degrade::Guest for $plugin {
            fn choose_tier(health: $crate::types::Health) -> $crate::types::Tier {
                $crate::__private::enter();
                <$plugin as $crate::Degrade>::choose_tier(health)
            }
        }
        #[cfg(target_arch = "wasm32")]
        __herald_degrade::export!($plugin with_types_in __herald_degrade);
        const _: fn() = || {
            fn implements<T: $crate::Degrade>() {}
            implements::<$plugin>();
        };
    };
    (deliver_filter, $plugin:ident) => {
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        mod __herald_deliver_filter {
            $crate::__herald_generate_hook!("deliver-filter-plugin");
        }
        #[cfg(target_arch = "wasm32")]
        impl __herald_deliver_filter::exports::herald::plugin::deliver_filter::Guest for $plugin {
            fn filter(delivery: $crate::types::Delivery) -> Vec<String> {
                $crate::__private::enter();
                <$plugin as $crate::DeliverFilter>::filter_recipients(delivery)
            }
        }
        #[cfg(target_arch = "wasm32")]
        __herald_deliver_filter::export!($plugin with_types_in __herald_deliver_filter);
        const _: fn() = || {
            fn implements<T: $crate::DeliverFilter>() {}
            implements::<$plugin>();
        };
    };
    (connect, $plugin:ident) => {
        #[cfg(target_arch = "wasm32")]
        #[doc(hidden)]
        mod __herald_connect {
            $crate::__herald_generate_hook!("connect-plugin");
        }
        #[cfg(target_arch = "wasm32")]
        impl __herald_connect::exports::herald::plugin::connect::Guest for $plugin {
            fn authorize(request: $crate::types::ConnectRequest) -> $crate::types::ConnectDecision {
                $crate::__private::enter();
                <$plugin as $crate::Connect>::authorize(request)
            }
        }
        #[cfg(target_arch = "wasm32")]
        __herald_connect::export!($plugin with_types_in __herald_connect);
        const _: fn() = || {
            fn implements<T: $crate::Connect>() {}
            implements::<$plugin>();
        };
    };
    ($other:ident, $plugin:ident) => {
        compile_error!(concat!(
            "unknown hook `", stringify!($other),
            "`: expected message_policy, announce_policy, route_key, degrade, connect or deliver_filter"
        ));
    };
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    /// The SDK builds from its own copy of the contract (so it builds outside this
    /// repository); the copy must be the contract.
    #[test]
    fn the_sdk_carries_the_contract_verbatim() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let read = |path: &str| std::fs::read_to_string(dir.join(path)).map_err(|e| format!("{path}: {e}"));
        assert_eq!(
            read("wit/herald-plugin.wit"),
            read("../proto/wit/herald-plugin.wit"),
            "sdk/wit/herald-plugin.wit differs from proto/wit/herald-plugin.wit: copy the contract over"
        );
    }
}
