//! Running availability checks (`check_fn`) safely: each distinct check once per build, on its
//! own thread, bounded by a timeout (built-in checks marked instant run inline).
//!
//! A check is user- or plugin-supplied code that may probe the network or a binary, so it can
//! fail in three ways besides returning `false`: it can panic (unavailable, with the message), it
//! can hang (unavailable once the timeout passes; the stuck thread is remembered so later builds
//! do not pile up more threads on the same stuck check), or it can be slow (all distinct checks of
//! a build run concurrently, so a build waits at most one timeout). Checks are identified by the
//! address of their `Arc`, which is what "one shared check" means: several tools holding clones of
//! the same `Arc` run it once.

use crate::entry::{panic_message, CheckFn, ToolEntry};
use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a `check_fn` may run before its tool counts as unavailable.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// Whether a tool is usable now, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// Usable.
    Available,
    /// Not usable; the text says why (check result, panic, timeout, missing variables).
    Unavailable(String),
}

impl Availability {
    /// Whether the tool is usable.
    pub fn is_available(&self) -> bool {
        matches!(self, Availability::Available)
    }
}

/// Result of running one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CheckOutcome {
    Passed,
    Failed,
    Panicked(String),
    TimedOut(Duration),
    StillHung,
}

/// Identity of a shared check.
fn check_key(check: &CheckFn) -> usize {
    Arc::as_ptr(check) as *const () as usize
}

/// Checks abandoned after a timeout that have not returned yet.
fn hung() -> &'static Mutex<HashSet<usize>> {
    static HUNG: OnceLock<Mutex<HashSet<usize>>> = OnceLock::new();
    HUNG.get_or_init(Default::default)
}

#[derive(Default)]
struct RunState {
    done: bool,
    abandoned: bool,
}

// Lives here rather than with the entry type, so that entries do not depend on the machinery
// that runs their checks.
impl ToolEntry {
    /// Whether the tool is usable now (its check passes within the default timeout, or it has
    /// none). A panicking or hanging check counts as unavailable.
    pub fn is_available(&self) -> bool {
        availability_of(&[Arc::new(self.clone())], DEFAULT_CHECK_TIMEOUT)
            .first()
            .is_some_and(Availability::is_available)
    }
}

/// Runs every distinct check among `entries` once, concurrently, and returns each tool's
/// availability in `entries` order.
pub(crate) fn availability_of(entries: &[Arc<ToolEntry>], timeout: Duration) -> Vec<Availability> {
    let mut checks: HashMap<usize, CheckFn> = HashMap::new();
    let mut instant: HashMap<usize, CheckFn> = HashMap::new();
    for e in entries {
        if let Some(holder) = &e.check_fn {
            let to = if e.check_is_instant {
                &mut instant
            } else {
                &mut checks
            };
            to.entry(check_key(&holder.0))
                .or_insert_with(|| Arc::clone(&holder.0));
        }
    }
    // A check shared with a tool that did not declare it instant keeps its thread and timeout.
    instant.retain(|key, _| !checks.contains_key(key));
    let mut outcomes = run_checks(checks, timeout);
    for (key, check) in instant {
        outcomes.insert(key, run_one(&check));
    }
    entries
        .iter()
        .map(|e| {
            let outcome = e
                .check_fn
                .as_ref()
                .and_then(|h| outcomes.get(&check_key(&h.0)));
            describe(e, outcome)
        })
        .collect()
}

fn describe(entry: &ToolEntry, outcome: Option<&CheckOutcome>) -> Availability {
    let why = match outcome {
        None | Some(CheckOutcome::Passed) => return Availability::Available,
        Some(CheckOutcome::Failed) => "check failed".to_string(),
        Some(CheckOutcome::Panicked(m)) => format!("check raised an error: {m}"),
        Some(CheckOutcome::TimedOut(t)) => {
            format!("check did not finish within {}s", t.as_secs_f64())
        }
        Some(CheckOutcome::StillHung) => {
            "check is still running from an earlier call (hung)".to_string()
        }
    };
    let missing: Vec<&str> = entry
        .requires_env
        .iter()
        .map(String::as_str)
        .filter(|v| std::env::var_os(v).is_none_or(|x| x.is_empty()))
        .collect();
    if missing.is_empty() {
        Availability::Unavailable(why)
    } else {
        Availability::Unavailable(format!("{why}; missing env: {}", missing.join(", ")))
    }
}

/// Runs one check on this thread; a panic is an outcome, not a crash.
fn run_one(check: &CheckFn) -> CheckOutcome {
    match catch_unwind(AssertUnwindSafe(|| check())) {
        Ok(true) => CheckOutcome::Passed,
        Ok(false) => CheckOutcome::Failed,
        Err(p) => CheckOutcome::Panicked(panic_message(p.as_ref())),
    }
}

fn run_checks(checks: HashMap<usize, CheckFn>, timeout: Duration) -> HashMap<usize, CheckOutcome> {
    let mut outcomes = HashMap::with_capacity(checks.len());
    let (tx, rx) = mpsc::channel::<(usize, CheckOutcome)>();
    let mut pending: HashMap<usize, Arc<Mutex<RunState>>> = HashMap::new();
    for (key, check) in checks {
        if hung()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&key)
        {
            outcomes.insert(key, CheckOutcome::StillHung);
            continue;
        }
        let state = Arc::new(Mutex::new(RunState::default()));
        let thread_state = Arc::clone(&state);
        let tx = tx.clone();
        let spawned = std::thread::Builder::new()
            .name("vibeos-check".into())
            .spawn(move || {
                let outcome = run_one(&check);
                let mut st = thread_state.lock().unwrap_or_else(|p| p.into_inner());
                st.done = true;
                if st.abandoned {
                    hung()
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&key);
                }
                let _ = tx.send((key, outcome));
            });
        match spawned {
            Ok(_) => {
                pending.insert(key, state);
            }
            Err(e) => {
                outcomes.insert(
                    key,
                    CheckOutcome::Panicked(format!("cannot start a thread for the check: {e}")),
                );
            }
        }
    }
    drop(tx);
    let deadline = Instant::now() + timeout;
    while !pending.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((key, outcome)) => {
                pending.remove(&key);
                outcomes.insert(key, outcome);
            }
            Err(_) => break,
        }
    }
    for (key, state) in pending {
        let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
        if st.done {
            // Finished between the deadline and now: take its answer.
            drop(st);
            while let Ok((k, outcome)) = rx.try_recv() {
                outcomes.insert(k, outcome);
            }
            outcomes
                .entry(key)
                .or_insert(CheckOutcome::TimedOut(timeout));
        } else {
            st.abandoned = true;
            hung().lock().unwrap_or_else(|p| p.into_inner()).insert(key);
            tracing::warn!(
                "a tool availability check did not finish within {}s; its tools count as unavailable",
                timeout.as_secs_f64()
            );
            outcomes.insert(key, CheckOutcome::TimedOut(timeout));
        }
    }
    outcomes
}
