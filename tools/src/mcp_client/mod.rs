//! Tools from external MCP servers (SPEC §7): the client side.
//!
//! Each configured server (stdio child process or streamable-HTTP endpoint) becomes an
//! [`McpServer`]: started eagerly or on the first definitions build, its `tools/list` registered
//! as the dynamic toolset `mcp-<name>`, every call dispatched through the registry like any tool
//! (hooks, error wrapping, result cap) and sent with the official Rust SDK (`rmcp`). The same
//! code hosts plugins: the Python plugin host is an MCP stdio server whose tools carry their
//! plugin module in `_meta`, and they are registered as `plugin-<module>` toolsets.
//!
//! Failure handling is the point of this module: a server that cannot start, speaks garbage or
//! never answers is logged with its name and skipped; a server that dies is restarted once and
//! the caller gets a clear error if it stays down; a hung call ends at the per-call timeout and
//! holds no lock while it waits, so other tools (and other calls of the same server) go on.

mod config;
mod precedence;
mod result;
mod spec;
mod stdio;

pub use config::{
    McpConfigError, McpServerConfig, PluginsConfig, ScriptCallable, Startup, DEFAULT_CALL_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT, PLUGIN_HOST,
};
pub use spec::{ServerKind, ServerReport, ServerSpec, ServerState};
pub use stdio::{MAX_MESSAGE_BYTES, STOP_GRACE};

use result::{result_value, too_large};
use stdio::forward_stderr;

use crate::entry::{ToolEntry, ToolSource};
use crate::registry::{Prepare, ToolRegistry};
use crate::url_mask::{mask_url, mask_urls_in};
use crate::{run_async, CheckFn, ToolError};
use rmcp::model::{CallToolRequestParams, ClientConfig, Implementation, Tool};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// `_meta` key naming the plugin module a plugin-host tool comes from.
pub const PLUGIN_META_KEY: &str = "vibeos/plugin";
/// `_meta` key marking a plugin tool its plugin opened to scripts.
pub const PLUGIN_SCRIPT_META_KEY: &str = "vibeos/script_callable";
/// `_meta` key of a plugin-host tool: the environment variables it needs (list of str).
pub const PLUGIN_REQUIRES_ENV_META_KEY: &str = "vibeos/requires_env";
/// `_meta` key of a plugin-host tool: its emoji (str).
pub const PLUGIN_EMOJI_META_KEY: &str = "vibeos/emoji";
/// `_meta` key of a plugin-host tool whose `check_fn` fails in the host: why (str).
pub const PLUGIN_UNAVAILABLE_META_KEY: &str = "vibeos/unavailable";
/// Key of the JSON object in the plugin host's `instructions` listing plugins that failed.
pub const PLUGIN_FAILURES_KEY: &str = "vibeos_plugin_failures";

type Client = RunningService<RoleClient, Notifier>;

enum Conn {
    None,
    Up {
        client: Arc<Client>,
        /// Process group a stdio server leads (its pid).
        group: Option<u32>,
    },
    Down(String),
    Stopped,
}

/// Where a server's tool-list refresh stands: notifications that come while one runs are
/// folded into one more refresh after it, however many there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refresh {
    /// None runs.
    Idle,
    /// One runs, and nothing came since it started.
    Running,
    /// One runs, and the list changed again since it started.
    RunningThenAgain,
}

/// One configured server and its connection.
pub struct McpServer {
    spec: ServerSpec,
    call_timeout: Duration,
    start_timeout: Duration,
    registry: &'static ToolRegistry,
    conn: tokio::sync::Mutex<Conn>,
    state: Mutex<ServerState>,
    toolsets: Mutex<Vec<String>>,
    /// The tool list last registered, as the server sent it: a `list_changed` that changes
    /// nothing registers nothing (a storm of them rotated agent.log through 60 MB).
    listed: Mutex<Option<Value>>,
    /// Whether a refresh runs, and whether another notification came while it ran.
    refreshing: Mutex<Refresh>,
    plugin_failures: Mutex<BTreeMap<String, String>>,
    check: CheckFn,
    /// This server's place among its manager's servers: which of two same-named tools wins.
    order: Arc<precedence::ServerOrder>,
    this: Weak<McpServer>,
}

/// Receives the server's notifications; a changed tool list is fetched again off the
/// notification path (the service loop must stay free to deliver the answer).
struct Notifier {
    server: Weak<McpServer>,
}

