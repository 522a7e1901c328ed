//! The supervisor's end of the RPC channel: a tokio Unix-socket server for one execution.
//!
//! Any number of connections may come from the script's process tree (threads share one,
//! subprocesses open their own); each is checked by peer credentials (same uid, a descendant of
//! the execution's reaper) and every request by token. Requests on a connection are served
//! concurrently and replies carry the request id. Nothing a peer sends can crash or stall the
//! server: bad frames get an error reply, oversized or unauthorised ones also close the
//! connection.
//!
//! Strict mode uses [`serve_stream`] instead: the script gets one end of a socketpair the
//! supervisor created, so there is no path to dial and no peer to vet — only the token, the
//! allowlist and the budget apply, exactly as on the listener.

use crate::reaper::is_descendant;
use futures_util::StreamExt;
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::codec::{AnyDelimiterCodec, AnyDelimiterCodecError, FramedRead};
use vibeos_rpc::{decode_request, encode_error, encode_response, ProtocolError, MAX_FRAME_BYTES};
use vibeos_tools::{CallOrigin, ToolContext, ToolRegistry, SCRIPT_BLOCKED_TOOLS};

/// Parameters of `terminal` a script may not use: scripts run foreground commands only.
const TERMINAL_STRIPPED: [&str; 5] = ["background", "pty", "notify", "notify_on_complete", "watch"];

/// Everything the server needs to answer one execution's calls.
pub struct ChannelState {
    /// Registry calls are dispatched through.
    pub registry: &'static ToolRegistry,
    /// The token every request must carry.
    pub token: String,
    /// Names the script may call (the script tools available now).
    pub allowed: BTreeSet<String>,
    /// Call budget of the execution.
    pub max_tool_calls: usize,
    /// Calls dispatched so far.
    pub calls_made: AtomicUsize,
    /// Pid of the execution's reaper; peers must descend from it. 0 until the child starts.
    pub root_pid: AtomicU32,
    /// Context handed to tool handlers.
    pub context: ToolContext,
}

impl ChannelState {
    /// State for an execution.
    pub fn new(
        registry: &'static ToolRegistry,
        token: String,
        allowed: BTreeSet<String>,
        max_tool_calls: usize,
        context: ToolContext,
    ) -> Self {
        ChannelState {
            registry,
            token,
            allowed,
            max_tool_calls,
            calls_made: AtomicUsize::new(0),
            root_pid: AtomicU32::new(0),
            context: ToolContext {
                origin: CallOrigin::Script,
                ..context
            },
        }
    }

    /// Answers one decoded request (token already checked).
    async fn answer(self: &Arc<Self>, tool: String, mut args: Map<String, Value>) -> Value {
        if SCRIPT_BLOCKED_TOOLS.contains(&tool.as_str()) || !self.allowed.contains(&tool) {
            let available: Vec<&str> = self.allowed.iter().map(String::as_str).collect();
            let why = if SCRIPT_BLOCKED_TOOLS.contains(&tool.as_str()) {
                "can never be called from execute_code scripts"
            } else {
                "is not available in execute_code scripts"
            };
            return json!({
                "error": format!(
                    "Tool `{tool}` {why}. Available: {}",
                    if available.is_empty() { "none".to_string() } else { available.join(", ") }
                )
            });
        }
        let admitted = self
            .calls_made
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max_tool_calls).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            return json!({
                "error": format!(
                    "Tool call limit reached ({}). No more tool calls allowed in this execution.",
                    self.max_tool_calls
                )
            });
        }
        if tool == "terminal" {
            for key in TERMINAL_STRIPPED {
                args.remove(key);
            }
        }
        let state = Arc::clone(self);
        let outcome = tokio::task::spawn_blocking(move || {
            state
                .registry
                .handle_function_call(&tool, &Value::Object(args), &state.context)
        })
        .await;
        match outcome {
            Ok(text) => serde_json::from_str(&text).unwrap_or(Value::String(text)),
            Err(e) => {
                json!({ "error": format!("Error executing tool: the call was aborted ({e})") })
            }
        }
    }
}

