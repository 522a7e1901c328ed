//! Launching an interpreter for one execution, split out of `execute.rs` so that every launch
//! has one shape: a [`LaunchSpec`] (what decides how the interpreter starts), a [`Staging`] dir
//! with the stub and the script, and a [`Launched`] child that [`crate::execute`] supervises.
//! A cold launch is [`launch`] with [`Program::Script`]; the warm pool ([`crate::pool`]) starts
//! the same thing early with [`Program::Warm`]; a remote launch ([`crate::remote`]) stages the
//! same files through a backend instead and is supervised by the same limits.

use crate::config::Mode;
use crate::confine::StrictOptions;
use crate::env_policy::{EnvPolicy, Rule};
use crate::error::StartError;
use crate::interpreter::Interpreter;
use crate::reaper::{become_reaper, lifeline, Lifeline};
use crate::request::{session_cwd, ExecutionRequest};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

/// The bootstrap a pooled interpreter ([`Program::Warm`], [`crate::pool`]) runs with `-c`.
const POOL_BOOTSTRAP: &str = concat!(
    include_str!("script_runner.py"),
    include_str!("pool_boot.py")
);

/// Longest path a Unix socket address can hold (sun_path minus its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// What decides how an interpreter is started for a call. Calls whose specs have equal
/// [`LaunchSpec::key`]s can use each other's pre-started interpreters; the environment may differ
/// and is reconciled per call ([`crate::pool`]).
#[derive(Debug, Clone)]
pub(crate) struct LaunchSpec {
    pub(crate) mode: Mode,
    pub(crate) interpreter: Interpreter,
    pub(crate) session_cwd: PathBuf,
    pub(crate) strict: StrictOptions,
    pub(crate) kill_grace: Duration,
    pub(crate) base_env: Vec<(OsString, OsString)>,
    pub(crate) passthrough: BTreeSet<String>,
}

/// The part of a [`LaunchSpec`] a pre-started interpreter cannot change after the fact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LaunchKey {
    mode: Mode,
    interpreter: PathBuf,
    /// The child's cwd and `PYTHONPATH` entry in project mode; strict runs in its staging dir.
    session_cwd: Option<PathBuf>,
    strict: Option<StrictOptions>,
    kill_grace: Duration,
}

impl LaunchSpec {
    fn new(request: &ExecutionRequest, interpreter: Interpreter, session_cwd: PathBuf) -> Self {
        LaunchSpec {
            mode: request.mode,
            interpreter,
            session_cwd,
            strict: request.strict.clone(),
            kill_grace: request.kill_grace,
            base_env: match &request.base_env {
                Some(env) => env.clone(),
                None => std::env::vars_os().collect(),
            },
            passthrough: request.env_passthrough.iter().cloned().collect(),
        }
    }

    /// The spec of `request` as it would run now (its cwd and interpreter resolved).
    pub(crate) fn for_request(request: &ExecutionRequest) -> Result<Self, StartError> {
        let session_cwd = session_cwd(request.cwd.as_deref())?;
        let interpreter = request.resolution().resolve(request.mode, &session_cwd)?;
        Ok(LaunchSpec::new(request, interpreter, session_cwd))
    }

    pub(crate) fn key(&self) -> LaunchKey {
        let strict = self.mode == Mode::Strict;
        LaunchKey {
            mode: self.mode,
            interpreter: self.interpreter.path.clone(),
            session_cwd: (!strict).then(|| self.session_cwd.clone()),
            strict: strict.then(|| self.strict.clone()),
            kill_grace: self.kill_grace,
        }
    }

    /// The disk budget of a strict execution's staging dir.
    pub(crate) fn disk_budget(&self) -> Option<u64> {
        (self.mode == Mode::Strict).then_some(self.strict.disk_bytes)
    }

