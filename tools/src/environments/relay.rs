//! The relay: execute_code's RPC channel for sandboxes the host cannot mount a socket into
//! (daytona, modal). See docs/backends.md, "The relay".
//!
//! Docker bind-mounts the socket's directory and ssh forwards it; a cloud sandbox offers
//! neither, only commands whose stdin and stdout stream. So a small program ([`RELAY_SOURCE`],
//! Python, because the sandbox must have Python for the script anyway) runs as ONE streaming
//! exec inside the sandbox: it binds the UNIX socket the stub connects to, starts the bootstrap
//! as its child, and carries every socket connection, the child's stdout and stderr, its exit
//! code and signals as text frames over its stdin/stdout. [`Relay`] is the host's end: it turns
//! each connection the relay reports into a connection to a local socket (where the execution's
//! RPC server listens), so the server, its token check and every tool run exactly as for docker.
//!
//! A backend only moves bytes: it hands what the exec printed to [`Relay::feed`] (or lets
//! [`pump_reader`] read an `AsyncRead`) and sends what arrives on the outgoing receiver to the
//! exec's stdin (or lets [`pump_writer`] write it to an `AsyncWrite`). Each call to `feed` may
//! carry any part of the stream; each outgoing item is one or more complete lines.

use super::process::tree_kill_argv;
use super::{EnvError, ExecSpec, GroupSignal, Process, Spawned};
use base64::Engine as _;
use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// The in-sandbox relay program (Python 3.6+, standard library only).
pub const RELAY_SOURCE: &str = include_str!("relay.py");

/// The longest frame line the host accepts from the relay: its data frames carry at most 64 KiB
/// (88 KiB as base64); anything much longer is not the relay talking.
pub const MAX_FRAME: usize = 256 * 1024;

/// Bytes read from one local connection per data frame (what the relay uses too).
const CHUNK: usize = 64 * 1024;

/// The argv that starts the relay with `python` (the source travels in argv; it holds no
/// payload, and its comment lines are dropped because `ps` shows them).
pub fn relay_argv(python: &str) -> Vec<String> {
    let source = RELAY_SOURCE
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    vec![python.into(), "-u".into(), "-B".into(), "-c".into(), source]
}

/// What the relay reports about the execution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayEvent {
    /// The script's socket is bound: the child may start.
    Listening,
    /// Output of the child.
    Stdout(Vec<u8>),
    /// Error output of the child.
    Stderr(Vec<u8>),
    /// The child exited with this code (`-N`: killed by signal N); the relay exits too.
    Exited(i32),
    /// The relay reported an error, sent something that is not a frame, or its stream ended
    /// before the child exited.
    Failed(String),
}

/// The host's end of one relay (one execution).
pub struct Relay {
    local: PathBuf,
    runtime: tokio::runtime::Handle,
    out: UnboundedSender<Vec<u8>>,
    events: UnboundedSender<RelayEvent>,
    conns: Conns,
    pending: Mutex<Vec<u8>>,
    /// The child's and the relay's own pid over there, as the relay reported them when it
    /// started the child.
    leader: std::sync::OnceLock<(i32, i32)>,
}

/// Open connections by channel number: where to send their bytes (`None` closes them).
type Conns = Arc<Mutex<HashMap<u64, UnboundedSender<Option<Vec<u8>>>>>>;

/// What [`Relay::new`] returns: the relay, what to send to its stdin, what it reports.
pub type RelayParts = (
    Arc<Relay>,
    UnboundedReceiver<Vec<u8>>,
    UnboundedReceiver<RelayEvent>,
);

fn frame(tag: &str, chan: u64, data: Option<&[u8]>) -> Vec<u8> {
    let mut line = format!("{tag} {chan}");
    if let Some(data) = data {
        line.push(' ');
        line.push_str(&base64::engine::general_purpose::STANDARD.encode(data));
    }
    line.push('\n');
    line.into_bytes()
}

impl Relay {
    /// A relay whose connections are carried to the UNIX socket `local_socket` on this host;
    /// their tasks run on `runtime`, so [`Relay::feed`] may be called from any thread.
    pub fn new(local_socket: PathBuf, runtime: tokio::runtime::Handle) -> RelayParts {
        let (out, out_rx) = unbounded_channel();
        let (events, events_rx) = unbounded_channel();
        let relay = Arc::new(Relay {
            local: local_socket,
            runtime,
            out,
            events,
            conns: Arc::default(),
            pending: Mutex::new(Vec::new()),
            leader: std::sync::OnceLock::new(),
        });
        (relay, out_rx, events_rx)
    }

