//! One execute_code call from start to cleanup (SPEC §2).
//!
//! staging dir + stub → RPC listener → child (scrubbed env, mode's cwd and interpreter, under
//! its reaper) → limits (timeout, output caps, call budget, interrupt) → result → cleanup. The
//! staging dir and socket are removed on every path, because they live in a `TempDir` owned by
//! this function.

use crate::capture::{drain, HeadTail};
use crate::config::{Config, Mode};
use crate::confine::{ConfineError, StrictOptions};
use crate::env_policy::{EnvPolicy, Rule};
use crate::interpreter::{Interpreter, Resolution};
use crate::reaper::{become_reaper, lifeline};
use crate::result::{ExecutionResult, Status};
use crate::rpc_server::{serve, serve_stream, ChannelState};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use vibeos_rpc::{generate_stub, StubTool};
use vibeos_tools::{CallOrigin, ToolContext, ToolRegistry};

/// Grace period between SIGTERM and SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(5);

/// Longest path a Unix socket address can hold (sun_path minus its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Everything one execution needs. Build it with [`ExecutionRequest::from_config`] and adjust
/// per call.
#[derive(Debug, Clone)]
pub struct ExecutionRequest {
    /// The script's source.
    pub code: String,
    /// Where and with what it runs.
    pub mode: Mode,
    /// Wall-clock limit.
    pub timeout: Duration,
    /// Tool-call budget.
    pub max_tool_calls: usize,
    /// Session working dir (`--cwd`); `None` means `TERMINAL_CWD`, else the process cwd.
    pub cwd: Option<PathBuf>,
    /// Default interpreter (`code_execution.python`, or the embedding host's executable).
    pub python: Option<PathBuf>,
    /// Names kept even if they look secret (config plus skills), except provider credentials.
    pub env_passthrough: Vec<String>,
    /// Stdout cap in bytes.
    pub stdout_limit: usize,
    /// Stderr cap in bytes.
    pub stderr_limit: usize,
    /// Agent task id, handed to tools.
    pub task_id: Option<String>,
    /// Grace between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// Environment to scrub; `None` means this process's environment.
    pub base_env: Option<Vec<(OsString, OsString)>>,
    /// Script tools the session's toolset selection left enabled; `None` means every available
    /// one. Only narrows: names that are not script tools or not available are ignored.
    pub script_tools: Option<BTreeSet<String>>,
    /// Strict-mode settings (`code_execution.strict`).
    pub strict: StrictOptions,
}

impl ExecutionRequest {
    /// A request with the limits and settings of `config`.
    pub fn from_config(code: impl Into<String>, config: &Config) -> Self {
        ExecutionRequest {
            code: code.into(),
            mode: config.mode,
            timeout: config.timeout,
            max_tool_calls: config.max_tool_calls,
            cwd: None,
            python: config.python.clone(),
            env_passthrough: config.env_passthrough.clone(),
            stdout_limit: config.stdout_limit,
            stderr_limit: config.stderr_limit,
            task_id: None,
            kill_grace: KILL_GRACE,
            base_env: None,
            script_tools: None,
            strict: StrictOptions::from_config(config),
        }
    }
}

/// Stops a running execution from anywhere (another task, thread or a signal handler).
#[derive(Debug, Clone, Default)]
pub struct Interrupt(CancellationToken);

impl Interrupt {
    /// A fresh handle.
    pub fn new() -> Self {
        Self::default()
    }
    /// Stops the execution: status `interrupted`.
    pub fn interrupt(&self) {
        self.0.cancel();
    }
    /// Whether [`Interrupt::interrupt`] was called.
    pub fn is_interrupted(&self) -> bool {
        self.0.is_cancelled()
    }
}

