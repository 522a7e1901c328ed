//! A process running in an environment, as the backend-neutral handle callers hold.
//!
//! Why this exists: callers (execute_code, the tool agent, `exec`) need byte streams, a wait
//! and a kill that reaches the *whole process group over there* — and nothing else. A backend
//! driven by a CLI client (`docker exec`, `ssh`) implements it with a local client process plus
//! a remote kill; an HTTP-API or SDK backend implements [`Process`] over its own session and
//! hands out its own streams. Nobody has to fake a local `std::process::Command`.
//!
//! CLI backends start every command through [`group_wrapper`]: a POSIX `sh` line that puts the
//! command in a new session (so it leads its own process group), records that group's id in a
//! file on that side, waits, removes the file (in the background, so the exit does not wait for
//! `rm`) and exits with the command's status. Killing the local client alone would leave the
//! remote command running; [`ClientProcess::kill`] runs `kill -s SIG -- -PGID` there instead.

use super::{shell_quote, EnvError};
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag};
use nix::unistd::Pid;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

/// A signal for a process group over there; only these are needed to stop commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupSignal {
    /// SIGINT: an interrupt, as Ctrl-C would send.
    Int,
    /// SIGTERM: asks it to exit.
    Term,
    /// SIGKILL: ends it.
    Kill,
}

impl GroupSignal {
    /// The name `kill -s` takes.
    pub fn name(self) -> &'static str {
        match self {
            GroupSignal::Int => "INT",
            GroupSignal::Term => "TERM",
            GroupSignal::Kill => "KILL",
        }
    }

    fn nix(self) -> Signal {
        match self {
            GroupSignal::Int => Signal::SIGINT,
            GroupSignal::Term => Signal::SIGTERM,
            GroupSignal::Kill => Signal::SIGKILL,
        }
    }
}

/// What to run in an environment: argv, working dir and variables.
#[derive(Debug, Clone, Default)]
pub struct ExecSpec {
    /// The program and its arguments (never empty when run).
    pub argv: Vec<String>,
    /// Working dir over there; `None`: the environment's default.
    pub cwd: Option<String>,
    /// Variables set on top of the environment's own. CLI backends pass them in the client's
    /// argv (visible to `ps` on the host and, for ssh, on the remote host): send secrets on
    /// stdin instead, as execute_code does.
    pub env: Vec<(String, String)>,
}

impl ExecSpec {
    /// Runs `argv` in the default working dir with the default environment.
    pub fn new<S: Into<String>>(argv: impl IntoIterator<Item = S>) -> Self {
        ExecSpec {
            argv: argv.into_iter().map(Into::into).collect(),
            cwd: None,
            env: Vec::new(),
        }
    }

    /// Sets the working dir.
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Adds a variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Refuses what no backend can run (an empty argv), naming the backend.
    pub fn check(&self, backend: &'static str) -> Result<(), EnvError> {
        if self.argv.first().is_none_or(|p| p.is_empty()) {
            return Err(EnvError::Command {
                backend,
                what: "starting a command".into(),
                message: "the argv is empty: name the program to run".into(),
            });
        }
        Ok(())
    }

    /// The argv as one line for logs and error messages.
    pub fn display(&self) -> String {
        self.argv.join(" ")
    }
}

/// A started process: its streams (each `None` once taken) and its control handle.
pub struct Spawned {
    /// Its stdin; dropping it closes the stream.
    pub stdin: Option<Box<dyn Write + Send>>,
    /// Its stdout.
    pub stdout: Option<Box<dyn Read + Send>>,
    /// Its stderr.
    pub stderr: Option<Box<dyn Read + Send>>,
    /// Wait and kill; shareable so one thread can wait while another kills.
    pub process: std::sync::Arc<dyn Process>,
}

/// Control of a process running in an environment. All methods take `&self`: a blocked
/// [`Process::wait`] on one thread must not stop [`Process::kill`] on another.
pub trait Process: Send + Sync {
    /// Blocks until it ends: the exit code, or `-N` when a signal N ended it.
    fn wait(&self) -> Result<i32, EnvError>;

