//! The local terminal backend: commands run on this machine under `bash -c` (else `sh -c`).
//!
//! Containment: every command gets its own session, and so its own process group and no
//! controlling terminal (in PTY mode the PTY becomes its controlling terminal), and a timeout or
//! a kill signals the whole group — SIGTERM, then SIGKILL after a grace period — so
//! children of the shell die with it. Limit: a descendant that calls `setsid`/`setpgid` leaves
//! the group and is not reached by that signal. For script calls this gap is closed by the
//! execution's end ([`kill_scope`]): the commands a script ran are children of the supervisor,
//! not of the script's reaper, so the end kills the groups still running, what is left in the
//! groups of commands that returned, and every process that carries the execution's
//! [`SCOPE_VAR`] in its environment (what a command left in the background and moved out of
//! its group: `setsid`). For direct agent calls it stays open while the host runs (a cgroup per
//! command would close it but needs delegation rights this process usually lacks); what they
//! leave running is bound to this process's lifetime instead, by a marker of its own, as
//! background commands ([`super::background`]) are: the exit hook, or the keeper when this
//! process is killed, ends it. In the tool agent every command's leftovers also end with the
//! agent's environment ([`mark_every_command`]). See docs/terminal.md.
//!
//! Output: stdout and stderr share one pipe (so they interleave as on a terminal) that a reader
//! thread drains into a bounded [`HeadTail`]; the child never blocks on a full pipe and memory
//! stays fixed whatever it writes.

use super::HeadTail;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex};
use std::time::{Duration, Instant};

/// How long a process group gets between SIGTERM and SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long to keep reading after the shell exits while something it left behind still holds
/// the output pipe open.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(500);

/// What a spawn needs.
pub struct SpawnSpec<'a> {
    /// Shell command line.
    pub command: &'a str,
    /// The command as its caller gave it, which `process(action="list")` shows (`command` may
    /// be it wrapped to keep the shell session's state).
    pub shown_command: &'a str,
    /// Working directory.
    pub cwd: &'a Path,
    /// Where the command starts, which `process(action="list")` shows: `cwd`, or where the
    /// shell session's last `cd` left it (`command` then enters it; `cwd` was shown).
    pub starts_in: &'a Path,
    /// The complete environment of the command.
    pub env: &'a [(String, String)],
    /// Run under a pseudo-terminal instead of pipes.
    pub pty: bool,
    /// The execution this command belongs to (see [`scope_of`]); [`kill_scope`] ends it.
    pub scope: Option<usize>,
}

/// The outcome of a foreground command.
#[derive(Debug)]
pub struct RunOutput {
    /// Combined stdout+stderr, capped.
    pub output: String,
    /// Whether output was cut.
    pub truncated: bool,
    /// Total output bytes.
    pub output_bytes: u64,
    /// Exit code; `-N` when killed by signal N (as Python reports it).
    pub exit_code: i32,
    /// Whether the timeout fired.
    pub timed_out: bool,
    /// Whether the shell exited while a process it left behind still held the output open.
    pub detached_output: bool,
    /// Wall time.
    pub duration: Duration,
}

/// Errors of the backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The command could not be started.
    #[error("could not start the shell: {0}")]
    Spawn(std::io::Error),
    /// A pipe or pseudo-terminal could not be created.
    #[error("could not create {what}: {err}")]
    Setup {
        /// Pipe or PTY.
        what: &'static str,
        /// The OS error.
        err: nix::Error,
    },
    /// No background process with that id.
    #[error("no background process `{0}`; list them with process(action=\"list\")")]
    UnknownProcess(String),
}

fn shell() -> &'static str {
    static SHELL: LazyLock<&'static str> = LazyLock::new(|| {
        if Path::new("/bin/bash").exists() {
            "/bin/bash"
        } else {
            "/bin/sh"
        }
    });
    &SHELL
}

/// A started command: the shell, its group and its output (and its input, with a PTY).
pub(super) struct Spawned {
    pub(super) child: Child,
    pub(super) pgid: Pid,
    pub(super) reader: Box<dyn Read + Send>,
    pub(super) stdin: Option<std::fs::File>,
}

/// Marks every command a script runs, and what those commands start, with the execution they
/// belong to: [`kill_scope`] finds by it what left the command's process group (`setsid`).
pub const SCOPE_VAR: &str = "VIBEOS_EXECUTION_SCOPE";

/// The value of [`SCOPE_VAR`] for `scope`: unique per process and execution (scopes are
/// addresses, which a later execution of the same process may reuse only after this one ended).
fn scope_marker(scope: usize) -> String {
    format!("{}{scope:x}", marker_prefix())
}

/// The start of every scope marker of this process (what [`super::keeper`] looks for).
pub(crate) fn marker_prefix() -> &'static str {
    // Not a secret, only distinct from other processes' markers.
    static PREFIX: LazyLock<String> = LazyLock::new(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        format!("{:016x}", now ^ (u64::from(std::process::id()) << 40))
    });
    &PREFIX
}

/// The value of [`SCOPE_VAR`] for commands bound to this process's own lifetime rather than to
/// an execution: background commands and direct calls' commands. `p` is not a hex digit, so
/// no execution's marker equals it.
fn own_marker() -> String {
    format!("{}p", marker_prefix())
}

