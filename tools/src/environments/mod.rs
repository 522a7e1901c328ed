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
pub mod background;
pub mod daytona;
pub mod docker;
pub mod host_dirs;
pub mod keeper;
pub mod local;
pub mod local_env;
pub mod manager;
pub mod modal;
pub mod modal_sidecar;
pub mod owner;
pub mod process;
pub mod relay;
pub mod route;
pub mod session;
pub mod settings;
mod shape;
pub mod shared_dir;
pub mod singularity;
mod site;
pub mod ssh;

pub use crate::capture::HeadTail;
pub use manager::{activate, active, remote_for, shutdown, Environments};
pub use process::{ClientProcess, ExecSpec, GroupSignal, Process, Spawned};
pub use settings::{BackendKind, BackendSettings, SettingsError};
pub use site::Site;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

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
    /// The service was reached but refused the credentials (HTTP 401/403, an auth error):
    /// told apart from [`EnvError::Unreachable`], whose fix (the endpoint, the network) differs.
    #[error("{backend} backend: the service refused the credentials: {message}")]
    Refused {
        /// Backend name.
        backend: &'static str,
        /// What was refused, and which variables to check.
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
    #[error("{backend} backend: cannot run {program}: {source}; install it or set {setting}")]
    Spawn {
        /// Backend name.
        backend: &'static str,
        /// The program.
        program: String,
        /// The OS error.
        source: std::io::Error,
        /// The setting (or the fix) that chooses the program: each backend's client has its
        /// own key, and naming another backend's would send the user to the wrong place.
        setting: &'static str,
    },
    /// An operation did not finish in time (the backend hangs, or the command ran too long).
    #[error("{backend} backend: {what} did not finish within {seconds}s; check that the engine/host responds{}", timeout_hint(.backend))]
    Timeout {
        /// Backend name.
        backend: &'static str,
        /// Which operation.
        what: String,
        /// The limit.
        seconds: u64,
    },
    /// The host began to stop (an interrupted `run`, `serve` ending) while the environment was
    /// still being started: what was under way is killed rather than left to finish unowned.
    #[error("{backend} backend: {what} was abandoned because vibeos-exec is stopping")]
    Abandoned {
        /// Backend name.
        backend: &'static str,
        /// Which operation.
        what: String,
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

    /// Stderr as text, trimmed (for error messages), without the engine CLI's pointers to its
    /// own help (`Run 'docker run --help' for more information`, `See 'podman run --help'.`),
    /// which read as advice about the wrong command in our messages.
    pub fn stderr_text(&self) -> String {
        let text = String::from_utf8_lossy(&self.stderr);
        let kept: Vec<&str> = text
            .lines()
            .filter(|line| !is_help_pointer(line.trim()))
            .collect();
        kept.join("\n").trim().to_string()
    }
}

/// Whether `line` is a CLI's "Run '<cmd> --help' for more information" or "See '<cmd>
/// --help'." line.
fn is_help_pointer(line: &str) -> bool {
    let rest = line
        .strip_prefix("Run '")
        .or_else(|| line.strip_prefix("See '"));
    rest.and_then(|r| r.split_once("--help'"))
        .is_some_and(|(_, tail)| {
            matches!(
                tail,
                "" | "." | " for more information" | " for more information."
            )
        })
}

/// One environment of a backend: a container, an ssh host, a cloud sandbox, or this machine.
///
/// The operations every caller needs and nothing backend-specific: run a command to completion
/// ([`Environment::exec`]) or streaming ([`Environment::spawn`], a handle with byte streams,
/// wait and a kill of the whole process group over there), move files in and out
/// ([`Environment::upload`], [`Environment::download`]), open an execution's RPC channel, reach
/// the tool agent, stop. Environments are started by [`start`] (one constructor per backend).
/// A backend must implement `spawn`, `open_channel`, `agent` and `stop`; `exec`, `upload` and
/// `download` have defaults built on `spawn` (`cat` over there) that an API backend with its
/// own file transfer overrides.
pub trait Environment: Send + Sync {
    /// The backend's name (`local`, `docker`, `ssh`).
    fn backend(&self) -> &'static str;

    /// Whether this environment is isolated from the host: a container with no host mounts.
    /// Dangerous-command approval may be skipped there (`approvals.skip_in_isolated_backends`).
    fn isolated(&self) -> bool;

    /// Whether the environment itself still runs (the container, the ssh master connection):
    /// asked when an execution ended without its bootstrap's report, to say whether the
    /// environment was lost (and will be started again) or only the bootstrap. May take an
    /// engine or control round trip; `true` (the default) where it cannot be lost that way.
    fn still_up(&self) -> bool {
        true
    }

    /// The working dir and the interpreter on that side.
    fn site(&self) -> &Site;

    /// The working dir commands and tools start in on that side.
    fn workdir(&self) -> String {
        self.site().workdir.clone()
    }

    /// The interpreter on that side (`terminal.python`).
    fn python(&self) -> String {
        self.site().python.clone()
    }

    /// Starts `spec` there in a new process group, with its three streams piped.
    fn spawn(&self, spec: &ExecSpec) -> Result<Spawned, EnvError>;

    /// Starts a command that puts itself in a new process group and records that group's id
    /// itself, like execute_code's bootstrap: `build(Some(path))` must give a command that
    /// writes its group id to `path` before anything else and removes it when it ends. A
    /// backend that can skip [`Environment::spawn`]'s group wrapper that way (ssh: one `sh`
    /// and one `setsid` less per execution) picks the path and kills through it; the default
    /// asks for no file (`build(None)`) and spawns through the wrapper.
    fn spawn_leader(&self, build: &dyn Fn(Option<&str>) -> ExecSpec) -> Result<Spawned, EnvError> {
        self.spawn(&build(None))
    }

    /// A way to run a short command over there as a fresh process started by the backend's
    /// own API (not through a helper process an execution's script could have stopped or
    /// killed), to completion; `None` (the default) when the backend has none beyond its
    /// helpers. The relay uses it as the kill's backstop ([`relay::spawn_relayed`]).
    fn fresh_runner(&self) -> Option<FreshRun> {
        None
    }

    /// Runs `spec` to completion with `stdin`. After `timeout` the whole process group there
    /// is killed and the result is [`EnvError::Timeout`]: a hung command never hangs the caller.
    fn exec(
        &self,
        spec: &ExecSpec,
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<CommandOutput, EnvError> {
        let spawned = self.spawn(spec)?;
        collect(self.backend(), spawned, stdin, timeout, &spec.display())
    }

    /// Writes `data` to `path` there (created or replaced, with permission bits `mode`); the
    /// parent directory must exist. Written to a temporary name first, then renamed.
    fn upload(&self, data: &[u8], path: &str, mode: u32) -> Result<(), EnvError> {
        let p = shell_quote(path);
        let tmp = shell_quote(&format!("{path}.vibeos-part"));
        let script = format!("umask 077; cat > {tmp} && chmod {mode:o} {tmp} && mv -f {tmp} {p}");
        let out = self.exec(
            &ExecSpec::new(["sh", "-c", &script]),
            data,
            TRANSFER_TIMEOUT,
        )?;
        if out.success() {
            Ok(())
        } else {
            Err(EnvError::Command {
                backend: self.backend(),
                what: format!("uploading to {path}"),
                message: out.stderr_text(),
            })
        }
    }

    /// Copies the host file `src` to `path` there, keeping its permission bits.
    fn upload_file(&self, src: &std::path::Path, path: &str) -> Result<(), EnvError> {
        use std::os::unix::fs::PermissionsExt;
        let local_err = |e: std::io::Error| EnvError::Command {
            backend: self.backend(),
            what: format!("reading {}", src.display()),
            message: e.to_string(),
        };
        let mode = std::fs::metadata(src)
            .map_err(local_err)?
            .permissions()
            .mode()
            & 0o7777;
        let data = std::fs::read(src).map_err(local_err)?;
        self.upload(&data, path, mode)
    }

    /// The contents of the file `path` there.
    fn download(&self, path: &str) -> Result<Vec<u8>, EnvError> {
        let out = self.exec(&ExecSpec::new(["cat", "--", path]), b"", TRANSFER_TIMEOUT)?;
        if out.success() {
            Ok(out.stdout)
        } else {
            Err(EnvError::Command {
                backend: self.backend(),
                what: format!("downloading {path}"),
                message: out.stderr_text(),
            })
        }
    }

    /// Copies the file `path` there to the host file `dest` (created or replaced).
    fn download_file(&self, path: &str, dest: &std::path::Path) -> Result<(), EnvError> {
        let data = self.download(path)?;
        std::fs::write(dest, data).map_err(|e| EnvError::Command {
            backend: self.backend(),
            what: format!("writing {}", dest.display()),
            message: e.to_string(),
        })
    }

    /// Where an execution's RPC socket lives on both sides, and how its connections reach the
    /// supervisor. `token` is the execution's RPC token (a backend that routes the connections
    /// of several executions over one socket tells them apart by it).
    fn open_channel(&self, exec_id: &str, token: &str) -> Result<Channel, EnvError>;

    /// Whether execute_code reaches the script through the relay ([`relay::spawn_relayed`]):
    /// true for sandboxes nothing can be mounted into or forwarded to (daytona, modal).
    fn relayed(&self) -> bool {
        false
    }

    /// The tool agent of this environment (started on first use); `None` where tools run in
    /// this process (local).
    fn agent(&self) -> Option<&agent::AgentClient>;

    /// Stops the environment (container stopped and, unless persistent, removed); what runs
    /// there is killed.
    fn stop(&self);
}

/// How long a default [`Environment::upload`] or [`Environment::download`] may take.
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(300);

/// Starts the environment of `task` for the configured backend.
pub fn start(settings: &BackendSettings, task: &str) -> Result<EnvHandle, EnvError> {
    Ok(match settings.backend {
        BackendKind::Docker => Arc::new(docker::DockerEnv::start(settings, task)?),
        BackendKind::Ssh => Arc::new(ssh::SshEnv::start(settings, task)?),
        BackendKind::Modal => Arc::new(modal::ModalEnv::start(settings, task)?),
        BackendKind::Daytona => Arc::new(daytona::DaytonaEnv::start(settings, task)?),
        BackendKind::Singularity => Arc::new(singularity::SingularityEnv::start(settings, task)?),
        BackendKind::Local => Arc::new(local_env::LocalEnv::new(settings)),
    })
}

/// An execution's RPC socket, seen from both sides. Dropping it removes what the backend set
/// up for it (the socket dir, the route).
pub struct Channel {
    /// How the supervisor receives the script's connections.
    pub connections: Connections,
    /// The socket's path as the script sees it (`VIBEOS_RPC_SOCKET`).
    pub remote_socket: String,
    /// The private work dir of the execution on that side (the bootstrap creates it 0700).
    pub remote_dir: String,
    /// Whether the stub must send the token as its first line on each connection
    /// (`VIBEOS_RPC_HELLO=1`): set by backends whose connections are [`Connections::Routed`].
    pub hello: bool,
    /// Undoes the set-up when dropped.
    pub guard: Box<dyn Send>,
}

/// Where the script's connections arrive.
pub enum Connections {
    /// The supervisor binds a listener at this host path (a bind-mounted dir, a forward's end).
    Bind(std::path::PathBuf),
    /// The backend accepts and routes: each stream arrives here with its hello line read and
    /// its token already checked.
    Routed(std::sync::mpsc::Receiver<std::os::unix::net::UnixStream>),
}

/// Runs `argv` in `env` to completion with `stdin`, killing it after `timeout`.
pub fn run<E: Environment + ?Sized>(
    env: &E,
    argv: &[String],
    stdin: &[u8],
    timeout: Duration,
) -> Result<CommandOutput, EnvError> {
    env.exec(&ExecSpec::new(argv.iter().cloned()), stdin, timeout)
}

/// Feeds `stdin` to a spawned process, collects both outputs, and kills its group after
/// `timeout` ([`EnvError::Timeout`]).
pub fn collect(
    backend: &'static str,
    spawned: Spawned,
    stdin: &[u8],
    timeout: Duration,
    what: &str,
) -> Result<CommandOutput, EnvError> {
    let data = std::io::Cursor::new(stdin.to_vec());
    collect_reading(backend, spawned, Box::new(data), timeout, what)
}

/// [`collect`] with the input streamed from `stdin` as the process reads it (a large file is
/// never held in memory whole).
pub fn collect_reading(
    backend: &'static str,
    spawned: Spawned,
    mut stdin: Box<dyn Read + Send>,
    timeout: Duration,
    what: &str,
) -> Result<CommandOutput, EnvError> {
    let Spawned {
        stdin: input,
        stdout,
        stderr,
        process,
    } = spawned;
    let writer = input.map(|mut w| {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut stdin, &mut w);
        })
    });
    let readers = [stdout, stderr].map(|r| {
        r.map(|mut r| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = r.read_to_end(&mut buf);
                buf
            })
        })
    });
    let waiter = {
        let process = Arc::clone(&process);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(process.wait());
        });
        rx
    };
    let deadline = std::time::Instant::now() + timeout;
    let mut abandoned = false;
    let status = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match waiter.recv_timeout(left.min(manager::ABANDON_POLL)) {
            Ok(s) => break Some(s?),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
                if !left.is_zero() && !manager::start_abandoned() => {}
            Err(_) => {
                abandoned = manager::start_abandoned();
                let _ = process.kill(GroupSignal::Kill);
                // The client ends when what it ran does; give it a moment, never forever.
                let _ = waiter.recv_timeout(Duration::from_secs(5));
                break None;
            }
        }
    };
    if let Some(w) = writer {
        let _ = w.join();
    }
    let [out, err] = readers.map(|r| {
        r.filter(|h| status.is_some() || h.is_finished())
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    });
    let Some(code) = status else {
        if abandoned {
            return Err(EnvError::Abandoned {
                backend,
                what: what.chars().take(120).collect(),
            });
        }
        return Err(EnvError::Timeout {
            backend,
            what: what.chars().take(120).collect(),
            seconds: timeout.as_secs(),
        });
    };
    Ok(CommandOutput {
        code: Some(code),
        stdout: out,
        stderr: err,
    })
}

