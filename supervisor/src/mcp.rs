//! `vibeos-exec serve`: execute_code (and optionally other registry tools) as a Model Context
//! Protocol server.
//!
//! Agents that are not written in Python speak MCP; serving execute_code over it makes the
//! product usable by all of them without glue code. The protocol machinery is the official SDK
//! (`rmcp`); this module adds what is specific to execute_code:
//!
//! - the tool list is generated from the registry at each `tools/list`, so `execute_code`
//!   describes exactly the script tools available now and the configured limits;
//! - executions run concurrently up to `--max-concurrent`, the rest wait in a queue; with a
//!   `progressToken` the client hears about both phases through `notifications/progress`;
//! - `notifications/cancelled` interrupts the execution (status `interrupted`), and a client
//!   that goes away gets every execution it started interrupted, so no process or staging dir
//!   outlives its connection;
//! - over stdio, lines are framed by our own transport ([`StdioLines`]) rather than the SDK's,
//!   because the SDK silently drops unparsable and oversized lines while JSON-RPC asks for a
//!   `-32700 Parse error` / `-32600 Invalid Request` reply. Over HTTP the SDK's streamable HTTP
//!   service answers those itself (HTTP 400/413 with a JSON-RPC error body).

use crate::config::Config;
use crate::execute::{execute, Interrupt};
use crate::execute_code_tool::{execute_code_settings, request_from};
use crate::result::Status;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientJsonRpcMessage, ClientRequest,
    ContentBlock, ErrorData, Implementation, JsonRpcRequest, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ServerCapabilities,
    ServerConfig, ServerJsonRpcMessage, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService, Transport};
use rmcp::{ServerHandler, ServiceExt};
use serde_json::{Map, Value};
use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use vibeos_tools::{ToolContext, ToolRegistry, EXECUTE_CODE};

/// Largest request accepted by default (one stdio line, or one HTTP body): 4 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// How often a queued or running execution reports progress when the client asked for it.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// How long shutdown waits for interrupted executions to clean up (SIGTERM, the kill grace,
/// then reaping and staging-dir removal).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);

/// Methods of the MCP spec a client sends; a request for one of them that the SDK could not
/// type has malformed params.
const STANDARD_METHODS: [&str; 15] = [
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "resources/subscribe",
    "resources/unsubscribe",
    "completion/complete",
    "logging/setLevel",
    "server/discover",
    "subscriptions/listen",
];

/// Arguments of execute_code a call may set; the rest (mode, cwd, interpreter) are the
/// server's, so a client cannot loosen what the operator chose (e.g. strict → project).
const CALL_ARGUMENTS: [&str; 3] = ["code", "timeout", "max_tool_calls"];

/// What `serve` was configured with.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    /// Configuration with the command line's `--mode`, `--timeout` and `--max-tool-calls`
    /// already applied: the defaults of every call.
    pub config: Config,
    /// Session working dir of every execution (`--cwd`, else `TERMINAL_CWD`, else the cwd).
    pub cwd: PathBuf,
    /// Toolsets whose tools are offered besides execute_code (`--toolsets`).
    pub toolsets: Vec<String>,
    /// Executions allowed to run at once; more wait in a queue.
    pub max_concurrent: usize,
    /// Largest accepted request in bytes.
    pub max_request_bytes: usize,
    /// HTTP sessions open at once (`--max-sessions`); a new client beyond it gets 503 until one
    /// ends (DELETE, or idle for [`SESSION_IDLE_TIMEOUT`]).
    pub max_sessions: usize,
}

/// Default `--max-sessions`: each open HTTP session holds a worker and its buffers (tens of
/// KB), so clients that never close theirs must not be able to grow the server without bound.
pub const DEFAULT_MAX_SESSIONS: usize = 64;

/// An HTTP session with no request for this long is closed by the server.
pub const SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// `--http` named something that is not `IP:PORT` / `localhost:PORT`.
    #[error("--http {0:?} is not an address; use 127.0.0.1:PORT (or [::1]:PORT, localhost:PORT)")]
    BadAddress(String),
    /// `--http` named an address other machines could reach.
    #[error("refusing to serve on {0}: it is not a loopback address, and the server runs code for whoever connects; use 127.0.0.1:PORT (or [::1]:PORT)")]
    NotLoopback(SocketAddr),
    /// The listener could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// `--toolsets` named something the registry does not know.
    #[error("--toolsets: {0}")]
    Toolsets(String),
    /// `--max-concurrent`, `--max-request-bytes` or `--max-sessions` is zero.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// The transport failed.
    #[error("the MCP server stopped: {0}")]
    Io(String),
}

