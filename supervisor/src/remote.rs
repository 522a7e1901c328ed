//! execute_code inside a backend (docker, podman, ssh): the remote launch (SPEC §9).
//!
//! The same shape as the local launch — stub and script staged, a socket listener, a child with
//! the scrubbed environment, limits, result — with the backend in between. The stub and the
//! script travel on the client's stdin (never argv) to a small bootstrap that
//! writes them into a private 0700 work dir over there, starts the interpreter in a new session
//! and reports its process-group id in a file, so a timeout or an interrupt kills the remote
//! group through the backend (killing the local `docker exec`/`ssh` client would leave it
//! running). The script's exit, not EOF on its output, ends the execution: the bootstrap then
//! kills every descendant left and reports the script's real wait status at the end of stderr,
//! which is where the result's exit code comes from (the client's own code cannot tell a signal
//! from an exit code). The RPC channel is a real socket: a directory bind-mounted into the container, or an
//! OpenSSH stream-local forward. Peer credentials mean nothing across a container or host
//! boundary, so such a channel is authenticated by its token alone; the socket is reachable only
//! through that 0700 directory (or the forward, which lands in the 0700 remote work dir of the
//! remote user), and the token travels only in the script's environment. See docs/backends.md.

use crate::capture::HeadTail;
use crate::confine::staging::{SCRIPT_FILE, STUB_FILE};
use crate::env_policy::{self, EnvPolicy};
use crate::error::StartError;
use crate::outcome::{ended_result, finish, Ended, Ending};
use crate::request::{ExecutionRequest, Interrupt};
use crate::result::ExecutionResult;
use crate::rpc_server::{serve_stream, serve_with, ChannelState};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vibeos_tools::environments::process::scope_sweep_argv;
use vibeos_tools::environments::{
    relay, Channel, Connections, EnvHandle, ExecSpec, GroupSignal, Spawned,
};
use vibeos_tools::{CallOrigin, ToolContext, ToolRegistry};

const BOOTSTRAP: &str = include_str!("remote_boot.py");

/// Host-specific names that describe this machine, not the backend: the bootstrap takes the
/// backend's own values (PATH, HOME) or none. `VIBEOS_HOME` and `VIBEOS_CONFIG` name this
/// host's files (its config, logs, plugins), which the backend does not have.
pub(crate) const HOST_ONLY: [&str; 11] = [
    "PATH",
    "HOME",
    "SHELL",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "PWD",
    "OLDPWD",
    "VIBEOS_HOME",
    "VIBEOS_CONFIG",
];

/// Whether a variable the scrub kept on this host is sent to a remote backend's script: not
/// the host-specific ones ([`HOST_ONLY`], `XDG_*`). (The names vibeos-exec injects are replaced
/// by [`SET_OVER_THERE`].)
pub(crate) fn sent_over_there(name: &str) -> bool {
    !HOST_ONLY.contains(&name) && !name.starts_with("XDG_")
}

/// What a remote backend's script finds set that is not the caller's: name and value, for
/// `env audit` (a test checks that [`remote_env`] and [`script_env`] set nothing else).
pub(crate) const SET_OVER_THERE: &[(&str, &str)] = &[
    ("VIBEOS_RPC_TOKEN", "the RPC channel's token"),
    (
        "VIBEOS_RPC_DIR",
        "the RPC channel's directory on the backend's side",
    ),
    (
        "VIBEOS_RPC_SOCKET",
        "the RPC socket's path on the backend's side",
    ),
    (
        "VIBEOS_EXECUTION_SCOPE",
        "the execution's scope marker, by which the host ends what the script started",
    ),
    (
        "VIBEOS_RPC_HELLO",
        "1 where the backend routes every execution's connections through one socket (the \
         stub sends its token first)",
    ),
    (
        "TZ",
        "the caller's TZ, else the zone /etc/localtime links to on this host, else UTC",
    ),
    (
        "PATH",
        "the backend login's own PATH, else /usr/local/bin:/usr/bin:/bin (never this host's)",
    ),
    (
        "HOME",
        "the backend login's own HOME, if it has one (never this host's)",
    ),
    ("PYTHONDONTWRITEBYTECODE", "1"),
    ("PYTHONIOENCODING", "utf-8"),
    ("PYTHONUTF8", "1"),
    (
        "PYTHONPATH",
        "the execution's work dir on the backend's side, then the session dir there",
    ),
];

