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
pub mod builtin;
mod context;
pub mod environments;
mod error;
mod registry;
pub mod settings;

pub use context::{CallOrigin, ToolContext};
pub use error::{RegistrationError, ToolError};
pub use registry::{
    registry, BuiltinTool, CheckFn, Handler, SyncHandler, ToolEntry, ToolRegistry,
    AGENT_LOOP_TOOLS, SCRIPT_BLOCKED_TOOLS, SCRIPT_TOOLS,
};
