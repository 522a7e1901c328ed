//! The process-wide tool registry: registration, toolsets, lookup and the one dispatch path.
//!
//! Every way a tool is called — by the agent, from an execute_code script over RPC, in a
//! parallel batch — ends in [`ToolRegistry::handle_function_call`], so argument coercion, hooks,
//! error wrapping and result caps are the same for all of them.

use crate::async_bridge::{run_async, BoxFuture};
use crate::availability::{availability_of, Availability, DEFAULT_CHECK_TIMEOUT};
use crate::coerce::coerce_args;
use crate::hooks::{CallStatus, HookDecision, PostHook, PostToolCall, PreHook, PreToolCall};
use crate::toolsets::{
    static_toolsets, valid_toolset_name, Resolver, Toolset, ToolsetError, ToolsetKind,
    LEGACY_TOOLSET_ALIASES,
};
use crate::{RegistrationError, ToolContext, ToolError};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

/// Tools an execute_code script may call (SPEC §2). Everything else is refused on the channel.
pub const SCRIPT_TOOLS: [&str; 7] = [
    "web_search",
    "web_extract",
    "read_file",
    "write_file",
    "search_files",
    "patch",
    "terminal",
];

/// Tools a script can never call, whatever is enabled: recursion and delegation.
pub const SCRIPT_BLOCKED_TOOLS: [&str; 2] = ["execute_code", "delegate_task"];

/// Tools the agent loop handles itself; reaching dispatch is a bug in the caller, refused.
pub const AGENT_LOOP_TOOLS: [&str; 4] = ["todo", "memory", "session_search", "delegate_task"];

/// Most calls of one batch that run at the same time.
pub const MAX_PARALLEL_TOOL_CALLS: usize = 8;

/// A synchronous tool handler: arguments object in, JSON result out.
pub type SyncHandler =
    dyn Fn(&Map<String, Value>, &ToolContext) -> Result<Value, ToolError> + Send + Sync;

/// An asynchronous tool handler. It owns its inputs so the future can outlive the call frame.
pub type AsyncHandler =
    dyn Fn(Map<String, Value>, ToolContext) -> BoxFuture<Result<Value, ToolError>> + Send + Sync;

/// A handler that returns text it claims is JSON, as plugin and MCP tools do. Text that does not
/// parse is wrapped as `{"result": <text>, "note": ...}`, so the caller still gets JSON and loses
/// nothing.
pub type TextHandler =
    dyn Fn(&Map<String, Value>, &ToolContext) -> Result<String, ToolError> + Send + Sync;

/// Availability check of a tool: `true` means usable now. A panic counts as unavailable.
pub type CheckFn = Arc<dyn Fn() -> bool + Send + Sync>;

/// How a tool's work is run.
#[derive(Clone)]
pub enum Handler {
    /// Runs on the calling thread.
    Sync(Arc<SyncHandler>),
    /// Runs through the async bridge (see [`crate::run_async`]).
    Async(Arc<AsyncHandler>),
    /// Runs on the calling thread and returns raw text.
    Text(Arc<TextHandler>),
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Handler::Sync(_) => f.write_str("Handler::Sync"),
            Handler::Async(_) => f.write_str("Handler::Async"),
            Handler::Text(_) => f.write_str("Handler::Text"),
        }
    }
}

/// Who registered a tool; decides whether it may replace another.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolSource {
    /// Shipped with the product (self-registered built-ins, execute_code, host tools).
    #[default]
    Builtin,
    /// A plugin, by name.
    Plugin(String),
    /// An MCP server, by name.
    Mcp(String),
    /// The embedding host's own code (the Python package's `registry.register`), by name.
    /// Like a built-in it is not subject to the plugin [`OverridePolicy`].
    Host(String),
}

impl ToolSource {
    /// Plugins and MCP servers: subject to the [`OverridePolicy`].
    pub fn is_external(&self) -> bool {
        matches!(self, ToolSource::Plugin(_) | ToolSource::Mcp(_))
    }
}

impl std::fmt::Display for ToolSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ToolSource::Builtin => f.write_str("built-in"),
            ToolSource::Plugin(p) => write!(f, "plugin `{p}`"),
            ToolSource::Mcp(s) => write!(f, "MCP server `{s}`"),
            ToolSource::Host(h) => write!(f, "host `{h}`"),
        }
    }
}

/// Which built-in tools plugins and MCP servers may replace. By default none: a plugin that
/// registers `read_file` is refused, not silently swapped in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverridePolicy {
    /// Tool names that may be replaced.
    pub names: BTreeSet<String>,
    /// Tool-name prefixes (namespaces such as `browser_`) whose tools may be replaced.
    pub namespaces: Vec<String>,
    /// Plugin or MCP server names allowed to replace any built-in.
    pub sources: BTreeSet<String>,
}

impl OverridePolicy {
    /// Also allows replacing the tool `name`.
    pub fn allow_name(mut self, name: &str) -> Self {
        self.names.insert(name.into());
        self
    }

    /// Also allows replacing every tool whose name starts with `prefix`.
    pub fn allow_namespace(mut self, prefix: &str) -> Self {
        self.namespaces.push(prefix.into());
        self
    }

    /// Also allows the plugin or MCP server `source` to replace any built-in.
    pub fn allow_source(mut self, source: &str) -> Self {
        self.sources.insert(source.into());
        self
    }

    /// Whether a tool from `source` may replace the built-in `name`.
    pub fn allows(&self, name: &str, source: &ToolSource) -> bool {
        let source_ok = match source {
            ToolSource::Builtin | ToolSource::Host(_) => true,
            ToolSource::Plugin(s) | ToolSource::Mcp(s) => self.sources.contains(s),
        };
        source_ok
            || self.names.contains(name)
            || self.namespaces.iter().any(|p| name.starts_with(p.as_str()))
    }
}