    /// The exit code if it has ended, without blocking.
    fn try_wait(&self) -> Result<Option<i32>, EnvError>;

    /// Sends `signal` to its whole process group over there (what it started, too).
    fn kill(&self, signal: GroupSignal) -> Result<(), EnvError>;
}

/// How a [`ClientProcess`] reaches the process group over there.
pub type RemoteKill = Box<dyn Fn(GroupSignal) -> Result<(), EnvError> + Send + Sync>;

/// A process driven through a local client (or a local process itself): waited for through
/// the client, killed through `remote_kill` (or, with none, the local process group).
pub struct ClientProcess {
    backend: &'static str,
    pid: Pid,
    child: Mutex<Child>,
    remote_kill: Option<RemoteKill>,
}

impl ClientProcess {
    /// Spawns `cmd` with all three streams piped. With `remote_kill` `None` the command must
    /// lead its own process group here (`process_group(0)`), which [`Process::kill`] signals.
    pub fn spawn(
        backend: &'static str,
        mut cmd: Command,
        remote_kill: Option<RemoteKill>,
    ) -> Result<Spawned, EnvError> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|source| EnvError::Spawn {
            backend,
            program: cmd.get_program().to_string_lossy().into_owned(),
            source,
            setting: client_setting(backend),
        })?;
        let stdin = child
            .stdin
            .take()
            .map(|s| Box::new(s) as Box<dyn Write + Send>);
        let stdout = child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>);
        let stderr = child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>);
        let pid = Pid::from_raw(child.id() as i32);
        Ok(Spawned {
            stdin,
            stdout,
            stderr,
            process: std::sync::Arc::new(ClientProcess {
                backend,
                pid,
                child: Mutex::new(child),
                remote_kill,
            }),
        })
    }

    /// Kills the local client (not what it started over there).
    pub fn kill_client(&self) {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
        }
    }

    fn io(&self, what: &str, e: impl std::fmt::Display) -> EnvError {
        EnvError::Command {
            backend: self.backend,
            what: what.into(),
            message: e.to_string(),
        }
    }
}

/// What chooses the local client program of `backend`, for "cannot run" errors.
fn client_setting(backend: &str) -> &'static str {
    match backend {
        "docker" | "podman" => "terminal.docker_binary",
        "ssh" => "PATH (the OpenSSH client `ssh`)",
        "singularity" => "PATH (`apptainer` or `singularity`)",
        _ => "PATH",
    }
}

fn code_of(status: std::process::ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| -s))
        .unwrap_or(-1)
}

impl Process for ClientProcess {
    fn wait(&self) -> Result<i32, EnvError> {
        // Block without reaping (WNOWAIT), so the pid stays ours and `kill` on another thread
        // never races with pid reuse; then reap under the lock.
        loop {
            match waitid(
                Id::Pid(self.pid),
                WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT,
            ) {
                Ok(_) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                // ECHILD: someone reaped it already (try_wait below reports it).
                Err(_) => break,
            }
        }
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        child
            .wait()
            .map(code_of)
            .map_err(|e| self.io("waiting for the client", e))
    }

    fn try_wait(&self) -> Result<Option<i32>, EnvError> {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        child
            .try_wait()
            .map(|s| s.map(code_of))
            .map_err(|e| self.io("polling the client", e))
    }

    fn kill(&self, signal: GroupSignal) -> Result<(), EnvError> {
        match &self.remote_kill {
            Some(kill) => kill(signal),
            None => {
                let child = self.child.lock().unwrap_or_else(|p| p.into_inner());
                // Unreaped (we hold the lock that reaping needs), so the group id is still ours.
                let _ = killpg(self.pid, signal.nix());
                drop(child);
                Ok(())
            }
        }
    }
}

