//! `vibeos_exec._native`: the Rust half of the `vibeos_exec` Python package.
//!
//! Most agents that would call execute_code are Python programs, so they get it in-process
//! instead of through the CLI: this extension runs [`vibeos_supervisor::execute`] on a tokio
//! runtime owned by the extension, with the GIL released for the whole run, and lets Python
//! register tools into the same process-wide registry the scripts' calls are dispatched
//! through. The Python half (`vibeos_exec/*.py`) checks argument types, adapts handlers
//! (sync/async, JSON in and out, exceptions to `(kind, message)`) and holds session state; this
//! half stays a thin, typed bridge.
//!
//! Locking rule: every call into the registry or the supervisor that may take a Rust lock or
//! wait is made with the GIL released, because Python tool handlers take the GIL from the
//! registry's threads — holding the GIL while waiting on them would deadlock.

mod log_bridge;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use vibeos_supervisor::overrides::{Overrides, Requested, Spelling};
use vibeos_supervisor::session_cwd;
use vibeos_supervisor::EnvPolicy;
use vibeos_supervisor::{execute, Config, ExecutionRequest, ExecutionResult, Interrupt, Status};
use vibeos_tools::approval::{self, ApprovalRequest, NoAnswer};
use vibeos_tools::approval_policy::{self, SmartVerdict};
use vibeos_tools::environments::BackendKind;
use vibeos_tools::{
    registry, CallOrigin, CheckFn, EndedFlag, RegistrationError, ToolCall, ToolContext, ToolEntry,
    ToolError, ToolRegistry, ToolSource, ToolsetSelection,
};

/// How often a waiting `execute_code` looks for a pending signal (Ctrl-C) of the host.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// How many executions deep `execute_code` may run inside the tool calls of other executions'
/// scripts. A host tool that runs code for a script (a sub-agent, a "run this" tool) nests one
/// level per call; without a bound a script calling such a tool in a loop started executions
/// without end (285 running after 4 s, stop 58's probe).
const MAX_NESTING: u32 = 3;

/// The extension's runtime: one multi-thread runtime per process, started on first use.
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("vibeos-exec-py")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the execution runtime: {e}")))
}

fn value_error(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}

/// Runs one script. Arguments were type-checked by `vibeos_exec.execute_code`; values are
/// checked here. Returns the result object as JSON text.
#[pyfunction]
#[pyo3(signature = (code, mode, timeout, max_tool_calls, cwd, enabled_tools, task_id, python, env_passthrough, stdout_limit=None, stderr_limit=None, cancellation=None, called_from=None))]
#[allow(clippy::too_many_arguments)]
fn execute_code(
    py: Python<'_>,
    code: String,
    mode: Option<String>,
    timeout: Option<f64>,
    max_tool_calls: Option<u64>,
    cwd: Option<PathBuf>,
    enabled_tools: Option<Vec<String>>,
    task_id: Option<String>,
    python: Option<PathBuf>,
    env_passthrough: Vec<String>,
    stdout_limit: Option<u64>,
    stderr_limit: Option<u64>,
    cancellation: Option<PyRef<'_, Cancellation>>,
    called_from: Option<PyRef<'_, ScriptCall>>,
) -> PyResult<String> {
    let nesting = called_from.as_ref().map_or(0, |call| call.nesting + 1);
    if nesting > MAX_NESTING {
        return Err(PyRuntimeError::new_err(format!(
            "execute_code cannot start here: it was called from a tool handler answering a \
             script, whose execution already runs {} executions deep (at most {MAX_NESTING}); \
             a tool that runs code for scripts would otherwise let one script start executions \
             without end. Run the code in the handler itself, or have the agent call \
             execute_code",
            nesting - 1
        )));
    }
    let config = py
        .allow_threads(|| Config::load(None))
        .map_err(|e| PyRuntimeError::new_err(format!("vibeos config: {e}")))?;
    py.allow_threads(|| log_config_warnings(&config));
    py.allow_threads(|| ensure_backend(&config))?;
    let mut request = ExecutionRequest::from_config(code, &config);
    let requested = Requested {
        mode: mode.as_deref(),
        timeout,
        max_tool_calls,
        stdout_limit,
        stderr_limit,
    };
    // Named as the package's own argument errors name them (`timeout must be …`).
    Overrides::check(requested, Spelling::Keyword)
        .map_err(|e| value_error(e.to_string()))?
        .apply_to_request(&mut request);
    // With a remote backend the caller's dir names one over there (docs/backends.md).
    request.backend_cwd = cwd.as_ref().map(|c| c.to_string_lossy().into_owned());
    request.cwd = cwd;
    // The host's interpreter is the default when code_execution.python is unset; kept apart
    // from it so the start log names where the interpreter came from.
    request.host_python = python;
    for name in env_passthrough {
        if !request.env_passthrough.contains(&name) {
            request.env_passthrough.push(name);
        }
    }
    if let Some(tools) = enabled_tools {
        let callable = registry().script_tool_names();
        for name in &tools {
            if registry().get(name).is_none() {
                return Err(value_error(format!(
                    "enabled_tools names `{name}`, which is not a registered tool"
                )));
            }
            if !callable.contains(name) {
                return Err(value_error(format!(
                    "enabled_tools names `{name}`, which scripts may not call; script tools are: {} (open a host tool with vibeos_exec.allow_in_scripts)",
                    callable.join(", ")
                )));
            }
        }
        request.script_tools = Some(tools.into_iter().collect::<BTreeSet<_>>());
    }
    // An unusable code_execution.python is a config error, raised as the config's others are
    // (the CLI exits 2 for it), not a failed execution. A remote backend runs its own Python.
    if vibeos_tools::environments::active().is_none() {
        py.allow_threads(|| request.check_configured_python())
            .map_err(|e| {
                PyRuntimeError::new_err(match &config.source {
                    Some(file) => format!("vibeos config: config file {}: {e}", file.display()),
                    None => format!("vibeos config: {e}"),
                })
            })?;
    }
    request.task_id = task_id.clone();
    request.nesting = nesting;
    // Without a task id, "session" approvals last only while such calls run (a gateway that
    // passes none must not let one user's answer approve every later execution).
    let _untracked = task_id.is_none().then(approval::untracked_call);
    let rt = runtime()?;
    // A cancellation made by the caller is this execution's interrupt: cancelled before the
    // execution starts (or is tracked under its task id), the script never runs.
    let interrupt = cancellation.map_or_else(Interrupt::new, |c| c.0.clone());
    let _guard = vibeos_supervisor::interrupts::track(task_id.as_deref(), interrupt.clone());
    let mode_name = request.mode.as_str();
    let mut handle = rt.spawn(execute(request, registry(), interrupt.clone()));
    // Started by a tool call of another execution's script: it ends when that execution does
    // (it ran on to its own timeout, long after the script that asked for it was gone).
    let caller_ended = called_from.map(|call| {
        let mut ended = call.ended.clone();
        let interrupt = interrupt.clone();
        rt.spawn(async move {
            ended.ended().await;
            interrupt.interrupt();
        })
    });
    let mut pending_signal: Option<PyErr> = None;
    let outcome = py.allow_threads(|| loop {
        match rt.block_on(async { tokio::time::timeout(SIGNAL_POLL, &mut handle).await }) {
            Ok(joined) => break joined,
            Err(_) if pending_signal.is_none() => {
                // Ctrl-C in the host: stop the script, wait for its cleanup, then re-raise.
                if let Err(e) = Python::with_gil(|py| py.check_signals()) {
                    interrupt.interrupt();
                    pending_signal = Some(e);
                }
            }
            Err(_) => {}
        }
    });
    if let Some(watch) = caller_ended {
        watch.abort();
    }
    if let Some(e) = pending_signal {
        return Err(e);
    }
    let result = outcome.unwrap_or_else(|e| {
        ExecutionResult::failed_to_start(mode_name, format!("the execution task failed: {e}"), 0.0)
    });
    Ok(result.to_json().to_string())
}