    pub(crate) fn child_cwd(&self, staging: &Path) -> PathBuf {
        match self.mode {
            Mode::Project => self.session_cwd.clone(),
            Mode::Strict => staging.to_path_buf(),
        }
    }

    /// Whether a warm interpreter (pooled, or a fork server) is started with variable `name`
    /// instead of being given it with each call. The environment a process is exec'd with
    /// stays in its memory (`/proc/self/environ`, the stack) and every fork copies it: a
    /// passthrough secret a warm interpreter started with was still there for the scripts of
    /// later calls the host no longer passed it to (stop 58's probe read it back, in strict
    /// mode too). So the names the host passes through (config, skills) come with each call,
    /// unless the interpreter reads them while it starts (`PYTHONPATH`): a change to those
    /// replaces the warm interpreter instead. The scrub's own allowlist (`PATH`, `TERM`, ...)
    /// passes no secrets and starts with it: each `putenv` in a forked child costs page copies.
    pub(crate) fn warm_start_keeps(&self, name: &std::ffi::OsStr) -> bool {
        name.to_str()
            .is_none_or(|n| crate::env_policy::affects_startup(n) || !self.passthrough.contains(n))
    }

    /// The child's environment: scrubbed base, then the injected names (SPEC §4). Without the
    /// RPC channel's variables, which are what tools the script starts (terminal) get.
    /// `log` says whether this is the execution's own computation (dropped `VIBEOS_*` names are
    /// logged once per execution), not one made ahead of time for the pool.
    pub(crate) fn child_env(
        &self,
        staging: &Path,
        log: bool,
    ) -> Result<Vec<(OsString, OsString)>, StartError> {
        let policy = EnvPolicy::builtin()?;
        let base = &self.base_env;
        let lookup = |name: &str| base.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let scrubbed = crate::env_policy::scrub_builtin(base, &self.passthrough)?;
        if log {
            policy.log_dropped(&scrubbed);
        }
        let injected_names: BTreeSet<&str> = policy.injected.iter().map(String::as_str).collect();
        let mut env: Vec<(OsString, OsString)> = scrubbed
            .kept
            .iter()
            .filter(|(k, _)| !k.to_str().is_some_and(|k| injected_names.contains(k)))
            .cloned()
            .collect();
        let home = match self.mode {
            Mode::Project => lookup("HOME").unwrap_or_else(|| staging.as_os_str().to_owned()),
            Mode::Strict => staging.as_os_str().to_owned(),
        };
        env.push(("HOME".into(), home));
        if let Some(path) = self.path_for_wrapped(&env) {
            env.retain(|(k, _)| k != "PATH");
            env.push(("PATH".into(), path));
        }
        // SPEC §4: TZ in every mode, the caller's else the host's zone (a strict script cannot
        // read /etc to find it, and a fork server's children must match a cold start's).
        env.push((
            "TZ".into(),
            crate::env_policy::tz_with_source(lookup("TZ")).0,
        ));
        env.push(("PYTHONDONTWRITEBYTECODE".into(), "1".into()));
        env.push(("PYTHONIOENCODING".into(), "utf-8".into()));
        env.push(("PYTHONUTF8".into(), "1".into()));
        // The staging dir first so `import vibeos_tools` works from any cwd; in project mode the
        // session dir next, so project imports work as they do for `python -c` in terminal().
        // PYTHONPATH has no escape for `:`: a path holding one would be read as two other
        // entries (`/tmp/a:b` as `/tmp/a` and a relative `b`), places someone else may own.
        let has_colon = |p: &Path| p.as_os_str().as_encoded_bytes().contains(&b':');
        if has_colon(staging) {
            return Err(StartError::StagingPathHasColon(staging.to_path_buf()));
        }
        let mut pythonpath = staging.as_os_str().to_owned();
        if self.mode == Mode::Project && !has_colon(&self.session_cwd) {
            pythonpath.push(":");
            pythonpath.push(self.session_cwd.as_os_str());
        } else if self.mode == Mode::Project && log {
            tracing::warn!(
                "execute_code: the session dir {} holds a ':', which PYTHONPATH cannot carry, \
                 so it is not on the script's PYTHONPATH; a script that imports from it can \
                 add it with sys.path.insert(0, os.getcwd())",
                self.session_cwd.display()
            );
        }
        let keeps_pythonpath = policy.decide("PYTHONPATH", &self.passthrough) == Rule::SafeSystem
            || self.passthrough.contains("PYTHONPATH");
        if let Some(old) = lookup("PYTHONPATH").filter(|v| !v.is_empty() && keeps_pythonpath) {
            pythonpath.push(":");
            pythonpath.push(old);
        }
        env.push(("PYTHONPATH".into(), pythonpath));
        Ok(env)
    }
}

