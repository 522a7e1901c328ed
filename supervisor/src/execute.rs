//! One execute_code call from start to cleanup (SPEC §2).
//!
//! staging dir + stub → RPC listener → child (scrubbed env, mode's cwd and interpreter, under
//! its reaper) → limits (timeout, output caps, call budget, interrupt) → result → cleanup. The
//! staging dir and socket are removed on every path, because they live in a `TempDir` owned by
//! this function.

use crate::capture::{spawn_drain, HeadTail};
use crate::config::{Config, Mode};
use crate::confine::{ConfineError, StrictOptions};
use crate::interpreter::Interpreter;
use crate::result::{ExecutionResult, Status};
use crate::rpc_server::{serve, serve_stream, ChannelState};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use vibeos_rpc::{generate_stub, StubTool};
use vibeos_tools::{CallOrigin, ToolContext, ToolRegistry};

// The launch moved to its own module; these names stay reachable here for the pool.
pub(crate) use crate::launch::{
    launch, with_channel, LaunchKey, LaunchSpec, Launched, Program, RpcEnd, Staging,
};

/// Grace period between SIGTERM and SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(5);

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

    /// Resolves once [`Interrupt::interrupt`] is called.
    pub(crate) async fn cancelled(&self) {
        self.0.cancelled().await
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

/// The session working dir: explicit, else `TERMINAL_CWD` (`~` expanded; an unusable one is
/// logged and skipped), else the process cwd. An explicit dir that is unusable is an error.
pub fn session_cwd(explicit: Option<&Path>) -> Result<PathBuf, StartError> {
    if let Some(p) = explicit {
        return usable_dir(p);
    }
    if let Some(dir) = crate::terminal_cwd::from_env() {
        match usable_dir(&dir) {
            Ok(d) => return Ok(d),
            Err(e) => tracing::warn!("TERMINAL_CWD ignored, using the process cwd instead: {e}"),
        }
    }
    let cwd = std::env::current_dir().map_err(|e| StartError::BadCwd {
        path: PathBuf::from("."),
        reason: e.to_string(),
    })?;
    usable_dir(&cwd)
}

fn usable_dir(dir: &Path) -> Result<PathBuf, StartError> {
    let bad = |reason: &str| StartError::BadCwd {
        path: dir.to_path_buf(),
        reason: reason.into(),
    };
    let meta = std::fs::metadata(dir).map_err(|e| bad(&e.to_string()))?;
    if !meta.is_dir() {
        return Err(bad("not a directory"));
    }
    std::fs::canonicalize(dir).map_err(|e| bad(&e.to_string()))
}

/// Formats seconds the way the timeout notice prints them (`300`, `0.5`, `0.0001`): the
/// shortest decimal that reads back as the same value, so a sub-millisecond timeout is never
/// reported as `0s`.
pub fn format_seconds(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        d.as_secs().to_string()
    } else {
        d.as_secs_f64().to_string()
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

async fn run(
    request: ExecutionRequest,
    registry: &'static ToolRegistry,
    interrupt: Interrupt,
    started: Instant,
) -> Result<ExecutionResult, StartError> {
    if request.code.trim().is_empty() {
        return Err(StartError::EmptyCode);
    }
    if let Some(refusal) = crate::script_guard::refusal(&request).await {
        return Ok(ExecutionResult::failed_to_start(
            request.mode.as_str(),
            refusal,
            started.elapsed().as_secs_f64(),
        ));
    }
    let script_tools: Vec<_> = registry
        .script_tools()
        .into_iter()
        .filter(|e| {
            request
                .script_tools
                .as_ref()
                .is_none_or(|s| s.contains(&e.name))
        })
        .filter(|e| {
            request.mode != Mode::Strict || crate::confine::tools::offered(&request.strict, &e.name)
        })
        .collect();
    let stub_tools: Vec<StubTool> = script_tools
        .iter()
        .map(|e| StubTool {
            name: e.name.clone(),
            description: e.description.clone(),
            parameters: e.script_schema(),
        })
        .collect();
    let stub = generate_stub(&stub_tools);
    for skipped in &stub.skipped {
        tracing::warn!("execute_code: {skipped}");
    }
    // A remote backend runs the script where its tools act (SPEC §9).
    if let Some(envs) = vibeos_tools::environments::active() {
        let task = request.task_id.clone();
        let env = tokio::task::spawn_blocking(move || envs.get(task.as_deref()))
            .await
            .map_err(|e| StartError::Listener(std::io::Error::other(e)))?;
        let mut result = match env {
            Ok(env) => {
                crate::remote::run_remote(crate::remote::RemoteRun {
                    request: &request,
                    env,
                    stub: stub.source,
                    allowed: stub.tools.iter().cloned().collect(),
                    registry,
                    interrupt,
                    started,
                })
                .await
            }
            Err(e) => {
                let mut failed = ExecutionResult::failed_to_start(
                    request.mode.as_str(),
                    e.to_string(),
                    started.elapsed().as_secs_f64(),
                );
                failed.backend = Some(envs_backend());
                failed
            }
        };
        let base_env = match &request.base_env {
            Some(env) => env.clone(),
            None => std::env::vars_os().collect(),
        };
        crate::redaction::apply(&mut result, &base_env);
        return Ok(result);
    }
    let spec = LaunchSpec::for_request(&request)?;
    let interpreter = spec.interpreter.clone();
    let session_cwd = spec.session_cwd.clone();
    // An interpreter already waiting in the pool is claimed with one write (7.6 ms against the
    // fork server's 36 ms for a paced call, docs/warm-pool.md); when the pool is dry (bursts,
    // back to back) the fork server serves the call instead of a cold start.
    let pooled = match crate::pool::active() {
        Some(pool) => pool.start_warm(&spec, &stub.source, &request.code),
        None => None,
    };
    let warm = match pooled {
        Some(launched) => Some(launched),
        None => crate::zygote::start_async(&spec, &stub.source, &request.code).await,
    };
    let launched = match warm {
        Some(launched) => launched,
        None => {
            let staging = Staging::create(spec.disk_budget())?;
            staging.write_files(&stub.source, &request.code, None)?;
            launch(&spec, staging, Program::Script)?
        }
    };
    // Strict mode: the file tools act only beneath the execution's roots.
    let paths = if spec.mode == Mode::Strict {
        match crate::confine::tools::path_policy(
            &request.strict,
            launched.staging.path(),
            &session_cwd,
        ) {
            Ok(p) => Some(Arc::new(p)),
            Err(e) => {
                launched.discard(true);
                return Err(e.into());
            }
        }
    } else {
        None
    };
    tracing::info!(
        mode = request.mode.as_str(),
        interpreter = %interpreter.path.display(),
        source = interpreter.source,
        cwd = %spec.child_cwd(launched.staging.path()).display(),
        "execute_code: script started"
    );
    let tool_env = launched.tool_env.clone();
    let mut result = supervise(
        launched,
        Supervision {
            request: &request,
            interpreter: &interpreter,
            session_cwd,
            allowed: stub.tools.iter().cloned().collect(),
            tool_env,
            paths,
            registry,
            interrupt,
            started,
        },
    )
    .await;
    crate::redaction::apply(&mut result, &spec.base_env);
    Ok(result)
}

/// The active backend's name, for results of executions that never reached it.
fn envs_backend() -> String {
    vibeos_tools::environments::active()
        .map(|e| e.settings().backend.as_str().to_string())
        .unwrap_or_else(|| "local".into())
}

/// Everything [`supervise`] needs besides the started child.
struct Supervision<'a> {
    request: &'a ExecutionRequest,
    interpreter: &'a Interpreter,
    session_cwd: PathBuf,
    allowed: BTreeSet<String>,
    tool_env: Vec<(OsString, OsString)>,
    paths: Option<Arc<vibeos_tools::path_policy::PathPolicy>>,
    registry: &'static ToolRegistry,
    interrupt: Interrupt,
    started: Instant,
}

/// Serves the channel, drains the output, enforces timeout and interrupt, cleans up and builds
/// the result: the same for a cold child and a pooled one.
async fn supervise(launched: Launched, s: Supervision<'_>) -> ExecutionResult {
    let Launched {
        child,
        pidfd,
        lifeline,
        staging,
        rpc,
        token,
        on_done,
        ..
    } = launched;
    let mut child = child;
    let request = s.request;
    let state = Arc::new(ChannelState::new(
        s.registry,
        token,
        s.allowed,
        request.max_tool_calls,
        ToolContext {
            task_id: request.task_id.clone(),
            cwd: s.session_cwd.clone(),
            env: Some(Arc::new(
                s.tool_env
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
            paths: s.paths.clone(),
        },
    ));
    let reaper_pid = child.id();
    state.root_pid.store(reaper_pid, Ordering::SeqCst);
    let server = match rpc {
        RpcEnd::Listener(listener) => {
            match listener
                .set_nonblocking(true)
                .and_then(|_| tokio::net::UnixListener::from_std(listener))
            {
                Ok(listener) => Some(serve(listener, Arc::clone(&state))),
                Err(e) => {
                    tracing::error!("execute_code: cannot serve the RPC socket: {e}");
                    None
                }
            }
        }
        RpcEnd::Stream(ours) => {
            // Nothing to accept in strict mode: the connection thread serves the one channel.
            serve_stream(
                ours,
                Arc::clone(&state),
                false,
                tokio::runtime::Handle::current(),
            );
            None
        }
    };

    let stdout = child
        .take_stdout()
        .and_then(|s| tokio::process::ChildStdout::from_std(s).ok());
    let stderr = child
        .take_stderr()
        .and_then(|s| tokio::process::ChildStderr::from_std(s).ok());
    let stdout_limit = request.stdout_limit;
    let stderr_limit = request.stderr_limit;
    let stdout_task = spawn_drain(stdout, stdout_limit);
    let stderr_task = spawn_drain(stderr, stderr_limit);
    // std's wait blocks; it gets a thread of the blocking pool. The pidfd (or the reaped flag)
    // keeps our signals from reaching another process once it has returned.
    let reaped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reaped_flag = Arc::clone(&reaped);
    let mut waiter = tokio::task::spawn_blocking(move || {
        let status = child.wait().ok();
        reaped_flag.store(true, Ordering::SeqCst);
        status
    });
    let send = |sig: rustix::process::Signal| {
        if pidfd.is_some() || !reaped.load(Ordering::SeqCst) {
            signal(pidfd.as_ref(), reaper_pid, sig);
        }
    };

    let mut status = None;
    let ending = tokio::select! {
        s = &mut waiter => { status = s.ok().flatten(); Ending::Exited }
        _ = tokio::time::sleep(request.timeout) => Ending::Timeout,
        _ = s.interrupt.0.cancelled() => Ending::Interrupted,
    };
    if !matches!(ending, Ending::Exited) {
        // The reaper relays SIGTERM to every process of the execution and SIGKILLs what is
        // left after the grace period.
        send(rustix::process::Signal::TERM);
        let backstop = request.kill_grace + Duration::from_secs(3);
        status = match tokio::time::timeout(backstop, &mut waiter).await {
            Ok(s) => s.ok().flatten(),
            Err(_) => {
                send(rustix::process::Signal::KILL);
                waiter.await.ok().flatten()
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
    if let Some(server) = server {
        server.abort();
        let _ = server.await;
    }
    state.close_all();
    let tool_calls_made = state.calls_made.load(Ordering::SeqCst);

    let exit_code = status.map(|s| {
        use std::os::unix::process::ExitStatusExt;
        s.code().unwrap_or_else(|| -s.signal().unwrap_or(0))
    });
    drop(staging);
    drop(on_done);
    ended_result(
        Ended {
            ending,
            exit_code,
            stdout: &stdout_cap,
            stderr: &stderr_cap,
            tool_calls_made,
        },
        request,
        s.started,
        s.interpreter.path.display().to_string(),
    )
}

/// How an execution ended, as the supervision saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The script (or its remote client) exited.
    Exited,
    /// The timeout fired.
    Timeout,
    /// [`Interrupt::interrupt`] was called.
    Interrupted,
}

/// How an execution ended and what it left: the supervision's findings, local or remote.
pub(crate) struct Ended<'a> {
    pub(crate) ending: Ending,
    pub(crate) exit_code: Option<i32>,
    pub(crate) stdout: &'a HeadTail,
    pub(crate) stderr: &'a HeadTail,
    pub(crate) tool_calls_made: usize,
}

/// The result object of an ended execution. Shared by local and remote supervision, so every
/// launch returns the same object (a remote one then sets `backend`).
pub(crate) fn ended_result(
    ended: Ended<'_>,
    request: &ExecutionRequest,
    started: Instant,
    interpreter: String,
) -> ExecutionResult {
    let (status, error, output) = compose_output(
        ended.ending,
        ended.exit_code,
        ended.stdout,
        ended.stderr,
        request.timeout,
    );
    ExecutionResult {
        status,
        output,
        tool_calls_made: ended.tool_calls_made,
        duration_seconds: started.elapsed().as_secs_f64(),
        error,
        exit_code: ended.exit_code,
        truncated: ended.stdout.truncated() || ended.stderr.truncated(),
        stdout_bytes: ended.stdout.total(),
        stdout_bytes_omitted: ended.stdout.omitted(),
        stderr_bytes: ended.stderr.total(),
        stderr_bytes_omitted: ended.stderr.omitted(),
        mode: request.mode.as_str(),
        redactions: 0,
        interpreter: Some(interpreter),
        backend: None,
    }
}

/// Status, error line and output of an ended execution: the captured stdout, stderr when it
/// failed, and the closing notice.
fn compose_output(
    ending: Ending,
    exit_code: Option<i32>,
    stdout_cap: &HeadTail,
    stderr_cap: &HeadTail,
    timeout: Duration,
) -> (Status, Option<String>, String) {
    let (status, error) = match ending {
        Ending::Timeout => (Status::Timeout, Some(timeout_notice(timeout))),
        Ending::Interrupted => (
            Status::Interrupted,
            Some("execution interrupted — user sent a new message".to_string()),
        ),
        Ending::Exited => match exit_code {
            Some(0) => (Status::Success, None),
            Some(code) => (Status::Error, Some(exit_error(code, stderr_cap))),
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
        Status::Timeout => Some(timeout_notice(timeout)),
        Status::Interrupted => Some(INTERRUPT_NOTICE.to_string()),
        _ => None,
    };
    if let Some(notice) = notice {
        if !output.is_empty() && !output.ends_with('\n') {
            output.push('\n');
        }
        output.push_str(&notice);
    }
    (status, error, output)
}

/// Sends `sig` to the reaper: through its pidfd when there is one (never a recycled pid), else
/// by pid, which the caller only does while the reaper is unreaped.
fn signal(pidfd: Option<&OwnedFd>, pid: u32, sig: rustix::process::Signal) {
    if let Some(fd) = pidfd {
        let _ = rustix::process::pidfd_send_signal(fd, sig);
        return;
    }
    // `pid` is our own child, not yet reaped (0: none).
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

/// The capture of an output reader, waiting at most `bound` for it to drain (an empty capture
/// if it does not).
pub(crate) async fn finish(
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
pub(crate) fn exit_error(code: i32, stderr: &HeadTail) -> String {
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
        assert_eq!(format_seconds(Duration::from_secs_f64(0.0001)), "0.0001");
        assert_eq!(format_seconds(Duration::from_secs(300)), "300");
    }
}
