//! MCP over stdin/stdout with our own line framing: the SDK's silently drops unparsable and
//! oversized lines, while JSON-RPC asks for an error reply to each.

use crate::handler::{ExecServer, Shared, DRAIN_TIMEOUT};
use crate::inflight::{ConnKey, InFlight};
use crate::jsonrpc::{check_message, id_of_discarded, reply_id, Checked, Rejection};
use crate::{validate, ServeError, ServeSettings};
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, JsonRpcMessage, ServerJsonRpcMessage,
};
use rmcp::service::RoleServer;
use rmcp::transport::Transport;
use rmcp::ServiceExt;
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use vibeos_tools::ToolRegistry;

/// Serves MCP on stdin/stdout until the client closes stdin (or `stop` fires). Every execution
/// of the session is interrupted and cleaned up before this returns.
pub async fn serve_stdio(
    registry: &'static ToolRegistry,
    settings: ServeSettings,
    stop: CancellationToken,
) -> Result<(), ServeError> {
    validate(registry, &settings)?;
    crate::approval::install();
    // One client, one session: its line is the whole queue.
    let shared = Shared::new(registry, settings, crate::handler::MAX_QUEUED_CALLS);
    {
        let shared = shared.clone();
        tokio::task::spawn_blocking(move || shared.warn_idle_toolsets());
    }
    let conn = shared.next_id();
    let closed = CancellationToken::new();
    let (input, output, _blocking_again) = stdio_streams();
    let max = shared.settings.max_request_bytes;
    let (mut transport, writer) = match output {
        Output::Pipe(pipe) => StdioLines::on_pipe(input, pipe, max, closed.clone()),
        Output::Stream(stream) => StdioLines::new(input, stream, max, closed.clone()),
    };
    transport.track_ids(shared.in_flight.clone(), ConnKey::Conn(conn));
    let server = ExecServer::new(shared.clone(), conn);
    // The moment the client is gone (EOF on stdin, or a signal) its executions are stopped,
    // without waiting for the SDK to drain in-flight responses nobody will read.
    {
        let shared = shared.clone();
        let closed = closed.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = closed.cancelled() => {}
                // A signal's stop interrupts them itself, below.
                _ = stop.cancelled() => return,
            }
            let n = shared.interrupt(Some(conn));
            if n > 0 {
                tracing::info!("client gone: interrupted {n} running execution(s)");
            }
        });
    }
    // A signal ends the session once its calls are answered: queued ones are refused ("the
    // server is shutting down"), running ones interrupted, and their results written before
    // the SDK stops. Stopped at once, running calls got no response and queued ones were
    // told they had been "cancelled by the client".
    let session_ct = CancellationToken::new();
    {
        let (shared, stop, session_ct) = (shared.clone(), stop.clone(), session_ct.clone());
        tokio::spawn(async move {
            stop.cancelled().await;
            shared.answer_last_calls(Some(conn)).await;
            session_ct.cancel();
        });
    }
    let running = match server.serve_with_ct(transport, session_ct.clone()).await {
        Ok(running) => running,
        // A signal before the client initialized ends the server as one after it does.
        Err(_) if stop.is_cancelled() => return Ok(()),
        Err(e) => return Err(ServeError::Io(e.to_string())),
    };
    let quit = running.waiting().await;
    tracing::debug!("MCP stdio session ended: {quit:?}");
    shared.interrupt(None);
    shared.wait_idle(None, DRAIN_TIMEOUT).await;
    let _ = writer.await;
    Ok(())
}

type Input = Box<dyn tokio::io::AsyncRead + Unpin + Send>;

/// Where the session's lines go: stdout as a pipe on the runtime's poller, which a reply can be
/// written to at once ([`LineOut`]), or anything else through tokio's own stdout.
enum Output {
    Pipe(tokio::net::unix::pipe::Sender),
    Stream(Box<dyn tokio::io::AsyncWrite + Unpin + Send>),
}

