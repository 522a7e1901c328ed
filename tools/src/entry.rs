//! What one tool is: its entry (name, toolset, schema, handler, availability check, source)
//! and the handler and check types, apart from the registry that holds entries, so the
//! registry and the availability checks both build on it without importing each other.

use crate::async_bridge::BoxFuture;
use crate::toolsets::valid_toolset_name;
use crate::{RegistrationError, ToolContext, ToolError};
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

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

/// The longest tool name accepted (model APIs take function names of at most 64 characters).
pub const MAX_TOOL_NAME: usize = 64;

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
    /// Whether `check_fn` only reads settings already in memory or a local file, so it runs
    /// on the caller's thread rather than a thread of its own with a timeout (which costs a
    /// one-shot `run` a thread start per check). Only built-in checks set it.
    pub check_is_instant: bool,
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
    /// Whether dispatch refuses a call that leaves out an argument the schema's `required`
    /// lists, before the handler runs (as it refuses a wrong type). Set for tools whose
    /// handlers take the arguments as they come (the Python package's); built-ins parse
    /// typed arguments, which name a missing one with more detail.
    pub check_required: bool,
    /// The handler is a short, bounded local operation (no network, no child process, no
    /// waiting on anything but the local filesystem), so async callers may run it inline on
    /// their worker thread instead of paying a thread hop per call.
    pub bounded: bool,
    /// Arguments dispatch does not coerce ([`crate::coerce`]): a value of another type than
    /// the schema declares is refused, naming the argument. For arguments where a number or a
    /// boolean is no slip of a model but a wrong call (`terminal`'s `command` and `workdir`:
    /// `command=5` ran `5`, `workdir=123` became `<cwd>/123`).
    pub exact_type_args: Vec<String>,
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
            check_is_instant: false,
            requires_env: Vec::new(),
            description: description.into(),
            emoji: String::new(),
            max_result_size_chars: None,
            parallel_safe: false,
            path_arg: None,
            source: ToolSource::Builtin,
            bounded: false,
            check_required: false,
            exact_type_args: Vec::new(),
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
        self.check_is_instant = false;
        self
    }

    /// Gates availability on `check`, which must answer at once from memory or a local file (it
    /// runs inline, without the thread and timeout that guard other checks).
    pub fn with_instant_check<F: Fn() -> bool + Send + Sync + 'static>(mut self, check: F) -> Self {
        self.check_fn = Some(CheckFnHolder(Arc::new(check)));
        self.check_is_instant = true;
        self
    }

    /// Gates availability on a check shared with other tools; it runs once per build.
    pub fn with_shared_check(mut self, check: &CheckFn) -> Self {
        self.check_fn = Some(CheckFnHolder(Arc::clone(check)));
        self.check_is_instant = false;
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

    /// Has dispatch refuse calls missing a `required` argument (see
    /// [`ToolEntry::check_required`]).
    pub fn checking_required(mut self) -> Self {
        self.check_required = true;
        self
    }

    /// Has dispatch take `args` as they come, without coercion (see
    /// [`ToolEntry::exact_type_args`]).
    pub fn with_exact_types(mut self, args: &[&str]) -> Self {
        self.exact_type_args = args.iter().map(|a| a.to_string()).collect();
        self
    }

    /// Sets who registers the tool (plugins and MCP servers are subject to the override
    /// policy).
    pub fn with_source(mut self, source: ToolSource) -> Self {
        self.source = source;
        self
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

    pub(crate) fn validate(&self) -> Result<(), RegistrationError> {
        // Model APIs take function names of at most 64 characters; one longer name made a
        // provider refuse the whole tool list.
        let name_ok = !self.name.is_empty()
            && self.name.len() <= MAX_TOOL_NAME
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(RegistrationError::BadName(crate::error::shown_name(
                &self.name,
            )));
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

/// What a caught panic says, for the error a caller gets instead.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "the tool panicked".to_string()
    }
}
