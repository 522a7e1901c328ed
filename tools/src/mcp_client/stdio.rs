//! The stdio transport of an MCP server: its child process, its stdout read through a guard,
//! and a bounded shutdown.
//!
//! rmcp's `TokioChildProcess` does most of this, but three of its choices are wrong here:
//! - a message over its line limit (16 MiB) is dropped with a log line, and the call waiting for
//!   it learns nothing until its own timeout (60 s), then blames the server for being slow.
//!   [`LineGuard`] ends such a line early and hands rmcp, for the same request id, a JSON-RPC
//!   error saying the answer was too large, so the call fails at once with the reason;
//! - its shutdown waits 3 s after closing stdin, then sends SIGTERM and waits 3 s more: a server
//!   that ignores both held every `tools list` or `run` 6 s at exit, where the process group is
//!   SIGKILLed after [`STOP_GRACE`] here;
//! - a spawn that fails with ENOENT may be a missing `cwd` as well as a missing command; the
//!   directory is checked first so the error names the right one.
//!
//! Likewise a response that is not JSON text (bytes that are not UTF-8, an escaped lone UTF-16
//! surrogate such as `\ud800`): rmcp drops it as it drops a stray line, and its call waited out
//! its timeout to be told the server was slow. [`TextCheck`] notices, and the call gets an
//! error for its id at once.
//!
//! A line on stdout that is not JSON (a start-up banner, stray `print`s) is skipped, as rmcp and
//! the other official SDKs do: such servers are common and otherwise work. It is logged (info,
//! the first few per connection) so the operator can see why a server that only ever writes
//! such lines never completes its handshake.

use process_wrap::tokio::{ChildWrapper, CommandWrap, KillOnDrop, ProcessGroup};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::Transport;
use rmcp::RoleClient;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};

/// Largest message accepted from a server: rmcp's own default line limit (it matches the
/// streamable HTTP client's event limit, so stdio and HTTP servers are held to the same size).
pub const MAX_MESSAGE_BYTES: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;

/// How long a stopped server gets to exit after its stdin is closed before its process group
/// is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// Key of the `data` object of the error [`LineGuard`] puts in place of a response that was too
/// large; its value is the limit in bytes.
pub(crate) const TOO_LARGE_KEY: &str = "vibeos/response_too_large";

/// Non-JSON lines of one connection that are logged; later ones are only counted.
const LOGGED_STRAY_LINES: usize = 3;

/// How much of a stray line is logged.
const STRAY_LINE_SHOWN: usize = 200;

/// A started stdio server: the transport rmcp drives, its stderr (to forward to the log) and
/// its pid (the leader of its process group).
pub(crate) struct Spawned {
    pub transport: ChildTransport,
    pub stderr: Option<ChildStderr>,
    pub pid: Option<u32>,
}

/// Starts `command` with `args` in its own process group, with exactly `env` when given, in
/// `cwd` when given. The error says what to fix.
pub(crate) fn spawn(
    label: &str,
    command: &str,
    args: &[String],
    env: Option<&[(String, String)]>,
    cwd: Option<&std::path::Path>,
) -> Result<Spawned, String> {
    if let Some(dir) = cwd {
        // Checked first: a spawn in a missing directory fails with the same ENOENT as a missing
        // command, and would be reported as one.
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(format!("its cwd {} is not a directory", dir.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(format!("its cwd {} does not exist", dir.display()))
            }
            Err(e) => return Err(format!("its cwd {} cannot be used: {e}", dir.display())),
        }
    }
    let mut cmd = tokio::process::Command::new(command);
    cmd.args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(env) = env {
        cmd.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
    }
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    // The server leads its own process group, and dropping the handle kills it: whatever the
    // server started dies with it, without polling pids.
    let mut wrapped = CommandWrap::from(cmd);
    wrapped.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
    let mut child = wrapped.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            format!("command `{command}` was not found (is it installed and on PATH?)")
        }
        std::io::ErrorKind::PermissionDenied => {
            format!("command `{command}` cannot be run (permission denied; is it executable?)")
        }
        _ => format!("cannot start `{command}`: {e}"),
    })?;
    let pid = child.id();
    let (Some(stdin), Some(stdout)) = (child.stdin().take(), child.stdout().take()) else {
        // Both were asked for as pipes above; without them there is no protocol to speak.
        let _ = child.start_kill();
        return Err(format!(
            "cannot talk to `{command}`: its stdin or stdout is not a pipe"
        ));
    };
    let stderr = child.stderr().take();
    let guard = LineGuard::new(label.to_string(), stdout, MAX_MESSAGE_BYTES);
    // rmcp's own limit sits one byte above ours (it counts the newline): every line reaches it
    // within it, having been cut here first.
    let inner =
        AsyncRwTransport::new_client(guard, stdin).with_max_line_length(MAX_MESSAGE_BYTES + 1);
    Ok(Spawned {
        transport: ChildTransport {
            child: Some(child),
            inner,
        },
        stderr,
        pid,
    })
}

