//! The wasmtime engine and linker every plugin shares, and the epoch ticker that enforces
//! call deadlines.
//!
//! The engine is narrowed to what plugins need: the component model, async host calls,
//! epoch interruption, cranelift. Each instance reserves address space only up to the
//! host's `max_memory_mib` (not wasmtime's default 4 GiB), so a pool of instances stays
//! small. The ticker is an OS thread, not a tokio task: a plugin spinning in a loop holds
//! its tokio worker, and with every worker held a ticker task would never run.

use crate::{compiled::CompiledFunctions, config::PluginHostConfig, error::PluginError, state::StoreState};
use herald_plugin_bindings::AllHooks;
use std::{
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    thread::{JoinHandle, Thread},
};
use wasmtime::{
    Config, Enabled, Engine, InstanceAllocationStrategy, OptLevel, PoolingAllocationConfig,
    component::{HasSelf, Linker},
};

/// Table size of a pooled instance slot; a plugin's `table_elements` cap stays below it.
const TABLE_SLOT_ELEMENTS: usize = 20_000;

/// Bytes of a recycled linear memory slot kept mapped (see `pagemap_scan` below).
const LINEAR_MEMORY_KEEP_RESIDENT: usize = 256 * 1024;

/// Bytes of a recycled table slot kept mapped (8192 entries).
const TABLE_KEEP_RESIDENT: usize = 64 * 1024;

/// Engine, linker and ticker; one per [`crate::PluginHost`].
pub(crate) struct Runtime {
    pub engine: Engine,
    pub linker: Linker<StoreState>,
    /// Components compiled so far (a reload that changes only a manifest compiles nothing).
    pub compilations: std::sync::atomic::AtomicU64,
    /// The functions compiled so far, for the next compile (none when turned off).
    pub compiled: Option<Arc<CompiledFunctions>>,
    pub ticker: EpochTicker,
}

impl Runtime {
    pub fn new(config: &PluginHostConfig) -> Result<Self, PluginError> {
        let engine_err = |e: wasmtime::Error| PluginError::Engine(e.to_string());
        let max_memory = config.max_memory_mib.saturating_mul(1 << 20);
        let mut c = Config::new();
        c.epoch_interruption(true)
            .cranelift_opt_level(OptLevel::Speed)
            .max_wasm_stack(512 * 1024)
            .async_stack_size(2 * 1024 * 1024)
            .memory_reservation(max_memory)
            .memory_guard_size(64 * 1024)
            .memory_reservation_for_growth(0)
            // The reservation covers the largest memory any plugin may have (the limiter
            // caps growth at `memory_mib` <= `max_memory_mib`), so a memory never needs
            // to move. Saying so lets Cranelift treat a memory's base address as constant,
            // so guest code need not reload it after every call.
            .memory_may_move(false);
        if config.pooling {
            let n = config.max_instances.max(1);
            let mut pool = PoolingAllocationConfig::new();
            // A Rust wasm32-wasip2 component has a few core instances (main module and
            // lowering shims), one or two memories and a few tables.
            pool.total_component_instances(n)
                .total_core_instances(n.saturating_mul(8))
                .total_memories(n.saturating_mul(2))
                .total_tables(n.saturating_mul(4))
                .total_stacks(n)
                .max_memory_size(usize::try_from(max_memory).unwrap_or(usize::MAX))
                .table_elements(TABLE_SLOT_ELEMENTS)
                // When an instance is dropped its slot is reset for the next one. By default
                // that is `madvise(DONTNEED)` over the whole slot, so the next instance
                // page-faults on every page it touches (guest stack, data, heap, tables):
                // most of a fresh instantiation's cost. With `PAGEMAP_SCAN` (Linux 6.7+)
                // wasmtime finds the pages the guest actually dirtied and restores just
                // those with `memcpy`, up to these sizes, so they stay mapped and the next
                // instance takes no faults (fresh instantiation went from ~15 to ~5 µs).
                // Without the ioctl, wasmtime falls back to resetting the first N bytes
                // with `memset`, which is why the sizes stay moderate.
                .pagemap_scan(Enabled::Auto)
                .linear_memory_keep_resident(LINEAR_MEMORY_KEEP_RESIDENT)
                .table_keep_resident(TABLE_KEEP_RESIDENT);
            c.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        }
        let compiled =
            (config.compile_cache_mib > 0).then(|| Arc::new(CompiledFunctions::new(config.compile_cache_mib)));
        if let Some(compiled) = &compiled {
            c.enable_incremental_compilation(Arc::clone(compiled) as _).map_err(engine_err)?;
        }
        let engine = Engine::new(&c).map_err(engine_err)?;
        let mut linker = Linker::new(&engine);
        // Rust's wasm32-wasip2 std imports wasi:cli/io/clocks/...; they are served from an
        // empty WasiCtx (no preopens, env, args or sockets; the host's clock).
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(engine_err)?;
        AllHooks::add_to_linker::<StoreState, HasSelf<StoreState>>(&mut linker, |s| s).map_err(engine_err)?;
        // Plugins built for contract 0.1.0 import `host@0.1.0` (the same functions) and
        // `types@0.1.0` (types only: an empty instance).
        herald_plugin_bindings::v0_1::herald::plugin::host::add_to_linker::<StoreState, HasSelf<StoreState>>(
            &mut linker,
            |s| s,
        )
        .map_err(engine_err)?;
        linker.instance("herald:plugin/types@0.1.0").map_err(engine_err)?;
        let ticker = EpochTicker::start(engine.clone(), config.epoch_tick())?;
        Ok(Self { engine, linker, compilations: std::sync::atomic::AtomicU64::new(0), compiled, ticker })
    }
}