/// Parses `--http`: an `IP:PORT` (or `localhost:PORT`) that must be a loopback address.
pub fn parse_http_addr(text: &str) -> Result<SocketAddr, ServeError> {
    let addr = match text.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => {
            let (host, port) = text
                .rsplit_once(':')
                .ok_or_else(|| ServeError::BadAddress(text.into()))?;
            let port: u16 = port
                .parse()
                .map_err(|_| ServeError::BadAddress(text.into()))?;
            if host.eq_ignore_ascii_case("localhost") {
                SocketAddr::new(IpAddr::from([127, 0, 0, 1]), port)
            } else {
                return match host.parse::<IpAddr>() {
                    Ok(ip) => Err(ServeError::NotLoopback(SocketAddr::new(ip, port))),
                    Err(_) if host.is_empty() => Err(ServeError::BadAddress(text.into())),
                    // A name other than localhost may resolve anywhere.
                    Err(_) => Err(ServeError::BadAddress(format!(
                        "{text} (only IP addresses and localhost are accepted)"
                    ))),
                };
            }
        }
    };
    if !addr.ip().is_loopback() {
        return Err(ServeError::NotLoopback(addr));
    }
    Ok(addr)
}

/// State shared by every connection of one server: the slots that bound concurrency and the
/// executions running now, so a closing connection (or the whole server) can interrupt its own.
struct Shared {
    registry: &'static ToolRegistry,
    settings: ServeSettings,
    slots: Arc<Semaphore>,
    next_id: AtomicU64,
    running: Mutex<HashMap<u64, (u64, Interrupt)>>,
    idle: Notify,
}

impl Shared {
    fn new(registry: &'static ToolRegistry, settings: ServeSettings) -> Arc<Self> {
        Arc::new(Shared {
            registry,
            slots: Arc::new(Semaphore::new(settings.max_concurrent)),
            settings,
            next_id: AtomicU64::new(1),
            running: Mutex::new(HashMap::new()),
            idle: Notify::new(),
        })
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (u64, Interrupt)>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Interrupts the executions of connection `conn` (all of them when `None`).
    fn interrupt(&self, conn: Option<u64>) -> usize {
        let running = self.running();
        let mut n = 0;
        for (c, interrupt) in running.values() {
            if conn.is_none_or(|want| want == *c) {
                interrupt.interrupt();
                n += 1;
            }
        }
        n
    }

    /// Waits until the executions of `conn` (all when `None`) have finished their cleanup.
    async fn wait_idle(&self, conn: Option<u64>, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.idle.notified();
            let busy = self
                .running()
                .values()
                .any(|(c, _)| conn.is_none_or(|want| want == *c));
            if !busy {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                tracing::warn!("executions still cleaning up after {limit:?}; giving up waiting");
                return;
            }
        }
    }
}

/// Removes an execution from the running set when its call ends, however it ends.
struct Registration<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.shared.running().remove(&self.id);
        self.shared.idle.notify_waiters();
    }
}

/// The MCP server of one connection (a stdio session or an HTTP session).
#[derive(Clone)]
pub struct ExecServer {
    shared: Arc<Shared>,
    conn: u64,
}

impl ExecServer {
    /// The tools this server offers now: execute_code, described for the script tools
    /// available now and the configured limits, plus the available tools of `--toolsets`.
    fn tools(&self) -> Result<Vec<Tool>, ErrorData> {
        let reg = self.shared.registry;
        let settings = execute_code_settings(
            &self.shared.settings.config,
            Some(&self.shared.settings.cwd),
        );
        // Built from the whole registry so the execute_code description names every available
        // script tool, not only those of the extra toolsets.
        let defs = reg
            .get_tool_definitions_with(&[], &[], &settings)
            .map_err(|e| ErrorData::internal_error(format!("tool registry: {e}"), None))?;
        let extra = self.extra_tools()?;
        Ok(defs
            .iter()
            .filter_map(|def| {
                let f = def.get("function")?;
                let name = f.get("name")?.as_str()?;
                if name != EXECUTE_CODE && !extra.contains(name) {
                    return None;
                }
                let description = f
                    .get("description")
                    .and_then(Value::as_str)
                    .map(|d| d.to_string().into());
                let schema = match f.get("parameters") {
                    Some(Value::Object(m)) => m.clone(),
                    _ => Map::new(),
                };
                Some(Tool::new_with_raw(name.to_string(), description, schema))
            })
            .collect())
    }

