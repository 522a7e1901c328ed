//! The supervisor's end of the RPC channel for one execution.
//!
//! Any number of connections may come from the script's process tree (threads share one,
//! subprocesses open their own); each is checked by peer credentials (same uid, a descendant of
//! the execution's reaper) and every request by token. Nothing a peer sends can crash or stall
//! the server: bad frames get an error reply, oversized or unauthorised ones also close the
//! connection.
//!
//! Accepting is async (tokio), but each connection is then served by a plain thread doing
//! blocking reads, the way the minimal echo server of the benchmark does: a tool call is one
//! read, one dispatch and one write, with no wake-up hops between tasks or threads. That keeps
//! a call within a small factor of a bare socket round trip (the RPC latency budget is tens of
//! microseconds). Bounded local tools (`read_file`, `write_file`) run inline on that thread;
//! tools that may wait (terminal, web) run on the blocking pool, so a connection keeps reading
//! and several calls can be in flight at once; replies carry the request id and are written
//! whole under a lock, so they never interleave.

use crate::reaper::descends_from;
use serde_json::{json, Map, Value};
use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use subtle::ConstantTimeEq;
use tokio::net::UnixListener;
use vibeos_rpc::{
    decode_request, encode_error, encode_response_json, ProtocolError, MAX_FRAME_BYTES,
};
use vibeos_tools::{CallOrigin, ToolContext, ToolEntry, ToolRegistry, SCRIPT_BLOCKED_TOOLS};

/// Most connections one execution may hold open at once. Each costs the supervisor a thread and
/// two descriptors; without a cap a script could exhaust the supervisor's descriptors and break
/// every other execution it serves.
pub const MAX_OPEN_CONNECTIONS: usize = 64;

/// How long a new connection waits for a slot when the execution is at
/// [`MAX_OPEN_CONNECTIONS`]. A script that just closed connections is not refused while their
/// threads are still noticing the close (they free their slots within milliseconds); a script
/// that really holds the cap open is refused after this once, and at once after that until one
/// of its connections ends.
const SLOT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Most calls of one execution that may wait on the blocking pool at once. Each holds a pool
/// thread and its reply until the script reads it: without a cap, a script that writes
/// requests and never reads the replies grew the supervisor by gigabytes. At the cap, the
/// connection stops reading, the socket fills, and the script's own write blocks.
pub const MAX_CALLS_IN_FLIGHT: usize = 32;

/// Parameters of `terminal` a script may not use: scripts run foreground commands only.
const TERMINAL_STRIPPED: [&str; 5] = ["background", "pty", "notify", "notify_on_complete", "watch"];

/// How many refused connections of one execution are logged (see `ChannelState::log_refusal`).
const REFUSALS_LOGGED: u32 = 5;

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
    /// Writers of the open connections by serial number, so [`ChannelState::close_all`] can
    /// end their threads; a connection removes itself when it ends.
    connections: Mutex<HashMap<u64, Writer>>,
    /// Signalled when a connection ends (its slot is free).
    slot_freed: Condvar,
    /// Set when a wait for a slot timed out; cleared when a connection ends. While set, a new
    /// connection beyond the cap is refused without waiting again.
    saturated: AtomicBool,
    /// Serial number of the next connection.
    next_connection: AtomicU64,
    /// Calls on the blocking pool now (see [`MAX_CALLS_IN_FLIGHT`]).
    in_flight: Mutex<usize>,
    /// Signalled when a call on the pool ends, or the execution closes its channel.
    call_done: Condvar,
    /// Set by [`ChannelState::close_all`]: nothing waits for a call slot any more.
    closed: AtomicBool,
    /// Connections refused so far; only the first [`REFUSALS_LOGGED`] are logged.
    refusals: AtomicU32,
}