/// Advances the engine's epoch every tick while guest code may run, and sleeps otherwise.
///
/// The epoch only matters while a guest runs: it is what interrupts a call past its
/// deadline. Ticking with no plugin called would wake a thread hundreds of times a second
/// on an idle node for nothing, so once no guest started for [`QUIET_FOR`] the ticker
/// parks, and the next guest to start wakes it. Nodes that call plugins steadily
/// never see it park; one whose calls come seconds apart pays a wake-up per call.
pub(crate) struct EpochTicker {
    shared: Arc<Ticking>,
    thread: Option<JoinHandle<()>>,
}

/// How long no guest may start before the ticker parks.
const QUIET_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// What the ticker and the guests share.
#[derive(Debug, Default)]
pub(crate) struct Ticking {
    stop: AtomicBool,
    /// Guests running now (calls and instantiations).
    running: AtomicUsize,
    /// Guests started so far: a tick that sees it unchanged was quiet.
    started: AtomicU64,
    /// Set by the ticker before it parks; whoever starts a guest then wakes it.
    parked: AtomicBool,
    /// Ticks so far.
    ticks: AtomicU64,
    thread: OnceLock<Thread>,
}

/// A guest running: keeps the epoch ticking until dropped.
#[must_use = "the epoch ticks only while the guard lives"]
pub(crate) struct Running(Arc<Ticking>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Ticking {
    /// Marks a guest as running (waking the ticker if it parked) until the guard drops.
    pub fn running(self: &Arc<Self>) -> Running {
        self.started.fetch_add(1, Ordering::Relaxed);
        // SeqCst on both sides (here the increment then the read of `parked`, in the ticker
        // the store of `parked` then the read of `running`): one of the two sees the other,
        // so a guest never runs with the ticker asleep.
        self.running.fetch_add(1, Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst)
            && let Some(thread) = self.thread.get()
        {
            thread.unpark();
        }
        Running(Arc::clone(self))
    }
}

impl EpochTicker {
    fn start(engine: Engine, tick: std::time::Duration) -> Result<Self, PluginError> {
        Self::start_quiet_after(engine, tick, QUIET_FOR)
    }

    fn start_quiet_after(
        engine: Engine,
        tick: std::time::Duration,
        quiet_for: std::time::Duration,
    ) -> Result<Self, PluginError> {
        let shared = Arc::new(Ticking::default());
        let ticking = Arc::clone(&shared);
        let quiet_ticks = u32::try_from(quiet_for.as_nanos() / tick.as_nanos().max(1)).unwrap_or(u32::MAX).max(1);
        let thread = std::thread::Builder::new()
            .name("herald-plugin-epoch".into())
            .spawn(move || {
                let (mut quiet, mut seen) = (0u32, 0u64);
                while !ticking.stop.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    engine.increment_epoch();
                    ticking.ticks.fetch_add(1, Ordering::Relaxed);
                    let started = ticking.started.load(Ordering::Relaxed);
                    if started != seen || ticking.running.load(Ordering::SeqCst) > 0 {
                        (quiet, seen) = (0, started);
                        continue;
                    }
                    quiet += 1;
                    if quiet < quiet_ticks {
                        continue;
                    }
                    ticking.parked.store(true, Ordering::SeqCst);
                    if ticking.running.load(Ordering::SeqCst) == 0 && !ticking.stop.load(Ordering::SeqCst) {
                        // Woken by a guest starting, by the drop below, or spuriously: each
                        // goes round the loop again, ticking.
                        std::thread::park();
                    }
                    ticking.parked.store(false, Ordering::SeqCst);
                    quiet = 0;
                }
            })
            .map_err(|e| PluginError::Engine(format!("starting the epoch ticker thread: {e}")))?;
        let _ = shared.thread.set(thread.thread().clone());
        Ok(Self { shared, thread: Some(thread) })
    }

    /// What guests mark themselves running with.
    pub fn ticking(&self) -> Arc<Ticking> {
        Arc::clone(&self.shared)
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        // The thread sees the flag within one tick (at once if parked) and exits; not
        // joined, so dropping a host never blocks an async worker.
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Polls `done` every millisecond for up to ten seconds.
    fn wait_for(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn the_ticker_parks_when_no_guest_starts_and_ticks_again_for_the_next() {
        let ticker =
            EpochTicker::start_quiet_after(Engine::default(), Duration::from_millis(1), Duration::from_millis(20))
                .expect("ticker");
        let ticking = ticker.ticking();
        wait_for("the ticker to park", || ticking.parked.load(Ordering::SeqCst));
        let before = ticking.ticks.load(Ordering::Relaxed);
        let running = ticking.running();
        wait_for("ticks for the guest", || ticking.ticks.load(Ordering::Relaxed) >= before + 3);
        // A long guest keeps it ticking well past the quiet time.
        let long = ticking.ticks.load(Ordering::Relaxed);
        wait_for("ticks past the quiet time", || ticking.ticks.load(Ordering::Relaxed) >= long + 60);
        assert!(!ticking.parked.load(Ordering::SeqCst), "parked while a guest ran");
        drop(running);
        wait_for("the ticker to park again", || ticking.parked.load(Ordering::SeqCst));
    }
}