/// rmcp's line transport over the child's pipes, owning the child.
pub(crate) struct ChildTransport {
    child: Option<Box<dyn ChildWrapper>>,
    inner: AsyncRwTransport<RoleClient, LineGuard<ChildStdout>, ChildStdin>,
}

impl Transport<RoleClient> for ChildTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    fn receive(
        &mut self,
    ) -> impl std::future::Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.inner.receive()
    }

    /// Closes the server's stdin (the MCP stdio shutdown), gives it [`STOP_GRACE`] to exit,
    /// then kills its process group.
    async fn close(&mut self) -> Result<(), Self::Error> {
        let closed = self.inner.close().await;
        if let Some(mut child) = self.child.take() {
            if tokio::time::timeout(STOP_GRACE, child.wait())
                .await
                .is_err()
            {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
        closed
    }
}

impl Drop for ChildTransport {
    fn drop(&mut self) {
        // Not closed (the session was dropped): kill the group now. The kill-on-drop flag then
        // lets tokio reap the leader in the background.
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
        }
    }
}

/// The child's stdout as rmcp reads it, line by line within [`MAX_MESSAGE_BYTES`]: a longer line
/// is cut (rmcp gets a truncated line, which it drops as unparsable) and, once it ends, an error
/// response for its request id takes its place. Non-JSON lines are logged.
pub(crate) struct LineGuard<R> {
    inner: R,
    label: String,
    limit: usize,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// Bytes of the current line handed on (or, while discarding, seen).
    line_len: usize,
    /// The current line is over the limit: its rest is read and dropped.
    discarding: bool,
    /// The first non-blank byte of the current line, once seen.
    first: Option<u8>,
    /// The beginning of the current line, for the log if it is not JSON.
    head: Vec<u8>,
    stray_lines: usize,
    id: IdScan,
    text: TextCheck,
    /// Bytes to hand on before reading more (a cut line's newline, an error response).
    pending: Vec<u8>,
    pending_at: usize,
}

impl<R> LineGuard<R> {
    fn new(label: String, inner: R, limit: usize) -> Self {
        LineGuard {
            inner,
            label,
            limit,
            buf: vec![0; 64 * 1024].into_boxed_slice(),
            start: 0,
            end: 0,
            line_len: 0,
            discarding: false,
            first: None,
            head: Vec::new(),
            stray_lines: 0,
            id: IdScan::default(),
            text: TextCheck::default(),
            pending: Vec::new(),
            pending_at: 0,
        }
    }

    /// Notes `bytes` of the current line (not its newline).
    fn observe(&mut self, bytes: &[u8]) {
        if self.first.is_none() {
            self.first = bytes.iter().copied().find(|b| !b.is_ascii_whitespace());
        }
        if self.head.len() < STRAY_LINE_SHOWN {
            let room = STRAY_LINE_SHOWN - self.head.len();
            self.head.extend_from_slice(&bytes[..bytes.len().min(room)]);
        }
        self.id.feed(bytes);
        self.text.feed(bytes);
    }