/// The window size of a command's PTY. Without one it was 0 x 0 (`stty size` printed `0 0`),
/// which programs take for "unknown" and handle each its own way (a pager waits for a key on
/// every line). The reader is a model, not a screen: 200 columns keep the lines of `ps`, tables
/// and `git log --graph` from being cut or wrapped at 80, and 50 rows give full-screen programs
/// a usual page.
const PTY_SIZE: nix::pty::Winsize = nix::pty::Winsize {
    ws_row: 50,
    ws_col: 200,
    ws_xpixel: 0,
    ws_ypixel: 0,
};

/// Whether bash would take `bash -c` for a command sshd started itself and read `~/.bashrc`
/// first (Debian's bash does when `SSH_CLIENT` or `SSH2_CLIENT` is set and the shell level is
/// below 2): the case of the tool agent over ssh, which runs in the login's environment after
/// the login shell's `exec` (level 0). A `.bashrc` that prints or `cd`s would then show in
/// every command's output and move its directory; a level of 1, what a command started from
/// any shell inherits, keeps commands there exactly as they are locally.
fn sourced_as_if_from_sshd(env: &[(String, String)]) -> bool {
    let from_sshd = env
        .iter()
        .any(|(k, _)| k == "SSH_CLIENT" || k == "SSH2_CLIENT");
    let level = env
        .iter()
        .rev()
        .find(|(k, _)| k == "SHLVL")
        .and_then(|(_, v)| v.trim().parse::<i64>().ok())
        .unwrap_or(0);
    from_sshd && level < 1
}

/// Whether this process is a tool agent ([`mark_every_command`]).
static MARK_EVERY_COMMAND: AtomicBool = AtomicBool::new(false);

/// Marks this process as a tool agent, whose environment's end ([`kill_all_marked`]) ends what
/// any of its commands left running, a script's as well as a direct call's: in ssh nothing else
/// ends what a command left in the background (`cmd &`, `nohup`), and there is no container
/// whose end would. (Direct calls' commands carry this process's own marker in every host, so
/// that they end with it at the latest.)
pub fn mark_every_command() {
    MARK_EVERY_COMMAND.store(true, Ordering::SeqCst);
}

/// Whether [`mark_every_command`] was called.
pub fn marks_every_command() -> bool {
    MARK_EVERY_COMMAND.load(Ordering::SeqCst)
}

/// Spawns `spec`. Whatever it starts ends with its execution (a script's command) or, at the
/// latest, with this process (see [`super::background`]).
pub(super) fn spawn(spec: &SpawnSpec<'_>) -> Result<Spawned, BackendError> {
    let mut cmd = Command::new(shell());
    // Held until the spawn returns: the child's fd 3 is a copy of it.
    let long_command = command_file(spec.command)?;
    match &long_command {
        None => cmd.arg("-c").arg(spec.command),
        Some(_) => cmd.arg("-c").arg(READ_COMMAND_FROM_FD_3),
    };
    cmd.current_dir(spec.cwd).env_clear();
    cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
    if sourced_as_if_from_sshd(spec.env) {
        cmd.env("SHLVL", "1");
    }
    let marker = match spec.scope {
        Some(scope) => {
            if let Ok(mut g) = MARKED.lock() {
                g.insert(scope);
            }
            Some(scope_marker(scope))
        }
        // Not an execution's: a direct (agent or host) call's, or a background command. What
        // it leaves running ends with this process (its exit hook, or the keeper when it is
        // killed), as background commands always did: a direct call's `cmd &` or `setsid cmd
        // &` outlived the host that ran it.
        None => {
            super::background::end_with_this_process();
            Some(own_marker())
        }
    };
    if let Some(marker) = marker {
        // Started before the first marked command, so that no command of ours can outlive a
        // killed supervisor unseen.
        super::keeper::ensure(marker_prefix());
        cmd.env(SCOPE_VAR, marker);
    }
    if spec.pty {
        // No one reads a pager's screen or presses its `q`: `git log` sat in `less` until the
        // timeout (180 s by default). What the caller's environment sets is kept.
        for (name, value) in [
            ("TERM", "xterm-256color"),
            ("PAGER", "cat"),
            ("GIT_PAGER", "cat"),
        ] {
            if !spec.env.iter().any(|(k, _)| k == name) {
                cmd.env(name, value);
            }
        }
        let pty = nix::pty::openpty(Some(&PTY_SIZE), None).map_err(|err| BackendError::Setup {
            what: "a pseudo-terminal",
            err,
        })?;
        // openpty takes no flags: mark both ends close-on-exec at once, for the same reason as
        // the pipe below (the child gets its own copies on stdin/stdout/stderr).
        for fd in [&pty.master, &pty.slave] {
            nix::fcntl::fcntl(
                fd,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            )
            .map_err(|err| BackendError::Setup {
                what: "a pseudo-terminal",
                err,
            })?;
        }
        let dup = |fd: &OwnedFd| {
            fd.try_clone()
                .map_err(|e| BackendError::Spawn(std::io::Error::other(e)))
        };
        cmd.stdin(Stdio::from(dup(&pty.slave)?));
        cmd.stdout(Stdio::from(dup(&pty.slave)?));
        cmd.stderr(Stdio::from(pty.slave));
        new_session(
            &mut cmd,
            true,
            long_command.as_ref().map(AsRawFd::as_raw_fd),
        );
        let child = cmd.spawn().map_err(BackendError::Spawn)?;
        drop(cmd);
        let master = std::fs::File::from(pty.master);
        let writer = master.try_clone().map_err(BackendError::Spawn)?;
        let pgid = Pid::from_raw(child.id() as i32);
        Ok(Spawned {
            child,
            pgid,
            reader: Box::new(PtyReader(master)),
            stdin: Some(writer),
        })
    } else {
        // Close-on-exec: a process another thread starts at the same moment (a concurrent
        // command, a pool refill) must not inherit the write end, or it would hold this
        // command's output open after the command exits. The child's copies on its stdout and
        // stderr are made by dup2 in the spawn and stay open across its exec.
        let (read_end, write_end) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|err| {
                BackendError::Setup {
                    what: "an output pipe",
                    err,
                }
            })?;
        let write2 = write_end.try_clone().map_err(BackendError::Spawn)?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(write_end))
            .stderr(Stdio::from(write2));
        new_session(
            &mut cmd,
            false,
            long_command.as_ref().map(AsRawFd::as_raw_fd),
        );
        let child = cmd.spawn().map_err(BackendError::Spawn)?;
        // The write ends live in `cmd`; drop it so EOF arrives when the command's side closes.
        drop(cmd);
        let pgid = Pid::from_raw(child.id() as i32);
        Ok(Spawned {
            child,
            pgid,
            reader: Box::new(std::fs::File::from(read_end)),
            stdin: None,
        })
    }
}

