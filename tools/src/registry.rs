//! The process-wide tool registry: registration, lookup and the one dispatch path.

use crate::{RegistrationError, ToolContext, ToolError};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock, RwLock};

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

/// A synchronous tool handler: arguments object in, JSON result out.
pub type SyncHandler =
    dyn Fn(&Map<String, Value>, &ToolContext) -> Result<Value, ToolError> + Send + Sync;

/// Availability check of a tool: `true` means usable now.
pub type CheckFn = Arc<dyn Fn() -> bool + Send + Sync>;

/// How a tool's work is run.
#[derive(Clone)]
pub enum Handler {
    /// Runs on the calling thread.
    Sync(Arc<SyncHandler>),
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Handler::Sync(_) => f.write_str("Handler::Sync"),
        }
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
    /// Optional availability check; `None` means always available.
    #[doc(hidden)]
    pub check_fn: Option<CheckFnHolder>,
    /// Environment variables the tool needs (shown to users when it is unavailable).
    pub requires_env: Vec<String>,
    /// Whether the handler is asynchronous.
    pub is_async: bool,
    /// What the tool does; the first line is its doc line in the stub.
    pub description: String,
    /// Emoji shown in listings.
    pub emoji: String,
    /// Results longer than this many characters are truncated with a note.
    pub max_result_size_chars: Option<usize>,
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
        ToolEntry {
            name: name.into(),
            toolset: toolset.into(),
            schema,
            handler: Handler::Sync(Arc::new(handler)),
            check_fn: None,
            requires_env: Vec::new(),
            is_async: false,
            description: description.into(),
            emoji: String::new(),
            max_result_size_chars: None,
            bounded: false,
        }
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

    /// Whether the tool is usable now (its check passes, or it has none). A panicking check
    /// counts as unavailable.
    pub fn is_available(&self) -> bool {
        match &self.check_fn {
            None => true,
            Some(CheckFnHolder(check)) => {
                catch_unwind(AssertUnwindSafe(|| check())).unwrap_or(false)
            }
        }
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
        let obj = self
            .schema
            .as_object()
            .ok_or_else(|| bad("must be a JSON object"))?;
        match obj.get("type") {
            Some(Value::String(t)) if t == "object" => {}
            _ => return Err(bad("must have \"type\": \"object\"")),
        }
        match obj.get("properties") {
            None | Some(Value::Object(_)) => {}
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

/// The registry: tools keyed by name.
#[derive(Default)]
pub struct ToolRegistry {
    tools: RwLock<BTreeMap<String, Arc<ToolEntry>>>,
}

impl ToolRegistry {
    /// An empty registry (tests and embedders; the process-wide one is [`registry`]).
    pub fn new() -> Self {
        Self::default()
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

    /// Adds a tool. A name already taken by another toolset is logged; the last registration
    /// wins.
    pub fn register(&self, entry: ToolEntry) -> Result<(), RegistrationError> {
        entry.validate()?;
        let mut tools = self.tools.write().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = tools.get(&entry.name) {
            if old.toolset != entry.toolset {
                tracing::warn!(
                    tool = %entry.name,
                    "tool `{}` of toolset `{}` replaces the one of toolset `{}`",
                    entry.name,
                    entry.toolset,
                    old.toolset
                );
            }
        }
        tools.insert(entry.name.clone(), Arc::new(entry));
        Ok(())
    }

    /// Looks a tool up by name.
    pub fn get(&self, name: &str) -> Option<Arc<ToolEntry>> {
        self.tools
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    /// All tools, by name.
    pub fn entries(&self) -> Vec<Arc<ToolEntry>> {
        self.tools
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// The script tools (SPEC §2) that are registered and available now, in [`SCRIPT_TOOLS`]
    /// order. Empty when none is: scripts then get no tools, never all of them.
    pub fn script_tools(&self) -> Vec<Arc<ToolEntry>> {
        SCRIPT_TOOLS
            .iter()
            .filter_map(|name| self.get(name))
            .filter(|e| e.is_available())
            .collect()
    }

    /// Runs a tool's handler. Handler failures (errors and panics) become
    /// `{"error": "Tool execution failed: <kind>: <message>"}`. Always returns a JSON string.
    pub fn dispatch(&self, name: &str, args: &Map<String, Value>, ctx: &ToolContext) -> String {
        let Some(entry) = self.get(name) else {
            return error_json(format!(
                "Tool execution failed: UnknownTool: no tool named `{name}`"
            ));
        };
        let outcome = match &entry.handler {
            Handler::Sync(h) => catch_unwind(AssertUnwindSafe(|| h(args, ctx))),
        };
        let value = match outcome {
            Ok(Ok(value)) => value,
            Ok(Err(e)) => return error_json(format!("Tool execution failed: {e}")),
            Err(panic) => {
                return error_json(format!(
                    "Tool execution failed: Panic: {}",
                    panic_message(panic.as_ref())
                ))
            }
        };
        let text = value.to_string();
        match entry.max_result_size_chars {
            Some(max) => cap_result(text, max),
            None => text,
        }
    }

    /// The one entry point for tool calls, from the agent and from scripts alike. Refuses
    /// agent-loop tools and unknown names, then dispatches; any failure outside the handler is
    /// wrapped as `{"error": "Error executing <tool>: <message>"}`.
    pub fn handle_function_call(&self, name: &str, args: &Value, ctx: &ToolContext) -> String {
        let outer = |message: String| error_json(format!("Error executing {name}: {message}"));
        if AGENT_LOOP_TOOLS.contains(&name) {
            return outer(format!(
                "`{name}` is handled by the agent loop and cannot be dispatched as a tool"
            ));
        }
        if self.get(name).is_none() {
            let known: Vec<String> = self.entries().iter().map(|e| e.name.clone()).collect();
            return outer(format!(
                "unknown tool; registered tools: {}",
                known.join(", ")
            ));
        }
        let empty = Map::new();
        let args = match args {
            Value::Object(m) => m,
            Value::Null => &empty,
            other => {
                return outer(format!(
                    "arguments must be a JSON object, got {}",
                    json_type(other)
                ))
            }
        };
        match catch_unwind(AssertUnwindSafe(|| self.dispatch(name, args, ctx))) {
            Ok(text) => text,
            Err(panic) => outer(panic_message(panic.as_ref())),
        }
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

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
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
    fn last_registration_wins() {
        let reg = ToolRegistry::new();
        reg.register(echo("same", "a")).unwrap();
        reg.register(echo("same", "b")).unwrap();
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
    fn builtins_register_themselves() {
        let reg = ToolRegistry::with_builtins();
        assert!(reg.get("read_file").is_some());
        assert!(reg.get("write_file").is_some());
        let names: Vec<String> = reg.script_tools().iter().map(|e| e.name.clone()).collect();
        assert!(names.contains(&"read_file".to_string()));
    }
}