/// Why a remote execution could not start.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The backend failed.
    #[error(transparent)]
    Backend(#[from] vibeos_tools::environments::EnvError),
    /// Strict confinement is a local mechanism.
    #[error("strict mode confines a local child and cannot be applied inside the {0} backend; use mode project there (the backend is the isolation) or the local backend")]
    StrictRemote(&'static str),
    /// Something on this side failed.
    #[error(transparent)]
    Start(#[from] StartError),
    /// The working dir does not exist (or cannot be entered) over there.
    #[error("cannot enter the working dir {cwd} on the {backend} backend ({why}); name a directory that exists there (terminal.cwd, or the run's --cwd / cwd), or unset it for the default")]
    Cwd {
        /// The backend's name.
        backend: &'static str,
        /// The directory.
        cwd: String,
        /// The system's reason.
        why: String,
    },
    /// The bootstrap refused to start the script (its reason).
    #[error("the {backend} backend could not start the script: {message}")]
    Boot {
        /// The backend's name.
        backend: &'static str,
        /// What the bootstrap said.
        message: String,
    },
}

/// The execution's working dir inside the backend: the request's own
/// ([`ExecutionRequest::backend_cwd`], the Python API's `cwd`) where the backend takes dirs by
/// name, else the environment's (`terminal.cwd`, `--cwd`, or the backend's default).
fn session_dir_over_there(
    request: &ExecutionRequest,
    env: &EnvHandle,
    cwd_is_remote: bool,
) -> Result<String, RemoteError> {
    match request.backend_cwd.as_ref().filter(|_| cwd_is_remote) {
        None => Ok(env.workdir()),
        Some(dir) if dir.starts_with('/') => Ok(dir.clone()),
        Some(dir) => Err(RemoteError::Cwd {
            backend: env.backend(),
            cwd: dir.clone(),
            why: "a working dir inside the backend must be an absolute path".into(),
        }),
    }
}

/// What [`run_remote`] needs from the caller.
pub(crate) struct RemoteRun<'a> {
    pub(crate) request: &'a ExecutionRequest,
    pub(crate) env: EnvHandle,
    /// Whether the request's session dir names a directory over there
    /// ([`vibeos_tools::environments::BackendSettings::cwd_is_remote`]).
    pub(crate) cwd_is_remote: bool,
    pub(crate) stub: String,
    pub(crate) allowed: BTreeSet<String>,
    pub(crate) registry: &'static ToolRegistry,
    pub(crate) interrupt: Interrupt,
    pub(crate) started: Instant,
}

fn new_id() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The script's environment over there: the host's scrubbed variables minus host-specific
/// ones, then the injected names of SPEC §4.
fn remote_env(
    request: &ExecutionRequest,
    work_dir: &str,
    cwd: &str,
) -> Result<Vec<(OsString, OsString)>, StartError> {
    let policy = EnvPolicy::builtin()?;
    let base: Vec<(std::ffi::OsString, std::ffi::OsString)> = match &request.base_env {
        Some(env) => env.clone(),
        None => std::env::vars_os().collect(),
    };
    // As a local run: the caller's TZ, else the host's zone, so that a script's times read the
    // same wherever it runs (the remote's own zone is not the agent's).
    let (base_tz, _) = crate::env_policy::tz_with_source(
        base.iter().find(|(k, _)| k == "TZ").map(|(_, v)| v.clone()),
    );
    let passthrough: BTreeSet<String> = request.env_passthrough.iter().cloned().collect();
    let scrubbed = policy.scrub_quiet(base, &passthrough);
    policy.log_dropped(&scrubbed);
    let injected: BTreeSet<&str> = policy.injected.iter().map(String::as_str).collect();
    // Values go as bytes, as a local child gets them: the bootstrap sets them unchanged.
    let mut env: Vec<(OsString, OsString)> = scrubbed
        .kept
        .into_iter()
        .filter(|(k, _)| {
            let name = k.to_string_lossy();
            !injected.contains(name.as_ref()) && sent_over_there(&name)
        })
        .collect();
    env.push(("TZ".into(), base_tz));
    env.push(("PYTHONDONTWRITEBYTECODE".into(), "1".into()));
    env.push(("PYTHONIOENCODING".into(), "utf-8".into()));
    env.push(("PYTHONUTF8".into(), "1".into()));
    // As locally: a dir holding `:` would be read as two other entries (the work dir is ours
    // and never holds one).
    let pythonpath = if cwd.contains(':') {
        work_dir.to_string()
    } else {
        format!("{work_dir}:{cwd}")
    };
    env.push(("PYTHONPATH".into(), pythonpath.into()));
    Ok(env)
}

/// The script's variables: [`remote_env`]'s and its RPC channel's.
fn script_env(
    mut env: Vec<(OsString, OsString)>,
    remote_socket: &str,
    token: &str,
    hello: bool,
) -> Vec<(OsString, OsString)> {
    let rpc_dir = remote_socket
        .rsplit_once('/')
        .map(|(d, _)| d.to_string())
        .unwrap_or_default();
    env.push(("VIBEOS_RPC_DIR".into(), rpc_dir.into()));
    env.push(("VIBEOS_RPC_SOCKET".into(), remote_socket.into()));
    env.push(("VIBEOS_RPC_TOKEN".into(), token.into()));
    if hello {
        env.push(("VIBEOS_RPC_HELLO".into(), "1".into()));
    }
    env
}

/// Runs the request's script inside `env` and returns its result.
pub(crate) async fn run_remote(r: RemoteRun<'_>) -> ExecutionResult {
    let backend = r.env.backend();
    let mode = r.request.mode.as_str();
    let started = r.started;
    match run(r).await {
        Ok(result) => result,
        Err(e) => {
            tracing::error!("execute_code ({backend}): {e}");
            let mut result = ExecutionResult::failed_to_start(
                mode,
                e.to_string(),
                started.elapsed().as_secs_f64(),
            );
            result.backend = Some(backend.to_string());
            result
        }
    }
}

async fn run(r: RemoteRun<'_>) -> Result<ExecutionResult, RemoteError> {
    let request = r.request;
    let backend = r.env.backend();
    if request.mode == crate::config::Mode::Strict {
        return Err(RemoteError::StrictRemote(backend));
    }
    let exec_id = new_id();
    let token = new_token();
    let env = Arc::clone(&r.env);
    let (id, tok) = (exec_id.clone(), token.clone());
    let channel = tokio::task::spawn_blocking(move || env.open_channel(&id, &tok))
        .await
        .map_err(|e| StartError::Listener(std::io::Error::other(e)))??;
    let Channel {
        connections,
        remote_socket,
        remote_dir,
        hello,
        guard,
    } = channel;

    let cwd = session_dir_over_there(r.request, &r.env, r.cwd_is_remote)?;
    let python = r.env.python();
    let env_over_there = remote_env(request, &remote_dir, &cwd)?;
    let tool_env = env_policy::lossy_pairs(&env_over_there);
    let script_env = script_env(env_over_there, &remote_socket, &token, hello);

    // The bootstrap reports the script's real wait status behind this nonce (see remote_boot.py).
    let nonce = new_id();
    // Through the relay the bootstrap's input is sent when its stdin is dropped; everywhere
    // else stdin stays open as the bootstrap's lifeline.
    let lifeline = !r.env.relayed();
    let header = boot_input(
        &nonce,
        lifeline,
        &remote_dir,
        &cwd,
        &[
            (vibeos_rpc::RUNTIME_FILE, vibeos_rpc::RUNTIME_SOURCE),
            (STUB_FILE, r.stub.as_str()),
            (SCRIPT_FILE, request.code.as_str()),
        ],
        &script_env,
    )
    .map_err(|e| StartError::Staging(std::io::Error::other(e)))?;

    let state = Arc::new(ChannelState::new(
        r.registry,
        token,
        r.allowed,
        request.max_tool_calls,
        ToolContext {
            task_id: request.task_id.clone(),
            cwd: cwd.clone().into(),
            env: Some(Arc::new(tool_env)),
            origin: CallOrigin::Script,
            // The backend is the sandbox; tools act inside it, not on this host's paths.
            paths: None,
            toolsets: None,
        },
    ));
    vibeos_tools::mark_nesting(&state.context, request.nesting);
    // Through the relay, the relay connects to the bound socket on this side.
    let relay_local = match (&connections, r.env.relayed()) {
        (Connections::Bind(path), true) => Some(path.clone()),
        _ => None,
    };
    let server = serve_connections(connections, Arc::clone(&state))?;

    let bootstrap = without_comments(BOOTSTRAP);
    let boot_python = python.clone();
    let scope = scope_marker(&exec_id);
    let boot_scope = scope.clone();
    // The bootstrap records its own process group when the backend gives it a file for it
    // (an empty argument: none), and carries the execution's scope marker for the sweep.
    let build = move |pgid_file: Option<&str>| {
        let mut argv = vec![
            boot_python.clone(),
            "-u".into(),
            "-B".into(),
            "-X".into(),
            "utf8".into(),
            "-c".into(),
            bootstrap.clone(),
        ];
        argv.push(pgid_file.unwrap_or_default().to_string());
        argv.push(boot_scope.clone());
        ExecSpec::new(argv)
    };
    let env = Arc::clone(&r.env);
    let relayed_socket = remote_socket.clone();
    let spawned = match tokio::task::spawn_blocking(move || match relay_local {
        Some(local) => relay::spawn_relayed(&*env, &build(None), local, &relayed_socket),
        None => env.spawn_leader(&build),
    })
    .await
    {
        Ok(Ok(spawned)) => spawned,
        Ok(Err(e)) => {
            server.stop();
            return Err(e.into());
        }
        Err(e) => {
            server.stop();
            return Err(StartError::Listener(std::io::Error::other(e)).into());
        }
    };
    tracing::info!(backend, cwd = %cwd, "execute_code: script started");
    let Spawned {
        stdin,
        stdout,
        stderr,
        process,
    } = spawned;
    // The header is small; a failure shows up as the bootstrap's error on stderr. The stream
    // is kept (when it is a lifeline) until the execution has ended.
    let lifeline_stdin = match stdin {
        Some(mut stdin) => tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let _ = stdin.write_all(&header).and_then(|_| stdin.flush());
            lifeline.then_some(stdin)
        })
        .await
        .ok()
        .flatten(),
        None => None,
    };
    let (stdout_limit, stderr_limit) = (request.stdout_limit, request.stderr_limit);
    let stdout_task = drain_blocking(stdout, stdout_limit);
    let stderr_task = drain_reporting(stderr, stderr_limit, nonce);

    let waiter = {
        let process = Arc::clone(&process);
        detached(move || process.wait().ok())
    };
    tokio::pin!(waiter);
    let mut exit_code = None;
    let ending = tokio::select! {
        s = &mut waiter => {
            exit_code = s.ok().flatten().flatten();
            Ending::Exited
        }
        _ = tokio::time::sleep(request.timeout) => Ending::Timeout,
        _ = r.interrupt.cancelled() => Ending::Interrupted,
    };
    // The host's own sweep of every process marked with the execution's scope, run as a
    // fresh process (not through the bootstrap, the master or the relay, which the script may
    // have killed or stopped). Through the relay too: its exec is one more process the script
    // can stop, and a TERM-ignoring script's setsid'd child outlived the relay's group kill.
    let sweeper = Sweeper {
        fresh: r.env.fresh_runner(),
        python: python.clone(),
        scope,
    };
    let mut swept_all = false;
    if ending != Ending::Exited {
        // Bounded: over ssh the kill travels through the master, whose session process the
        // script may have stopped; the timeout's grace must hold anyway.
        signal_bounded(&process, GroupSignal::Term).await;
        match tokio::time::timeout(request.kill_grace, &mut waiter).await {
            Ok(s) => exit_code = s.ok().flatten().flatten(),
            Err(_) => {
                // The group kill and, at once, the sweep below the bootstrap (which it
                // resumes, so it reaps the script and reports): a script that killed or
                // stopped its bootstrap, or left its group, is reached all the same.
                tokio::join!(
                    signal_bounded(&process, GroupSignal::Kill),
                    sweeper.sweep(true)
                );
                if let Ok(s) = tokio::time::timeout(Duration::from_secs(2), &mut waiter).await {
                    exit_code = s.ok().flatten().flatten();
                } else {
                    // Still running: the bootstrap is dead or will not report. End it all.
                    sweeper.sweep(false).await;
                    swept_all = true;
                    if let Ok(s) = tokio::time::timeout(Duration::from_secs(2), &mut waiter).await {
                        exit_code = s.ok().flatten().flatten();
                    }
                }
            }
        }
    }
    let settle = Duration::from_secs(2);
    let stdout_cap = finish(stdout_task, settle, stdout_limit).await;
    let (stderr_cap, report) = finish_reporting(stderr_task, settle, stderr_limit).await;
    drop(lifeline_stdin);
    // The bootstrap's own report is the script's real wait status; the client's exit code
    // (ssh's 255, docker's 128+N) is only the fallback when the bootstrap itself was killed.
    let mut boot_error = None;
    let reported = report.is_some();
    match report {
        Some(EndReport::Exit(code)) => exit_code = Some(code),
        Some(EndReport::Cwd(why)) => {
            boot_error = Some(RemoteError::Cwd {
                backend,
                cwd: cwd.clone(),
                why,
            })
        }
        Some(EndReport::Error(message)) => {
            boot_error = Some(RemoteError::Boot { backend, message })
        }
        None => {}
    }
    // Without the bootstrap's report the status is only the client's (docker's, ssh's), which
    // says nothing about the script: a killed script must never look like a clean exit 0.
    if !reported && ending != Ending::Exited && exit_code == Some(0) {
        exit_code = None;
    }
    // Whether the environment itself is gone (the container stopped, the ssh master lost),
    // asked only when the bootstrap did not report: that decides which end to report, and
    // whether anything is left over there to sweep.
    let env_down = if !reported && ending == Ending::Exited && !r.env.relayed() {
        let env = Arc::clone(&r.env);
        !tokio::task::spawn_blocking(move || env.still_up())
            .await
            .unwrap_or(true)
    } else {
        false
    };
    // ssh's own 255 without a report and the master gone: the connection ended (a lost
    // master, a dropped network), not the script, which the end of its session stopped.
    // Blaming the script with "exited with code 255" sent readers looking in the wrong place.
    // With the master alive, 255 is the bootstrap's death by a signal (a script that killed
    // its parent): `bootstrap_lost` below.
    let ssh_ended = !reported && backend == "ssh" && exit_code == Some(255);
    let connection_lost = ssh_ended && (env_down || ending != Ending::Exited);
    if connection_lost {
        exit_code = None;
    }
    // The shell's 127 without a report: the bootstrap never ran, because `terminal.python` is
    // not there (a script's own exit 127 comes with the bootstrap's report).
    let no_interpreter =
        !reported && !r.env.relayed() && ending == Ending::Exited && exit_code == Some(127);
    if no_interpreter {
        exit_code = None;
    }
    // docker's own 255 without a report: the client lost the engine (dockerd died or
    // restarted), which says nothing about the script.
    let engine_lost = !reported
        && matches!(backend, "docker" | "podman")
        && ending == Ending::Exited
        && exit_code == Some(255);
    // Any other end without the bootstrap's report: the bootstrap was killed (a script can
    // kill its own parent), so the client's code is the bootstrap's death, not the script's
    // status, and what the script started may still run over there.
    let bootstrap_lost = !reported
        && !r.env.relayed()
        && ending == Ending::Exited
        && !connection_lost
        && !no_interpreter
        && !engine_lost;
    if engine_lost || bootstrap_lost || ssh_ended {
        exit_code = None;
    }
    // A container stopped from outside (or with its engine): nothing of the execution runs
    // there, and the sweep and the work dir's removal would only fail ("is not running").
    let container_stopped =
        env_down && matches!(backend, "docker" | "podman") && (engine_lost || bootstrap_lost);
    if !reported && !swept_all && !no_interpreter && !container_stopped {
        sweeper.sweep(false).await;
    }
    // A bootstrap that reported has removed its work dir; one that did not may have been
    // killed before it could.
    if !reported && !container_stopped {
        remove_work_dir(&r.env, &remote_dir).await;
    }
    server.stop();
    state.close_all();
    // Its async tool calls (MCP) run here, whatever the backend: nothing waits for them now.
    vibeos_tools::cancel_scope(&state.context);
    // Terminal commands the script started run under the agent, not in the script's group.
    if state.calls_made.load(Ordering::SeqCst) > 0 {
        if let Some(agent) = r.env.agent() {
            agent.kill_scope(&state.context);
        }
    }
    // Removes the socket dir (docker) or cancels the forward (ssh). Nothing of the execution
    // depends on it any more, so the result does not wait for it.
    drop(tokio::task::spawn_blocking(move || drop(guard)));
    if let Some(e) = boot_error {
        return Err(e);
    }
    let tool_calls_made = state.calls_made.load(Ordering::SeqCst);

    let mut result = ended_result(
        Ended {
            ending,
            exit_code,
            stdout: &stdout_cap,
            stderr: &stderr_cap,
            tool_calls_made,
        },
        request,
        r.started,
        python.clone(),
    );
    result.backend = Some(backend.to_string());
    if no_interpreter {
        result.error = Some(format!(
            "the script did not start: `{python}` (terminal.python) could not be run on the \
             {backend} side (the shell's exit 127). Set terminal.python to that side's Python 3 \
             interpreter"
        ));
    }
    if engine_lost {
        result.error = Some(format!(
            "the script's exit status was lost: the connection to the {backend} engine ended \
             before the script reported ({backend} exited with 255). Check that the engine is \
             running (`{backend} info`), then run it again"
        ));
    }
    if container_stopped {
        result.error = Some(format!(
            "the script's exit status was lost: the {backend} container stopped (killed or \
             stopped from outside, or its engine restarted) before the script reported; the \
             next call starts it again"
        ));
    } else if bootstrap_lost {
        result.error = Some(format!(
            "the script's exit status was lost: the execution's bootstrap on the {backend} side \
             was killed before it reported (the script may have killed its parent); every \
             process of the execution still running there was then killed"
        ));
    }
    if connection_lost && ending == Ending::Exited {
        result.error = Some(
            "the script's exit status was lost: the connection to the ssh host ended before the \
             script reported (ssh exited with 255); the script was stopped with its session. \
             Check the host and the network, then run it again"
                .into(),
        );
    }
    Ok(result)
}

