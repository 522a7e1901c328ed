//! What one execution is asked to do: the script, its mode and limits ([`ExecutionRequest`]),
//! the handle that interrupts it ([`Interrupt`]) and the session working dir it runs in.
//!
//! Kept below every module that starts or supervises an execution (launch, pool, fork server,
//! remote, the whole-script guard, execute) so that they all read the request from here instead
//! of from [`crate::execute`], which uses them.

use crate::config::{Config, Mode};
use crate::confine::StrictOptions;
use crate::error::StartError;
use crate::interpreter::{InterpreterError, Resolution};
use crate::interpreter_probe::ProbeEnv;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

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
    /// The working dir inside a remote backend asked for this execution alone (the Python
    /// API's `cwd` with a backend that does not mount this host's dir); `None` means the
    /// backend's (`terminal.cwd`, `--cwd`, or its default). Apart from `cwd`, which the tool
    /// path fills with the host's session dir: a host path means nothing over there.
    pub backend_cwd: Option<String>,
    /// Default interpreter (`code_execution.python`).
    pub python: Option<PathBuf>,
    /// The embedding host's own interpreter, the default when `python` is unset
    /// ([`Config::host_python`]).
    pub host_python: Option<PathBuf>,
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
    /// How many executions this one runs inside: 0 for one an agent or a user started, n + 1
    /// for one a host tool started while answering a script call of an execution at n (the
    /// Python package's `execute_code` in a tool handler). Its own script's calls carry it on
    /// ([`vibeos_tools::mark_nesting`]), so the host can bound how deep executions nest.
    pub nesting: u32,
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
            backend_cwd: None,
            python: config.python.clone(),
            host_python: config.host_python.clone(),
            env_passthrough: config.env_passthrough.clone(),
            stdout_limit: config.stdout_limit,
            stderr_limit: config.stderr_limit,
            task_id: None,
            kill_grace: KILL_GRACE,
            base_env: None,
            script_tools: None,
            strict: StrictOptions::from_config(config),
            nesting: 0,
        }
    }

    /// How this request's interpreter is found on this machine: its settings, the caller's
    /// environment, and the environment probes of the interpreter get (made from the same
    /// caller environment and passthrough names as the script child's).
    pub(crate) fn resolution(&self) -> Resolution {
        Resolution::from_env(self.python.clone())
            .with_host(self.host_python.clone())
            .with_probe_env(ProbeEnv::new(
                self.base_env.clone(),
                self.env_passthrough.iter().cloned().collect(),
            ))
    }

    /// Checks `code_execution.python` when this request would run it on this machine: `Err`
    /// when it is missing, not executable or named for a Python older than 3.8. That is a
    /// configuration error, which a face reports as one before anything starts (the CLI exits
    /// 2, the Python package raises) instead of as a failed execution. Everything else is left
    /// to the execution, whose result reports it: no python3 on PATH, or a setting that an
    /// active virtualenv leaves unused in project mode.
    pub fn check_configured_python(&self) -> Result<(), InterpreterError> {
        if self.python.is_none() {
            return Ok(()); // nothing configured: nothing to check, and no cost on a cold start
        }
        // The session dir as the execution takes it; a bad one is the execution's to report,
        // and a wrapper is then asked where this process runs.
        let cwd = session_cwd(self.cwd.as_deref())
            .or_else(|_| std::env::current_dir())
            .unwrap_or_else(|_| PathBuf::from("/"));
        match self.resolution().resolve(self.mode, &cwd) {
            Err(e) if e.is_setting() => Err(e),
            _ => Ok(()),
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

/// The session working dir: explicit, else `TERMINAL_CWD` (`~` expanded; an unusable one is
/// logged and skipped), else the process cwd. An explicit dir that is unusable is an error.
pub fn session_cwd(explicit: Option<&Path>) -> Result<PathBuf, StartError> {
    if let Some(p) = explicit {
        return usable_dir(p);
    }
    if let Some(dir) = crate::terminal_cwd::from_env() {
        match usable_dir(&dir) {
            Ok(d) => return Ok(d),
            Err(e) => {
                // One run resolves the session dir more than once (its prestart, its
                // execution); a long-lived host at every call. Said once per value, once
                // logging is up (`run` resolves it first before that, unheard).
                static WARNED: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);
                let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
                if warned.as_deref() != Some(dir.as_path()) {
                    tracing::warn!("TERMINAL_CWD ignored, using the process cwd instead: {e}");
                    if tracing::dispatcher::has_been_set() {
                        *warned = Some(dir);
                    }
                }
            }
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
    crate::real_path::canonical(dir).map_err(|e| bad(&e.to_string()))
}
