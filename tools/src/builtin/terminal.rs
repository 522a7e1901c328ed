//! `terminal`: run a shell command on the local backend.
//!
//! Every command passes dangerous-command approval first (SPEC §8). The environment is the
//! call's `ctx.env` when set (script calls: the scrubbed execute_code environment, SPEC §4), else
//! this process's environment minus the provider credentials the product manages — the
//! `provider_blocklist` of `policies/env.json`, the one list the supervisor's scrubbing uses too.
//! Background processes and PTY mode are for the agent only; scripts run foreground commands.

use super::args::{in_range, parse, schema_for};
use crate::approval::{check_command, check_command_in, Decision};
use crate::environments::local::{self, SpawnSpec};
use crate::{BuiltinTool, CallOrigin, ToolContext, ToolEntry, ToolError};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::LazyLock;
use std::time::Duration;

/// Default foreground timeout in seconds.
const DEFAULT_TIMEOUT: i64 = 180;
/// Output kept for a foreground command, and for one `process` poll or log of a background
/// one (first 40% and last 60%).
pub(crate) const OUTPUT_CAP: usize = 50 * 1024;
/// Longest command line accepted.
const MAX_COMMAND_BYTES: usize = 256 * 1024;

#[derive(Deserialize)]
struct EnvPolicy {
    provider_blocklist: Vec<String>,
}

/// Provider credentials that never reach a command (policies/env.json `provider_blocklist`).
pub static PROVIDER_BLOCKLIST: LazyLock<Vec<String>> = LazyLock::new(|| {
    serde_json::from_str::<EnvPolicy>(include_str!("../../../policies/env.json"))
        .map(|p| p.provider_blocklist)
        .unwrap_or_else(|e| {
            tracing::error!("policies/env.json has no valid provider_blocklist: {e}");
            Vec::new()
        })
});

/// The arguments of `terminal`: its schema and its parser.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct TerminalArgs {
    /// Shell command line
    command: String,
    /// Seconds before the command and its process group are killed
    #[serde(default = "default_timeout")]
    #[schemars(range(min = 1, max = 86400))]
    timeout: i64,
    /// Working directory (default: the session working dir)
    workdir: Option<String>,
    /// Start in the background and return a process id (not available in scripts)
    #[serde(default)]
    background: bool,
    /// Run under a pseudo-terminal (not available in scripts)
    #[serde(default)]
    pty: bool,
}

fn default_timeout() -> i64 {
    DEFAULT_TIMEOUT
}

fn entry() -> ToolEntry {
    ToolEntry::new(
        "terminal",
        "terminal",
        "Run a shell command (bash -c) and return its combined output and exit code. Dangerous \
         commands need approval. Foreground commands are killed (with their process group) at the \
         timeout; output is capped (head and tail kept). Agent only: background=true starts it in \
         the background (manage it with the `process` tool), pty=true runs it under a \
         pseudo-terminal.",
        schema_for::<TerminalArgs>(),
        terminal,
    )
    .with_emoji("💻")
    // A number or boolean here is a wrong call, not a model's way of writing a string:
    // `command=5` ran `5`, `workdir=123` ran in `<cwd>/123`. (`timeout="2"` is still read as 2,
    // as every tool's numbers are.)
    .with_exact_types(&["command", "workdir"])
}

inventory::submit! { BuiltinTool(entry) }

/// The environment for a command of this call.
pub fn command_env(ctx: &ToolContext) -> Vec<(String, String)> {
    match &ctx.env {
        Some(env) => env.as_ref().clone(),
        None => std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .filter(|(k, _)| !PROVIDER_BLOCKLIST.iter().any(|b| b.eq_ignore_ascii_case(k)))
            .collect(),
    }
}