impl LaunchSpec {
    /// The child's `PATH` when its interpreter is what a `#!` wrapper selects (a pyenv shim):
    /// the interpreter's directory first, unless `PATH` already has it, as `pyenv exec` puts
    /// the selected version's `bin` first (and leaves `PATH` alone for the system Python).
    /// A script's `subprocess.run(["pip", ...])` then reaches the pip of the Python it runs in,
    /// not a shim that would select again without the caller's `PYENV_VERSION` (scrubbed) or
    /// from another cwd. `None`: `PATH` stays as scrubbed.
    fn path_for_wrapped(&self, env: &[(OsString, OsString)]) -> Option<OsString> {
        self.interpreter.wrapper.as_ref()?;
        let dir = self.interpreter.path.parent()?;
        let old = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v);
        if let Some(old) = old {
            if std::env::split_paths(old).any(|p| p == dir) {
                return None;
            }
        }
        let mut path = dir.as_os_str().to_owned();
        if let Some(old) = old.filter(|v| !v.is_empty()) {
            path.push(":");
            path.push(old);
        }
        Some(path)
    }
}

/// `env` with `channel` laid over it (a name in both takes the channel's value).
pub(crate) fn with_channel(
    mut env: Vec<(OsString, OsString)>,
    channel: &[(OsString, OsString)],
) -> Vec<(OsString, OsString)> {
    env.retain(|(k, _)| !channel.iter().any(|(c, _)| c == k));
    env.extend(channel.iter().cloned());
    env
}

/// A fresh staging dir with its private `rpc/` dir; removed when dropped.
/// Created 0700 under a 0711 parent, files written with O_EXCL|O_NOFOLLOW: see
/// [`crate::confine::staging`]. Fields drop in order: tmpfs unmounted, dir removed, parent
/// removed when empty.
#[derive(Debug)]
pub(crate) struct Staging {
    _budget: Option<crate::confine::staging::DiskBudget>,
    dir: tempfile::TempDir,
    _parent: crate::confine::staging::ParentCleanup,
    /// Strict mode as root: the script's uid, leased until the execution is over.
    lease: Option<Arc<crate::confine::uids::UidLease>>,
    script: PathBuf,
    socket: PathBuf,
    rpc_dir: PathBuf,
}