/// Has the command's shell start a session of its own (`setsid` between fork and exec): it
/// leads a new process group too (group id = its pid, what the timeout's and the kills'
/// `killpg` use), and has no controlling terminal. Without it, a command kept the terminal of
/// whoever started this process: `/dev/tty` opened, and a command of a script run from a
/// shell could `TIOCSTI` text into that terminal's input (answer "o" to its own command's
/// approval prompt, queue commands for the operator's shell after the run), `stty -echo` it,
/// or stop on `SIGTTIN` reading it. With `take_pty` (PTY mode, the PTY slave on stdin) the
/// shell then takes the PTY as its controlling terminal, as programs that need one expect.
/// `command_fd` ([`command_file`]) becomes the shell's fd 3.
fn new_session(cmd: &mut Command, take_pty: bool, command_fd: Option<RawFd>) {
    // SAFETY: the closure runs in the forked child between fork and exec, captures only a
    // `bool` and an fd number, allocates nothing and calls only setsid(2), ioctl(2), dup2(2)
    // and fcntl(2), which are async-signal-safe: nothing in it can touch a lock or heap state
    // another thread of the parent held at the fork. setsid cannot fail with EPERM here: the
    // child was forked from this process and is no group leader (no `process_group` is set on
    // `cmd`). TIOCSCTTY acts on fd 0, which the spawn has already made the PTY slave (stdio is
    // set up before the pre_exec closures run). `command_fd` is open in the child (the parent
    // holds it until the spawn returns; close-on-exec only closes it at the exec): dup2 puts
    // a copy without close-on-exec on fd 3, replacing whatever the child had there; when it
    // is fd 3 already, dup2 would do nothing, so the flag is cleared instead.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if take_pty && libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let moved = match command_fd {
                None => 0,
                Some(3) => libc::fcntl(3, libc::F_SETFD, 0),
                Some(fd) => libc::dup2(fd, 3),
            };
            if moved < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Longest command passed to the shell as its `-c` argument: Linux refuses a single argument
/// of `MAX_ARG_STRLEN` (32 pages; 131,072 bytes with 4 KiB pages) or more, terminating NUL
/// included, and the spawn failed with "Argument list too long (os error 7)".
const ARGV_COMMAND_MAX: usize = 32 * 4096 - 1;

/// The `-c` script of a command too long for an argument: read the command from fd 3 (a
/// memory file, [`command_file`]) into a variable, close fd 3 so that nothing the command
/// starts inherits it, and run it. All on one line, so the command's line N is still the
/// shell's line N in its error messages. `read` reads a seekable file in blocks.
const READ_COMMAND_FROM_FD_3: &str = "IFS= builtin read -r -d '' __vibeos_c <&3; \
     exec 3<&-; builtin eval \"builtin unset __vibeos_c; $__vibeos_c\"";

/// For a command longer than [`ARGV_COMMAND_MAX`]: a memory file (`memfd_create`, close-on-
/// exec) holding it, read from the start, for the shell's fd 3. `None` for a command that fits
/// in an argument, which is passed as one (as `ps` then shows it).
fn command_file(command: &str) -> Result<Option<OwnedFd>, BackendError> {
    if command.len() <= ARGV_COMMAND_MAX {
        return Ok(None);
    }
    if shell() != "/bin/bash" {
        return Err(BackendError::Spawn(std::io::Error::other(format!(
            "the command is {} bytes; without bash (/bin/bash) a command travels as an \
             argument, and Linux takes at most {ARGV_COMMAND_MAX} bytes there. Write a longer \
             one to a file and run that",
            command.len()
        ))));
    }
    let setup = |err| BackendError::Setup {
        what: "a memory file for a long command",
        err,
    };
    let fd =
        nix::sys::memfd::memfd_create(c"vibeos-command", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
            .map_err(setup)?;
    let mut rest = command.as_bytes();
    while !rest.is_empty() {
        match nix::unistd::write(&fd, rest) {
            Ok(0) => return Err(setup(nix::Error::EIO)),
            Ok(n) => rest = &rest[n..],
            Err(nix::Error::EINTR) => {}
            Err(err) => return Err(setup(err)),
        }
    }
    nix::unistd::lseek(&fd, 0, nix::unistd::Whence::SeekSet).map_err(setup)?;
    Ok(Some(fd))
}

/// Reading a PTY master returns EIO once the last slave fd closes; that is the end of output.
struct PtyReader(std::fs::File);

impl Read for PtyReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self.0.read(buf) {
            Err(e) if e.raw_os_error() == Some(libc::EIO) => Ok(0),
            other => other,
        }
    }
}