/// Everything the registry knows about one tool (SPEC §7).
#[derive(Clone, Debug)]
pub struct ToolEntry {
    /// Unique name the model and scripts call it by.
    pub name: String,
    /// Toolset (bundle) the tool belongs to.
    pub toolset: String,
    /// JSON schema of the arguments object.
    pub schema: Value,
    /// The work itself.
    pub handler: Handler,
    /// Optional availability check; `None` means always available. Tools sharing one check hold
    /// clones of the same `Arc`, and it runs once per definitions build.
    pub check_fn: Option<CheckFnHolder>,
    /// Environment variables the tool needs (shown to users when it is unavailable).
    pub requires_env: Vec<String>,
    /// Whether the handler is asynchronous (kept in step with `handler` at registration).
    pub is_async: bool,
    /// What the tool does; the first line is its doc line in the stub.
    pub description: String,
    /// Emoji shown in listings.
    pub emoji: String,
    /// Results longer than this many characters are truncated with a note.
    pub max_result_size_chars: Option<usize>,
    /// Whether calls of this tool may run at the same time as other calls of the same turn
    /// (read-only tools: reads, searches, web).
    pub parallel_safe: bool,
    /// For tools that write one file named by an argument (`write_file`, `patch`): that
    /// argument. The planner runs such calls in parallel when their paths differ.
    pub path_arg: Option<String>,
    /// Who registered it.
    pub source: ToolSource,
    /// The handler is a short, bounded local operation (no network, no child process, no
    /// waiting on anything but the local filesystem), so async callers may run it inline on
    /// their worker thread instead of paying a thread hop per call.
    pub bounded: bool,
}

/// Wrapper so [`ToolEntry`] can derive `Debug` while holding a closure.
#[derive(Clone)]
pub struct CheckFnHolder(pub CheckFn);

impl std::fmt::Debug for CheckFnHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CheckFn")
    }
}

impl ToolEntry {
    fn with_handler(
        name: impl Into<String>,
        toolset: impl Into<String>,
        description: impl Into<String>,
        schema: Value,
        handler: Handler,
    ) -> Self {
        ToolEntry {
            name: name.into(),
            toolset: toolset.into(),
            schema,
            is_async: matches!(handler, Handler::Async(_)),
            handler,
            check_fn: None,
            requires_env: Vec::new(),
            description: description.into(),
            emoji: String::new(),
            max_result_size_chars: None,
            parallel_safe: false,
            path_arg: None,
            source: ToolSource::Builtin,
            bounded: false,
        }
    }

    /// A tool with a synchronous handler and defaults for the optional fields.
    pub fn new<F>(
        name: impl Into<String>,
        toolset: impl Into<String>,
        description: impl Into<String>,
        schema: Value,
        handler: F,
    ) -> Self
    where
        F: Fn(&Map<String, Value>, &ToolContext) -> Result<Value, ToolError>
            + Send
            + Sync
            + 'static,
    {
        Self::with_handler(
            name,
            toolset,
            description,
            schema,
            Handler::Sync(Arc::new(handler)),
        )
    }

    /// A tool with an asynchronous handler (`is_async` set).
    pub fn new_async<F, Fut>(
        name: impl Into<String>,
        toolset: impl Into<String>,
        description: impl Into<String>,
        schema: Value,
        handler: F,
    ) -> Self
    where
        F: Fn(Map<String, Value>, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        let boxed: Arc<AsyncHandler> = Arc::new(move |args, ctx| Box::pin(handler(args, ctx)));
        Self::with_handler(name, toolset, description, schema, Handler::Async(boxed))
    }

    /// A tool whose handler returns text (plugins, MCP). See [`TextHandler`].
    pub fn new_text<F>(
        name: impl Into<String>,
        toolset: impl Into<String>,
        description: impl Into<String>,
        schema: Value,
        handler: F,
    ) -> Self
    where
        F: Fn(&Map<String, Value>, &ToolContext) -> Result<String, ToolError>
            + Send
            + Sync
            + 'static,
    {
        Self::with_handler(
            name,
            toolset,
            description,
            schema,
            Handler::Text(Arc::new(handler)),
        )
    }

    /// Marks the handler as short and bounded (see [`ToolEntry::bounded`]).
    pub fn bounded(mut self) -> Self {
        self.bounded = true;
        self
    }

    /// Sets the emoji shown in listings.
    pub fn with_emoji(mut self, emoji: &str) -> Self {
        self.emoji = emoji.into();
        self
    }