    /// Asks the relay to bind the script's socket at `path` over there (its directory is
    /// created 0700 when missing, and refused unless private).
    pub fn listen(&self, path: &str) {
        let _ = self.out.send(frame("L", 0, Some(path.as_bytes())));
    }

    /// Starts `argv` over there with `stdin` as its whole input, in a new session (so
    /// [`Relay::signal`] reaches everything it starts).
    pub fn boot(&self, argv: &[String], stdin: &[u8]) {
        let spec = serde_json::json!({
            "argv": argv,
            "stdin": base64::engine::general_purpose::STANDARD.encode(stdin),
        });
        let _ = self
            .out
            .send(frame("B", 0, Some(spec.to_string().as_bytes())));
    }

    /// Sends `signal` (`TERM`, `KILL`, `INT`) to the child's process group over there: one
    /// frame, no extra exec.
    pub fn signal(&self, signal: &str) {
        let _ = self.out.send(frame("K", 0, Some(signal.as_bytes())));
    }

    /// Ends the stream to the relay: the pumps close its stdin (a backend that drives the
    /// outgoing receiver itself sees an empty item), and the relay kills what it runs and exits.
    pub fn close(&self) {
        let _ = self.out.send(Vec::new());
    }

    /// Takes bytes the relay printed (any split of its stdout), from any thread.
    pub fn feed(&self, bytes: &[u8]) {
        let lines = {
            let Ok(mut pending) = self.pending.lock() else {
                return;
            };
            pending.extend_from_slice(bytes);
            let Some(last) = pending.iter().rposition(|b| *b == b'\n') else {
                if pending.len() > MAX_FRAME {
                    pending.clear();
                    drop(pending);
                    self.fail("the relay sent a line longer than the frame limit".into());
                }
                return;
            };
            let rest = pending.split_off(last + 1);
            std::mem::replace(&mut *pending, rest)
        };
        for line in lines.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            if let Err(e) = self.frame_in(line) {
                self.fail(e);
            }
        }
    }

    /// Reports that the stream from the relay ended. If the child has not exited, the
    /// execution failed (the exec was cut).
    pub fn stream_ended(&self) {
        self.fail("the relay's stream ended before the script exited".into());
    }

    fn fail(&self, message: String) {
        // Its text may come from the sandbox: a newline in it made a line of its own in
        // agent.log, one that read as the host's.
        let message = message
            .chars()
            .flat_map(|c| {
                let escaped: Vec<char> = if c.is_control() {
                    c.escape_default().collect()
                } else {
                    vec![c]
                };
                escaped
            })
            .collect();
        let _ = self.events.send(RelayEvent::Failed(message));
    }

    fn frame_in(&self, line: &[u8]) -> Result<(), String> {
        let text = std::str::from_utf8(line)
            .map_err(|_| "the relay sent a frame that is not ASCII".to_string())?;
        let mut parts = text.split(' ');
        let tag = parts.next().unwrap_or_default();
        let chan: u64 = parts
            .next()
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("the relay sent a malformed frame: {:.80}", text))?;
        let data = match parts.next() {
            Some(b64) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| format!("the relay sent bad base64 in a {tag} frame: {e}"))?,
            None => Vec::new(),
        };
        match tag {
            "R" => {
                let _ = self.events.send(RelayEvent::Listening);
            }
            "O" => self.open(chan),
            "D" => {
                let conns = self.conns.lock().map_err(|_| "relay state poisoned")?;
                if let Some(tx) = conns.get(&chan) {
                    let _ = tx.send(Some(data));
                }
            }
            "C" => {
                let tx = self
                    .conns
                    .lock()
                    .map_err(|_| "relay state poisoned")?
                    .remove(&chan);
                if let Some(tx) = tx {
                    let _ = tx.send(None);
                }
            }
            "1" => {
                let _ = self.events.send(RelayEvent::Stdout(data));
            }
            "2" => {
                let _ = self.events.send(RelayEvent::Stderr(data));
            }
            "X" => {
                let code = String::from_utf8_lossy(&data)
                    .trim()
                    .parse()
                    .map_err(|_| "the relay sent a bad exit code".to_string())?;
                let _ = self.events.send(RelayEvent::Exited(code));
            }
            "P" => {
                let text = String::from_utf8_lossy(&data);
                let mut pids = text.split_whitespace().map(|p| p.parse::<i32>().ok());
                if let (Some(Some(child)), Some(Some(relay))) = (pids.next(), pids.next()) {
                    if child > 1 && relay > 1 {
                        let _ = self.leader.set((child, relay));
                    }
                }
            }
            "E" => {
                return Err(format!(
                    "relay in the sandbox: {}",
                    String::from_utf8_lossy(&data)
                ))
            }
            other => return Err(format!("the relay sent an unknown frame {other:?}")),
        }
        Ok(())
    }

    /// A client connected over there: connect to the local socket and carry both directions.
    fn open(&self, chan: u64) {
        let (tx, mut rx) = unbounded_channel::<Option<Vec<u8>>>();
        if let Ok(mut conns) = self.conns.lock() {
            conns.insert(chan, tx);
        }
        let local = self.local.clone();
        let out = self.out.clone();
        let conns = Arc::clone(&self.conns);
        let runtime = self.runtime.clone();
        self.runtime.spawn(async move {
            let stream = match UnixStream::connect(&local).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("relay: cannot reach {}: {e}", local.display());
                    if let Ok(mut c) = conns.lock() {
                        c.remove(&chan);
                    }
                    let _ = out.send(frame("C", chan, None));
                    return;
                }
            };
            let (mut read, mut write) = stream.into_split();
            let reader_out = out.clone();
            let reader_conns = Arc::clone(&conns);
            let reader = runtime.spawn(async move {
                let mut buf = vec![0u8; CHUNK];
                loop {
                    match read.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if reader_out.send(frame("D", chan, Some(&buf[..n]))).is_err() {
                                return;
                            }
                        }
                    }
                }
                // Closed on this side: tell the relay, unless it closed first.
                let known = reader_conns
                    .lock()
                    .map(|mut c| c.remove(&chan).is_some())
                    .unwrap_or(false);
                if known {
                    let _ = reader_out.send(frame("C", chan, None));
                }
            });
            while let Some(Some(data)) = rx.recv().await {
                if write.write_all(&data).await.is_err() {
                    break;
                }
            }
            let _ = write.shutdown().await;
            drop(reader);
        });
    }
}