    /// Names of the tools `--toolsets` adds (before availability checks).
    fn extra_tools(&self) -> Result<BTreeSet<String>, ErrorData> {
        if self.shared.settings.toolsets.is_empty() {
            return Ok(BTreeSet::new());
        }
        let entries = self
            .shared
            .registry
            .select_tools(&self.shared.settings.toolsets, &[])
            .map_err(|e| ErrorData::internal_error(format!("--toolsets: {e}"), None))?;
        Ok(entries.iter().map(|e| e.name.clone()).collect())
    }

    async fn call_execute_code(
        &self,
        args: Map<String, Value>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        if let Some(bad) = args.keys().find(|k| !CALL_ARGUMENTS.contains(&k.as_str())) {
            return Err(ErrorData::invalid_params(
                format!(
                    "execute_code has no argument `{bad}`; it takes code, timeout and max_tool_calls (mode and cwd are the server's settings)"
                ),
                None,
            ));
        }
        match args.get("code") {
            Some(Value::String(_)) | None => {}
            Some(other) => {
                return Err(ErrorData::invalid_params(
                    format!(
                        "argument `code` must be a string of Python source, got {}",
                        vibeos_tools::json_type(other)
                    ),
                    None,
                ))
            }
        }
        let settings = &self.shared.settings;
        let mut ctx = ToolContext::agent(settings.cwd.clone());
        ctx.task_id = Some(crate::mcp_approval::task_id(self.conn));
        let request = request_from(&args, &ctx, &settings.config)
            .map_err(|e| ErrorData::invalid_params(e.message, None))?;
        // Approvals of this call are asked of this client (elicitation).
        let _approvals = crate::mcp_approval::bind(
            &crate::mcp_approval::task_id(self.conn),
            context.peer.clone(),
        );

        let progress = Progress::new(&context);
        // Stop when the client cancels, and (over HTTP) when its response stream goes away.
        let ct = context.ct.child_token();
        if let Some(ClientGone(gone)) = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<ClientGone>())
        {
            let (gone, ct) = (gone.clone(), ct.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = gone.cancelled() => ct.cancel(),
                    _ = ct.cancelled() => {}
                }
            });
        }
        let started = Instant::now();
        let slots = self.shared.slots.clone();
        // Queue: wait for a slot, telling the client why it waits, until cancelled.
        let permit = {
            let acquire = slots.acquire_owned();
            tokio::pin!(acquire);
            let mut tick = tokio::time::interval(PROGRESS_EVERY);
            loop {
                tokio::select! {
                    permit = &mut acquire => break permit.map_err(|_| ErrorData::internal_error("the server is shutting down", None))?,
                    _ = ct.cancelled() => return Err(ErrorData::internal_error("cancelled by the client while queued", None)),
                    _ = tick.tick() => progress.send(format!(
                        "queued: all {} execution slots are busy (--max-concurrent), waited {:.0}s",
                        settings.max_concurrent, started.elapsed().as_secs_f64()
                    )).await,
                }
            }
        };

        let interrupt = Interrupt::new();
        let id = self.shared.next_id();
        self.shared
            .running()
            .insert(id, (self.conn, interrupt.clone()));
        let _registration = Registration {
            shared: &self.shared,
            id,
        };
        let run = execute(request, self.shared.registry, interrupt.clone());
        tokio::pin!(run);
        let run_started = Instant::now();
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        let mut cancelled = false;
        let result = loop {
            tokio::select! {
                result = &mut run => break result,
                _ = ct.cancelled(), if !cancelled => {
                    cancelled = true;
                    interrupt.interrupt();
                }
                _ = tick.tick() => progress.send(format!(
                    "running for {:.0}s", run_started.elapsed().as_secs_f64()
                )).await,
            }
        };
        drop(permit);
        tracing::info!(
            "execute_code call {id}: status {}{}",
            result.status.as_str(),
            if cancelled {
                " (cancelled by the client)"
            } else {
                ""
            }
        );
        let value = result.to_json();
        let text = serde_json::to_string(&value).map_err(|e| {
            ErrorData::internal_error(format!("cannot render the result: {e}"), None)
        })?;
        let mut out = if result.status == Status::Success {
            CallToolResult::success(vec![ContentBlock::text(text)])
        } else {
            CallToolResult::error(vec![ContentBlock::text(text)])
        };
        out.structured_content = Some(value);
        Ok(out)
    }

    async fn call_registry_tool(
        &self,
        name: String,
        args: Map<String, Value>,
        peer: rmcp::Peer<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let registry = self.shared.registry;
        let mut ctx = ToolContext::agent(self.shared.settings.cwd.clone());
        let task_id = crate::mcp_approval::task_id(self.conn);
        let _approvals = crate::mcp_approval::bind(&task_id, peer);
        ctx.task_id = Some(task_id);
        let text = tokio::task::spawn_blocking(move || {
            registry.handle_function_call(&name, &Value::Object(args), &ctx)
        })
        .await
        .map_err(|e| ErrorData::internal_error(format!("the tool call failed: {e}"), None))?;
        let parsed: Option<Value> = serde_json::from_str(&text).ok();
        let is_error = parsed
            .as_ref()
            .and_then(Value::as_object)
            .is_some_and(|o| o.contains_key("error"));
        let mut out = if is_error {
            CallToolResult::error(vec![ContentBlock::text(text)])
        } else {
            CallToolResult::success(vec![ContentBlock::text(text)])
        };
        if let Some(v @ Value::Object(_)) = parsed {
            out.structured_content = Some(v);
        }
        Ok(out)
    }
}

