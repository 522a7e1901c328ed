//! execute_code: run an agent's Python script that calls its tools, and return what it printed.
//!
//! [`execute`] is the whole path of one call: a staging dir with the generated
//! `vibeos_tools.py`, a private Unix-socket RPC listener, the interpreter started in the mode's
//! cwd with a scrubbed environment under a per-execution reaper, the limits of SPEC §5, and a
//! [`ExecutionResult`]. The `vibeos-exec` binary (crate vibeos-cli), the MCP server (crate
//! vibeos-mcp-server) and the Python package are thin hosts over it.

// The public face: what hosts (the CLI, the MCP server, the Python package, benchmarks and
// tests) use. Modules a host calls into by name stay public; the machinery of one execution is
// private, and the few items of it hosts need are re-exported below.
pub mod audit;
pub mod backends;
pub mod direct_tools;
pub mod execute_code_tool;
pub mod extensions;
pub mod interrupts;
pub mod logging;
pub mod overrides;
pub mod pool;
pub mod prestart;
pub mod zygote;

mod background;
mod capture;
mod config;
mod confine;
mod env_policy;
mod error;
mod execute;
mod fds;
mod fork_activity;
mod forked;
mod interpreter;
mod interpreter_probe;
mod interpreter_shim;
mod launch;
mod leftovers;
mod outcome;
mod real_path;
mod reaper;
mod redaction;
mod remote;
mod request;
mod result;
mod rpc_server;
mod script_exec;
mod script_feed;
mod script_guard;
mod staging_retire;
mod staging_sweep;
mod startup_files;
mod terminal_cwd;
mod unreaped;

pub use config::{Config, ConfigError, Mode};
pub use confine::doctor;
pub use env_policy::EnvPolicy;
pub use error::StartError;
pub use execute::execute;
pub use interpreter::InterpreterError;
pub use reaper::is_descendant;
pub use remote::RemoteError;
pub use request::{session_cwd, ExecutionRequest, Interrupt};
pub use result::{ExecutionResult, Status};
pub use unreaped::wait_for_reapers;
