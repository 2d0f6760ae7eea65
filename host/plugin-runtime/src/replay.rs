//! `herald plugin replay PLUGIN.wasm RECORDING`: runs a recording's calls through a plugin
//! outside the server and reports every decision that differs from the recorded one.
//!
//! The plugin runs in a throwaway embedded runtime (in-memory KV and rate limiter, both
//! empty at the start) whose clock is set to each record's `at_ms` before its call, so
//! time-based decisions (rate limits, TTLs) see the time they saw when recorded. What the
//! plugin kept in KV before the recording started is not in it: a plugin whose answers
//! depend on older state may differ for that reason alone. Records of hooks the plugin does
//! not export are skipped and counted.

use crate::{
    clock::{Clock, ManualClock},
    config::{Hook, PluginHostConfig},
    error::PluginError,
    fallback::BuiltinDefaults,
    host::PluginHost,
    kv::MemoryKv,
    limiter::MemoryLimiter,
    plugin::{Plugin, Source},
    recording::{CallInput, CallOutput, FORMAT_VERSION, Header, Record},
};
use serde::Serialize;
use std::{io::BufRead, path::Path, sync::Arc};

/// One decision that changed.
#[derive(Debug, Clone, Serialize)]
pub struct Difference {
    /// Line of the recording (1 is the header).
    pub line: usize,
    /// The hook and its input.
    #[serde(flatten)]
    pub call: CallInput,
    /// What the recorded version answered.
    pub recorded: CallOutput,
    /// What this plugin answers.
    pub replayed: CallOutput,
}

/// What a replay found.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    /// The recording's header.
    pub recording: Header,
    /// The plugin replayed: name, version, hash.
    pub plugin: String,
    /// Its version (manifest).
    pub version: String,
    /// `sha256:<hex>` of its component.
    pub content_hash: String,
    /// Records in the recording.
    pub records: usize,
    /// Records replayed.
    pub replayed: usize,
    /// Records of hooks the plugin does not export.
    pub skipped: usize,
    /// Every decision that differs.
    pub differences: Vec<Difference>,
}

fn bad(path: &Path, line: usize, why: impl std::fmt::Display) -> PluginError {
    PluginError::Recording { path: path.to_path_buf(), message: format!("line {line}: {why}") }
}

/// Replays the recording at `recording` through the plugin at `plugin` (with its
/// `NAME.toml` beside it, if any).
///
/// # Errors
/// The plugin's load error, or [`PluginError::Recording`] when the recording cannot be read
/// or a line is not of the format (saying which line and why).
pub async fn replay(plugin: impl AsRef<Path>, recording: impl AsRef<Path>) -> Result<ReplayReport, PluginError> {
    let recording_path = recording.as_ref().to_path_buf();
    let lines = {
        let path = recording_path.clone();
        tokio::task::spawn_blocking(move || read_lines(&path)).await.map_err(PluginError::Task)??
    };
    let mut lines = lines.into_iter();
    let (_, first) = lines.next().ok_or_else(|| bad(&recording_path, 1, "the recording is empty"))?;
    let header: Header = serde_json::from_str(&first).map_err(|e| bad(&recording_path, 1, e))?;
    if header.recording != FORMAT_VERSION {
        return Err(bad(
            &recording_path,
            1,
            format!("recording format {} is not {FORMAT_VERSION}, the one this Herald reads", header.recording),
        ));
    }
    let clock = Arc::new(ManualClock::new(header.started_ms));
    let c: Arc<dyn Clock> = clock.clone();
    // No quarantine: a failing call must not turn the calls after it into failures too.
    let mut config = PluginHostConfig::default();
    config.quarantine.failures = 0;
    let host = PluginHost::with_clock(
        config,
        Arc::new(MemoryKv::new(c.clone())),
        Arc::new(MemoryLimiter::new(c.clone())),
        Arc::new(BuiltinDefaults),
        c,
    )?;
    let source = Source::read_off_thread(plugin.as_ref().to_path_buf()).await?;
    let plugin = Plugin::load(&host.inner.runtime, source, &host.inner.deps, None, &[]).await?;
    let mut report = ReplayReport {
        recording: header,
        plugin: plugin.name.to_string(),
        version: plugin.settings.version.clone(),
        content_hash: plugin.content_hash.clone(),
        records: 0,
        replayed: 0,
        skipped: 0,
        differences: Vec::new(),
    };
    for (line, text) in lines {
        let record: Record = serde_json::from_str(&text).map_err(|e| bad(&recording_path, line, e))?;
        report.records += 1;
        let hook: Hook = record.call.hook();
        if !plugin.hooks.contains(&hook) {
            report.skipped += 1;
            continue;
        }
        clock.set_ms(record.at_ms);
        let replayed = match plugin.invoke(record.call.as_input()).await {
            Ok(output) => CallOutput::of(Ok(&output)),
            Err(failure) => CallOutput::Failed(failure.message),
        };
        report.replayed += 1;
        if !replayed.same_decision(&record.output) {
            report.differences.push(Difference { line, call: record.call, recorded: record.output, replayed });
        }
    }
    Ok(report)
}

/// The recording's non-empty lines, numbered from 1.
fn read_lines(path: &Path) -> Result<Vec<(usize, String)>, PluginError> {
    let file = std::fs::File::open(path).map_err(|source| PluginError::Io { path: path.to_path_buf(), source })?;
    let mut lines = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| bad(path, n + 1, e))?;
        if !line.trim().is_empty() {
            lines.push((n + 1, line));
        }
    }
    Ok(lines)
}
