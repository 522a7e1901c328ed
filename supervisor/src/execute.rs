//! One execute_code call from start to cleanup (SPEC §2).
//!
//! staging dir + stub → RPC listener → child (scrubbed env, mode's cwd and interpreter, under
//! its reaper) → limits (timeout, output caps, call budget, interrupt) → result → cleanup. The
//! staging dir and socket are removed on every path, because they live in a `TempDir` owned by
//! this function.

use crate::capture::spawn_drain;
use crate::config::Mode;
use crate::env_policy;
use crate::error::StartError;
use crate::interpreter::Interpreter;
use crate::launch::{launch, LaunchSpec, Launched, Proc, Program, RpcEnd, Staging};
use crate::outcome::{ended_result, finish, Ended, Ending};
use crate::request::{ExecutionRequest, Interrupt};
use crate::result::ExecutionResult;
use crate::rpc_server::{serve, serve_when_written, ChannelState};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vibeos_rpc::{generate_stub, GeneratedStub, StubTool};
use vibeos_tools::{CallOrigin, ToolContext, ToolEntry, ToolRegistry};

/// Runs one script to completion and returns its result. Never panics on script input; always
/// removes its staging dir and leaves no process behind.
pub async fn execute(
    request: ExecutionRequest,
    registry: &'static ToolRegistry,
    interrupt: Interrupt,
) -> ExecutionResult {
    let started = Instant::now();
    let mode = request.mode.as_str();
    // For a start that fails: its error may quote what the caller gave (a working dir named
    // after a secret's value), and is redacted as a script's is.
    let base_env = request.base_env.clone();
    let result = run(request, registry, interrupt, started).await;
    // A prestarted interpreter this execution did not take (it was refused, went remote or
    // failed first) is not left waiting for a script.
    crate::prestart::discard();
    match result {
        Ok(result) => result,
        Err(e) => {
            let mut result = ExecutionResult::failed_to_start(
                mode,
                e.to_string(),
                started.elapsed().as_secs_f64(),
            );
            let base_env = base_env.unwrap_or_else(|| std::env::vars_os().collect());
            crate::redaction::apply(&mut result, &base_env);
            let error = result.error.as_deref().unwrap_or_default();
            tracing::error!("execute_code: {error}");
            result
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
    crate::zygote::wake_ahead();
    if let Some(refusal) = crate::script_guard::refusal(&request).await {
        return Ok(ExecutionResult::failed_to_start(
            request.mode.as_str(),
            refusal,
            started.elapsed().as_secs_f64(),
        ));
    }
    // Interrupted before it started (a host's cancelled task whose call was still queued): the
    // script never runs. Started anyway, it was killed only after its first instructions, or
    // ran in full when the interrupt came before the execution was tracked.
    if interrupt.is_interrupted() {
        let mut result = ExecutionResult::interrupted_before_start(
            request.mode.as_str(),
            "interrupted before the script started".to_string(),
        );
        result.duration_seconds = started.elapsed().as_secs_f64();
        return Ok(result);
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
            request.mode != Mode::Strict || crate::confine::tools::offered(&request.strict, e)
        })
        .collect();
    let stub = stub_for(script_tools);
    // A remote backend runs the script where its tools act (SPEC §9).
    if let Some(envs) = vibeos_tools::environments::active() {
        let task = request.task_id.clone();
        let cwd_is_remote = envs.settings().cwd_is_remote();
        let starting = tokio::task::spawn_blocking(move || envs.get(task.as_deref()));
        // Starting an environment can take its backend's whole connect timeout (an ssh host
        // that never answers): an interrupt ends the execution now, as it would a running
        // script; the start goes on for the task's later calls, or is abandoned if the host
        // is stopping (`Environments::stop_all`).
        let env = tokio::select! {
            env = starting => env.map_err(|e| StartError::Listener(std::io::Error::other(e)))?,
            () = interrupt.cancelled() => {
                let backend = envs_backend();
                let mut result = ExecutionResult::interrupted_before_start(
                    request.mode.as_str(),
                    format!("interrupted while the {backend} environment was starting"),
                );
                result.duration_seconds = started.elapsed().as_secs_f64();
                result.backend = Some(backend);
                return Ok(result);
            }
        };
        let mut result = match env {
            Ok(env) => {
                crate::remote::run_remote(crate::remote::RemoteRun {
                    request: &request,
                    env,
                    cwd_is_remote,
                    stub: stub.source.clone(),
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
    // The fork server keeps the next execution's processes forked and waiting, so a paced call
    // costs what claiming a pooled interpreter costs, and its refill is a fork, not an
    // interpreter start (docs/warm-pool.md). The single-use pool serves what a fork server
    // cannot (a pinned strict.uid, Python < 3.9); everything else starts cold.
    let forked = crate::zygote::start_async(&spec, &stub.source, &request.code).await;
    let warm = match forked {
        Some(launched) => Some(launched),
        None => match crate::pool::active() {
            Some(pool) => pool.start_warm(&spec, &stub.source, &request.code),
            None => None,
        },
    };
    let launched = match warm {
        Some(launched) => launched,
        None => match crate::prestart::take(&spec) {
            Some(prestarted) => release(prestarted, &stub.source, &request.code)?,
            None => {
                let staging = Staging::create(spec.disk_budget())?;
                staging.write_files(&stub.source, &request.code, None)?;
                launch(&spec, staging, Program::Script)?
            }
        },
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

/// The stub generated last, with the tool entries it was generated for (held, so no entry's
/// address can be reused by another while it is the key).
type LastStub = Option<(Vec<Arc<ToolEntry>>, Arc<GeneratedStub>)>;
static LAST_STUB: std::sync::Mutex<LastStub> = std::sync::Mutex::new(None);

/// The stub for `tools`: the last one generated when the entries are the same ones (a registry
/// entry never changes; re-registering makes a new one), else a new one. A long-lived host's
/// executions almost always offer the same tools, and generating the stub (every tool's schema
/// rendered to Python) cost a warm call a tenth of a millisecond.
fn stub_for(tools: Vec<Arc<ToolEntry>>) -> Arc<GeneratedStub> {
    let mut last = LAST_STUB.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((entries, stub)) = last.as_ref() {
        let same = entries.len() == tools.len()
            && entries.iter().zip(&tools).all(|(a, b)| Arc::ptr_eq(a, b));
        if same {
            return Arc::clone(stub);
        }
    }
    let stub_tools: Vec<StubTool> = tools
        .iter()
        .map(|e| StubTool {
            name: e.name.clone(),
            description: e.description.clone(),
            parameters: e.script_schema(),
        })
        .collect();
    let stub = Arc::new(generate_stub(&stub_tools));
    // Said once per tool set rather than once per execution.
    for skipped in &stub.skipped {
        tracing::warn!("execute_code: {skipped}");
    }
    *last = Some((tools, Arc::clone(&stub)));
    stub
}

/// Writes the stub into a prestarted interpreter's staging dir and releases its script
/// ([`crate::prestart`]); the interpreter is discarded if either fails.
fn release(mut launched: Launched, stub: &str, code: &str) -> Result<Launched, StartError> {
    let released =
        launched
            .staging
            .write_stub(stub, None)
            .and_then(|()| match launched.feeding.as_mut() {
                Some(feed) => feed.release(code).map_err(StartError::Staging),
                None => Err(StartError::Staging(std::io::Error::other(
                    "the prestarted interpreter has no script FIFO",
                ))),
            });
    match released {
        Ok(()) => Ok(launched),
        Err(e) => {
            launched.discard(true);
            Err(e)
        }
    }
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
        feeding,
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
            env: Some(Arc::new(env_policy::lossy_pairs(&s.tool_env))),
            origin: CallOrigin::Script,
            paths: s.paths.clone(),
            // A script's calls never reach execute_code (SPEC §2).
            toolsets: None,
        },
    ));
    vibeos_tools::mark_nesting(&state.context, request.nesting);
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
        // Nothing to accept in strict mode: a connection thread serves the one channel once
        // the script first writes to it.
        RpcEnd::Stream(ours) => Some(serve_when_written(ours, Arc::clone(&state), false)),
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
    // Every reaper reports the script's status on a pipe, read on the runtime's poller. The
    // pidfd (or the reported flag) keeps our signals from reaching another process: a spawned
    // reaper stays unreaped, so its pid is not reused, until it has reported.
    let reaped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reaped_flag = Arc::clone(&reaped);
    let mut waiter = match child {
        Proc::Forked(mut forked) => tokio::spawn(async move {
            let status = forked.report.wait_async().await.ok();
            reaped_flag.store(true, Ordering::SeqCst);
            status
        }),
        Proc::Spawned(spawned) => {
            let reap_by = pidfd.as_ref().and_then(|fd| fd.try_clone().ok());
            tokio::spawn(async move {
                let status = spawned.wait_reported(reap_by).await.ok();
                reaped_flag.store(true, Ordering::SeqCst);
                status
            })
        }
    };
    let send = |sig: rustix::process::Signal| {
        if pidfd.is_some() || !reaped.load(Ordering::SeqCst) {
            signal(pidfd.as_ref(), reaper_pid, sig);
        }
    };

    let mut status = None;
    let ending = tokio::select! {
        s = &mut waiter => { status = s.ok().flatten(); Ending::Exited }
        _ = tokio::time::sleep(request.timeout) => Ending::Timeout,
        _ = s.interrupt.cancelled() => Ending::Interrupted,
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
    // Its tool calls first: nothing waits for them now. Async ones (MCP) end at once (a
    // blocking thread waiting on one would hold a one-shot host open to the call's own
    // timeout), queued ones do not start, a long search stops, and no command starts any more
    // (one waiting for an approval, say).
    vibeos_tools::cancel_scope(&state.context);
    // Then the terminal commands the script started: the supervisor's children, out of the
    // reaper's reach. After the mark above, so none can start unseen.
    vibeos_tools::environments::local::kill_scope(&state.context);
    // Every process of the execution is gone, so the pipes reach EOF; the bound guards
    // against one that escaped our reach (say, a setuid program we may not signal).
    let settle = Duration::from_secs(2);
    let stdout_cap = finish(stdout_task, settle, stdout_limit).await;
    let stderr_cap = finish(stderr_task, settle, stderr_limit).await;
    // Every process of the execution is gone: a release still waiting cannot be taken now.
    let feed_failure = feeding.and_then(|f| f.finish().err());
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
    // A long-lived host removes the dir after the result is back (staging_retire).
    let long_lived = crate::zygote::enabled() || crate::pool::active().is_some();
    crate::staging_retire::retire(staging, long_lived);
    drop(on_done);
    let mut result = ended_result(
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
    );
    if let Some(failure) = feed_failure {
        // The interpreter ran nothing of the script (it read an empty one): say so.
        result.status = crate::result::Status::Error;
        result.error = Some(failure.to_string());
    }
    result
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