/// One `execute_code` call's own interrupt, made before the call so that it can be cancelled
/// at any point: before the call starts its script (it then never runs), or while it runs.
/// `aexecute_code` makes one per call; an interrupt by task id reached only executions
/// already tracked, and a cancelled call still queued in the host's thread pool ran in full.
#[pyclass(frozen, module = "vibeos_exec._native")]
#[derive(Default)]
struct Cancellation(Interrupt);

#[pymethods]
impl Cancellation {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Interrupts the call: now if it runs, at its start otherwise.
    fn cancel(&self) {
        self.0.interrupt();
    }

    /// Whether [`Cancellation::cancel`] was called.
    fn cancelled(&self) -> bool {
        self.0.is_interrupted()
    }
}

/// A script's tool call, as the host's handler of it runs: how many executions deep the calling
/// execution runs, and whether it has ended. The package keeps it in a context variable while
/// the handler runs, and an `execute_code` the handler makes passes it on: that execution runs
/// one level deeper (refused past [`MAX_NESTING`]) and is interrupted when the calling one ends.
/// Only ever handed out (to the package's tool invoker), so not among the module's names.
#[pyclass(frozen, module = "vibeos_exec._native")]
struct ScriptCall {
    nesting: u32,
    ended: EndedFlag,
}

#[pymethods]
impl ScriptCall {
    /// How many executions the calling execution runs inside (0: an agent started it).
    #[getter]
    fn nesting(&self) -> u32 {
        self.nesting
    }

    /// Whether the calling execution has ended (the call was then abandoned).
    fn ended(&self) -> bool {
        self.ended.is_set()
    }
}

/// Interrupts every running execution of `task_id` (started by `execute_code` or by the
/// execute_code tool through `handle_function_call`); returns how many.
#[pyfunction]
fn interrupt(task_id: &str) -> usize {
    vibeos_supervisor::interrupts::interrupt(task_id)
}

/// Interrupts every running execution; returns how many.
#[pyfunction]
fn interrupt_all() -> usize {
    vibeos_supervisor::interrupts::interrupt_all()
}

/// How many executions are running.
#[pyfunction]
fn running_count() -> usize {
    vibeos_supervisor::interrupts::count()
}

/// Calls from Rust into Python (tool handlers, checks, approval callbacks, log records) now in
/// progress, and whether the host's exit has closed that door ([`quiesce_native_callers`]).
///
/// Those calls run on threads Python did not start (the supervisor's runtime, the approval
/// thread) or outlive the wait that started them (an approval timeout, an execution's). When
/// one of them takes the GIL after the interpreter began to finalize, CPython ends the thread
/// with `pthread_exit`, whose forced unwind through Rust frames aborts the whole host (SIGABRT,
/// "FATAL: exception not rethrown"). So the host's last exit hook closes the door and waits
/// (bounded) for the calls inside to return, before finalization starts.
static NATIVE_CALLERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static NATIVE_CALLS_CLOSED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Counts one native call into Python for as long as it lives.
struct NativeCall;