/// How many of an execution's bad relay frames are said (logged, and in its stderr) before
/// the rest are only counted.
const SHOWN_FAILURES: usize = 10;

/// Feeds everything `reader` yields (the streaming exec's stdout) to `relay`, then reports the
/// end of the stream.
pub async fn pump_reader<R: AsyncRead + Unpin>(relay: Arc<Relay>, mut reader: R) {
    let mut buf = vec![0u8; CHUNK + CHUNK / 2];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => relay.feed(&buf[..n]),
        }
    }
    relay.stream_ended();
}

/// Writes the relay's outgoing frames to `writer` (the streaming exec's stdin) until
/// [`Relay::close`], the relay is dropped, or the writer fails.
pub async fn pump_writer<W: AsyncWrite + Unpin>(mut rx: UnboundedReceiver<Vec<u8>>, mut writer: W) {
    while let Some(bytes) = rx.recv().await {
        if bytes.is_empty() {
            break;
        }
        if writer.write_all(&bytes).await.is_err() || writer.flush().await.is_err() {
            return;
        }
    }
    let _ = writer.shutdown().await;
}

/// [`pump_reader`] for a blocking reader (a backend's `Spawned` stdout); run it on a thread.
pub fn pump_reader_blocking<R: std::io::Read>(relay: Arc<Relay>, mut reader: R) {
    let mut buf = vec![0u8; CHUNK + CHUNK / 2];
    loop {
        match reader.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => relay.feed(&buf[..n]),
        }
    }
    relay.stream_ended();
}

/// [`pump_writer`] for a blocking writer (a backend's `Spawned` stdin); run it on a thread.
/// Returning drops the writer, which closes the relay's stdin.
pub fn pump_writer_blocking<W: std::io::Write>(mut rx: UnboundedReceiver<Vec<u8>>, mut writer: W) {
    while let Some(bytes) = rx.blocking_recv() {
        if bytes.is_empty() {
            return;
        }
        if writer.write_all(&bytes).is_err() || writer.flush().is_err() {
            return;
        }
    }
}

/// The prefix of `backend`'s relay socket dirs on this host (see [`super::host_dirs`]).
pub fn dir_prefix(backend: &str) -> String {
    format!("vibeos-relay-{backend}-")
}