impl ClientHandler for Notifier {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + Send + '_ {
        let server = self.server.clone();
        async move {
            if let Some(server) = server.upgrade() {
                if server.refresh_wanted() {
                    tokio::spawn(async move { server.refresh_until_current().await });
                }
            }
        }
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            Default::default(),
            Implementation::new("vibeos-exec", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// The config key that sets `key` (`timeout`, `connect_timeout`) for a server, as a hint names
/// it: the plugin host's are in the `plugins:` section, an MCP server's in its `mcp_servers:`
/// entry.
fn config_key(kind: ServerKind, name: &str, key: &str) -> String {
    match kind {
        ServerKind::Mcp => format!("mcp_servers.{name}.{key}"),
        ServerKind::Plugins => format!("plugins.{key}"),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}")
    } else {
        format!("{s}")
    }
}

impl McpServer {
    /// A server, not started. Fails on a config entry that cannot be used.
    pub fn new(
        spec: ServerSpec,
        registry: &'static ToolRegistry,
    ) -> Result<Arc<Self>, McpConfigError> {
        let order = match spec.kind {
            ServerKind::Mcp => precedence::ServerOrder::new(vec![spec.name.clone()], None),
            ServerKind::Plugins => {
                precedence::ServerOrder::new(Vec::new(), Some(spec.name.clone()))
            }
        };
        Self::new_in(spec, registry, Arc::new(order))
    }

    /// A server of a manager whose servers are in `order` (see [`precedence`]).
    fn new_in(
        spec: ServerSpec,
        registry: &'static ToolRegistry,
        order: Arc<precedence::ServerOrder>,
    ) -> Result<Arc<Self>, McpConfigError> {
        spec.config.validate(&spec.name)?;
        let call_timeout = spec.config.call_timeout(&spec.name)?;
        let start_timeout = spec.config.start_timeout(&spec.name)?;
        Ok(Arc::new_cyclic(|this: &Weak<McpServer>| {
            let weak = this.clone();
            let check: CheckFn = Arc::new(move || {
                weak.upgrade()
                    .is_some_and(|s| matches!(*lock(&s.state), ServerState::Running(_)))
            });
            McpServer {
                spec,
                call_timeout,
                start_timeout,
                registry,
                conn: tokio::sync::Mutex::new(Conn::None),
                state: Mutex::new(ServerState::NotStarted),
                toolsets: Mutex::new(Vec::new()),
                listed: Mutex::new(None),
                refreshing: Mutex::new(Refresh::Idle),
                plugin_failures: Mutex::new(BTreeMap::new()),
                check,
                order,
                this: this.clone(),
            }
        }))
    }

    /// The server's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// Its spec.
    pub fn spec(&self) -> &ServerSpec {
        &self.spec
    }

    /// Where it is in its life.
    pub fn state(&self) -> ServerState {
        lock(&self.state).clone()
    }

    /// Plugins the plugin host could not load, by module, with the reason.
    pub fn plugin_failures(&self) -> BTreeMap<String, String> {
        lock(&self.plugin_failures).clone()
    }

    /// Whether the toolset `name` is (or would be, once started) one of this server's.
    fn owns_toolset(&self, name: &str) -> bool {
        match self.spec.kind {
            ServerKind::Mcp => name
                .strip_prefix("mcp-")
                .is_some_and(|server| server == self.spec.name),
            ServerKind::Plugins => name.starts_with("plugin-"),
        }
    }

    fn label(&self) -> String {
        match self.spec.kind {
            ServerKind::Mcp => format!("MCP server `{}`", self.spec.name),
            ServerKind::Plugins => "the plugin host".to_string(),
        }
    }

    fn set_state(&self, s: ServerState) {
        *lock(&self.state) = s;
    }

    /// Starts the server unless it was started (or tried) already.
    pub async fn ensure_started(&self) {
        let mut conn = self.conn.lock().await;
        if matches!(*conn, Conn::None) {
            let _ = self.start_locked(&mut conn).await;
        }
    }

    async fn start_locked(&self, conn: &mut Conn) -> Result<Arc<Client>, String> {
        match self.connect().await {
            Ok((client, group, tools)) => {
                let client = Arc::new(client);
                self.read_plugin_failures(&client);
                *conn = Conn::Up {
                    client: client.clone(),
                    group,
                };
                let n = self.register_tools(tools);
                self.set_state(ServerState::Running(n));
                tracing::info!("{} started with {n} tools", self.label());
                Ok(client)
            }
            Err(reason) => {
                // Shown by `tools list` and logged: no credential of a server URL in it, and
                // none of the server's control characters (an `initialize` error holding
                // `ESC[2J` cleared the terminal; a newline forged a log line).
                let reason = crate::error::one_line(&mask_urls_in(&reason));
                let reason = match &self.spec.start_hint {
                    Some(hint) => format!("{reason} ({hint})"),
                    None => reason,
                };
                tracing::warn!("{}: skipped: {reason}", self.label());
                *conn = Conn::Down(reason.clone());
                self.set_state(ServerState::Failed(reason.clone()));
                Err(reason)
            }
        }
    }