impl Staging {
    /// A fresh staging dir; `disk` (strict mode) caps its size with a tmpfs when root.
    pub(crate) fn create(disk: Option<u64>) -> Result<Staging, StartError> {
        let dir = crate::confine::staging::create_dir().map_err(StartError::Staging)?;
        let parent = crate::confine::staging::ParentCleanup(
            dir.path()
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default(),
        );
        let budget = match disk {
            Some(bytes) => crate::confine::staging::DiskBudget::mount(dir.path(), bytes)
                .map_err(StartError::Staging)?,
            None => None,
        };
        let script = dir.path().join(crate::confine::staging::SCRIPT_FILE);
        // The socket lives in the staging dir itself, which is already private (0700, ours):
        // a subdir of its own would add nothing but a mkdir and an rmdir, each a few hundred
        // microseconds of a cold run on ext4.
        let rpc_dir = dir.path().to_path_buf();
        let socket = rpc_dir.join("rpc.sock");
        if socket.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(StartError::SocketPathTooLong(socket));
        }
        Ok(Staging {
            _budget: budget,
            dir,
            _parent: parent,
            lease: None,
            script,
            socket,
            rpc_dir,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes the stub alone, with the runtime module it imports (the script of a prestarted
    /// interpreter comes through its FIFO); `owner` is the strict uid/gid the dir was handed
    /// to.
    pub(crate) fn write_stub(
        &self,
        stub: &str,
        owner: Option<(u32, u32)>,
    ) -> Result<(), StartError> {
        use crate::confine::staging::{write_new, STUB_FILE};
        write_new(
            self.dir.path(),
            vibeos_rpc::RUNTIME_FILE,
            vibeos_rpc::RUNTIME_SOURCE,
            owner,
        )
        .and_then(|()| write_new(self.dir.path(), STUB_FILE, stub, owner))
        .map_err(StartError::Staging)
    }

    /// Replaces the stub written earlier (by a preparation that guessed another tool set) with
    /// `stub`; the runtime beside it stays.
    pub(crate) fn replace_stub(
        &self,
        stub: &str,
        owner: Option<(u32, u32)>,
    ) -> Result<(), StartError> {
        use crate::confine::staging::{write_new, STUB_FILE};
        match std::fs::remove_file(self.dir.path().join(STUB_FILE)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StartError::Staging(e)),
        }
        write_new(self.dir.path(), STUB_FILE, stub, owner).map_err(StartError::Staging)
    }

    /// Writes the script; `owner` as for [`Staging::write_stub`].
    pub(crate) fn write_script(
        &self,
        code: &str,
        owner: Option<(u32, u32)>,
    ) -> Result<(), StartError> {
        crate::confine::staging::write_new(
            self.dir.path(),
            crate::confine::staging::SCRIPT_FILE,
            code,
            owner,
        )
        .map_err(StartError::Staging)
    }

    /// Creates the script's file, empty and open for writing, for a script not known yet;
    /// `owner` as for [`Staging::write_stub`].
    pub(crate) fn create_script(
        &self,
        owner: Option<(u32, u32)>,
    ) -> Result<std::fs::File, StartError> {
        crate::confine::staging::create_new(
            self.dir.path(),
            crate::confine::staging::SCRIPT_FILE,
            owner,
        )
        .map_err(StartError::Staging)
    }

    /// Writes the stub and the script; `owner` as for [`Staging::write_stub`].
    pub(crate) fn write_files(
        &self,
        stub: &str,
        code: &str,
        owner: Option<(u32, u32)>,
    ) -> Result<(), StartError> {
        self.write_stub(stub, owner)?;
        self.write_script(code, owner)
    }
}

/// The supervisor's end of the RPC channel.
#[derive(Debug)]
pub(crate) enum RpcEnd {
    /// Project mode: a listener on the staging dir's socket.
    Listener(std::os::unix::net::UnixListener),
    /// Strict mode: our end of the socketpair whose other end the script inherits.
    Stream(std::os::unix::net::UnixStream),
}

/// What the interpreter runs.
pub(crate) enum Program {
    /// `python -u script.py`.
    Script,
    /// `python -u script.py` with `script.py` a FIFO made here, through which the script is
    /// released later ([`crate::script_feed`], [`crate::prestart`]).
    Fifo,
    /// The pool's bootstrap: imports done, then it waits for a line on `control` (see
    /// [`crate::pool`]); it writes one byte to `ready` when its imports are done.
    Warm {
        /// The child's end of the control channel (a socketpair it only reads).
        control: OwnedFd,
        /// Write end of the readiness pipe (the child's).
        ready: OwnedFd,
    },
}

/// An execution's reaper: spawned by the supervisor (cold, pooled) or forked by a fork server
/// ([`crate::zygote`]), which is not our child, so its status arrives on a pipe.
#[derive(Debug)]
pub(crate) enum Proc {
    /// A child of the supervisor.
    Spawned(Spawned),
    /// A child of a fork server.
    Forked(crate::forked::Forked),
}

impl Proc {
    /// The reaper's pid.
    pub(crate) fn id(&self) -> u32 {
        match self {
            Proc::Spawned(s) => s.child.id(),
            Proc::Forked(f) => f.pid,
        }
    }

    /// The script's stdout (once).
    pub(crate) fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        match self {
            Proc::Spawned(s) => s.child.stdout.take(),
            Proc::Forked(f) => f.stdout.take(),
        }
    }

    /// The script's stderr (once).
    pub(crate) fn take_stderr(&mut self) -> Option<std::process::ChildStderr> {
        match self {
            Proc::Spawned(s) => s.child.stderr.take(),
            Proc::Forked(f) => f.stderr.take(),
        }
    }

    /// Blocks until the script's status is known (a spawned reaper's own exit included).
    pub(crate) fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match self {
            Proc::Spawned(s) => s.child.wait(),
            Proc::Forked(f) => f.wait(),
        }
    }

