//! Record and replay: a plugin's hook calls (inputs and answers) written to a JSON-lines
//! file while it serves, and a recording run through a plugin outside the server.
//!
//! # The format (`herald-recording` version 1)
//!
//! One JSON object per line. The first line is the [`Header`]; every other line is a
//! [`Record`]:
//!
//! ```text
//! {"recording":1,"plugin":"word-filter","version":"0.1.0","contract":"0.2.0","content_hash":"sha256:…","started_ms":1764892800000,"every":1,"redacted_bodies":false}
//! {"at_ms":1764892800123,"hook":"message-policy","input":{"sender":"alice",…,"body":[104,105],…},"output":{"message":"Allow"}}
//! {"at_ms":1764892800456,"hook":"route-key","input":{"command":"Send","user":"alice","conversation":"dm:alice:bob"},"output":{"route":null}}
//! {"at_ms":1764892800789,"hook":"message-policy","input":{…},"output":{"failed":"deadline of 20 ms exceeded: the call was interrupted"}}
//! ```
//!
//! `input` is the hook's WIT input record and `output` its answer, as serde writes the
//! contract's Rust types (records as objects with snake_case fields, variants as
//! `"Allow"` or `{"Reject":{…}}`, bodies as arrays of bytes). `output` is one of
//! `message`, `announcement`, `route`, `tier`, `connect`, `dropped` (a deliver-filter's
//! dropped user ids) or `failed` (why the call failed). With `redact_bodies`, message and
//! delivery bodies are recorded empty.
//!
//! Recording is sampled (one call in `every`) and bounded by records, bytes and time; it
//! never delays a call: lines go to a writer thread through a bounded queue, and a line the
//! queue has no room for is counted as dropped. A reload of the plugin ends its recording
//! (a recording is of one version: the header names it).

use crate::{
    call::{Input, Output},
    config::Hook,
    types::{
        AnnounceDecision, Announcement, ConnectDecision, ConnectRequest, Delivery, Health, Message, MessageDecision,
        RouteRequest, Tier,
    },
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::{
    io::Write,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        mpsc,
    },
    time::{Duration, Instant},
};

/// The format version a recording's header carries.
pub const FORMAT_VERSION: u32 = 1;

/// Lines waiting for the writer thread at most; beyond, lines are dropped (and counted).
const QUEUE: usize = 4_096;

/// How much a recording takes, and of what.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecordingOptions {
    /// Record one call in `every` (1: every call).
    pub every: u64,
    /// Stop after this many records.
    pub max_records: u64,
    /// Stop before the file grows past this many bytes.
    pub max_bytes: u64,
    /// Stop after this many seconds.
    pub max_seconds: u64,
    /// Record message and delivery bodies empty.
    pub redact_bodies: bool,
}

impl Default for RecordingOptions {
    fn default() -> Self {
        Self { every: 1, max_records: 100_000, max_bytes: 64 << 20, max_seconds: 3_600, redact_bodies: false }
    }
}

impl RecordingOptions {
    /// Checks the bounds: each must be at least 1.
    ///
    /// # Errors
    /// Which option is out of range.
    pub fn validate(&self) -> Result<(), String> {
        for (name, value) in [
            ("every", self.every),
            ("max_records", self.max_records),
            ("max_bytes", self.max_bytes),
            ("max_seconds", self.max_seconds),
        ] {
            if value == 0 {
                return Err(format!("recording option `{name}` must be at least 1"));
            }
        }
        Ok(())
    }
}

/// A recording's first line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The format version ([`FORMAT_VERSION`]).
    pub recording: u32,
    /// The plugin's name.
    pub plugin: String,
    /// Its manifest version.
    pub version: String,
    /// The contract version it was built for.
    pub contract: String,
    /// `sha256:<hex>` of its component.
    pub content_hash: String,
    /// When recording started, ms since the Unix epoch (the host's clock).
    pub started_ms: u64,
    /// One call in this many was recorded.
    pub every: u64,
    /// Whether bodies were recorded empty.
    pub redacted_bodies: bool,
}

/// A hook call's input, tagged with its hook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "hook", content = "input", rename_all = "kebab-case")]
pub enum CallInput {
    /// `message-policy`.
    MessagePolicy(Message),
    /// `announce-policy`.
    AnnouncePolicy(Announcement),
    /// `route-key`.
    RouteKey(RouteRequest),
    /// `degrade`.
    Degrade(Health),
    /// `connect`.
    Connect(ConnectRequest),
    /// `deliver-filter`.
    DeliverFilter(Delivery),
}

