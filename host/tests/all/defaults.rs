//! The settings tables of README.md and docs/OPERATIONS.md state every key's default; the
//! code states them again in `Config::default()`. This test holds the documents to the code,
//! so a changed default cannot leave a stale row behind: every documented key must exist in
//! the serialized `Config`, and every default written as literals in backticks (`8192`,
//! `true`, `full`, `2000` / `4000`) must equal it. Defaults in words ("unset",
//! "1 for SQLite…"), placeholders (`<data_dir>/plugins`) and references to another key
//! (`peer_listen`) are not compared. One failure lists every mismatch.

use herald_host::config::Config;
use serde_json::Value;

/// One documented key and its default cell's literal, if it has one.
struct Row {
    key: String,
    literal: Option<String>,
}

/// The rows of every `| key | … | default | … |` table in `text`. In OPERATIONS.md keys are
/// relative to the section above the table (`**`[storage.group_commit]`**`); a key written
/// `.window_ms` after `quarantine.failures` is `quarantine.window_ms`.
fn rows(text: &str) -> Vec<Row> {
    let (mut out, mut section, mut default_column) = (Vec::new(), String::new(), None);
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("**`[").and_then(|rest| rest.split_once("]`**")) {
            section = format!("{}.", name.0);
        } else if line.starts_with("**Top level**") {
            section.clear();
        }
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
        if !line.starts_with('|') {
            default_column = None;
        } else if cells[0] == "key" {
            default_column = cells.iter().position(|cell| *cell == "default");
        } else if let Some(column) = default_column.filter(|_| !cells[0].starts_with("---")) {
            let Some(keys) = literals(cells[0]) else { continue };
            let values = literals(cells[column]).unwrap_or_default();
            let mut previous = String::new();
            for (i, key) in keys.iter().enumerate() {
                let key = match key.strip_prefix('.') {
                    Some(leaf) => format!("{}{leaf}", parent(&previous)),
                    None => format!("{section}{key}"),
                };
                // One value for several keys applies to each; otherwise they pair up.
                let literal = match values.len() {
                    1 => values.first(),
                    n if n == keys.len() => values.get(i),
                    _ => None,
                };
                let literal = literal.filter(|value| !value.contains('<')).cloned();
                out.push(Row { key: key.clone(), literal });
                previous = key;
            }
        }
    }
    out
}

/// A cell made of backticked literals joined by ` / `, perhaps followed by a remark in
/// parentheses or after a colon (`0` (off), `0`: one per CPU core); `None` for anything else.
fn literals(cell: &str) -> Option<Vec<String>> {
    let (mut rest, mut out) = (cell, Vec::new());
    loop {
        let (literal, after) = rest.strip_prefix('`')?.split_once('`')?;
        out.push(literal.to_string());
        rest = after.trim_start();
        match rest.strip_prefix("/ ") {
            Some(next) => rest = next,
            None => break,
        }
    }
    (rest.is_empty() || rest.starts_with('(') || rest.starts_with(':')).then_some(out)
}

/// `a.b.` of `a.b.c`; empty for a top-level key.
fn parent(key: &str) -> &str {
    &key[..key.rfind('.').map_or(0, |dot| dot + 1)]
}

fn lookup<'a>(config: &'a Value, key: &str) -> Option<&'a Value> {
    // `intake.*` documents a whole section: it must exist.
    let key = key.strip_suffix(".*").unwrap_or(key);
    key.split('.').try_fold(config, |value, part| value.as_object()?.get(part))
}

fn same(documented: &str, actual: &Value) -> bool {
    match (serde_json::from_str::<Value>(documented), actual) {
        (Ok(Value::Number(a)), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (Ok(parsed @ (Value::Bool(_) | Value::Array(_))), _) => parsed == *actual,
        _ => actual.as_str() == Some(documented),
    }
}

#[test]
fn documented_defaults_match_config_default() {
    let config = serde_json::to_value(Config::default()).expect("Config serializes");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut problems = Vec::new();
    for file in ["README.md", "docs/OPERATIONS.md"] {
        let text = std::fs::read_to_string(format!("{root}/{file}")).expect(file);
        let rows = rows(&text);
        let checked = rows.iter().filter(|row| row.literal.is_some()).count();
        assert!(
            rows.len() > 20 && checked > 20,
            "{file}: the settings tables were not found ({} keys, {checked} defaults)",
            rows.len()
        );
        for row in rows.iter().filter(|row| !row.key.contains('<')) {
            let Some(actual) = lookup(&config, &row.key) else {
                problems.push(format!("{file}: `{}` is not a key of Config", row.key));
                continue;
            };
            let Some(documented) = &row.literal else { continue };
            let sibling = format!("{}{documented}", parent(&row.key));
            if actual.is_null() && lookup(&config, &sibling).is_some() {
                continue; // "defaults to that other key", e.g. `advertise`: `peer_listen`
            }
            if !same(documented, actual) {
                problems
                    .push(format!("{file}: `{}` documented `{documented}`, Config::default() has {actual}", row.key));
            }
        }
    }
    assert!(problems.is_empty(), "{} stale rows:\n{}", problems.len(), problems.join("\n"));
}
