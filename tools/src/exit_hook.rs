//! Cleanup at normal process exit for process-wide state that is never dropped.
//!
//! Statics (the fork servers' registry, the warm pool, the shell sessions) own files in TMPDIR
//! and child processes, but Rust never drops a static, and not every host calls a shutdown
//! function before it exits (a test binary, an embedder). A C `atexit` hook runs on every
//! normal exit, whatever the host: from `main` returning, `std::process::exit`, or the Python
//! interpreter's own exit. Hooks must never block: a lock held by a thread that exit() froze
//! would hang the process, so they use `try_lock` and give up.

use std::sync::Once;

/// Registers `hook` to run at normal process exit, once per `once` however often this is
/// called. `if_not` is logged (a warning) in the unlikely case libc cannot register it: what is
/// then left behind.
pub fn register(once: &'static Once, hook: extern "C" fn(), if_not: &str) {
    once.call_once(|| {
        // SAFETY: registering a plain `extern "C" fn()` that takes no arguments; libc calls it
        // once, at exit, on the exiting thread.
        if unsafe { libc::atexit(hook) } != 0 {
            tracing::warn!("cannot register an exit hook: {if_not}");
        }
    });
}
