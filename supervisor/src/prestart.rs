//! The interpreter of a one-shot host's only execution, started before the host has finished
//! starting itself.
//!
//! `vibeos-exec run` pays for its own start (logging, the tool registry, the async runtime, the
//! stub, the approval guard) before a cold execution would start the interpreter, and the
//! interpreter's start is the longest part of a no-op run. [`prestart`] starts the interpreter
//! as soon as the request is known, exactly as the cold path would (same staging dir, channel,
//! environment, reaper and, in strict mode, confinement), except that `script.py` is a FIFO
//! ([`crate::script_feed`]): the interpreter finishes starting on the other core and then waits
//! in its read of the script. [`crate::execute()`] takes it, writes the stub, runs the guard and
//! releases the script; what follows is the cold path's supervision. A request whose launch key
//! differs (or whose environment changed) discards it and starts cold, so a prestart can make a
//! run faster but never different.
//!
//! Long-lived hosts have the fork server and the pool instead; while either is on, or a remote
//! backend is active, [`prestart`] does nothing.

use crate::launch::{launch, with_channel, LaunchKey, LaunchSpec, Launched, Program, Staging};
use crate::request::ExecutionRequest;
use std::sync::Mutex;

/// The prestarted interpreter waiting for its script, with the key it was started for.
struct Prestarted {
    key: LaunchKey,
    launched: Option<Launched>,
}

impl Drop for Prestarted {
    fn drop(&mut self) {
        if let Some(l) = self.launched.take() {
            l.discard(true);
        }
    }
}

static SLOT: Mutex<Option<Prestarted>> = Mutex::new(None);

/// Starts the interpreter for `request` now, so that the next [`crate::execute()`] of a request
/// with the same launch settings takes it instead of starting one. Returns whether one was
/// started; a failure is not reported here (the execution then starts cold and reports it).
///
/// The launch runs on the caller's thread: handing it to a thread of its own, so the caller
/// could go on while the spawn waits for the interpreter's exec, measured slower on two cores
/// (the thread competes with the reaper and the interpreter it starts).
pub fn prestart(request: &ExecutionRequest) -> bool {
    if crate::zygote::enabled()
        || crate::pool::active().is_some()
        || vibeos_tools::environments::active().is_some()
        || request.code.trim().is_empty()
    {
        return false;
    }
    let Ok(spec) = LaunchSpec::for_request(request) else {
        return false;
    };
    let launched = match Staging::create(spec.disk_budget())
        .and_then(|staging| launch(&spec, staging, Program::Fifo))
    {
        Ok(l) => l,
        Err(e) => {
            tracing::debug!("execute_code: prestart failed: {e}");
            return false;
        }
    };
    let previous = SLOT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .replace(Prestarted {
            key: spec.key(),
            launched: Some(launched),
        });
    drop(previous);
    true
}

/// The prestarted interpreter, if there is one for `spec`'s key and the environment `spec`
/// gives it now is the one it was started with; any other is discarded.
pub(crate) fn take(spec: &LaunchSpec) -> Option<Launched> {
    let mut prestarted = SLOT.lock().unwrap_or_else(|p| p.into_inner()).take()?;
    if prestarted.key != spec.key() {
        return None;
    }
    let mut launched = prestarted.launched.take()?;
    let current = spec
        .child_env(launched.staging.path(), true)
        .map(|env| with_channel(env, &launched.channel_vars));
    let same_env = current.as_ref().is_ok_and(|env| *env == launched.env);
    if !same_env || launched.has_exited() {
        launched.discard(true);
        return None;
    }
    Some(launched)
}

/// Discards a prestarted interpreter nobody took (the run ended before it reached one).
pub fn discard() {
    let prestarted = SLOT.lock().unwrap_or_else(|p| p.into_inner()).take();
    drop(prestarted);
}
