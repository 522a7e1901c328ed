//! The tools as part of the strict sandbox (SPEC §6): what a strict script's tool calls may
//! reach.
//!
//! A strict script's only door is its RPC channel, and what stands behind the door runs with
//! the supervisor's rights. So in strict mode:
//! - the file tools (`read_file`, `write_file`, `patch`, `search_files`) act only beneath the
//!   execution's roots — the staging dir and the session cwd (read-write: results land in
//!   the cwd, as scripts and agents expect), `code_execution.strict.read_roots` (read) and
//!   `write_roots` (read-write) — through
//!   [`vibeos_tools::path_policy::PathPolicy`];
//! - `terminal` is not offered: a shell needs programs the script's landlock ruleset does not
//!   grant (`/usr/bin` is closed on purpose), so running it "under the same confinement" would
//!   leave a terminal that cannot start `sh`. An operator who wants it sets
//!   `code_execution.strict.terminal: true` and gets it as the supervisor's user, unconfined.
//! - the web tools stay: they reach the network from the supervisor, under its hooks and
//!   approval, which is what the channel is for.

use super::{ConfineError, StrictOptions};
use std::path::Path;
use vibeos_tools::path_policy::{PathPolicy, RootAccess};

/// Whether a script tool is offered to a strict script.
pub fn offered(options: &StrictOptions, tool: &str) -> bool {
    tool != "terminal" || options.terminal
}

/// The roots of one strict execution. A configured root that does not exist refuses the run;
/// a session cwd of `/` is not a root (it would open everything).
pub fn path_policy(
    options: &StrictOptions,
    staging: &Path,
    cwd: &Path,
) -> Result<PathPolicy, ConfineError> {
    let mut policy = PathPolicy::new();
    policy.set_write_budget(options.disk_bytes);
    let config = |e: vibeos_tools::path_policy::RootError| {
        ConfineError::Config(format!(
            "{e}; fix code_execution.strict.read_roots / write_roots"
        ))
    };
    policy
        .add_root(staging, RootAccess::ReadWrite, true)
        .map_err(|e| ConfineError::Config(e.to_string()))?;
    if let Err(e) = policy.add_root(cwd, RootAccess::ReadWrite, false) {
        tracing::warn!("execute_code: the session cwd is not a strict tool root: {e}");
    }
    for root in &options.read_roots {
        policy
            .add_root(root, RootAccess::Read, false)
            .map_err(config)?;
    }
    for root in &options.write_roots {
        policy
            .add_root(root, RootAccess::ReadWrite, false)
            .map_err(config)?;
    }
    Ok(policy)
}