    async fn connect(&self) -> Result<(Client, Option<u32>, Vec<Tool>), String> {
        let handler = Notifier {
            server: self.this.clone(),
        };
        let cfg = &self.spec.config;
        let work = async {
            let (client, group) = if let Some(command) = &cfg.command {
                let spawned = stdio::spawn(
                    &self.label(),
                    command,
                    &cfg.args,
                    self.spec.env.as_deref(),
                    cfg.cwd.as_deref(),
                )?;
                if let Some(stderr) = spawned.stderr {
                    tokio::spawn(forward_stderr(self.label(), stderr));
                }
                let client = handler
                    .serve(spawned.transport)
                    .await
                    .map_err(|e| format!("did not complete the MCP handshake: {e}"))?;
                (client, spawned.pid)
            } else if let Some(url) = &cfg.url {
                // reqwest is built without a default TLS provider; use ring, as the web tools do.
                let _ = rustls::crypto::ring::default_provider().install_default();
                let mut headers = std::collections::HashMap::new();
                for (k, v) in &cfg.headers {
                    let name = http::HeaderName::try_from(k.as_str())
                        .map_err(|e| format!("header name `{k}` is not valid: {e}"))?;
                    let value = http::HeaderValue::try_from(v.as_str())
                        .map_err(|e| format!("header `{k}` has a value that is not valid: {e}"))?;
                    headers.insert(name, value);
                }
                let config = rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(headers);
                let transport = rmcp::transport::StreamableHttpClientTransport::from_config(config);
                let client = handler.serve(transport).await.map_err(|e| {
                    // The URL may hold a password or a key, and the HTTP client's error
                    // quotes it: both are masked.
                    format!(
                        "cannot connect to {}: {}",
                        mask_url(url),
                        mask_urls_in(&e.to_string())
                    )
                })?;
                (client, None)
            } else {
                return Err("neither `command` nor `url` is set".to_string());
            };
            let tools = client
                .list_all_tools()
                .await
                .map_err(|e| format!("tools/list failed: {e}"))?;
            Ok((client, group, tools))
        };
        match tokio::time::timeout(self.start_timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "did not start within {} s (raise {} if it is slow to start)",
                secs(self.start_timeout),
                config_key(self.spec.kind, &self.spec.name, "connect_timeout")
            )),
        }
    }

    fn read_plugin_failures(&self, client: &Client) {
        if self.spec.kind != ServerKind::Plugins {
            return;
        }
        let Some(info) = client.peer_info() else {
            return;
        };
        let Some(text) = info.instructions.as_deref() else {
            return;
        };
        let failures: BTreeMap<String, String> = serde_json::from_str::<Value>(text)
            .ok()
            .and_then(|v| v.get(PLUGIN_FAILURES_KEY).cloned())
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        for (module, why) in &failures {
            tracing::warn!("plugin `{module}` skipped: {why}");
        }
        *lock(&self.plugin_failures) = failures;
    }

    /// Registers `tools` (replacing this server's previous toolsets); returns how many were
    /// registered. Bad tools are logged with the server's name and skipped, and so are tools
    /// whose name a server listed before this one holds ([`precedence`]).
    /// Registers the server's `tools` in place of what it listed before. Make before break: a
    /// tool listed before and now is replaced in place, never absent for a moment (a call
    /// made while the list was fetched again used to find no such tool); what is no longer
    /// listed goes afterwards.
    fn register_tools(&self, tools: Vec<Tool>) -> usize {
        let _registering = self.order.registering();
        *lock(&self.listed) = serde_json::to_value(&tools).ok();
        let old_toolsets = std::mem::take(&mut *lock(&self.toolsets));
        let ours_before: BTreeMap<String, Arc<ToolEntry>> = self
            .registry
            .entries()
            .into_iter()
            .filter(|e| e.source.is_external() && old_toolsets.contains(&e.toolset))
            .map(|e| (e.name.clone(), e))
            .collect();
        let mut groups: BTreeMap<String, (ToolSource, Vec<ToolEntry>)> = BTreeMap::new();
        let mut script_open = Vec::new();
        let mut listed = std::collections::BTreeSet::new();
        for tool in tools {
            // A name listed twice: the later one replaced the first without a word, and a
            // script calling the first's arguments got a TypeError.
            if !listed.insert(tool.name.to_string()) {
                tracing::warn!(
                    "{}: tool `{}` is listed twice; the first one is kept (rename one to use both)",
                    self.label(),
                    tool.name
                );
                continue;
            }
            let raw = serde_json::to_value(&tool).unwrap_or(Value::Null);
            let meta = raw.get("_meta").cloned().unwrap_or(Value::Null);
            let (toolset, source) = match self.spec.kind {
                ServerKind::Mcp => (
                    format!("mcp-{}", self.spec.name),
                    ToolSource::Mcp(self.spec.name.clone()),
                ),
                ServerKind::Plugins => {
                    let module = meta
                        .get(PLUGIN_META_KEY)
                        .and_then(Value::as_str)
                        .unwrap_or("unknown")
                        .to_string();
                    if meta.get(PLUGIN_SCRIPT_META_KEY) == Some(&Value::Bool(true)) {
                        script_open.push(tool.name.to_string());
                    }
                    (
                        format!("plugin-{}", sanitize(&module)),
                        ToolSource::Plugin(module),
                    )
                }
            };
            let name = tool.name.to_string();
            // A tool that moved to another of this server's toolsets (a plugin tool now from
            // another module) goes first: it would shadow its old self.
            if ours_before
                .get(&name)
                .is_some_and(|was| was.toolset != toolset)
            {
                self.registry.unregister(&name);
            }
            let earlier = self
                .order
                .held_by_earlier(&self.spec.name, self.registry, &name);
            if let Some(winner) = earlier {
                tracing::warn!(
                    "{}: tool `{name}` left out: MCP server `{winner}`, listed before it in \
                     mcp_servers (the plugins come after every server), has a tool of that \
                     name (the first listed wins; rename or disable one to use both)",
                    self.label()
                );
                continue;
            }
            let schema = Value::Object((*tool.input_schema).clone());
            let description = tool
                .description
                .as_deref()
                .map(str::to_string)
                .unwrap_or_else(|| format!("{name} (from {})", self.label()));
            let weak = self.this.clone();
            let label = self.label();
            let tool_name = name.clone();
            let entry = ToolEntry::new_async(
                name,
                toolset.clone(),
                description,
                schema,
                move |args, _ctx| {
                    let server = weak.upgrade();
                    let tool = tool_name.clone();
                    let label = label.clone();
                    async move {
                        match server {
                            Some(s) => s.call(&tool, args).await,
                            None => Err(ToolError::new(
                                crate::ToolErrorKind::McpServerGone,
                                format!("{label} was removed; `{tool}` cannot be called"),
                            )),
                        }
                    }
                },
            )
            .with_shared_check(&self.check);
            let entry = match self.spec.kind {
                ServerKind::Plugins => self.with_plugin_meta(entry, &meta),
                ServerKind::Mcp => entry,
            };
            groups
                .entry(toolset)
                .or_insert_with(|| (source, Vec::new()))
                .1
                .push(entry);
        }
        let mut count = 0;
        let mut names = Vec::new();
        for (toolset, (source, entries)) in groups {
            let total = entries.len();
            let description = format!("tools of {source}");
            match self.registry.register_dynamic_toolset(
                &toolset,
                &description,
                source.clone(),
                entries,
            ) {
                Ok(failures) => {
                    for f in &failures {
                        tracing::warn!("{}: skipped a tool: {f}", self.label());
                    }
                    count += total - failures.len();
                    names.push(toolset);
                }
                Err(e) => tracing::warn!("{}: toolset `{toolset}` skipped: {e}", self.label()),
            }
        }
        for name in script_open {
            if let Err(e) = self.registry.allow_in_scripts(&name) {
                tracing::warn!("{}: {e}", self.label());
            }
        }
        // Now what is no longer listed (or no longer registers): whole toolsets, then each
        // entry of before that nothing replaced.
        for old in old_toolsets.iter().filter(|t| !names.contains(t)) {
            let _ = self.registry.remove_toolset(old);
        }
        for (name, before) in &ours_before {
            if self
                .registry
                .get(name)
                .is_some_and(|now| Arc::ptr_eq(&now, before))
            {
                self.registry.unregister(name);
            }
        }
        *lock(&self.toolsets) = names;
        count
    }

    /// What the plugin host says of a tool beyond MCP (its `_meta`, see plugin_host.py): the
    /// variables it needs (checked here, as for any tool), its emoji, and, for a tool whose
    /// `check_fn` fails there, why — such a tool is registered unavailable, so `tools list`
    /// shows it with its reason instead of not at all.
    fn with_plugin_meta(&self, mut entry: ToolEntry, meta: &Value) -> ToolEntry {
        if let Some(vars) = meta
            .get(PLUGIN_REQUIRES_ENV_META_KEY)
            .and_then(Value::as_array)
        {
            entry.requires_env = vars
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
        }
        if let Some(emoji) = meta.get(PLUGIN_EMOJI_META_KEY).and_then(Value::as_str) {
            entry.emoji = emoji.to_string();
        }
        if let Some(why) = meta
            .get(PLUGIN_UNAVAILABLE_META_KEY)
            .and_then(Value::as_str)
        {
            tracing::warn!(
                "{}: tool `{}` is unavailable: {}",
                self.label(),
                entry.name,
                bounded_text(why.to_string(), 1024)
            );
            entry = entry.with_instant_check(|| false);
        }
        entry
    }

    /// Notes a `list_changed`; true when the caller is to start the refresh (none runs).
    fn refresh_wanted(&self) -> bool {
        let mut state = lock(&self.refreshing);
        let start = *state == Refresh::Idle;
        *state = match *state {
            Refresh::Idle => Refresh::Running,
            Refresh::Running | Refresh::RunningThenAgain => Refresh::RunningThenAgain,
        };
        start
    }

    /// Fetches the tool list again, once more for every burst of notifications that came while
    /// it did.
    async fn refresh_until_current(&self) {
        loop {
            self.refresh_tools().await;
            let mut state = lock(&self.refreshing);
            if *state == Refresh::RunningThenAgain {
                *state = Refresh::Running;
                continue;
            }
            *state = Refresh::Idle;
            return;
        }
    }

    async fn refresh_tools(&self) {
        let client = match &*self.conn.lock().await {
            Conn::Up { client, .. } => client.clone(),
            _ => return,
        };
        match tokio::time::timeout(self.start_timeout, client.list_all_tools()).await {
            Ok(Ok(tools)) => {
                let raw = serde_json::to_value(&tools).ok();
                if raw.is_some() && *lock(&self.listed) == raw {
                    tracing::debug!("{}: tool list changed; nothing in it did", self.label());
                    return;
                }
                let n = self.register_tools(tools);
                self.set_state(ServerState::Running(n));
                tracing::info!("{}: tool list changed; {n} tools now", self.label());
            }
            Ok(Err(e)) => tracing::warn!("{}: cannot refresh its tools: {e}", self.label()),
            Err(_) => tracing::warn!("{}: tools/list did not answer; tools kept", self.label()),
        }
    }

    /// The connection for a call: starts a lazy server, restarts one that died while idle
    /// (once), or fails with the reason it is down.
    async fn client_for_call(&self) -> Result<Arc<Client>, ToolError> {
        let mut conn = self.conn.lock().await;
        let down = |label: String, why: &str| {
            ToolError::new(
                crate::ToolErrorKind::McpServerDown,
                format!("{label} is down: {why}; fix it and restart vibeos-exec"),
            )
        };
        match &*conn {
            Conn::Up { client, .. } if !client.is_transport_closed() => Ok(client.clone()),
            Conn::Up { .. } => {
                tracing::warn!("{} exited; restarting it once", self.label());
                self.start_locked(&mut conn).await.map_err(|why| {
                    down(
                        self.label(),
                        &format!("it exited and the restart failed: {why}"),
                    )
                })
            }
            Conn::None => self
                .start_locked(&mut conn)
                .await
                .map_err(|why| down(self.label(), &why)),
            Conn::Down(why) => Err(down(self.label(), why)),
            Conn::Stopped => Err(down(
                self.label(),
                "it was stopped (vibeos-exec is exiting)",
            )),
        }
    }

    /// After a call found the connection dead: restart once (unless another call already
    /// did). Returns the restart's failure reason.
    async fn restart_after_crash(&self, dead: &Arc<Client>) -> Result<(), String> {
        let mut conn = self.conn.lock().await;
        match &*conn {
            Conn::Up { client, .. } if Arc::ptr_eq(client, dead) => {
                tracing::warn!("{} exited during a call; restarting it once", self.label());
                self.start_locked(&mut conn).await.map(|_| ())
            }
            Conn::Up { .. } => Ok(()),
            Conn::Down(why) => Err(why.clone()),
            Conn::None | Conn::Stopped => Err("it is not running".into()),
        }
    }

    /// Calls `tool` with `args`, bounded by the per-call timeout.
    pub async fn call(&self, tool: &str, args: Map<String, Value>) -> Result<Value, ToolError> {
        let client = self.client_for_call().await?;
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = Some(args);
        match tokio::time::timeout(self.call_timeout, client.call_tool(params)).await {
            Err(_) => Err(ToolError::new(
                crate::ToolErrorKind::McpTimeout,
                format!(
                    "{} did not answer `{tool}` within {} s; the call was abandoned (raise {} \
                     if the tool is slow)",
                    self.label(),
                    secs(self.call_timeout),
                    config_key(self.spec.kind, &self.spec.name, "timeout")
                ),
            )),
            Ok(Ok(result)) => result_value(&self.label(), tool, result),
            Ok(Err(e)) => {
                let dead = client.is_transport_closed()
                    || matches!(
                        e,
                        rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_)
                    );
                if let Some(limit) = too_large(&e) {
                    return Err(ToolError::new(
                        crate::ToolErrorKind::McpResponseTooLarge,
                        format!(
                            "{} answered `{tool}` with a response larger than {} MiB ({limit} \
                             bytes), the largest MCP message accepted; it was discarded. Ask \
                             the tool for less (a narrower query, a page of the results), or \
                             have it write the data to a file and return the path",
                            self.label(),
                            limit >> 20
                        ),
                    ));
                }
                if !dead {
                    return Err(ToolError::new(
                        crate::ToolErrorKind::McpError,
                        format!(
                            "{} failed `{tool}`: {}",
                            self.label(),
                            mask_urls_in(&call_error_text(&e))
                        ),
                    ));
                }
                let message = match self.restart_after_crash(&client).await {
                    Ok(()) => format!(
                        "{} exited during the call to `{tool}`; it was restarted, so the call \
                         may be retried (it may have partly run)",
                        self.label()
                    ),
                    Err(why) => format!(
                        "{} exited during the call to `{tool}` and could not be restarted: {why}",
                        self.label()
                    ),
                };
                Err(ToolError::new(
                    crate::ToolErrorKind::McpServerCrashed,
                    message,
                ))
            }
        }
    }

    /// Stops the server: ends the session and, for a stdio server, its whole process group.
    /// The server first gets the stdio shutdown sequence (its stdin closed, [`STOP_GRACE`] to
    /// exit, then SIGKILL to the group); whatever it started and left behind in its group is
    /// then killed too. Bounded: an HTTP session whose end hangs is let go after the same
    /// grace.
    pub async fn stop(&self) {
        let previous = std::mem::replace(&mut *self.conn.lock().await, Conn::Stopped);
        if let Conn::Up { client, group } = previous {
            match Arc::try_unwrap(client) {
                Ok(client) => {
                    let ending = client.cancel();
                    if tokio::time::timeout(STOP_GRACE + Duration::from_secs(1), ending)
                        .await
                        .is_err()
                    {
                        tracing::warn!(
                            "{} did not end its session within {} s; let go",
                            self.label(),
                            secs(STOP_GRACE)
                        );
                    }
                }
                // Calls still hold the session: cancelling ends its loop, and the transport
                // kills the group when the last holder lets go.
                Err(shared) => shared.cancellation_token().cancel(),
            }
            if let Some(group) = group.and_then(|g| i32::try_from(g).ok()) {
                // A group id stays taken while any member lives, so this reaches only what the
                // server left behind; with nothing left it is ESRCH (reuse of the id would need
                // the pid space to wrap within this instant).
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(group),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        self.set_state(ServerState::Stopped);
    }
}

fn sanitize(module: &str) -> String {
    module
        .chars()
        .map(|c| {
            // `_` and `.` kept: a module `p_long` is toolset `plugin-p_long`, as written.
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect::<String>()
        .to_ascii_lowercase()
}

/// All configured servers (and the plugin host) of one registry.
pub struct McpManager {
    servers: Vec<Arc<McpServer>>,
}

impl McpManager {
    /// Creates the servers of `specs` (bad entries are logged and skipped), registers the
    /// prepare hook that starts lazy ones, opens script-callable ones to scripts, and starts
    /// the eager ones (in parallel, each bounded by its start-up timeout).
    pub fn start(specs: Vec<ServerSpec>, registry: &'static ToolRegistry) -> Arc<McpManager> {
        // The MCP servers in config order, then the plugin host: the first listed wins a tool
        // name they share.
        let order = Arc::new(precedence::ServerOrder::new(
            specs
                .iter()
                .filter(|s| s.kind == ServerKind::Mcp)
                .map(|s| s.name.clone())
                .collect(),
            specs
                .iter()
                .find(|s| s.kind == ServerKind::Plugins)
                .map(|s| s.name.clone()),
        ));
        let mut servers = Vec::new();
        for spec in specs {
            if !spec.config.is_enabled() {
                continue;
            }
            let name = spec.name.clone();
            let opened = spec.config.script_callable.opened();
            match McpServer::new_in(spec, registry, Arc::clone(&order)) {
                Ok(s) => {
                    if let Some(tools) = opened {
                        if s.spec.kind == ServerKind::Mcp {
                            registry.allow_mcp_server_in_scripts(&name, tools);
                        }
                    }
                    servers.push(s);
                }
                Err(e) => tracing::warn!("MCP server `{name}` skipped: {e}"),
            }
        }
        let manager = Arc::new(McpManager { servers });
        let weak = Arc::downgrade(&manager);
        registry.add_prepare_hook(move |_, what| {
            if let Some(m) = weak.upgrade() {
                m.start_lazy(what);
            }
        });
        let eager: Vec<Arc<McpServer>> = manager
            .servers
            .iter()
            .filter(|s| s.spec.config.startup == Startup::Eager)
            .cloned()
            .collect();
        start_all(eager);
        manager
    }

    fn start_lazy(&self, what: Prepare) {
        let todo: Vec<Arc<McpServer>> = self
            .servers
            .iter()
            .filter(|s| s.state() == ServerState::NotStarted)
            .filter(|s| match what {
                Prepare::Definitions => true,
                // The plugin host too: its plugins open their own tools to scripts, which is
                // known only once it runs (a script's first execution missed them, and the
                // description listed them after a definitions build).
                Prepare::Scripts => {
                    s.spec.kind == ServerKind::Plugins
                        || s.spec.config.script_callable.opened().is_some()
                }
            })
            .cloned()
            .collect();
        start_all(todo);
    }

    /// Starts every server not started yet.
    pub fn start_all(&self) {
        start_all(self.servers.clone());
    }

    /// Starts the servers not started yet whose toolsets `names` name: `mcp-<server>`, or any
    /// `plugin-…` for the plugin host. A command line that names a lazy server's toolset
    /// (`serve --toolsets`, `tools list --enable-toolsets`) needs its tools registered before
    /// the name can be resolved; other lazy servers stay unstarted.
    pub fn start_for_toolsets(&self, names: &[String]) {
        let todo: Vec<Arc<McpServer>> = self
            .servers
            .iter()
            .filter(|s| s.state() == ServerState::NotStarted)
            .filter(|s| names.iter().any(|n| s.owns_toolset(n.trim())))
            .cloned()
            .collect();
        start_all(todo);
    }

    /// Why the toolset `name` has no tools, when it is a configured server's and that server
    /// failed, or a plugin's that the plugin host could not load: what failed and why.
    pub fn failed_toolset(&self, name: &str) -> Option<String> {
        let name = name.trim();
        if let Some(why) = self
            .servers
            .iter()
            .find(|s| s.owns_toolset(name))
            .and_then(|s| match s.state() {
                ServerState::Failed(why) => Some(format!("{} failed: {why}", s.label())),
                _ => None,
            })
        {
            return Some(why);
        }
        // A plugin the plugin host could not load has no toolset, but its name is known: it is
        // a failed one, not an unknown one (`serve --toolsets plugin-x` exited on it).
        self.servers.iter().find_map(|s| {
            s.plugin_failures()
                .into_iter()
                .find(|(module, _)| format!("plugin-{}", sanitize(module)) == name)
                .map(|(module, why)| format!("plugin {module} failed to load: {why}"))
        })
    }

    /// The servers.
    pub fn servers(&self) -> &[Arc<McpServer>] {
        &self.servers
    }

    /// A row per server, then one per plugin the plugin host could not load.
    pub fn report(&self) -> Vec<ServerReport> {
        let mut rows = Vec::new();
        for s in &self.servers {
            let cfg = &s.spec.config;
            let transport = match (&cfg.command, &cfg.url) {
                (Some(c), _) => format!("stdio: {c}"),
                (None, Some(u)) => format!("http: {}", mask_url(u)),
                _ => String::new(),
            };
            let kind = match s.spec.kind {
                ServerKind::Mcp => "mcp",
                ServerKind::Plugins => "plugins",
            };
            rows.push(ServerReport {
                name: s.spec.name.clone(),
                kind,
                transport: transport.clone(),
                startup: cfg.startup.as_str(),
                state: s.state(),
                toolsets: lock(&s.toolsets).clone(),
            });
            for (module, why) in s.plugin_failures() {
                rows.push(ServerReport {
                    name: format!("plugin {module}"),
                    kind: "plugin",
                    transport: transport.clone(),
                    startup: cfg.startup.as_str(),
                    state: ServerState::Failed(why),
                    toolsets: Vec::new(),
                });
            }
        }
        rows
    }

    /// Stops every server (children end; nothing outlives the process).
    pub fn shutdown(&self) {
        if self.servers.is_empty() {
            // Nothing to stop: do not start the async bridge's runtime (two threads) for it.
            return;
        }
        let servers = self.servers.clone();
        let _ = run_async(Box::pin(async move {
            let mut set = tokio::task::JoinSet::new();
            for s in servers {
                set.spawn(async move { s.stop().await });
            }
            while set.join_next().await.is_some() {}
        }));
    }
}

fn start_all(servers: Vec<Arc<McpServer>>) {
    if servers.is_empty() {
        return;
    }
    let result = run_async(Box::pin(async move {
        let mut set = tokio::task::JoinSet::new();
        for s in servers {
            set.spawn(async move { s.ensure_started().await });
        }
        while set.join_next().await.is_some() {}
    }));
    if let Err(e) = result {
        tracing::error!("cannot start MCP servers: {e}");
    }
}

/// The most of a server's error text a failed call reports: results are bounded (16 MiB), and
/// an error is read by a model, whose context a server's 5 MB message would fill.
const MAX_ERROR_TEXT: usize = 16 * 1024;

/// What a failed call says to a script or a model: the server's own error (bounded), or what
/// became of the request, without the client library's type names (a transport's error
/// started with `rmcp::transport::worker::WorkerTransport<…>`).
fn call_error_text(e: &rmcp::ServiceError) -> String {
    let text = match e {
        rmcp::ServiceError::McpError(data) => format!("error {data}"),
        rmcp::ServiceError::TransportSend(t) => {
            format!("the request could not be sent: {}", t.error)
        }
        other => other.to_string(),
    };
    bounded_text(text, MAX_ERROR_TEXT)
}

/// `text` cut to at most `max` bytes (on a character boundary), saying how much was left out.
fn bounded_text(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let left = text.len() - cut;
    text.truncate(cut);
    text.push_str(&format!(" … [{left} more bytes of the message left out]"));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_toolset_keeps_the_module_name_as_written() {
        // `p_long64` was `plugin-p-long64`, which `--enable-toolsets plugin-p_long64` missed.
        assert_eq!(sanitize("p_long64"), "p_long64");
        assert_eq!(sanitize("pkg.mod"), "pkg.mod");
        assert_eq!(sanitize("My Plugin"), "my-plugin");
    }

    #[test]
    fn timeout_hints_name_the_key_that_sets_them() {
        // The plugin host's hint said `raise mcp_servers.plugins.timeout`, a key that does not
        // exist: its timeouts are `plugins.timeout` and `plugins.connect_timeout`.
        assert_eq!(
            config_key(ServerKind::Plugins, "plugins", "timeout"),
            "plugins.timeout"
        );
        assert_eq!(
            config_key(ServerKind::Plugins, "plugins", "connect_timeout"),
            "plugins.connect_timeout"
        );
        assert_eq!(
            config_key(ServerKind::Mcp, "github", "timeout"),
            "mcp_servers.github.timeout"
        );
    }

    #[test]
    fn a_server_s_error_text_is_bounded_and_names_no_library_type() {
        let huge = rmcp::ServiceError::McpError(rmcp::ErrorData::internal_error(
            "E".repeat(5_000_000),
            None,
        ));
        let text = call_error_text(&huge);
        assert!(text.len() < MAX_ERROR_TEXT + 100, "{}", text.len());
        assert!(text.starts_with("error -32603: EEE"), "{}", &text[..40]);
        assert!(text.ends_with("more bytes of the message left out]"));
        // A cut never splits a character.
        assert_eq!(
            bounded_text("é".repeat(10), 5),
            "éé … [16 more bytes of the message left out]"
        );
        let closed = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the pipe is closed");
        let send =
            rmcp::ServiceError::TransportSend(rmcp::transport::DynamicTransportError::from_parts(
                "rmcp::transport::worker::WorkerTransport<Something>",
                std::any::TypeId::of::<u8>(),
                Box::new(closed),
            ));
        assert_eq!(
            call_error_text(&send),
            "the request could not be sent: the pipe is closed"
        );
    }
}
