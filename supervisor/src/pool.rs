//! Warm interpreter pool: pre-started, single-use interpreters, so a call pays for one write to a waiting process
//! instead of an interpreter start.
//!
//! A cold `python -u script.py` with the stub's imports costs tens of milliseconds; most of it is
//! the interpreter's own start and the imports of `json`, `socket` and `threading`. The pool
//! does that work ahead of time. Each pooled interpreter is launched by the same code as a cold
//! child ([`crate::execute`]): its own staging dir, RPC channel and token, the scrubbed
//! environment, its own reaper (own session, subreaper, lifeline), and in strict mode the same
//! landlock/seccomp/uid confinement — so the staging dir exists before the interpreter does and
//! belongs to the entry. Instead of a script it runs a small bootstrap (`pool_boot.py`) that
//! imports `json, os, socket, threading, time`, reports ready on a pipe, and blocks reading one
//! JSON line from a control channel (a socketpair). At claim time the supervisor writes the stub and the script
//! into the entry's staging dir and sends `{"set": {...}, "unset": [...]}`: the difference
//! between the environment the call wants and the one the interpreter started with. The
//! bootstrap applies it to `os.environ`, closes both descriptors, and runs the script as a fresh
//! `__main__` module: `__name__ == "__main__"`, `__file__` and `sys.argv == [script]`,
//! `sys.path[0]` the staging dir, tracebacks without the bootstrap's frame, exit codes as from
//! `python -u script.py`. From then on the supervision (timeout, interrupt, capture, budget,
//! cleanup) is the cold path's.
//!
//! **Isolation.** An interpreter runs one script and is discarded; the pool refills in the
//! background. Nothing can pass between executions: each has its own process (so modules,
//! monkeypatches, threads and the environment die with it), its own staging dir (removed at the
//! end) and its own channel; the control channel and readiness pipe are closed before the script runs.
//!
//! **When the pool is not used.** Entries are keyed by mode, interpreter, session dir (project
//! mode), strict settings and kill grace; a call with another key starts cold (and the pool
//! then fills for that key, evicting idle entries of the least recently used key so it never
//! holds more than its size). Per-call environment differences — passthrough variables of a
//! skill loaded later, a changed variable of the host — are applied before the script runs,
//! unless they touch a variable the interpreter reads at startup (`PYTHON*`, `LD_*`, `LC_*`,
//! `LANG`, `LANGUAGE`, `HOME`, `TZ`, `MALLOC_*`, `GLIBC_TUNABLES`) or are not UTF-8: then the
//! entry (and its siblings started with the same stale environment) is discarded and the call
//! starts cold. An empty pool never delays a call: it starts cold.
//!
//! **Hosts.** The pool is process-wide and off by default, so the one-shot CLI never
//! pre-starts interpreters it would not use (it starts its one interpreter early instead:
//! [`crate::prestart`]). A long-lived host turns it on once:
//!
//! ```no_run
//! # let config = vibeos_supervisor::Config::default();
//! vibeos_supervisor::pool::enable(config.pool_size);
//! ```
//!
//! after which every [`crate::execute()`] consults it transparently. [`disable`] shuts it down
//! (idle interpreters killed, their staging dirs removed); so does normal process exit, through
//! an `atexit` hook, and a killed host's interpreters die through their reapers' lifelines.
//! [`prewarm`] fills the pool for a request before its first call; [`stats`] and
//! [`wait_until_idle`] are for monitoring, tests and benchmarks.
//!
//! **Exit.** The bootstrap ends the script as the interpreter's exit would (status, threads,
//! atexit, the script's globals released, stdio flushed) but skips tearing down every module,
//! which costs more than the rest of a small warm call. What a script could tell apart from a
//! cold start, and the alternatives considered, are in docs/warm-pool.md.

use crate::error::StartError;
use crate::launch::{
    launch, with_channel, LaunchKey, LaunchSpec, Launched, OnDone, Program, Staging,
};
use crate::request::ExecutionRequest;
use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod active;