/// stdin and stdout for the session. When they are pipes (as MCP clients start servers), the
/// runtime's own poller drives them: tokio's `stdin()`/`stdout()` hand every read and write to
/// a blocking thread, which cost each request two thread wake-ups, and as many for its reply,
/// each the wake-up of an idle CPU when calls are paced. A terminal or a file keeps tokio's
/// (they cannot be made non-blocking). The returned guard puts the pipes back in blocking mode
/// at the end of the session, for whoever else holds them.
fn stdio_streams() -> (Input, Output, BlockingAgain) {
    use std::os::fd::AsFd;
    let mut switched = BlockingAgain(Vec::new());
    let input: Input = match on_poller(
        std::io::stdin().as_fd(),
        tokio::net::unix::pipe::Receiver::from_file,
        &mut switched,
    ) {
        Some(r) => Box::new(r),
        None => Box::new(tokio::io::stdin()),
    };
    let output = match on_poller(
        std::io::stdout().as_fd(),
        tokio::net::unix::pipe::Sender::from_file,
        &mut switched,
    ) {
        Some(w) => Output::Pipe(w),
        None => Output::Stream(Box::new(tokio::io::stdout())),
    };
    (input, output, switched)
}

/// `fd` as a pipe end of the runtime's (`make` fails unless it is a pipe open the right way),
/// remembered in `switched`; `None` if it is something else.
fn on_poller<T>(
    fd: std::os::fd::BorrowedFd<'_>,
    make: impl FnOnce(std::fs::File) -> std::io::Result<T>,
    switched: &mut BlockingAgain,
) -> Option<T> {
    let end = make(std::fs::File::from(fd.try_clone_to_owned().ok()?)).ok()?;
    switched.0.extend(fd.try_clone_to_owned());
    Some(end)
}

/// Clears `O_NONBLOCK` on the descriptors [`stdio_streams`] switched, when dropped: the flag
/// belongs to the open pipe, which the process that started us may share. Holds a duplicate of
/// each: the flag is the open pipe's, so clearing it through the duplicate clears it for fd 0/1.
struct BlockingAgain(Vec<std::os::fd::OwnedFd>);

impl Drop for BlockingAgain {
    fn drop(&mut self) {
        use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
        for fd in &self.0 {
            if let Ok(flags) = fcntl_getfl(fd) {
                let _ = fcntl_setfl(fd, flags - OFlags::NONBLOCK);
            }
        }
    }
}

/// Newline-delimited JSON-RPC over a byte stream, answering what JSON-RPC says to answer:
/// unparsable lines get `-32700 Parse error`, lines longer than the limit and JSON that is not
/// a JSON-RPC message get `-32600 Invalid Request` (with the request's id when it has one).
/// Replies and the SDK's messages go out a whole line at a time, in order ([`LineOut`]).
pub struct StdioLines<R> {
    reader: BufReader<R>,
    line: Vec<u8>,
    discarding: bool,
    /// The start and the last bytes of a line being discarded, where its id can be found.
    head: Vec<u8>,
    tail: Vec<u8>,
    max: usize,
    out: LineOut,
    closed: CancellationToken,
    /// The request ids in flight, when tracked: a request reusing one is refused.
    in_flight: Option<(Arc<InFlight>, ConnKey)>,
}

/// The sending side of a session's output. A line is written at once when no line is queued
/// ahead of it and the pipe takes it whole; otherwise (a stream that is not a pipe, a full
/// pipe, lines still queued) it goes to the writer task, which writes its queue in order. A
/// paced reply handed to the writer task waited for that task's wake-up, often on the other,
/// idle CPU: 0.2 ms of a 2.8 ms `tools/call` (docs/warm-pool.md).
struct LineOut {
    queue: mpsc::UnboundedSender<Vec<u8>>,
    /// Lines queued and not yet written whole: only at zero may a line skip the queue.
    queued: Arc<AtomicUsize>,
    direct: Option<Arc<tokio::net::unix::pipe::Sender>>,
}