pub(super) fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| -s))
        .unwrap_or(-1)
}

/// Signals the group with SIGTERM, then SIGKILL after [`KILL_GRACE`] unless `child` has exited.
pub(super) fn kill_group(pgid: Pid, child: &mut Child) -> Option<ExitStatus> {
    let _ = killpg(pgid, Signal::SIGTERM);
    let deadline = Instant::now() + KILL_GRACE;
    while Instant::now() < deadline {
        if let Ok(Some(st)) = child.try_wait() {
            // The shell is gone; make sure nothing else of the group lingers.
            let _ = killpg(pgid, Signal::SIGKILL);
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = killpg(pgid, Signal::SIGKILL);
    child.wait().ok()
}

/// Foreground commands running now: process group and scope.
static RUNNING: LazyLock<Mutex<BTreeMap<i32, Option<usize>>>> =
    LazyLock::new(|| Mutex::new(BTreeMap::new()));

/// The process groups of the foreground commands each scope started, kept after the commands
/// returned: what a command left running in its own group ends with the execution
/// ([`kill_left_group`]).
static LEFT_GROUPS: LazyLock<Mutex<BTreeMap<usize, Vec<i32>>>> =
    LazyLock::new(|| Mutex::new(BTreeMap::new()));

/// Remembers `pgid` as a group `scope`'s commands made. Groups that are gone are dropped now
/// and then, so an execution that runs many commands keeps a short list.
fn remember_left_group(scope: usize, pgid: i32) {
    if let Ok(mut g) = LEFT_GROUPS.lock() {
        let groups = g.entry(scope).or_default();
        if groups.len() >= 64 && groups.len().is_power_of_two() {
            // Signal 0 only asks whether the group still has a member (zombies count).
            groups.retain(|p| killpg(Pid::from_raw(*p), None).is_ok());
        }
        groups.push(pgid);
    }
}

/// Kills what is left in the process group a command made, after the command returned.
///
/// The group's id is the pid of the command's shell, which the supervisor has reaped. While any
/// member of the group lives (or is a zombie), the kernel keeps that pid number allocated, so
/// no other process can get it and no other group can take the id. The id can only have been
/// reused if the group emptied first; then a process with that pid exists (the new group's
/// leader, or a thread), and the group is left alone. So a group whose id is no process's pid
/// is still the command's (unless a reused id's leader exited too, with members left: a wrap of
/// the pid numbers to exactly this id within one execution), and is killed whole: one signal
/// reaches every member, including a child forked at that moment, which no pass over /proc
/// does for a fork chain.
pub(super) fn kill_left_group(pgid: i32) {
    if pgid <= 1 || std::path::Path::new(&format!("/proc/{pgid}")).exists() {
        return;
    }
    let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
}

/// Scopes that started a command, so [`kill_scope`] looks for marked processes only where
/// there can be some.
static MARKED: LazyLock<Mutex<std::collections::BTreeSet<usize>>> =
    LazyLock::new(|| Mutex::new(std::collections::BTreeSet::new()));

/// The scope of a call: the identity of its execute_code environment, which is one shared `Arc`
/// per execution (`None` for agent calls). Commands a script started are found by it when the
/// execution ends.
pub fn scope_of(ctx: &crate::ToolContext) -> Option<usize> {
    ctx.env
        .as_ref()
        .map(|env| Arc::as_ptr(env) as *const () as usize)
}

/// Kills (SIGKILL, whole process group) every foreground command started in `ctx`'s scope.
///
/// The supervisor calls this when an execution ends: terminal commands are children of the
/// supervisor, not of the script, so the script's reaper does not reach them, and a command
/// still running would otherwise outlive the execution until its own timeout.
pub fn kill_scope(ctx: &crate::ToolContext) -> usize {
    let Some(scope) = scope_of(ctx) else {
        return 0;
    };
    let groups: Vec<i32> = RUNNING
        .lock()
        .map(|g| {
            g.iter()
                .filter(|(_, s)| **s == Some(scope))
                .map(|(p, _)| *p)
                .collect()
        })
        .unwrap_or_default();
    for pgid in &groups {
        let _ = killpg(Pid::from_raw(*pgid), Signal::SIGKILL);
    }
    // What commands that already returned left in their own groups (`nohup daemon &`, a fork
    // chain whose one live pid changes faster than a scan of /proc can follow it).
    let left = LEFT_GROUPS
        .lock()
        .map(|mut g| g.remove(&scope))
        .ok()
        .flatten()
        .unwrap_or_default();
    for pgid in left {
        kill_left_group(pgid);
    }
    // What left its command's group (`setsid`, `setpgid`) is found by its marker.
    let marked = MARKED.lock().map(|mut g| g.remove(&scope)).unwrap_or(false);
    if marked {
        kill_marked(&scope_marker(scope), true);
    }
    groups.len()
}

/// Kills (SIGKILL) every process carrying this process's own marker: what its background
/// commands (and, in a tool agent, all its commands) left running, in their groups or out of
/// them. Called at exit; does not block.
pub(super) fn kill_own_marked() {
    kill_marked(&own_marker(), true);
}

/// Kills (SIGKILL) every process carrying any marker of this process: an execution's or its
/// own. The tool agent's end: nothing its commands started may outlive its environment.
pub fn kill_all_marked() {
    kill_marked(marker_prefix(), false);
}

/// Kills every process whose environment carries `SCOPE_VAR=marker` (`whole`), or a value that
/// starts with `marker`: what commands started and moved out of their process group. A few
/// rounds, since a process being killed may have started another meanwhile.
fn kill_marked(marker: &str, whole: bool) {
    let needle = format!("{SCOPE_VAR}={marker}{}", if whole { "\0" } else { "" });
    let me = std::process::id();
    let own_group = nix::unistd::getpgrp().as_raw();
    let own_session = nix::unistd::getsid(None).map_or(0, |s| s.as_raw());
    let pid_max = read_number("/proc/sys/kernel/pid_max");
    // Kills `pid` when it carries the marker; whether it did.
    let kill_if_marked = |pid: u32| -> bool {
        if pid == me {
            return false;
        }
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            return false;
        };
        let starts_entry = |at: usize| at == 0 || env[at - 1] == 0;
        let hit = env
            .windows(needle.len())
            .enumerate()
            .any(|(at, w)| w == needle.as_bytes() && starts_entry(at));
        if !hit {
            return false;
        }
        let pid = i32::try_from(pid).unwrap_or(i32::MAX);
        let group = group_and_session(pid);
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        // A process that forks and exits in a loop (a daemon's fork chain) changes its pid
        // faster than a kill can follow; its group is stable. Only a group in a session one of
        // our commands made (`setsid`) is taken whole: such a session holds nothing but that
        // command's descendants, while a group in our own session could be one a marked
        // process joined (ours, or the user's shell).
        if let Some((pgrp, session)) = group {
            if session != own_session && pgrp > 1 && pgrp != own_group {
                let _ = killpg(Pid::from_raw(pgrp), Signal::SIGKILL);
            }
        }
        true
    };
    let mut empty_passes = 0;
    for _ in 0..8 {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return;
        };
        let mut found = 0;
        let listed = dir
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
            .collect();
        for (i, pid) in newest_first(listed, pid_max).into_iter().enumerate() {
            // A pass over thousands of entries (a fork chain's zombies, while an init that
            // reaps slowly lets them pile up) takes milliseconds, in which a chain's one live
            // pid moves past the listing: the newest pids are tried again as the pass goes.
            if i % NEWEST_EVERY == 0 {
                found += newest_pids(pid_max).filter(|p| kill_if_marked(*p)).count();
            }
            found += usize::from(kill_if_marked(pid));
        }
        // Done after three passes in a row found nothing, not one: the one live pid of a fast
        // fork chain slips between a listing and its read in about a quarter of the passes
        // (measured: 3 of 12 first passes missed one that a later pass found).
        empty_passes = if found == 0 { empty_passes + 1 } else { 0 };
        if empty_passes == 3 {
            return;
        }
    }
}