/// The scope marker of execution `exec_id`: an argv word of its bootstrap (and so of the
/// script, a fork of it) and the value of `VIBEOS_EXECUTION_SCOPE` in the script's
/// environment. Not a secret: it only names what the host's sweep ends.
fn scope_marker(exec_id: &str) -> String {
    format!("vibeos-remote-scope-{exec_id}")
}

/// Sends `signal` to the execution's group through the backend, waiting at most 3 s for the
/// request (it may travel through a helper the script stopped; the sweep is the backstop).
async fn signal_bounded(
    process: &Arc<dyn vibeos_tools::environments::Process>,
    signal: GroupSignal,
) {
    let p = Arc::clone(process);
    let sent = tokio::task::spawn_blocking(move || p.kill(signal));
    match tokio::time::timeout(Duration::from_secs(3), sent).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => tracing::warn!("execute_code: signalling the script failed: {e}"),
        Ok(Err(e)) => tracing::warn!("execute_code: signalling the script failed: {e}"),
        Err(_) => tracing::warn!("execute_code: signalling the script took over 3 s; sweeping"),
    }
}

/// Runs [`scope_sweep_argv`] for one execution through the backend's fresh runner.
struct Sweeper {
    fresh: Option<vibeos_tools::environments::FreshRun>,
    python: String,
    scope: String,
}

