//! The tool agent: the same built-in tools, run on the backend's side.
//!
//! With a remote backend, `read_file`, `write_file`, `search_files`, `patch` and `terminal` must
//! act on the backend's filesystem and processes. Rather than re-implementing each tool as a
//! chain of remote shell commands (one round trip per file operation, different semantics,
//! different bugs), the host starts `vibeos-exec backend-agent` there once per environment —
//! the binary is bind-mounted read-only into containers and uploaded once to ssh hosts — and
//! keeps one `exec -i` stream to it. Each forwarded call is one JSON line each way, answered by
//! the identical handler code. Hooks, budgets and approval stay on the host, in front of the
//! forward; the agent only executes.
//!
//! Wire format, one JSON object per line: request `{"id", "tool", "args", "task_id", "cwd",
//! "env", "origin"}`, reply `{"id", "ok": value}` or `{"id", "err": {"kind", "message"}}`.
//! Requests are answered concurrently (a thread each), replies written whole under a lock.

use super::{EnvError, GroupSignal, Process, Spawned};
use crate::{CallOrigin, Handler, ToolContext, ToolError, ToolRegistry};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Tools the agent runs: the tools that touch files and processes. `process` manages the
/// background commands `terminal(background=true)` started there.
pub const REMOTE_TOOLS: [&str; 6] = [
    "read_file",
    "write_file",
    "search_files",
    "patch",
    "terminal",
    "process",
];

/// How long a forwarded file tool may take.
pub const FILE_TOOL_TIMEOUT: Duration = Duration::from_secs(120);

type Pending = Arc<Mutex<HashMap<u64, mpsc::Sender<Value>>>>;

struct Conn {
    process: Arc<dyn Process>,
    /// Kept open in socket mode: the agent exits when it closes (its lifeline).
    _lifeline: Option<Box<dyn Write + Send>>,
    writer: Box<dyn Write + Send>,
    pending: Pending,
    next_id: u64,
    /// Socket mode: where to connect and the token, for per-caller connections that are
    /// answered on the calling thread (no reader-thread hop per call).
    direct: Option<(std::path::PathBuf, String)>,
    /// Connections free for the next caller.
    idle: Vec<DirectConn>,
    /// Which start of the agent this is: a caller whose connection broke forgets the agent
    /// only if it is still the one it used (another caller may have started a new one).
    epoch: u64,
}

/// One authenticated connection used by one caller at a time.
struct DirectConn {
    reader: BufReader<std::os::unix::net::UnixStream>,
    writer: std::os::unix::net::UnixStream,
}

/// How the host reaches an agent's socket: the host-side path, and what must happen first
/// (an ssh `-L` forward) once the agent listens.
pub struct AgentSocket {
    /// The socket as seen from the host (a bind mount or a forward's local end).
    pub local: std::path::PathBuf,
    /// Run after the agent is ready and before connecting.
    pub prepare: Option<Box<dyn Fn() -> Result<(), EnvError> + Send + Sync>>,
}

/// How to start an agent.
pub struct AgentLaunch {
    /// `vibeos-exec backend-agent [--listen PATH]` started there (any backend's
    /// [`super::Environment::spawn`]-like handle: its stdin is the agent's lifeline, or in
    /// stdio mode its request stream). Killing it must end the agent.
    pub process: Spawned,
    /// With a socket, calls go over it (one kernel socket hop for a bind mount, one ssh
    /// traversal for a forward) instead of the exec client's stdio, which docker relays through
    /// its daemon and shim and ssh through the mux client.
    pub socket: Option<AgentSocket>,
}

/// The host's end of a tool agent: started on first call, restarted if it died.
pub struct AgentClient {
    backend: &'static str,
    launch: Box<dyn Fn() -> Result<AgentLaunch, EnvError> + Send + Sync>,
    /// Shared with the cancel hooks of forwarded calls ([`AgentClient::call`]).
    conn: Arc<Mutex<Option<Conn>>>,
    /// Starts so far (the next [`Conn::epoch`]).
    starts: std::sync::atomic::AtomicU64,
}