/// Progress notifications of one call, when the client sent a `progressToken`.
struct Progress {
    target: Option<(ProgressToken, rmcp::Peer<RoleServer>)>,
    count: AtomicU64,
}

impl Progress {
    fn new(context: &RequestContext<RoleServer>) -> Self {
        Progress {
            target: context
                .meta
                .get_progress_token()
                .map(|t| (t, context.peer.clone())),
            count: AtomicU64::new(0),
        }
    }

    async fn send(&self, message: String) {
        let Some((token, peer)) = &self.target else {
            return;
        };
        let n = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        let param = ProgressNotificationParam::new(token.clone(), n as f64).with_message(message);
        if let Err(e) = peer.notify_progress(param).await {
            tracing::debug!("cannot send a progress notification: {e}");
        }
    }
}

impl ServerHandler for ExecServer {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        info.server_info = Implementation::new("vibeos-exec", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "execute_code runs a Python script that imports your tools from `vibeos_tools`, \
             calls them in loops and branches, and returns only what it prints."
                .into(),
        );
        info
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let this = self.clone();
        // Availability checks may block (bounded by the registry's check timeout).
        let tools = tokio::task::spawn_blocking(move || this.tools())
            .await
            .map_err(|e| ErrorData::internal_error(format!("listing tools failed: {e}"), None))??;
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let args = request.arguments.unwrap_or_default();
        if name == EXECUTE_CODE {
            return self.call_execute_code(args, context).await.map(Into::into);
        }
        let offered = {
            let this = self.clone();
            tokio::task::spawn_blocking(move || this.tools())
                .await
                .map_err(|e| {
                    ErrorData::internal_error(format!("listing tools failed: {e}"), None)
                })??
        };
        if !offered.iter().any(|t| t.name == name) {
            let names: Vec<String> = offered.iter().map(|t| t.name.to_string()).collect();
            return Err(ErrorData::invalid_params(
                format!(
                    "unknown tool `{name}`; this server offers: {}",
                    names.join(", ")
                ),
                None,
            ));
        }
        self.call_registry_tool(name, args, context.peer.clone())
            .await
            .map(Into::into)
    }
}