impl ChannelState {
    /// Logs a refused connection: a script can be refused thousands of times a second (it
    /// controls how often it connects), and each line would grow the host's log without bound.
    fn log_refusal(&self, what: &dyn std::fmt::Display) {
        let n = self.refusals.fetch_add(1, Ordering::Relaxed);
        if n < REFUSALS_LOGGED {
            tracing::warn!("execute_code: {what}");
        } else if n == REFUSALS_LOGGED {
            tracing::warn!(
                "execute_code: {what}; further refused RPC connections of this execution are not logged"
            );
        }
    }

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
            connections: Mutex::new(HashMap::new()),
            slot_freed: Condvar::new(),
            saturated: AtomicBool::new(false),
            next_connection: AtomicU64::new(0),
            in_flight: Mutex::new(0),
            call_done: Condvar::new(),
            closed: AtomicBool::new(false),
            refusals: AtomicU32::new(0),
        }
    }

    /// Waits until fewer than [`MAX_CALLS_IN_FLIGHT`] calls are on the pool and takes a slot;
    /// `None` once the channel is closed.
    fn take_call_slot(self: &Arc<Self>) -> Option<CallSlot> {
        let count = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let mut count = self
            .call_done
            .wait_while(count, |n| {
                *n >= MAX_CALLS_IN_FLIGHT && !self.closed.load(Ordering::SeqCst)
            })
            .unwrap_or_else(|p| p.into_inner());
        if self.closed.load(Ordering::SeqCst) {
            return None;
        }
        *count += 1;
        Some(CallSlot(Arc::clone(self)))
    }

    /// Shuts every open connection down (the execution is over); their threads then end.
    pub fn close_all(&self) {
        self.closed.store(true, Ordering::SeqCst);
        {
            let _count = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            self.call_done.notify_all();
        }
        let mut conns = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        for (_, writer) in conns.drain() {
            let guard = writer.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(w) = guard.as_ref() {
                let _ = w.shutdown(std::net::Shutdown::Both);
            }
        }
        self.slot_freed.notify_all();
    }

    /// Whether the execution holds [`MAX_OPEN_CONNECTIONS`] open connections.
    fn at_capacity(&self) -> bool {
        self.connections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
            >= MAX_OPEN_CONNECTIONS
    }

    /// Blocks up to [`SLOT_WAIT`] until a slot is free (see there); returns at once when one
    /// is, or when an earlier wait already found the cap really held.
    fn wait_for_slot(&self) {
        let conns = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        if conns.len() < MAX_OPEN_CONNECTIONS || self.saturated.load(Ordering::SeqCst) {
            return;
        }
        let (_conns, waited) = self
            .slot_freed
            .wait_timeout_while(conns, SLOT_WAIT, |c| c.len() >= MAX_OPEN_CONNECTIONS)
            .unwrap_or_else(|p| p.into_inner());
        if waited.timed_out() {
            self.saturated.store(true, Ordering::SeqCst);
        }
    }

    /// Registers a new connection unless the execution is at [`MAX_OPEN_CONNECTIONS`]: makes
    /// its writer (a second descriptor of the stream, shared by the replies of calls in flight)
    /// and records it so [`ChannelState::close_all`] can shut it down. The guard unregisters it
    /// when dropped.
    fn register(
        self: &Arc<Self>,
        stream: &UnixStream,
    ) -> Result<(Registration, Writer), ProtocolError> {
        let mut conns = self.connections.lock().unwrap_or_else(|p| p.into_inner());
        if conns.len() >= MAX_OPEN_CONNECTIONS {
            return Err(ProtocolError::TooManyConnections {
                limit: MAX_OPEN_CONNECTIONS,
            });
        }
        let write_half = stream.try_clone().map_err(|e| {
            ProtocolError::Internal(format!("cannot duplicate the connection: {e}"))
        })?;
        let writer: Writer = Arc::new(Mutex::new(Some(write_half)));
        let id = self.next_connection.fetch_add(1, Ordering::Relaxed);
        conns.insert(id, Arc::clone(&writer));
        let registration = Registration {
            state: Arc::clone(self),
            id,
        };
        Ok((registration, writer))
    }

    /// Whether a call to `tool` is answered inline on the connection thread: refusals and
    /// bounded local tools are; anything that may wait goes to the blocking pool.
    /// A call past the budget is a refusal, answered inline too: at the socket's pace.
    /// `entry` is what the registry holds under the name ([`ToolRegistry::get`]), looked up once
    /// for this and [`Self::answer`].
    fn answers_inline(&self, tool: &str, entry: Option<&Arc<ToolEntry>>) -> bool {
        !self.allowed.contains(tool)
            || self.calls_made.load(Ordering::SeqCst) >= self.max_tool_calls
            || entry.is_some_and(|e| e.bounded)
    }

    /// Answers one request whose token was checked; returns the result as JSON text. `entry`
    /// is the registry's entry for `tool` ([`ToolRegistry::get`]): the one checked here is the
    /// one called.
    fn answer(
        &self,
        tool: &str,
        entry: Option<Arc<ToolEntry>>,
        mut args: Map<String, Value>,
    ) -> String {
        if SCRIPT_BLOCKED_TOOLS.contains(&tool) || !self.allowed.contains(tool) {
            let available: Vec<&str> = self.allowed.iter().map(String::as_str).collect();
            let why = if SCRIPT_BLOCKED_TOOLS.contains(&tool) {
                "can never be called from execute_code scripts"
            } else {
                "is not available in execute_code scripts"
            };
            return json!({
                "error": format!(
                    "Tool `{tool}` {why}. Available: {}",
                    if available.is_empty() { "none".to_string() } else { available.join(", ") }
                )
            })
            .to_string();
        }
        if entry
            .as_ref()
            .is_some_and(|e| self.registry.closed_to_scripts(e))
        {
            return json!({
                "error": format!(
                    "Tool `{tool}` is no longer available to execute_code scripts: the host \
                     closed it to scripts while this one ran"
                )
            })
            .to_string();
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
            })
            .to_string();
        }
        if tool == "terminal" {
            for key in TERMINAL_STRIPPED {
                args.remove(key);
            }
        }
        self.registry
            .handle_function_call_to(entry, tool, &Value::Object(args), &self.context)
    }
}