impl CallInput {
    /// The hook it is an input of.
    pub fn hook(&self) -> Hook {
        match self {
            CallInput::MessagePolicy(_) => Hook::MessagePolicy,
            CallInput::AnnouncePolicy(_) => Hook::AnnouncePolicy,
            CallInput::RouteKey(_) => Hook::RouteKey,
            CallInput::Degrade(_) => Hook::Degrade,
            CallInput::Connect(_) => Hook::Connect,
            CallInput::DeliverFilter(_) => Hook::DeliverFilter,
        }
    }

    pub(crate) fn of(input: Input<'_>, redact: bool) -> Self {
        match input {
            Input::Message(m) => {
                let mut m = m.clone();
                if redact {
                    m.body.clear();
                }
                CallInput::MessagePolicy(m)
            }
            Input::Announcement(a) => CallInput::AnnouncePolicy(a.clone()),
            Input::Route(r) => CallInput::RouteKey(r.clone()),
            Input::Health(h) => CallInput::Degrade(*h),
            Input::Connect(c) => CallInput::Connect(c.clone()),
            Input::Delivery(d) => {
                let mut d = d.clone();
                if redact {
                    d.body.clear();
                }
                CallInput::DeliverFilter(d)
            }
        }
    }

    pub(crate) fn as_input(&self) -> Input<'_> {
        match self {
            CallInput::MessagePolicy(m) => Input::Message(m),
            CallInput::AnnouncePolicy(a) => Input::Announcement(a),
            CallInput::RouteKey(r) => Input::Route(r),
            CallInput::Degrade(h) => Input::Health(h),
            CallInput::Connect(c) => Input::Connect(c),
            CallInput::DeliverFilter(d) => Input::Delivery(d),
        }
    }
}

/// A hook call's answer, or why it had none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallOutput {
    /// A message-policy decision.
    Message(MessageDecision),
    /// An announce-policy decision.
    Announcement(AnnounceDecision),
    /// A route key, or no opinion.
    Route(Option<String>),
    /// A degrade tier.
    Tier(Tier),
    /// A connect decision.
    Connect(ConnectDecision),
    /// The recipients a deliver-filter dropped, sorted.
    Dropped(Vec<String>),
    /// The call failed (trap, deadline, limit): why.
    Failed(String),
}

impl CallOutput {
    pub(crate) fn of(outcome: Result<&Output, &str>) -> Self {
        match outcome {
            Ok(Output::Message(d)) => CallOutput::Message(d.clone()),
            Ok(Output::Announcement(d)) => CallOutput::Announcement(*d),
            Ok(Output::Route(d)) => CallOutput::Route(d.clone()),
            Ok(Output::Tier(d)) => CallOutput::Tier(*d),
            Ok(Output::Connect(d)) => CallOutput::Connect(d.clone()),
            Ok(Output::Dropped(d)) => {
                let mut d = d.clone();
                d.sort();
                d.dedup();
                CallOutput::Dropped(d)
            }
            Err(why) => CallOutput::Failed(why.to_owned()),
        }
    }

    /// Whether two answers are the same decision: failures match any failure (their
    /// messages carry timings), dropped sets match whatever their order.
    pub fn same_decision(&self, other: &CallOutput) -> bool {
        match (self, other) {
            (CallOutput::Failed(_), CallOutput::Failed(_)) => true,
            (CallOutput::Dropped(a), CallOutput::Dropped(b)) => {
                let (mut a, mut b) = (a.clone(), b.clone());
                a.sort();
                a.dedup();
                b.sort();
                b.dedup();
                a == b
            }
            (a, b) => a == b,
        }
    }
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// When it was called, ms since the Unix epoch (the host's clock); replay sets its
    /// clock to this before the call.
    pub at_ms: u64,
    /// The hook and its input.
    #[serde(flatten)]
    pub call: CallInput,
    /// What the plugin answered.
    pub output: CallOutput,
}

/// A recording's progress, as `/admin/plugins` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecordingStatus {
    /// The file.
    pub file: PathBuf,
    /// Still recording.
    pub active: bool,
    /// Records written or queued.
    pub records: u64,
    /// Bytes written or queued, the header included.
    pub bytes: u64,
    /// Records the queue had no room for.
    pub dropped: u64,
    /// Why it stopped, once it has.
    pub ended: Option<String>,
    /// The options it runs with.
    pub options: RecordingOptions,
}

