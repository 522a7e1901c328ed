//! Running executions by task id, process-wide, so `interrupt(task_id)` reaches an execution
//! whoever started it — `vibeos_exec.execute_code`, or the `execute_code` tool dispatched
//! through `handle_function_call` (an agent loop that registered it), which has no handle of
//! its own to give back.

use crate::request::Interrupt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

type Running = HashMap<String, Vec<(u64, Interrupt)>>;

fn running() -> MutexGuard<'static, Running> {
    static RUNNING: OnceLock<Mutex<Running>> = OnceLock::new();
    RUNNING
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Keeps one execution findable by its task id until dropped.
#[derive(Debug)]
pub struct Tracked {
    key: String,
    serial: u64,
}

/// Makes `interrupt` reachable through [`interrupt`]`(task_id)` (an empty id when `None`)
/// while the returned guard lives.
pub fn track(task_id: Option<&str>, interrupt: Interrupt) -> Tracked {
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    let key = task_id.unwrap_or_default().to_string();
    running()
        .entry(key.clone())
        .or_default()
        .push((serial, interrupt));
    Tracked { key, serial }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut map = running();
        if let Some(list) = map.get_mut(&self.key) {
            list.retain(|(s, _)| *s != self.serial);
            if list.is_empty() {
                map.remove(&self.key);
            }
        }
    }
}

/// Interrupts every tracked execution of `task_id`; returns how many.
pub fn interrupt(task_id: &str) -> usize {
    let map = running();
    let list = map.get(task_id).map(Vec::as_slice).unwrap_or_default();
    for (_, i) in list {
        i.interrupt();
    }
    list.len()
}

/// Interrupts every tracked execution; returns how many.
pub fn interrupt_all() -> usize {
    let map = running();
    let mut n = 0;
    for (_, i) in map.values().flatten() {
        i.interrupt();
        n += 1;
    }
    n
}

/// How many tracked executions are running.
pub fn count() -> usize {
    running().values().map(Vec::len).sum()
}
