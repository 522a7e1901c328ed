//! Background processes of the local backend: what `terminal(background=true)` starts and the
//! `process` tool manages. (Split from [`super::local`], which spawns them, when that file
//! passed the size of one module's job.)
//!
//! Per task: each process belongs to the task that started it (the call's task id; calls with
//! none are the default task, as in [`super::manager`]), and only that task can list, read,
//! write to or kill it. The remote backends get this from one environment per task; locally one
//! process serves every task (and every MCP connection, each its own task), so the registry
//! itself keeps them apart.
//!
//! Lifetime: a background process ends at the latest with this process, as the environment of a
//! remote backend ends its processes when it stops (SPEC §9). Each one carries this process's
//! own marker ([`super::local::SCOPE_VAR`]), so an exit hook ends its group and whatever it
//! started outside the group (`setsid`, `nohup … &`), and the keeper ([`super::keeper`]) does
//! the same when this process dies without running exit hooks (SIGKILL, the OOM killer).

use super::local::{self, BackendError, SpawnSpec, Spawned, KILL_GRACE};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

/// Output of a background process kept with absolute offsets, so polls return only what is new
/// and say how much was lost when the process outran the buffer.
#[derive(Debug, Default)]
struct Ring {
    buf: VecDeque<u8>,
    start: u64,
    cap: usize,
    eof: bool,
}

impl Ring {
    fn push(&mut self, data: &[u8]) {
        self.buf.extend(data);
        let over = self.buf.len().saturating_sub(self.cap);
        if over > 0 {
            self.buf.drain(..over);
            self.start += over as u64;
        }
    }

    fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    /// Bytes from absolute `from` to the end, and how many before them were already dropped.
    fn since(&self, from: u64) -> (Vec<u8>, u64) {
        let lost = self.start.saturating_sub(from);
        let skip = from.saturating_sub(self.start) as usize;
        (self.buf.iter().skip(skip).copied().collect(), lost)
    }
}

/// A process started with `background=true`.
pub struct BackgroundProcess {
    /// Its id, `proc_N`.
    pub id: String,
    /// The command line.
    pub command: String,
    /// Working dir.
    pub cwd: String,
    /// Pid of the shell (also its process group id).
    pub pid: u32,
    /// Whether it runs under a PTY.
    pub pty: bool,
    /// Start time.
    pub started: Instant,
    /// The task that started it (see [`task_key`]): the only one that may manage it.
    task: String,
    pgid: Pid,
    output: Arc<Mutex<Ring>>,
    exit: Arc<Mutex<Option<i32>>>,
    read_cursor: Mutex<u64>,
    stdin: Mutex<Option<std::fs::File>>,
}

static PROCESSES: LazyLock<Mutex<BTreeMap<String, Arc<BackgroundProcess>>>> =
    LazyLock::new(|| Mutex::new(BTreeMap::new()));
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Most output kept per background process.
pub const BACKGROUND_BUFFER: usize = 1024 * 1024;

/// The registry key of a call's task: its id, or the default task's for a call with none (or
/// an empty one), as the remote backends pick the task's environment.
fn task_key(task: Option<&str>) -> &str {
    task.filter(|t| !t.is_empty())
        .unwrap_or(super::manager::DEFAULT_TASK)
}

