//! Embeds the WIT contract into the `__herald_generate_hook!` macro.
//!
//! A plugin crate expands `wit_bindgen::generate!` itself (one world per hook it exports, so
//! the component exports exactly those hooks). `generate!` resolves `path` against the
//! *plugin's* manifest directory, so the SDK hands it the contract inline instead: this
//! script writes a `macro_rules!` whose body carries `wit/herald-plugin.wit` verbatim.
//!
//! `wit/herald-plugin.wit` is the SDK's own copy of the contract (`proto/wit/`), so the
//! crate builds on its own, outside this repository; a test keeps the two identical. The
//! contract version comes from its `package` line.

use std::{env, fs, path::PathBuf};

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let wit_path = manifest.join("wit/herald-plugin.wit");
    println!("cargo:rerun-if-changed={}", wit_path.display());
    let wit = fs::read_to_string(&wit_path)
        .unwrap_or_else(|e| panic!("reading the plugin contract {}: {e}", wit_path.display()));
    assert!(!wit.contains("\"####"), "the WIT text must not contain `\"####`");
    let version = wit
        .lines()
        .find_map(|line| line.trim().strip_prefix("package herald:plugin@")?.strip_suffix(';'))
        .unwrap_or_else(|| panic!("{}: no `package herald:plugin@<version>;` line", wit_path.display()));
    println!("cargo:rustc-env=HERALD_CONTRACT_VERSION={version}");
    let macro_src = format!(
        r#####"/// Expands `wit_bindgen::generate!` for one hook world of the embedded contract.
#[doc(hidden)]
#[macro_export]
macro_rules! __herald_generate_hook {{
    ($world:tt) => {{
        $crate::__private::wit_bindgen::generate!({{
            inline: r####"{wit}"####,
            world: $world,
            runtime_path: "::herald_sdk::__private::wit_bindgen::rt",
            with: {{
                "herald:plugin/host@{version}": ::herald_sdk::__private::bindings::herald::plugin::host,
                "herald:plugin/types@{version}": ::herald_sdk::__private::bindings::herald::plugin::types,
            }},
        }});
    }};
}}
"#####
    );
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("generate_hook.rs");
    fs::write(&out, macro_src).unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
}