/// A running recording of one plugin version.
pub(crate) struct Recorder {
    file: PathBuf,
    options: RecordingOptions,
    until: Instant,
    calls: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
    dropped: AtomicU64,
    done: AtomicBool,
    sender: Mutex<Option<mpsc::SyncSender<String>>>,
    ended: Mutex<Option<String>>,
}

impl Recorder {
    /// Creates `file` (and its folder), writes the header and starts the writer thread.
    pub fn start(file: PathBuf, header: &Header, options: RecordingOptions) -> std::io::Result<Arc<Self>> {
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let mut out = std::io::BufWriter::new(std::fs::File::create_new(&file)?);
        let header = serde_json::to_string(header).map_err(std::io::Error::other)?;
        writeln!(out, "{header}")?;
        out.flush()?;
        let (sender, lines) = mpsc::sync_channel::<String>(QUEUE);
        let path = file.clone();
        std::thread::Builder::new().name("plugin-recorder".into()).spawn(move || {
            for line in lines {
                if let Err(error) = writeln!(out, "{line}") {
                    tracing::error!(file = %path.display(), %error, "writing a plugin recording failed; it stops");
                    return;
                }
            }
            if let Err(error) = out.flush() {
                tracing::error!(file = %path.display(), %error, "writing a plugin recording failed");
            }
        })?;
        Ok(Arc::new(Self {
            file,
            options,
            until: Instant::now() + Duration::from_secs(options.max_seconds),
            calls: AtomicU64::new(0),
            records: AtomicU64::new(0),
            bytes: AtomicU64::new(header.len() as u64 + 1),
            dropped: AtomicU64::new(0),
            done: AtomicBool::new(false),
            sender: Mutex::new(Some(sender)),
            ended: Mutex::new(None),
        }))
    }

    /// Records one call, if it is sampled and the bounds allow.
    pub fn record(&self, at_ms: u64, input: Input<'_>, outcome: Result<&Output, &str>) {
        if self.done.load(Relaxed) || !self.calls.fetch_add(1, Relaxed).is_multiple_of(self.options.every) {
            return;
        }
        if Instant::now() >= self.until {
            self.stop(format!("reached max_seconds ({})", self.options.max_seconds));
            return;
        }
        let record =
            Record { at_ms, call: CallInput::of(input, self.options.redact_bodies), output: CallOutput::of(outcome) };
        let Ok(line) = serde_json::to_string(&record) else { return };
        let size = line.len() as u64 + 1;
        if self.bytes.load(Relaxed) + size > self.options.max_bytes {
            self.stop(format!("reached max_bytes ({})", self.options.max_bytes));
            return;
        }
        let sent = self.sender.lock().as_ref().map(|sender| sender.try_send(line));
        match sent {
            Some(Ok(())) => {
                self.bytes.fetch_add(size, Relaxed);
                if self.records.fetch_add(1, Relaxed) + 1 >= self.options.max_records {
                    self.stop(format!("reached max_records ({})", self.options.max_records));
                }
            }
            Some(Err(_)) => _ = self.dropped.fetch_add(1, Relaxed),
            None => {}
        }
    }

    /// Stops recording (the writer thread writes what is queued and closes the file).
    pub fn stop(&self, why: String) {
        if !self.done.swap(true, Relaxed) {
            tracing::info!(file = %self.file.display(), "plugin recording ended: {why}");
            *self.ended.lock() = Some(why);
            self.sender.lock().take();
        }
    }

    pub fn status(&self) -> RecordingStatus {
        RecordingStatus {
            file: self.file.clone(),
            active: !self.done.load(Relaxed),
            records: self.records.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            dropped: self.dropped.load(Relaxed),
            ended: self.ended.lock().clone(),
            options: self.options,
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop("the plugin version it recorded stopped serving".to_owned());
    }
}

/// Why a recording did not start.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    /// No version of that plugin serves.
    #[error("no plugin named `{0}` is loaded")]
    NotLoaded(String),
    /// It is being recorded already.
    #[error("plugin `{name}` is being recorded already, to {file}; stop that recording first")]
    AlreadyRecording {
        /// The plugin.
        name: String,
        /// The running recording's file.
        file: PathBuf,
    },
    /// An option is out of range.
    #[error("{0}")]
    BadOptions(String),
    /// The file could not be created.
    #[error("cannot create the recording {file}: {source}")]
    Io {
        /// The file.
        file: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}