/// Serves `listener` until the returned task is aborted.
pub fn serve(listener: UnixListener, state: Arc<ChannelState>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let state = Arc::clone(&state);
                        connections.spawn(serve_connection(stream, state, true));
                    }
                    Err(e) => {
                        tracing::warn!("execute_code: accepting an RPC connection failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
    })
}

/// Serves one already-connected stream (strict mode's socketpair end) until it closes or the
/// returned task is aborted. The peer is known (we created the pair), so no credential check.
pub fn serve_stream(stream: UnixStream, state: Arc<ChannelState>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(serve_connection(stream, state, false))
}

fn peer_allowed(stream: &UnixStream, state: &ChannelState) -> bool {
    let Ok(cred) = stream.peer_cred() else {
        return false;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let root = state.root_pid.load(Ordering::SeqCst);
    let pid_ok = match cred.pid() {
        Some(pid) if pid > 0 && root != 0 => is_descendant(pid as u32, root),
        _ => false,
    };
    cred.uid() == me && pid_ok
}

enum Outgoing {
    Frame(Vec<u8>),
    Close(Vec<u8>),
}

async fn serve_connection(stream: UnixStream, state: Arc<ChannelState>, check_peer: bool) {
    if check_peer && !peer_allowed(&stream, &state) {
        tracing::warn!(
            "execute_code: refused an RPC connection from a process outside the execution"
        );
        let mut stream = stream;
        let _ = stream
            .write_all(&encode_error(None, &ProtocolError::ForeignPeer))
            .await;
        return;
    }
    let (read_half, mut write_half) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Outgoing>();
    let writer = tokio::spawn(async move {
        while let Some(out) = rx.recv().await {
            let (bytes, close) = match out {
                Outgoing::Frame(b) => (b, false),
                Outgoing::Close(b) => (b, true),
            };
            if write_half.write_all(&bytes).await.is_err() || close {
                break;
            }
        }
        let _ = write_half.shutdown().await;
    });
    let codec =
        AnyDelimiterCodec::new_with_max_length(b"\n".to_vec(), b"\n".to_vec(), MAX_FRAME_BYTES);
    let mut frames = FramedRead::with_capacity(read_half, codec, 64 * 1024);
    let mut calls = JoinSet::new();
    loop {
        let frame = tokio::select! {
            frame = frames.next() => frame,
            Some(_) = calls.join_next(), if !calls.is_empty() => continue,
        };
        let Some(frame) = frame else { break };
        let frame = match frame {
            Ok(f) => f,
            Err(AnyDelimiterCodecError::MaxChunkLengthExceeded) => {
                let _ = tx.send(Outgoing::Close(encode_error(
                    None,
                    &ProtocolError::TooLarge {
                        limit: MAX_FRAME_BYTES,
                    },
                )));
                break;
            }
            Err(_) => break,
        };
        if frame.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let request = match decode_request(&frame) {
            Ok(r) => r,
            Err((id, e)) => {
                let bytes = encode_error(id.as_ref(), &e);
                let out = if e.closes_connection() {
                    Outgoing::Close(bytes)
                } else {
                    Outgoing::Frame(bytes)
                };
                let _ = tx.send(out);
                continue;
            }
        };
        if !constant_time_eq(request.token.as_bytes(), state.token.as_bytes()) {
            tracing::warn!("execute_code: refused an RPC request with a wrong token");
            let _ = tx.send(Outgoing::Close(encode_error(
                Some(&request.id),
                &ProtocolError::BadToken,
            )));
            break;
        }
        let state = Arc::clone(&state);
        let tx = tx.clone();
        calls.spawn(async move {
            let result = state.answer(request.tool, request.args).await;
            let _ = tx.send(Outgoing::Frame(encode_response(&request.id, &result)));
        });
    }
    // Let calls already admitted finish and reply before the connection goes away.
    while calls.join_next().await.is_some() {}
    drop(tx);
    let _ = writer.await;
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