/// Starts `spec` in the background for `task` and registers it.
pub fn start_background(
    spec: &SpawnSpec<'_>,
    task: Option<&str>,
) -> Result<Arc<BackgroundProcess>, BackendError> {
    let Spawned {
        mut child,
        pgid,
        mut reader,
        stdin,
    } = local::spawn(spec)?;
    let output = Arc::new(Mutex::new(Ring {
        cap: BACKGROUND_BUFFER,
        ..Ring::default()
    }));
    let exit = Arc::new(Mutex::new(None));
    let out2 = Arc::clone(&output);
    let reader_ok = std::thread::Builder::new()
        .name("bg-output".into())
        .spawn(move || {
            local::pump(&mut reader, |chunk| {
                if let Ok(mut g) = out2.lock() {
                    g.push(chunk);
                }
            });
            if let Ok(mut g) = out2.lock() {
                g.eof = true;
            }
        });
    if let Err(e) = reader_ok {
        let _ = local::kill_group(pgid, &mut child);
        return Err(BackendError::Spawn(e));
    }
    let pid = child.id();
    let exit2 = Arc::clone(&exit);
    let waiter = std::thread::Builder::new()
        .name("bg-wait".into())
        .spawn(move || {
            let code = child.wait().map(local::exit_code).unwrap_or(-1);
            if let Ok(mut g) = exit2.lock() {
                *g = Some(code);
            }
        });
    if let Err(e) = waiter {
        let _ = killpg(pgid, Signal::SIGKILL);
        return Err(BackendError::Spawn(e));
    }
    let id = format!("proc_{}", NEXT_ID.fetch_add(1, Ordering::SeqCst));
    let proc_ = Arc::new(BackgroundProcess {
        id: id.clone(),
        command: spec.shown_command.to_string(),
        cwd: spec.starts_in.display().to_string(),
        pid,
        pty: spec.pty,
        started: Instant::now(),
        task: task_key(task).to_string(),
        pgid,
        output,
        exit,
        read_cursor: Mutex::new(0),
        stdin: Mutex::new(stdin),
    });
    if let Ok(mut g) = PROCESSES.lock() {
        g.insert(id, Arc::clone(&proc_));
    }
    Ok(proc_)
}

/// Bytes at the end of `bytes` that a poll holds back: the word they end in (the run after
/// the last whitespace), when it is at most [`crate::capture::MAX_CUT_WORD`] bytes, the longest
/// piece the output caps' cuts drop for the same reason. A longer run is no secret's piece.
fn trailing_word_len(bytes: &[u8]) -> usize {
    let word = bytes
        .iter()
        .rev()
        .take_while(|b| !b.is_ascii_whitespace())
        .count();
    if word <= crate::capture::MAX_CUT_WORD {
        word
    } else {
        0
    }
}

/// A snapshot of one poll.
#[derive(Debug)]
pub struct PollResult {
    /// Output since the previous poll (or all kept output with `from_start`).
    pub output: String,
    /// Bytes that scrolled out of the buffer before they could be returned: since the previous
    /// poll, or (with `from_start`) since the process started.
    pub lost_bytes: u64,
    /// Exit code once it has ended.
    pub exit_code: Option<i32>,
    /// Total output bytes so far.
    pub total_bytes: u64,
}

impl BackgroundProcess {
    /// Exit code once ended.
    pub fn exit_code(&self) -> Option<i32> {
        self.exit.lock().ok().and_then(|g| *g)
    }

    /// New output since the last poll; `from_start` returns everything still buffered, and
    /// counts as lost everything that scrolled out before it.
    pub fn poll(&self, from_start: bool) -> PollResult {
        let exit_code = self.exit_code();
        let mut cursor = self.read_cursor.lock().unwrap_or_else(|e| e.into_inner());
        let (mut bytes, lost, end, ended) = match self.output.lock() {
            Ok(ring) => {
                // The whole log starts at offset 0: what the ring no longer holds of it is
                // lost, however far an earlier poll had read.
                let from = if from_start { 0 } else { *cursor };
                let (b, l) = ring.since(from);
                (b, l, ring.end(), ring.eof)
            }
            Err(_) => (Vec::new(), 0, *cursor, true),
        };
        // Each poll's output is redacted on its own, so a secret split between two polls
        // (a pipe's block buffering cuts lines anywhere) would go out as two harmless-looking
        // pieces. While more can come, the word the output ends in waits for the next poll,
        // where it is redacted whole. Not in PTY mode: a program on a terminal writes whole
        // lines, and a prompt without a newline must show at once.
        // Once the process has exited nothing is held, even before its output's end of file
        // is seen: a caller that waited for the exit reads the last word now.
        let held = if self.pty || ended || exit_code.is_some() {
            0
        } else {
            trailing_word_len(&bytes)
        };
        bytes.truncate(bytes.len() - held);
        *cursor = end - held as u64;
        let mut output = String::from_utf8_lossy(&bytes).into_owned();
        if self.pty {
            output = output.replace("\r\n", "\n");
        }
        PollResult {
            output,
            lost_bytes: lost,
            exit_code,
            total_bytes: end,
        }
    }