pub use crate::config::{DEFAULT_POOL_SIZE, MAX_POOL_SIZE};
use active::EXITING;
pub use active::{active, disable, enable, prewarm, stats, wait_until_idle};

/// How long a pooled interpreter may take to finish its imports before it counts as failed.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest a refill waits for the fork servers to go idle (a long-running forked script
/// must not keep the pool dry).
const REFILL_DEFERRAL: Duration = Duration::from_secs(2);

/// Consecutive failed starts after which a key is no longer refilled (until its spec changes).
const MAX_FAILURES: u32 = 3;

/// Keys remembered without entries, beyond which the least recently used empty ones are dropped.
const MAX_SLOTS: usize = 8;

/// Figures of the pool, for monitoring and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Configured size.
    pub size: usize,
    /// Interpreters ready to take a script.
    pub idle: usize,
    /// Interpreters being started.
    pub starting: usize,
    /// Calls that ran in a pooled interpreter.
    pub warm_starts: u64,
    /// Calls that found no usable pooled interpreter and started cold.
    pub cold_starts: u64,
}

/// One idle, pre-started interpreter.
struct Entry {
    launched: Option<Launched>,
    /// Our end of the control channel; the bootstrap exits quietly at its EOF.
    control: Option<std::os::unix::net::UnixStream>,
}

impl Drop for Entry {
    fn drop(&mut self) {
        drop(self.control.take());
        if let Some(l) = self.launched.take() {
            l.discard(!EXITING.load(Ordering::SeqCst));
        }
    }
}

struct Slot {
    key: LaunchKey,
    spec: LaunchSpec,
    idle: VecDeque<Entry>,
    starting: usize,
    last_used: u64,
    failures: u32,
    /// Bumped when the spec's environment changed incompatibly: entries started under an older
    /// generation are not added.
    generation: u64,
}

#[derive(Default)]
struct State {
    slots: Vec<Slot>,
    shutdown: bool,
    clock: u64,
    warm_starts: u64,
    cold_starts: u64,
    /// Staging dir of the interpreter being started, removed at exit if it never arrives.
    starting_dir: Option<PathBuf>,
}

impl State {
    fn total(&self) -> usize {
        self.slots.iter().map(|s| s.idle.len() + s.starting).sum()
    }
}

struct Shared {
    size: usize,
    state: Mutex<State>,
    /// Wakes the refill worker.
    work: Condvar,
    /// Signals that an entry became idle.
    filled: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A pool of pre-started interpreters with its refill thread. Dropping it shuts it down.
pub struct Pool {
    shared: Arc<Shared>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The process that created the pool; a forked copy of the host must not use or clean it.
    owner_pid: u32,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("stats", &self.stats())
            .finish()
    }
}

/// Why the pool could not be started.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The refill thread could not be started.
    #[error("cannot start the interpreter pool's refill thread: {0}; execute_code keeps starting interpreters cold")]
    Thread(std::io::Error),
}

impl Pool {
    /// A pool holding at most `size` interpreters (`size` ≥ 1), refilled by its own thread.
    pub fn new(size: usize) -> Result<Pool, PoolError> {
        let shared = Arc::new(Shared {
            size: size.clamp(1, MAX_POOL_SIZE),
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            filled: Condvar::new(),
        });
        let for_worker = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name("vibeos-pool".into())
            .spawn(move || refill_loop(&for_worker))
            .map_err(PoolError::Thread)?;
        Ok(Pool {
            shared,
            worker: Mutex::new(Some(worker)),
            owner_pid: std::process::id(),
        })
    }

    /// Current figures.
    pub fn stats(&self) -> PoolStats {
        let st = self.shared.lock();
        PoolStats {
            size: self.shared.size,
            idle: st.slots.iter().map(|s| s.idle.len()).sum(),
            starting: st.slots.iter().map(|s| s.starting).sum(),
            warm_starts: st.warm_starts,
            cold_starts: st.cold_starts,
        }
    }