impl Drop for ClientProcess {
    fn drop(&mut self) {
        // Nobody waits any more: end the client (like `kill_on_drop`) and reap it.
        let child = self.child.get_mut().unwrap_or_else(|p| p.into_inner());
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The `sh` line that runs `spec` in a new session over there and records its process-group
/// id in `pgid_file` (removed when it ends). `python` is the fallback when `setsid` is missing.
///
/// The command runs in the background of the wrapper shell so that `$!` is its pid — and, as
/// `setsid` does not need to fork there, its session and group id — while the wrapper stays
/// outside that group to clean up and pass on the exit status. Its stdin is handed over
/// explicitly (a background job's stdin would otherwise be /dev/null). `wait` speaks with its
/// stderr closed: dash reports a job that a signal ended ("Killed") on the shell's stderr, which
/// is the command's stderr, so an interrupt or a sandbox teardown would add a line the command
/// never wrote; the status still says how it ended.
///
/// A kill that came before the group was recorded left a note ([`group_kill`]); right after
/// recording, the wrapper claims any note and sends its signal (see [`claim_and_signal`]).
pub fn group_wrapper(spec: &ExecSpec, pgid_file: &str, python: &str) -> String {
    let (cd, cmd) = (cd_prefix(spec), command_words(spec));
    let f = shell_quote(pgid_file);
    let k = shell_quote(&kill_note(pgid_file));
    let py = shell_quote(python);
    let claim = claim_and_signal(pgid_file, "\"$(cat \"$c\" 2>/dev/null)\"");
    format!(
        "{cd}exec 3<&0; if command -v setsid >/dev/null 2>&1; then setsid {cmd} <&3 3<&- & \
         else {py} -c 'import os,sys;os.setsid();os.execvp(sys.argv[1],sys.argv[1:])' {cmd} <&3 3<&- & fi; \
         p=$!; exec 3<&-; echo $p > {f}; {claim}; wait $p 2>/dev/null; s=$?; \
         rm -f {f} {k} </dev/null >/dev/null 2>&1 & exit $s"
    )
}

/// Where a kill that found no recorded group leaves its signal for the wrapper.
fn kill_note(pgid_file: &str) -> String {
    format!("{pgid_file}.k")
}

/// The `sh` line, run with the group's id in `$p`, that claims the kill note and, if this side
/// got it, signals the group with `signal` (a shell word; `$c` names the claimed note).
///
/// Both sides write first and read second: [`group_kill`] writes the note and then reads the
/// pgid file, the wrapper writes the pgid file and then claims the note. So at least one of them
/// sees the other's write, and as the claim is a rename, exactly one of them sends the signal.
/// A note is looked for with the shell's own `test` before `mv` runs, so a command nobody
/// killed costs its wrapper no extra process.
/// The group may not exist yet even once its id is known (the command between its fork and its
/// `setsid`, having started nothing): the signal is retried while the command lives, briefly
/// and bounded (2 s), and never sent to the command alone, which could make its group and
/// children between two `kill`s.
fn claim_and_signal(pgid_file: &str, signal: &str) -> String {
    let k = shell_quote(&kill_note(pgid_file));
    // The claimed name ends in this shell's pid, so it must expand: only the path is quoted.
    let c = format!("{k}.\"$$\"");
    format!(
        "c={c}; if [ -e {k} ] && mv -f {k} \"$c\" 2>/dev/null; then g={signal}; rm -f \"$c\"; n=0; \
         until kill -s \"$g\" -- -\"$p\" 2>/dev/null || ! kill -0 \"$p\" 2>/dev/null \
         || [ $n -ge 200 ]; do n=$((n+1)); sleep 0.01 2>/dev/null || sleep 1; done; fi"
    )
}

/// The `sh` line that runs `spec` as is (`exec`, no wrapper): for a command that leads its own
/// process group and records it itself ([`super::Environment::spawn_leader`]).
pub fn exec_line(spec: &ExecSpec) -> String {
    format!("{}exec {}", cd_prefix(spec), command_words(spec))
}

/// `spec`'s variables (through `env`) and argv as shell words.
fn command_words(spec: &ExecSpec) -> String {
    let mut words: Vec<String> = Vec::new();
    if !spec.env.is_empty() {
        words.push("env".into());
        words.extend(
            spec.env
                .iter()
                .map(|(k, v)| shell_quote(&format!("{k}={v}"))),
        );
    }
    words.push(shell_line(&spec.argv));
    words.join(" ")
}

/// `argv` as one `sh` command line: each word quoted, nothing expanded.
pub fn shell_line(argv: &[String]) -> String {
    argv.iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `cd DIR; ` for `spec`'s working dir (exit 125 naming it when it is missing), or nothing.
fn cd_prefix(spec: &ExecSpec) -> String {
    spec.cwd
        .as_ref()
        .map(|c| {
            format!(
                "cd {} || {{ echo \"vibeos-exec: no directory {}\" >&2; exit 125; }}; ",
                shell_quote(c),
                c.replace(['"', '\\', '$', '`'], "?")
            )
        })
        .unwrap_or_default()
}

/// Run over there (by [`tree_kill_argv`]) with a leader's pid and a signal name: signals every
/// process below the leader and every other member of its session (the script stays in it
/// unless it calls setsid; one that did is still below the leader, a subreaper), never the
/// leader itself, which must survive to reap the script and report its status. The leader is
/// sent SIGCONT: a script may have stopped it. With KILL it repeats until nothing but zombies
/// is left (bounded), so a script forking while it is killed does not leave a child behind.
pub const TREE_KILL: &str = r#"
import os, signal, sys, time
b, sig = int(sys.argv[1]), getattr(signal, "SIG" + sys.argv[2])
def targets():
    kids, found = {}, set()
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % e) as f:
                st = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        p = int(e)
        if st[0] == "Z":
            continue
        kids.setdefault(int(st[1]), []).append(p)
        if int(st[3]) == b and p != b:
            found.add(p)
    todo = [b]
    while todo:
        for k in kids.get(todo.pop(), []):
            found.add(k)
            todo.append(k)
    found.discard(b)
    return found
deadline = time.monotonic() + 3
while True:
    left = targets()
    for p in left:
        try:
            os.kill(p, sig)
        except OSError:
            pass
    try:
        os.kill(b, signal.SIGCONT)
    except OSError:
        pass
    if sig != signal.SIGKILL or not left or time.monotonic() > deadline:
        break
    time.sleep(0.01)
"#;

/// The argv that runs [`TREE_KILL`] with `python` against the leader `pid`: a fresh process,
/// started by the backend's own API or engine, so that a script that stopped or fooled the
/// helpers of its execution (its bootstrap, the relay, a pgid file) is still reached.
pub fn tree_kill_argv(python: &str, pid: i32, signal: GroupSignal) -> Vec<String> {
    vec![
        python.to_string(),
        "-c".to_string(),
        TREE_KILL.to_string(),
        pid.to_string(),
        signal.name().to_string(),
    ]
}

/// Run over there (by [`scope_sweep_argv`]) with an execution's scope marker and a mode:
/// SIGKILLs every process that carries the marker — as an argv word (the bootstrap and the
/// script, a fork of it) or as `VIBEOS_EXECUTION_SCOPE=<marker>` in its environment (what the
/// script exec'd, even after `setsid` and a double fork) — except itself. With `spare` it
/// leaves out the marked processes whose parent is neither marked nor init (the bootstrap,
/// whose parent is sshd or the engine's exec) and sends them SIGCONT instead, so a bootstrap
/// the script stopped resumes, reaps and reports. It needs nothing of the execution's own
/// helpers, which the script may have killed or stopped. Repeats until none is left (bounded),
/// so a script forking while it is killed does not leave a child behind.
pub const SCOPE_SWEEP: &str = r#"
import os, sys, time
m = sys.argv[1].encode()
spare = sys.argv[2] == "spare"
env = b"VIBEOS_EXECUTION_SCOPE=" + m
me = os.getpid()
def marked():
    hits, parent = set(), {}
    for e in os.listdir("/proc"):
        if not e.isdigit() or int(e) == me:
            continue
        p = int(e)
        try:
            with open("/proc/%s/stat" % e) as f:
                st = f.read().rsplit(")", 1)[1].split()
            if st[0] == "Z":
                continue
            parent[p] = int(st[1])
            with open("/proc/%s/cmdline" % e, "rb") as f:
                hit = m in f.read().split(b"\0")
            if not hit:
                with open("/proc/%s/environ" % e, "rb") as f:
                    hit = env in f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if hit:
            hits.add(p)
    return hits, parent
deadline = time.monotonic() + 3
while True:
    hits, parent = marked()
    roots = set()
    if spare:
        roots = {p for p in hits if parent.get(p) not in hits and parent.get(p) != 1}
    for p in hits - roots:
        try:
            os.kill(p, 9)
        except OSError:
            pass
    for p in roots:
        try:
            os.kill(p, 18)
        except OSError:
            pass
    if not hits - roots or time.monotonic() > deadline:
        break
    time.sleep(0.01)
"#;

/// The argv that runs [`SCOPE_SWEEP`] with `python` for the execution marked `scope`: with
/// `spare_leader` the execution's bootstrap is resumed rather than killed.
pub fn scope_sweep_argv(python: &str, scope: &str, spare_leader: bool) -> Vec<String> {
    vec![
        python.to_string(),
        "-c".to_string(),
        SCOPE_SWEEP.to_string(),
        scope.to_string(),
        if spare_leader { "spare" } else { "all" }.to_string(),
    ]
}

/// The `sh` line that signals the group recorded in `pgid_file` (nothing when it has ended).
///
/// The signal is written down first, as a note next to `pgid_file`, and the group read second:
/// a command killed while its wrapper was still starting (a 2 s timeout on a loaded host) had
/// recorded no group yet, and used to run on for good. Whichever of this line and the wrapper
/// comes second sends the signal ([`claim_and_signal`]). A note nobody claims (the command had
/// already ended) stays until the environment's files go.
pub fn group_kill(pgid_file: &str, signal: GroupSignal) -> String {
    let f = shell_quote(pgid_file);
    let k = shell_quote(&kill_note(pgid_file));
    let sig = signal.name();
    let claim = claim_and_signal(pgid_file, sig);
    format!("echo {sig} > {k} 2>/dev/null; p=$(cat {f} 2>/dev/null) && [ -n \"$p\" ] && {{ {claim}; }}; true")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Waits for `wrapper` for up to 20 s; past that, kills its group through `pgid_file` and
    /// fails, so a lost kill cannot leave the test's sleeps behind.
    fn ended_within_deadline(mut wrapper: Child, pgid_file: &str) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            if let Some(status) = wrapper.try_wait().unwrap() {
                return status;
            }
            if std::time::Instant::now() > deadline {
                let _ = Command::new("sh")
                    .arg("-c")
                    .arg(group_kill(pgid_file, GroupSignal::Kill))
                    .status();
                let _ = wrapper.kill();
                let _ = wrapper.wait();
                panic!("the kill never reached the command's group");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Whether a process whose argv is exactly `args` is still alive (zombies aside).
    fn running(args: &str) -> bool {
        let ps = Command::new("ps")
            .args(["-eo", "stat=,args="])
            .output()
            .unwrap();
        String::from_utf8_lossy(&ps.stdout)
            .lines()
            .any(|l| l.trim_end().ends_with(args) && !l.trim_start().starts_with('Z'))
    }

    #[test]
    fn a_kill_sent_before_the_group_is_recorded_reaches_it_once_it_is() {
        // A 2 s timeout on a loaded host killed an ssh command whose wrapper had not recorded
        // its group yet: the kill found nothing, and `sleep` ran on for good.
        let dir = tempfile::tempdir().unwrap();
        let pgid_file = dir.path().join("pg").display().to_string();
        let kill = Command::new("sh")
            .arg("-c")
            .arg(group_kill(&pgid_file, GroupSignal::Term))
            .status()
            .unwrap();
        assert!(kill.success());
        let spec = ExecSpec::new(["sh", "-c", "sleep 4717 & sleep 4718; wait"]);
        let wrapper = Command::new("sh")
            .arg("-c")
            .arg(group_wrapper(&spec, &pgid_file, "python3"))
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let status = ended_within_deadline(wrapper, &pgid_file);
        assert_eq!(status.code(), Some(128 + 15), "{status:?}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while (running("sleep 4717") || running("sleep 4718"))
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!running("sleep 4717") && !running("sleep 4718"));
        // The note was claimed and the pgid file removed once the command ended.
        while std::fs::read_dir(dir.path()).unwrap().count() > 0
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_kill_racing_the_start_of_a_command_always_reaches_its_group() {
        // Kills sent at every point of the wrapper's start: before the group is recorded,
        // between the fork and the `setsid`, and after. None may leave the command running.
        let dir = tempfile::tempdir().unwrap();
        for round in 0..40u32 {
            let pgid_file = dir.path().join(format!("pg{round}")).display().to_string();
            let spec = ExecSpec::new(["sh", "-c", "sleep 4719 & sleep 4720; wait"]);
            let start = || {
                Command::new("sh")
                    .arg("-c")
                    .arg(group_wrapper(&spec, &pgid_file, "python3"))
                    .stdin(Stdio::null())
                    .spawn()
                    .unwrap()
            };
            let kill = || {
                Command::new("sh")
                    .arg("-c")
                    .arg(group_kill(&pgid_file, GroupSignal::Kill))
                    .spawn()
                    .unwrap()
            };
            // Half the rounds start the kill first, half the command; the other one follows
            // after a delay that grows through the rounds.
            let gap = std::time::Duration::from_micros(u64::from(round / 2) * 300);
            let (wrapper, mut killer) = if round % 2 == 0 {
                let killer = kill();
                std::thread::sleep(gap);
                (start(), killer)
            } else {
                let wrapper = start();
                std::thread::sleep(gap);
                (wrapper, kill())
            };
            assert!(killer.wait().unwrap().success());
            let status = ended_within_deadline(wrapper, &pgid_file);
            assert_eq!(status.code(), Some(128 + 9), "round {round}: {status:?}");
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while (running("sleep 4719") || running("sleep 4720"))
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!running("sleep 4719") && !running("sleep 4720"));
    }

    #[test]
    fn the_wrapper_runs_the_command_in_its_own_group_and_kill_reaches_all_of_it_quietly() {
        let dir = tempfile::tempdir().unwrap();
        let pgid_file = dir.path().join("pg").display().to_string();
        let spec = ExecSpec::new(["sh", "-c", "sleep 30 & echo started; cat; wait"])
            .cwd(dir.path().display().to_string())
            .env("MARK", "x y");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(group_wrapper(&spec, &pgid_file, "python3"));
        let kill_file = pgid_file.clone();
        let mut spawned = ClientProcess::spawn(
            "test",
            cmd,
            Some(Box::new(move |sig| {
                let out = Command::new("sh")
                    .arg("-c")
                    .arg(group_kill(&kill_file, sig))
                    .output()
                    .unwrap();
                assert!(out.status.success());
                Ok(())
            })),
        )
        .unwrap();
        let mut line = [0u8; 8];
        spawned
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut line)
            .unwrap();
        assert_eq!(&line, b"started\n");
        // The wrapper records the group after starting the command, so "started" can come
        // first: wait for the record rather than racing it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let pgid: i32 = loop {
            let text = std::fs::read_to_string(&pgid_file).unwrap_or_default();
            if let Ok(pgid) = text.trim().parse() {
                break pgid;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no process group recorded"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_ne!(pgid, nix::unistd::getpgrp().as_raw());
        spawned.process.kill(GroupSignal::Kill).unwrap();
        let code = spawned.process.wait().unwrap();
        assert_eq!(code, 128 + 9, "the wrapper reports the kill");
        // The wrapper itself adds nothing to the command's stderr (dash's "Killed").
        let mut stderr = String::new();
        spawned
            .stderr
            .as_mut()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert_eq!(stderr, "", "the kill added a line to stderr");
        // No process of the group is left (orphans are reaped by init a moment later), and
        // the pgid file is gone.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while killpg(Pid::from_raw(pgid), None).is_ok() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(killpg(Pid::from_raw(pgid), None).is_err());
        while std::path::Path::new(&pgid_file).exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!std::path::Path::new(&pgid_file).exists());
    }
}