/// How many listed pids [`kill_marked`] reads between two looks at the newest pids.
const NEWEST_EVERY: usize = 32;

/// The four pids given out last, newest first (none when `/proc` does not say).
fn newest_pids(pid_max: Option<u32>) -> impl Iterator<Item = u32> {
    let last = read_number("/proc/sys/kernel/ns_last_pid");
    counting_back(last, pid_max, 4)
}

/// The pids of a /proc listing, newest first, with the newest pids given out after the listing
/// (up to 64) in front: the listing is one snapshot, and a process that forks and exits in a
/// loop is alive only as its newest pid, for a fraction of a millisecond. Pids wrap at
/// `pid_max`: the newest are those just below `ns_last_pid`. Without either, highest first.
fn newest_first(mut pids: Vec<u32>, pid_max: Option<u32>) -> Vec<u32> {
    let last = read_number("/proc/sys/kernel/ns_last_pid");
    let (Some(newest), Some(max)) = (last, pid_max.filter(|m| *m > 0)) else {
        pids.sort_unstable_by(|a, b| b.cmp(a));
        return pids;
    };
    let age = |p: u32| (i64::from(newest) - i64::from(p)).rem_euclid(i64::from(max));
    pids.sort_unstable_by_key(|p| age(*p));
    let newest_listed = pids.first().map_or(64, |p| age(*p).min(64));
    counting_back(last, pid_max, newest_listed)
        .chain(pids)
        .collect()
}

/// `count` pids counted back from `last` (the newest given out), wrapping below 1 to
/// `pid_max`; none when either is unknown.
fn counting_back(last: Option<u32>, pid_max: Option<u32>, count: i64) -> impl Iterator<Item = u32> {
    let start = last.zip(pid_max.filter(|m| *m > 0));
    (0..count)
        .filter_map(move |back| {
            let (last, max) = start?;
            u32::try_from((i64::from(last) - back).rem_euclid(i64::from(max))).ok()
        })
        .filter(|p| *p > 0)
}

/// A number a one-line /proc file holds (`pid_max`, `ns_last_pid`).
fn read_number(path: &str) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The process group and session of `pid`, from `/proc/<pid>/stat` (after the command name,
/// which may hold spaces and parentheses: fields 5 and 6 follow the last `)`).
fn group_and_session(pid: i32) -> Option<(i32, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(2);
    let pgrp = fields.next()?.parse().ok()?;
    let session = fields.next()?.parse().ok()?;
    Some((pgrp, session))
}

/// Removes a command from [`RUNNING`] when it ends, however it ends.
struct RunningGuard(i32);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        if let Ok(mut g) = RUNNING.lock() {
            g.remove(&self.0);
        }
    }
}