impl AgentClient {
    /// A client that starts the agent with the command `launch` builds.
    pub fn new(
        backend: &'static str,
        launch: impl Fn() -> Result<AgentLaunch, EnvError> + Send + Sync + 'static,
    ) -> Self {
        AgentClient {
            backend,
            launch: Box::new(launch),
            conn: Arc::new(Mutex::new(None)),
            starts: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn start(&self) -> Result<Conn, EnvError> {
        let AgentLaunch {
            process: spawned,
            socket,
        } = (self.launch)()?;
        let Spawned {
            stdin,
            stdout,
            stderr,
            process,
        } = spawned;
        let fail = |process: &Arc<dyn Process>, e: EnvError| {
            let _ = process.kill(GroupSignal::Kill);
            e
        };
        let (Some(mut stdin), Some(stdout)) = (stdin, stdout) else {
            return Err(fail(&process, self.err("its pipes could not be set up")));
        };
        // Its diagnostics go where the host's own go.
        if let Some(mut err) = stderr {
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut err, &mut std::io::stderr());
            });
        }
        type Ends = (
            Box<dyn std::io::Read + Send>,
            Box<dyn Write + Send>,
            Option<Box<dyn Write + Send>>,
            Option<(std::path::PathBuf, String)>,
        );
        let (reader, writer, lifeline, direct): Ends = match socket {
            None => (stdout, stdin, None, None),
            Some(sock) => {
                let token = new_token();
                let mut line = token.clone();
                line.push('\n');
                if let Err(e) = stdin.write_all(line.as_bytes()).and_then(|_| stdin.flush()) {
                    return Err(fail(
                        &process,
                        self.err(&format!("cannot send its token: {e}")),
                    ));
                }
                // It prints one line when it listens (or exits with the reason on stderr).
                let mut ready = String::new();
                let mut out = BufReader::new(stdout);
                if out.read_line(&mut ready).unwrap_or(0) == 0 || ready.trim() != "ready" {
                    return Err(fail(
                            &process,
                            self.err("it exited before listening (is the vibeos-exec binary runnable there? see its stderr)"),
                        ));
                }
                if let Some(prepare) = &sock.prepare {
                    prepare().map_err(|e| fail(&process, e))?;
                }
                let stream = super::shared_dir::connect_socket(&sock.local).map_err(|e| {
                    fail(
                        &process,
                        self.err(&format!("cannot connect to {}: {e}", sock.local.display())),
                    )
                })?;
                let mut w = stream
                    .try_clone()
                    .map_err(|e| fail(&process, self.err(&e.to_string())))?;
                if let Err(e) = w.write_all(line.as_bytes()) {
                    return Err(fail(
                        &process,
                        self.err(&format!("cannot authenticate: {e}")),
                    ));
                }
                // The stdout pipe stays with the reader below until EOF (agent gone).
                std::thread::spawn(move || {
                    let mut sink = Vec::new();
                    let _ = std::io::Read::read_to_end(&mut out, &mut sink);
                });
                (
                    Box::new(stream),
                    Box::new(w),
                    Some(stdin),
                    Some((sock.local.clone(), token)),
                )
            }
        };
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let reader_pending = Arc::clone(&pending);
        std::thread::Builder::new()
            .name("vibeos-agent-reader".into())
            .spawn(move || read_replies(reader, reader_pending))
            .map_err(|e| self.err(&format!("cannot start its reader thread: {e}")))?;
        Ok(Conn {
            process,
            _lifeline: lifeline,
            writer,
            pending,
            next_id: 1,
            direct,
            idle: Vec::new(),
            epoch: self
                .starts
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst),
        })
    }

    fn err(&self, message: &str) -> EnvError {
        EnvError::Agent {
            backend: self.backend,
            message: message.to_string(),
        }
    }

    /// Runs `tool` with `args` on the backend's side, in the call's context.
    pub fn call(
        &self,
        tool: &str,
        args: &Map<String, Value>,
        ctx: &ToolContext,
        timeout: Duration,
    ) -> Result<Value, ToolError> {
        let backend_err =
            |e: EnvError| ToolError::new(crate::ToolErrorKind::BackendError, e.to_string());
        let (rx, id, pending, _cancel_hook) = {
            let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
            let dead = match guard.as_mut() {
                Some(c) => !matches!(c.process.try_wait(), Ok(None)),
                None => true,
            };
            if dead {
                if let Some(old) = guard.take() {
                    old.end();
                }
                *guard = Some(self.start().map_err(backend_err)?);
            }
            let Some(conn) = guard.as_mut() else {
                return Err(backend_err(self.err("not running")));
            };
            // A host call its client can cancel (an MCP request): the cancel reaches the command
            // over there, as it kills a local one (`local::cancel_call`).
            let call = super::local::current_call();
            let _cancel_hook = match call {
                Some(call) => {
                    let (conn_ref, epoch) = (Arc::clone(&self.conn), conn.epoch);
                    super::local::on_cancel_of_current_call(Box::new(move || {
                        send_control(&conn_ref, Some(epoch), json!({"cancel_call": call}));
                    }))
                    .map_err(|e| {
                        ToolError::new(crate::ToolErrorKind::BackendError, e.to_string())
                    })?
                }
                None => None,
            };
            let id = conn.next_id;
            conn.next_id += 1;
            let (tx, rx) = mpsc::channel();
            if let Ok(mut p) = conn.pending.lock() {
                p.insert(id, tx);
            }
            let request = json!({
                "call": call,
                "id": id,
                "tool": tool,
                "args": args,
                "task_id": ctx.task_id,
                "cwd": ctx.cwd.to_string_lossy(),
                "env": ctx.env.as_ref().map(|e| e.as_ref().clone()),
                "origin": match ctx.origin { CallOrigin::Agent => "agent", CallOrigin::Script => "script" },
                "scope": super::local::scope_of(ctx),
            });
            let mut line = request.to_string();
            line.push('\n');
            if let Some((path, token)) = conn.direct.clone() {
                let (idle, epoch) = (conn.idle.pop(), conn.epoch);
                drop(guard);
                return self.call_direct(idle, epoch, &path, &token, &line, tool, timeout);
            }
            if let Err(e) = conn
                .writer
                .write_all(line.as_bytes())
                .and_then(|_| conn.writer.flush())
            {
                let _ = conn.process.kill(GroupSignal::Kill);
                return Err(backend_err(self.err(&format!("the connection broke: {e}"))));
            }
            (rx, id, Arc::clone(&conn.pending), _cancel_hook)
        };
        let reply = rx.recv_timeout(timeout);
        if let Ok(mut p) = pending.lock() {
            p.remove(&id);
        }
        match reply {
            Ok(v) => decode_reply(v),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(ToolError::new(
                crate::ToolErrorKind::BackendError,
                format!("{} backend: `{tool}` got no answer within {}s", self.backend, timeout.as_secs()),
            )),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(ToolError::new(
                crate::ToolErrorKind::BackendError,
                format!(
                    "{} backend: the tool agent exited during `{tool}`; the environment may have been stopped",
                    self.backend
                ),
            )),
        }
    }

    /// One request on a connection of the caller's own, answered on this thread.
    #[allow(clippy::too_many_arguments)]
    fn call_direct(
        &self,
        idle: Option<DirectConn>,
        epoch: u64,
        path: &std::path::Path,
        token: &str,
        line: &str,
        tool: &str,
        timeout: Duration,
    ) -> Result<Value, ToolError> {
        // The agent (or what carries its socket: an ssh master, a container) is gone: it is
        // forgotten, so the next call starts it again (and the environment with it) instead
        // of every later call failing here for good.
        let broke = |e: std::io::Error| {
            self.forget(epoch);
            ToolError::new(
                crate::ToolErrorKind::BackendError,
                format!(
                    "{} backend: the tool agent was lost during `{tool}` ({e}): it, or the \
                     environment it runs in, was stopped or killed; the next call starts it again",
                    self.backend
                ),
            )
        };
        let mut conn = match idle {
            Some(c) => c,
            None => {
                let stream = super::shared_dir::connect_socket(path).map_err(broke)?;
                let mut writer = stream.try_clone().map_err(broke)?;
                writer
                    .write_all(format!("{token}\n").as_bytes())
                    .map_err(broke)?;
                DirectConn {
                    reader: BufReader::new(stream),
                    writer,
                }
            }
        };
        conn.writer.write_all(line.as_bytes()).map_err(broke)?;
        let _ = conn.writer.set_read_timeout(Some(timeout));
        let mut reply = String::new();
        match conn.reader.read_line(&mut reply) {
            Ok(0) => {
                return Err(broke(std::io::Error::from(
                    std::io::ErrorKind::UnexpectedEof,
                )))
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(ToolError::new(
                    crate::ToolErrorKind::BackendError,
                    format!(
                        "{} backend: `{tool}` got no answer within {}s",
                        self.backend,
                        timeout.as_secs()
                    ),
                ))
            }
            Err(e) => return Err(broke(e)),
        }
        let v: Value = serde_json::from_str(&reply).map_err(|e| {
            ToolError::new(
                crate::ToolErrorKind::BackendError,
                format!(
                    "{} backend: the tool agent sent a reply that is not JSON: {e}",
                    self.backend
                ),
            )
        })?;
        if let Ok(mut guard) = self.conn.lock() {
            if let Some(c) = guard.as_mut().filter(|c| c.epoch == epoch) {
                c.idle.push(conn);
            }
        }
        decode_reply(v)
    }

    /// Ends the agent of start `epoch` if it is still the current one (its process may look
    /// alive: an ssh client whose remote agent was killed keeps its session while a child of
    /// the agent holds its output). Its end is waited for on a thread of its own.
    fn forget(&self, epoch: u64) {
        let old = {
            let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
            match guard.as_ref() {
                Some(c) if c.epoch == epoch => guard.take(),
                _ => None,
            }
        };
        if let Some(old) = old {
            tracing::warn!(
                "backends: the {} tool agent was lost; it is started again on the next call",
                self.backend
            );
            std::thread::spawn(move || old.end());
        }
    }

    /// Kills (process group, SIGKILL) every command still running there for the execution
    /// whose tool context is `ctx`: they run under the agent, out of reach of the script's
    /// process group, and must not outlive the execution.
    pub fn kill_scope(&self, ctx: &ToolContext) {
        let Some(scope) = super::local::scope_of(ctx) else {
            return;
        };
        // Whichever agent runs now: commands of the scope can only be under the current one
        // (a lost agent's were killed with it).
        send_control(&self.conn, None, json!({"kill_scope": scope}));
    }

    /// Stops the agent process (the environment is going away).
    pub fn stop(&self) {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = guard.take() {
            c.end();
        }
    }
}

