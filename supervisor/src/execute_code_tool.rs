//! The `execute_code` entry of the tool registry.
//!
//! The supervisor owns execution, so it is the supervisor that registers the tool; the tools
//! crate only knows it by name (to rewrite its description after filtering). The handler is
//! asynchronous — [`crate::execute`] is — and so runs through the registry's async bridge: from
//! plain sync code on the bridge's persistent runtime, and from inside a running runtime on a
//! worker thread, never by blocking a runtime worker on itself.

use crate::config::Config;
use crate::execute::execute;
use crate::overrides::Overrides;
use crate::request::{session_cwd, ExecutionRequest, Interrupt};
use serde_json::{json, Map, Value};
use std::path::Path;
use vibeos_tools::{
    ExecuteCodeSettings, RegistrationError, ToolContext, ToolEntry, ToolError, ToolRegistry,
};

/// The tool's own description; the registry appends the script tools, mode and limits.
pub const DESCRIPTION: &str = "Run a Python script that calls your tools and return only what it \
prints. Use it to chain several tool calls (loops, filtering, aggregation) in one turn instead \
of many; intermediate results stay out of the conversation.";

/// The settings the registry describes execute_code with, from `config` and the session
/// working dir (`cwd`, else `TERMINAL_CWD`, else the process cwd).
pub fn execute_code_settings(config: &Config, cwd: Option<&Path>) -> ExecuteCodeSettings {
    ExecuteCodeSettings {
        mode: config.mode.as_str().to_string(),
        cwd: session_cwd(cwd).ok(),
        timeout: config.timeout,
        max_tool_calls: config.max_tool_calls,
        strict_terminal: crate::confine::StrictOptions::from_config(config).terminal,
        strict_plugin_tools: crate::confine::StrictOptions::from_config(config).plugin_tools,
        stdout_limit: config.stdout_limit,
    }
}

/// The `execute_code` entry (toolset `code_execution`): runs scripts with `config`'s limits,
/// overridable per call, dispatching the scripts' tool calls through `registry`. Scripts get
/// every available script tool, or those the call's [`ToolContext::toolsets`] keep.
pub fn execute_code_entry(registry: &'static ToolRegistry, config: &Config) -> ToolEntry {
    execute_code_entry_for(registry, config, &[], &[])
}

/// Like [`execute_code_entry`] for a session whose tools are selected by `enabled` /
/// `disabled` toolsets: scripts get only the script tools that selection keeps, the same ones
/// the rewritten execute_code description names (a call's own [`ToolContext::toolsets`]
/// narrows it further, never widens it). The selection is resolved at each call, so
/// toolsets added or removed later are followed; a selection that no longer resolves is an
/// error of the call.
pub fn execute_code_entry_for(
    registry: &'static ToolRegistry,
    config: &Config,
    enabled: &[String],
    disabled: &[String],
) -> ToolEntry {
    let config = config.clone();
    let selection = Some(vibeos_tools::ToolsetSelection::from_lists(
        enabled, disabled,
    ))
    .filter(|s| !s.is_everything());
    ToolEntry::new_async(
        "execute_code",
        "code_execution",
        DESCRIPTION,
        json!({
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "Python source; `from vibeos_tools import ...` to call tools, print() what should come back"},
                "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": crate::config::MAX_TIMEOUT_SECS, "description": "Seconds before the script is killed, at most a day (default from config)"},
                "max_tool_calls": {"type": "integer", "minimum": 0, "description": "Most tool calls the script may make (default from config)"},
                "stdout_limit": {"type": "integer", "minimum": crate::config::MIN_OUTPUT_LIMIT, "maximum": crate::config::MAX_OUTPUT_LIMIT, "description": "Bytes of stdout returned; longer output keeps its first 40% and last 60% (default from config)"},
                "stderr_limit": {"type": "integer", "minimum": crate::config::MIN_OUTPUT_LIMIT, "maximum": crate::config::MAX_OUTPUT_LIMIT, "description": "Bytes of stderr kept for a failed script (default from config)"}
            },
            "required": ["code"]
        }),
        move |args, ctx| {
            let config = config.clone();
            let selection = selection.clone();
            async move {
                let mut request = request_from(&args, &ctx, &config)?;
                // The entry's selection (a session's) and the call's own narrow each other: a
                // caller can take tools away, never add one the entry's session lacks.
                // A call's selection with an empty `enabled` list selects no toolset: its
                // script gets no tool (fail closed), never every one.
                let call = ctx.toolsets.as_deref();
                let mut allowed: Option<std::collections::BTreeSet<String>> = None;
                for chosen in [selection.as_ref(), call].into_iter().flatten() {
                    let selected = registry.select_toolsets(chosen).map_err(|e| {
                        ToolError::new(vibeos_tools::ToolErrorKind::ToolsetError, format!("the session's toolsets: {e}"))
                    })?;
                    let names: std::collections::BTreeSet<String> =
                        selected.iter().map(|e| e.name.clone()).collect();
                    allowed = Some(match allowed {
                        None => names,
                        Some(before) => &before & &names,
                    });
                }
                if allowed.is_some() {
                    request.script_tools = allowed;
                }
                let interrupt = Interrupt::new();
                // `interrupt(task_id)` of a host reaches this execution too.
                let _tracked = crate::interrupts::track(ctx.task_id.as_deref(), interrupt.clone());
                Ok(execute(request, registry, interrupt).await.to_json())
            }
        },
    )
    .with_emoji("🐍")
}

/// The arguments an execute_code call may set; the rest (mode, cwd, interpreter) are the
/// host's, so a caller cannot loosen what the operator chose (strict → project, say).
pub const CALL_ARGUMENTS: [&str; 5] = [
    "code",
    "timeout",
    "max_tool_calls",
    "stdout_limit",
    "stderr_limit",
];

/// The execution request an execute_code call with `args` asks for: `code`, and optional
/// `timeout` / `max_tool_calls` / `stdout_limit` / `stderr_limit` overriding `config`'s limits; runs in `ctx.cwd`. Other faces of
/// execute_code (the MCP server) use it so every caller validates arguments the same way.
pub fn request_from(
    args: &Map<String, Value>,
    ctx: &ToolContext,
    config: &Config,
) -> Result<ExecutionRequest, ToolError> {
    // An argument the call cannot set is refused, not dropped: a model that passed
    // `mode: strict` must not believe its script ran confined.
    if let Some(bad) = args.keys().find(|k| !CALL_ARGUMENTS.contains(&k.as_str())) {
        return Err(ToolError::invalid_args(format!(
            "execute_code has no argument `{bad}`; it takes {} (mode and cwd are the host's \
             settings)",
            CALL_ARGUMENTS.join(", ")
        )));
    }
    let code = match args.get("code") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(Value::String(_)) => {
            return Err(ToolError::invalid_args(
                "argument `code` is empty; pass Python code that prints its result",
            ))
        }
        _ => {
            return Err(ToolError::invalid_args(
                "missing required argument `code` (the Python source to run)",
            ))
        }
    };
    let mut request = ExecutionRequest::from_config(code, config);
    // The mode is the host's setting, not the model's: only the limits are per call here.
    Overrides::from_json(args, false)
        .map_err(|e| ToolError::invalid_args(e.to_string()))?
        .apply_to_request(&mut request);
    request.cwd = Some(ctx.cwd.clone());
    request.task_id = ctx.task_id.clone();
    Ok(request)
}

/// Registers [`execute_code_entry`] in `registry`.
pub fn register_execute_code(
    registry: &'static ToolRegistry,
    config: &Config,
) -> Result<(), RegistrationError> {
    registry.register(execute_code_entry(registry, config))
}