fn terminal(args: &Map<String, Value>, ctx: &ToolContext) -> Result<Value, ToolError> {
    let a: TerminalArgs = parse(args)?;
    let command = a.command.as_str();
    if command.trim().is_empty() {
        return Err(ToolError::invalid_args("argument `command` is empty"));
    }
    if command.len() > MAX_COMMAND_BYTES {
        return Err(ToolError::invalid_args(format!(
            "argument `command` is {} bytes; the limit is {MAX_COMMAND_BYTES}. Put long input in a \
             file with write_file and run that instead",
            command.len()
        )));
    }
    if command.contains('\0') {
        return Err(ToolError::invalid_args(
            "argument `command` contains a NUL byte, which no shell command can hold",
        ));
    }
    let timeout = in_range("timeout", a.timeout, 1, 86_400)?;
    let (background, pty) = (a.background, a.pty);
    if ctx.origin == CallOrigin::Script && (background || pty) {
        return Err(ToolError::invalid_args(
            "background and pty are not available to execute_code scripts; run the command in \
             the foreground",
        ));
    }
    let workdir_arg = a.workdir.as_deref();
    if let Some(env) = crate::environments::remote_for(ctx)? {
        // Background and PTY commands run under the agent there, like foreground ones; the
        // `process` tool reaches them through the same agent.
        return remote_terminal(env, command, args, ctx, timeout);
    }
    let cwd = match workdir_arg {
        Some(w) if w.contains('\0') => {
            return Err(ToolError::invalid_args(
                "argument `workdir` contains a NUL byte",
            ))
        }
        Some(w) => ctx.resolve(w),
        None => ctx.cwd.clone(),
    };
    if !cwd.is_dir() {
        return Err(ToolError::new(
            crate::ToolErrorKind::NotADirectory,
            format!(
                "working directory {} does not exist or is not a directory",
                cwd.display()
            ),
        ));
    }
    // Where the command starts: its workdir, else where the session's last `cd` left it.
    let starts_in = match workdir_arg {
        Some(_) => cwd.clone(),
        None => crate::environments::session::current_dir(ctx).unwrap_or_else(|| cwd.clone()),
    };
    if let Decision::Deny { message } = check_command_in(command, &starts_in, ctx) {
        return Err(ToolError::new(crate::ToolErrorKind::CommandDenied, message));
    }
    // An approval can take longer than the script lives: a command approved after its
    // execution ended must not run (nothing would receive its output or end what it starts).
    if crate::call_scope::scope_ended(ctx) {
        return Err(crate::call_scope::abandoned("terminal"));
    }
    let env = command_env(ctx);
    let wrapped = crate::environments::session::wrap(command, ctx, workdir_arg.is_some());
    let spec = SpawnSpec {
        command: &wrapped,
        shown_command: command,
        cwd: &cwd,
        starts_in: &starts_in,
        env: &env,
        pty,
        scope: local::scope_of(ctx),
    };
    if background {
        let p = crate::environments::background::start_background(&spec, ctx.task_id.as_deref())
            .map_err(|e| ToolError::new(crate::ToolErrorKind::SpawnError, e.to_string()))?;
        return Ok(json!({
            "status": "running",
            "process_id": p.id,
            "pid": p.pid,
            "pty": pty,
            "output": "",
            "exit_code": Value::Null,
            "error": Value::Null,
            "hint": format!("poll with process(action=\"poll\", process_id=\"{}\"); stop with action=\"kill\"", p.id),
        }));
    }
    let out = local::run_foreground(&spec, Duration::from_secs(timeout as u64), OUTPUT_CAP)
        .map_err(|e| ToolError::new(crate::ToolErrorKind::SpawnError, e.to_string()))?;
    let (mut output, redactions) = crate::redact::redact_command_output(out.output, ctx);
    let error = if out.timed_out {
        let note =
            format!("Command timed out after {timeout}s and was killed (with its process group).");
        output.push_str(&format!("\n[{note}]"));
        Value::String(note)
    } else {
        Value::Null
    };
    if out.detached_output {
        // A script cannot pass `background` (its stub does not offer it, and its requests lose
        // it on the way): the note tells it what becomes of the process instead.
        output.push_str(if ctx.origin == CallOrigin::Script {
            "\n[the command exited but a process it started in the background still holds its \
             output; it runs on until this execution ends]"
        } else {
            "\n[the command exited but a process it started in the background still holds its \
             output; use background=true for long-running processes]"
        });
    }
    Ok(json!({
        "output": output,
        "exit_code": out.exit_code,
        "error": error,
        "timed_out": out.timed_out,
        "truncated": out.truncated,
        "output_bytes": out.output_bytes,
        "redactions": redactions,
        "duration_seconds": (out.duration.as_secs_f64() * 1000.0).round() / 1000.0,
        // Where the session now is: a `cd` in this command moves it (the next call starts
        // there), and the field must not keep naming the base dir. A `workdir` call does not
        // move the session, so it reports that dir.
        "cwd": workdir_arg
            .is_none()
            .then(|| crate::environments::session::current_dir(ctx))
            .flatten()
            .unwrap_or(cwd)
            .display()
            .to_string(),
    }))
}

/// `terminal` with a remote backend: approval here (skipped for an isolated container when
/// `approvals.skip_in_isolated_backends` allows), execution by the environment's tool agent.
/// Whether commands sent to `env` skip the dangerous-command approval: an isolated backend
/// (a container without host volumes) with `approvals.skip_in_isolated_backends`. What
/// `process(write)` sends to a shell there is judged the same way.
pub(super) fn approval_skipped_in(env: &dyn crate::environments::Environment) -> bool {
    env.isolated()
        && crate::environments::active().is_some_and(|a| a.settings().skip_approvals_isolated)
}

fn remote_terminal(
    env: crate::environments::EnvHandle,
    command: &str,
    args: &Map<String, Value>,
    ctx: &ToolContext,
    timeout: i64,
) -> Result<Value, ToolError> {
    if !approval_skipped_in(env.as_ref()) {
        // The workdir names a dir over there; without one, where the remote session stands
        // is not known here.
        let decision = match args.get("workdir").and_then(Value::as_str) {
            Some(w) if w.starts_with('/') => {
                check_command_in(command, std::path::Path::new(w), ctx)
            }
            _ => check_command(command, ctx),
        };
        if let Decision::Deny { message } = decision {
            return Err(ToolError::new(crate::ToolErrorKind::CommandDenied, message));
        }
    }
    if crate::call_scope::scope_ended(ctx) {
        return Err(crate::call_scope::abandoned("terminal"));
    }
    match crate::environments::agent::forward(
        "terminal",
        args,
        ctx,
        Duration::from_secs(timeout as u64 + 30),
    ) {
        Some(result) => crate::redact::redact_forwarded(result, ctx),
        None => Err(ToolError::new(
            crate::ToolErrorKind::BackendError,
            format!("the {} backend has no tool agent", env.backend()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_and_parser_come_from_one_definition() {
        super::super::args::assert_schema_and_parser_agree::<TerminalArgs>(
            &entry().schema,
            json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "Shell command line"},
                    "timeout": {"type": "integer", "minimum": 1, "maximum": 86400, "default": DEFAULT_TIMEOUT, "description": "Seconds before the command and its process group are killed"},
                    "workdir": {"type": "string", "description": "Working directory (default: the session working dir)"},
                    "background": {"type": "boolean", "default": false, "description": "Start in the background and return a process id (not available in scripts)"},
                    "pty": {"type": "boolean", "default": false, "description": "Run under a pseudo-terminal (not available in scripts)"}
                },
                "required": ["command"]
            }),
            json!({"command": "ls -la", "timeout": 30, "workdir": "/tmp"}),
            json!({"command": "ls", "background": "sometimes"}),
        );
    }
}