    /// The current line ended (its newline was read).
    fn line_ended(&mut self) {
        if self.discarding || self.line_len > self.limit {
            self.too_large();
        } else if let Some(why) = self.first.filter(|b| *b == b'{').and(self.text.fault()) {
            self.not_text(why);
        } else if self.first.is_some_and(|b| b != b'{' && b != b'[') {
            self.stray_lines += 1;
            if self.stray_lines <= LOGGED_STRAY_LINES {
                let text = String::from_utf8_lossy(&self.head);
                tracing::info!(
                    "{}: ignored a line on stdout that is not JSON-RPC (a server must write only \
                     MCP messages there){}: {}",
                    self.label,
                    if self.stray_lines == LOGGED_STRAY_LINES {
                        "; further ones are not logged"
                    } else {
                        ""
                    },
                    text.trim_end()
                );
            }
        }
        self.line_len = 0;
        self.discarding = false;
        self.first = None;
        self.head.clear();
        self.id = IdScan::default();
        self.text = TextCheck::default();
    }

    /// The line just ended is not JSON text, so rmcp drops it: answer the request it was the
    /// response to with an error saying so. (A response only: a server's own request, which
    /// has a `method`, has an id of the server's numbering. Were the line fine after all, the
    /// call already has its answer and the error, for an id no longer awaited, is dropped.)
    fn not_text(&mut self, why: &str) {
        let error = serde_json::json!({
            "code": -32603,
            "message": format!(
                "the server's response was not JSON text ({why}), so it could not be read; the \
                 server must send UTF-8 and escape only valid characters"
            ),
        });
        if self.answer_in_its_place(&error) {
            tracing::warn!(
                "{}: a response was not JSON text ({why}); its call fails",
                self.label
            );
        } else {
            tracing::warn!(
                "{}: sent a message that is not JSON text ({why}); it was discarded",
                self.label
            );
        }
    }

    /// Hands rmcp, after the line just ended, `error` as the response to the request that line
    /// answered, when it answered one (it has an id and no `method`: a server's own request
    /// has an id of the server's numbering). Whether it did.
    fn answer_in_its_place(&mut self, error: &serde_json::Value) -> bool {
        let Some(id) = self.id.found().filter(|_| !self.id.method) else {
            return false;
        };
        // `id` is the raw JSON of the request's id (a number or a string), as sent.
        let line = format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{error}}}"#);
        self.pending.extend_from_slice(line.as_bytes());
        self.pending.push(b'\n');
        true
    }

    /// The line just ended was over the limit: answer its request with an error, or say in the
    /// log that a message was dropped when it had no id to answer.
    fn too_large(&mut self) {
        let mib = self.limit >> 20;
        let error = serde_json::json!({
            "code": -32603,
            "message": format!(
                "the response was larger than {mib} MiB, the largest MCP message accepted; it \
                 was discarded"
            ),
            "data": { TOO_LARGE_KEY: self.limit },
        });
        if self.answer_in_its_place(&error) {
            tracing::warn!(
                "{}: a response was larger than {mib} MiB, the largest MCP message accepted; it \
                 was discarded and its call fails",
                self.label
            );
        } else {
            tracing::warn!(
                "{}: sent a message larger than {mib} MiB, the largest MCP message accepted, \
                 with no request id; it was discarded",
                self.label
            );
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LineGuard<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.pending_at < this.pending.len() {
                let n = (this.pending.len() - this.pending_at).min(out.remaining());
                out.put_slice(&this.pending[this.pending_at..this.pending_at + n]);
                this.pending_at += n;
                if this.pending_at == this.pending.len() {
                    this.pending.clear();
                    this.pending_at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if out.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if this.start == this.end {
                let mut read = ReadBuf::new(&mut this.buf);
                match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Ready(Ok(())) => {}
                }
                let n = read.filled().len();
                if n == 0 {
                    // EOF: `out` stays empty, which tells the reader.
                    return Poll::Ready(Ok(()));
                }
                this.start = 0;
                this.end = n;
            }
            let chunk_len = this.end - this.start;
            let newline = this.buf[this.start..this.end]
                .iter()
                .position(|b| *b == b'\n');
            let body = newline.unwrap_or(chunk_len);
            if this.discarding {
                let chunk = this.buf[this.start..this.start + body].to_vec();
                this.id.feed(&chunk);
                this.line_len = this.line_len.saturating_add(body);
                this.start += newline.map_or(body, |i| i + 1);
                if newline.is_some() {
                    this.line_ended();
                }
                continue;
            }
            if this.line_len + body > this.limit {
                // Over the limit: nothing more of this line goes on. The newline ends what rmcp
                // holds of it (a truncated message, which it drops).
                let chunk = this.buf[this.start..this.start + body].to_vec();
                this.id.feed(&chunk);
                this.line_len = this.line_len.saturating_add(body);
                this.discarding = true;
                this.pending.push(b'\n');
                this.start += newline.map_or(body, |i| i + 1);
                if newline.is_some() {
                    this.line_ended();
                }
                continue;
            }
            // Within the limit: hand on as much of the line (and its newline) as fits.
            let with_newline = newline.map_or(body, |i| i + 1);
            let n = with_newline.min(out.remaining());
            let taken = this.buf[this.start..this.start + n].to_vec();
            out.put_slice(&taken);
            this.start += n;
            let line_part = n.min(body);
            this.observe(&taken[..line_part]);
            this.line_len += line_part;
            if n == with_newline && newline.is_some() {
                this.line_ended();
            }
            return Poll::Ready(Ok(()));
        }
    }
}