impl Sweeper {
    /// Kills every process of the execution over there; with `spare_leader` its bootstrap is
    /// resumed instead, to reap and report. Waits at most 40 s (a fresh ssh connection may
    /// take its connect timeout); a failure is logged: the result does not depend on it.
    async fn sweep(&self, spare_leader: bool) {
        let Some(fresh) = self.fresh.clone() else {
            return;
        };
        let argv = scope_sweep_argv(&self.python, &self.scope, spare_leader);
        let ran = tokio::task::spawn_blocking(move || fresh(&argv));
        match tokio::time::timeout(Duration::from_secs(40), ran).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!("execute_code: the end's sweep failed: {e}"),
            Ok(Err(e)) => tracing::warn!("execute_code: the end's sweep failed: {e}"),
            Err(_) => tracing::warn!("execute_code: the end's sweep took over 40 s"),
        }
    }
}

/// Removes the execution's work dir over there (the script, the stub and whatever the script
/// left in it), waiting at most 10 s; a failure is logged, not reported, since the execution's
/// result does not depend on it.
async fn remove_work_dir(env: &EnvHandle, remote_dir: &str) {
    let env = Arc::clone(env);
    let dir = remote_dir.to_string();
    let removed = tokio::task::spawn_blocking(move || {
        env.exec(
            &ExecSpec::new(["rm", "-rf", "--", dir.as_str()]),
            b"",
            Duration::from_secs(10),
        )
    })
    .await;
    let why = match removed {
        Ok(Ok(out)) if out.success() => return,
        Ok(Ok(out)) => out.stderr_text(),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    };
    tracing::warn!("execute_code: removing the work dir {remote_dir} failed: {why}");
}