/// Why an execution could not start. Its message becomes the result's `error`.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Nothing to run.
    #[error("the script is empty; pass Python code that prints its result")]
    EmptyCode,
    /// Strict confinement is not available.
    #[error("{0}")]
    StrictUnavailable(String),
    /// Strict confinement could not be prepared (missing kernel feature, bad policy, ...).
    #[error(transparent)]
    Confine(#[from] ConfineError),
    /// The session working dir is unusable.
    #[error("working directory {path} is not usable: {reason}")]
    BadCwd {
        /// The directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// No interpreter.
    #[error(transparent)]
    Interpreter(#[from] crate::interpreter::InterpreterError),
    /// The environment policy is broken.
    #[error(transparent)]
    Policy(#[from] crate::env_policy::PolicyError),
    /// The staging dir could not be prepared.
    #[error("cannot prepare the staging directory: {0}; check that TMPDIR is writable")]
    Staging(std::io::Error),
    /// The socket path would be too long.
    #[error("the RPC socket path {0} is longer than Unix sockets allow; set TMPDIR to a shorter directory")]
    SocketPathTooLong(PathBuf),
    /// The RPC listener could not be opened.
    #[error("cannot open the RPC socket: {0}")]
    Listener(std::io::Error),
    /// The interpreter could not be started.
    #[error("cannot start {interpreter}: {source}")]
    Spawn {
        /// The interpreter.
        interpreter: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

/// The session working dir: explicit, else `TERMINAL_CWD`, else the process cwd.
pub fn session_cwd(explicit: Option<&Path>) -> Result<PathBuf, StartError> {
    let dir = match explicit {
        Some(p) => p.to_path_buf(),
        None => match std::env::var_os("TERMINAL_CWD").filter(|v| !v.is_empty()) {
            Some(p) => PathBuf::from(p),
            None => std::env::current_dir().map_err(|e| StartError::BadCwd {
                path: PathBuf::from("."),
                reason: e.to_string(),
            })?,
        },
    };
    let bad = |reason: &str| StartError::BadCwd {
        path: dir.clone(),
        reason: reason.into(),
    };
    let meta = std::fs::metadata(&dir).map_err(|e| bad(&e.to_string()))?;
    if !meta.is_dir() {
        return Err(bad("not a directory"));
    }
    std::fs::canonicalize(&dir).map_err(|e| bad(&e.to_string()))
}

/// Formats seconds the way the timeout notice prints them (`300`, `0.5`).
pub fn format_seconds(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        d.as_secs().to_string()
    } else {
        let s = format!("{:.3}", d.as_secs_f64());
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The notice a timed-out execution ends with.
pub fn timeout_notice(timeout: Duration) -> String {
    format!(
        "Script timed out after {}s and was killed.",
        format_seconds(timeout)
    )
}

/// The notice an interrupted execution ends with.
pub const INTERRUPT_NOTICE: &str = "[execution interrupted — user sent a new message]";

/// Runs one script to completion and returns its result. Never panics on script input; always
/// removes its staging dir and leaves no process behind.
pub async fn execute(
    request: ExecutionRequest,
    registry: &'static ToolRegistry,
    interrupt: Interrupt,
) -> ExecutionResult {
    let started = Instant::now();
    let mode = request.mode.as_str();
    match run(request, registry, interrupt, started).await {
        Ok(result) => result,
        Err(e) => {
            tracing::error!("execute_code: {e}");
            ExecutionResult::failed_to_start(mode, e.to_string(), started.elapsed().as_secs_f64())
        }
    }
}

struct Prepared {
    staging: tempfile::TempDir,
    script: PathBuf,
    socket: PathBuf,
    rpc_dir: PathBuf,
}

fn prepare_staging(stub_source: &str, code: &str) -> Result<Prepared, StartError> {
    let staging = tempfile::Builder::new()
        .prefix("vibeos-exec-")
        .tempdir()
        .map_err(StartError::Staging)?;
    let dir = staging.path();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(StartError::Staging)?;
    std::fs::write(dir.join("vibeos_tools.py"), stub_source).map_err(StartError::Staging)?;
    let script = dir.join("script.py");
    std::fs::write(&script, code).map_err(StartError::Staging)?;
    let rpc_dir = dir.join("rpc");
    std::fs::create_dir(&rpc_dir).map_err(StartError::Staging)?;
    std::fs::set_permissions(&rpc_dir, std::fs::Permissions::from_mode(0o700))
        .map_err(StartError::Staging)?;
    let socket = rpc_dir.join("rpc.sock");
    if socket.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(StartError::SocketPathTooLong(socket));
    }
    Ok(Prepared {
        staging,
        script,
        socket,
        rpc_dir,
    })
}

fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The child's environment: scrubbed base, then the injected names (SPEC §4).
fn child_env(
    request: &ExecutionRequest,
    staging: &Path,
    session_cwd: &Path,
) -> Result<Vec<(OsString, OsString)>, StartError> {
    let policy = EnvPolicy::builtin()?;
    let base: Vec<(OsString, OsString)> = match &request.base_env {
        Some(env) => env.clone(),
        None => std::env::vars_os().collect(),
    };
    let lookup = |name: &str| base.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let passthrough: BTreeSet<String> = request.env_passthrough.iter().cloned().collect();
    let scrubbed = policy.scrub(base.clone(), &passthrough);
    let injected_names: BTreeSet<&str> = policy.injected.iter().map(String::as_str).collect();
    let mut env: Vec<(OsString, OsString)> = scrubbed
        .kept
        .into_iter()
        .filter(|(k, _)| !k.to_str().is_some_and(|k| injected_names.contains(k)))
        .collect();
    let home = match request.mode {
        Mode::Project => lookup("HOME").unwrap_or_else(|| staging.as_os_str().to_owned()),
        Mode::Strict => staging.as_os_str().to_owned(),
    };
    env.push(("HOME".into(), home));
    if let Some(tz) = lookup("TZ") {
        env.push(("TZ".into(), tz));
    }
    env.push(("PYTHONDONTWRITEBYTECODE".into(), "1".into()));
    env.push(("PYTHONIOENCODING".into(), "utf-8".into()));
    env.push(("PYTHONUTF8".into(), "1".into()));
    // The staging dir first so `import vibeos_tools` works from any cwd; in project mode the
    // session dir next, so project imports work as they do for `python -c` in terminal().
    let mut pythonpath = staging.as_os_str().to_owned();
    if request.mode == Mode::Project {
        pythonpath.push(":");
        pythonpath.push(session_cwd.as_os_str());
    }
    let keeps_pythonpath = policy.decide("PYTHONPATH", &passthrough) == Rule::SafeSystem
        || passthrough.contains("PYTHONPATH");
    if let Some(old) = lookup("PYTHONPATH").filter(|v| !v.is_empty() && keeps_pythonpath) {
        pythonpath.push(":");
        pythonpath.push(old);
    }
    env.push(("PYTHONPATH".into(), pythonpath));
    Ok(env)
}

async fn run(
    request: ExecutionRequest,
    registry: &'static ToolRegistry,
    interrupt: Interrupt,
    started: Instant,
) -> Result<ExecutionResult, StartError> {
    if request.code.trim().is_empty() {
        return Err(StartError::EmptyCode);
    }
    let session_cwd = session_cwd(request.cwd.as_deref())?;
    let interpreter: Interpreter =
        Resolution::from_env(request.python.clone()).resolve(request.mode)?;

    let script_tools: Vec<_> = registry
        .script_tools()
        .into_iter()
        .filter(|e| {
            request
                .script_tools
                .as_ref()
                .is_none_or(|s| s.contains(&e.name))
        })
        .collect();
    let stub_tools: Vec<StubTool> = script_tools
        .iter()
        .map(|e| StubTool {
            name: e.name.clone(),
            description: e.description.clone(),
            parameters: e.schema.clone(),
        })
        .collect();
    let stub = generate_stub(&stub_tools);
    for skipped in &stub.skipped {
        tracing::warn!("execute_code: {skipped}");
    }
    let prepared = prepare_staging(&stub.source, &request.code)?;
    let staging = prepared.staging.path().to_path_buf();
    let child_cwd = match request.mode {
        Mode::Project => session_cwd.clone(),
        Mode::Strict => staging.clone(),
    };
    let mut env = child_env(&request, &staging, &session_cwd)?;
    // What tools started by the script (terminal) get: the same, without the channel.
    let tool_env = env.clone();
    let token = new_token();
    let strict = request.mode == Mode::Strict;
    // Strict mode: the script gets one end of a socketpair (landlock cannot stop a confined
    // process from dialling a pathname socket, so there must be no path to dial at all).
    let mut rpc_pair = None;
    if strict {
        let (ours, theirs) =
            std::os::unix::net::UnixStream::pair().map_err(StartError::Listener)?;
        env.push((
            "VIBEOS_RPC_FD".into(),
            theirs.as_raw_fd().to_string().into(),
        ));
        env.push(("VIBEOS_RPC_STRICT".into(), "1".into()));
        env.retain(|(k, _)| k != "TMPDIR");
        env.push(("TMPDIR".into(), staging.clone().into_os_string()));
        rpc_pair = Some((ours, OwnedFd::from(theirs)));
    } else {
        env.push((
            "VIBEOS_RPC_DIR".into(),
            prepared.rpc_dir.clone().into_os_string(),
        ));
        env.push((
            "VIBEOS_RPC_SOCKET".into(),
            prepared.socket.clone().into_os_string(),
        ));
    }
    env.push(("VIBEOS_RPC_TOKEN".into(), token.clone().into()));

    let listener = if strict {
        None
    } else {
        Some(tokio::net::UnixListener::bind(&prepared.socket).map_err(StartError::Listener)?)
    };
    let state = Arc::new(ChannelState::new(
        registry,
        token,
        stub.tools.iter().cloned().collect(),
        request.max_tool_calls,
        ToolContext {
            task_id: request.task_id.clone(),
            cwd: session_cwd.clone(),
            env: Some(Arc::new(
                tool_env
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.to_string_lossy().into_owned(),
                            v.to_string_lossy().into_owned(),
                        )
                    })
                    .collect(),
            )),
            origin: CallOrigin::Script,
        },
    ));
    let mut confinement = None;
    let server = match (listener, rpc_pair) {
        (Some(listener), _) => serve(listener, Arc::clone(&state)),
        (None, Some((ours, theirs))) => {
            let (prepared_confinement, summary) = crate::confine::prepare(crate::confine::Plan {
                options: &request.strict,
                interpreter: &interpreter.path,
                staging: &staging,
                rpc: theirs,
            })?;
            tracing::debug!(
                uid = summary.uid,
                dac_read_search = summary.dac_read_search,
                read_execute = ?summary.read_execute,
                "execute_code: strict confinement prepared"
            );
            confinement = Some(prepared_confinement);
            serve_stream(
                ours,
                Arc::clone(&state),
                false,
                tokio::runtime::Handle::current(),
            );
            // Nothing to accept in strict mode: the connection thread serves the one channel.
            tokio::spawn(std::future::pending::<()>())
        }
        (None, None) => {
            return Err(StartError::Listener(std::io::Error::other(
                "no RPC channel was set up",
            )))
        }
    };

    let (lifeline, setup, read_end) =
        lifeline(request.kill_grace).map_err(|e| StartError::Spawn {
            interpreter: interpreter.path.clone(),
            source: e,
        })?;
    let mut command = tokio::process::Command::new(&interpreter.path);
    command
        .arg("-u")
        .arg(&prepared.script)
        .env_clear()
        .envs(env)
        .current_dir(&child_cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(false);
    // SAFETY: `become_reaper` (and the confinement it applies) is written for the pre_exec
    // window: it only makes async-signal-safe system calls on values prepared before the fork,
    // and never returns in the reaper branch.
    unsafe {
        command.pre_exec(move || become_reaper(setup, confinement.as_ref()));
    }
    tracing::info!(
        mode = request.mode.as_str(),
        interpreter = %interpreter.path.display(),
        source = interpreter.source,
        cwd = %child_cwd.display(),
        "execute_code: starting script"
    );
    let spawned = command.spawn();
    // The command owns the confinement, with the script's end of the socketpair: drop it so
    // only the script holds that end and the channel reaches EOF when the script is gone.
    drop(command);
    drop(read_end);
    let mut child = spawned.map_err(|source| StartError::Spawn {
        interpreter: interpreter.path.clone(),
        source,
    })?;
    let reaper_pid = child.id().unwrap_or(0);
    state.root_pid.store(reaper_pid, Ordering::SeqCst);

    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let stdout_limit = request.stdout_limit;
    let stderr_limit = request.stderr_limit;
    let stdout_task = tokio::spawn(async move {
        match stdout {
            Some(s) => drain(s, stdout_limit).await,
            None => HeadTail::new(stdout_limit),
        }
    });
    let stderr_task = tokio::spawn(async move {
        match stderr {
            Some(s) => drain(s, stderr_limit).await,
            None => HeadTail::new(stderr_limit),
        }
    });

    enum Ending {
        Exited,
        Timeout,
        Interrupted,
    }
    let mut status = None;
    let ending = tokio::select! {
        s = child.wait() => { status = s.ok(); Ending::Exited }
        _ = tokio::time::sleep(request.timeout) => Ending::Timeout,
        _ = interrupt.0.cancelled() => Ending::Interrupted,
    };
    if !matches!(ending, Ending::Exited) {
        // The reaper relays SIGTERM to every process of the execution and SIGKILLs what is
        // left after the grace period.
        signal(reaper_pid, libc::SIGTERM);
        let backstop = request.kill_grace + Duration::from_secs(3);
        status = match tokio::time::timeout(backstop, child.wait()).await {
            Ok(s) => s.ok(),
            Err(_) => {
                signal(reaper_pid, libc::SIGKILL);
                child.wait().await.ok()
            }
        };
    }
    drop(lifeline);
    // Terminal commands the script started are the supervisor's children, out of the reaper's
    // reach: end them too, or a blocked tool call would outlive the execution.
    vibeos_tools::environments::local::kill_scope(&state.context);
    // Every process of the execution is gone, so the pipes reach EOF; the bound guards
    // against one that escaped our reach (say, a setuid program we may not signal).
    let settle = Duration::from_secs(2);
    let stdout_cap = finish(stdout_task, settle, stdout_limit).await;
    let stderr_cap = finish(stderr_task, settle, stderr_limit).await;
    server.abort();
    let _ = server.await;
    state.close_all();
    let tool_calls_made = state.calls_made.load(Ordering::SeqCst);

    let exit_code = status.map(|s| {
        use std::os::unix::process::ExitStatusExt;
        s.code().unwrap_or_else(|| -s.signal().unwrap_or(0))
    });
    let (status, error) = match ending {
        Ending::Timeout => (Status::Timeout, Some(timeout_notice(request.timeout))),
        Ending::Interrupted => (
            Status::Interrupted,
            Some("execution interrupted — user sent a new message".to_string()),
        ),
        Ending::Exited => match exit_code {
            Some(0) => (Status::Success, None),
            Some(code) => (Status::Error, Some(exit_error(code, &stderr_cap))),
            None => (
                Status::Error,
                Some("the script's exit status was lost".into()),
            ),
        },
    };
    let mut output = stdout_cap.render("output");
    if status != Status::Success && stderr_cap.total() > 0 {
        if !output.is_empty() && !output.ends_with('\n') {
            output.push('\n');
        }
        output.push_str("--- stderr ---\n");
        output.push_str(&stderr_cap.render("stderr"));
    }
    let notice = match status {
        Status::Timeout => Some(timeout_notice(request.timeout)),
        Status::Interrupted => Some(INTERRUPT_NOTICE.to_string()),
        _ => None,
    };
    if let Some(notice) = notice {
        if !output.is_empty() && !output.ends_with('\n') {
            output.push('\n');
        }
        output.push_str(&notice);
    }
    drop(prepared);
    Ok(ExecutionResult {
        status,
        output,
        tool_calls_made,
        duration_seconds: started.elapsed().as_secs_f64(),
        error,
        exit_code,
        truncated: stdout_cap.truncated() || stderr_cap.truncated(),
        stdout_bytes: stdout_cap.total(),
        stdout_bytes_omitted: stdout_cap.omitted(),
        stderr_bytes: stderr_cap.total(),
        stderr_bytes_omitted: stderr_cap.omitted(),
        mode: request.mode.as_str(),
        interpreter: Some(interpreter.path.display().to_string()),
    })
}

fn signal(pid: u32, sig: libc::c_int) {
    if pid == 0 {
        return;
    }
    // SAFETY: kill has no memory-safety preconditions; `pid` is our own child, not yet reaped
    // (we hold its `Child` and only call this before `wait` returned).
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

async fn finish(
    task: tokio::task::JoinHandle<HeadTail>,
    bound: Duration,
    limit: usize,
) -> HeadTail {
    let abort = task.abort_handle();
    match tokio::time::timeout(bound, task).await {
        Ok(Ok(cap)) => cap,
        _ => {
            abort.abort();
            HeadTail::new(limit)
        }
    }
}

/// The error line of a failed script: its exit code and the last line of stderr (the
/// exception, for a Python traceback).
fn exit_error(code: i32, stderr: &HeadTail) -> String {
    let text = stderr.render("stderr");
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(str::trim);
    let what = if code < 0 {
        format!("the script was killed by signal {}", -code)
    } else {
        format!("the script exited with code {code}")
    };
    match last {
        Some(line) => format!("{what}: {line}"),
        None => what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_timeouts_like_the_spec() {
        assert_eq!(
            timeout_notice(Duration::from_secs(300)),
            "Script timed out after 300s and was killed."
        );
        assert_eq!(format_seconds(Duration::from_millis(1500)), "1.5");
    }
}