    /// Waits up to `timeout` for it to end.
    pub fn wait(&self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(c) = self.exit_code() {
                return Some(c);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills its process group (SIGTERM, SIGKILL after the grace period). Once its shell has
    /// exited (and been reaped), what is left of the group is killed only while the group's id
    /// can still be no one else's ([`local::kill_left_group`]).
    pub fn kill(&self) -> Option<i32> {
        if let Some(c) = self.exit_code() {
            local::kill_left_group(self.pgid.as_raw());
            return Some(c);
        }
        let _ = killpg(self.pgid, Signal::SIGTERM);
        if let Some(c) = self.wait(KILL_GRACE) {
            local::kill_left_group(self.pgid.as_raw());
            return Some(c);
        }
        let _ = killpg(self.pgid, Signal::SIGKILL);
        self.wait(KILL_GRACE)
    }

    /// Writes to its stdin (PTY processes only: pipe-mode processes have stdin from /dev/null).
    /// A process that has exited reads nothing more: an error, not a count of bytes the
    /// terminal took and nobody will read.
    pub fn write_stdin(&self, data: &[u8]) -> Result<(), String> {
        if let Some(code) = self.exit_code() {
            return Err(exited(&self.id, code));
        }
        let mut g = self
            .stdin
            .lock()
            .map_err(|_| "stdin lock poisoned".to_string())?;
        match g.as_mut() {
            Some(f) => f.write_all(data).and_then(|_| f.flush()).map_err(|e| {
                // It may have ended during the write (the terminal's other end closed).
                match self.wait(Duration::from_millis(100)) {
                    Some(code) => exited(&self.id, code),
                    None => format!("cannot write to {}: {e}", self.id),
                }
            }),
            None => Err(format!(
                "{} has no stdin to write to; start it with pty=true to interact with it",
                self.id
            )),
        }
    }
}

fn exited(id: &str, code: i32) -> String {
    format!(
        "{id} has exited (exit code {code}) and reads no more input; read its output with \
         process(action=\"log\") or start it again"
    )
}

/// The background process `id` of `task`. Another task's process is unknown here, with the
/// same error as an id that never existed: a task learns nothing of other tasks' processes.
pub fn get_process(task: Option<&str>, id: &str) -> Result<Arc<BackgroundProcess>, BackendError> {
    let task = task_key(task);
    PROCESSES
        .lock()
        .ok()
        .and_then(|g| g.get(id).filter(|p| p.task == task).cloned())
        .ok_or_else(|| BackendError::UnknownProcess(id.to_string()))
}

/// The background processes of `task`.
pub fn list_processes(task: Option<&str>) -> Vec<Arc<BackgroundProcess>> {
    let task = task_key(task);
    PROCESSES
        .lock()
        .map(|g| g.values().filter(|p| p.task == task).cloned().collect())
        .unwrap_or_default()
}

/// Forgets a finished process.
pub fn remove_process(id: &str) {
    if let Ok(mut g) = PROCESSES.lock() {
        g.remove(id);
    }
}

/// Kills (process group: SIGTERM, SIGKILL after the grace period, all at once) and forgets the
/// background processes of `task`: its session ended (an MCP client's session closed or
/// expired), so nobody could reach them again with `process`.
pub fn end_task(task: Option<&str>) {
    let task = task_key(task);
    let procs: Vec<Arc<BackgroundProcess>> = PROCESSES
        .lock()
        .map(|mut g| {
            let ids: Vec<String> = g
                .iter()
                .filter(|(_, p)| p.task == task)
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| g.remove(id)).collect()
        })
        .unwrap_or_default();
    let killers: Vec<_> = procs
        .into_iter()
        .map(|p| std::thread::spawn(move || p.kill()))
        .collect();
    for k in killers {
        let _ = k.join();
    }
}

/// Kills (process group: SIGTERM, SIGKILL after the grace period, all at once) and forgets
/// every background process of every task: the environment this process serves is going
/// away (the tool agent's end).
pub fn end_all() {
    let procs: Vec<Arc<BackgroundProcess>> = PROCESSES
        .lock()
        .map(|mut g| std::mem::take(&mut *g).into_values().collect())
        .unwrap_or_default();
    let killers: Vec<_> = procs
        .into_iter()
        .map(|p| std::thread::spawn(move || p.kill()))
        .collect();
    for k in killers {
        let _ = k.join();
    }
}

/// Registered with the first command not bound to an execution ([`end_with_this_process`]).
static AT_EXIT: std::sync::Once = std::sync::Once::new();

/// Makes what the commands of this process leave running end when it exits normally: the
/// background processes' groups, and every process that carries this process's own marker
/// (background commands and direct calls' commands carry it). Called before such a command
/// starts; registers the exit hook once.
pub(super) fn end_with_this_process() {
    crate::exit_hook::register(
        &AT_EXIT,
        end_at_exit,
        "processes left by terminal commands (background ones, and what direct calls started \
         with `&`) may outlive this process",
    );
    HOST_PID.store(std::process::id(), Ordering::SeqCst);
}
/// The process that registered [`end_at_exit`]: a forked child that inherited the hook and
/// exits through `exit()` (a Python `os.fork()` then `sys.exit()`) must not end its parent's
/// processes.
static HOST_PID: AtomicU32 = AtomicU32::new(0);

/// At normal exit: SIGKILL to the group of every background process still running, then to
/// every process carrying this process's own marker (what left its group). Never blocks: a
/// lock held by a thread that exit() froze is skipped (the marker scan still runs).
extern "C" fn end_at_exit() {
    if HOST_PID.load(Ordering::SeqCst) != std::process::id() {
        return;
    }
    if let Ok(g) = PROCESSES.try_lock() {
        for p in g.values() {
            // Only groups whose shell is unreaped: a reaped one's id may belong to another
            // process by now. Running or not yet known to have ended, the group is still ours.
            let ended = p.exit.try_lock().map(|e| e.is_some()).unwrap_or(false);
            if !ended {
                let _ = killpg(p.pgid, Signal::SIGKILL);
            }
        }
    }
    local::kill_own_marked();
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::Path;

    /// The background-process registry is process-wide, and the agent's `serve` ends every
    /// entry when it returns: a test that starts a background process and one that runs `serve`
    /// take turns.
    pub(crate) static BACKGROUND_REGISTRY: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// `cmd` started in the background from `/` with this process's PATH.
    fn started(cmd: &str, pty: bool) -> Arc<BackgroundProcess> {
        let e = vec![("PATH".into(), std::env::var("PATH").unwrap_or_default())];
        start_background(
            &SpawnSpec {
                command: cmd,
                shown_command: cmd,
                cwd: Path::new("/"),
                starts_in: Path::new("/"),
                env: &e,
                pty,
                scope: None,
            },
            None,
        )
        .unwrap()
    }

    #[test]
    fn background_poll_write_and_kill() {
        let _turn = BACKGROUND_REGISTRY
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let p = started("echo started; read line; echo got:$line; sleep 60", true);
        // Output arrives when the shell gets a CPU: poll for it rather than sleeping a fixed
        // time (a loaded machine took longer than 300 ms).
        let wait_for = |needle: &str| {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            let mut seen = String::new();
            while !seen.contains(needle) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no {needle:?} in {seen:?}"
                );
                std::thread::sleep(Duration::from_millis(50));
                seen.push_str(&p.poll(false).output);
            }
        };
        wait_for("started");
        p.write_stdin(b"hello\n").unwrap();
        wait_for("got:hello");
        assert!(p.exit_code().is_none());
        let code = p.kill();
        assert!(code.is_some());
        remove_process(&p.id);
    }

    #[test]
    fn a_word_split_between_polls_is_returned_whole() {
        let _turn = BACKGROUND_REGISTRY
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // The first half of a token, a pause long enough for a poll, then the rest.
        let p = started(
            "printf 'start tok=ghp_A1b2C3d4'; sleep 1; printf 'E5f6G7h8 end\\n'",
            false,
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut polls = Vec::new();
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let r = p.poll(false);
            let done = r.exit_code.is_some() && r.output.is_empty() && !polls.is_empty();
            polls.push(r.output);
            if done || std::time::Instant::now() > deadline {
                break;
            }
        }
        let all: String = polls.concat();
        assert_eq!(all, "start tok=ghp_A1b2C3d4E5f6G7h8 end\n", "{polls:?}");
        assert!(
            polls.iter().any(|o| o.contains("tok=ghp_A1b2C3d4E5f6G7h8")),
            "the token came in pieces: {polls:?}"
        );
        assert!(
            polls.iter().all(|o| !o.ends_with("ghp_A1b2C3d4")),
            "{polls:?}"
        );
        remove_process(&p.id);
    }
}