/// Runs a client command to completion: feeds `stdin`, collects both outputs, kills it after
/// `timeout` so a hung engine or host gives an error instead of a hang. For the backend's own
/// administration (engine commands, ssh control commands), not for commands *in* an environment.
pub fn run_client(
    backend: &'static str,
    cmd: &mut Command,
    stdin: &[u8],
    timeout: Duration,
    what: &str,
) -> Result<CommandOutput, EnvError> {
    let data = std::io::Cursor::new(stdin.to_vec());
    run_client_reading(backend, cmd, Box::new(data), timeout, what)
}

/// [`run_client`] with the input streamed from `stdin` (an upload of a large file reads it as
/// the client takes it, instead of holding it in memory).
pub fn run_client_reading(
    backend: &'static str,
    cmd: &mut Command,
    stdin: Box<dyn Read + Send>,
    timeout: Duration,
    what: &str,
) -> Result<CommandOutput, EnvError> {
    cmd.process_group(0);
    let spawned =
        process::ClientProcess::spawn(backend, std::mem::replace(cmd, Command::new("true")), None)?;
    collect_reading(backend, spawned, stdin, timeout, what)
}

/// `s` quoted for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Runs an argv over there to completion as a fresh process (see
/// [`Environment::fresh_runner`]).
pub type FreshRun = Arc<dyn Fn(&[String]) -> Result<(), EnvError> + Send + Sync>;

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

/// What else a timeout of `backend` may mean: over ssh every command runs through the remote
/// user's login shell, and a start-up file that waits (a script that wrote `sleep 1000` into
/// `~/.bashrc`) hangs every command of every later run, the environment's set-up included.
fn timeout_hint(backend: &str) -> &'static str {
    if backend == "ssh" {
        " (and that the remote user's shell start-up files, such as ~/.bashrc, do not wait: \
         every ssh command runs through them; try `ssh HOST true`)"
    } else {
        ""
    }
}

#[cfg(test)]
mod stderr_text_tests {
    use super::CommandOutput;

    #[test]
    fn the_engine_clis_help_pointers_are_left_out_of_messages() {
        let out = CommandOutput {
            code: Some(125),
            stdout: Vec::new(),
            stderr: b"docker: Cannot connect to the Docker daemon.\nRun 'docker run --help' for more information\n\
                      Error: no such image\nSee 'podman run --help'.\nRun 'x' to go\n"
                .to_vec(),
        };
        assert_eq!(
            out.stderr_text(),
            "docker: Cannot connect to the Docker daemon.\nError: no such image\nRun 'x' to go"
        );
    }
}