/// Accepts connections on `listener` until the returned task is aborted; each is served on its
/// own thread after the peer-credential check.
pub fn serve(listener: UnixListener, state: Arc<ChannelState>) -> tokio::task::JoinHandle<()> {
    serve_with(listener, state, true)
}

/// [`serve`], choosing whether peers must pass the credential check. Only a channel that
/// crosses a container or host boundary turns it off: peer credentials mean nothing there, so
/// the token alone authenticates, on a socket reachable only through a private directory or an
/// ssh forward (see docs/backends.md).
pub fn serve_with(
    listener: UnixListener,
    state: Arc<ChannelState>,
    check_peer: bool,
) -> tokio::task::JoinHandle<()> {
    let pool = tokio::runtime::Handle::current();
    tokio::spawn(async move {
        loop {
            // At the cap, leave new connections in the kernel's backlog (no descriptor here)
            // until a slot frees or the wait gives up; then accept, and refuse if still full.
            if state.at_capacity() {
                let waiting = Arc::clone(&state);
                let _ = tokio::task::spawn_blocking(move || waiting.wait_for_slot()).await;
            }
            match listener.accept().await {
                Ok((stream, _)) => match into_blocking(stream) {
                    Ok(s) => serve_stream(s, Arc::clone(&state), check_peer, pool.clone()),
                    Err(e) => {
                        tracing::warn!("execute_code: cannot serve an RPC connection: {e}")
                    }
                },
                Err(e) => {
                    tracing::warn!("execute_code: accepting an RPC connection failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            }
        }
    })
}

/// [`serve_stream`] for a stream the supervisor connected itself (strict mode's socketpair),
/// started only once the script writes to it, until the returned task is aborted. A script that
/// calls no tool then costs no connection thread: starting one for every strict execution put
/// a thread's clone, and its wake-up and exit at the end, on every call's path, where project
/// mode starts one only when its listener accepts.
pub fn serve_when_written(
    stream: UnixStream,
    state: Arc<ChannelState>,
    check_peer: bool,
) -> tokio::task::JoinHandle<()> {
    let pool = tokio::runtime::Handle::current();
    tokio::spawn(async move {
        let ours = match stream
            .set_nonblocking(true)
            .and_then(|()| tokio::net::UnixStream::from_std(stream))
        {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("execute_code: cannot watch the RPC channel: {e}");
                return;
            }
        };
        if let Err(e) = ours.readable().await {
            tracing::warn!("execute_code: watching the RPC channel failed: {e}");
            return;
        }
        // Readable also means closed: a script that ended without a call needs no thread.
        let mut first = [0u8; 1];
        let peeked = nix::sys::socket::recv(
            std::os::fd::AsRawFd::as_raw_fd(&ours),
            &mut first,
            nix::sys::socket::MsgFlags::MSG_PEEK | nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        );
        if matches!(peeked, Ok(0)) {
            return;
        }
        match into_blocking(ours) {
            Ok(s) => serve_stream(s, state, check_peer, pool),
            Err(e) => tracing::warn!("execute_code: cannot serve the RPC channel: {e}"),
        }
    })
}

/// A stream off the runtime's poller, in blocking mode, for a connection thread.
fn into_blocking(stream: tokio::net::UnixStream) -> std::io::Result<UnixStream> {
    let s = stream.into_std()?;
    s.set_nonblocking(false)?;
    Ok(s)
}

/// Serves one connected stream on a new thread. `check_peer` is false only for a stream the
/// supervisor connected itself (a socketpair handed to the child).
pub fn serve_stream(
    stream: UnixStream,
    state: Arc<ChannelState>,
    check_peer: bool,
    pool: tokio::runtime::Handle,
) {
    // A routed stream (ssh) arrives here without the accept loop's wait. From the accept loop
    // this returns at once: that loop already waited, and nothing else adds connections.
    state.wait_for_slot();
    // Registered before its thread starts: the cap then bounds the descriptors and threads
    // connections hold, however fast a script connects and hangs up.
    let (registration, writer) = match state.register(&stream) {
        Ok(r) => r,
        Err(e) => {
            match &e {
                ProtocolError::Internal(_) => tracing::error!("execute_code: {e}"),
                _ => state.log_refusal(&e),
            }
            refuse(stream, &e);
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("vibeos-rpc-conn".into())
        .spawn(move || {
            serve_connection(stream, writer, &state, check_peer, pool);
            drop(registration);
        });
    if let Err(e) = spawned {
        tracing::warn!("execute_code: cannot start a thread for an RPC connection: {e}");
    }
}

/// An open connection's entry in [`ChannelState`]; dropping it forgets the connection.
struct Registration {
    state: Arc<ChannelState>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.state
            .connections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
        self.state.saturated.store(false, Ordering::SeqCst);
        self.state.slot_freed.notify_all();
    }
}

/// Checks that the peer is a process of this execution: `Err(ForeignPeer)` when it is not,
/// `Err(Internal)` when its credentials cannot be read (the supervisor's failure, which
/// must not be reported as the peer's).
fn check_peer_credentials(stream: &UnixStream, state: &ChannelState) -> Result<(), ProtocolError> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    let cred = getsockopt(stream, PeerCredentials)
        .map_err(|e| ProtocolError::Internal(format!("cannot read the peer's credentials: {e}")))?;
    let me = rustix::process::geteuid().as_raw();
    let root = state.root_pid.load(Ordering::SeqCst);
    let pid_ok = cred.pid() > 0
        && root != 0
        && descends_from(cred.pid() as u32, root).map_err(|e| {
            ProtocolError::Internal(format!("cannot check the peer's ancestry in /proc: {e}"))
        })?;
    if cred.uid() == me && pid_ok {
        Ok(())
    } else {
        Err(ProtocolError::ForeignPeer)
    }
}

/// Answers `error` on a connection that will not be served, and closes it.
fn refuse(mut stream: UnixStream, error: &ProtocolError) {
    let _ = stream.write_all(&encode_error(None, error));
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

type Writer = Arc<Mutex<Option<UnixStream>>>;

/// Writes one frame whole; `close` shuts the connection after it.
fn send(writer: &Writer, frame: &[u8], close: bool) {
    let mut guard = writer.lock().unwrap_or_else(|p| p.into_inner());
    let Some(w) = guard.as_mut() else { return };
    let failed = w.write_all(frame).is_err();
    if close || failed {
        if let Some(w) = guard.take() {
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Reads one frame (without its newline) into `buf`. `Ok(false)` at end of stream.
fn read_frame(reader: &mut impl BufRead, buf: &mut Vec<u8>) -> Result<bool, ProtocolError> {
    buf.clear();
    let n = reader
        .by_ref()
        .take(MAX_FRAME_BYTES as u64 + 1)
        .read_until(b'\n', buf)
        .map_err(|_| ProtocolError::NotJson("the connection failed mid-frame".into()))?;
    if n == 0 {
        return Ok(false);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
    } else if buf.len() > MAX_FRAME_BYTES {
        return Err(ProtocolError::TooLarge {
            limit: MAX_FRAME_BYTES,
        });
    }
    Ok(true)
}

/// How long a connection thread polls for the script's next call before it blocks in `read`.
///
/// A script calling tools in a loop sends its next call a few microseconds after it reads a
/// reply. A thread blocked in `read` then has to be woken, and on a VM waking a thread on
/// another (idle) CPU costs an interrupt to that CPU, about 10 us here: a third of a
/// `read_file` round trip. Polling this long first catches the next call without that wake-up
/// (docs/rpc-channel.md has the figures). Longer would burn more CPU for scripts that pause
/// between calls; shorter would miss a loop whose Python side takes more than this.
const POLL_WINDOW: std::time::Duration = std::time::Duration::from_micros(30);

/// Whether the script is calling tools back to back, which is when polling for its next call
/// pays: only after a call that came within twice [`POLL_WINDOW`] of the reply before it
/// (twice, so a call that missed the window because the thread had blocked, and paid the
/// wake-up, still counts). A script that pauses between calls is never polled for, so an idle
/// or slow script costs the supervisor no CPU.
#[derive(Default)]
struct CallPace {
    /// When the last inline reply was written; None before the first and after a call that
    /// went to the blocking pool.
    last_reply: Option<std::time::Instant>,
    /// Whether the last call came soon enough after the reply before it.
    back_to_back: bool,
}

impl CallPace {
    fn expects_next_call_soon(&self) -> bool {
        self.back_to_back
    }

    fn call_arrived(&mut self, now: std::time::Instant) {
        self.back_to_back = self
            .last_reply
            .is_some_and(|sent| now.saturating_duration_since(sent) <= 2 * POLL_WINDOW);
    }

    fn replied(&mut self, now: std::time::Instant) {
        self.last_reply = Some(now);
    }

    fn went_async(&mut self) {
        self.last_reply = None;
        self.back_to_back = false;
    }
}

/// The connection's read side. Its first read after `poll_first` was set polls without blocking
/// for up to [`POLL_WINDOW`], yielding the CPU between tries (a script on this same CPU then
/// gets it to send its call rather than wait out the window); after that, or when nothing came,
/// reads block as usual. Polling with the read itself, not a peek before it, costs no syscall
/// beyond the read when the call is already there.
struct Incoming {
    stream: UnixStream,
    poll_first: bool,
}

impl Read for Incoming {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if std::mem::take(&mut self.poll_first) {
            use nix::sys::socket::{recv, MsgFlags};
            use std::os::fd::AsRawFd;
            let deadline = std::time::Instant::now() + POLL_WINDOW;
            loop {
                match recv(self.stream.as_raw_fd(), buf, MsgFlags::MSG_DONTWAIT) {
                    Ok(n) => return Ok(n),
                    Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(e.into()),
                }
                if std::time::Instant::now() >= deadline {
                    break;
                }
                std::thread::yield_now();
            }
        }
        self.stream.read(buf)
    }
}

fn serve_connection(
    stream: UnixStream,
    writer: Writer,
    state: &Arc<ChannelState>,
    check_peer: bool,
    pool: tokio::runtime::Handle,
) {
    if check_peer {
        if let Err(e) = check_peer_credentials(&stream, state) {
            match &e {
                ProtocolError::ForeignPeer => state.log_refusal(
                    &"refused an RPC connection from a process that is not (or no longer) one of the execution's",
                ),
                other => tracing::error!("execute_code: {other}"),
            }
            send(&writer, &encode_error(None, &e), true);
            return;
        }
    }
    let mut reader = BufReader::with_capacity(
        64 * 1024,
        Incoming {
            stream,
            poll_first: false,
        },
    );
    let mut frame = Vec::with_capacity(4096);
    let mut pace = CallPace::default();
    loop {
        reader.get_mut().poll_first = pace.expects_next_call_soon();
        match read_frame(&mut reader, &mut frame) {
            Ok(true) => pace.call_arrived(std::time::Instant::now()),
            Ok(false) => break,
            Err(e) => {
                send(&writer, &encode_error(None, &e), true);
                break;
            }
        }
        if frame.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let request = match decode_request(&frame) {
            Ok(r) => r,
            Err((id, e)) => {
                let close = e.closes_connection();
                send(&writer, &encode_error(id.as_ref(), &e), close);
                if close {
                    break;
                }
                continue;
            }
        };
        // Constant time: how long a refusal takes must not tell a guesser how much it got right.
        if !bool::from(request.token.as_bytes().ct_eq(state.token.as_bytes())) {
            tracing::warn!("execute_code: refused an RPC request with a wrong token");
            send(
                &writer,
                &encode_error(Some(&request.id), &ProtocolError::BadToken),
                true,
            );
            break;
        }
        let entry = state.registry.get(&request.tool);
        if state.answers_inline(&request.tool, entry.as_ref()) {
            let result = state.answer(&request.tool, entry, request.args);
            send(&writer, &encode_response_json(&request.id, &result), false);
            pace.replied(std::time::Instant::now());
        } else {
            // The script waits for this reply, not to send: nothing to poll for meanwhile.
            pace.went_async();
            let Some(slot) = state.take_call_slot() else {
                break;
            };
            let state = Arc::clone(state);
            let writer = Arc::clone(&writer);
            pool.spawn_blocking(move || {
                let result = state.answer(&request.tool, entry, request.args);
                send(&writer, &encode_response_json(&request.id, &result), false);
                drop(slot);
            });
        }
    }
}

/// One call's place among the [`MAX_CALLS_IN_FLIGHT`]; freed when dropped, however the call
/// ends.
struct CallSlot(Arc<ChannelState>);

impl Drop for CallSlot {
    fn drop(&mut self) {
        let mut count = self.0.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        *count = count.saturating_sub(1);
        self.0.call_done.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polling_is_only_for_calls_that_come_back_to_back() {
        let t0 = std::time::Instant::now();
        let at = |us: u64| t0 + std::time::Duration::from_micros(us);
        let mut pace = CallPace::default();
        pace.call_arrived(at(0));
        assert!(
            !pace.expects_next_call_soon(),
            "the first call has no reply before it"
        );
        pace.replied(at(10));
        pace.call_arrived(at(20));
        assert!(pace.expects_next_call_soon(), "a call right after a reply");
        pace.replied(at(30));
        pace.call_arrived(at(30) + 2 * POLL_WINDOW + std::time::Duration::from_micros(1));
        assert!(!pace.expects_next_call_soon(), "a call after a pause");
        pace.replied(at(1000));
        pace.call_arrived(at(1010));
        pace.went_async();
        assert!(
            !pace.expects_next_call_soon(),
            "a call answered off the thread: the script waits, it does not send"
        );
        pace.call_arrived(at(1020));
        assert!(!pace.expects_next_call_soon(), "no reply written since");
    }

    #[test]
    fn frames_are_bounded() {
        let mut buf = Vec::new();
        let mut ok = std::io::Cursor::new(b"{\"a\":1}\nrest".to_vec());
        assert_eq!(read_frame(&mut ok, &mut buf), Ok(true));
        assert_eq!(buf, b"{\"a\":1}");
        assert_eq!(read_frame(&mut ok, &mut buf), Ok(true));
        assert_eq!(buf, b"rest");
        assert_eq!(read_frame(&mut ok, &mut buf), Ok(false));
        let mut big = std::io::Cursor::new(vec![b'x'; MAX_FRAME_BYTES + 10]);
        assert!(matches!(
            read_frame(&mut big, &mut buf),
            Err(ProtocolError::TooLarge { .. })
        ));
    }
}
