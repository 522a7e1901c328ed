//! The MCP handler: execute_code (and the served toolsets' tools) as MCP tools, with
//! concurrency slots, progress notifications and interrupts of a closing client's executions.

use crate::fair_slots::{FairSlots, NoSlot};
use crate::http::ClientGone;
use crate::inflight::{ConnKey, HandlerHold, InFlight};
use crate::ServeSettings;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    Implementation, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ProgressToken, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::ServerHandler;
use serde_json::{Map, Value};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use vibeos_supervisor::direct_tools::{DirectCallError, DirectTools};
use vibeos_supervisor::execute_code_tool::{execute_code_settings, request_from};
use vibeos_supervisor::Status;
use vibeos_supervisor::{execute, Interrupt};
use vibeos_tools::{ToolContext, ToolRegistry, EXECUTE_CODE};

/// How often a queued or running execution reports progress when the client asked for it.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Most `execute_code` calls that may wait for a slot at once, over every session. Each waits
/// holding its request (its code, up to `--max-request-bytes`): unbounded, 200 queued calls of
/// 900 KB took a server from 13 to 376 MB, and more would have taken the machine's memory.
pub(crate) const MAX_QUEUED_CALLS: usize = 64;

/// Most bytes of code the waiting calls may hold together.
pub(crate) const MAX_QUEUED_CODE_BYTES: usize = 64 << 20;

/// A call's place in the queue, given back when it stops waiting (it got a slot, was
/// cancelled, or its client went away).
struct QueuePlace<'a> {
    shared: &'a Shared,
    bytes: usize,
}

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        self.shared.queued_calls.fetch_sub(1, Ordering::SeqCst);
        self.shared
            .queued_code_bytes
            .fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

impl Shared {
    /// A place in the queue for a call of `bytes` of code, or `None` when the queue is full.
    fn take_queue_place(&self, bytes: usize) -> Option<QueuePlace<'_>> {
        let take = |counter: &std::sync::atomic::AtomicUsize, n: usize, max: usize| {
            counter
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                    now.checked_add(n).filter(|total| *total <= max)
                })
                .is_ok()
        };
        if !take(&self.queued_calls, 1, MAX_QUEUED_CALLS) {
            return None;
        }
        if !take(&self.queued_code_bytes, bytes, MAX_QUEUED_CODE_BYTES) {
            self.queued_calls.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(QueuePlace {
            shared: self,
            bytes,
        })
    }
}

/// How long shutdown waits for interrupted executions to clean up (SIGTERM, the kill grace,
/// then reaping and staging-dir removal).
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a stopping server waits for the answers of its last calls to be written, once
/// their executions have ended.
const ANSWERS_WRITTEN_WAIT: Duration = Duration::from_secs(2);

// The arguments of execute_code a call may set: the same list the registry's entry checks.
use vibeos_supervisor::execute_code_tool::CALL_ARGUMENTS;

/// State shared by every connection of one server: the slots that bound concurrency and the
/// executions running now, so a closing connection (or the whole server) can interrupt its own.
pub(crate) struct Shared {
    registry: &'static ToolRegistry,
    pub(crate) settings: ServeSettings,
    /// The rules of the tools offered besides execute_code: in strict mode, those of a strict
    /// script's tools, so a client cannot reach directly what a script cannot.
    direct: DirectTools,
    slots: Arc<FairSlots>,
    next_id: AtomicU64,
    running: Mutex<HashMap<u64, (u64, Interrupt)>>,
    /// Calls waiting for a slot, and the bytes of code they hold ([`MAX_QUEUED_CALLS`]).
    queued_calls: std::sync::atomic::AtomicUsize,
    queued_code_bytes: std::sync::atomic::AtomicUsize,
    idle: Notify,
    /// The request ids each connection has in flight (a request reusing one is refused).
    pub(crate) in_flight: Arc<InFlight>,
}

