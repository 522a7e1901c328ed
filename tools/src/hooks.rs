//! `pre_tool_call` and `post_tool_call` hooks: the place for policy (block a call), auditing and
//! metrics, run around every dispatched call whatever its origin (agent or script).

use crate::ToolContext;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;

/// A call about to be dispatched (arguments already coerced to the schema's types).
#[derive(Debug)]
pub struct PreToolCall<'a> {
    /// Tool name.
    pub name: &'a str,
    /// Arguments.
    pub args: &'a Map<String, Value>,
    /// Call context (task id, cwd, origin).
    pub ctx: &'a ToolContext,
}

/// What a `pre_tool_call` hook decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookDecision {
    /// Let the call run.
    Continue,
    /// Refuse it; the text is the reason the caller sees.
    Block(String),
}

/// How a call ended, as `post_tool_call` hooks see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallStatus {
    /// The handler returned a result that is not an error object.
    Success,
    /// The handler failed, panicked, returned an error object, or the arguments did not fit.
    Error,
    /// A `pre_tool_call` hook refused the call; the handler did not run.
    Blocked,
}

impl CallStatus {
    /// Lower-case name: `success`, `error`, `blocked`.
    pub fn as_str(self) -> &'static str {
        match self {
            CallStatus::Success => "success",
            CallStatus::Error => "error",
            CallStatus::Blocked => "blocked",
        }
    }
}

/// A call that has finished.
#[derive(Debug)]
pub struct PostToolCall<'a> {
    /// Tool name.
    pub name: &'a str,
    /// Arguments as dispatched.
    pub args: &'a Map<String, Value>,
    /// Call context.
    pub ctx: &'a ToolContext,
    /// The JSON text the caller gets.
    pub result: &'a str,
    /// How it ended.
    pub status: CallStatus,
    /// Time from the start of dispatch (hooks included) to the result.
    pub duration: Duration,
}

/// A `pre_tool_call` hook. A panicking hook blocks the call (fail closed: a policy hook that
/// breaks must not wave calls through).
pub type PreHook = Arc<dyn Fn(&PreToolCall<'_>) -> HookDecision + Send + Sync>;

/// A `post_tool_call` hook. A panicking hook is logged and ignored.
pub type PostHook = Arc<dyn Fn(&PostToolCall<'_>) + Send + Sync>;