/// Sends a control request (`kill_scope`, `cancel_call`: answered, the answer unread) on the
/// agent's main stream: to the agent of start `epoch` if it still runs, or to whichever agent
/// runs when `epoch` is `None`.
fn send_control(conn: &Mutex<Option<Conn>>, epoch: Option<u64>, body: Value) {
    let mut guard = conn.lock().unwrap_or_else(|p| p.into_inner());
    let Some(conn) = guard
        .as_mut()
        .filter(|c| epoch.is_none_or(|epoch| c.epoch == epoch))
    else {
        return;
    };
    let mut request = body;
    request["id"] = json!(conn.next_id);
    conn.next_id += 1;
    let line = format!("{request}\n");
    let _ = conn
        .writer
        .write_all(line.as_bytes())
        .and_then(|_| conn.writer.flush());
}

/// How long ending the agent waits for its process to be reaped after the kill.
const AGENT_END_WAIT: Duration = Duration::from_secs(5);

impl Conn {
    /// Ends the agent: its lifeline closes and its process is killed and reaped — waited for
    /// at most [`AGENT_END_WAIT`]. The wait is bounded because a script can keep the agent's
    /// command from ever ending over there (it stopped the agent's parent shell, so the killed
    /// agent stays a zombie and a cloud session's command never completes): unbounded, the
    /// host's exit hung for ever after the result, and the sandbox was never deleted.
    fn end(self) {
        let Conn {
            process, _lifeline, ..
        } = self;
        drop(_lifeline);
        let _ = process.kill(GroupSignal::Kill);
        let deadline = std::time::Instant::now() + AGENT_END_WAIT;
        while matches!(process.try_wait(), Ok(None)) {
            if std::time::Instant::now() >= deadline {
                tracing::warn!(
                    "backends: the tool agent did not end within {}s of its kill; going on without it",
                    AGENT_END_WAIT.as_secs()
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for AgentClient {
    fn drop(&mut self) {
        self.stop();
    }
}

fn read_replies(stream: Box<dyn std::io::Read + Send>, pending: Pending) {
    let reader = BufReader::new(stream);
    for line in reader.lines() {
        let Ok(line) = line else { break };
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            tracing::warn!("backends: the tool agent sent a line that is not JSON");
            continue;
        };
        let Some(id) = v.get("id").and_then(Value::as_u64) else {
            continue;
        };
        let tx = pending.lock().ok().and_then(|mut p| p.remove(&id));
        if let Some(tx) = tx {
            let _ = tx.send(v);
        }
    }
    // Dropping the senders wakes every waiting caller with "disconnected".
    if let Ok(mut p) = pending.lock() {
        p.clear();
    }
}

fn decode_reply(v: Value) -> Result<Value, ToolError> {
    if let Some(ok) = v.get("ok") {
        return Ok(ok.clone());
    }
    let err = v.get("err");
    let field = |k: &str| {
        err.and_then(|e| e.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    if err.is_some() {
        Err(ToolError::new(field("kind"), field("message")))
    } else {
        Err(ToolError::new(
            crate::ToolErrorKind::BackendError,
            "the tool agent sent a reply with neither a result nor an error",
        ))
    }
}

/// The agent's side: answers requests from `input` on `output` until `input` ends. Commands
/// were approved on the host before they were forwarded: the agent process installs
/// [`approve_all`] so approval there always agrees.
///
/// With `listen`, the first line of `input` is a token; the agent listens on that path (a
/// private directory), says `ready` on `output`, and serves every connection that starts with
/// the token. `input` then only keeps it alive: the agent exits when it closes.
pub fn serve(
    registry: &'static ToolRegistry,
    mut input: impl BufRead,
    mut output: impl Write + Send + 'static,
    listen: Option<&std::path::Path>,
) -> Result<(), String> {
    let Some(path) = listen else {
        serve_stream(registry, input, output);
        end_environment();
        return Ok(());
    };
    let mut token = String::new();
    input
        .read_line(&mut token)
        .map_err(|e| format!("cannot read the token: {e}"))?;
    let token = token.trim().to_string();
    if token.len() < 32 {
        return Err("no token on stdin".into());
    }
    let _ = std::fs::remove_file(path);
    let listener = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot protect {}: {e}", path.display()))?;
    let bound = std::fs::symlink_metadata(path)
        .map(|m| (m.dev(), m.ino()))
        .map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
    output
        .write_all(b"ready\n")
        .and_then(|_| output.flush())
        .map_err(|e| format!("cannot report readiness: {e}"))?;
    let accepting = std::thread::Builder::new().name("vibeos-agent-accept".into());
    let accepted = accepting.spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let token = token.clone();
            // Not `thread::spawn`, whose panic when the backend is out of processes (a script
            // that filled the container's pids limit) ended this accepting thread, so every
            // later call was refused for good: the connection is closed instead (its caller
            // hears the agent was lost, and the next call tries again).
            let spawned = std::thread::Builder::new()
                .name("vibeos-agent-conn".into())
                .spawn(move || {
                    let Ok(writer) = conn.try_clone() else { return };
                    let mut reader = BufReader::new(conn);
                    let mut first = String::new();
                    if reader.read_line(&mut first).is_err()
                        || !token_matches(first.trim().as_bytes(), token.as_bytes())
                    {
                        return;
                    }
                    serve_stream(registry, reader, writer);
                });
            if let Err(e) = spawned {
                tracing::error!(
                    "backend-agent: cannot start a thread for a connection ({e}): out of \
                     processes or memory over here? (terminal.container_pids, container_memory)"
                );
            }
        }
    });
    if let Err(e) = accepted {
        let _ = std::fs::remove_file(path);
        return Err(format!(
            "cannot start the thread that accepts connections: {e}"
        ));
    }
    // Lifeline: the host closing our stdin (or dying) ends the agent.
    let mut sink = String::new();
    while input.read_line(&mut sink).unwrap_or(0) > 0 {
        sink.clear();
    }
    // Only the socket this agent bound: when its lifeline went with an ssh master, the next
    // agent may already listen on the same path (the host reconnects at once), and removing
    // that one left the new forward pointing at nothing.
    if std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == bound) {
        let _ = std::fs::remove_file(path);
    }
    end_environment();
    Ok(())
}

/// Ends what the commands run here left: the environment is going away, and with ssh nothing
/// else would end it. Every background command's group first (SIGTERM, then SIGKILL), then,
/// in an agent process ([`contain_commands`]), every process any command of this agent
/// started: a foreground command's `cmd &` or `nohup cmd &` stayed in no registry.
fn end_environment() {
    super::background::end_all();
    if super::local::marks_every_command() {
        super::local::kill_all_marked();
    }
}

/// Makes this process's approval agree with every command: for the agent process only, whose
/// commands the host approved before forwarding them.
pub fn approve_all() {
    crate::approval::set_smart_approval(Some(Arc::new(|_| true)));
}

/// Binds what every command of this process starts to the agent's life: [`serve`]'s end (or,
/// if the agent is killed, the keeper) kills every process that carries any marker of this
/// process, the executions' as well as its own. For the agent process only: in a host, an
/// execution's commands end with the execution, and direct calls' with the host
/// ([`super::local::mark_every_command`]).
pub fn contain_commands() {
    super::local::mark_every_command();
}

/// Whether two tokens are equal, in time that does not depend on where they differ.
pub(crate) fn token_matches(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b.iter())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn new_token() -> String {
    super::random_hex(32)
}

/// Answers the requests of one stream; bounded file tools inline, the rest on a thread each
/// so a long command does not hold up other calls.
fn serve_stream(
    registry: &'static ToolRegistry,
    input: impl BufRead,
    output: impl Write + Send + 'static,
) {
    let output = Arc::new(Mutex::new(output));
    for line in input.lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let output = Arc::clone(&output);
        let request: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => json!({"id": null, "bad": e.to_string()}),
        };
        let inline = matches!(
            request.get("tool").and_then(Value::as_str),
            Some("read_file" | "write_file" | "patch")
        );
        let reply = move || {
            let reply = answer(registry, request);
            let mut text = reply.to_string();
            text.push('\n');
            let mut out = output.lock().unwrap_or_else(|p| p.into_inner());
            let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
        };
        if inline {
            reply();
            continue;
        }
        let spawned = std::thread::Builder::new()
            .name("vibeos-agent-call".into())
            .spawn(reply);
        if let Err(e) = spawned {
            tracing::error!("backend-agent: cannot start a thread for a call: {e}");
        }
    }
}