    /// Waits until at least `n` interpreters (capped at the size) are idle for calls like
    /// `request` (for any call with `None`); false on timeout.
    pub fn wait_until_idle(
        &self,
        request: Option<&ExecutionRequest>,
        n: usize,
        timeout: Duration,
    ) -> bool {
        let key = match request.map(LaunchSpec::for_request) {
            None => None,
            Some(Ok(spec)) => Some(spec.key()),
            Some(Err(_)) => return false,
        };
        let want = n.min(self.shared.size);
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        loop {
            let idle: usize = st
                .slots
                .iter()
                .filter(|s| key.as_ref().is_none_or(|k| *k == s.key))
                .map(|s| s.idle.len())
                .sum();
            if idle >= want {
                return true;
            }
            let now = Instant::now();
            if now >= deadline || st.shutdown {
                return false;
            }
            st = self
                .shared
                .filled
                .wait_timeout(st, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Stops the refill thread and kills every idle interpreter, removing its staging dir.
    pub fn shutdown(&self) {
        let idle = {
            let mut st = self.shared.lock();
            st.shutdown = true;
            take_all(&mut st)
        };
        self.shared.work.notify_all();
        self.shared.filled.notify_all();
        drop(idle);
        let worker = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(w) = worker {
            let _ = w.join();
        }
    }

    /// Records `spec` as the one to refill for and makes room for it.
    fn note(st: &mut State, spec: &LaunchSpec) -> usize {
        st.clock += 1;
        let clock = st.clock;
        let key = spec.key();
        let idx = match st.slots.iter().position(|s| s.key == key) {
            Some(i) => i,
            None => {
                st.slots.push(Slot {
                    key,
                    spec: spec.clone(),
                    idle: VecDeque::new(),
                    starting: 0,
                    last_used: clock,
                    failures: 0,
                    generation: 0,
                });
                st.slots.len() - 1
            }
        };
        let slot = &mut st.slots[idx];
        if slot.spec.base_env != spec.base_env || slot.spec.passthrough != spec.passthrough {
            slot.failures = 0;
        }
        slot.spec = spec.clone();
        slot.last_used = clock;
        idx
    }

    /// Evicts idle entries of less recently used keys while the pool is full and slot `idx` is
    /// not. Returns the evicted entries, to be dropped outside the lock.
    fn make_room(st: &mut State, size: usize, idx: usize) -> Vec<Entry> {
        let mut evicted = Vec::new();
        let key = st.slots[idx].key.clone();
        loop {
            let mine = st.slots[idx].idle.len() + st.slots[idx].starting;
            if st.total() < size || mine >= size {
                break;
            }
            let victim = st
                .slots
                .iter_mut()
                .filter(|s| s.key != key && !s.idle.is_empty())
                .min_by_key(|s| s.last_used);
            match victim.and_then(|s| s.idle.pop_front()) {
                Some(e) => evicted.push(e),
                None => break,
            }
        }
        evicted
    }

    fn prune(st: &mut State) {
        while st.slots.len() > MAX_SLOTS {
            let lru = st
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.idle.is_empty() && s.starting == 0)
                .min_by_key(|(_, s)| s.last_used)
                .map(|(i, _)| i);
            match lru {
                Some(i) => {
                    st.slots.remove(i);
                }
                None => break,
            }
        }
    }

    /// Notes `spec` for refills without taking an interpreter.
    fn prewarm_spec(&self, spec: &LaunchSpec) {
        let evicted = {
            let mut st = self.shared.lock();
            if st.shutdown {
                return;
            }
            let idx = Self::note(&mut st, spec);
            let evicted = Self::make_room(&mut st, self.shared.size, idx);
            Self::prune(&mut st);
            evicted
        };
        drop(evicted);
        self.shared.work.notify_all();
    }

    /// Takes a pooled interpreter for `spec`, hands it the stub and the script and lets it run.
    /// `None` means "start cold": no usable entry, or one that could not be adapted to the call.
    pub(crate) fn start_warm(&self, spec: &LaunchSpec, stub: &str, code: &str) -> Option<Launched> {
        if std::process::id() != self.owner_pid {
            return None;
        }
        let (entry, evicted) = {
            let mut st = self.shared.lock();
            if st.shutdown {
                return None;
            }
            let idx = Self::note(&mut st, spec);
            let entry = st.slots[idx].idle.pop_front();
            let evicted = Self::make_room(&mut st, self.shared.size, idx);
            Self::prune(&mut st);
            if entry.is_none() {
                st.cold_starts += 1;
            }
            (entry, evicted)
        };
        drop(evicted);
        let Some(mut entry) = entry else {
            self.shared.work.notify_all();
            return None;
        };
        match self.adapt(spec, &mut entry, stub, code) {
            Ok(()) => {
                let refill_now = {
                    let mut st = self.shared.lock();
                    st.warm_starts += 1;
                    st.slots
                        .iter()
                        .find(|s| s.key == spec.key())
                        .is_none_or(|s| s.idle.is_empty())
                };
                // Starting the replacement competes for the CPU with the script that just
                // started; unless the key has nothing left in reserve, refill once it is over.
                if refill_now {
                    self.shared.work.notify_all();
                }
                let mut launched = entry.launched.take()?;
                launched.on_done = (!refill_now).then(|| -> OnDone {
                    Box::new(RefillWhenDone {
                        shared: Arc::downgrade(&self.shared),
                    })
                });
                Some(launched)
            }
            Err(why) => {
                tracing::debug!("execute_code: pooled interpreter not used: {why}; starting cold");
                let stale = {
                    let mut st = self.shared.lock();
                    st.cold_starts += 1;
                    match st.slots.iter_mut().find(|s| s.key == spec.key()) {
                        Some(slot) if why.stale_env => {
                            slot.generation += 1;
                            slot.idle.drain(..).collect::<Vec<_>>()
                        }
                        _ => Vec::new(),
                    }
                };
                drop(stale);
                drop(entry);
                self.shared.work.notify_all();
                None
            }
        }
    }

    /// Brings `entry` to the call's environment, writes the files and releases the script.
    fn adapt(
        &self,
        spec: &LaunchSpec,
        entry: &mut Entry,
        stub: &str,
        code: &str,
    ) -> Result<(), NotUsed> {
        let launched = entry
            .launched
            .as_mut()
            .ok_or_else(|| NotUsed::other("entry already used"))?;
        if launched.has_exited() {
            return Err(NotUsed::other("it exited while idle"));
        }
        let tool_env = spec
            .child_env(launched.staging.path(), true)
            .map_err(|e| NotUsed::other(e.to_string()))?;
        let wanted = with_channel(tool_env.clone(), &launched.channel_vars);
        let message = env_delta(&launched.env, &wanted)?;
        launched.env = wanted;
        launched.tool_env = tool_env;
        launched
            .staging
            .write_files(stub, code, launched.owner)
            .map_err(|e| NotUsed::other(e.to_string()))?;
        let control = entry
            .control
            .as_ref()
            .ok_or_else(|| NotUsed::other("its control channel is gone"))?;
        let mut line = message.to_string();
        line.push('\n');
        send_all(control, line.as_bytes())
            .map_err(|e| NotUsed::other(format!("its control channel failed: {e}")))?;
        // EOF after the one line: nothing else can ever reach the interpreter this way.
        drop(entry.control.take());
        Ok(())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if std::process::id() == self.owner_pid {
            self.shutdown();
        }
    }
}

/// Wakes the refill thread when dropped, at the end of the execution that took an interpreter.
#[derive(Debug)]
struct RefillWhenDone {
    shared: std::sync::Weak<Shared>,
}

impl Drop for RefillWhenDone {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.work.notify_all();
        }
    }
}

