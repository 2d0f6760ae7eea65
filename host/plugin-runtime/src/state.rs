//! What a plugin instance's store holds, and the `host` imports served from it.
//!
//! Each host import counts against the call's budget ([`Limits::max_host_calls`]) and
//! reaches only the plugin's own scope of KV and limiter. Storage failures and budget
//! overruns trap the call, so the guest API stays infallible.

use crate::{
    clock::Clock,
    config::Limits,
    kv::PluginKv,
    limiter::{Limit, RateLimiter},
};
use herald_plugin_bindings::herald::plugin::{host, types};
use std::{future::Future, sync::Arc, time::Duration};
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};

/// Shared by every instance of one loaded plugin version.
pub(crate) struct PluginContext {
    /// Plugin name: the KV and limiter scope, and the log tag.
    pub name: Arc<str>,
    /// `config()`'s answer.
    pub config_text: String,
    pub kv: Arc<dyn PluginKv>,
    pub limiter: Arc<dyn RateLimiter>,
    pub clock: Arc<dyn Clock>,
    pub limits: Limits,
    /// Metric name prefix for `counter-add`.
    pub metric_prefix: String,
}

/// A limit the sandbox enforced; the error a trap carries so the runtime can say why.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum LimitHit {
    /// `memory.grow` past the plugin's cap.
    #[error("memory limit: the plugin tried to grow its memory to {desired} bytes; its cap is {cap} bytes")]
    Memory {
        /// Requested size.
        desired: usize,
        /// The cap.
        cap: usize,
    },
    /// `table.grow` past the cap.
    #[error("table limit: the plugin tried to grow a table to {desired} elements; its cap is {cap}")]
    Table {
        /// Requested size.
        desired: usize,
        /// The cap.
        cap: usize,
    },
    /// Too many host imports in one call.
    #[error("host-call limit: the plugin made more than {0} host calls in one hook call")]
    HostCalls(u32),
    /// The KV store or rate limiter did not answer within the call's time.
    #[error("timeout: the KV store or rate limiter did not answer within the call's {0} ms")]
    HostTimeout(u128),
}

/// Enforces memory and table caps per instance.
pub(crate) struct Sandbox {
    memory_cap: usize,
    table_cap: usize,
}

impl wasmtime::ResourceLimiter for Sandbox {
    fn memory_growing(&mut self, _current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_cap {
            return Err(wasmtime::Error::new(LimitHit::Memory { desired, cap: self.memory_cap }));
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.table_cap {
            return Err(wasmtime::Error::new(LimitHit::Table { desired, cap: self.table_cap }));
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        32
    }

    fn tables(&self) -> usize {
        32
    }

    fn memories(&self) -> usize {
        8
    }
}

/// WASI's clocks read the host's [`Clock`]: a plugin sees one time, whichever API it uses.
struct WallClock(Arc<dyn Clock>);

impl HostWallClock for WallClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }

    fn now(&self) -> Duration {
        Duration::from_millis(self.0.now_ms())
    }
}

struct MonotonicClock(Arc<dyn Clock>);

impl HostMonotonicClock for MonotonicClock {
    fn resolution(&self) -> u64 {
        1_000_000
    }

    fn now(&self) -> u64 {
        self.0.now_ms().saturating_mul(1_000_000)
    }
}

/// One instance's store data.
pub(crate) struct StoreState {
    pub ctx: Arc<PluginContext>,
    wasi: WasiCtx,
    table: ResourceTable,
    pub sandbox: Sandbox,
    /// Host calls made by the current hook call.
    pub host_calls: u32,
    /// The last error-level log line (the SDK logs panic messages there).
    pub last_error_log: Option<String>,
    /// When the current call must be over; host calls that wait (KV, limiter) stop here.
    /// Wasm code is stopped by the epoch deadline instead, which costs no timer.
    pub deadline: tokio::time::Instant,
    /// The time budget `deadline` was derived from, for messages.
    budget: Duration,
}

impl StoreState {
    /// State for a new instance; `deadline` bounds host calls made while instantiating and
    /// is moved forward by each hook call to its start plus `budget`.
    pub fn new(ctx: Arc<PluginContext>, deadline: tokio::time::Instant, budget: Duration) -> Self {
        // No preopens, no env, no args, no network: stdio goes nowhere.
        let wasi = WasiCtx::builder()
            .wall_clock(WallClock(ctx.clock.clone()))
            .monotonic_clock(MonotonicClock(ctx.clock.clone()))
            .build();
        let sandbox = Sandbox {
            memory_cap: ctx.limits.memory_bytes(),
            table_cap: usize::try_from(ctx.limits.table_elements).unwrap_or(usize::MAX),
        };
        Self { ctx, wasi, table: ResourceTable::new(), sandbox, host_calls: 0, last_error_log: None, deadline, budget }
    }

    fn count(&mut self) -> wasmtime::Result<()> {
        self.host_calls += 1;
        if self.host_calls > self.ctx.limits.max_host_calls {
            return Err(wasmtime::Error::new(LimitHit::HostCalls(self.ctx.limits.max_host_calls)));
        }
        Ok(())
    }
}

/// Awaits a back-end call, bounded by the call's deadline.
async fn bounded<T, E>(
    deadline: tokio::time::Instant,
    budget: Duration,
    fut: impl Future<Output = Result<T, E>>,
) -> wasmtime::Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    // In-memory back ends answer on the first poll: no timer is set up for them.
    let mut fut = std::pin::pin!(fut);
    if let std::task::Poll::Ready(result) =
        std::future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx))).await
    {
        return result.map_err(wasmtime::Error::new);
    }
    match tokio::time::timeout_at(deadline, fut).await {
        Ok(result) => result.map_err(wasmtime::Error::new),
        Err(_) => Err(wasmtime::Error::new(LimitHit::HostTimeout(budget.as_millis()))),
    }
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