/// Finds the top-level `"id"` of a JSON object streamed through it, as raw JSON text (a number
/// or a string): enough to answer the request a too-large response was for without holding the
/// response. Members are tracked by nesting depth and string state, so an `"id"` inside the
/// result does not count, wherever the top-level one comes (first or last).
#[derive(Default)]
struct IdScan {
    depth: u32,
    in_string: bool,
    escaped: bool,
    /// At depth 1, a key is expected next (after `{` or `,`).
    want_key: bool,
    /// Reading a depth-1 key into `key`.
    in_key: bool,
    key: Vec<u8>,
    /// The key just read was `id`: its value comes after the `:`.
    id_key: bool,
    /// After `"id":`, the value starts at the next non-blank byte.
    want_value: bool,
    /// Reading the id's value into `value` (`quoted` for a string).
    in_value: bool,
    quoted: bool,
    value: Vec<u8>,
    found: Option<Vec<u8>>,
    /// A top-level `method` key was seen: the message is a request or a notification.
    method: bool,
}

/// Longest id kept; a longer one is not answered.
const MAX_ID_BYTES: usize = 256;

impl IdScan {
    fn found(&self) -> Option<String> {
        let raw = self.found.as_ref()?;
        let text = std::str::from_utf8(raw).ok()?;
        // Only what parses as a JSON number or string is sent back.
        match serde_json::from_str::<serde_json::Value>(text).ok()? {
            serde_json::Value::Number(_) | serde_json::Value::String(_) => Some(text.to_string()),
            _ => None,
        }
    }

    fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    fn keep(&mut self, b: u8) {
        if self.value.len() <= MAX_ID_BYTES {
            self.value.push(b);
        }
    }

    fn finish_value(&mut self) {
        self.in_value = false;
        if self.found.is_none() && self.value.len() <= MAX_ID_BYTES {
            self.found = Some(std::mem::take(&mut self.value));
        }
    }