/// Serves the script's connections until stopped.
enum Server {
    /// A listener the supervisor bound.
    Listener(tokio::task::JoinHandle<()>),
    /// Streams the backend routed to this execution; dropping the flag's last user ends it.
    Routed(Arc<std::sync::atomic::AtomicBool>),
}

impl Server {
    fn stop(&self) {
        match self {
            Server::Listener(task) => task.abort(),
            Server::Routed(stop) => stop.store(true, Ordering::SeqCst),
        }
    }
}

fn serve_connections(
    connections: Connections,
    state: Arc<ChannelState>,
) -> Result<Server, StartError> {
    match connections {
        Connections::Bind(path) => {
            let listener =
                std::os::unix::net::UnixListener::bind(&path).map_err(StartError::Listener)?;
            listener
                .set_nonblocking(true)
                .map_err(StartError::Listener)?;
            let listener =
                tokio::net::UnixListener::from_std(listener).map_err(StartError::Listener)?;
            // Across the boundary peer credentials describe the runtime, not the script: the
            // token alone authenticates (see the module doc).
            Ok(Server::Listener(serve_with(listener, state, false)))
        }
        Connections::Routed(incoming) => {
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let flag = Arc::clone(&stop);
            let pool = tokio::runtime::Handle::current();
            std::thread::Builder::new()
                .name("vibeos-rpc-routed".into())
                .spawn(move || loop {
                    match incoming.recv_timeout(Duration::from_millis(100)) {
                        Ok(stream) if !flag.load(Ordering::SeqCst) => {
                            serve_stream(stream, Arc::clone(&state), false, pool.clone())
                        }
                        Ok(_) => return,
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                            if flag.load(Ordering::SeqCst) {
                                return;
                            }
                        }
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                })
                .map_err(StartError::Listener)?;
            Ok(Server::Routed(stop))
        }
    }
}

/// Runs `f` on a thread of its own and resolves to its value (`None` if it panicked). Not
/// tokio's blocking pool: a backend call that never returns (a stream a stray process holds
/// open) must not keep the runtime from shutting down.
fn detached<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> tokio::task::JoinHandle<Option<T>> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    tokio::spawn(async move { rx.await.ok() })
}