fn ttl(ms: Option<u64>) -> Option<Duration> {
    ms.map(Duration::from_millis)
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

impl types::Host for StoreState {}

impl host::Host for StoreState {
    async fn kv_get(&mut self, key: String) -> wasmtime::Result<Option<Vec<u8>>> {
        self.count()?;
        bounded(self.deadline, self.budget, self.ctx.kv.get(&self.ctx.name, &key)).await
    }

    async fn kv_set(&mut self, key: String, value: Vec<u8>, ttl_ms: Option<u64>) -> wasmtime::Result<()> {
        self.count()?;
        bounded(self.deadline, self.budget, self.ctx.kv.set(&self.ctx.name, &key, value, ttl(ttl_ms))).await
    }

    async fn kv_set_if_absent(&mut self, key: String, value: Vec<u8>, ttl_ms: Option<u64>) -> wasmtime::Result<bool> {
        self.count()?;
        bounded(self.deadline, self.budget, self.ctx.kv.set_if_absent(&self.ctx.name, &key, value, ttl(ttl_ms))).await
    }

    async fn kv_increment(&mut self, key: String, delta: i64, ttl_ms: Option<u64>) -> wasmtime::Result<i64> {
        self.count()?;
        bounded(self.deadline, self.budget, self.ctx.kv.increment(&self.ctx.name, &key, delta, ttl(ttl_ms))).await
    }

    async fn kv_delete(&mut self, key: String) -> wasmtime::Result<bool> {
        self.count()?;
        bounded(self.deadline, self.budget, self.ctx.kv.delete(&self.ctx.name, &key)).await
    }

    async fn rate_limit(&mut self, key: String, per_second: f64, burst: u32) -> wasmtime::Result<types::LimitDecision> {
        self.count()?;
        match bounded(self.deadline, self.budget, self.ctx.limiter.check(&self.ctx.name, &key, per_second, burst))
            .await?
        {
            Limit::Allowed => Ok(types::LimitDecision::Allowed),
            Limit::RetryAfter(d) => {
                Ok(types::LimitDecision::RetryAfterMs(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
            }
        }
    }

    async fn now_ms(&mut self) -> wasmtime::Result<u64> {
        self.count()?;
        Ok(self.ctx.clock.now_ms())
    }

    async fn log(
        &mut self,
        level: types::LogLevel,
        message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        use types::LogLevel as L;
        self.count()?;
        let message = truncate(message, 4096);
        let plugin = &*self.ctx.name;
        match level {
            L::Trace => tracing::trace!(plugin, ?fields, "{message}"),
            L::Debug => tracing::debug!(plugin, ?fields, "{message}"),
            L::Info => tracing::info!(plugin, ?fields, "{message}"),
            L::Warn => tracing::warn!(plugin, ?fields, "{message}"),
            L::Error => {
                tracing::error!(plugin, ?fields, "{message}");
                self.last_error_log = Some(message);
            }
        }
        Ok(())
    }

    async fn counter_add(&mut self, name: String, delta: u64) -> wasmtime::Result<()> {
        self.count()?;
        let name: String = name
            .chars()
            .take(64)
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
            .collect();
        metrics::counter!(format!("{}{name}", self.ctx.metric_prefix), "plugin" => self.ctx.name.to_string())
            .increment(delta);
        Ok(())
    }

    async fn config(&mut self) -> wasmtime::Result<String> {
        self.count()?;
        Ok(self.ctx.config_text.clone())
    }
}

/// Contract 0.1.0's `host` import: the same functions as today's, one by one.
impl herald_plugin_bindings::v0_1::herald::plugin::host::Host for StoreState {
    async fn kv_get(&mut self, key: String) -> wasmtime::Result<Option<Vec<u8>>> {
        host::Host::kv_get(self, key).await
    }

    async fn kv_set(&mut self, key: String, value: Vec<u8>, ttl_ms: Option<u64>) -> wasmtime::Result<()> {
        host::Host::kv_set(self, key, value, ttl_ms).await
    }

    async fn kv_set_if_absent(&mut self, key: String, value: Vec<u8>, ttl_ms: Option<u64>) -> wasmtime::Result<bool> {
        host::Host::kv_set_if_absent(self, key, value, ttl_ms).await
    }

    async fn kv_increment(&mut self, key: String, delta: i64, ttl_ms: Option<u64>) -> wasmtime::Result<i64> {
        host::Host::kv_increment(self, key, delta, ttl_ms).await
    }

    async fn kv_delete(&mut self, key: String) -> wasmtime::Result<bool> {
        host::Host::kv_delete(self, key).await
    }

    async fn rate_limit(&mut self, key: String, per_second: f64, burst: u32) -> wasmtime::Result<types::LimitDecision> {
        host::Host::rate_limit(self, key, per_second, burst).await
    }

    async fn now_ms(&mut self) -> wasmtime::Result<u64> {
        host::Host::now_ms(self).await
    }

    async fn log(
        &mut self,
        level: types::LogLevel,
        message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        host::Host::log(self, level, message, fields).await
    }

    async fn counter_add(&mut self, name: String, delta: u64) -> wasmtime::Result<()> {
        host::Host::counter_add(self, name, delta).await
    }

    async fn config(&mut self) -> wasmtime::Result<String> {
        host::Host::config(self).await
    }
}