    fn byte(&mut self, b: u8) {
        if self.in_value && self.quoted {
            self.keep(b);
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.finish_value();
            }
            return;
        }
        if self.in_value {
            if b == b',' || b == b'}' || b.is_ascii_whitespace() {
                self.finish_value();
                // The byte also ends the member: fall through to the structure below.
            } else {
                self.keep(b);
                return;
            }
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
                if self.in_key {
                    self.key.push(b);
                }
            } else if b == b'\\' {
                self.escaped = true;
                if self.in_key {
                    self.key.push(b);
                }
            } else if b == b'"' {
                self.in_string = false;
                if self.in_key {
                    self.in_key = false;
                    self.id_key = self.key == b"id";
                    self.method |= self.key == b"method";
                }
            } else if self.in_key && self.key.len() < 8 {
                self.key.push(b);
            } else if self.in_key {
                // Longer than `id`: just not it.
                self.key.push(b'x');
                self.key.truncate(8);
            }
            return;
        }
        if self.want_value && !b.is_ascii_whitespace() {
            self.want_value = false;
            match b {
                b'"' => {
                    self.in_value = true;
                    self.quoted = true;
                    self.value = vec![b];
                    return;
                }
                b'{' | b'[' => {}
                _ => {
                    self.in_value = true;
                    self.quoted = false;
                    self.value = vec![b];
                    return;
                }
            }
        }
        match b {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.want_key {
                    self.want_key = false;
                    self.in_key = true;
                    self.key.clear();
                }
            }
            b'{' | b'[' => {
                self.depth += 1;
                if b == b'{' && self.depth == 1 {
                    self.want_key = true;
                }
            }
            b'}' | b']' => self.depth = self.depth.saturating_sub(1),
            b',' if self.depth == 1 => self.want_key = true,
            b':' if self.depth == 1 => {
                self.want_value = self.id_key;
                self.id_key = false;
            }
            _ => {}
        }
    }
}

/// What makes a line not JSON text, if anything does.
const NOT_UTF8: &str = "it is not UTF-8";
const LONE_SURROGATE: &str = "an escaped lone UTF-16 surrogate";

/// Whether one line is JSON *text*, fed as it streams by: UTF-8, and no `\uXXXX` escape of a
/// UTF-16 surrogate that is not half of a pair (serde_json, and so rmcp, refuses both).
#[derive(Default)]
struct TextCheck {
    /// The bytes of a UTF-8 sequence a chunk ended inside.
    carry: Vec<u8>,
    fault: Option<&'static str>,
    /// The next byte is escaped (an odd run of backslashes so far).
    escaping: bool,
    /// After `\u`, the hex digits read so far.
    hex: Option<Vec<u8>>,
    /// The last escape was a high surrogate: `\u` and a low one must follow at once.
    high: bool,
    /// Bytes seen since that high surrogate.
    after_high: u8,
}

impl TextCheck {
    fn fault(&self) -> Option<&'static str> {
        match self.fault {
            Some(f) => Some(f),
            None if !self.carry.is_empty() => Some(NOT_UTF8),
            None if self.high => Some(LONE_SURROGATE),
            None => None,
        }
    }

    fn feed(&mut self, bytes: &[u8]) {
        if self.fault.is_some() {
            return;
        }
        let mut joined = std::mem::take(&mut self.carry);
        joined.extend_from_slice(bytes);
        match std::str::from_utf8(&joined) {
            Ok(_) => {}
            // The chunk ended inside a character: the rest comes with the next one.
            Err(e) if e.error_len().is_none() => self.carry = joined[e.valid_up_to()..].to_vec(),
            Err(_) => {
                self.fault = Some(NOT_UTF8);
                return;
            }
        }
        for &b in bytes {
            self.byte(b);
        }
    }

    fn byte(&mut self, b: u8) {
        if let Some(hex) = &mut self.hex {
            hex.push(b);
            if hex.len() < 4 {
                return;
            }
            let code = std::str::from_utf8(hex)
                .ok()
                .and_then(|h| u16::from_str_radix(h, 16).ok());
            self.hex = None;
            let low = matches!(code, Some(0xDC00..=0xDFFF));
            match code {
                Some(0xD800..=0xDBFF) if !self.high => {
                    self.high = true;
                    self.after_high = 0;
                }
                _ if low == self.high => self.high = false,
                _ => self.fault = Some(LONE_SURROGATE),
            }
            return;
        }
        if self.high {
            // Only `\u` may come between a high surrogate and its low half.
            self.after_high += 1;
            let fits = (self.after_high == 1 && b == b'\\') || (self.after_high == 2 && b == b'u');
            if !fits {
                self.fault = Some(LONE_SURROGATE);
                return;
            }
        }
        if self.escaping {
            self.escaping = false;
            if b == b'u' {
                self.hex = Some(Vec::with_capacity(4));
            }
        } else if b == b'\\' {
            self.escaping = true;
        }
    }
}

