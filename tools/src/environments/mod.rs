//! Execution backends: where `terminal`, the file tools and execute_code run (SPEC §9).
//!
//! One abstraction, [`Environment`], serves every caller: a backend starts an environment per
//! task id, runs commands in it (argv, cwd, stdin, timeout, kill of the whole process group
//! there), moves files in and out, and stops it. `local` is the machine this process runs on;
//! `docker` (also podman) and `ssh` are remote. The choice is process-wide
//! (`terminal.backend`, `--backend`), made once by the host through [`activate`]; tools find
//! their task's environment with [`remote_for`] and, when it is remote, forward the call to the
//! tool agent running there ([`agent`]), which runs the very same tool code on that side. So a
//! tool behaves identically wherever it runs, and only what crosses the boundary differs.

pub mod agent;
pub mod docker;
pub mod local;
pub mod local_env;
pub mod manager;
pub mod relay;
pub mod session;
pub mod settings;
pub mod ssh;

pub use crate::capture::HeadTail;
pub use manager::{activate, active, remote_for, shutdown, Environments};
pub use settings::{BackendKind, BackendSettings, SettingsError};

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Errors of a backend: every message says what failed and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// The engine or host could not be reached at all.
    #[error("{backend} backend unreachable: {message}")]
    Unreachable {
        /// Backend name.
        backend: &'static str,
        /// What failed, and what to check.
        message: String,
    },
    /// A command of the backend's client failed.
    #[error("{backend} backend: {what} failed: {message}")]
    Command {
        /// Backend name.
        backend: &'static str,
        /// Which operation.
        what: String,
        /// Its error output.
        message: String,
    },
    /// A client process could not be started.
    #[error("{backend} backend: cannot run {program}: {source}; install it or set terminal.docker_binary")]
    Spawn {
        /// Backend name.
        backend: &'static str,
        /// The program.
        program: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// An operation did not finish in time (the backend hangs).
    #[error("{backend} backend: {what} did not finish within {seconds}s; check that the engine/host responds")]
    Timeout {
        /// Backend name.
        backend: &'static str,
        /// Which operation.
        what: String,
        /// The limit.
        seconds: u64,
    },
    /// The tool agent cannot be started or answered nonsense.
    #[error("{backend} backend: tool agent: {message}")]
    Agent {
        /// Backend name.
        backend: &'static str,
        /// What went wrong.
        message: String,
    },
}

/// What a finished command left behind.
#[derive(Debug, Clone)]
pub struct CommandOutput {
    /// Exit code; `-N` when killed by signal N; `None` when it timed out.
    pub code: Option<i32>,
    /// Its stdout.
    pub stdout: Vec<u8>,
    /// Its stderr.
    pub stderr: Vec<u8>,
}

impl CommandOutput {
    /// Whether it exited with 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// Stderr as text, trimmed (for error messages).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).trim().to_string()
    }
}

/// One environment of a backend: a container, an ssh host, or this machine.
///
/// Commands are built as client processes (`docker exec -i …`, `ssh -S master …`): the caller
/// owns their pipes, so streaming executions (execute_code) and short admin commands share one
/// path. Killing a client process does not stop what it started on the other side; that is
/// what [`Environment::kill_group`] is for.
pub trait Environment: Send + Sync {
    /// The backend's name (`local`, `docker`, `ssh`).
    fn backend(&self) -> &'static str;

    /// Whether this environment is isolated from the host: a container with no host mounts.
    /// Dangerous-command approval may be skipped there (`approvals.skip_in_isolated_backends`).
    fn isolated(&self) -> bool;

    /// The working dir commands and tools start in on that side.
    fn workdir(&self) -> String;

    /// The interpreter on that side (`terminal.python`).
    fn python(&self) -> String;

    /// A client process that runs `argv` there with stdin, stdout and stderr piped.
    fn command(&self, argv: &[String]) -> Command;