/// Checks the settings and the toolset names before any client connects.
fn validate(registry: &'static ToolRegistry, settings: &ServeSettings) -> Result<(), ServeError> {
    if settings.max_concurrent == 0 {
        return Err(ServeError::Zero("--max-concurrent"));
    }
    if settings.max_request_bytes == 0 {
        return Err(ServeError::Zero("--max-request-bytes"));
    }
    if settings.max_sessions == 0 {
        return Err(ServeError::Zero("--max-sessions"));
    }
    registry
        .select_tools(&settings.toolsets, &[])
        .map_err(|e| ServeError::Toolsets(e.to_string()))?;
    Ok(())
}

/// Serves MCP on stdin/stdout until the client closes stdin (or `stop` fires). Every execution
/// of the session is interrupted and cleaned up before this returns.
pub async fn serve_stdio(
    registry: &'static ToolRegistry,
    settings: ServeSettings,
    stop: CancellationToken,
) -> Result<(), ServeError> {
    validate(registry, &settings)?;
    crate::mcp_approval::install();
    let shared = Shared::new(registry, settings);
    let conn = shared.next_id();
    let closed = CancellationToken::new();
    let (transport, writer) = StdioLines::new(
        tokio::io::stdin(),
        tokio::io::stdout(),
        shared.settings.max_request_bytes,
        closed.clone(),
    );
    let server = ExecServer {
        shared: shared.clone(),
        conn,
    };
    // The moment the client is gone (EOF on stdin, or a signal) its executions are stopped,
    // without waiting for the SDK to drain in-flight responses nobody will read.
    {
        let shared = shared.clone();
        let closed = closed.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = closed.cancelled() => {}
                _ = stop.cancelled() => {}
            }
            let n = shared.interrupt(Some(conn));
            if n > 0 {
                tracing::info!("client gone: interrupted {n} running execution(s)");
            }
        });
    }
    let running = server
        .serve_with_ct(transport, stop.child_token())
        .await
        .map_err(|e| ServeError::Io(e.to_string()))?;
    let quit = running.waiting().await;
    tracing::debug!("MCP stdio session ended: {quit:?}");
    shared.interrupt(None);
    shared.wait_idle(None, DRAIN_TIMEOUT).await;
    let _ = writer.await;
    Ok(())
}

/// Serves MCP over streamable HTTP on `addr` (loopback only) at path `/mcp` until `stop`
/// fires; `on_listening` is told the bound address (useful with port 0).
pub async fn serve_http(
    registry: &'static ToolRegistry,
    settings: ServeSettings,
    addr: SocketAddr,
    stop: CancellationToken,
    on_listening: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    validate(registry, &settings)?;
    if !addr.ip().is_loopback() {
        return Err(ServeError::NotLoopback(addr));
    }
    crate::mcp_approval::install();
    let shared = Shared::new(registry, settings);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = stop.child_token();
    config.max_request_body_bytes = shared.settings.max_request_bytes;
    config = config.with_allowed_hosts([
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
        format!("localhost:{}", bound.port()),
        format!("127.0.0.1:{}", bound.port()),
        format!("[::1]:{}", bound.port()),
    ]);
    let factory_shared = shared.clone();
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(SESSION_IDLE_TIMEOUT);
    let sessions = Arc::new(sessions);
    let service = StreamableHttpService::new(
        move || {
            Ok(ExecServer {
                conn: factory_shared.next_id(),
                shared: factory_shared.clone(),
            })
        },
        sessions.clone(),
        config,
    );
    let limits = HttpLimits {
        max_body: shared.settings.max_request_bytes,
        max_sessions: shared.settings.max_sessions,
        sessions,
    };
    let router =
        axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn(move |req, next| {
                check_http_request(req, next, limits.clone())
            }));
    on_listening(bound);
    let stopped = stop.clone();
    let served = axum::serve(listener, router)
        .with_graceful_shutdown(async move { stopped.cancelled().await })
        .await;
    shared.interrupt(None);
    shared.wait_idle(None, DRAIN_TIMEOUT).await;
    served.map_err(|e| ServeError::Io(e.to_string()))
}

/// Most bytes of an oversized body read and thrown away before answering 413: a client still
/// sending would otherwise see its connection reset instead of the answer.
const DRAIN_CAP: usize = 256 * 1024 * 1024;