/// Logs what a stdio server writes to stderr, line by line, under its label: at warn when the
/// line looks like an error, else at info.
pub(crate) async fn forward_stderr(label: String, stderr: tokio::process::ChildStderr) {
    each_stderr_line(stderr, MAX_STDERR_LINE, |line| {
        let lower = line.to_ascii_lowercase();
        if ["error", "warning", "traceback", "exception"]
            .iter()
            .any(|w| lower.contains(w))
        {
            tracing::warn!("{label}: {line}");
        } else {
            tracing::info!("{label}: {line}");
        }
    })
    .await;
}

/// The longest stderr line of a server kept for the log; the rest of a longer one is counted.
const MAX_STDERR_LINE: usize = 8 * 1024;

/// Calls `on_line` with each line `reader` gives until its end, as text (invalid UTF-8
/// replaced) cut at `max` bytes with a note of how much was left out. Memory stays bounded
/// however long a line is (a server once wrote 400 MB without a newline, and the CLI held it
/// all), and bytes that are not UTF-8 do not stop the reading (which would leave the server
/// blocked on a full pipe).
async fn each_stderr_line<R: tokio::io::AsyncRead + Unpin>(
    mut reader: R,
    max: usize,
    mut on_line: impl FnMut(String),
) {
    use tokio::io::AsyncReadExt;
    let mut line: Vec<u8> = Vec::new();
    let mut dropped = 0usize;
    let mut buf = vec![0u8; 16 * 1024];
    let mut emit = |line: &mut Vec<u8>, dropped: &mut usize| {
        let mut text = String::from_utf8_lossy(line).into_owned();
        if *dropped > 0 {
            text.push_str(&format!(
                " … ({} more bytes of this line left out)",
                *dropped
            ));
        }
        line.clear();
        *dropped = 0;
        on_line(text);
    };
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for &b in &buf[..n] {
            if b == b'\n' {
                emit(&mut line, &mut dropped);
            } else if line.len() < max {
                line.push(b);
            } else {
                dropped += 1;
            }
        }
    }
    if !line.is_empty() || dropped > 0 {
        emit(&mut line, &mut dropped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn stderr_lines_are_cut_and_never_stop_the_reading() {
        let mut input = b"short\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 100_000));
        input.extend(b"\nnot \xff utf-8\ntail without newline");
        let mut lines = Vec::new();
        each_stderr_line(input.as_slice(), 16, |l| lines.push(l)).await;
        assert_eq!(lines[0], "short");
        assert_eq!(
            lines[1],
            format!(
                "{} … (99984 more bytes of this line left out)",
                "x".repeat(16)
            )
        );
        assert_eq!(lines[2], "not \u{fffd} utf-8");
        assert_eq!(
            lines[3],
            "tail without new … (4 more bytes of this line left out)"
        );
        assert_eq!(lines.len(), 4);
    }

    fn id_of(json: &str) -> Option<String> {
        let mut s = IdScan::default();
        s.feed(json.as_bytes());
        s.found()
    }

    fn fault_of(line: &[u8], chunk: usize) -> Option<&'static str> {
        let mut t = TextCheck::default();
        for part in line.chunks(chunk) {
            t.feed(part);
        }
        t.fault()
    }

    #[test]
    fn lines_that_are_not_json_text_are_told_apart_whatever_the_chunks() {
        for chunk in [1, 2, 3, 1000] {
            for fine in [
                &br#"{"id":1,"result":{"text":"caf\u00e9 \ud83d\ude00 \\ud800"}}"#[..],
                "{\"text\":\"é😀\"}".as_bytes(),
            ] {
                assert_eq!(fault_of(fine, chunk), None, "{chunk}");
            }
            for (bad, why) in [
                (&b"{\"text\":\"A\xff\xfeB\"}"[..], NOT_UTF8),
                (&br#"{"text":"X\ud800Y"}"#[..], LONE_SURROGATE),
                (&br#"{"text":"\udc00"}"#[..], LONE_SURROGATE),
                (&br#"{"text":"\ud800"}"#[..], LONE_SURROGATE),
                (&br#"{"text":"\ud800\u0041"}"#[..], LONE_SURROGATE),
                (&br#"{"text":"\ud800\ud800"}"#[..], LONE_SURROGATE),
                (&b"{\"text\":\"\xe2\x82\"}"[..], NOT_UTF8),
            ] {
                assert_eq!(fault_of(bad, chunk), Some(why), "{chunk}: {bad:?}");
            }
        }
    }

    #[test]
    fn a_response_that_is_not_json_text_becomes_an_error_for_its_id() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let input = b"{\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{\"t\":\"A\xffB\"}}\n\
                      {\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"x\",\"params\":{\"t\":\"\\ud800\"}}\n\
                      {\"id\":5}\n";
        let out = rt.block_on(through(input, 1 << 20));
        let text = String::from_utf8_lossy(&out);
        let lines: Vec<&str> = text.split('\n').collect();
        // The line itself (rmcp drops it), then the error for id 9; the server's own request
        // (it has a method) gets no made-up response.
        let error: serde_json::Value =
            serde_json::from_str(lines[1]).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(error["id"], 9);
        assert!(error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not JSON text (it is not UTF-8)")));
        assert!(lines[2].contains("\"method\""), "{text}");
        assert_eq!(lines[3], "{\"id\":5}");
    }

    #[test]
    fn the_top_level_id_is_found_wherever_it_is() {
        assert_eq!(
            id_of(r#"{"jsonrpc":"2.0","id":7,"result":{"id":99}}"#).as_deref(),
            Some("7")
        );
        assert_eq!(
            id_of(r#"{"result":{"id":99,"x":"\"id\":5"},"jsonrpc":"2.0","id":"a\"b"}"#).as_deref(),
            Some(r#""a\"b""#)
        );
        assert_eq!(id_of(r#"{ "id" : 12 }"#).as_deref(), Some("12"));
        assert_eq!(id_of(r#"{"method":"x","params":{"id":1}}"#), None);
        assert_eq!(id_of(r#"{"identity":1}"#), None);
        assert_eq!(id_of(r#"{"id":{"nested":1}}"#), None);
    }

    async fn through(input: &[u8], limit: usize) -> Vec<u8> {
        let mut guard = LineGuard::new("test".into(), input, limit);
        let mut out = Vec::new();
        let mut chunk = [0u8; 7];
        loop {
            let n = guard.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            out.extend_from_slice(&chunk[..n]);
        }
        out
    }

    #[test]
    fn lines_within_the_limit_pass_and_a_longer_one_becomes_an_error_for_its_id() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let small = b"{\"id\":1,\"result\":{}}\nbanner\n".to_vec();
        assert_eq!(rt.block_on(through(&small, 64)), small);
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":4,\"result\":\"{}\"}}\n{{\"id\":5}}\n",
            "x".repeat(100)
        );
        let out = String::from_utf8(rt.block_on(through(big.as_bytes(), 64)))
            .unwrap_or_else(|e| panic!("{e}"));
        let lines: Vec<&str> = out.split('\n').collect();
        // The cut line (at most the limit), then the error for id 4, then the next message.
        assert!(lines[0].len() <= 64, "{out}");
        let error: serde_json::Value =
            serde_json::from_str(lines[1]).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert_eq!(error["id"], 4);
        assert_eq!(error["error"]["data"][TOO_LARGE_KEY], 64);
        assert_eq!(lines[2], "{\"id\":5}");
    }
}