/// Reads a stream of the backend to its end into a capture of `limit` bytes, on a thread of
/// its own (a backend's streams are plain `Read`ers, not necessarily pipes of this process).
fn drain_blocking(
    stream: Option<Box<dyn std::io::Read + Send>>,
    limit: usize,
) -> tokio::task::JoinHandle<HeadTail> {
    let task = detached(move || {
        let mut cap = HeadTail::new(limit);
        let Some(mut stream) = stream else {
            return cap;
        };
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => cap.push(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        cap
    });
    tokio::spawn(async move {
        task.await
            .ok()
            .flatten()
            .unwrap_or_else(|| HeadTail::new(limit))
    })
}

/// What the bootstrap reported as the last bytes of its stderr (see remote_boot.py).
#[derive(Debug, Clone, PartialEq, Eq)]
enum EndReport {
    /// The script's wait status: its exit code, or `-N` when signal N ended it.
    Exit(i32),
    /// The working dir could not be entered (the system's reason).
    Cwd(String),
    /// The bootstrap refused to start the script.
    Error(String),
}

/// The longest report the bootstrap writes; more than that held back from the capture could
/// delay nothing (it is only released at EOF) but would cost memory for nothing.
const REPORT_MAX: usize = 1024;

/// Splits the bootstrap's report off the end of `tail` (stderr's last bytes): the bytes before
/// it, and the report when `tail` ends with a well-formed one carrying `nonce`.
fn split_report<'a>(tail: &'a [u8], nonce: &str) -> (&'a [u8], Option<EndReport>) {
    let marker = format!("\0VIBEOS-END {nonce} ");
    let marker = marker.as_bytes();
    let Some(start) = tail.windows(marker.len()).rposition(|w| w == marker) else {
        return (tail, None);
    };
    let Some(body) = tail[start + marker.len()..].strip_suffix(b"\0") else {
        return (tail, None);
    };
    let body = String::from_utf8_lossy(body);
    let (kind, value) = body.split_once(' ').unwrap_or((&body, ""));
    let report = match kind {
        "exit" => match value.parse() {
            Ok(code) => EndReport::Exit(code),
            Err(_) => return (tail, None),
        },
        "cwd" => EndReport::Cwd(value.to_string()),
        "error" => EndReport::Error(value.to_string()),
        _ => return (tail, None),
    };
    (&tail[..start], Some(report))
}