/// Reads a body of at most `limit` bytes; `None` if it is larger (the rest is drained, up to
/// [`DRAIN_CAP`]) or cannot be read.
async fn read_body_draining(mut body: axum::body::Body, limit: usize) -> Option<axum::body::Bytes> {
    use http_body::Body as _;
    let mut kept = Vec::new();
    let mut total = 0usize;
    loop {
        let frame = std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await;
        match frame {
            None => break,
            Some(Err(_)) => return None,
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    total = total.saturating_add(data.len());
                    if total <= limit {
                        kept.extend_from_slice(&data);
                    } else if total > DRAIN_CAP {
                        return None;
                    }
                }
            }
        }
    }
    (total <= limit).then(|| axum::body::Bytes::from(kept))
}

/// What the HTTP front checks before the SDK sees a request.
#[derive(Clone)]
struct HttpLimits {
    /// Largest body (`--max-request-bytes`).
    max_body: usize,
    /// Sessions open at once (`--max-sessions`).
    max_sessions: usize,
    /// The SDK's session table, to count open sessions.
    sessions: Arc<LocalSessionManager>,
}

/// Checks a request before the SDK sees it, so bad input gets a JSON-RPC error body (the SDK
/// would answer 415 with plain text): a body over the limit → 413 with -32600; unparsable or not
/// JSON-RPC → 400 with -32700 / -32600 / -32602 as [`check_message`] decides; a new session
/// beyond `--max-sessions` → 503 with -32000. A successful `DELETE` (session closed) answers 200:
/// the SDK answers 202, which the official clients log as a failed termination.
async fn check_http_request(
    req: axum::extract::Request,
    next: axum::middleware::Next,
    limits: HttpLimits,
) -> axum::response::Response {
    use axum::http::{header, Method, StatusCode};
    use axum::response::IntoResponse;
    if req.method() == Method::DELETE {
        let mut response = next.run(req).await;
        if response.status() == StatusCode::ACCEPTED {
            *response.status_mut() = StatusCode::OK;
        }
        return response;
    }
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let limit = limits.max_body;
    let json_error = |status: StatusCode, rejection: Rejection| {
        (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            rejection.to_json().to_string(),
        )
            .into_response()
    };
    let opens_session = !req.headers().contains_key("mcp-session-id");
    if opens_session && limits.sessions.sessions.read().await.len() >= limits.max_sessions {
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            Rejection {
                code: -32000,
                message: format!(
                    "Server busy: {} MCP sessions are open (--max-sessions); close one (DELETE \
                     /mcp with its Mcp-Session-Id) or retry when an idle one expires ({}s)",
                    limits.max_sessions,
                    SESSION_IDLE_TIMEOUT.as_secs()
                ),
                id: Value::Null,
            },
        );
    }
    let (parts, body) = req.into_parts();
    let bytes = match read_body_draining(body, limit).await {
        Some(b) => b,
        None => {
            return json_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                Rejection {
                    code: -32600,
                    message: format!(
                        "Invalid Request: the body is larger than {limit} bytes (--max-request-bytes) or could not be read"
                    ),
                    id: Value::Null,
                },
            )
        }
    };
    if let Checked::Reject(rejection) = check_message(&bytes) {
        return json_error(StatusCode::BAD_REQUEST, rejection);
    }
    let mut parts = parts;
    let gone = CancellationToken::new();
    parts.extensions.insert(ClientGone(gone.clone()));
    let response = next
        .run(axum::extract::Request::from_parts(
            parts,
            axum::body::Body::from(bytes),
        ))
        .await;
    // The response stream of a tools/call is dropped when it is finished or when the client
    // hangs up; either way the call's execution has no one left to report to.
    let guard = gone.drop_guard();
    response.map(|inner| {
        axum::body::Body::new(GuardedBody {
            inner,
            _guard: guard,
        })
    })
}

/// Fires when the HTTP response of the request that carries it is dropped (sent, or the client
/// disconnected). Handed to the handler through the request's extensions.
#[derive(Clone)]
struct ClientGone(CancellationToken);

/// A response body that fires its request's [`ClientGone`] when dropped.
struct GuardedBody {
    inner: axum::body::Body,
    _guard: tokio_util::sync::DropGuard,
}

impl http_body::Body for GuardedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A message the client sent that JSON-RPC says to answer with an error.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejection {
    /// JSON-RPC error code: -32700 parse error, -32600 invalid request, -32602 invalid params.
    pub code: i32,
    /// What was wrong.
    pub message: String,
    /// The request's id when it could be read, else null.
    pub id: Value,
}

