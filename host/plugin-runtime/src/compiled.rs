//! Cranelift's incremental compilation cache: the machine code of every function compiled,
//! keyed by the function's code with its references to other functions and types left out,
//! so a function whose code is unchanged hits even when a new version moved it.
//!
//! A new version of a plugin usually changes a few functions of its own; the rest (the SDK,
//! the standard library, its dependencies, most of its code) are taken from here instead of
//! compiled again. That matters most in a cluster deploy: every node compiles the version at
//! the same moment, beside the traffic. Kept in memory, bounded by
//! `plugin_runtime.compile_cache_mib`; a node starts with it empty.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use moka::sync::Cache;

/// The compiled functions, by key.
pub(crate) struct CompiledFunctions {
    functions: Cache<Box<[u8]>, Arc<[u8]>>,
    /// Lookups answered from here, and those that were not (the function was compiled).
    hits: AtomicU64,
    misses: AtomicU64,
}

impl CompiledFunctions {
    /// A cache holding up to `mib` MiB of keys and code.
    pub(crate) fn new(mib: u64) -> Self {
        let functions = Cache::<Box<[u8]>, Arc<[u8]>>::builder()
            .max_capacity(mib.saturating_mul(1 << 20))
            .weigher(|key, code| u32::try_from(key.len() + code.len()).unwrap_or(u32::MAX))
            .build();
        Self { functions, hits: AtomicU64::new(0), misses: AtomicU64::new(0) }
    }

    /// Functions taken from here so far, and functions compiled.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.hits.load(Relaxed), self.misses.load(Relaxed))
    }
}

impl std::fmt::Debug for CompiledFunctions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledFunctions").field("functions", &self.functions.entry_count()).finish()
    }
}

impl wasmtime::CacheStore for CompiledFunctions {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        let code = self.functions.get(key);
        let (count, outcome) = if code.is_some() { (&self.hits, "hit") } else { (&self.misses, "miss") };
        count.fetch_add(1, Relaxed);
        metrics::counter!("herald_plugin_compile_cache_total", "outcome" => outcome).increment(1);
        code.map(|code| Cow::Owned(code.to_vec()))
    }

    fn insert(&self, key: &[u8], code: Vec<u8>) -> bool {
        self.functions.insert(key.into(), code.into());
        true
    }
}