/// The channel of an execution that goes through the relay: the RPC server binds
/// `rpc.sock` in a private 0700 temp dir on the host (removed when the channel is dropped); the
/// relay binds the script's socket in the execution's private work dir over there, which is
/// also what `VIBEOS_RPC_DIR` names.
pub fn channel(backend: &'static str, exec_id: &str) -> Result<super::Channel, EnvError> {
    // Named after the backend, so that `backends gc` reports a crashed host's dir under it.
    let dir =
        super::host_dirs::private_dir(&dir_prefix(backend)).map_err(|e| EnvError::Command {
            backend,
            what: "creating the execution's local socket dir".into(),
            message: format!("{e}; check that TMPDIR is writable"),
        })?;
    let remote_dir = format!("/tmp/vibeos-exec-{exec_id}");
    Ok(super::Channel {
        connections: super::Connections::Bind(dir.path().join("rpc.sock")),
        remote_socket: format!("{remote_dir}/rpc.sock"),
        remote_dir,
        hello: false,
        guard: Box::new(dir),
    })
}

/// Starts `spec` (execute_code's bootstrap) in `env` behind a relay: one streaming exec of the
/// relay program, which binds `remote_socket` over there and carries its connections to
/// `local_socket` here. The returned handle behaves like a plain spawn: what is written to its
/// stdin becomes the bootstrap's whole input (sent when the stdin is dropped), its stdout and
/// stderr are the bootstrap's, `wait` gives its exit code, and `kill` signals its process group
/// with one frame. Must be called where a tokio runtime is current (e.g. in `spawn_blocking`).
pub fn spawn_relayed(
    env: &dyn super::Environment,
    spec: &ExecSpec,
    local_socket: PathBuf,
    remote_socket: &str,
) -> Result<Spawned, EnvError> {
    let backend = env.backend();
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| EnvError::Agent {
        backend,
        message: "the relay needs a tokio runtime (internal error)".into(),
    })?;
    let relay_spec = ExecSpec {
        argv: relay_argv(&env.python()),
        cwd: spec.cwd.clone(),
        env: spec.env.clone(),
    };
    let raw = env.spawn(&relay_spec)?;
    let Spawned {
        stdin,
        stdout,
        stderr,
        process: raw_process,
    } = raw;
    let (Some(stdin), Some(stdout)) = (stdin, stdout) else {
        let _ = raw_process.kill(GroupSignal::Kill);
        return Err(EnvError::Agent {
            backend,
            message: "the relay's streams could not be set up".into(),
        });
    };
    let (relay, out, mut events) = Relay::new(local_socket, runtime);
    let feeder = Arc::clone(&relay);
    std::thread::spawn(move || pump_reader_blocking(feeder, stdout));
    std::thread::spawn(move || pump_writer_blocking(out, stdin));
    relay.listen(remote_socket);

    let (out_r, mut out_w) = std::io::pipe().map_err(|e| pipe_err(backend, &e))?;
    let (err_r, err_w) = std::io::pipe().map_err(|e| pipe_err(backend, &e))?;
    let err_w = Arc::new(Mutex::new(Some(err_w)));
    // The relay's own diagnostics (a Python traceback) belong to the script's stderr.
    if let Some(mut raw_err) = stderr {
        let sink = Arc::clone(&err_w);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = raw_err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if let Ok(mut w) = sink.lock() {
                    if let Some(w) = w.as_mut() {
                        let _ = w.write_all(&buf[..n]);
                    }
                }
            }
        });
    }
    let (fresh, python) = (env.fresh_runner(), env.python());
    let process = Arc::new_cyclic(|me| RelayedProcess {
        backend,
        relay: Arc::clone(&relay),
        raw: Arc::clone(&raw_process),
        fresh,
        python,
        done: Mutex::new(None),
        changed: std::sync::Condvar::new(),
        me: me.clone(),
    });
    let watcher = Arc::clone(&process);
    std::thread::spawn(move || {
        let mut outcome: Option<Result<i32, String>> = None;
        let mut listening = false;
        // What the relay's stream carries is the sandbox's to write (a script can write to
        // its relay's stdout): one warning per bad frame let it flood the host's stderr and
        // rotate every earlier line out of agent.log (1.5 million lines in 20 s, stop 58's
        // probe). The first few are said, then how many more there were.
        let mut failures = 0usize;
        while let Some(event) = events.blocking_recv() {
            match event {
                RelayEvent::Listening => listening = true,
                RelayEvent::Stdout(b) => {
                    let _ = out_w.write_all(&b);
                }
                RelayEvent::Stderr(b) => {
                    if let Ok(mut w) = err_w.lock() {
                        if let Some(w) = w.as_mut() {
                            let _ = w.write_all(&b);
                        }
                    }
                }
                RelayEvent::Exited(code) => {
                    outcome = Some(Ok(code));
                    break;
                }
                RelayEvent::Failed(mut message) => {
                    let ended = message.contains("stream ended");
                    if !listening && ended {
                        // The relay never ran: most often the interpreter it is started with
                        // is not there (the shell's own error is in the stderr above).
                        message = format!(
                            "the relay did not start over there with `{}` (terminal.python); set terminal.python to the sandbox's Python 3 interpreter",
                            watcher.python
                        );
                    }
                    failures += 1;
                    let shown = if ended || failures <= SHOWN_FAILURES {
                        Some(message.clone())
                    } else if failures == SHOWN_FAILURES + 1 {
                        Some(format!(
                            "the relay sent more bad frames; only the first {SHOWN_FAILURES} are shown"
                        ))
                    } else {
                        None
                    };
                    if let Some(shown) = shown {
                        tracing::warn!("{backend} relay: {shown}");
                        if let Ok(mut w) = err_w.lock() {
                            if let Some(w) = w.as_mut() {
                                let _ = writeln!(w, "vibeos-exec: {shown}");
                            }
                        }
                    }
                    if ended {
                        outcome = Some(Err(message));
                        break;
                    }
                }
            }
        }
        if failures > SHOWN_FAILURES + 1 {
            tracing::warn!(
                "{backend} relay: {failures} bad frames in all from this execution's relay"
            );
        }
        // Closing the pipes ends the caller's readers; the relay program exits by itself.
        drop(out_w);
        if let Ok(mut w) = err_w.lock() {
            w.take();
        }
        watcher.relay.close();
        let confirmed = matches!(outcome, Some(Ok(_)));
        watcher.finish(outcome.unwrap_or_else(|| Err("the relay went away".into())));
        // Nothing the script started may outlive the execution (SPEC §2), and what ended it
        // here is the relay's word, which the script can silence (it kills or stops its relay)
        // or forge (an exit frame written to the relay's stdout): after the end, the exec must
        // end too, or the backstop runs.
        watcher.sweep_after_end(confirmed);
    });
    // The raw exec is reaped (its client, if any) when it ends.
    std::thread::spawn(move || {
        let _ = raw_process.wait();
    });
    Ok(Spawned {
        stdin: Some(Box::new(BootInput {
            relay,
            argv: spec.argv.clone(),
            input: Vec::new(),
        })),
        stdout: Some(Box::new(out_r)),
        stderr: Some(Box::new(err_r)),
        process,
    })
}