    /// The status if already known.
    pub(crate) fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        match self {
            Proc::Spawned(s) => s.child.try_wait(),
            Proc::Forked(f) => f.try_wait(),
        }
    }
}

/// A reaper the supervisor spawned, with the status report it writes before its own exit.
#[derive(Debug)]
pub(crate) struct Spawned {
    pub(crate) child: std::process::Child,
    pub(crate) report: crate::forked::StatusReport,
}

impl Spawned {
    /// The script's status from the reaper's report, read on the runtime's poller; the
    /// reaper's own exit is then collected off the result's path ([`crate::unreaped`]).
    pub(crate) async fn wait_reported(
        mut self,
        pidfd: Option<OwnedFd>,
    ) -> std::io::Result<std::process::ExitStatus> {
        let status = self.report.wait_async().await;
        crate::unreaped::reap_when_gone(self.child, pidfd);
        status
    }
}

/// What a launch's owner does when the execution that took it is over, by being dropped then
/// (the warm pool wakes its refill thread). A box, so that a launch need not name the pool
/// that launches through it.
pub(crate) type OnDone = Box<dyn std::fmt::Debug + Send + Sync>;

/// A started interpreter under its reaper, with everything the supervision needs.
#[derive(Debug)]
pub(crate) struct Launched {
    /// The reaper (the interpreter's parent).
    pub(crate) child: Proc,
    /// A pidfd of the reaper, so signals never reach a recycled pid.
    pub(crate) pidfd: Option<OwnedFd>,
    pub(crate) lifeline: Lifeline,
    pub(crate) staging: Staging,
    pub(crate) rpc: RpcEnd,
    pub(crate) token: String,
    /// The environment the interpreter was started with.
    pub(crate) env: Vec<(OsString, OsString)>,
    /// The channel's variables within `env` (socket or fd, token, strict TMPDIR).
    pub(crate) channel_vars: Vec<(OsString, OsString)>,
    /// `env` without the channel: what tools the script starts (terminal) get.
    pub(crate) tool_env: Vec<(OsString, OsString)>,
    /// uid/gid the staging dir belongs to (strict mode as root).
    pub(crate) owner: Option<(u32, u32)>,
    /// Held until the execution is over (a pooled interpreter's refill waits for it).
    pub(crate) on_done: Option<OnDone>,
    /// A prestarted interpreter's FIFO: the script is released through it, and the release
    /// is finished once the execution is over.
    pub(crate) feeding: Option<crate::script_feed::ScriptFeed>,
}