/// Environments of the executions the agent serves, by the host's scope id: every call of one
/// execution shares one `Arc`, so [`super::local::kill_scope`] finds its commands.
static SCOPES: std::sync::LazyLock<Mutex<HashMap<u64, ScopeEnv>>> =
    std::sync::LazyLock::new(|| Mutex::new(HashMap::new()));

/// The environment shared by the calls of one execution.
type ScopeEnv = Arc<Vec<(String, String)>>;

fn answer(registry: &'static ToolRegistry, req: Value) -> Value {
    if let Some(scope) = req.get("kill_scope").and_then(Value::as_u64) {
        let env = SCOPES.lock().ok().and_then(|mut m| m.remove(&scope));
        let killed = env.map_or(0, |env| {
            super::local::kill_scope(&ToolContext {
                task_id: None,
                cwd: std::path::PathBuf::from("/"),
                env: Some(env),
                origin: CallOrigin::Script,
                paths: None,
                toolsets: None,
            })
        });
        return json!({"id": req.get("id"), "ok": {"killed": killed}});
    }
    if let Some(call) = req.get("cancel_call").and_then(Value::as_u64) {
        super::local::cancel_call(call);
        return json!({"id": req.get("id"), "ok": {"cancelled": call}});
    }
    if let Some(bad) = req.get("bad").and_then(Value::as_str) {
        return json!({"id": null, "err": {"kind": "ProtocolError", "message": format!("not JSON: {bad}")}});
    }
    let id = req.get("id").cloned().unwrap_or(Value::Null);
    let fail =
        |kind: &str, message: String| json!({"id": id, "err": {"kind": kind, "message": message}});
    let tool = req.get("tool").and_then(Value::as_str).unwrap_or("");
    if !REMOTE_TOOLS.contains(&tool) {
        return fail(
            "UnknownTool",
            format!("the backend agent does not run `{tool}`"),
        );
    }
    let Some(entry) = registry.get(tool) else {
        return fail("UnknownTool", format!("no tool named `{tool}` here"));
    };
    let args = req
        .get("args")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let env = req.get("env").and_then(Value::as_array).map(|pairs| {
        let mut env: Vec<(String, String)> = pairs
            .iter()
            .filter_map(|p| {
                let p = p.as_array()?;
                Some((
                    p.first()?.as_str()?.to_string(),
                    p.get(1)?.as_str()?.to_string(),
                ))
            })
            .collect();
        // The host cannot know the backend's PATH and HOME (execute_code drops the host's):
        // take ours when the call brings none, as the script itself gets them (SPEC §4).
        for name in ["PATH", "HOME"] {
            if !env.iter().any(|(k, _)| k == name) {
                if let Ok(value) = std::env::var(name) {
                    env.push((name.into(), value));
                }
            }
        }
        let env = Arc::new(env);
        match req.get("scope").and_then(Value::as_u64) {
            Some(scope) => SCOPES
                .lock()
                .map(|mut m| Arc::clone(m.entry(scope).or_insert(env.clone())))
                .unwrap_or(env),
            None => env,
        }
    });
    let ctx = ToolContext {
        task_id: req
            .get("task_id")
            .and_then(Value::as_str)
            .map(str::to_string),
        cwd: req
            .get("cwd")
            .and_then(Value::as_str)
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::PathBuf::from("/")),
        env,
        // The backend itself is the sandbox: strict mode's host path policy does not apply here.
        paths: None,
        // Scripts run inside the backend call no execute_code.
        toolsets: None,
        origin: if req.get("origin").and_then(Value::as_str) == Some("script") {
            CallOrigin::Script
        } else {
            CallOrigin::Agent
        },
    };
    let result = match &entry.handler {
        Handler::Sync(f) => {
            // A host call its client may cancel (`cancel_call`): its command is killed here.
            let run = || match req.get("call").and_then(Value::as_u64) {
                Some(call) => super::local::in_call(call, || f(&args, &ctx)),
                None => f(&args, &ctx),
            };
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|_| {
                Err(ToolError::new(
                    crate::ToolErrorKind::Panic,
                    format!("`{tool}` panicked"),
                ))
            })
        }
        _ => Err(ToolError::new(
            crate::ToolErrorKind::UnknownTool,
            format!("`{tool}` is not a synchronous built-in"),
        )),
    };
    match result {
        Ok(v) => json!({"id": id, "ok": v}),
        Err(e) => fail(e.kind.as_str(), e.message),
    }
}