impl Shared {
    /// The state of a server whose sessions may each have `per_session_queue` calls waiting
    /// for a slot (`fair_slots`).
    pub(crate) fn new(
        registry: &'static ToolRegistry,
        settings: ServeSettings,
        per_session_queue: usize,
    ) -> Arc<Self> {
        Arc::new(Shared {
            registry,
            direct: DirectTools::new(&settings.config),
            slots: FairSlots::new(settings.max_concurrent, per_session_queue),
            settings,
            next_id: AtomicU64::new(1),
            running: Mutex::new(HashMap::new()),
            queued_calls: Default::default(),
            queued_code_bytes: Default::default(),
            idle: Notify::new(),
            in_flight: Arc::default(),
        })
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (u64, Interrupt)>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Logs a warning for each `--toolsets` name that adds no tool, saying why for each of its
    /// tools: an operator who asked for a toolset and is served execute_code alone should
    /// not have to guess. Runs the availability checks (which may block).
    pub(crate) fn warn_idle_toolsets(&self) {
        for toolset in &self.settings.toolsets {
            let Ok(rows) = self
                .registry
                .tool_report(std::slice::from_ref(toolset), &[])
            else {
                continue;
            };
            let mut why = Vec::new();
            let mut offers = false;
            for row in &rows {
                let name = row.name.as_str();
                if name == EXECUTE_CODE {
                    offers = true;
                } else if vibeos_tools::AGENT_LOOP_TOOLS.contains(&name) {
                    why.push(format!(
                        "{name}: an agent-loop tool, which serve never offers (it belongs to the \
                         client's own loop)"
                    ));
                } else if let Err(e) = self.direct.offered(name) {
                    why.push(format!("{name}: {e}"));
                } else if let vibeos_tools::Availability::Unavailable(reason) = &row.availability {
                    why.push(format!("{name}: unavailable ({reason})"));
                } else {
                    offers = true;
                }
            }
            if !offers {
                if why.is_empty() {
                    why.push("it has no tools".into());
                }
                tracing::warn!(
                    "--toolsets {toolset}: no tool of it is offered; {}",
                    why.join("; ")
                );
            }
        }
    }

    /// Interrupts the executions of connection `conn` (all of them when `None`).
    pub(crate) fn interrupt(&self, conn: Option<u64>) -> usize {
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

    /// Refuses every call waiting for a slot, and every later one ("the server is shutting
    /// down"): the server is stopping.
    pub(crate) fn close_queue(&self) {
        self.slots.close();
    }

    /// The ordered stop of connection `conn` (every connection when `None`), shared by stdio
    /// and HTTP: calls waiting for a slot are refused ("the server is shutting down"), running
    /// ones interrupted, and this returns once their answers are written, or once
    /// [`DRAIN_TIMEOUT`] and then [`ANSWERS_WRITTEN_WAIT`] have passed (a client that does not
    /// read can hold its answers back for ever).
    pub(crate) async fn answer_last_calls(&self, conn: Option<u64>) {
        self.close_queue();
        self.interrupt(conn);
        self.wait_idle(conn, DRAIN_TIMEOUT).await;
        let answered = || match conn {
            Some(c) => self.in_flight.is_idle(&ConnKey::Conn(c)),
            None => self.in_flight.is_empty(),
        };
        let deadline = tokio::time::Instant::now() + ANSWERS_WRITTEN_WAIT;
        while !answered() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the executions of `conn` (all when `None`) have finished their cleanup.
    pub(crate) async fn wait_idle(&self, conn: Option<u64>, limit: Duration) {
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
    pub(crate) shared: Arc<Shared>,
    pub(crate) conn: u64,
    /// Dropped with the session's last handle (see [`SessionEnd`]).
    _session_end: Arc<SessionEnd>,
}

impl ExecServer {
    /// The server of connection `conn`.
    pub(crate) fn new(shared: Arc<Shared>, conn: u64) -> Self {
        ExecServer {
            shared,
            conn,
            _session_end: Arc::new(SessionEnd(conn)),
        }
    }
}

/// Ends what a session leaves behind when it ends: its background processes
/// (`terminal(background=true)`), which only its own `process` calls could reach. An HTTP
/// session closed with DELETE, or expired, left them running until the server exited, out of
/// every client's reach (stop 60's probe).
#[derive(Debug)]
pub(crate) struct SessionEnd(u64);

impl Drop for SessionEnd {
    fn drop(&mut self) {
        let task = crate::approval::task_id(self.0);
        // Killing waits out each process's grace; not on the runtime's thread.
        std::thread::spawn(move || {
            vibeos_tools::environments::background::end_task(Some(&task));
        });
    }
}

impl ExecServer {
    /// The connection of a request, as the front that passed it on names it: the HTTP session
    /// by its id, else this stdio connection.
    fn conn_key(&self, context: &RequestContext<RoleServer>) -> ConnKey {
        context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .map(|s| ConnKey::Session(s.to_string()))
            .unwrap_or(ConnKey::Conn(self.conn))
    }

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

    /// Names of the tools `--toolsets` adds (before availability checks), without the agent
    /// loop's and, in strict mode, without those strict mode cannot confine.
    fn extra_tools(&self) -> Result<BTreeSet<String>, ErrorData> {
        let mut names = self.selected_tools()?;
        names.retain(|name| self.shared.direct.offered(name).is_ok());
        Ok(names)
    }

    /// Names of the tools `--toolsets` selects, without the agent loop's.
    fn selected_tools(&self) -> Result<BTreeSet<String>, ErrorData> {
        if self.shared.settings.toolsets.is_empty() {
            return Ok(BTreeSet::new());
        }
        let entries = self
            .shared
            .registry
            .select_tools(&self.shared.settings.toolsets, &[])
            .map_err(|e| ErrorData::internal_error(format!("--toolsets: {e}"), None))?;
        // Agent-loop tools (todo, memory, ...) belong to the client's own loop: dispatch
        // refuses them, so a server that listed them would offer tools that always fail.
        Ok(entries
            .iter()
            .filter(|e| !vibeos_tools::AGENT_LOOP_TOOLS.contains(&e.name.as_str()))
            .map(|e| e.name.clone())
            .collect())
    }

    async fn call_execute_code(
        &self,
        args: Map<String, Value>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        if let Some(bad) = args.keys().find(|k| !CALL_ARGUMENTS.contains(&k.as_str())) {
            return Err(ErrorData::invalid_params(
                format!(
                    "execute_code has no argument `{bad}`; it takes code, timeout, max_tool_calls, stdout_limit and stderr_limit (mode and cwd are the server's settings)"
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
        ctx.task_id = Some(crate::approval::task_id(self.conn));
        let request = request_from(&args, &ctx, &settings.config)
            .map_err(|e| ErrorData::invalid_params(e.message, None))?;
        // Approvals of this call are asked of this client (elicitation).
        let _approvals =
            crate::approval::bind(&crate::approval::task_id(self.conn), context.peer.clone());

        // Stop when the client cancels, and (over HTTP) when its response stream goes away.
        let ct = context.ct.child_token();
        let progress = Progress::new(&context, ct.clone());
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
        // Queue: wait for a slot, telling the client why it waits (at once, then every
        // PROGRESS_EVERY), until cancelled. A free slot is taken first: the interval's first
        // tick is immediate, and raced against a ready slot it told a call that never waited
        // that every slot was busy. Sessions take turns for freed slots (`fair_slots`).
        let shutting_down = || ErrorData::internal_error("the server is shutting down", None);
        let permit = match slots.try_acquire() {
            Ok(Some(permit)) => permit,
            Err(_) => return Err(shutting_down()),
            Ok(None) => {
                let code_bytes = args.get("code").and_then(Value::as_str).map_or(0, str::len);
                let Some(_place) = self.shared.take_queue_place(code_bytes) else {
                    return Err(ErrorData::new(
                        rmcp::model::ErrorCode(-32000),
                        format!(
                            "the server is busy: all {} execution slots are taken \
                             (--max-concurrent) and {} calls, or {} MiB of code, already wait \
                             for one; retry when one ends",
                            settings.max_concurrent,
                            MAX_QUEUED_CALLS,
                            MAX_QUEUED_CODE_BYTES >> 20
                        ),
                        None,
                    ));
                };
                let acquire = match slots.acquire(self.conn) {
                    Ok(acquire) => acquire,
                    Err(NoSlot::Closed) => return Err(shutting_down()),
                    Err(NoSlot::SessionQueueFull) => {
                        return Err(ErrorData::new(
                            rmcp::model::ErrorCode(-32000),
                            format!(
                                "the server is busy: all {} execution slots are taken \
                                 (--max-concurrent) and this session already has {} calls \
                                 waiting for one, the most one session may have (other \
                                 sessions take turns with it); retry when one ends",
                                settings.max_concurrent,
                                slots.per_session()
                            ),
                            None,
                        ))
                    }
                };
                tokio::pin!(acquire);
                let mut tick = tokio::time::interval(PROGRESS_EVERY);
                loop {
                    // Cancellation first: a tick ready at the same time must not report
                    // progress of a call the client has given up.
                    tokio::select! {
                        biased;
                        _ = ct.cancelled() => return Err(ErrorData::internal_error("cancelled by the client while queued", None)),
                        permit = &mut acquire => break permit.map_err(|_| shutting_down())?,
                        _ = tick.tick() => progress.send(format!(
                            "queued: all {} execution slots are busy (--max-concurrent), waited {:.0}s",
                            settings.max_concurrent, started.elapsed().as_secs_f64()
                        )).await,
                    }
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
                biased;
                result = &mut run => break result,
                _ = ct.cancelled(), if !cancelled => {
                    cancelled = true;
                    interrupt.interrupt();
                }
                // A cancelled call is not reported on while its script is being stopped.
                _ = tick.tick(), if !cancelled => progress.send(format!(
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
        ct: tokio_util::sync::CancellationToken,
    ) -> Result<CallToolResult, ErrorData> {
        let registry = self.shared.registry;
        // In strict mode the call carries the strict path policy (and is refused outright for a
        // tool strict mode does not offer): the server's rights are not the client's.
        let mut ctx = match self.shared.direct.context(&name, &self.shared.settings.cwd) {
            Ok(ctx) => ctx,
            Err(e @ DirectCallError::NotOffered { .. }) => {
                return Err(ErrorData::invalid_params(e.to_string(), None))
            }
            Err(e @ DirectCallError::Config(_)) => {
                tracing::error!("{name}: {e}");
                let text = serde_json::json!({ "error": e.to_string() }).to_string();
                return Ok(CallToolResult::error(vec![ContentBlock::text(text)]));
            }
        };
        let task_id = crate::approval::task_id(self.conn);
        let _approvals = crate::approval::bind(&task_id, peer);
        ctx.task_id = Some(task_id);
        // A client that cancels the request (or a dropped request) cancels the call: the
        // command it runs (`terminal`) is killed, and none starts after a pending approval.
        // It would otherwise run on to its own timeout.
        static NEXT_CALL: AtomicU64 = AtomicU64::new(1);
        let call = NEXT_CALL.fetch_add(1, Ordering::Relaxed);
        let mut cancel = CancelOnDrop(Some(call));
        let work = tokio::task::spawn_blocking(move || {
            vibeos_tools::environments::local::in_call(call, || {
                registry.handle_function_call(&name, &Value::Object(args), &ctx)
            })
        });
        let text = tokio::select! {
            done = work => done.map_err(|e| {
                ErrorData::internal_error(format!("the tool call failed: {e}"), None)
            })?,
            _ = ct.cancelled() => {
                return Err(ErrorData::internal_error("cancelled by the client", None));
            }
        };
        cancel.0 = None;
        let parsed: Option<Value> = serde_json::from_str(&text).ok();
        // A tool's own error is a non-null `error` (terminal's results always carry the key).
        let is_error = parsed
            .as_ref()
            .and_then(Value::as_object)
            .is_some_and(|o| o.get("error").is_some_and(|e| !e.is_null()));
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

/// Cancels the registry call it holds when dropped before the call returned.
struct CancelOnDrop(Option<u64>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(call) = self.0 {
            vibeos_tools::environments::local::cancel_call(call);
        }
    }
}

/// Progress notifications of one call, when the client sent a `progressToken`, until the call
/// is cancelled: the client has given up on it and hears nothing more of it.
struct Progress {
    target: Option<(ProgressToken, rmcp::Peer<RoleServer>)>,
    count: AtomicU64,
    cancelled: tokio_util::sync::CancellationToken,
}

impl Progress {
    fn new(
        context: &RequestContext<RoleServer>,
        cancelled: tokio_util::sync::CancellationToken,
    ) -> Self {
        Progress {
            target: context
                .meta
                .get_progress_token()
                .map(|t| (t, context.peer.clone())),
            count: AtomicU64::new(0),
            cancelled,
        }
    }

    async fn send(&self, message: String) {
        let Some((token, peer)) = &self.target else {
            return;
        };
        if self.cancelled.is_cancelled() {
            return;
        }
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
        // The id stays in flight until this handler returns, even when the client cancelled
        // the call (see crate::inflight).
        let _held = HandlerHold {
            table: self.shared.in_flight.clone(),
            conn: self.conn_key(&context),
            id: context.id.clone(),
        };
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
            // A tool of --toolsets that strict mode keeps back: say why, and what would open it.
            if let Err(e) = self.shared.direct.offered(&name) {
                let this = self.clone();
                let selected = tokio::task::spawn_blocking(move || this.selected_tools())
                    .await
                    .map_err(|e| {
                        ErrorData::internal_error(format!("listing tools failed: {e}"), None)
                    })??;
                if selected.contains(&name) {
                    return Err(ErrorData::invalid_params(e.to_string(), None));
                }
            }
            let names: Vec<String> = offered.iter().map(|t| t.name.to_string()).collect();
            let what = if vibeos_tools::AGENT_LOOP_TOOLS.contains(&name.as_str()) {
                format!(
                    "`{name}` is an agent-loop tool: it belongs to the client's own agent loop, \
                     and serve never offers it (not even with --toolsets)"
                )
            } else {
                format!("unknown tool `{name}`")
            };
            return Err(ErrorData::invalid_params(
                format!("{what}; this server offers: {}", names.join(", ")),
                None,
            ));
        }
        self.call_registry_tool(name, args, context.peer.clone(), context.ct.clone())
            .await
            .map(Into::into)
    }
}
