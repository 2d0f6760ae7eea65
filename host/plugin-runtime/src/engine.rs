//! The wasmtime engine and linker every plugin shares, and the epoch ticker that enforces
//! call deadlines.
//!
//! The engine is narrowed to what plugins need: the component model, async host calls,
//! epoch interruption, cranelift. Each instance reserves address space only up to the
//! host's `max_memory_mib` (not wasmtime's default 4 GiB), so a pool of instances stays
//! small. The ticker is an OS thread, not a tokio task: a plugin spinning in a loop holds
//! its tokio worker, and with every worker held a ticker task would never run.

use crate::{config::PluginHostConfig, error::PluginError, state::StoreState};
use herald_plugin_bindings::AllHooks;
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
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
    _ticker: EpochTicker,
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
        Ok(Self { engine, linker, compilations: std::sync::atomic::AtomicU64::new(0), _ticker: ticker })
    }
}

/// Advances the engine's epoch every tick until dropped.
struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine, tick: std::time::Duration) -> Result<Self, PluginError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("herald-plugin-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(tick);
                    engine.increment_epoch();
                }
            })
            .map_err(|e| PluginError::Engine(format!("starting the epoch ticker thread: {e}")))?;
        Ok(Self { stop, thread: Some(thread) })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        // The thread sees the flag within one tick and exits; not joined, so dropping a
        // host never blocks an async worker.
        self.stop.store(true, Ordering::Relaxed);
        drop(self.thread.take());
    }
}
