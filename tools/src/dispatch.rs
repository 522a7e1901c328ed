//! The one dispatch path: every call — from the agent, from a script over RPC, in a parallel
//! batch — goes through [`ToolRegistry::handle_function_call`] here, so argument coercion, hooks,
//! error wrapping and result caps are the same for all of them.

use crate::async_bridge::run_async;
use crate::availability::{availability_of, Availability};
use crate::coerce::{coerce_args, missing_required};
use crate::entry::{panic_message, Handler, ToolCall, ToolEntry, ToolSource};
use crate::hooks::{CallStatus, HookDecision, PostHook, PostToolCall, PreHook, PreToolCall};
use crate::registry::{json_type, read, ToolRegistry, AGENT_LOOP_TOOLS};
use crate::ToolContext;
use serde_json::{json, Map, Value};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

impl ToolRegistry {
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
    /// agent-loop tools, unknown names and (direct agent calls) tools whose check fails now,
    /// coerces arguments to the schema, runs the
    /// `pre_tool_call` hooks (which may block), dispatches, runs the `post_tool_call` hooks.
    /// Failures outside the handler are wrapped as `{"error": "Error executing <tool>: <message>"}`.
    /// Always returns a JSON string.
    pub fn handle_function_call(&self, name: &str, args: &Value, ctx: &ToolContext) -> String {
        self.handle_function_call_to(self.get(name), name, args, ctx)
    }

    /// [`Self::handle_function_call`] for a caller that has already looked `name` up
    /// ([`Self::get`]) to check the entry: the call goes to that entry, not to whatever a
    /// host registered under the name since (the script channel refuses tools closed to
    /// scripts while a script runs, and must dispatch the entry it checked).
    pub fn handle_function_call_to(
        &self,
        entry: Option<Arc<ToolEntry>>,
        name: &str,
        args: &Value,
        ctx: &ToolContext,
    ) -> String {
        let outer = |message: String| error_json(format!("Error executing {name}: {message}"));
        match catch_unwind(AssertUnwindSafe(|| self.call(entry, name, args, ctx))) {
            Ok(Ok(text)) => text,
            Ok(Err(message)) => outer(message),
            Err(panic) => outer(panic_message(panic.as_ref())),
        }
    }

    fn call(
        &self,
        entry: Option<Arc<ToolEntry>>,
        name: &str,
        args: &Value,
        ctx: &ToolContext,
    ) -> Result<String, String> {
        if AGENT_LOOP_TOOLS.contains(&name) {
            return Err(format!(
                "`{name}` is handled by the agent loop and cannot be dispatched as a tool"
            ));
        }
        let Some(entry) = entry else {
            // A script learns no more than its own tool list: the registry also holds the
            // host's tools it was never offered.
            if ctx.origin == crate::CallOrigin::Script {
                return Err(format!(
                    "unknown tool `{name}`: no tool of that name is registered (any more)"
                ));
            }
            let known: Vec<String> = self.entries().iter().map(|e| e.name.clone()).collect();
            return Err(format!(
                "unknown tool; registered tools: {}",
                known.join(", ")
            ));
        };
        if let Some(why) = unavailable_for_direct_call(&entry, ctx, self.check_timeout()) {
            return Err(format!("unavailable: {why}"));
        }
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
        let coerced = coerce_args(&entry.schema, args, &entry.exact_type_args).and_then(|c| {
            // After coercion, so a value coerced to fit is present; the same error shape as a
            // wrong type's.
            match entry
                .check_required
                .then(|| missing_required(&entry.schema, &c))
            {
                Some(Some(message)) => Err(message),
                _ => Ok(c),
            }
        });
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

/// Why a direct (agent) call of `entry` is refused, if it is: its `check_fn` fails now, so
/// `get_tool_definitions` leaves it out and `tools list` shows it `unavailable: <why>` (SPEC §7:
/// the check gates availability; a host calling a tool it was never offered got it run anyway).
/// The check runs as a definitions build runs it: an instant (built-in) check inline, any other
/// on its own thread bounded by the registry's check timeout, a hung one not started again.
///
/// Script calls are not checked again: an execution's tools are the ones available when it
/// started (the stub and the RPC allowlist come from the same checks), and a plugin's or a
/// Python host's check (a network probe, the GIL) would otherwise run once per call, up to the
/// execution's whole call budget. MCP tools are not checked either: their check only mirrors
/// whether their server is running, and their handler answers a call to a server that is down
/// with why (or restarts one that exited), which says more.
fn unavailable_for_direct_call(
    entry: &Arc<ToolEntry>,
    ctx: &ToolContext,
    timeout: std::time::Duration,
) -> Option<String> {
    if entry.check_fn.is_none()
        || ctx.origin != crate::CallOrigin::Agent
        || matches!(entry.source, ToolSource::Mcp(_))
    {
        return None;
    }
    match availability_of(std::slice::from_ref(entry), timeout).pop() {
        Some(Availability::Unavailable(why)) => Some(why),
        _ => None,
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
        // A call its script can no longer receive does not start (it waited in a queue).
        _ if crate::call_scope::scope_ended(ctx) => Err(crate::call_scope::abandoned(&entry.name)),
        Handler::Sync(h) => h(args, ctx).map(Produced::Value),
        // A script's async call ends with its execution (see `call_scope`).
        Handler::Async(h) => run_async(crate::call_scope::scoped(
            ctx,
            &entry.name,
            h(args.clone(), ctx.clone()),
        ))?
        .map(Produced::Value),
        Handler::Text(h) => h(args, ctx).map(Produced::Text),
    }));
    let (text, status) = match outcome {
        Ok(Ok(Produced::Value(value))) => {
            let status = status_of(&value);
            (json_text(&value), status)
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

/// `value` as JSON text. Writes straight into a buffer: `Value::to_string` goes through
/// `Display` and a formatter adapter, several times slower for a small tool result.
fn json_text(value: &Value) -> String {
    // Serialising a `Value` cannot fail (string keys, no foreign types); the fallback is
    // unreachable but keeps this free of panics.
    serde_json::to_string(value).unwrap_or_else(|_| value.to_string())
}

fn status_of(value: &Value) -> CallStatus {
    if value.get("error").is_some_and(|e| !e.is_null()) {
        CallStatus::Error
    } else {
        CallStatus::Success
    }
}

fn error_json(message: String) -> String {
    json!({ "error": message }).to_string()
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