impl Launched {
    /// Throws a started interpreter away: the lifeline's EOF makes its reaper stop the tree, and
    /// the staging dir is removed. With `reap`, a thread collects the reaper's exit status so no
    /// zombie is left in a long-lived host.
    pub(crate) fn discard(self, reap: bool) {
        let Launched {
            mut child,
            lifeline,
            staging,
            feeding,
            ..
        } = self;
        drop(lifeline);
        // Before the dir goes: a release still writing gives up.
        if let Some(feed) = feeding {
            let _ = feed.finish();
        }
        drop(staging);
        if reap {
            let spawned = std::thread::Builder::new()
                .name("vibeos-pool-reap".into())
                .spawn(move || {
                    let _ = child.wait();
                });
            if let Err(e) = spawned {
                tracing::debug!(
                    "execute_code: cannot start a thread to reap a pooled interpreter: {e}"
                );
            }
        }
    }

    /// Whether the interpreter's reaper already exited (the pooled interpreter died idle).
    pub(crate) fn has_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }
}

/// Starts the interpreter for `spec` in `staging`: channel, environment, confinement, reaper.
pub(crate) fn launch(
    spec: &LaunchSpec,
    mut staging: Staging,
    program: Program,
) -> Result<Launched, StartError> {
    let env = spec.child_env(staging.path(), matches!(program, Program::Script))?;
    let tool_env = env.clone();
    let Channel {
        rpc,
        token,
        channel_vars,
        confinement,
        owner,
    } = open_channel(spec, &mut staging)?;
    let env = with_channel(env, &channel_vars);
    // A pooled interpreter waits for a call whose environment is not known yet: the names the
    // host passes through come with the call (`pool::env_delta`), see `warm_start_keeps`.
    let env = if matches!(program, Program::Warm { .. }) {
        env.into_iter()
            .filter(|(k, _)| spec.warm_start_keeps(k) || channel_vars.iter().any(|(c, _)| c == k))
            .collect()
    } else {
        env
    };
    let feeding = if matches!(program, Program::Fifo) {
        // The supervisor's, mode 0644, like the regular file the cold path writes; its end is
        // opened before the spawn, so no program started later inherits it.
        Some(crate::script_feed::make_fifo(staging.path()).map_err(StartError::Staging)?)
    } else {
        None
    };

    let spawn_error = |source| StartError::Spawn {
        interpreter: spec.interpreter.path.clone(),
        source,
    };
    let (lifeline, mut setup, read_end) =
        lifeline(spec.kill_grace, Some(staging.path())).map_err(spawn_error)?;
    let (report, report_w) = crate::reaper::status_report().map_err(spawn_error)?;
    setup.report_status_on(report_w.as_raw_fd());
    let child_cwd = spec.child_cwd(staging.path());
    let mut args: Vec<&std::ffi::OsStr> = vec!["-u".as_ref()];
    let (control_fd, ready_fd);
    let inherit: [libc::c_int; 2] = match &program {
        Program::Script | Program::Fifo => {
            args.push(staging.script.as_os_str());
            [-1, -1]
        }
        Program::Warm { control, ready } => {
            control_fd = control.as_raw_fd().to_string();
            ready_fd = ready.as_raw_fd().to_string();
            args.extend([
                "-c".as_ref(),
                POOL_BOOTSTRAP.as_ref(),
                staging.script.as_os_str(),
                control_fd.as_ref(),
                ready_fd.as_ref(),
            ]);
            [control.as_raw_fd(), ready.as_raw_fd()]
        }
    };
    // The reaper starts the interpreter itself (`crate::script_exec`), so the command's own
    // program, arguments and environment are never exec'd: it only forks the reaper, in the
    // interpreter's working directory, with its standard streams.
    let exec = crate::script_exec::ScriptExec::new(
        &spec.interpreter.path,
        args,
        env.iter().map(|(k, v)| (k.as_os_str(), v.as_os_str())),
    )
    .map_err(|e| spawn_error(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
    let mut command = std::process::Command::new(&spec.interpreter.path);
    command
        .current_dir(&child_cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: `become_reaper` (and the confinement it applies) is written for the pre_exec
    // window: it only makes async-signal-safe system calls on values prepared before the fork
    // (`exec` among them), and returns only an error, which std then reports to this spawn.
    unsafe {
        command.pre_exec(move || Err(become_reaper(setup, confinement.as_ref(), inherit, &exec)));
    }
    let spawned = command.spawn();
    // The command owns the confinement, with the script's end of the socketpair: drop it so
    // only the script holds that end and the channel reaches EOF when the script is gone. The
    // same goes for the child's ends of the pool's pipes.
    drop(command);
    drop(read_end);
    drop(report_w);
    drop(program);
    let child = spawned.map_err(spawn_error)?;
    Ok(Launched {
        pidfd: pidfd_open(child.id()),
        child: Proc::Spawned(Spawned {
            child,
            report: crate::forked::StatusReport::new(report),
        }),
        lifeline,
        staging,
        rpc,
        token,
        env,
        channel_vars,
        tool_env,
        owner,
        on_done: None,
        feeding,
    })
}

/// An execution's RPC channel and, in strict mode, its prepared confinement: what every local
/// launch (cold, pooled, forked by [`crate::zygote`]) sets up the same way.
pub(crate) struct Channel {
    pub(crate) rpc: RpcEnd,
    pub(crate) token: String,
    /// The channel's variables (socket or fd, token, strict TMPDIR).
    pub(crate) channel_vars: Vec<(OsString, OsString)>,
    /// Strict mode: everything the script process applies to itself.
    pub(crate) confinement: Option<crate::confine::child::ChildConfinement>,
    /// uid/gid the staging dir belongs to (strict mode as root).
    pub(crate) owner: Option<(u32, u32)>,
}

/// Opens the channel for `staging` and prepares strict confinement (leasing a uid into
/// `staging`, so it is held until the execution is over).
pub(crate) fn open_channel(
    spec: &LaunchSpec,
    staging: &mut Staging,
) -> Result<Channel, StartError> {
    let token = new_token();
    let strict = spec.mode == Mode::Strict;
    let mut channel_vars: Vec<(OsString, OsString)> = Vec::new();
    // Strict mode: the script gets one end of a socketpair (landlock cannot stop a confined
    // process from dialling a pathname socket, so there must be no path to dial at all).
    let (rpc, theirs) = if strict {
        let (ours, theirs) =
            std::os::unix::net::UnixStream::pair().map_err(StartError::Listener)?;
        channel_vars.push((
            "VIBEOS_RPC_FD".into(),
            theirs.as_raw_fd().to_string().into(),
        ));
        channel_vars.push(("VIBEOS_RPC_STRICT".into(), "1".into()));
        channel_vars.push(("TMPDIR".into(), staging.path().as_os_str().to_owned()));
        (RpcEnd::Stream(ours), Some(OwnedFd::from(theirs)))
    } else {
        channel_vars.push((
            "VIBEOS_RPC_DIR".into(),
            staging.rpc_dir.clone().into_os_string(),
        ));
        channel_vars.push((
            "VIBEOS_RPC_SOCKET".into(),
            staging.socket.clone().into_os_string(),
        ));
        let listener = std::os::unix::net::UnixListener::bind(&staging.socket)
            .map_err(StartError::Listener)?;
        (RpcEnd::Listener(listener), None)
    };
    channel_vars.push(("VIBEOS_RPC_TOKEN".into(), token.clone().into()));

    let mut confinement = None;
    let mut owner = None;
    if let Some(theirs) = theirs {
        let (prepared, summary) = crate::confine::prepare(crate::confine::Plan {
            options: &spec.strict,
            interpreter: &spec.interpreter.path,
            staging: staging.path(),
            rpc: theirs,
        })?;
        tracing::debug!(
            uid = summary.uid,
            covered = ?summary.covered,
            read_execute = ?summary.read_execute,
            "execute_code: strict confinement prepared"
        );
        owner = prepared.credentials.map(|c| (c.uid, c.gid));
        staging.lease = summary.lease;
        confinement = Some(prepared);
    }
    Ok(Channel {
        rpc,
        token,
        channel_vars,
        confinement,
        owner,
    })
}

fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
}

/// The channel's token, straight from the kernel's random source: a one-shot `run` makes one
/// token, and seeding a user-space generator for it (rand's thread-local ChaCha, which also probes
/// the CPU's features, each probe a trap to the hypervisor on a VM) cost more than the token.
fn new_token() -> String {
    let mut bytes = [0u8; 32];
    if getrandom::fill(&mut bytes).is_err() {
        bytes = rand::random();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// A wrapper's selection depends on the session dir, so the warm paths (fork server,
    /// pool, prestart), which reuse an interpreter by launch key, must not let one dir's
    /// Python serve another's: in strict mode the key holds no session dir, only the
    /// interpreter resolved for it.
    #[test]
    fn the_launch_key_holds_what_a_wrapper_selects_for_the_session_dir() {
        let Ok(python) = which::which("python3") else {
            eprintln!("SKIP: no python3 on PATH");
            return;
        };
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap_or_else(|e| panic!("{e}"));
        let real = std::process::Command::new(&python)
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
            .unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink(&real, other.join("python3")).unwrap_or_else(|e| panic!("{e}"));
        let shim = dir.path().join("python3");
        std::fs::write(
            &shim,
            format!(
                "#!/bin/sh\nif [ -e .other ]; then exec {} \"$@\"; fi\nexec {} \"$@\"\n",
                other.join("python3").display(),
                real.display()
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("{e}"));
        let project = dir.path().join("project");
        std::fs::create_dir(&project).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(project.join(".other"), "").unwrap_or_else(|e| panic!("{e}"));
        let config = Config {
            python: Some(shim.clone()),
            ..Config::default()
        };
        for mode in [Mode::Project, Mode::Strict] {
            let spec = |cwd: &Path| {
                let mut request = ExecutionRequest::from_config("pass", &config);
                request.mode = mode;
                request.cwd = Some(cwd.to_path_buf());
                LaunchSpec::for_request(&request).unwrap_or_else(|e| panic!("{e}"))
            };
            let (a, b) = (spec(&project), spec(dir.path()));
            assert_eq!(a.interpreter.path, other.join("python3"), "{mode:?}");
            assert_eq!(a.interpreter.wrapper.as_deref(), Some(shim.as_path()));
            assert_eq!(b.interpreter.path, real, "{mode:?}");
            assert_ne!(a.key(), b.key(), "{mode:?}");
            // The selected Python's directory comes first on the child's PATH.
            let env = a
                .child_env(dir.path(), false)
                .unwrap_or_else(|e| panic!("{e}"));
            let path = env
                .iter()
                .find(|(k, _)| k == "PATH")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            assert_eq!(
                std::env::split_paths(&path).next().as_deref(),
                Some(other.as_path()),
                "{mode:?}"
            );
        }
        // A PATH that has the directory already is left as it is (pyenv's system Python).
        let caller_path = format!("/usr/bin:{}", other.display());
        let mut request = ExecutionRequest::from_config("pass", &config);
        request.cwd = Some(project.clone());
        request.base_env = Some(vec![("PATH".into(), caller_path.clone().into())]);
        let spec = LaunchSpec::for_request(&request).unwrap_or_else(|e| panic!("{e}"));
        let env = spec
            .child_env(dir.path(), false)
            .unwrap_or_else(|e| panic!("{e}"));
        let paths: Vec<_> = env.iter().filter(|(k, _)| k == "PATH").collect();
        assert_eq!(paths, [&("PATH".into(), caller_path.into())]);
    }
}
