//! One environment per task id: created on first use, reused by later calls of that task,
//! stopped after `terminal.lifetime_seconds` idle and at host exit (SPEC §9).
//!
//! An environment counts as busy while anyone holds its handle (an execution, a tool call), so
//! the idle sweep never stops one under a running script however long it runs.

use super::settings::{BackendKind, BackendSettings};
use super::{EnvError, EnvHandle};
use crate::{ToolContext, ToolError};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

/// Task key of calls that carry no task id.
pub const DEFAULT_TASK: &str = "default";

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
        let env = super::start(&self.settings, key)?;
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