/// Why a pooled interpreter was not used for a call.
#[derive(Debug)]
struct NotUsed {
    reason: String,
    /// The environment changed in a way no entry of this key can follow.
    stale_env: bool,
}

impl NotUsed {
    fn other(reason: impl Into<String>) -> Self {
        NotUsed {
            reason: reason.into(),
            stale_env: false,
        }
    }
}

impl std::fmt::Display for NotUsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

pub use crate::env_policy::affects_startup;

/// The control message turning `started` into `wanted`, or why it cannot.
fn env_delta(
    started: &[(OsString, OsString)],
    wanted: &[(OsString, OsString)],
) -> Result<serde_json::Value, NotUsed> {
    let before: BTreeMap<&OsString, &OsString> = started.iter().map(|(k, v)| (k, v)).collect();
    let after: BTreeMap<&OsString, &OsString> = wanted.iter().map(|(k, v)| (k, v)).collect();
    let mut set = serde_json::Map::new();
    let mut unset = Vec::new();
    let stale = |name: &str| NotUsed {
        reason: format!(
            "the environment variable {name} changed and is read at interpreter startup"
        ),
        stale_env: true,
    };
    let text = |s: &OsString| {
        s.to_str().map(str::to_owned).ok_or_else(|| NotUsed {
            reason: "a changed environment variable is not UTF-8".into(),
            stale_env: true,
        })
    };
    for (k, v) in &after {
        if before.get(k) != Some(v) {
            let name = text(k)?;
            if affects_startup(&name) {
                return Err(stale(&name));
            }
            set.insert(name, serde_json::Value::String(text(v)?));
        }
    }
    for k in before.keys() {
        if !after.contains_key(k) {
            let name = text(k)?;
            if affects_startup(&name) {
                return Err(stale(&name));
            }
            unset.push(serde_json::Value::String(name));
        }
    }
    Ok(serde_json::json!({"set": set, "unset": unset}))
}