/// Calls of a host that can be cancelled (an MCP request), by id: the foreground command each
/// one runs, and the ids cancelled.
#[derive(Default)]
struct Calls {
    groups: BTreeMap<i32, u64>,
    cancelled: std::collections::BTreeSet<u64>,
    /// What else cancels a call: the call forwarded to a backend's tool agent
    /// ([`on_cancel_of_current_call`]), by call id and hook number.
    hooks: BTreeMap<(u64, u64), CancelHook>,
}

/// Run when its call is cancelled, on a thread of its own (it may block on a socket).
type CancelHook = Box<dyn FnOnce() + Send>;

static CALLS: LazyLock<Mutex<Calls>> = LazyLock::new(|| Mutex::new(Calls::default()));

thread_local! {
    /// The cancellable call this thread is serving ([`in_call`]).
    static CALL: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` (a tool call) as the cancellable call `id`: a foreground command it starts is
/// killed with its group by [`cancel_call`], and none starts after that.
pub fn in_call<R>(id: u64, f: impl FnOnce() -> R) -> R {
    struct Reset(Option<u64>, u64);
    impl Drop for Reset {
        fn drop(&mut self) {
            CALL.with(|c| c.set(self.0));
            if let Ok(mut calls) = CALLS.lock() {
                calls.cancelled.remove(&self.1);
            }
        }
    }
    let _reset = Reset(CALL.with(|c| c.replace(Some(id))), id);
    f()
}

/// Cancels the call `id` (its client gave up on it): kills the foreground command it runs, with
/// its process group, and refuses the ones it would start later (say, after an approval that
/// was still pending).
pub fn cancel_call(id: u64) {
    let Ok(mut calls) = CALLS.lock() else {
        return;
    };
    calls.cancelled.insert(id);
    for (pgid, _) in calls.groups.iter().filter(|(_, c)| **c == id) {
        let _ = killpg(Pid::from_raw(*pgid), Signal::SIGKILL);
    }
    let keys: Vec<(u64, u64)> = calls
        .hooks
        .range((id, 0)..=(id, u64::MAX))
        .map(|(k, _)| *k)
        .collect();
    for key in keys {
        if let Some(hook) = calls.hooks.remove(&key) {
            // Callers drop their guard (an async task's drop, say): never block them.
            let _ = std::thread::Builder::new()
                .name("vibeos-cancel".into())
                .spawn(hook);
        }
    }
}

/// The cancellable call this thread serves ([`in_call`]), if any.
pub fn current_call() -> Option<u64> {
    CALL.with(|c| c.get())
}

/// Runs `hook` if the call this thread serves is cancelled while the returned guard lives:
/// how a call forwarded to a backend's tool agent reaches the command it runs over there.
/// `Ok(None)` (`hook` dropped) when the thread serves no cancellable call; [`CallCancelled`]
/// when its call was cancelled already (nothing should be forwarded then).
pub fn on_cancel_of_current_call(
    hook: CancelHook,
) -> Result<Option<CancelHookGuard>, CallCancelled> {
    static NEXT_HOOK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let Some(id) = current_call() else {
        return Ok(None);
    };
    let mut calls = CALLS.lock().unwrap_or_else(|p| p.into_inner());
    if calls.cancelled.contains(&id) {
        return Err(CallCancelled);
    }
    let key = (
        id,
        NEXT_HOOK.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    );
    calls.hooks.insert(key, hook);
    Ok(Some(CancelHookGuard(key)))
}

/// The call was cancelled by its client before this step.
#[derive(Debug, thiserror::Error)]
#[error("the call was cancelled by its client")]
pub struct CallCancelled;

/// Unregisters a hook of [`on_cancel_of_current_call`] when the forwarded call returned.
pub struct CancelHookGuard((u64, u64));

impl Drop for CancelHookGuard {
    fn drop(&mut self) {
        if let Ok(mut calls) = CALLS.lock() {
            calls.hooks.remove(&self.0);
        }
    }
}

/// Registers the command `pgid` under the thread's call, or kills it when that call was
/// cancelled meanwhile; the guard unregisters it.
fn register_call(pgid: Pid) -> Result<Option<CallGuard>, BackendError> {
    let Some(id) = CALL.with(|c| c.get()) else {
        return Ok(None);
    };
    let mut calls = CALLS.lock().unwrap_or_else(|p| p.into_inner());
    if calls.cancelled.contains(&id) {
        let _ = killpg(pgid, Signal::SIGKILL);
        return Err(BackendError::Spawn(std::io::Error::new(
            std::io::ErrorKind::Interrupted,
            "the call was cancelled by its client",
        )));
    }
    calls.groups.insert(pgid.as_raw(), id);
    Ok(Some(CallGuard(pgid.as_raw())))
}

struct CallGuard(i32);

impl Drop for CallGuard {
    fn drop(&mut self) {
        if let Ok(mut calls) = CALLS.lock() {
            calls.groups.remove(&self.0);
        }
    }
}

/// Runs a command in the foreground: waits up to `timeout`, keeps at most `cap` bytes of output.
pub fn run_foreground(
    spec: &SpawnSpec<'_>,
    timeout: Duration,
    cap: usize,
) -> Result<RunOutput, BackendError> {
    let started = Instant::now();
    let Spawned {
        mut child,
        pgid,
        mut reader,
        stdin,
    } = spawn(spec)?;
    drop(stdin);
    if let Ok(mut g) = RUNNING.lock() {
        g.insert(pgid.as_raw(), spec.scope);
    }
    if let Some(scope) = spec.scope {
        remember_left_group(scope, pgid.as_raw());
    }
    let _running = RunningGuard(pgid.as_raw());
    // Registered first, checked second: an execution's end marks its scope ended, then kills
    // the groups registered so far ([`kill_scope`]), so a command that started meanwhile is
    // either among those or sees the mark here.
    if spec.scope.is_some_and(crate::call_scope::ended_at) {
        let _ = killpg(pgid, Signal::SIGKILL);
        let _ = child.wait();
        return Err(BackendError::Spawn(std::io::Error::new(
            std::io::ErrorKind::Interrupted,
            "the execution ended before the command could run",
        )));
    }
    let _call = match register_call(pgid) {
        Ok(guard) => guard,
        Err(e) => {
            let _ = child.wait();
            return Err(e);
        }
    };
    let capture = Arc::new((Mutex::new((HeadTail::new(cap), false)), Condvar::new()));
    let cap2 = Arc::clone(&capture);
    let reader_thread = std::thread::Builder::new()
        .name("terminal-output".into())
        .spawn(move || {
            pump(&mut reader, |chunk| {
                if let Ok(mut g) = cap2.0.lock() {
                    g.0.push(chunk);
                }
            });
            if let Ok(mut g) = cap2.0.lock() {
                g.1 = true;
            }
            cap2.1.notify_all();
        });
    if let Err(e) = reader_thread {
        let _ = kill_group(pgid, &mut child);
        return Err(BackendError::Spawn(e));
    }
    let deadline = started + timeout;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) => {}
            Err(_) => break None,
        }
        if Instant::now() >= deadline {
            timed_out = true;
            break kill_group(pgid, &mut child);
        }
        std::thread::sleep(Duration::from_millis(5).max(Duration::from_millis(
            (started.elapsed().as_millis() / 50).min(50) as u64,
        )));
    };
    // Wait for the reader to see EOF; a background process the command left holding the pipe
    // must not hold the call hostage.
    let (lock, cvar) = &*capture;
    let mut detached_output = false;
    if let Ok(guard) = lock.lock() {
        let (guard, res) = cvar
            .wait_timeout_while(guard, DRAIN_AFTER_EXIT, |g| !g.1)
            .unwrap_or_else(|e| e.into_inner());
        if res.timed_out() && !guard.1 {
            detached_output = true;
        }
    }
    let (output, truncated, output_bytes) = match lock.lock() {
        Ok(g) => (g.0.render("output"), g.0.truncated(), g.0.total()),
        Err(e) => {
            let g = e.into_inner();
            (g.0.render("output"), g.0.truncated(), g.0.total())
        }
    };
    let output = if spec.pty {
        output.replace("\r\n", "\n")
    } else {
        output
    };
    Ok(RunOutput {
        output,
        truncated,
        output_bytes,
        exit_code: status.map(exit_code).unwrap_or(-1),
        timed_out,
        detached_output,
        duration: started.elapsed(),
    })
}

/// Reads `reader` to its end in 64 KiB chunks, handing each to `sink`; a read error ends it
/// like end of file (the process is gone or its pipe broke).
pub(super) fn pump(reader: &mut impl Read, mut sink: impl FnMut(&[u8])) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => sink(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Vec<(String, String)> {
        vec![("PATH".into(), std::env::var("PATH").unwrap_or_default())]
    }

    fn spec<'a>(cmd: &'a str, env: &'a [(String, String)], pty: bool) -> SpawnSpec<'a> {
        SpawnSpec {
            command: cmd,
            shown_command: cmd,
            cwd: Path::new("/"),
            starts_in: Path::new("/"),
            env,
            pty,
            scope: None,
        }
    }

    #[test]
    fn runs_and_reports_exit_code() {
        let e = env();
        let out = run_foreground(
            &spec("echo out; echo err >&2; exit 3", &e, false),
            Duration::from_secs(10),
            1000,
        )
        .unwrap();
        assert_eq!(out.exit_code, 3);
        assert_eq!(out.output, "out\nerr\n");
        assert!(!out.timed_out);
    }

    #[test]
    fn timeout_kills_the_group() {
        let e = env();
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let cmd = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
        let out = run_foreground(&spec(&cmd, &e, false), Duration::from_millis(500), 1000).unwrap();
        assert!(out.timed_out);
        assert!(out.duration < Duration::from_secs(5));
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z"),
            "sleep survived: {stat}"
        );
    }

    #[test]
    fn a_login_environment_from_sshd_does_not_make_bash_read_the_bashrc() {
        // The tool agent over ssh: SSH_CLIENT set, no shell level. Debian's bash (the one
        // these machines run) then reads ~/.bashrc for `bash -c`.
        let home = tempfile::tempdir().unwrap();
        std::fs::write(
            home.path().join(".bashrc"),
            "echo NOISE-OUT\necho NOISE-ERR >&2\ncd /tmp\n",
        )
        .unwrap();
        let mut e = env();
        e.push(("HOME".into(), home.path().display().to_string()));
        e.push(("SSH_CLIENT".into(), "127.0.0.1 40000 22".into()));
        let out = run_foreground(&spec("pwd", &e, false), Duration::from_secs(10), 1000).unwrap();
        assert_eq!(out.output, "/\n");
        // A caller's own shell level is kept.
        e.push(("SHLVL".into(), "3".into()));
        let out = run_foreground(
            &spec("echo $SHLVL", &e, false),
            Duration::from_secs(10),
            1000,
        )
        .unwrap();
        assert_eq!(out.output, "4\n");
    }

    #[test]
    fn flood_is_capped() {
        let e = env();
        let out = run_foreground(
            &spec("yes abcdefgh | head -c 5000000", &e, false),
            Duration::from_secs(30),
            10_000,
        )
        .unwrap();
        assert!(out.truncated);
        assert_eq!(out.output_bytes, 5_000_000);
        assert!(out.output.len() < 11_000);
    }

    #[test]
    fn pty_mode_has_a_terminal() {
        let e = env();
        let out = run_foreground(
            &spec("test -t 1 && echo tty || echo notty", &e, true),
            Duration::from_secs(10),
            1000,
        )
        .unwrap();
        assert_eq!(out.output.trim(), "tty");
        let out = run_foreground(
            &spec("test -t 1 && echo tty || echo notty", &e, false),
            Duration::from_secs(10),
            1000,
        )
        .unwrap();
        assert_eq!(out.output.trim(), "notty");
    }

    #[test]
    fn a_pty_has_a_window_size_and_pagers_do_not_wait() {
        let e = env();
        let out = run_foreground(
            &spec("stty size; echo $PAGER $GIT_PAGER", &e, true),
            Duration::from_secs(10),
            1000,
        )
        .unwrap();
        assert_eq!(out.output, "50 200\ncat cat\n");
        // A caller's own pager stays.
        let mut own = env();
        own.push(("PAGER".into(), "more".into()));
        let out = run_foreground(
            &spec("echo $PAGER $GIT_PAGER", &own, true),
            Duration::from_secs(10),
            1000,
        )
        .unwrap();
        assert_eq!(out.output, "more cat\n");
        // `git log` with more commits than a screen holds: it paged, and sat in `less` until
        // the timeout.
        if std::process::Command::new("git")
            .arg("--version")
            .output()
            .is_err()
        {
            vibeos_testkit::skip!("git is not installed: the pager check needs it");
        }
        let repo = tempfile::tempdir().unwrap();
        let mut e = env();
        for (k, v) in [
            ("GIT_AUTHOR_NAME", "t"),
            ("GIT_AUTHOR_EMAIL", "t@example.invalid"),
            ("GIT_COMMITTER_NAME", "t"),
            ("GIT_COMMITTER_EMAIL", "t@example.invalid"),
            ("GIT_CONFIG_NOSYSTEM", "1"),
            ("HOME", &repo.path().display().to_string()),
        ] {
            e.push((k.into(), v.into()));
        }
        let setup = format!(
            "cd {} && git init -q && for i in $(seq 80); do git commit -q --allow-empty -m c$i \
             || exit 1; done && echo made",
            repo.path().display()
        );
        let out = run_foreground(&spec(&setup, &e, false), Duration::from_secs(120), 1000).unwrap();
        assert_eq!(out.output, "made\n", "{out:?}");
        let log = format!("cd {} && git log", repo.path().display());
        let out = run_foreground(&spec(&log, &e, true), Duration::from_secs(20), 100_000).unwrap();
        assert!(!out.timed_out, "{out:?}");
        assert_eq!(out.exit_code, 0, "{out:?}");
        assert!(out.output.contains("c1\n") && out.output.contains("c80\n"));
    }

    #[test]
    fn a_command_longer_than_an_argument_can_be_runs() {
        // The probe's finding: a command over 128 KiB failed with "could not start the shell:
        // Argument list too long (os error 7)".
        let e = env();
        let filler = "x".repeat(200_000);
        let cmd = format!(
            ": {filler}; echo done; [ -e /proc/self/fd/3 ] && echo fd3-open\n5\necho $LINENO"
        );
        for pty in [false, true] {
            let out =
                run_foreground(&spec(&cmd, &e, pty), Duration::from_secs(30), 10_000).unwrap();
            assert!(
                out.output.starts_with("done\n")
                    && out.output.ends_with("line 2: 5: command not found\n3\n"),
                "pty {pty}: {out:?}"
            );
            assert_eq!(out.exit_code, 0, "{out:?}");
        }
        // One that fits in an argument still travels as one.
        assert!(command_file(&"y".repeat(ARGV_COMMAND_MAX))
            .unwrap()
            .is_none());
        assert!(command_file(&"y".repeat(ARGV_COMMAND_MAX + 1))
            .unwrap()
            .is_some());
    }

    #[test]
    fn pids_are_counted_back_across_the_wrap() {
        let pids: Vec<u32> = counting_back(Some(2), Some(100), 5).collect();
        assert_eq!(pids, vec![2, 1, 99, 98], "pid 0 is never given out");
        assert_eq!(counting_back(None, Some(100), 5).count(), 0);
        assert_eq!(counting_back(Some(2), Some(0), 5).count(), 0);
    }

    #[test]
    fn a_listing_is_ordered_newest_first_after_the_pids_given_out_since() {
        let max = read_number("/proc/sys/kernel/pid_max").expect("/proc/sys/kernel/pid_max");
        let own = std::process::id();
        let older = if own > 1 { own - 1 } else { max - 1 };
        let ordered = newest_first(vec![older, own], Some(max));
        let at = |p: u32| ordered.iter().position(|q| *q == p);
        assert!(at(own) < at(older), "{ordered:?}");
        // Pids given out after this process (threads of the test harness, other processes)
        // come first, at most 64 of them.
        assert!(ordered.len() <= 66, "{}", ordered.len());
    }
}
