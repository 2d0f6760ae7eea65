//! The `herald-sdk` crate this binary was built with, carried inside it, so that
//! `herald plugin new` works from an installed binary on any machine: by default it writes
//! this copy into the new plugin's folder (`herald-sdk/`) and depends on it by relative
//! path. The copy's contract is the host's own, and the plugin folder is self-contained:
//! it builds wherever it is cloned, offline.

/// Every file of `sdk/`, by its path inside the crate. A test keeps the list complete.
pub(crate) const FILES: &[(&str, &str)] = &[
    ("Cargo.toml", include_str!("../../../sdk/Cargo.toml")),
    ("README.md", include_str!("../../../sdk/README.md")),
    ("build.rs", include_str!("../../../sdk/build.rs")),
    ("src/capabilities.rs", include_str!("../../../sdk/src/capabilities.rs")),
    ("src/hooks.rs", include_str!("../../../sdk/src/hooks.rs")),
    ("src/lib.rs", include_str!("../../../sdk/src/lib.rs")),
    ("src/pattern.rs", include_str!("../../../sdk/src/pattern.rs")),
    ("src/testkit.rs", include_str!("../../../sdk/src/testkit.rs")),
    ("src/testkit/recording.rs", include_str!("../../../sdk/src/testkit/recording.rs")),
    ("wit/herald-plugin.wit", include_str!("../../../sdk/wit/herald-plugin.wit")),
];

/// Writes the carried SDK into `dir` (created if needed).
pub(crate) fn write_to(dir: &std::path::Path) -> std::io::Result<()> {
    for (path, text) in FILES {
        let file = dir.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(file, text)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    fn files_under(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path: PathBuf = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    files_under(root, &path, out);
                }
            } else if let Ok(relative) = path.strip_prefix(root) {
                out.push(relative.to_string_lossy().replace('\\', "/"));
            }
        }
    }

    #[test]
    fn the_carried_sdk_is_every_file_of_sdk() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk");
        let mut on_disk = Vec::new();
        files_under(&root, &root, &mut on_disk);
        on_disk.sort();
        let mut carried: Vec<String> = super::FILES.iter().map(|(path, _)| (*path).to_owned()).collect();
        carried.sort();
        assert_eq!(carried, on_disk, "host/plugin-runtime/src/bundled_sdk.rs must list every file of sdk/");
    }
}
