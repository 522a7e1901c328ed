//! One environment per task id: created on first use, reused by later calls of that task,
//! stopped after `terminal.lifetime_seconds` idle and at host exit (SPEC §9).
//!
//! An environment counts as busy while anyone holds its handle (an execution, a tool call), so
//! the idle sweep never stops one under a running script however long it runs.

use super::settings::{BackendKind, BackendSettings};
use super::{EnvError, EnvHandle};
use crate::{ToolContext, ToolError};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

/// Task key of calls that carry no task id.
pub const DEFAULT_TASK: &str = "default";

/// How often a command of an environment's start looks whether the host began to stop.
pub(crate) const ABANDON_POLL: Duration = Duration::from_millis(100);

thread_local! {
    /// While this thread starts an environment: the flag its [`Environments`] raises when the
    /// host stops, so that the start's commands ([`super::collect`]) give up at once instead of
    /// holding the host's exit for their whole timeout (an ssh master's 30 s).
    static STARTING_FOR: std::cell::RefCell<Option<Arc<AtomicBool>>> =
        const { std::cell::RefCell::new(None) };
}

/// Whether the environment this thread is starting is no longer wanted.
pub(crate) fn start_abandoned() -> bool {
    STARTING_FOR.with(|s| {
        s.borrow()
            .as_ref()
            .is_some_and(|flag| flag.load(Ordering::SeqCst))
    })
}

/// Marks this thread as starting an environment of `envs` until dropped.
struct Starting;

impl Starting {
    fn mark(stopping: &Arc<AtomicBool>) -> Starting {
        STARTING_FOR.with(|s| *s.borrow_mut() = Some(Arc::clone(stopping)));
        Starting
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        STARTING_FOR.with(|s| *s.borrow_mut() = None);
    }
}

struct Slot {
    /// Created lazily under the slot's own lock, so two calls of one task never race to create
    /// two containers while calls of other tasks proceed.
    env: Arc<Mutex<Option<EnvHandle>>>,
    last_used: Instant,
}

/// The environments of the active backend.
pub struct Environments {
    settings: BackendSettings,
    slots: Mutex<BTreeMap<String, Slot>>,
    /// Raised by [`Environments::stop_all`]: a start still under way gives up.
    stopping: Arc<AtomicBool>,
}

static ACTIVE: RwLock<Option<Arc<Environments>>> = RwLock::new(None);

/// Makes `settings` the process-wide backend choice (replacing an earlier one, whose
/// environments are stopped) and starts the idle sweep. A `local` choice clears it: tools then
/// run in this process as they always did.
pub fn activate(settings: BackendSettings) -> Option<Arc<Environments>> {
    let new = (settings.backend != BackendKind::Local).then(|| {
        Arc::new(Environments {
            settings,
            slots: Mutex::new(BTreeMap::new()),
            stopping: Arc::new(AtomicBool::new(false)),
        })
    });
    let old = match ACTIVE.write() {
        Ok(mut g) => std::mem::replace(&mut *g, new.clone()),
        Err(_) => None,
    };
    if let Some(old) = old {
        old.stop_all();
    }
    if let Some(envs) = &new {
        let weak = Arc::downgrade(envs);
        let tick =
            (envs.settings.lifetime / 4).clamp(Duration::from_millis(200), Duration::from_secs(5));
        let spawned = std::thread::Builder::new()
            .name("vibeos-env-idle".into())
            .spawn(move || idle_sweep(weak, tick));
        if let Err(e) = spawned {
            tracing::warn!(
                "backends: cannot start the idle sweep (environments will only stop at exit): {e}"
            );
        }
    }
    new
}

fn idle_sweep(envs: Weak<Environments>, tick: Duration) {
    loop {
        std::thread::sleep(tick);
        let Some(envs) = envs.upgrade() else { return };
        envs.stop_idle();
    }
}

/// The active non-local backend, if any.
pub fn active() -> Option<Arc<Environments>> {
    ACTIVE.read().ok().and_then(|g| g.clone())
}

/// Stops every environment of the active backend (host exit).
pub fn shutdown() {
    if let Some(envs) = active() {
        envs.stop_all();
    }
}

/// The remote environment a tool call of `ctx` must run in, or `None` to run here.
pub fn remote_for(ctx: &ToolContext) -> Result<Option<EnvHandle>, ToolError> {
    match active() {
        None => Ok(None),
        Some(envs) => envs
            .get(ctx.task_id.as_deref())
            .map(Some)
            .map_err(|e| ToolError::new(crate::ToolErrorKind::BackendError, e.to_string())),
    }
}

impl Environments {
    /// The settings in force.
    pub fn settings(&self) -> &BackendSettings {
        &self.settings
    }

    /// The environment of `task` (created on first use).
    pub fn get(&self, task: Option<&str>) -> Result<EnvHandle, EnvError> {
        let key = task.filter(|t| !t.is_empty()).unwrap_or(DEFAULT_TASK);
        let cell = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            let slot = slots.entry(key.to_string()).or_insert_with(|| Slot {
                env: Arc::new(Mutex::new(None)),
                last_used: Instant::now(),
            });
            slot.last_used = Instant::now();
            Arc::clone(&slot.env)
        };
        let mut guard = cell.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(env) = guard.as_ref() {
            return Ok(Arc::clone(env));
        }
        let env = {
            let _starting = Starting::mark(&self.stopping);
            super::start(&self.settings, key)?
        };
        if self.stopping.load(Ordering::SeqCst) {
            // Made after stop_all went by: nobody else would stop it.
            env.stop();
            return Err(EnvError::Abandoned {
                backend: self.settings.backend.as_str(),
                what: "starting the environment".into(),
            });
        }
        *guard = Some(Arc::clone(&env));
        Ok(env)
    }

    /// Task ids with a live environment.
    pub fn live_tasks(&self) -> Vec<String> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .iter()
            .filter(|(_, s)| s.env.lock().map(|g| g.is_some()).unwrap_or(false))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Stops environments idle for longer than `lifetime_seconds` that nobody holds.
    pub fn stop_idle(&self) {
        let lifetime = self.settings.lifetime;
        let idle: Vec<EnvHandle> = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            let mut out = Vec::new();
            slots.retain(|task, slot| {
                if slot.last_used.elapsed() < lifetime {
                    return true;
                }
                let Ok(mut g) = slot.env.try_lock() else {
                    return true;
                };
                match g.as_ref() {
                    // One reference is the slot's own; more means someone is using it.
                    Some(env) if Arc::strong_count(env) > 1 => true,
                    Some(_) => {
                        tracing::info!("backends: stopping the idle environment of task {task}");
                        out.extend(g.take());
                        false
                    }
                    None => false,
                }
            });
            out
        };
        for env in idle {
            env.stop();
        }
    }

    /// Stops every environment.
    pub fn stop_all(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let envs: Vec<EnvHandle> = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            let all = std::mem::take(&mut *slots);
            all.into_values()
                .filter_map(|s| s.env.lock().ok().and_then(|mut g| g.take()))
                .collect()
        };
        for env in envs {
            env.stop();
        }
    }
}