fn pipe_err(backend: &'static str, e: &std::io::Error) -> EnvError {
    EnvError::Agent {
        backend,
        message: format!("cannot create a pipe for the relay: {e}"),
    }
}

/// The bootstrap's stdin: collected, and sent with the boot frame when dropped.
struct BootInput {
    relay: Arc<Relay>,
    argv: Vec<String>,
    input: Vec<u8>,
}

impl std::io::Write for BootInput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.input.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for BootInput {
    fn drop(&mut self) {
        self.relay.boot(&self.argv, &self.input);
    }
}

/// How long after the script's exit frame the relay's exec may take to end before what is
/// left of it is killed (the relay exits as soon as it has sent the frame; the service may take
/// a moment to report the exec's end).
const EXEC_END_AFTER_EXIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The relayed child as a [`Process`]: its exit comes from the `X` frame, signals go as `K`
/// frames; if the relay cannot be reached any more, the exec itself is killed.
struct RelayedProcess {
    backend: &'static str,
    relay: Arc<Relay>,
    raw: Arc<dyn Process>,
    /// The backend's fresh-process runner, for the kill's backstop (see `kill`).
    fresh: Option<super::FreshRun>,
    /// The interpreter over there (runs the backstop's tree kill).
    python: String,
    done: Mutex<Option<Result<i32, String>>>,
    changed: std::sync::Condvar,
    /// Itself, for the threads of [`Process::kill`], which gets `&self` only.
    me: std::sync::Weak<RelayedProcess>,
}

impl RelayedProcess {
    fn finish(&self, outcome: Result<i32, String>) {
        if let Ok(mut done) = self.done.lock() {
            *done = Some(outcome);
        }
        self.changed.notify_all();
    }

