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
//!
//! The same rules hold for a tool a strict host offers *directly*, outside any script
//! (`serve --mode strict --toolsets …`): that call runs in the same process, with the same
//! rights, so a client must not reach through it what a script cannot ([`direct_offer`],
//! [`direct_path_policy`]).

use super::{ConfineError, StrictOptions};
use std::path::Path;
use vibeos_tools::path_policy::{PathPolicy, RootAccess};
use vibeos_tools::{ToolEntry, ToolSource};

/// Whether a script tool is offered to a strict script: `terminal` and plugin tools only when
/// the operator opens them (`code_execution.strict.terminal`, `strict.plugin_tools`). A plugin
/// marks its own tools script-callable; that is the plugin's word, not the operator's, and the
/// tool runs in the plugin host with the operator's rights.
pub fn offered(options: &StrictOptions, tool: &ToolEntry) -> bool {
    (tool.name != "terminal" || options.terminal)
        && (options.plugin_tools || !matches!(tool.source, ToolSource::Plugin(_)))
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
    policy
        .add_root(staging, RootAccess::ReadWrite, true)
        .map_err(|e| ConfineError::Config(e.to_string()))?;
    if let Err(e) = policy.add_root(cwd, RootAccess::ReadWrite, false) {
        tracing::warn!("execute_code: the session cwd is not a strict tool root: {e}");
    }
    add_configured_roots(&mut policy, options)?;
    Ok(policy)
}

/// The roots of one direct call in strict mode: those of a strict execution
/// ([`path_policy`]) minus the staging dir, which a direct call does not have. With no staging
/// root, every execution's staging dir is out of reach too ([`PathPolicy`] refuses the staging
/// area except a policy's own). The write budget (`disk_mb`) applies per call, as it applies
/// per execution. A session cwd of `/` is not a root; the configured roots remain.
pub fn direct_path_policy(options: &StrictOptions, cwd: &Path) -> Result<PathPolicy, ConfineError> {
    let mut policy = PathPolicy::new();
    policy.set_write_budget(options.disk_bytes);
    if let Err(e) = policy.add_root(cwd, RootAccess::ReadWrite, false) {
        // Said at debug: a server started in `/` would otherwise log it at every call.
        tracing::debug!("strict mode: the session cwd is not a root of direct tool calls: {e}");
    }
    add_configured_roots(&mut policy, options)?;
    Ok(policy)
}

/// Adds `code_execution.strict.read_roots` and `write_roots`; one that cannot be used (missing,
/// not a directory, `/`) is a configuration error naming the key.
fn add_configured_roots(
    policy: &mut PathPolicy,
    options: &StrictOptions,
) -> Result<(), ConfineError> {
    let config = |e: vibeos_tools::path_policy::RootError| {
        ConfineError::Config(format!(
            "{e}; fix code_execution.strict.read_roots / write_roots"
        ))
    };
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
    Ok(())
}

/// Whether a registry tool may be offered directly (not from a script) by a host in strict
/// mode, or why not.
///
/// An allowlist, unlike [`offered`]: a script only ever sees the registry's script tools,
/// while a direct caller may name any tool of any toolset, including ones registered at run
/// time whose reach this module cannot know. So what is not known to be confined is refused:
/// - the file tools act beneath the roots of [`direct_path_policy`];
/// - the web tools reach the configured search backend and public hosts only (`web_extract`
///   checks destinations whenever the call carries a path policy);
/// - `terminal` and `process` run and drive commands as the host's user, outside any sandbox,
///   so they come only with `code_execution.strict.terminal: true`, as for scripts;
/// - `execute_code` runs the script in strict mode itself.
pub fn direct_offer(options: &StrictOptions, tool: &str) -> Result<(), String> {
    match tool {
        "read_file"
        | "write_file"
        | "patch"
        | "search_files"
        | "web_search"
        | "web_extract"
        | vibeos_tools::EXECUTE_CODE => Ok(()),
        "terminal" | "process" if options.terminal => Ok(()),
        "terminal" | "process" => Err(format!(
            "in strict mode `{tool}` would run commands as this server's user, outside the \
             sandbox; set code_execution.strict.terminal: true in config.yaml to offer it \
             anyway (unconfined), or serve in project mode"
        )),
        _ => Err(format!(
            "strict mode cannot confine `{tool}`: only the file tools (beneath the allowed \
             roots), the web tools (public hosts only) and, with \
             code_execution.strict.terminal: true, terminal and process are offered directly; \
             serve in project mode to offer it"
        )),
    }
}
