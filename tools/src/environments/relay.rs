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

use base64::Engine as _;
use std::collections::HashMap;
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

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;