    fn outcome(&self, done: &Option<Result<i32, String>>) -> Option<Result<i32, EnvError>> {
        done.as_ref().map(|r| {
            r.clone().map_err(|message| EnvError::Agent {
                backend: self.backend,
                message,
            })
        })
    }
}

impl RelayedProcess {
    /// Ends whatever is left of the execution over there once its end was reported: after an
    /// exit frame the relay exits by itself at once, so an exec still running
    /// [`EXEC_END_AFTER_EXIT`] later means the frame was not the relay's (or the relay is stuck); without an exit
    /// frame the relay is gone and the script may run on in its own session. Either way the
    /// kill's backstop reaches everything below the bootstrap by the pid the relay reported
    /// before the script ran.
    fn sweep_after_end(self: &Arc<Self>, confirmed: bool) {
        let this = Arc::clone(self);
        std::thread::spawn(move || {
            if confirmed {
                let deadline = std::time::Instant::now() + EXEC_END_AFTER_EXIT;
                while matches!(this.raw.try_wait(), Ok(None)) {
                    if std::time::Instant::now() > deadline {
                        tracing::warn!(
                            "{} relay: the exec still runs after the script's exit was reported; killing what is left",
                            this.backend
                        );
                        this.backstop();
                        return;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                return;
            }
            this.backstop();
        });
    }

    /// The tree kill below the bootstrap, as a fresh process of the backend's API, then the
    /// exec itself, then the relay by its pid if the exec still runs.
    fn backstop(&self) {
        let fresh = self.fresh.clone().zip(self.relay.leader.get().copied());
        if let Some((run, (child, _))) = &fresh {
            let argv = tree_kill_argv(&self.python, *child, GroupSignal::Kill);
            if let Err(e) = run(&argv) {
                tracing::warn!("{} relay: the kill's backstop failed: {e}", self.backend);
            }
        }
        let _ = self.raw.kill(GroupSignal::Kill);
        let Some((run, (_, relay))) = &fresh else {
            return;
        };
        std::thread::sleep(std::time::Duration::from_secs(1));
        if matches!(self.raw.try_wait(), Ok(None)) {
            let argv = [
                self.python.clone(),
                "-c".into(),
                "import os, sys\nos.kill(int(sys.argv[1]), 9)".into(),
                relay.to_string(),
            ];
            if let Err(e) = run(&argv) {
                tracing::warn!("{} relay: killing the relay failed: {e}", self.backend);
            }
        }
    }

    fn myself(&self) -> Option<Arc<RelayedProcess>> {
        self.me.upgrade()
    }
}

impl Process for RelayedProcess {
    fn wait(&self) -> Result<i32, EnvError> {
        let mut done = self.done.lock().map_err(|_| EnvError::Agent {
            backend: self.backend,
            message: "relay state poisoned".into(),
        })?;
        loop {
            if let Some(r) = self.outcome(&done) {
                return r;
            }
            done = self.changed.wait(done).map_err(|_| EnvError::Agent {
                backend: self.backend,
                message: "relay state poisoned".into(),
            })?;
        }
    }

    fn try_wait(&self) -> Result<Option<i32>, EnvError> {
        let done = self.done.lock().map_err(|_| EnvError::Agent {
            backend: self.backend,
            message: "relay state poisoned".into(),
        })?;
        self.outcome(&done).transpose()
    }

    fn kill(&self, signal: GroupSignal) -> Result<(), EnvError> {
        self.relay.signal(signal.name());
        if signal == GroupSignal::Kill {
            // A relay that no longer reads its stdin cannot pass the frame on: end the exec
            // itself, but only after the relay had its chance (killing it first would orphan
            // the script's group).
            //
            // The backstop: the relay, the bootstrap below it and the pgid file of the exec's
            // group all run as the script's user, which may have stopped or removed them (a
            // script that ignores SIGTERM and SIGSTOPs its relay and bootstrap outlived its
            // timeout). A fresh process started by the backend's API kills everything below
            // the bootstrap by the pid the relay reported before the script ran, and resumes a
            // stopped bootstrap so it can reap and report.
            // The relay itself is killed by pid the same way once the bootstrap had its chance
            // to report through it (a stopped relay never would, and the exec's group kill
            // depends on a file the script can remove).
            let raw = Arc::clone(&self.raw);
            let this = self.myself();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_secs(2));
                if !matches!(raw.try_wait(), Ok(None)) {
                    return;
                }
                match this {
                    Some(this) => this.backstop(),
                    None => {
                        let _ = raw.kill(GroupSignal::Kill);
                    }
                }
            });
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;