/// [`drain_blocking`] for the bootstrap's stderr: the last [`REPORT_MAX`] bytes are held back
/// until EOF, and the bootstrap's report found there is returned beside the capture (and kept
/// out of it).
fn drain_reporting(
    stream: Option<Box<dyn std::io::Read + Send>>,
    limit: usize,
    nonce: String,
) -> tokio::task::JoinHandle<(HeadTail, Option<EndReport>)> {
    let task = detached(move || {
        let mut cap = HeadTail::new(limit);
        let Some(mut stream) = stream else {
            return (cap, None);
        };
        let mut held: Vec<u8> = Vec::with_capacity(2 * REPORT_MAX);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    held.extend_from_slice(&buf[..n]);
                    if held.len() > REPORT_MAX {
                        let release = held.len() - REPORT_MAX;
                        cap.push(&held[..release]);
                        held.drain(..release);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let (rest, report) = split_report(&held, &nonce);
        cap.push(rest);
        (cap, report)
    });
    tokio::spawn(async move {
        task.await
            .ok()
            .flatten()
            .unwrap_or_else(|| (HeadTail::new(limit), None))
    })
}

/// [`finish`] for [`drain_reporting`]: waits at most `bound` (an empty capture and no report
/// if the stream does not end by then).
async fn finish_reporting(
    task: tokio::task::JoinHandle<(HeadTail, Option<EndReport>)>,
    bound: Duration,
    limit: usize,
) -> (HeadTail, Option<EndReport>) {
    let abort = task.abort_handle();
    match tokio::time::timeout(bound, task).await {
        Ok(Ok(done)) => done,
        _ => {
            abort.abort();
            (HeadTail::new(limit), None)
        }
    }
}

/// Python source without its comment lines: it travels in argv, where `ps` shows it.
pub(crate) fn without_comments(source: &str) -> String {
    source
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The bootstrap's input: `<length>\0` and that many bytes of NUL-separated fields, then the
/// report's nonce as a second such block (see remote_boot.py; the lengths let stdin stay open
/// afterwards as the lifeline). No field may hold a NUL: paths, environment entries and Python
/// source cannot.
fn boot_input(
    nonce: &str,
    lifeline: bool,
    dir: &str,
    cwd: &str,
    files: &[(&str, &str)],
    env: &[(OsString, OsString)],
) -> Result<Vec<u8>, String> {
    use std::os::unix::ffi::OsStrExt;
    let mut fields: Vec<&[u8]> = vec![
        if lifeline { b"1" } else { b"0" },
        dir.as_bytes(),
        cwd.as_bytes(),
    ];
    let nfiles = files.len().to_string();
    fields.push(nfiles.as_bytes());
    for (name, text) in files {
        fields.push(name.as_bytes());
        fields.push(text.as_bytes());
    }
    let nenv = env.len().to_string();
    fields.push(nenv.as_bytes());
    for (k, v) in env {
        fields.push(k.as_bytes());
        fields.push(v.as_bytes());
    }
    if let Some(bad) = fields.iter().find(|f| f.contains(&0)) {
        return Err(format!(
            "cannot ship {:?}… to the backend: it contains a NUL byte (Python source cannot)",
            String::from_utf8_lossy(bad)
                .chars()
                .take(40)
                .collect::<String>()
        ));
    }
    let payload = fields.join(&b"\0"[..]);
    let mut input = format!("{}\0", payload.len()).into_bytes();
    input.extend(payload);
    // A block of its own after the header: the bootstrap reads it only once the script has
    // been forked, so the script's copy of the bootstrap's memory never holds it.
    input.extend(format!("{}\0{nonce}", nonce.len()).into_bytes());
    Ok(input)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_script_gets_tz_as_a_local_one_does() {
        let mut request = ExecutionRequest::from_config("", &crate::Config::default());
        let tz_of = |request: &ExecutionRequest| {
            remote_env(request, "/w", "/c")
                .unwrap()
                .into_iter()
                .find(|(k, _)| k == "TZ")
                .and_then(|(_, v)| v.into_string().ok())
        };
        request.base_env = Some(vec![("PATH".into(), "/usr/bin".into())]);
        let host = crate::env_policy::tz_with_source(None)
            .0
            .into_string()
            .unwrap();
        assert_eq!(
            tz_of(&request),
            Some(host),
            "the host's zone when the caller has none"
        );
        request.base_env = Some(vec![("TZ".into(), "Asia/Tokyo".into())]);
        assert_eq!(tz_of(&request).as_deref(), Some("Asia/Tokyo"));
    }

    #[test]
    fn env_audit_lists_everything_a_remote_script_finds_set() {
        let mut request = ExecutionRequest::from_config("", &crate::Config::default());
        request.base_env = Some(vec![
            ("PATH".into(), "/host/bin".into()),
            ("HOME".into(), "/root".into()),
            ("XDG_RUNTIME_DIR".into(), "/run/user/0".into()),
            ("LANG".into(), "C.UTF-8".into()),
        ]);
        let env = script_env(remote_env(&request, "/w", "/c").unwrap(), "/d/s", "t", true);
        for (name, _) in &env {
            let name = name.to_string_lossy();
            assert!(
                name == "LANG" || SET_OVER_THERE.iter().any(|(n, _)| *n == name),
                "{name} is set over there but env audit would not list it"
            );
        }
        for host_only in ["PATH", "HOME", "XDG_RUNTIME_DIR"] {
            assert!(!sent_over_there(host_only));
            assert!(!env.iter().any(|(k, _)| k == host_only), "{env:?}");
        }
        assert!(sent_over_there("LANG"));
    }

    #[test]
    fn a_remote_cwd_holding_a_colon_stays_off_pythonpath() {
        let request = ExecutionRequest::from_config("", &crate::Config::default());
        let pythonpath = |cwd: &str| {
            remote_env(&request, "/w", cwd)
                .unwrap()
                .into_iter()
                .find(|(k, _)| k == "PYTHONPATH")
                .map(|(_, v)| v)
                .unwrap()
        };
        assert_eq!(pythonpath("/c"), "/w:/c");
        // Read as `/tmp/a` and a relative `b`, places someone else may own.
        assert_eq!(pythonpath("/tmp/a:b"), "/w");
    }

    #[test]
    fn bootstrap_input_is_nul_separated_and_refuses_nul_bytes() {
        let env = vec![("A".into(), "1".into())];
        let input = boot_input("n", true, "/d", "/c", &[("script.py", "print(1)")], &env).unwrap();
        let payload = b"1\0/d\0/c\x001\0script.py\0print(1)\x001\0A\x001".to_vec();
        let mut framed = format!("{}\0", payload.len()).into_bytes();
        framed.extend(payload);
        framed.extend(b"1\0n");
        assert_eq!(input, framed);
        let err = boot_input("n", true, "/d", "/c", &[("script.py", "a\0b")], &env).unwrap_err();
        assert!(err.contains("NUL"), "{err}");
    }

    #[test]
    fn the_bootstrap_parses_what_the_host_sends() {
        // The real bootstrap, fed by the real encoder, on this machine's python3.
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("w");
        use std::os::unix::ffi::OsStringExt;
        // A value that is not UTF-8 arrives unchanged, as in a local child.
        let env = vec![
            ("ONLY_THIS".into(), "yes".into()),
            ("ONLY_BYTES".into(), OsString::from_vec(b"a\xffb".to_vec())),
        ];
        let code = "import os, sys\nprint(sorted(k for k in os.environ if k.startswith('ONLY')), sys.argv[0].endswith('script.py'), os.getpgid(0) == os.getpid(), os.environb[b'ONLY_BYTES'])";
        let input = boot_input(
            "n0",
            false,
            &work.display().to_string(),
            &dir.path().display().to_string(),
            &[("script.py", code)],
            &env,
        )
        .unwrap();
        let pgid_file = dir.path().join("pg");
        let mut child = bootstrap_here(&pgid_file);
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&input).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "['ONLY_BYTES', 'ONLY_THIS'] True True b'a\\xffb'"
        );
        assert!(!work.exists(), "the bootstrap removes its work dir at exit");
        assert!(!pgid_file.exists(), "and its process-group file");
    }

    #[test]
    fn without_the_wrapper_the_bootstrap_records_its_group_and_the_kill_reaches_all_of_it() {
        // What ssh's spawn_leader does, on this machine: the bootstrap exec'd by `sh` (no group
        // wrapper), killed through the group id it recorded itself.
        use std::io::{BufRead, Write};
        use vibeos_tools::environments::process::{exec_line, group_kill};
        let dir = tempfile::tempdir().unwrap();
        let pgid_file = dir.path().join("pg").display().to_string();
        let code = "import subprocess, time\nsubprocess.Popen(['sleep', '4547'])\nprint('up', flush=True)\ntime.sleep(600)";
        let input = boot_input(
            "n1",
            false,
            &dir.path().join("w").display().to_string(),
            &dir.path().display().to_string(),
            &[("script.py", code)],
            &[],
        )
        .unwrap();
        let spec = ExecSpec::new([
            "python3".to_string(),
            "-u".into(),
            "-c".into(),
            without_comments(BOOTSTRAP),
            pgid_file.clone(),
        ]);
        let mut cmd = std::process::Command::new("sh");
        // Its own group here, as sshd's session would give it.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd.arg("-c").arg(exec_line(&spec));
        let kill_file = pgid_file.clone();
        let mut spawned = vibeos_tools::environments::ClientProcess::spawn(
            "test",
            cmd,
            Some(Box::new(move |sig| {
                let out = std::process::Command::new("sh")
                    .arg("-c")
                    .arg(group_kill(&kill_file, sig))
                    .output()
                    .unwrap();
                assert!(out.status.success());
                Ok(())
            })),
        )
        .unwrap();
        let mut stdin = spawned.stdin.take().unwrap();
        stdin.write_all(&input).unwrap();
        drop(stdin);
        let mut line = String::new();
        std::io::BufReader::new(spawned.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "up\n");
        let pgid: i32 = std::fs::read_to_string(&pgid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_ne!(pgid, nix::unistd::getpgrp().as_raw());
        spawned.process.kill(GroupSignal::Kill).unwrap();
        // The kill reaches the script's group, not the bootstrap, which reports the script's
        // real status behind the nonce and exits with the shell's 128+N for it.
        assert_eq!(spawned.process.wait().unwrap(), 128 + 9);
        let mut stderr = Vec::new();
        std::io::Read::read_to_end(&mut spawned.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(
            split_report(&stderr, "n1"),
            (&b""[..], Some(EndReport::Exit(-9)))
        );
        let group = nix::unistd::Pid::from_raw(pgid);
        let deadline = Instant::now() + Duration::from_secs(5);
        while nix::sys::signal::killpg(group, None).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            nix::sys::signal::killpg(group, None).is_err(),
            "the script's child (sleep 4547) was left running"
        );
    }

    /// The real bootstrap started on this machine's python3 as the hosts start it, its pgid
    /// file at `pgid_file` and its three streams piped.
    fn bootstrap_here(pgid_file: &std::path::Path) -> std::process::Child {
        std::process::Command::new("python3")
            .args(["-u", "-B", "-X", "utf8", "-c", &without_comments(BOOTSTRAP)])
            .arg(pgid_file)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Runs the real bootstrap on this machine's python3 with `code` as the script (own group,
    /// as ssh and docker start it) and returns its stdout, stderr and exit status.
    fn boot_here(code: &str, cwd: Option<&str>, work: &std::path::Path) -> (String, Vec<u8>, i32) {
        let dir = work.parent().unwrap();
        let input = boot_input(
            "nonce",
            true,
            &work.display().to_string(),
            cwd.unwrap_or(&dir.display().to_string()),
            &[("script.py", code)],
            &[],
        )
        .unwrap();
        let mut child = bootstrap_here(&dir.join("pg"));
        use std::io::Write;
        // Kept open (the lifeline) until the bootstrap is done, as the host does.
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&input).unwrap();
        let out = child.wait_with_output().unwrap();
        drop(stdin);
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            out.stderr,
            out.status.code().unwrap_or(-1),
        )
    }

    fn gone(tag: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
                std::fs::read(e.path().join("cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(tag))
            });
            if !left {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn the_bootstrap_reports_a_signal_death_and_ends_what_escaped_the_group() {
        // The script's exit decides the end even while an escaped process (its own session,
        // re-parented when its parent exits) still holds stdout; that process is killed.
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("w");
        let code = "import os, subprocess\nif os.fork() == 0:\n    os.setsid()\n    subprocess.Popen(['sleep', '4561'])\n    os._exit(0)\nsubprocess.Popen(['setsid', 'sleep', '4562'])\nos.wait()\nprint('bye', flush=True)\nos.kill(os.getpid(), 9)";
        let started = Instant::now();
        let (stdout, stderr, status) = boot_here(code, None, &work);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(stdout, "bye\n");
        assert_eq!(
            split_report(&stderr, "nonce"),
            (&b""[..], Some(EndReport::Exit(-9)))
        );
        assert_eq!(status, 128 + 9);
        assert!(
            gone("sleep 4561") && gone("sleep 4562"),
            "an escaped process outlived the execution"
        );
        assert!(!work.exists(), "the work dir was left");
    }

    #[test]
    fn the_bootstrap_cleans_up_after_os_exit_and_names_a_missing_cwd() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("w");
        let (_, stderr, status) = boot_here("import os\nos._exit(3)", None, &work);
        assert_eq!(split_report(&stderr, "nonce").1, Some(EndReport::Exit(3)));
        assert_eq!(status, 3);
        assert!(!work.exists(), "os._exit skipped the cleanup");

        let (_, stderr, _) = boot_here("print(1)", Some("/nonexistent/dir"), &work);
        let (rest, report) = split_report(&stderr, "nonce");
        assert!(
            matches!(report, Some(EndReport::Cwd(_))),
            "{:?}",
            String::from_utf8_lossy(&stderr)
        );
        assert!(
            rest.is_empty(),
            "no traceback: {:?}",
            String::from_utf8_lossy(rest)
        );
        assert!(!work.exists());
    }

    #[test]
    fn the_report_is_only_taken_from_the_very_end_with_the_right_nonce() {
        let report = b"oops\n\0VIBEOS-END abc exit -15\0";
        assert_eq!(
            split_report(report, "abc"),
            (&b"oops\n"[..], Some(EndReport::Exit(-15)))
        );
        assert_eq!(split_report(report, "xyz").1, None);
        let forged = b"\0VIBEOS-END abc exit 0\0 and more";
        assert_eq!(split_report(forged, "abc").1, None);
    }

    #[test]
    fn the_bootstrap_kills_the_script_when_its_lifeline_closes() {
        // The host (or the ssh connection) going away closes the bootstrap's stdin.
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("w");
        let code = "import subprocess, time\nsubprocess.Popen(['sleep', '4571'])\nprint('up', flush=True)\ntime.sleep(600)";
        let input = boot_input(
            "n2",
            true,
            &work.display().to_string(),
            &dir.path().display().to_string(),
            &[("script.py", code)],
            &[],
        )
        .unwrap();
        let mut child = bootstrap_here(&dir.path().join("pg"));
        use std::io::{BufRead, Write};
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&input).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "up\n");
        let started = Instant::now();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(split_report(&out.stderr, "n2").1, Some(EndReport::Exit(-9)));
        assert!(
            gone("sleep 4571"),
            "the script's child outlived the lifeline"
        );
        assert!(!work.exists());
    }
}
