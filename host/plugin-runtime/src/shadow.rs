//! Shadow runs and canaries: a new version of a plugin tried on live traffic before it
//! decides anything, then promoted, then watched.
//!
//! * **Shadow.** `NAME.shadow.wasm` (with `NAME.shadow.toml`) beside `NAME.wasm` is loaded
//!   as NAME's shadow: every call of the active version (or one in `shadow.every`) is
//!   given, with the same input, to the shadow too — queued for the shadow's worker task,
//!   after the active call answered, at most `shadow.max_in_flight` waiting — and the two
//!   answers are compared. The worker drains the queue in batches, woken by a short tick or
//!   when the queue is half full, so an offer costs a copy and one lock, never a wake-up.
//!   Its answers are never applied. It runs in a KV and rate-limiter scope of its own
//!   (`NAME.shadow`), so it cannot disturb the active version's state. `/admin/plugins`
//!   shows how many decisions differed, by kind, with a few examples of each, and its
//!   calls, failures and p99 next to the active version's.
//! * **Promote.** The shadow's files become `NAME.wasm`/`NAME.toml` (the active ones are kept
//!   as `NAME.previous.*`), and it serves at once, its compiled code reused.
//! * **Canary.** For `canary.window_ms` after a promotion, the new version's failure ratio and
//!   p99 are checked every few hundred milliseconds; past a bound, the previous version
//!   serves again (its files back as `NAME.*`, the rejected ones kept as `NAME.rejected.*`),
//!   and the log and `/admin/plugins` say why.
//!
//! This file holds the shadow; the host's `promote.rs` moves the files and runs the watch,
//! and `canary.rs` holds the bounds it judges by and the status it keeps.

use crate::{
    call::{Failure, Input, Output},
    config::{Hook, ShadowPolicy},
    plugin::Plugin,
    recording::{CallInput, CallOutput},
};
use parking_lot::Mutex;
use serde::Serialize;
use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
};

/// An answer in a few words: the kind of decision, for grouping differences.
fn kind(output: &CallOutput) -> String {
    use crate::types::{AnnounceDecision as A, ConnectDecision as C, MessageDecision as M};
    match output {
        CallOutput::Message(M::Allow) => "allow".into(),
        CallOutput::Message(M::Reject(r)) => format!("reject {}", r.code),
        CallOutput::Message(M::Rewrite(_)) => "rewrite".into(),
        CallOutput::Announcement(A::Accept(a)) => if a.archive { "accept, archive" } else { "accept" }.into(),
        CallOutput::Announcement(A::Defer(_)) => "defer".into(),
        CallOutput::Announcement(A::Duplicate) => "duplicate".into(),
        CallOutput::Route(None) => "no key".into(),
        CallOutput::Route(Some(_)) => "a key".into(),
        CallOutput::Tier(t) => format!("{t:?}").to_lowercase(),
        CallOutput::Connect(C::Allow(None)) => "allow".into(),
        CallOutput::Connect(C::Allow(Some(_))) => "allow as another user".into(),
        CallOutput::Connect(C::Deny(_)) => "deny".into(),
        CallOutput::Dropped(d) if d.is_empty() => "drop none".into(),
        CallOutput::Dropped(_) => "drop some".into(),
        CallOutput::Failed(_) => "failed".into(),
    }
}

/// One call on which the shadow answered differently.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShadowExample {
    /// The hook and its input.
    #[serde(flatten)]
    pub call: CallInput,
    /// The active version's answer (the one applied).
    pub active: CallOutput,
    /// The shadow's.
    pub shadow: CallOutput,
}

/// The differences of one kind, e.g. `message-policy: allow → reject blocked-word`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShadowDifferences {
    /// `<hook>: <active's kind of answer> → <shadow's>`.
    pub kind: String,
    /// How many calls differed so.
    pub count: u64,
    /// The first few.
    pub examples: Vec<ShadowExample>,
}

/// A shadow's standing, as `/admin/plugins` shows it under the active plugin.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShadowStatus {
    /// Its manifest version.
    pub version: Option<String>,
    /// `sha256:<hex>` of its component.
    pub content_hash: Option<String>,
    /// The contract it was built for.
    pub contract: Option<String>,
    /// Its calls (each compared with the active version's answer).
    pub calls: u64,
    /// Its failed calls.
    pub failures: u64,
    /// Its call p99, µs (within 25 %), to set beside the active version's.
    pub p99_call_us: Option<u64>,
    /// Calls compared.
    pub compared: u64,
    /// Of which the same decision.
    pub agreed: u64,
    /// Of which another decision.
    pub differed: u64,
    /// Calls it was not given: `shadow.max_in_flight` were waiting already.
    pub skipped: u64,
    /// It is given one call in this many.
    pub every: u64,
    /// The differences, by kind, most frequent first.
    pub differences: Vec<ShadowDifferences>,
    /// Why its file failed to load, if it did (no shadow runs then).
    pub last_load_error: Option<String>,
}

/// How long an offer may wait in a shadow's queue before the worker takes it (unless the
/// queue fills to half first).
const DRAIN_EVERY: std::time::Duration = std::time::Duration::from_millis(5);

/// A call handed to the shadow: its hook, input and the active version's answer.
type Offer = (Hook, CallInput, CallOutput);