impl LineOut {
    /// Sends `line` (newline included); an error if the output is closed.
    fn send(&self, mut line: Vec<u8>) -> std::io::Result<()> {
        let closed = || std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdout is closed");
        if let Some(pipe) = &self.direct {
            if self.queued.load(Ordering::SeqCst) == 0 {
                match pipe.try_write(&line) {
                    Ok(n) if n == line.len() => return Ok(()),
                    Ok(n) => {
                        line.drain(..n);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return Err(closed()),
                }
            }
        }
        self.queued.fetch_add(1, Ordering::SeqCst);
        self.queue.send(line).map_err(|_| {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            closed()
        })
    }
}

/// Writes all of `buf` to `pipe` once it is writable; the writer task's half of [`LineOut`].
async fn write_all_to_pipe(
    pipe: &tokio::net::unix::pipe::Sender,
    mut buf: &[u8],
) -> std::io::Result<()> {
    while !buf.is_empty() {
        pipe.writable().await?;
        match pipe.try_write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Where the writer task writes the lines queued for it.
enum Sink {
    Stream(Box<dyn tokio::io::AsyncWrite + Unpin + Send>),
    Pipe(Arc<tokio::net::unix::pipe::Sender>),
}

impl Sink {
    async fn write_line(&mut self, line: &[u8]) -> std::io::Result<()> {
        match self {
            Sink::Stream(w) => {
                w.write_all(line).await?;
                w.flush().await
            }
            Sink::Pipe(pipe) => write_all_to_pipe(pipe, line).await,
        }
    }
}

impl<R: tokio::io::AsyncRead + Unpin + Send> StdioLines<R> {
    /// A transport reading `read` and writing `write`; `closed` fires at end of input. The
    /// returned task ends once every queued line is written and the transport is dropped.
    pub fn new<W: tokio::io::AsyncWrite + Unpin + Send + 'static>(
        read: R,
        write: W,
        max: usize,
        closed: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        Self::start(read, Sink::Stream(Box::new(write)), None, max, closed)
    }

    /// [`StdioLines::new`] writing to a pipe on the runtime's poller: a reply is written from
    /// the task that sends it whenever nothing is queued ahead of it ([`LineOut`]).
    pub fn on_pipe(
        read: R,
        pipe: tokio::net::unix::pipe::Sender,
        max: usize,
        closed: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let pipe = Arc::new(pipe);
        Self::start(read, Sink::Pipe(Arc::clone(&pipe)), Some(pipe), max, closed)
    }

    fn start(
        read: R,
        mut sink: Sink,
        direct: Option<Arc<tokio::net::unix::pipe::Sender>>,
        max: usize,
        closed: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (queue, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let queued = Arc::new(AtomicUsize::new(0));
        let written = Arc::clone(&queued);
        let writer = tokio::spawn(async move {
            while let Some(line) = rx.recv().await {
                if sink.write_line(&line).await.is_err() {
                    break;
                }
                written.fetch_sub(1, Ordering::SeqCst);
            }
        });
        let lines = StdioLines {
            reader: BufReader::new(read),
            line: Vec::new(),
            discarding: false,
            head: Vec::new(),
            tail: Vec::new(),
            max,
            out: LineOut {
                queue,
                queued,
                direct,
            },
            closed,
            in_flight: None,
        };
        (lines, writer)
    }

    /// Refuses a request whose id is in flight on `conn` in `table` (`-32600`), and keeps the
    /// table up to date: an id is taken when its request passes, and the transport lets go of
    /// it when the response is written or the client cancels the request.
    pub(crate) fn track_ids(&mut self, table: Arc<InFlight>, conn: ConnKey) {
        self.in_flight = Some((table, conn));
    }

    /// Whether `msg` may go to the SDK; a request whose id is in flight is answered here.
    fn admit(&self, msg: &ClientJsonRpcMessage) -> bool {
        let Some((table, conn)) = &self.in_flight else {
            return true;
        };
        match msg {
            JsonRpcMessage::Request(r) => {
                let call = matches!(r.request, ClientRequest::CallToolRequest(_));
                if table.begin(conn, &r.id, call) {
                    return true;
                }
                let id = serde_json::to_value(&r.id).unwrap_or(Value::Null);
                self.reply_error(-32600, InFlight::in_use_message(&r.id), id);
                false
            }
            JsonRpcMessage::Notification(n) => {
                // The SDK drops the response of a request the client cancelled.
                if let ClientNotification::CancelledNotification(c) = &n.notification {
                    if let Some(id) = &c.params.request_id {
                        table.release_front(conn, id);
                    }
                }
                true
            }
            _ => true,
        }
    }

    fn reply_error(&self, code: i32, message: String, id: Value) {
        let v = Rejection { code, message, id }.to_json();
        let mut line = v.to_string().into_bytes();
        line.push(b'\n');
        let _ = self.out.send(line);
    }

    /// One complete line into `self.line`; `false` at end of input. Cancel-safe: bytes are
    /// consumed from the reader only after they are copied into `self.line`.
    async fn read_line(&mut self) -> std::io::Result<bool> {
        loop {
            let buf = self.reader.fill_buf().await?;
            if buf.is_empty() {
                return Ok(false);
            }
            let (take, done) = match buf.iter().position(|b| *b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            if !self.discarding {
                if self.line.len() + take > self.max + 1 {
                    self.discarding = true;
                    let mut head = std::mem::take(&mut self.line);
                    head.truncate(HEAD_KEPT);
                    let room = HEAD_KEPT - head.len();
                    head.extend_from_slice(&buf[..take.min(room)]);
                    self.head = head;
                    self.tail.clear();
                } else {
                    self.line.extend_from_slice(&buf[..take]);
                }
            }
            if self.discarding {
                keep_last(&mut self.tail, &buf[..take], TAIL_KEPT);
            }
            self.reader.consume(take);
            if done {
                if self.discarding {
                    self.discarding = false;
                    // The reply carries the request's id when it can be found, or the client
                    // (which matches replies by id) would wait for an answer forever.
                    let id = reply_id(id_of_discarded(&self.head, &self.tail).as_ref());
                    self.head = Vec::new();
                    self.tail.clear();
                    self.reply_error(
                        -32600,
                        format!(
                            "Invalid Request: the message is larger than {} bytes (--max-request-bytes); it was discarded",
                            self.max
                        ),
                        id,
                    );
                    continue;
                }
                return Ok(true);
            }
        }
    }
}

/// Bytes kept from the start of a discarded line: enough for the members a client writes
/// before its parameters (the Python SDK writes `jsonrpc`, `id`, `method`, then `params`).
const HEAD_KEPT: usize = 64 * 1024;
/// Bytes kept from the end of a discarded line: enough for members written after the
/// parameters (the TypeScript SDK writes `id` last).
const TAIL_KEPT: usize = 1024;

/// Appends `more` to `tail`, keeping only its last `keep` bytes.
fn keep_last(tail: &mut Vec<u8>, more: &[u8], keep: usize) {
    if more.len() >= keep {
        tail.clear();
        tail.extend_from_slice(&more[more.len() - keep..]);
        return;
    }
    let over = (tail.len() + more.len()).saturating_sub(keep);
    tail.drain(..over.min(tail.len()));
    tail.extend_from_slice(more);
}

impl<R: tokio::io::AsyncRead + Unpin + Send> Transport<RoleServer> for StdioLines<R> {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        if let Some((table, conn)) = &self.in_flight {
            let answered = match &item {
                JsonRpcMessage::Response(r) => Some(&r.id),
                JsonRpcMessage::Error(e) => e.id.as_ref(),
                _ => None,
            };
            if let Some(id) = answered {
                table.release_front(conn, id);
            }
        }
        let sent = serde_json::to_vec(&item)
            .map_err(std::io::Error::other)
            .and_then(|mut line| {
                line.push(b'\n');
                self.out.send(line)
            });
        std::future::ready(sent)
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            match self.read_line().await {
                Ok(true) => {}
                Ok(false) => {
                    self.closed.cancel();
                    return None;
                }
                Err(e) => {
                    tracing::warn!("cannot read stdin: {e}");
                    self.closed.cancel();
                    return None;
                }
            }
            let line = std::mem::take(&mut self.line);
            let text = line.strip_suffix(b"\n").unwrap_or(&line);
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match check_message(text) {
                Checked::Message(msg) => {
                    if self.admit(&msg) {
                        return Some(*msg);
                    }
                }
                Checked::Ignore => tracing::debug!("ignoring an unknown or malformed notification"),
                Checked::Reject(e) => self.reply_error(e.code, e.message, e.id),
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jsonrpc::{from_head, from_tail};
    use serde_json::json;

    /// Ends the transport `t` and returns the replies its writer wrote, one JSON value a line.
    async fn replies_written(
        t: StdioLines<&[u8]>,
        writer: tokio::task::JoinHandle<()>,
        mut out: tokio::io::DuplexStream,
    ) -> Vec<Value> {
        drop(t);
        writer.await.unwrap();
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut out, &mut text)
            .await
            .unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn stdio_lines_answer_bad_lines_and_pass_good_ones() {
        let input = format!(
            "not json\n\n{}\n{}\n",
            r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#,
            "x".repeat(80)
        )
        .into_bytes();
        let (out_w, out_r) = tokio::io::duplex(4096);
        let closed = CancellationToken::new();
        let (mut t, writer) = StdioLines::new(&input[..], out_w, 64, closed.clone());
        let msg = t.receive().await.expect("the ping");
        assert_eq!(serde_json::to_value(&msg).unwrap()["id"], 3);
        assert!(t.receive().await.is_none(), "end of input");
        assert!(closed.is_cancelled());
        let replies = replies_written(t, writer, out_r).await;
        assert_eq!(replies.len(), 2, "{replies:?}");
        assert_eq!(replies[0]["error"]["code"], -32700);
        assert_eq!(replies[1]["error"]["code"], -32600);
        assert!(replies[1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("larger than 64 bytes"));
    }

    /// An oversized request is answered with its own id, wherever the client put it, so the
    /// client's pending call gets its error instead of waiting forever.
    #[tokio::test]
    async fn an_oversized_request_is_refused_under_its_own_id() {
        let big = "x".repeat(200_000);
        let call = |members: &str| format!("{{{members}}}\n");
        let params =
            format!(r#""params":{{"name":"execute_code","arguments":{{"code":"{big}","id":99}}}}"#);
        let input = [
            // The Python SDK's order: id before the parameters.
            call(&format!(
                r#""jsonrpc":"2.0","id":7,"method":"tools/call",{params}"#
            )),
            // The TypeScript SDK's: id last.
            call(&format!(
                r#""method":"tools/call",{params},"jsonrpc":"2.0","id":"s-8""#
            )),
            // No id of the message's own (the inner one does not count): a null id.
            call(&format!(
                r#""method":"tools/call","jsonrpc":"2.0",{params}"#
            )),
            r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#.to_string() + "\n",
        ]
        .concat()
        .into_bytes();
        let (out_w, out_r) = tokio::io::duplex(1 << 20);
        let (mut t, writer) = StdioLines::new(&input[..], out_w, 4096, CancellationToken::new());
        let msg = t.receive().await.expect("the ping after them");
        assert_eq!(serde_json::to_value(&msg).unwrap()["id"], 9);
        let ids: Vec<Value> = replies_written(t, writer, out_r)
            .await
            .into_iter()
            .map(|v| {
                assert_eq!(v["error"]["code"], -32600, "{v}");
                v["id"].clone()
            })
            .collect();
        assert_eq!(ids, vec![json!(7), json!("s-8"), Value::Null]);
    }

    /// A reply to a pipe is written by the task that sends it when nothing waits ahead of it,
    /// without the writer task; lines sent faster than a slow reader takes them queue behind
    /// the one the full pipe took part of, and all arrive whole and in order.
    #[tokio::test]
    async fn lines_to_a_pipe_are_written_at_once_or_queued_and_arrive_whole_in_order() {
        let (tx, mut rx) = tokio::net::unix::pipe::pipe().unwrap();
        // As the session's stdout is by its first reply: the poller has seen it writable.
        tx.writable().await.unwrap();
        let (t, writer) = StdioLines::on_pipe(&b""[..], tx, 1024, CancellationToken::new());
        let first = b"{\"first\":true}\n".to_vec();
        t.out.send(first.clone()).unwrap();
        // Nothing has awaited since, so the writer task has not run: nothing was queued.
        assert_eq!(t.out.queued.load(Ordering::SeqCst), 0, "written at once");
        let mut got = vec![0u8; 64];
        rx.readable().await.unwrap();
        let n = rx.try_read(&mut got).expect("written at once");
        assert_eq!(&got[..n], &first[..]);
        // Far more than a pipe holds, sent without reading.
        let lines: Vec<Vec<u8>> = (0..100)
            .map(|i| format!("{i}:{}\n", "x".repeat(9_000 + i)).into_bytes())
            .collect();
        for line in &lines {
            t.out.send(line.clone()).unwrap();
        }
        assert!(
            t.out.queued.load(Ordering::SeqCst) > 0,
            "a full pipe queues"
        );
        let reading = tokio::spawn(async move {
            let mut all = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut rx, &mut all)
                .await
                .unwrap();
            all
        });
        drop(t);
        writer.await.unwrap();
        assert_eq!(reading.await.unwrap(), lines.concat());
    }

    /// A reader gone makes a send fail as "stdout is closed": at once when the line is written
    /// at once, else once the writer task has found the pipe closed.
    #[tokio::test]
    async fn a_send_to_a_closed_pipe_fails() {
        let (tx, rx) = tokio::net::unix::pipe::pipe().unwrap();
        tx.writable().await.unwrap();
        let (t, _writer) = StdioLines::on_pipe(&b""[..], tx, 1024, CancellationToken::new());
        drop(rx);
        let e = t.out.send(b"{}\n".to_vec()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
        assert_eq!(e.to_string(), "stdout is closed");

        let (tx, rx) = tokio::net::unix::pipe::pipe().unwrap();
        let (t, writer) = StdioLines::on_pipe(&b""[..], tx, 1024, CancellationToken::new());
        drop(rx);
        // Not yet seen writable: queued, and the writer task ends on the closed pipe.
        t.out.send(b"{}\n".to_vec()).unwrap();
        let out = &t.out;
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while !out.queue.is_closed() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the writer task ends");
        let e = t.out.send(b"{}\n".to_vec()).unwrap_err();
        assert_eq!(e.to_string(), "stdout is closed");
        drop(t);
        writer.await.unwrap();
    }

    #[test]
    fn the_id_is_read_only_where_it_can_be_trusted() {
        // Cut inside the parameters before any id: nothing at the start.
        assert_eq!(from_head(br#"{"method":"x","params":{"code":"abc"#), None);
        assert_eq!(
            from_head(br#"{"jsonrpc":"2.0","id":3,"params":{"co"#),
            Some(json!(3))
        );
        // An id member that closes an inner object, not the message.
        assert_eq!(from_tail(br#"de":"abc","id":4}}"#), None);
        assert_eq!(from_tail(b"de\":\"abc\"},\"id\":5}\n"), Some(json!(5)));
        // Only numbers and strings are ids.
        assert_eq!(
            reply_id(id_of_discarded(br#"{"id":{"a":1},"params":{"#, b"").as_ref()),
            Value::Null
        );
    }
}