impl Rejection {
    /// The JSON-RPC error response.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "error": {"code": self.code, "message": self.message},
        })
    }
}

/// What to do with one incoming message.
#[derive(Debug)]
pub enum Checked {
    /// A message for the SDK to handle.
    Message(Box<ClientJsonRpcMessage>),
    /// An unknown or malformed notification: never answered, dropped.
    Ignore,
    /// Answer with this error.
    Reject(Rejection),
}

/// Classifies one incoming message the way JSON-RPC 2.0 asks: unparsable → -32700; JSON that
/// is not a JSON-RPC message (or a batch, which MCP does not use) → -32600; a standard MCP
/// method whose params do not fit its schema → -32602 (the SDK would call it "method not
/// found", but the method exists).
pub fn check_message(text: &[u8]) -> Checked {
    let reject =
        |code, message: String, id: Value| Checked::Reject(Rejection { code, message, id });
    let value: Value = match serde_json::from_slice(text) {
        Ok(v) => v,
        Err(e) => return reject(-32700, format!("Parse error: {e}"), Value::Null),
    };
    let id = match value.get("id") {
        Some(v @ (Value::String(_) | Value::Number(_))) => v.clone(),
        _ => Value::Null,
    };
    let is_notification = value.is_object() && value.get("id").is_none();
    match serde_json::from_value::<ClientJsonRpcMessage>(value.clone()) {
        Ok(ClientJsonRpcMessage::Request(JsonRpcRequest {
            request: ClientRequest::CustomRequest(custom),
            ..
        })) if STANDARD_METHODS.contains(&custom.method.as_str()) => {
            let detail = match custom.method.as_str() {
                "tools/call" => serde_json::from_value::<CallToolRequestParams>(
                    custom.params.clone().unwrap_or(Value::Null),
                )
                .err()
                .map(|e| format!(": {e}"))
                .unwrap_or_default(),
                _ => String::new(),
            };
            reject(
                -32602,
                format!(
                    "Invalid params: the params of `{}` do not match the MCP schema{detail}",
                    custom.method
                ),
                id,
            )
        }
        Ok(msg) => Checked::Message(Box::new(msg)),
        Err(_) if is_notification && value.get("method").is_some_and(Value::is_string) => {
            Checked::Ignore
        }
        Err(e) => {
            let message = if value.is_array() {
                "Invalid Request: batches are not supported; send one message per line".to_string()
            } else {
                format!("Invalid Request: not a JSON-RPC 2.0 message ({e})")
            };
            reject(-32600, message, id)
        }
    }
}

/// Newline-delimited JSON-RPC over a byte stream, answering what JSON-RPC says to answer:
/// unparsable lines get `-32700 Parse error`, lines longer than the limit and JSON that is not
/// a JSON-RPC message get `-32600 Invalid Request` (with the request's id when it has one).
/// Replies and the SDK's messages go out through one writer task, a whole line at a time.
pub struct StdioLines<R> {
    reader: BufReader<R>,
    line: Vec<u8>,
    discarding: bool,
    max: usize,
    out: mpsc::UnboundedSender<Vec<u8>>,
    closed: CancellationToken,
}

impl<R: tokio::io::AsyncRead + Unpin + Send> StdioLines<R> {
    /// A transport reading `read` and writing `write`; `closed` fires at end of input. The
    /// returned task ends once every queued line is written and the transport is dropped.
    pub fn new<W: tokio::io::AsyncWrite + Unpin + Send + 'static>(
        read: R,
        mut write: W,
        max: usize,
        closed: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (out, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let writer = tokio::spawn(async move {
            while let Some(line) = rx.recv().await {
                if write.write_all(&line).await.is_err() || write.flush().await.is_err() {
                    break;
                }
            }
        });
        (
            StdioLines {
                reader: BufReader::new(read),
                line: Vec::new(),
                discarding: false,
                max,
                out,
                closed,
            },
            writer,
        )
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
                    self.line.clear();
                } else {
                    self.line.extend_from_slice(&buf[..take]);
                }
            }
            self.reader.consume(take);
            if done {
                if self.discarding {
                    self.discarding = false;
                    self.reply_error(
                        -32600,
                        format!(
                            "Invalid Request: the message is larger than {} bytes (--max-request-bytes); it was discarded",
                            self.max
                        ),
                        Value::Null,
                    );
                    continue;
                }
                return Ok(true);
            }
        }
    }
}