    /// Gates availability on `check` (run when definitions are built).
    pub fn with_check<F: Fn() -> bool + Send + Sync + 'static>(mut self, check: F) -> Self {
        self.check_fn = Some(CheckFnHolder(Arc::new(check)));
        self
    }

    /// Gates availability on a check shared with other tools; it runs once per build.
    pub fn with_shared_check(mut self, check: &CheckFn) -> Self {
        self.check_fn = Some(CheckFnHolder(Arc::clone(check)));
        self
    }

    /// Declares environment variables the tool needs.
    pub fn with_requires_env(mut self, vars: &[&str]) -> Self {
        self.requires_env = vars.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Caps results at `max` characters.
    pub fn with_max_result_size_chars(mut self, max: usize) -> Self {
        self.max_result_size_chars = Some(max);
        self
    }

    /// Marks the tool safe (or not) to run alongside other calls of the same turn.
    pub fn with_parallel_safe(mut self, safe: bool) -> Self {
        self.parallel_safe = safe;
        self
    }

    /// Marks the tool as writing the one file its argument `arg` names (see
    /// [`ToolEntry::path_arg`]).
    pub fn with_path_scoped(mut self, arg: &str) -> Self {
        self.path_arg = Some(arg.to_string());
        self
    }

    /// Sets who registers the tool (plugins and MCP servers are subject to the override
    /// policy).
    pub fn with_source(mut self, source: ToolSource) -> Self {
        self.source = source;
        self
    }

    /// Whether the tool is usable now (its check passes within the default timeout, or it has
    /// none). A panicking or hanging check counts as unavailable.
    pub fn is_available(&self) -> bool {
        availability_of(&[Arc::new(self.clone())], DEFAULT_CHECK_TIMEOUT)
            .first()
            .is_some_and(Availability::is_available)
    }

    /// The OpenAI function-calling definition of the tool.
    pub fn definition(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.schema,
            }
        })
    }

    fn validate(&self) -> Result<(), RegistrationError> {
        let name_ok = !self.name.is_empty()
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(RegistrationError::BadName(self.name.clone()));
        }
        let bad = |reason: &str| RegistrationError::BadSchema {
            name: self.name.clone(),
            reason: reason.into(),
        };
        if !valid_toolset_name(&self.toolset) {
            return Err(bad(&format!(
                "belongs to toolset `{}`, which is not a usable toolset name",
                self.toolset
            )));
        }
        let obj = self
            .schema
            .as_object()
            .ok_or_else(|| bad("must be a JSON object"))?;
        match obj.get("type") {
            Some(Value::String(t)) if t == "object" => {}
            _ => return Err(bad("must have \"type\": \"object\"")),
        }
        match obj.get("properties") {
            None => {}
            Some(Value::Object(props)) => {
                for (pname, prop) in props {
                    if !prop.is_object() {
                        return Err(bad(&format!(
                            "has property `{pname}` that is not an object"
                        )));
                    }
                    if let Some(t) = prop.get("type") {
                        let types: Vec<&Value> = match t {
                            Value::Array(list) => list.iter().collect(),
                            one => vec![one],
                        };
                        for t in types {
                            let known = t.as_str().is_some_and(|t| {
                                matches!(
                                    t,
                                    "string"
                                        | "integer"
                                        | "number"
                                        | "boolean"
                                        | "array"
                                        | "object"
                                        | "null"
                                )
                            });
                            if !known {
                                return Err(bad(&format!(
                                    "gives property `{pname}` the type {t}, which is not a JSON-schema type"
                                )));
                            }
                        }
                    }
                }
            }
            Some(_) => return Err(bad("has \"properties\" that is not an object")),
        }
        if let Some(req) = obj.get("required") {
            let props = obj.get("properties").and_then(Value::as_object);
            let list = req
                .as_array()
                .ok_or_else(|| bad("has \"required\" that is not an array"))?;
            for r in list {
                let name = r
                    .as_str()
                    .ok_or_else(|| bad("has a non-string entry in \"required\""))?;
                if !props.is_some_and(|p| p.contains_key(name)) {
                    return Err(bad(&format!(
                        "requires `{name}`, which is not among its properties"
                    )));
                }
            }
        }
        Ok(())
    }
}

/// A built-in tool, submitted from its own file with `inventory::submit!`.
pub struct BuiltinTool(pub fn() -> ToolEntry);

inventory::collect!(BuiltinTool);

/// One call of a model turn, for [`ToolRegistry::handle_function_calls`].
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Tool name.
    pub name: String,
    /// Arguments (an object, or null for none).
    pub args: Value,
}

impl ToolCall {
    /// A call of `name` with `args`.
    pub fn new(name: impl Into<String>, args: Value) -> Self {
        ToolCall {
            name: name.into(),
            args,
        }
    }
}

/// The registry: tools keyed by name, toolsets, aliases, hooks and policies.
pub struct ToolRegistry {
    pub(crate) tools: RwLock<BTreeMap<String, Arc<ToolEntry>>>,
    pub(crate) toolsets: RwLock<BTreeMap<String, (Toolset, ToolsetKind)>>,
    pub(crate) aliases: RwLock<BTreeMap<String, String>>,
    pre_hooks: RwLock<Vec<PreHook>>,
    post_hooks: RwLock<Vec<PostHook>>,
    override_policy: RwLock<OverridePolicy>,
    check_timeout: RwLock<Duration>,
    /// Tools an embedding host opened to scripts besides [`SCRIPT_TOOLS`].
    extra_script_tools: RwLock<BTreeSet<String>>,
    /// MCP servers the operator's config opened to scripts: server name → the tool names
    /// opened (`None`: every tool of the server).
    script_mcp_servers: RwLock<BTreeMap<String, Option<BTreeSet<String>>>>,
    /// Run before tool definitions or the script tool list are built (lazy MCP servers).
    prepare_hooks: RwLock<Vec<PrepareHook>>,
}

/// What is about to be built when a [`PrepareHook`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepare {
    /// The model's tool definitions (`get_tool_definitions*`).
    Definitions,
    /// The tool list of an execute_code script (`script_tools`).
    Scripts,
}

/// A hook run before definitions or the script tool list are built, so tool sources that start
/// lazily (MCP servers) can register their tools first. It must not call back into the build.
pub type PrepareHook = Arc<dyn Fn(&ToolRegistry, Prepare) + Send + Sync>;

