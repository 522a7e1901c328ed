//! The shared tool registry of vibeos-exec and its built-in tools.
//!
//! Every tool the agent can call — directly, or from an execute_code script over the RPC
//! channel — is a [`ToolEntry`] in one process-wide [`ToolRegistry`]. The registry is the single
//! source of truth: the script stub, the execute_code schema and the CLI listing are generated
//! from it, and every call goes through [`ToolRegistry::handle_function_call`], so hooks, error
//! wrapping and limits are the same whatever the caller.
//!
//! Built-in tools register themselves from their own files under `builtin/` ("import =
//! registration", via `inventory`); there is no hand-kept list.

pub mod approval;
pub mod approval_policy;
mod approval_request;
mod async_bridge;
mod availability;
pub mod builtin;
mod call_scope;
pub mod capture;
pub mod coerce;
pub mod config_file;
pub mod config_types;
mod context;
mod definitions;
mod dispatch;
mod entry;
pub mod environments;
mod error;
pub mod exit_hook;
mod hooks;
pub mod mcp_client;
pub mod path_policy;
pub mod planner;
pub mod policy_file;
pub mod redact;
mod registry;
mod script_schema;
mod secret_shape;
pub mod settings;
mod toolsets;
pub mod url_mask;

pub use async_bridge::{run_async, BoxFuture};
pub use availability::{Availability, DEFAULT_CHECK_TIMEOUT};
pub use call_scope::{cancel_scope, ended_flag, mark_nesting, nesting, EndedFlag};
pub use context::{CallOrigin, ToolContext, ToolsetSelection};
pub use definitions::{execute_code_description, ExecuteCodeSettings, ToolStatus, EXECUTE_CODE};
pub use entry::{
    AsyncHandler, BuiltinTool, CheckFn, CheckFnHolder, Handler, OverridePolicy, SyncHandler,
    TextHandler, ToolCall, ToolEntry, ToolSource,
};
pub use error::{RegistrationError, ToolError, ToolErrorKind};
pub use hooks::{CallStatus, HookDecision, PostHook, PostToolCall, PreHook, PreToolCall};
pub use registry::{
    json_type, registry, Prepare, PrepareHook, ToolRegistry, AGENT_LOOP_TOOLS,
    MAX_PARALLEL_TOOL_CALLS, SCRIPT_BLOCKED_TOOLS, SCRIPT_TOOLS,
};
pub use script_schema::AGENT_ONLY_PARAMETERS;
pub use toolsets::{static_toolsets, Toolset, ToolsetError, LEGACY_TOOLSET_ALIASES};