    /// [`Environment::command`] for an execution's script: the client also carries what the
    /// channel needs (ssh adds the socket forward to the same request, saving a round trip).
    fn script_command(&self, argv: &[String], _channel: &Channel) -> Command {
        self.command(argv)
    }

    /// Kills the process group `pgid` there with `signal` (`TERM`, `KILL`).
    fn kill_group(&self, pgid_file: &str, signal: &str) -> Result<(), EnvError> {
        let script = format!(
            "p=$(cat '{pgid_file}' 2>/dev/null) && [ -n \"$p\" ] && kill -s {signal} -- -\"$p\" 2>/dev/null; true"
        );
        run(
            self,
            &["sh".into(), "-c".into(), script],
            b"",
            Duration::from_secs(15),
        )
        .map(|_| ())
    }

    /// Where an execution's RPC socket lives on both sides, and how the script reaches it.
    fn open_channel(&self, exec_id: &str) -> Result<Channel, EnvError>;

    /// The tool agent of this environment (started on first use); `None` where tools run in
    /// this process (local).
    fn agent(&self) -> Option<&agent::AgentClient>;

    /// Stops the environment (container stopped and, unless persistent, removed).
    fn stop(&self);
}

/// An execution's RPC socket, seen from both sides. Dropping it removes what the backend set
/// up for it (the socket dir, the ssh forward).
pub struct Channel {
    /// Where the supervisor binds its listener.
    pub local_socket: std::path::PathBuf,
    /// The same socket's path as the script sees it.
    pub remote_socket: String,
    /// The private work dir of the execution on that side (the bootstrap creates it 0700).
    pub remote_dir: String,
    /// An ssh forward spec (`remote.sock:local.sock`) the script's client must request.
    pub forward: Option<String>,
    /// Undoes the set-up when dropped.
    pub guard: Box<dyn Send>,
}

/// Runs `argv` in `env` to completion with `stdin`, killing the client after `timeout`.
pub fn run<E: Environment + ?Sized>(
    env: &E,
    argv: &[String],
    stdin: &[u8],
    timeout: Duration,
) -> Result<CommandOutput, EnvError> {
    let mut cmd = env.command(argv);
    run_client(env.backend(), &mut cmd, stdin, timeout, &argv.join(" "))
}

/// Runs a client command to completion: feeds `stdin`, collects both outputs, kills it after
/// `timeout` so a hung engine or host gives an error instead of a hang.
pub fn run_client(
    backend: &'static str,
    cmd: &mut Command,
    stdin: &[u8],
    timeout: Duration,
    what: &str,
) -> Result<CommandOutput, EnvError> {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|source| EnvError::Spawn {
        backend,
        program: cmd.get_program().to_string_lossy().into_owned(),
        source,
    })?;
    let input = stdin.to_vec();
    let writer = child.stdin.take().map(|mut w| {
        std::thread::spawn(move || {
            let _ = w.write_all(&input);
        })
    });
    let readers = [
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    ]
    .map(|r| {
        r.map(|mut r| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = r.read_to_end(&mut buf);
                buf
            })
        })
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    if let Some(w) = writer {
        let _ = w.join();
    }
    let [out, err] = readers.map(|r| r.and_then(|h| h.join().ok()).unwrap_or_default());
    let Some(status) = status else {
        return Err(EnvError::Timeout {
            backend,
            what: what.chars().take(120).collect(),
            seconds: timeout.as_secs(),
        });
    };
    use std::os::unix::process::ExitStatusExt;
    Ok(CommandOutput {
        code: status.code().or_else(|| status.signal().map(|s| -s)),
        stdout: out,
        stderr: err,
    })
}

/// `s` quoted for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// A shared handle to an environment.
pub type EnvHandle = Arc<dyn Environment>;

/// `n` random bytes from the kernel as hex (tokens, unguessable names); never fails: a missing
/// /dev/urandom falls back to the clock and pid, which still makes names unique.
pub(crate) fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_ok();
    if !ok {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
            ^ u128::from(std::process::id());
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (seed >> ((i % 16) * 8)) as u8;
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