/// A loaded shadow version and what it found.
pub(crate) struct Shadow {
    pub plugin: Arc<Plugin>,
    policy: ShadowPolicy,
    offered: AtomicU64,
    /// Offers waiting for the shadow's worker task, at most `max_in_flight`: a full queue
    /// skips the call. A plain locked queue: an offer takes the lock once, where a channel
    /// would cost a few more atomic operations (its permits, its slot, the receiver's waker).
    queue: Mutex<VecDeque<Offer>>,
    /// Whether a worker takes the offers (none without a tokio runtime).
    worker: bool,
    /// Wakes the worker before its tick when the queue is half full.
    wake: Arc<tokio::sync::Notify>,
    compared: AtomicU64,
    agreed: AtomicU64,
    skipped: AtomicU64,
    differences: Mutex<BTreeMap<String, ShadowDifferences>>,
}

impl ShadowStatus {
    /// A shadow whose file failed to load.
    pub(crate) fn failed(error: String) -> Self {
        Self {
            version: None,
            content_hash: None,
            contract: None,
            calls: 0,
            failures: 0,
            p99_call_us: None,
            compared: 0,
            agreed: 0,
            differed: 0,
            skipped: 0,
            every: 0,
            differences: Vec::new(),
            last_load_error: Some(error),
        }
    }
}

impl Shadow {
    /// A shadow of `plugin`, and its worker task: one shadow call at a time, in order, off
    /// the paths that serve messages. Without a tokio runtime (a throwaway host) it is given
    /// nothing.
    pub fn new(plugin: Arc<Plugin>, policy: ShadowPolicy) -> Arc<Self> {
        let runtime = tokio::runtime::Handle::try_current().ok();
        let wake = Arc::new(tokio::sync::Notify::new());
        let shadow = Arc::new(Self {
            plugin,
            policy,
            offered: AtomicU64::new(0),
            queue: Mutex::new(VecDeque::with_capacity(policy.max_in_flight.max(1))),
            worker: runtime.is_some(),
            wake: wake.clone(),
            compared: AtomicU64::new(0),
            agreed: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            differences: Mutex::new(BTreeMap::new()),
        });
        if let Some(runtime) = runtime {
            // Holds the shadow weakly: the worker ends when the shadow is dropped. An offer
            // never wakes it: the tick or the half-full notification does, once per batch.
            let weak = Arc::downgrade(&shadow);
            runtime.spawn(async move {
                let mut tick = tokio::time::interval(DRAIN_EVERY);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        () = wake.notified() => {}
                    }
                    let Some(shadow) = weak.upgrade() else { return };
                    loop {
                        // Not `while let`: the guard must drop before the call.
                        let next = shadow.queue.lock().pop_front();
                        let Some((hook, call, active)) = next else { break };
                        let answer = shadow.plugin.invoke(call.as_input()).await;
                        let answer = CallOutput::of(answer.as_ref().map_err(|f| f.message.as_str()));
                        shadow.compare(hook, call, active, answer);
                    }
                }
            });
        }
        shadow
    }

    /// Gives the shadow the call the active version just answered, if sampled and within
    /// budget: a copy of the input goes to the shadow's queue, so this call never waits
    /// for the shadow's, nor wakes its worker but once per half a queue.
    pub fn offer(&self, hook: Hook, input: Input<'_>, active: &Result<Output, Failure>) {
        let every = self.policy.every.max(1);
        if !self.worker
            || !self.plugin.hooks.contains(&hook)
            || (every > 1 && !self.offered.fetch_add(1, Relaxed).is_multiple_of(every))
        {
            return;
        }
        let limit = self.policy.max_in_flight.max(1);
        let waiting = {
            let mut queue = self.queue.lock();
            if queue.len() >= limit {
                drop(queue);
                self.skipped.fetch_add(1, Relaxed);
                return;
            }
            let active = CallOutput::of(active.as_ref().map_err(|f| f.message.as_str()));
            queue.push_back((hook, CallInput::of(input, false), active));
            queue.len()
        };
        if waiting == limit.div_ceil(2) {
            self.wake.notify_one();
        }
    }

    fn compare(&self, hook: Hook, call: CallInput, active: CallOutput, shadow: CallOutput) {
        self.compared.fetch_add(1, Relaxed);
        if active.same_decision(&shadow) {
            self.agreed.fetch_add(1, Relaxed);
            return;
        }
        let kind = format!("{hook}: {} → {}", kind(&active), kind(&shadow));
        let mut differences = self.differences.lock();
        let entry = differences.entry(kind.clone()).or_insert_with(|| ShadowDifferences {
            kind,
            count: 0,
            examples: Vec::new(),
        });
        entry.count += 1;
        if entry.examples.len() < self.policy.examples {
            entry.examples.push(ShadowExample { call, active, shadow });
        }
    }

    pub fn status(&self) -> ShadowStatus {
        let stats = &self.plugin.stats;
        let compared = self.compared.load(Relaxed);
        let agreed = self.agreed.load(Relaxed);
        let mut differences: Vec<ShadowDifferences> = self.differences.lock().values().cloned().collect();
        differences.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.kind.cmp(&b.kind)));
        ShadowStatus {
            version: Some(self.plugin.settings.version.clone()),
            content_hash: Some(self.plugin.content_hash.clone()),
            contract: Some(self.plugin.contract.version().to_owned()),
            calls: stats.calls(),
            failures: stats.failures.load(Relaxed),
            p99_call_us: stats.quantile(0.99).map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            compared,
            agreed,
            differed: compared - agreed,
            skipped: self.skipped.load(Relaxed),
            every: self.policy.every,
            differences,
            last_load_error: self.plugin.last_load_error.lock().clone(),
        }
    }
}