impl Default for ToolRegistry {
    fn default() -> Self {
        Self::new()
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

impl ToolRegistry {
    /// A registry with no tools but the static toolsets and legacy aliases (tests and
    /// embedders; the process-wide one is [`registry`]).
    pub fn new() -> Self {
        let toolsets = static_toolsets()
            .into_iter()
            .map(|t| (t.name.clone(), (t, ToolsetKind::Static)))
            .collect();
        let aliases = LEGACY_TOOLSET_ALIASES
            .iter()
            .map(|(a, t)| (a.to_string(), t.to_string()))
            .collect();
        ToolRegistry {
            tools: RwLock::new(BTreeMap::new()),
            toolsets: RwLock::new(toolsets),
            aliases: RwLock::new(aliases),
            pre_hooks: RwLock::new(Vec::new()),
            post_hooks: RwLock::new(Vec::new()),
            override_policy: RwLock::new(OverridePolicy::default()),
            check_timeout: RwLock::new(DEFAULT_CHECK_TIMEOUT),
            extra_script_tools: RwLock::new(BTreeSet::new()),
            script_mcp_servers: RwLock::new(BTreeMap::new()),
            prepare_hooks: RwLock::new(Vec::new()),
        }
    }

    /// A registry holding every built-in tool.
    pub fn with_builtins() -> Self {
        let reg = Self::new();
        for builtin in inventory::iter::<BuiltinTool> {
            if let Err(e) = reg.register(builtin.0()) {
                tracing::error!("{e}");
            }
        }
        reg
    }

    /// Adds a tool without permission to shadow another toolset's tool; see
    /// [`ToolRegistry::register_with_override`].
    pub fn register(&self, entry: ToolEntry) -> Result<(), RegistrationError> {
        self.register_with_override(entry, false)
    }

    /// Adds a tool (SPEC §7). When the name is taken:
    /// - a registration in the same toolset replaces the previous one (last wins, logged);
    /// - MCP-to-MCP overwrites are allowed (a server's tool may replace another server's);
    /// - a plugin or MCP tool replacing a built-in or host tool also needs the operator's
    ///   [`OverridePolicy`] (which, once it allows it, is the override);
    /// - shadowing a tool of a different toolset otherwise needs `override_existing`.
    pub fn register_with_override(
        &self,
        mut entry: ToolEntry,
        override_existing: bool,
    ) -> Result<(), RegistrationError> {
        entry.is_async = matches!(entry.handler, Handler::Async(_));
        entry.validate()?;
        let mut tools = write(&self.tools);
        if let Some(old) = tools.get(&entry.name) {
            let mcp_to_mcp = matches!(
                (&old.source, &entry.source),
                (ToolSource::Mcp(_), ToolSource::Mcp(_))
            );
            let mut permitted = override_existing || mcp_to_mcp;
            if entry.source.is_external() && !old.source.is_external() && !mcp_to_mcp {
                if !read(&self.override_policy).allows(&entry.name, &entry.source) {
                    return Err(RegistrationError::OverrideRefused {
                        name: entry.name.clone(),
                        by: entry.source.to_string(),
                        toolset: old.toolset.clone(),
                    });
                }
                permitted = true;
            }
            if old.toolset != entry.toolset && !permitted {
                return Err(RegistrationError::ShadowRefused {
                    name: entry.name.clone(),
                    toolset: entry.toolset.clone(),
                    existing_toolset: old.toolset.clone(),
                });
            }
            if old.toolset != entry.toolset || old.source != entry.source {
                tracing::warn!(
                    tool = %entry.name,
                    "tool `{}` of toolset `{}` ({}) replaces the one of toolset `{}` ({})",
                    entry.name,
                    entry.toolset,
                    entry.source,
                    old.toolset,
                    old.source
                );
            } else {
                tracing::info!(
                    tool = %entry.name,
                    "tool `{}` of toolset `{}` re-registered: the last registration wins",
                    entry.name,
                    entry.toolset
                );
            }
        }
        tools.insert(entry.name.clone(), Arc::new(entry));
        Ok(())
    }

    /// Removes a tool; returns it if it was registered.
    pub fn unregister(&self, name: &str) -> Option<Arc<ToolEntry>> {
        write(&self.tools).remove(name)
    }

    /// Replaces the policy deciding which built-ins plugins and MCP servers may replace.
    pub fn set_override_policy(&self, policy: OverridePolicy) {
        *write(&self.override_policy) = policy;
    }

    /// The policy deciding which built-ins plugins and MCP servers may replace.
    pub fn override_policy(&self) -> OverridePolicy {
        read(&self.override_policy).clone()
    }

    /// Opens the tool `name` to execute_code scripts besides [`SCRIPT_TOOLS`] (an embedding
    /// host's own tools). `execute_code`, `delegate_task`, the agent-loop tools and tools of MCP
    /// servers can never be opened; an MCP tool registered under the name later stays closed.
    pub fn allow_in_scripts(&self, name: &str) -> Result<(), RegistrationError> {
        let refused = |reason: &str| RegistrationError::NotScriptCallable {
            name: name.to_string(),
            reason: reason.to_string(),
        };
        if SCRIPT_BLOCKED_TOOLS.contains(&name) {
            return Err(refused(
                "scripts can never call it (no recursion, no delegation)",
            ));
        }
        if AGENT_LOOP_TOOLS.contains(&name) {
            return Err(refused("it is handled by the agent loop, not dispatched"));
        }
        if self
            .get(name)
            .is_some_and(|e| matches!(e.source, ToolSource::Mcp(_)))
        {
            return Err(refused(
                "it comes from an MCP server, and scripts never call MCP tools",
            ));
        }
        if !SCRIPT_TOOLS.contains(&name) {
            write(&self.extra_script_tools).insert(name.to_string());
        }
        Ok(())
    }

    /// Closes a tool opened with [`ToolRegistry::allow_in_scripts`]; returns whether it was
    /// open. The built-in script tools stay open.
    pub fn disallow_in_scripts(&self, name: &str) -> bool {
        write(&self.extra_script_tools).remove(name)
    }

    /// Opens tools of the MCP server `server` to execute_code scripts: all of them (`tools` is
    /// `None`) or the listed names. Scripts never call MCP tools (SPEC §2) unless the operator
    /// says so in config.yaml (`mcp_servers.<name>.script_callable`); this is that path, and
    /// nothing else (not the Python package, not a plugin) should call it. The blocked and
    /// agent-loop tools stay closed whatever the server calls its tools.
    pub fn allow_mcp_server_in_scripts(&self, server: &str, tools: Option<BTreeSet<String>>) {
        write(&self.script_mcp_servers).insert(server.to_string(), tools);
    }

    /// Closes the MCP server `server` to scripts again; returns whether it was open.
    pub fn disallow_mcp_server_in_scripts(&self, server: &str) -> bool {
        write(&self.script_mcp_servers).remove(server).is_some()
    }

    fn mcp_open_to_scripts(&self, server: &str, tool: &str) -> bool {
        match read(&self.script_mcp_servers).get(server) {
            Some(None) => true,
            Some(Some(names)) => names.contains(tool),
            None => false,
        }
    }

    /// Names of the tools scripts may call: [`SCRIPT_TOOLS`] in their order, then the ones a
    /// host opened, sorted, then the registered tools of MCP servers the operator opened,
    /// sorted. Registered or not, available or not (MCP ones: registered only).
    pub fn script_tool_names(&self) -> Vec<String> {
        let mut names: Vec<String> = SCRIPT_TOOLS.iter().map(|s| s.to_string()).collect();
        names.extend(read(&self.extra_script_tools).iter().cloned());
        if !read(&self.script_mcp_servers).is_empty() {
            let mcp: Vec<String> = read(&self.tools)
                .values()
                .filter(|e| match &e.source {
                    ToolSource::Mcp(server) => self.mcp_open_to_scripts(server, &e.name),
                    _ => false,
                })
                .map(|e| e.name.clone())
                .filter(|n| !names.contains(n))
                .collect();
            names.extend(mcp);
        }
        names
    }

    /// Whether `entry` may be handed to a script: its name is a script tool and it is not an
    /// MCP server's (scripts never call MCP tools, even under a script tool's name) unless the
    /// operator opened that server's tool in config.
    pub(crate) fn is_script_callable(&self, entry: &ToolEntry) -> bool {
        let name = entry.name.as_str();
        if SCRIPT_BLOCKED_TOOLS.contains(&name) || AGENT_LOOP_TOOLS.contains(&name) {
            return false;
        }
        if let ToolSource::Mcp(server) = &entry.source {
            return self.mcp_open_to_scripts(server, name);
        }
        SCRIPT_TOOLS.contains(&name) || read(&self.extra_script_tools).contains(&entry.name)
    }

    /// Adds a hook run before tool definitions or the script tool list are built.
    pub fn add_prepare_hook<F>(&self, hook: F)
    where
        F: Fn(&ToolRegistry, Prepare) + Send + Sync + 'static,
    {
        write(&self.prepare_hooks).push(Arc::new(hook));
    }

    /// Runs the prepare hooks (outside every lock; a panicking hook is logged).
    pub(crate) fn prepare(&self, what: Prepare) {
        let hooks: Vec<PrepareHook> = read(&self.prepare_hooks).clone();
        for hook in hooks {
            if catch_unwind(AssertUnwindSafe(|| hook(self, what))).is_err() {
                tracing::error!("a prepare hook panicked while preparing {what:?}; continuing");
            }
        }
    }

    /// How long a `check_fn` may run before its tools count as unavailable.
    pub fn set_check_timeout(&self, timeout: Duration) {
        *write(&self.check_timeout) = timeout;
    }

    pub(crate) fn check_timeout(&self) -> Duration {
        *read(&self.check_timeout)
    }

    /// Adds a `pre_tool_call` hook; it may block calls.
    pub fn add_pre_tool_call_hook<F>(&self, hook: F)
    where
        F: Fn(&PreToolCall<'_>) -> HookDecision + Send + Sync + 'static,
    {
        write(&self.pre_hooks).push(Arc::new(hook));
    }

    /// Adds a `post_tool_call` hook; it sees every result, blocked calls included.
    pub fn add_post_tool_call_hook<F>(&self, hook: F)
    where
        F: Fn(&PostToolCall<'_>) + Send + Sync + 'static,
    {
        write(&self.post_hooks).push(Arc::new(hook));
    }

    /// Looks a tool up by name.
    pub fn get(&self, name: &str) -> Option<Arc<ToolEntry>> {
        read(&self.tools).get(name).cloned()
    }

    /// All tools, by name.
    pub fn entries(&self) -> Vec<Arc<ToolEntry>> {
        read(&self.tools).values().cloned().collect()
    }

    // ---- toolsets -------------------------------------------------------------------------

    /// Runs `f` with a resolver over a consistent snapshot of tools, toolsets and aliases.
    pub(crate) fn with_resolver<R>(
        &self,
        tools: &BTreeMap<String, Arc<ToolEntry>>,
        f: impl FnOnce(&Resolver<'_>) -> R,
    ) -> R {
        let declared = read(&self.toolsets);
        let aliases = read(&self.aliases);
        let mut implicit: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for e in tools.values() {
            implicit
                .entry(e.toolset.as_str())
                .or_default()
                .push(e.name.as_str());
        }
        let resolver = Resolver {
            declared: &declared,
            aliases: &aliases,
            implicit,
        };
        f(&resolver)
    }

    /// Adds (or replaces) a toolset at run time — an MCP server's or a plugin's bundle, or a
    /// composite of existing ones. Static toolsets cannot be redefined; a definition that would
    /// make composites include each other in a loop is refused.
    pub fn add_toolset(&self, toolset: Toolset) -> Result<(), ToolsetError> {
        if !valid_toolset_name(&toolset.name) {
            return Err(ToolsetError::BadName(toolset.name));
        }
        let name = toolset.name.clone();
        let previous = {
            let mut sets = write(&self.toolsets);
            if let Some((_, ToolsetKind::Static)) = sets.get(&name) {
                return Err(ToolsetError::Static(name));
            }
            sets.insert(name.clone(), (toolset, ToolsetKind::Dynamic))
        };
        let tools = read(&self.tools);
        let check = self.with_resolver(&tools, |r| {
            // Unknown includes are allowed (they may be added later); loops are not.
            let mut sink = BTreeSet::new();
            match r.resolve_into(&name, &mut sink) {
                Err(e @ ToolsetError::Cycle { .. }) => Err(e),
                _ => Ok(()),
            }
        });
        drop(tools);
        if let Err(e) = check {
            let mut sets = write(&self.toolsets);
            match previous {
                Some(p) => sets.insert(name, p),
                None => sets.remove(&name),
            };
            return Err(e);
        }
        Ok(())
    }

    /// Maps `alias` to the toolset `target` (like the legacy `*_tools` names).
    pub fn add_toolset_alias(&self, alias: &str, target: &str) -> Result<(), ToolsetError> {
        if !valid_toolset_name(alias) {
            return Err(ToolsetError::BadName(alias.into()));
        }
        if read(&self.toolsets).contains_key(alias) {
            return Err(ToolsetError::Static(alias.into()));
        }
        write(&self.aliases).insert(alias.into(), target.into());
        Ok(())
    }

    /// Registers the tools of an MCP server or plugin as the dynamic toolset `toolset`. Each
    /// entry gets that toolset and `source`; entries that cannot be registered are logged and
    /// skipped (returned), the rest stay usable.
    pub fn register_dynamic_toolset(
        &self,
        toolset: &str,
        description: &str,
        source: ToolSource,
        entries: Vec<ToolEntry>,
    ) -> Result<Vec<RegistrationError>, ToolsetError> {
        let mut failures = Vec::new();
        let mut names = Vec::new();
        for mut entry in entries {
            entry.toolset = toolset.to_string();
            entry.source = source.clone();
            let name = entry.name.clone();
            match self.register(entry) {
                Ok(()) => names.push(name),
                Err(e) => {
                    tracing::warn!("{source}: skipping a tool: {e}");
                    failures.push(e);
                }
            }
        }
        let set = Toolset {
            name: toolset.into(),
            description: description.into(),
            tools: names,
            includes: Vec::new(),
        };
        if let Err(e) = self.add_toolset(set) {
            // Keep the registry consistent: tools of a toolset that could not be added go too.
            let mut tools = write(&self.tools);
            tools.retain(|_, t| !(t.toolset == toolset && t.source == source));
            return Err(e);
        }
        Ok(failures)
    }

    /// Removes a dynamic toolset and every tool registered in it by a plugin or MCP server (an
    /// MCP server went away). Returns the names of the removed tools.
    pub fn remove_toolset(&self, name: &str) -> Result<Vec<String>, ToolsetError> {
        {
            let mut sets = write(&self.toolsets);
            if let Some((_, ToolsetKind::Static)) = sets.get(name) {
                return Err(ToolsetError::Static(name.into()));
            }
            sets.remove(name);
        }
        let mut tools = write(&self.tools);
        let gone: Vec<String> = tools
            .values()
            .filter(|t| t.toolset == name && t.source.is_external())
            .map(|t| t.name.clone())
            .collect();
        for g in &gone {
            tools.remove(g);
        }
        Ok(gone)
    }

    /// The declared toolsets (static and dynamic), by name.
    pub fn toolsets(&self) -> Vec<Toolset> {
        read(&self.toolsets)
            .values()
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Every toolset name a user may select (declared and implicit), sorted.
    pub fn toolset_names(&self) -> Vec<String> {
        let tools = read(&self.tools);
        self.with_resolver(&tools, |r| r.valid_names())
    }

    /// The tool names toolset `name` stands for (recursively; legacy names accepted). Names of
    /// tools that are not registered are included: the toolset declares them.
    pub fn resolve_toolset(&self, name: &str) -> Result<BTreeSet<String>, ToolsetError> {
        let tools = read(&self.tools);
        let mut out = BTreeSet::new();
        self.with_resolver(&tools, |r| r.resolve_into(name, &mut out))?;
        Ok(out)
    }

    /// Whether at least one registered tool of toolset `name` is available now.
    pub fn is_toolset_available(&self, name: &str) -> Result<bool, ToolsetError> {
        let names = self.resolve_toolset(name)?;
        let entries: Vec<Arc<ToolEntry>> = names.iter().filter_map(|n| self.get(n)).collect();
        Ok(availability_of(&entries, self.check_timeout())
            .iter()
            .any(Availability::is_available))
    }

    /// The script tools (SPEC §2, plus those a host opened with
    /// [`ToolRegistry::allow_in_scripts`]) that are registered, not from an MCP server, and
    /// available now, in [`ToolRegistry::script_tool_names`] order. Empty when none is: scripts
    /// then get no tools, never all of them.
    pub fn script_tools(&self) -> Vec<Arc<ToolEntry>> {
        self.prepare(Prepare::Scripts);
        let entries: Vec<Arc<ToolEntry>> = self
            .script_tool_names()
            .iter()
            .filter_map(|name| self.get(name))
            .filter(|e| self.is_script_callable(e))
            .collect();
        let avail = availability_of(&entries, self.check_timeout());
        entries
            .into_iter()
            .zip(avail)
            .filter(|(_, a)| a.is_available())
            .map(|(e, _)| e)
            .collect()
    }

    // ---- dispatch -------------------------------------------------------------------------

    /// Runs a tool's handler. Handler failures (errors and panics) become
    /// `{"error": "Tool execution failed: <kind>: <message>"}`. Always returns a JSON string.
    pub fn dispatch(&self, name: &str, args: &Map<String, Value>, ctx: &ToolContext) -> String {
        match self.get(name) {
            Some(entry) => run_handler(&entry, args, ctx).0,
            None => error_json(format!(
                "Tool execution failed: UnknownTool: no tool named `{name}`"
            )),
        }
    }

    /// The one entry point for tool calls, from the agent and from scripts alike: refuses
    /// agent-loop tools and unknown names, coerces arguments to the schema, runs the
    /// `pre_tool_call` hooks (which may block), dispatches, runs the `post_tool_call` hooks.
    /// Failures outside the handler are wrapped as `{"error": "Error executing <tool>: <message>"}`.
    /// Always returns a JSON string.
    pub fn handle_function_call(&self, name: &str, args: &Value, ctx: &ToolContext) -> String {
        let outer = |message: String| error_json(format!("Error executing {name}: {message}"));
        match catch_unwind(AssertUnwindSafe(|| self.call(name, args, ctx))) {
            Ok(Ok(text)) => text,
            Ok(Err(message)) => outer(message),
            Err(panic) => outer(panic_message(panic.as_ref())),
        }
    }

    fn call(&self, name: &str, args: &Value, ctx: &ToolContext) -> Result<String, String> {
        if AGENT_LOOP_TOOLS.contains(&name) {
            return Err(format!(
                "`{name}` is handled by the agent loop and cannot be dispatched as a tool"
            ));
        }
        let Some(entry) = self.get(name) else {
            let known: Vec<String> = self.entries().iter().map(|e| e.name.clone()).collect();
            return Err(format!(
                "unknown tool; registered tools: {}",
                known.join(", ")
            ));
        };
        let empty = Map::new();
        let args = match args {
            Value::Object(m) => m,
            Value::Null => &empty,
            other => {
                return Err(format!(
                    "arguments must be a JSON object, got {}",
                    json_type(other)
                ))
            }
        };
        let started = Instant::now();
        let coerced = coerce_args(&entry.schema, args);
        let call_args: &Map<String, Value> = match &coerced {
            Ok(c) => c,
            Err(_) => args,
        };
        let (text, status) = match &coerced {
            Err(message) => (
                error_json(format!(
                    "Tool execution failed: InvalidArguments: {message}"
                )),
                CallStatus::Error,
            ),
            Ok(_) => match self.pre_hooks_verdict(name, call_args, ctx) {
                Some(reason) => (
                    error_json(format!("Blocked by pre_tool_call hook: {reason}")),
                    CallStatus::Blocked,
                ),
                None => run_handler(&entry, call_args, ctx),
            },
        };
        let hooks: Vec<PostHook> = read(&self.post_hooks).clone();
        if !hooks.is_empty() {
            let post = PostToolCall {
                name,
                args: call_args,
                ctx,
                result: &text,
                status,
                duration: started.elapsed(),
            };
            for hook in hooks {
                if let Err(p) = catch_unwind(AssertUnwindSafe(|| hook(&post))) {
                    tracing::warn!(
                        "a post_tool_call hook failed on `{name}`: {}",
                        panic_message(p.as_ref())
                    );
                }
            }
        }
        Ok(text)
    }

    /// The reason the first blocking `pre_tool_call` hook gives, if any.
    fn pre_hooks_verdict(
        &self,
        name: &str,
        args: &Map<String, Value>,
        ctx: &ToolContext,
    ) -> Option<String> {
        let hooks: Vec<PreHook> = read(&self.pre_hooks).clone();
        let pre = PreToolCall { name, args, ctx };
        for hook in hooks {
            match catch_unwind(AssertUnwindSafe(|| hook(&pre))) {
                Ok(HookDecision::Continue) => {}
                Ok(HookDecision::Block(reason)) => return Some(reason),
                Err(p) => {
                    return Some(format!(
                        "the hook failed ({}), so the call is refused",
                        panic_message(p.as_ref())
                    ))
                }
            }
        }
        None
    }

    /// Runs the calls of one model turn as the planner segments them ([`crate::planner`]):
    /// read-only tools in parallel, writes in parallel when their paths differ, everything
    /// else in order. Results come back in call order.
    pub fn handle_function_calls(&self, calls: &[ToolCall], ctx: &ToolContext) -> Vec<String> {
        crate::planner::run(self, calls, ctx)
    }
}

enum Produced {
    Value(Value),
    Text(String),
}

/// The dispatch layer: runs the handler, wraps failures, checks text results, caps size.
fn run_handler(
    entry: &ToolEntry,
    args: &Map<String, Value>,
    ctx: &ToolContext,
) -> (String, CallStatus) {
    let outcome = catch_unwind(AssertUnwindSafe(|| match &entry.handler {
        Handler::Sync(h) => h(args, ctx).map(Produced::Value),
        Handler::Async(h) => run_async(h(args.clone(), ctx.clone()))?.map(Produced::Value),
        Handler::Text(h) => h(args, ctx).map(Produced::Text),
    }));
    let (text, status) = match outcome {
        Ok(Ok(Produced::Value(value))) => {
            let status = status_of(&value);
            (value.to_string(), status)
        }
        Ok(Ok(Produced::Text(text))) => match serde_json::from_str::<Value>(&text) {
            Ok(value) => (text, status_of(&value)),
            Err(_) => (
                json!({
                    "result": text,
                    "note": format!("`{}` returned text that is not JSON; it is given here as a string", entry.name),
                })
                .to_string(),
                CallStatus::Success,
            ),
        },
        Ok(Err(e)) => (
            error_json(format!("Tool execution failed: {e}")),
            CallStatus::Error,
        ),
        Err(panic) => (
            error_json(format!(
                "Tool execution failed: Panic: {}",
                panic_message(panic.as_ref())
            )),
            CallStatus::Error,
        ),
    };
    match entry.max_result_size_chars {
        Some(max) => (cap_result(text, max), status),
        None => (text, status),
    }
}

fn status_of(value: &Value) -> CallStatus {
    if value.get("error").is_some_and(|e| !e.is_null()) {
        CallStatus::Error
    } else {
        CallStatus::Success
    }
}

/// The process-wide registry, holding the built-ins from first use.
pub fn registry() -> &'static ToolRegistry {
    static REGISTRY: OnceLock<ToolRegistry> = OnceLock::new();
    REGISTRY.get_or_init(ToolRegistry::with_builtins)
}

fn error_json(message: String) -> String {
    json!({ "error": message }).to_string()
}

/// How a JSON value's type reads in an error message ("a string", "an array", …).
pub fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "the tool panicked".to_string()
    }
}

/// Keeps a result within `max` characters; an oversized one becomes a JSON object holding the
/// head of its text and a note saying how much was cut, so the caller still gets valid JSON.
fn cap_result(text: String, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text,
        Some((cut, _)) => {
            let total = text.chars().count();
            json!({
                "truncated": true,
                "content": &text[..cut],
                "note": format!("result truncated: showing {max} of {total} characters"),
            })
            .to_string()
        }
    }
}

/// The tools map, read-locked (for sibling modules that need a consistent snapshot).
pub(crate) fn read_tools(
    reg: &ToolRegistry,
) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<ToolEntry>>> {
    read(&reg.tools)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo(name: &str, toolset: &str) -> ToolEntry {
        ToolEntry::new(
            name,
            toolset,
            "Echo.",
            json!({"type": "object", "properties": {"x": {"type": "string"}}}),
            |args, _| Ok(json!({ "echo": args.get("x") })),
        )
    }

    fn ctx() -> ToolContext {
        ToolContext::agent("/")
    }

    #[test]
    fn dispatches_and_wraps_both_error_layers() {
        let reg = ToolRegistry::new();
        reg.register(echo("echo", "t")).unwrap();
        reg.register(ToolEntry::new(
            "fails",
            "t",
            "Fails.",
            json!({"type": "object"}),
            |_, _| Err(ToolError::new("Boom", "it broke")),
        ))
        .unwrap();
        reg.register(ToolEntry::new(
            "panics",
            "t",
            "Panics.",
            json!({"type": "object"}),
            |_, _| panic!("handler exploded"),
        ))
        .unwrap();
        let ok: Value =
            serde_json::from_str(&reg.handle_function_call("echo", &json!({"x": "hi"}), &ctx()))
                .unwrap();
        assert_eq!(ok, json!({"echo": "hi"}));
        let e: Value =
            serde_json::from_str(&reg.handle_function_call("fails", &json!({}), &ctx())).unwrap();
        assert_eq!(e["error"], "Tool execution failed: Boom: it broke");
        let e: Value =
            serde_json::from_str(&reg.handle_function_call("panics", &json!({}), &ctx())).unwrap();
        assert_eq!(e["error"], "Tool execution failed: Panic: handler exploded");
        let e: Value =
            serde_json::from_str(&reg.handle_function_call("nope", &json!({}), &ctx())).unwrap();
        assert!(e["error"]
            .as_str()
            .unwrap()
            .starts_with("Error executing nope: unknown tool"));
        let e: Value =
            serde_json::from_str(&reg.handle_function_call("echo", &json!([1]), &ctx())).unwrap();
        assert_eq!(
            e["error"],
            "Error executing echo: arguments must be a JSON object, got an array"
        );
        let e: Value =
            serde_json::from_str(&reg.handle_function_call("todo", &json!({}), &ctx())).unwrap();
        assert!(e["error"]
            .as_str()
            .unwrap()
            .starts_with("Error executing todo:"));
    }

    #[test]
    fn last_registration_in_a_toolset_wins_and_shadowing_needs_override() {
        let reg = ToolRegistry::new();
        reg.register(echo("same", "a")).unwrap();
        reg.register(echo("same", "a").with_emoji("2")).unwrap();
        assert_eq!(reg.get("same").unwrap().emoji, "2");
        assert!(reg.register(echo("same", "b")).is_err());
        reg.register_with_override(echo("same", "b"), true).unwrap();
        assert_eq!(reg.get("same").unwrap().toolset, "b");
    }

    #[test]
    fn malformed_schemas_are_rejected_with_the_name() {
        let reg = ToolRegistry::new();
        let mut bad = echo("bad", "t");
        bad.schema = json!({"type": "object", "required": ["missing"]});
        let err = reg.register(bad).unwrap_err();
        assert!(err.to_string().contains("`bad`"), "{err}");
        assert!(reg.register(echo("", "t")).is_err());
        let mut bad = echo("bad2", "t");
        bad.schema = json!("string");
        assert!(reg.register(bad).is_err());
    }

    #[test]
    fn results_over_the_cap_are_truncated_with_a_note() {
        let reg = ToolRegistry::new();
        let mut e = ToolEntry::new("big", "t", "Big.", json!({"type": "object"}), |_, _| {
            Ok(Value::String("é".repeat(100)))
        });
        e.max_result_size_chars = Some(10);
        reg.register(e).unwrap();
        let out: Value =
            serde_json::from_str(&reg.handle_function_call("big", &json!({}), &ctx())).unwrap();
        assert_eq!(out["truncated"], true);
        assert_eq!(out["content"].as_str().unwrap().chars().count(), 10);
        assert!(out["note"]
            .as_str()
            .unwrap()
            .contains("showing 10 of 102 characters"));
    }

    #[test]
    fn hosts_open_their_tools_to_scripts_but_never_blocked_or_mcp_ones() {
        let reg = ToolRegistry::new();
        reg.register(echo("read_file", "file")).unwrap();
        reg.register(echo("my_tool", "host")).unwrap();
        reg.register(echo("mcp_thing", "srv").with_source(ToolSource::Mcp("srv".into())))
            .unwrap();
        let names = |r: &ToolRegistry| -> Vec<String> {
            r.script_tools().iter().map(|e| e.name.clone()).collect()
        };
        assert_eq!(names(&reg), vec!["read_file"]);
        reg.allow_in_scripts("my_tool").unwrap();
        assert_eq!(names(&reg), vec!["read_file", "my_tool"]);
        for blocked in ["execute_code", "delegate_task", "todo", "mcp_thing"] {
            let err = reg.allow_in_scripts(blocked).unwrap_err();
            assert!(err.to_string().contains(blocked), "{err}");
        }
        // An MCP tool that later takes an opened name stays closed to scripts.
        reg.allow_in_scripts("later").unwrap();
        reg.register(echo("later", "srv2").with_source(ToolSource::Mcp("srv2".into())))
            .unwrap();
        assert!(!names(&reg).contains(&"later".to_string()));
        assert!(reg.disallow_in_scripts("my_tool"));
        assert_eq!(names(&reg), vec!["read_file"]);
    }

    #[test]
    fn builtins_register_themselves() {
        let reg = ToolRegistry::with_builtins();
        assert!(reg.get("read_file").is_some());
        assert!(reg.get("write_file").is_some());
        let names: Vec<String> = reg.script_tools().iter().map(|e| e.name.clone()).collect();
        assert!(names.contains(&"read_file".to_string()));
    }
}