/// Forwards a tool call to the task's remote environment when a remote backend is active.
/// `None`: run it here.
pub fn forward(
    tool: &str,
    args: &Map<String, Value>,
    ctx: &ToolContext,
    timeout: Duration,
) -> Option<Result<Value, ToolError>> {
    let env = match super::remote_for(ctx) {
        Ok(Some(env)) => env,
        Ok(None) => return None,
        Err(e) => return Some(Err(e)),
    };
    let agent = env.agent()?;
    let mut ctx = ctx.clone();
    if ctx.origin == CallOrigin::Agent {
        // An agent call names paths relative to the backend's working dir, not the host's.
        ctx.cwd = std::path::PathBuf::from(env.workdir());
    }
    Some(agent.call(tool, args, &ctx, timeout))
}

/// [`agent_binary`], checked to be a regular file on this host, as `backend`'s error: run
/// before a backend creates anything, so a wrong path fails at once, naming the setting,
/// rather than after a container or sandbox exists (docker's `-v` would even create the
/// missing path as a directory) with every tool call failing vaguely.
pub fn checked_agent_binary(
    backend: &'static str,
    configured: Option<&std::path::Path>,
) -> Result<std::path::PathBuf, EnvError> {
    let path = agent_binary(configured).map_err(|message| EnvError::Agent { backend, message })?;
    let problem = match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => return Ok(path),
        Ok(_) => "is not a regular file".to_string(),
        Err(e) => format!("cannot be read ({e})"),
    };
    Err(EnvError::Agent {
        backend,
        message: format!(
            "the vibeos-exec binary {} {problem}; set terminal.agent_binary (or VIBEOS_AGENT_BINARY) to a vibeos-exec executable on this host",
            path.display()
        ),
    })
}

/// The vibeos-exec binary to run as tool agent: `terminal.agent_binary`, else
/// `$VIBEOS_AGENT_BINARY`, else this program if it is vibeos-exec, else `vibeos-exec` on PATH.
pub fn agent_binary(configured: Option<&std::path::Path>) -> Result<std::path::PathBuf, String> {
    if let Some(p) = configured {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("VIBEOS_AGENT_BINARY").filter(|p| !p.is_empty()) {
        return Ok(p.into());
    }
    if let Ok(me) = std::env::current_exe() {
        if me.file_name().is_some_and(|n| n == "vibeos-exec") {
            return Ok(me);
        }
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("vibeos-exec"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "cannot find the vibeos-exec binary to run as tool agent; set terminal.agent_binary"
                .to_string()
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
