//! Calls into a loaded version: instances checked out of its pool (or made when the pool is
//! empty), the call under its deadlines, and what a failure costs (the instance, a mark
//! towards quarantine).

use super::contract::Guests;
use super::{Plugin, chain};
use crate::{
    call::{Failure, Input, Output},
    error::PluginError,
    state::{LimitHit, StoreState},
};
use tokio::time::Instant;
use wasmtime::{Store, Trap};

/// An instance and its hooks' export handles, looked up once at instantiation. Boxed in
/// the pool: a call checks one out and gives it back, and moving a pointer in and out
/// of the pool is cheaper than moving the handles of all six hooks.
pub(super) struct Instance {
    store: Store<StoreState>,
    guests: Guests,
}

impl Plugin {
    /// A fresh instance; host calls made while instantiating stop at `deadline`.
    async fn instantiate(&self, deadline: Instant) -> Result<Box<Instance>, Failure> {
        // A start function is guest code: its deadline needs the epoch ticking.
        let _running = self.ticking.running();
        let mut store = Store::new(self.pre.engine(), StoreState::new(self.ctx.clone(), deadline, self.hard_timeout));
        store.limiter(|s| &mut s.sandbox);
        store.epoch_deadline_trap();
        store.set_epoch_deadline(self.epoch_ticks);
        let fail = |e: wasmtime::Error, store: &mut Store<StoreState>| Failure {
            message: format!("instantiation failed: {}", self.describe(&e, store)),
        };
        let instance = match self.pre.instantiate_async(&mut store).await {
            Ok(i) => i,
            Err(e) => return Err(fail(e, &mut store)),
        };
        let guests = self.indices.load(&mut store, &instance);
        match guests {
            Ok(guests) => Ok(Box::new(Instance { store, guests })),
            Err(e) => Err(fail(e, &mut store)),
        }
    }

    /// Fills the pool to `n` idle instances (at least one, at most the pool's size).
    pub async fn warm(&self, n: usize) -> Result<(), PluginError> {
        let want = n.clamp(1, self.pool_size.max(1));
        while self.idle_instances() < want {
            let instance = self
                .instantiate(Instant::now() + self.hard_timeout)
                .await
                .map_err(|f| PluginError::Instantiate { name: self.name.to_string(), message: f.message })?;
            self.give_back(instance);
        }
        Ok(())
    }

    fn give_back(&self, instance: Box<Instance>) {
        let mut pool = self.pool.lock();
        if pool.len() < self.pool_size.max(1) {
            pool.push(instance);
        }
        // Otherwise the surplus instance is dropped here, after the guard (locals drop
        // before parameters), so freeing its slot never holds up other calls.
    }

    /// Idle instances in the pool.
    pub fn idle_instances(&self) -> usize {
        self.pool.lock().len()
    }

    /// Drops every idle instance (tests and benchmarks measure fresh instantiation this way).
    pub fn drain_pool(&self) {
        // Freed outside the lock: resetting instance slots takes a while.
        let idle = std::mem::take(&mut *self.pool.lock());
        drop(idle);
    }

    /// Says why a call failed, naming the limit that was hit where there is one.
    fn describe(&self, e: &wasmtime::Error, store: &mut Store<StoreState>) -> String {
        if let Some(hit) = e.downcast_ref::<LimitHit>() {
            return hit.to_string();
        }
        if let Some(Trap::Interrupt) = e.downcast_ref::<Trap>() {
            return format!("deadline of {} ms exceeded: the call was interrupted", self.settings.limits.deadline_ms);
        }
        let mut message = format!("trap: {}", chain(e));
        if let Some(log) = store.data_mut().last_error_log.take() {
            message.push_str(&format!(" (last error logged by the plugin: {log})"));
        }
        message
    }

    fn fail(&self, message: String, timeout: bool) -> Failure {
        tracing::warn!(plugin = %self.name, version = %self.settings.version, "plugin call failed: {message}");
        if self.stats.record_failure(message.clone(), timeout, &self.quarantine) {
            tracing::error!(
                plugin = %self.name,
                failures = self.quarantine.failures,
                window_ms = self.quarantine.window_ms,
                "plugin quarantined for {} ms after repeated failures; its hooks answer by failure policy",
                self.quarantine.duration_ms
            );
        }
        Failure { message }
    }

    /// Calls the hook `input` is for. A quarantined plugin is not called.
    pub async fn invoke(&self, input: Input<'_>) -> Result<Output, Failure> {
        if let Some(left) = self.stats.quarantine_left() {
            return Err(Failure { message: format!("quarantined for another {} ms", left.as_millis()) });
        }
        // A call reads the clock twice (a read costs ~25 ns on a VM): here, and when it
        // ends, to time it for the stats. The host calls' deadline derives from this one.
        let started = Instant::now();
        let deadline = started + self.hard_timeout;
        let pooled = self.pool.lock().pop();
        let mut instance = match pooled {
            Some(i) => i,
            None => match self.instantiate(deadline).await {
                Ok(i) => i,
                Err(f) => {
                    self.stats.record_call(started.elapsed());
                    return Err(self.fail(f.message, false));
                }
            },
        };
        let Instance { store, guests } = &mut *instance;
        store.set_epoch_deadline(self.epoch_ticks);
        let data = store.data_mut();
        data.host_calls = 0;
        data.last_error_log = None;
        data.deadline = deadline;
        let running = self.ticking.running();
        let result = guests.call(store, input).await;
        drop(running);
        self.stats.record_call(started.elapsed());
        let recorder = self.recorder.load();
        match result {
            Ok(output) => {
                self.give_back(instance);
                if let Some(recorder) = recorder.as_ref() {
                    recorder.record(self.ctx.clock.now_ms(), input, Ok(&output));
                }
                Ok(output)
            }
            Err(e) => {
                let timeout = matches!(e.downcast_ref::<Trap>(), Some(Trap::Interrupt))
                    || matches!(e.downcast_ref::<LimitHit>(), Some(LimitHit::HostTimeout(_)));
                let message = self.describe(&e, &mut instance.store);
                if let Some(recorder) = recorder.as_ref() {
                    recorder.record(self.ctx.clock.now_ms(), input, Err(&message));
                }
                Err(self.fail(message, timeout))
            }
        }
    }
}
