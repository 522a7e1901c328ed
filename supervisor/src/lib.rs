//! execute_code: run an agent's Python script that calls its tools, and return what it printed.
//!
//! [`execute`] is the whole path of one call: a staging dir with the generated
//! `vibeos_tools.py`, a private Unix-socket RPC listener, the interpreter started in the mode's
//! cwd with a scrubbed environment under a per-execution reaper, the limits of SPEC §5, and a
//! [`ExecutionResult`]. The `vibeos-exec` binary is a thin CLI over it.

pub mod audit;
pub mod backends;
pub mod capture;
pub mod config;
pub mod confine;
pub mod env_policy;
pub mod execute;
pub mod execute_code_tool;
pub mod extensions;
pub mod interpreter;
pub mod interpreter_shim;
pub mod interrupts;
pub(crate) mod launch;
pub mod logging;
pub mod mcp;
pub mod mcp_approval;
pub mod overrides;
pub mod pool;
pub mod reaper;
pub mod redaction;
pub mod remote;
pub mod result;
pub mod rpc_server;
pub mod script_guard;
pub mod staging_sweep;
pub mod terminal_cwd;
pub mod zygote;

pub use config::{Config, ConfigError, Mode};
pub use execute::{execute, ExecutionRequest, Interrupt, StartError};
pub use result::{ExecutionResult, Status};