impl<R: tokio::io::AsyncRead + Unpin + Send> Transport<RoleServer> for StdioLines<R> {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        let sent = serde_json::to_vec(&item)
            .map_err(std::io::Error::other)
            .and_then(|mut line| {
                line.push(b'\n');
                self.out.send(line).map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdout is closed")
                })
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
                Checked::Message(msg) => return Some(*msg),
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

    #[test]
    fn http_addresses_must_be_loopback() {
        assert_eq!(
            parse_http_addr("127.0.0.1:8765").unwrap(),
            "127.0.0.1:8765".parse().unwrap()
        );
        assert_eq!(
            parse_http_addr("[::1]:0").unwrap(),
            "[::1]:0".parse().unwrap()
        );
        assert_eq!(
            parse_http_addr("localhost:9000").unwrap(),
            "127.0.0.1:9000".parse().unwrap()
        );
        assert!(
            parse_http_addr("127.1.2.3:80").is_ok(),
            "all of 127/8 is loopback"
        );
        for bad in ["0.0.0.0:80", "10.0.0.1:80", "[::]:80", "192.168.1.1:1"] {
            assert!(
                matches!(parse_http_addr(bad), Err(ServeError::NotLoopback(_))),
                "{bad}"
            );
        }
        for bad in [
            "",
            "8080",
            "example.com:80",
            "127.0.0.1",
            "localhost:x",
            ":80",
        ] {
            assert!(
                matches!(parse_http_addr(bad), Err(ServeError::BadAddress(_))),
                "{bad}"
            );
        }
    }

    fn rejection(text: &str) -> Rejection {
        match check_message(text.as_bytes()) {
            Checked::Reject(r) => r,
            other => panic!("{text}: expected a rejection, got {other:?}"),
        }
    }

    #[test]
    fn messages_are_classified_as_json_rpc_asks() {
        assert_eq!(rejection("{oops").code, -32700);
        assert_eq!(rejection("{\"a\":1}").code, -32600);
        assert_eq!(rejection("[]").code, -32600);
        assert_eq!(rejection("42").code, -32600);
        let r = rejection(
            r#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"execute_code","arguments":[1]}}"#,
        );
        assert_eq!((r.code, r.id.clone()), (-32602, Value::from("x")));
        assert!(r.message.contains("tools/call"), "{}", r.message);
        assert!(matches!(
            check_message(br#"{"jsonrpc":"2.0","method":"notifications/whatever","params":5}"#),
            Checked::Ignore | Checked::Message(_)
        ));
        assert!(matches!(
            check_message(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            Checked::Message(_)
        ));
        // An unknown method is the SDK's to answer (-32601), with the request's id.
        assert!(matches!(
            check_message(br#"{"jsonrpc":"2.0","id":1,"method":"no/such"}"#),
            Checked::Message(_)
        ));
    }

    #[tokio::test]
    async fn stdio_lines_answer_bad_lines_and_pass_good_ones() {
        let input = format!(
            "not json\n\n{}\n{}\n",
            r#"{"jsonrpc":"2.0","id":3,"method":"ping"}"#,
            "x".repeat(80)
        )
        .into_bytes();
        let (out_w, mut out_r) = tokio::io::duplex(4096);
        let closed = CancellationToken::new();
        let (mut t, writer) = StdioLines::new(&input[..], out_w, 64, closed.clone());
        let msg = t.receive().await.expect("the ping");
        assert_eq!(serde_json::to_value(&msg).unwrap()["id"], 3);
        assert!(t.receive().await.is_none(), "end of input");
        assert!(closed.is_cancelled());
        drop(t);
        writer.await.unwrap();
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut out_r, &mut text)
            .await
            .unwrap();
        let replies: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(replies.len(), 2, "{text}");
        assert_eq!(replies[0]["error"]["code"], -32700);
        assert_eq!(replies[1]["error"]["code"], -32600);
        assert!(replies[1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("larger than 64 bytes"));
    }
}