impl Drop for NativeCall {
    fn drop(&mut self) {
        NATIVE_CALLERS.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Runs `f` with the GIL for a call from Rust into Python, or `None` once the host is exiting
/// (nothing of Python may run then; see [`NATIVE_CALLERS`]).
fn with_python<R>(f: impl FnOnce(Python<'_>) -> R) -> Option<R> {
    use std::sync::atomic::Ordering;
    // Counted before the door is looked at, and the exit hook closes the door before it reads
    // the count (both SeqCst): a call either sees the door closed or is waited for.
    NATIVE_CALLERS.fetch_add(1, Ordering::SeqCst);
    let _counted = NativeCall;
    // SAFETY: Py_IsInitialized only reads interpreter state and may be called at any time.
    if NATIVE_CALLS_CLOSED.load(Ordering::SeqCst) || unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
        return None;
    }
    Some(Python::with_gil(f))
}

/// Closes the door of [`with_python`] and waits up to `timeout_seconds` for the calls inside to
/// return; `True` when none is left. Called by the host's last exit hook (after its non-daemon
/// threads were joined); a later call from Rust into Python gets the "host is exiting" answer
/// of its kind (a tool error, an unavailable tool, no approval).
#[pyfunction]
fn quiesce_native_callers(py: Python<'_>, timeout_seconds: f64) -> bool {
    use std::sync::atomic::Ordering;
    NATIVE_CALLS_CLOSED.store(true, Ordering::SeqCst);
    let limit = Duration::try_from_secs_f64(timeout_seconds).unwrap_or(Duration::ZERO);
    let deadline = std::time::Instant::now() + limit;
    // Without the GIL: the calls inside need it to return.
    py.allow_threads(|| loop {
        if NATIVE_CALLERS.load(Ordering::SeqCst) == 0 {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    })
}

/// What a call from Rust into Python answers once the host is exiting.
const HOST_EXITING: &str = "the Python host is exiting";

/// Calls a Python invoker made by `vibeos_exec.registry`: `(args_json, task_id)` in,
/// `(True, text, None)` or `(False, kind, message)` out.
fn call_invoker(
    invoker: &Py<PyAny>,
    args: &Map<String, Value>,
    ctx: &ToolContext,
) -> Result<String, ToolError> {
    let args_json = serde_json::to_string(args).map_err(|e| {
        ToolError::new(vibeos_tools::ToolErrorKind::InvalidArguments, e.to_string())
    })?;
    with_python(|py| {
        let call = match ctx.origin {
            CallOrigin::Script => Some(
                Py::new(
                    py,
                    ScriptCall {
                        nesting: vibeos_tools::nesting(ctx),
                        ended: vibeos_tools::ended_flag(ctx),
                    },
                )
                .map_err(|e| tool_error_of(py, &e))?,
            ),
            CallOrigin::Agent => None,
        };
        let out = invoker
            .bind(py)
            .call1((args_json, ctx.task_id.clone(), call))
            .map_err(|e| tool_error_of(py, &e))?;
        let (ok, first, second): (bool, String, Option<String>) = out.extract().map_err(|e| {
            ToolError::new(
                "TypeError",
                format!("the tool adapter returned an unexpected value: {e}"),
            )
        })?;
        if ok {
            Ok(first)
        } else {
            Err(ToolError::new(first, second.unwrap_or_default()))
        }
    })
    .unwrap_or_else(|| Err(ToolError::new("RuntimeError", HOST_EXITING)))
}

fn tool_error_of(py: Python<'_>, e: &PyErr) -> ToolError {
    let kind = e
        .get_type(py)
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "Exception".into());
    ToolError::new(kind, e.value(py).to_string())
}

fn registration_error(e: RegistrationError) -> PyErr {
    match e {
        RegistrationError::OverrideRefused { .. } => value_error(format!(
            "{e} (from Python: pass override=True to replace it)"
        )),
        RegistrationError::ShadowRefused { .. } => value_error(e.to_string()),
        other => value_error(other.to_string()),
    }
}

/// Identity of a Python check: the object, or for a bound method (`client.is_ready`, a new
/// object at every attribute access) its function and instance.
type CheckKey = (usize, usize);

/// The registry's check for each Python check still held by some tool, by [`CheckKey`].
/// Weak: the entry dies with the last tool holding the check; while it lives, its closure holds
/// the Python objects, so their addresses cannot be reused by another object.
static PY_CHECKS: Mutex<BTreeMap<CheckKey, Weak<dyn Fn() -> bool + Send + Sync>>> =
    Mutex::new(BTreeMap::new());

/// The registry check that calls the Python `check`: the same `Arc` for every tool registered
/// with the same Python callable, because the registry runs each distinct `Arc` once per
/// definitions build (SPEC §7: a shared check runs once). A check that raises counts as
/// unavailable, with its exception as the reason.
fn shared_check(py: Python<'_>, check: Py<PyAny>) -> CheckFn {
    let bound = check.bind(py);
    let is_method = py
        .import("types")
        .and_then(|types| types.getattr("MethodType"))
        .and_then(|method_type| bound.is_instance(&method_type))
        .unwrap_or(false);
    // A bound method holds its function and instance, so the check's closure (holding the
    // method) keeps both addresses taken for as long as the key is in use.
    let key = match (bound.getattr("__func__"), bound.getattr("__self__")) {
        (Ok(func), Ok(owner)) if is_method => (func.as_ptr() as usize, owner.as_ptr() as usize),
        _ => (bound.as_ptr() as usize, 0),
    };
    let mut checks = PY_CHECKS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(shared) = checks.get(&key).and_then(Weak::upgrade) {
        return shared;
    }
    checks.retain(|_, weak| weak.strong_count() > 0);
    let run: CheckFn = Arc::new(move || {
        let answer = with_python(|py| {
            check_answer(py, check.bind(py)).map_err(|e| {
                let e = tool_error_of(py, &e);
                format!("{}: {}", e.kind, e.message)
            })
        })
        .unwrap_or_else(|| Err(HOST_EXITING.to_string()));
        match answer {
            Ok(available) => available,
            // The registry runs checks under `catch_unwind` and words a panic "check raised an
            // error: <message>", as `tools list` and a refused direct call show it. Unwound
            // without the panic hook: a failing check is no crash to print. Outside the GIL.
            Err(why) => std::panic::resume_unwind(Box::new(why)),
        }
    });
    checks.insert(key, Arc::downgrade(&run));
    run
}

/// What the Python `check` answers, as a bool. An awaitable answer (an `async def` check, or a
/// callable returning a coroutine) is awaited through the bridge async handlers run on
/// (`vibeos_exec._async.run_coroutine`) first: as an object it would always be truthy, and
/// the coroutine would never run.
fn check_answer(py: Python<'_>, check: &Bound<'_, PyAny>) -> PyResult<bool> {
    let answer = check.call0()?;
    if answer.is_instance_of::<pyo3::types::PyBool>() {
        return answer.is_truthy();
    }
    let awaitable = py
        .import("inspect")?
        .getattr("isawaitable")?
        .call1((&answer,))?
        .is_truthy()?;
    if !awaitable {
        return answer.is_truthy();
    }
    py.import("vibeos_exec._async")?
        .getattr("run_coroutine")?
        .call1((answer,))?
        .is_truthy()
}

/// The `source` of registrations made by the host itself (`registry.register`'s default).
const HOST_SOURCE: &str = "python";

/// How the Python package opened tools to scripts: by a registration's `script_callable=True`,
/// or by the host's own `allow_in_scripts`. The registry keeps one set of opened names; keeping
/// the two apart here lets a re-registration without `script_callable` close what the replaced
/// registration opened (a re-registration replaces the entry, flags included), while an
/// opening the host asked for itself, which may precede the registration, stays.
struct Openings {
    by_registration: BTreeSet<String>,
    by_host: BTreeSet<String>,
}

static OPENINGS: Mutex<Openings> = Mutex::new(Openings {
    by_registration: BTreeSet::new(),
    by_host: BTreeSet::new(),
});

/// The openings, locked. Taken only with the GIL released (every caller is inside
/// `allow_threads`), so it never waits on a thread that waits for the GIL.
fn openings() -> std::sync::MutexGuard<'static, Openings> {
    OPENINGS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Puts `name` in `set` or takes it out.
fn set_member(set: &mut BTreeSet<String>, name: &str, member: bool) {
    if member {
        set.insert(name.to_string());
    } else {
        set.remove(name);
    }
}

/// What a registration replaced: the entry (`None` for a new name) and how the name was
/// opened to scripts, so `restore_tool` can undo the registration (a tool module that failed
/// after registering is skipped whole, see `vibeos_exec.discovery`). Not added to the module:
/// only `register_tool` makes one, and only `restore_tool` takes it.
#[pyclass(frozen, module = "vibeos_exec._native")]
struct PreviousTool {
    name: String,
    entry: Option<Arc<ToolEntry>>,
    by_registration: bool,
    by_host: bool,
    /// The registration opened the name in the plugin override policy (the host's
    /// `override=True` for a plugin source): undoing it closes the name again.
    widened_policy: bool,
}

#[pymethods]
impl PreviousTool {
    /// The tool's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Whether the registration replaced a tool (else the name was new).
    #[getter]
    fn replaced(&self) -> bool {
        self.entry.is_some()
    }
}

/// Registers a Python tool. `invoker` is the adapter from `vibeos_exec.registry`. Returns what
/// the name held before, for `restore_tool`.
#[pyfunction]
#[pyo3(signature = (name, toolset, parameters_json, invoker, description, emoji, requires_env, max_result_size_chars, check_fn, source, replace_builtin, parallel_safe, script_callable))]
#[allow(clippy::too_many_arguments)]
fn register_tool(
    py: Python<'_>,
    name: String,
    toolset: String,
    parameters_json: String,
    invoker: Py<PyAny>,
    description: String,
    emoji: String,
    requires_env: Vec<String>,
    max_result_size_chars: Option<usize>,
    check_fn: Option<Py<PyAny>>,
    source: String,
    replace_builtin: bool,
    parallel_safe: bool,
    script_callable: bool,
) -> PyResult<PreviousTool> {
    let schema: Value = serde_json::from_str(&parameters_json)
        .map_err(|e| value_error(format!("schema of `{name}` is not JSON: {e}")))?;
    if script_callable {
        // Before registering, so a refused opening leaves nothing half-done.
        ToolRegistry::check_script_name(&name).map_err(registration_error)?;
    }
    let invoker = Arc::new(invoker);
    let mut entry = ToolEntry::new_text(
        name.clone(),
        toolset,
        description,
        schema,
        move |args, ctx| call_invoker(&invoker, args, ctx),
    )
    .with_emoji(&emoji)
    .with_parallel_safe(parallel_safe)
    // Python handlers take the arguments as they come: a call missing a `required` one is
    // refused before the handler, as a wrong type is (built-ins parse typed arguments).
    .checking_required()
    // The host's own registrations (the default source) follow the registry's toolset rules;
    // a named plugin source is also subject to the operator's plugin override policy.
    .with_source(if source == HOST_SOURCE {
        ToolSource::Host(source)
    } else {
        ToolSource::Plugin(source)
    });
    entry.requires_env = requires_env;
    entry.max_result_size_chars = max_result_size_chars;
    if let Some(check) = check_fn {
        entry = entry.with_shared_check(&shared_check(py, check));
    }
    py.allow_threads(|| {
        let reg = registry();
        let widened_policy = replace_builtin
            && entry.source.is_external()
            && reg.get(&name).is_some_and(|old| !old.source.is_external())
            && !reg.override_policy().names.contains(&name);
        if widened_policy {
            reg.set_override_policy(reg.override_policy().allow_name(&name));
        }
        // Held across the registration, so a registration of the same name on another thread
        // cannot come between the entry and its opening.
        let mut open = openings();
        let by_registration = open.by_registration.contains(&name);
        let by_host = open.by_host.contains(&name);
        let replaced = reg
            .register_replacing(entry, replace_builtin)
            .inspect_err(|_| {
                // A refused registration leaves the policy as it found it.
                if widened_policy {
                    close_override_name(reg, &name);
                }
            })
            .map_err(registration_error)?;
        if script_callable {
            reg.allow_in_scripts(&name).map_err(registration_error)?;
            open.by_registration.insert(name.clone());
        } else if open.by_registration.remove(&name) && !open.by_host.contains(&name) {
            reg.disallow_in_scripts(&name);
        }
        Ok(PreviousTool {
            name,
            entry: replaced,
            by_registration,
            by_host,
            widened_policy,
        })
    })
}

/// Takes `name` out of the override policy's names again.
fn close_override_name(reg: &ToolRegistry, name: &str) {
    let mut policy = reg.override_policy();
    policy.names.remove(name);
    reg.set_override_policy(policy);
}

/// Undoes a registration: gives the name back what `previous` (from `register_tool`) says it
/// held — the entry as it was and its opening to scripts — or removes the tool if it held none.
#[pyfunction]
fn restore_tool(py: Python<'_>, previous: &Bound<'_, PreviousTool>) {
    let previous = previous.get();
    let name = previous.name.clone();
    let entry = previous.entry.clone();
    let (by_registration, by_host) = (previous.by_registration, previous.by_host);
    let widened_policy = previous.widened_policy;
    py.allow_threads(|| {
        let reg = registry();
        if widened_policy {
            close_override_name(reg, &name);
        }
        let mut open = openings();
        match entry {
            Some(entry) => {
                reg.reinstate(entry);
            }
            None => {
                reg.unregister(&name);
            }
        }
        set_member(&mut open.by_registration, &name, by_registration);
        set_member(&mut open.by_host, &name, by_host);
        if !(by_registration || by_host) {
            reg.disallow_in_scripts(&name);
        } else if let Err(e) = reg.allow_in_scripts(&name) {
            // It was open before, so the name passed this check then; say why it did not now.
            tracing::warn!("tool `{name}` restored but not opened to scripts again: {e}");
        }
    })
}

/// `text` with the values of this process's secret variables and well-known credential
/// formats replaced by markers, as execute_code's output is (`security.redact_output`; the
/// text unchanged when it is off). For the package's own log lines that quote a host's text
/// (a callback's exception).
#[pyfunction]
fn redact(py: Python<'_>, text: &str) -> String {
    py.allow_threads(|| {
        if !vibeos_tools::redact::enabled() {
            return text.to_string();
        }
        // `vars()` would panic on a variable that is not UTF-8.
        vibeos_tools::redact::Redactor::from_env(vibeos_tools::redact::lossy_env(
            std::env::vars_os(),
        ))
        .redact(text)
        .0
    })
}

/// Removes a tool; returns whether it was registered.
#[pyfunction]
fn unregister_tool(py: Python<'_>, name: &str) -> bool {
    py.allow_threads(|| {
        let mut open = openings();
        open.by_registration.remove(name);
        open.by_host.remove(name);
        registry().disallow_in_scripts(name);
        registry().unregister(name).is_some()
    })
}

/// Opens a registered-or-future tool to scripts.
#[pyfunction]
fn allow_in_scripts(py: Python<'_>, name: &str) -> PyResult<()> {
    py.allow_threads(|| {
        let mut open = openings();
        registry().allow_in_scripts(name)?;
        open.by_host.insert(name.to_string());
        Ok(())
    })
    .map_err(registration_error)
}

/// Closes a tool opened with `allow_in_scripts` (or a registration's `script_callable`).
#[pyfunction]
fn disallow_in_scripts(py: Python<'_>, name: &str) -> bool {
    py.allow_threads(|| {
        let mut open = openings();
        open.by_registration.remove(name);
        open.by_host.remove(name);
        registry().disallow_in_scripts(name)
    })
}

/// Names of the tools a script would get now (registered, allowed, available).
#[pyfunction]
fn script_tools(py: Python<'_>) -> Vec<String> {
    py.allow_threads(|| {
        registry()
            .script_tools()
            .iter()
            .map(|e| e.name.clone())
            .collect()
    })
}

/// Names of every registered tool.
#[pyfunction]
fn tool_names(py: Python<'_>) -> Vec<String> {
    py.allow_threads(|| {
        registry()
            .entries()
            .iter()
            .map(|e| e.name.clone())
            .collect()
    })
}

/// The toolsets of the most recent [`get_tool_definitions`]: what the model was last told it
/// has. An `execute_code` call that names no selection of its own gets the script tools of
/// this one, so the stub matches the execute_code description the model read (`None` until
/// definitions are asked for, or when they selected everything).
static LAST_SELECTION: Mutex<Option<Arc<ToolsetSelection>>> = Mutex::new(None);

/// The selection a call runs execute_code with: the caller's own (`enabled` or `disabled`
/// given), checked now; else that of the last definitions.
fn call_selection(
    enabled: Option<Vec<String>>,
    disabled: Option<Vec<String>>,
) -> PyResult<Option<Arc<ToolsetSelection>>> {
    if enabled.is_none() && disabled.is_none() {
        return Ok(LAST_SELECTION
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone());
    }
    // `enabled=[]` selects no toolset (its execute_code gets no script tool), not every one.
    let selection = ToolsetSelection {
        enabled,
        disabled: disabled.unwrap_or_default(),
    };
    registry()
        .select_toolsets(&selection)
        .map_err(|e| value_error(e.to_string()))?;
    Ok((!selection.is_everything()).then(|| Arc::new(selection)))
}

/// One direct (agent) tool call through the registry's dispatch. Returns JSON text.
#[pyfunction]
#[pyo3(signature = (name, args_json, task_id, cwd, enabled=None, disabled=None))]
fn handle_function_call(
    py: Python<'_>,
    name: &str,
    args_json: &str,
    task_id: Option<String>,
    cwd: Option<PathBuf>,
    enabled: Option<Vec<String>>,
    disabled: Option<Vec<String>>,
) -> PyResult<String> {
    let args: Value = serde_json::from_str(args_json)
        .map_err(|e| value_error(format!("args are not JSON: {e}")))?;
    let cwd = session_cwd(cwd.as_deref()).map_err(|e| value_error(e.to_string()))?;
    let toolsets = call_selection(enabled, disabled)?;
    let _untracked = task_id.is_none().then(approval::untracked_call);
    let mut ctx = ToolContext::agent(cwd);
    ctx.task_id = task_id;
    ctx.toolsets = toolsets;
    Ok(py.allow_threads(|| registry().handle_function_call(name, &args, &ctx)))
}

/// One model turn's calls through the planner (`[{"name", "args"}]` JSON). Returns a JSON
/// array of the result texts, in call order.
#[pyfunction]
#[pyo3(signature = (calls_json, task_id, cwd, enabled=None, disabled=None))]
fn handle_function_calls(
    py: Python<'_>,
    calls_json: &str,
    task_id: Option<String>,
    cwd: Option<PathBuf>,
    enabled: Option<Vec<String>>,
    disabled: Option<Vec<String>>,
) -> PyResult<String> {
    let raw: Vec<(String, Value)> = serde_json::from_str(calls_json)
        .map_err(|e| value_error(format!("calls are not a JSON list of [name, args]: {e}")))?;
    let calls: Vec<ToolCall> = raw.into_iter().map(|(n, a)| ToolCall::new(n, a)).collect();
    let cwd = session_cwd(cwd.as_deref()).map_err(|e| value_error(e.to_string()))?;
    let toolsets = call_selection(enabled, disabled)?;
    let _untracked = task_id.is_none().then(approval::untracked_call);
    let mut ctx = ToolContext::agent(cwd);
    ctx.task_id = task_id;
    ctx.toolsets = toolsets;
    let results = py.allow_threads(|| registry().handle_function_calls(&calls, &ctx));
    serde_json::to_string(&results).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// The function-calling definitions of the selected, available tools, as JSON text. The
/// selection is remembered for later execute_code calls that name none (see
/// [`LAST_SELECTION`]). `enabled` `None` selects every toolset, an empty list none.
#[pyfunction]
fn get_tool_definitions(
    py: Python<'_>,
    enabled: Option<Vec<String>>,
    disabled: Vec<String>,
) -> PyResult<String> {
    // The execute_code description states the configured mode and limits, read now, as
    // `execute_code()` and `vibeos-exec tools schema` read them.
    let config = py
        .allow_threads(|| Config::load(None))
        .map_err(|e| PyRuntimeError::new_err(format!("vibeos config: {e}")))?;
    py.allow_threads(|| log_config_warnings(&config));
    let settings = vibeos_supervisor::execute_code_tool::execute_code_settings(&config, None);
    let selection = ToolsetSelection { enabled, disabled };
    let defs = py
        .allow_threads(|| registry().get_tool_definitions_for(&selection, &settings))
        .map_err(|e| value_error(e.to_string()))?;
    *LAST_SELECTION.lock().unwrap_or_else(|p| p.into_inner()) =
        (!selection.is_everything()).then(|| Arc::new(selection));
    Ok(Value::Array(defs).to_string())
}

/// The names among `names` that are provider credentials, which can never be passed through.
#[pyfunction]
fn provider_credentials(names: Vec<String>) -> PyResult<Vec<String>> {
    let policy = EnvPolicy::builtin()
        .map_err(|e| PyRuntimeError::new_err(format!("the environment policy: {e}")))?;
    Ok(names
        .into_iter()
        .filter(|n| policy.is_provider_credential(std::ffi::OsStr::new(n)))
        .collect())
}

/// Calls a Python approval adapter from `vibeos_exec.approval` with
/// `(task_id, command, descriptions, is_script, timeout_seconds)`; its answer is text.
fn ask_python(adapter: &Py<PyAny>, req: &ApprovalRequest) -> Option<String> {
    let descriptions: Vec<String> = req.matches.iter().map(|(_, d)| d.clone()).collect();
    let timeout = approval_policy::settings().timeout.as_secs_f64();
    with_python(|py| {
        adapter
            .bind(py)
            .call1((
                req.task_id.clone(),
                req.command.clone(),
                descriptions,
                req.is_script,
                timeout,
            ))
            .and_then(|r| r.extract::<String>())
            .map_err(|e| tracing::warn!("the Python approval callback failed: {e}"))
            .ok()
    })
    .flatten()
}

/// Installs (or with `None` removes) the Python approval callback adapter.
#[pyfunction]
#[pyo3(signature = (adapter=None))]
fn set_approval_callback(py: Python<'_>, adapter: Option<Py<PyAny>>) {
    let callback = adapter.map(|a| {
        let a = Arc::new(a);
        Arc::new(move |req: &ApprovalRequest| python_answer(ask_python(&a, req)))
            as Arc<approval::ApprovalHost>
    });
    py.allow_threads(|| approval::set_approval_host(callback));
}

/// What the adapter of `vibeos_exec/approval.py` returned, as an answer: its markers for a
/// callback that raised or timed out become the [`NoAnswer`] that names the reason.
fn python_answer(answer: Option<String>) -> approval::ApprovalAnswer {
    let Some(answer) = answer else {
        return Err(NoAnswer::CallbackFailed(
            "the Python approval adapter failed (see the log)".into(),
        ));
    };
    if let Some(why) = answer.strip_prefix("!failed: ") {
        return Err(NoAnswer::CallbackFailed(why.to_string()));
    }
    if answer == "!timeout" {
        return Err(NoAnswer::TimedOut(approval_policy::settings().timeout));
    }
    if let Some(what) = answer.strip_prefix("!not-a-choice: ") {
        return Err(NoAnswer::NotAChoice(what.to_string()));
    }
    approval::parse_offered_choice(&answer)
        .ok_or_else(|| NoAnswer::NotAChoice(format!("{answer:?}")))
}

/// Installs (or with `None` removes) the Python smart-approver adapter.
#[pyfunction]
#[pyo3(signature = (adapter=None))]
fn set_smart_approver(py: Python<'_>, adapter: Option<Py<PyAny>>) {
    let approver = adapter.map(|a| {
        let a = Arc::new(a);
        Arc::new(move |req: &ApprovalRequest| match ask_python(&a, req) {
            Some(answer) => SmartVerdict::parse(&answer),
            None => SmartVerdict::Escalate,
        }) as Arc<approval_policy::SmartApprover>
    });
    py.allow_threads(|| approval_policy::set_smart_approver(approver));
}

/// The statuses a result can have, for the type stubs and tests.
/// The MCP servers of this process, once loaded (kept so they can be stopped at exit).
static EXTENSIONS: Mutex<Option<Arc<vibeos_tools::mcp_client::McpManager>>> = Mutex::new(None);

/// Starts the `mcp_servers:` of config.yaml into the registry (eager ones now, lazy ones on
/// the first definitions build). A second call does nothing: servers are loaded once per
/// process. Returns whether this call loaded them.
#[pyfunction]
fn load_mcp_servers(py: Python<'_>) -> PyResult<bool> {
    py.allow_threads(|| {
        let mut slot = EXTENSIONS.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return Ok(false);
        }
        let config = Config::load(None).map_err(|e| value_error(e.to_string()))?;
        *slot = Some(vibeos_supervisor::extensions::load_mcp_servers(
            &config,
            registry(),
        ));
        Ok(true)
    })
}

/// What [`plugin_settings`] returns.
type PluginSettings = (Option<bool>, Option<bool>, Vec<String>, bool);

/// config.yaml's `plugins:` as `load_plugins()` applies it: `(enabled, entry_points, dirs,
/// strict)` — the first two `None` when unset, `dirs` the extra plugin dirs, `strict` whether
/// `code_execution.mode` is strict (then the project's plugin dir is not loaded, as in the CLI).
#[pyfunction]
fn plugin_settings(py: Python<'_>) -> PyResult<PluginSettings> {
    py.allow_threads(|| {
        let config = Config::load(None).map_err(|e| value_error(e.to_string()))?;
        let plugins = config.file.plugins.clone().unwrap_or_default();
        Ok((
            plugins.enabled,
            plugins.entry_points,
            plugins
                .dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect(),
            config.mode == vibeos_supervisor::Mode::Strict,
        ))
    })
}

/// `(name, state, toolsets)` of every loaded MCP server; `stop=True` stops them first.
#[pyfunction]
#[pyo3(signature = (stop=false))]
fn mcp_server_status(py: Python<'_>, stop: bool) -> Vec<(String, String, Vec<String>)> {
    py.allow_threads(|| {
        let slot = EXTENSIONS.lock().unwrap_or_else(|p| p.into_inner());
        let Some(manager) = slot.as_ref() else {
            return Vec::new();
        };
        if stop {
            manager.shutdown();
        }
        manager
            .report()
            .into_iter()
            .map(|r| (r.name, r.state.to_string(), r.toolsets))
            .collect()
    })
}

#[pyfunction]
fn statuses() -> Vec<String> {
    [
        Status::Success,
        Status::Error,
        Status::Timeout,
        Status::Interrupted,
    ]
    .iter()
    .map(|s| {
        serde_json::to_value(s)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    })
    .collect()
}

/// Logs the problems of `config` that did not stop loading (an unknown `code_execution.mode`,
/// SPEC §3), as the CLI does at start. The config is re-read at every call, so a warning is
/// logged when it appears, not at every call while the file stays as it is.
fn log_config_warnings(config: &Config) {
    static LOGGED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut logged = LOGGED.lock().unwrap_or_else(|p| p.into_inner());
    if *logged == config.warnings {
        return;
    }
    for warning in config.warnings.iter().filter(|w| !logged.contains(w)) {
        tracing::warn!(target: "vibeos_supervisor::config", "{warning}");
    }
    logged.clone_from(&config.warnings);
}

/// Makes the backend config.yaml selects (`terminal.backend`, SPEC §9) the process's backend,
/// as `vibeos-exec run` does: re-read per call, so a host that changes the file gets the new
/// choice, and a bad backend setting refuses the call (naming the key) rather than quietly
/// running the script on this machine.
fn ensure_backend(config: &Config) -> PyResult<()> {
    let settings = vibeos_supervisor::backends::settings(config, None)
        .map_err(|e| value_error(format!("vibeos config: {e}")))?;
    let active = vibeos_tools::environments::active().map(|e| e.settings().backend);
    let wanted = Some(settings.backend).filter(|b| *b != BackendKind::Local);
    if active != wanted {
        vibeos_supervisor::backends::activate(settings, None);
    }
    Ok(())
}

/// Stops the environments of the active backend (containers, ssh masters) at interpreter exit.
#[pyfunction]
fn shutdown_backends(py: Python<'_>) {
    py.allow_threads(vibeos_supervisor::backends::shutdown);
}

/// Registers `execute_code` itself, so the host's tool definitions offer it to the model (with
/// the description listing the script tools) and `handle_function_call("execute_code", ...)`
/// works. Its settings are the config's at import, with the host's interpreter as the default.
/// A config that cannot be read leaves it out (every `execute_code` call reports that error).
fn register_execute_code_tool(py: Python<'_>) {
    let Ok(mut config) = Config::load(None) else {
        log_bridge::install(None);
        return;
    };
    log_bridge::install(config.log_level.as_deref());
    config.host_python = py
        .import("sys")
        .and_then(|sys| sys.getattr("executable"))
        .and_then(|exe| exe.extract::<PathBuf>())
        .ok()
        .filter(|p| !p.as_os_str().is_empty());
    py.allow_threads(|| {
        // The execute_code tool keeps this config, so its problems are said now.
        log_config_warnings(&config);
        // A host process runs many scripts: keep warm interpreters (code_execution.pool_size).
        vibeos_supervisor::pool::enable(config.pool_size);
        // Warm calls fork from one pre-initialised interpreter per key (docs/warm-pool.md).
        vibeos_supervisor::zygote::set_enabled(config.pool_size > 0);
        // The configured backend, for direct tool calls too; a bad setting is reported by
        // every execute_code call.
        if let Err(e) = ensure_backend(&config) {
            tracing::error!("{e}");
        }
        if registry().get("execute_code").is_none() {
            // Registration of a fixed, valid entry cannot fail; nothing to report if it did.
            let _ =
                vibeos_supervisor::execute_code_tool::register_execute_code(registry(), &config);
        }
    });
}

/// The extension module.
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(execute_code, m)?)?;
    m.add_class::<Cancellation>()?;
    m.add_function(wrap_pyfunction!(interrupt, m)?)?;
    m.add_function(wrap_pyfunction!(interrupt_all, m)?)?;
    m.add_function(wrap_pyfunction!(shutdown_backends, m)?)?;
    m.add_function(wrap_pyfunction!(quiesce_native_callers, m)?)?;
    m.add_function(wrap_pyfunction!(running_count, m)?)?;
    m.add_function(wrap_pyfunction!(register_tool, m)?)?;
    m.add_function(wrap_pyfunction!(unregister_tool, m)?)?;
    m.add_function(wrap_pyfunction!(restore_tool, m)?)?;
    m.add_function(wrap_pyfunction!(allow_in_scripts, m)?)?;
    m.add_function(wrap_pyfunction!(disallow_in_scripts, m)?)?;
    m.add_function(wrap_pyfunction!(script_tools, m)?)?;
    m.add_function(wrap_pyfunction!(tool_names, m)?)?;
    m.add_function(wrap_pyfunction!(handle_function_call, m)?)?;
    m.add_function(wrap_pyfunction!(handle_function_calls, m)?)?;
    m.add_function(wrap_pyfunction!(get_tool_definitions, m)?)?;
    m.add_function(wrap_pyfunction!(provider_credentials, m)?)?;
    m.add_function(wrap_pyfunction!(statuses, m)?)?;
    m.add_function(wrap_pyfunction!(set_approval_callback, m)?)?;
    m.add_function(wrap_pyfunction!(set_smart_approver, m)?)?;
    m.add_function(wrap_pyfunction!(redact, m)?)?;
    m.add_function(wrap_pyfunction!(load_mcp_servers, m)?)?;
    m.add_function(wrap_pyfunction!(plugin_settings, m)?)?;
    m.add_function(wrap_pyfunction!(mcp_server_status, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    register_execute_code_tool(m.py());
    Ok(())
}