fn take_all(st: &mut State) -> Vec<Entry> {
    st.slots
        .iter_mut()
        .flat_map(|s| s.idle.drain(..).collect::<Vec<_>>())
        .collect()
}

/// The refill thread: starts one interpreter at a time for the most recently used key that is
/// short, while the pool holds fewer than its size.
fn refill_loop(shared: &Shared) {
    loop {
        let (spec, key, generation) = {
            let mut st = shared.lock();
            loop {
                if st.shutdown {
                    return;
                }
                if let Some(i) = pick_slot(&st, shared.size) {
                    let slot = &mut st.slots[i];
                    slot.starting += 1;
                    break (slot.spec.clone(), slot.key.clone(), slot.generation);
                }
                st = shared.work.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        // While the fork server serves a burst, an interpreter start would take a core from
        // its scripts; the refill is for the next paced call and can wait for a lull.
        crate::fork_activity::wait_until_idle(REFILL_DEFERRAL, || shared.lock().shutdown);
        let started = start_one(shared, &spec);
        let surplus = {
            let mut st = shared.lock();
            st.starting_dir = None;
            let shutdown = st.shutdown;
            match st.slots.iter_mut().find(|s| s.key == key) {
                Some(slot) => {
                    slot.starting = slot.starting.saturating_sub(1);
                    match started {
                        Ok(entry) if !shutdown && slot.generation == generation => {
                            slot.failures = 0;
                            slot.idle.push_back(entry);
                            None
                        }
                        Ok(entry) => Some(entry),
                        Err(e) => {
                            slot.failures += 1;
                            if slot.failures == MAX_FAILURES {
                                tracing::warn!(
                                    "execute_code: cannot pre-start interpreters ({e}); calls \
                                     with these settings start cold"
                                );
                            } else {
                                tracing::debug!("execute_code: pre-starting an interpreter: {e}");
                            }
                            None
                        }
                    }
                }
                None => started.ok(),
            }
        };
        drop(surplus);
        shared.filled.notify_all();
    }
}

fn pick_slot(st: &State, size: usize) -> Option<usize> {
    if st.total() >= size {
        return None;
    }
    st.slots
        .iter()
        .enumerate()
        .filter(|(_, s)| s.failures < MAX_FAILURES && s.idle.len() + s.starting < size)
        .max_by_key(|(_, s)| s.last_used)
        .map(|(i, _)| i)
}

/// Why an interpreter could not be pre-started.
#[derive(Debug, thiserror::Error)]
enum BootError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("cannot create the pool's control channel or readiness pipe: {0}")]
    Pipe(std::io::Error),
    #[error("the interpreter exited before it was ready (run a script cold to see its error)")]
    Died,
    #[error("the interpreter was not ready within {0:?}")]
    Slow(Duration),
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

/// Writes all of `data` without ever raising SIGPIPE in the host (an interpreter that died idle
/// must be an error, not the end of the host).
fn send_all(stream: &std::os::unix::net::UnixStream, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        match rustix::net::send(stream, data, rustix::net::SendFlags::NOSIGNAL) {
            Ok(n) => data = &data[n..],
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn start_one(shared: &Shared, spec: &LaunchSpec) -> Result<Entry, BootError> {
    let staging = Staging::create(spec.disk_budget())?;
    shared.lock().starting_dir = Some(staging.path().to_path_buf());
    // A socketpair rather than a pipe, so a write to a dead interpreter can be made without
    // SIGPIPE (MSG_NOSIGNAL); the bootstrap only reads it.
    let (control_write, control_read) =
        std::os::unix::net::UnixStream::pair().map_err(BootError::Pipe)?;
    let (ready_read, ready_write) = pipe().map_err(BootError::Pipe)?;
    let launched = launch(
        spec,
        staging,
        Program::Warm {
            control: OwnedFd::from(control_read),
            ready: ready_write,
        },
    )?;
    let entry = Entry {
        launched: Some(launched),
        control: Some(control_write),
    };
    wait_ready(ready_read, READY_TIMEOUT)?;
    Ok(entry)
}

fn wait_ready(fd: OwnedFd, timeout: Duration) -> Result<(), BootError> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(BootError::Slow(timeout));
        }
        let mut pfd = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let wait = rustix::event::Timespec::try_from(left).ok();
        match rustix::event::poll(&mut pfd, wait.as_ref()) {
            Ok(n) if n > 0 => break,
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return Err(BootError::Died),
        }
    }
    let mut byte = [0u8; 1];
    let mut file = std::fs::File::from(fd);
    match file.read(&mut byte) {
        Ok(1) if byte[0] == b'R' => Ok(()),
        _ => Err(BootError::Died),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect()
    }

    #[test]
    fn startup_variables_are_recognised() {
        for n in [
            "PYTHONPATH",
            "PYTHONHASHSEED",
            "LD_PRELOAD",
            "LC_ALL",
            "HOME",
            "TZ",
        ] {
            assert!(affects_startup(n), "{n}");
        }
        for n in ["PATH", "MY_API_KEY", "VIBEOS_RPC_TOKEN", "TMPDIR"] {
            assert!(!affects_startup(n), "{n}");
        }
    }

    #[test]
    fn deltas_set_and_unset_or_refuse() {
        let before = env(&[("A", "1"), ("B", "2"), ("PYTHONUTF8", "1")]);
        let after = env(&[("A", "1"), ("C", "3"), ("PYTHONUTF8", "1")]);
        let msg = env_delta(&before, &after).unwrap();
        assert_eq!(msg["set"], serde_json::json!({"C": "3"}));
        assert_eq!(msg["unset"], serde_json::json!(["B"]));
        let after = env(&[("A", "1"), ("B", "2"), ("PYTHONUTF8", "0")]);
        assert!(env_delta(&before, &after).unwrap_err().stale_env);
    }
}
