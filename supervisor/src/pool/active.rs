//! The process-wide pool: one [`Pool`] per process that every [`crate::execute()`] call uses once a
//! host turned it on, and the exit hook that cleans it up. Kept apart from the pool itself
//! because it is global state with its own rules (owner pid after fork, no blocking at exit).

use super::{take_all, Pool, PoolStats};
use crate::config::MAX_POOL_SIZE;
use crate::launch::LaunchSpec;
use crate::request::ExecutionRequest;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

static ACTIVE: Mutex<Option<Arc<Pool>>> = Mutex::new(None);
/// Set once the process is exiting: pooled entries dropped then must not block on cleanup.
pub(super) static EXITING: AtomicBool = AtomicBool::new(false);
static AT_EXIT: std::sync::Once = std::sync::Once::new();

fn active_slot() -> MutexGuard<'static, Option<Arc<Pool>>> {
    ACTIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Tells confinement whose pool `slot` now holds (it refuses a pinned uid while a pool is on).
fn publish(slot: &Option<Arc<Pool>>) {
    crate::confine::note_pool_owner(slot.as_ref().map(|p| p.owner_pid));
}

/// Turns the process-wide pool on with `size` interpreters (`code_execution.pool_size`), or off
/// with 0. Calling it again with another size replaces the pool; with the same size it does
/// nothing. From then on every [`crate::execute()`] call of this process uses it.
pub fn enable(size: usize) {
    if size == 0 {
        disable();
        return;
    }
    let size = size.min(MAX_POOL_SIZE);
    let old = {
        let mut slot = active_slot();
        if slot
            .as_ref()
            .is_some_and(|p| p.shared.size == size && p.owner_pid == std::process::id())
        {
            return;
        }
        let old = match Pool::new(size) {
            Ok(pool) => slot.replace(Arc::new(pool)),
            Err(e) => {
                tracing::warn!("execute_code: {e}");
                slot.take()
            }
        };
        publish(&slot);
        old
    };
    if let Some(old) = old {
        old.shutdown();
    }
    vibeos_tools::exit_hook::register(
        &AT_EXIT,
        clean_up_at_exit,
        "the pool's idle interpreters still die with this process, but their staging dirs may \
         be left in TMPDIR",
    );
}

/// Shuts the process-wide pool down: idle interpreters are killed and their staging dirs
/// removed. Later calls start cold until [`enable`] is called again.
pub fn disable() {
    let old = {
        let mut slot = active_slot();
        let old = slot.take();
        publish(&slot);
        old
    };
    if let Some(old) = old {
        old.shutdown();
    }
}

/// The process-wide pool, if enabled in this process.
pub fn active() -> Option<Arc<Pool>> {
    active_slot()
        .as_ref()
        .filter(|p| p.owner_pid == std::process::id())
        .cloned()
}

/// Figures of the process-wide pool; `None` when it is off.
pub fn stats() -> Option<PoolStats> {
    active().map(|p| p.stats())
}

/// Waits until the process-wide pool has `n` idle interpreters for calls like `request` (any
/// call with `None`); false on timeout or when the pool is off.
pub fn wait_until_idle(request: Option<&ExecutionRequest>, n: usize, timeout: Duration) -> bool {
    active().is_some_and(|p| p.wait_until_idle(request, n, timeout))
}

/// Fills the process-wide pool for calls like `request` before the first one arrives. Errors
/// (bad cwd, no interpreter) are left for the call itself to report.
pub fn prewarm(request: &ExecutionRequest) {
    let Some(pool) = active() else { return };
    if let Ok(spec) = LaunchSpec::for_request(request) {
        pool.prewarm_spec(&spec);
    }
}

extern "C" fn clean_up_at_exit() {
    EXITING.store(true, Ordering::SeqCst);
    // Never block at exit: a lock held by a thread that exit() froze would hang the process.
    let pool = match ACTIVE.try_lock() {
        Ok(mut slot) => {
            let pool = slot.take();
            publish(&slot);
            pool
        }
        Err(_) => return,
    };
    let Some(pool) = pool else { return };
    if pool.owner_pid != std::process::id() {
        std::mem::forget(pool);
        return;
    }
    for _ in 0..100 {
        if let Ok(mut st) = pool.shared.state.try_lock() {
            st.shutdown = true;
            let idle = take_all(&mut st);
            let starting = st.starting_dir.take();
            drop(st);
            drop(idle);
            if let Some(dir) = starting {
                crate::confine::staging::remove_at_exit(&dir);
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // The refill thread may be in the middle of a start: do not join it at exit.
    std::mem::forget(pool);
}
