//! `process`: manage background processes started with `terminal(background=true)` — list them,
//! poll new output, wait, write to a PTY process's stdin, kill. Agent only: scripts cannot start
//! background processes, so it is not among the script tools. With a remote backend the
//! processes live under the task's tool agent there, and the call is forwarded to it. Either
//! way a call sees only its own task's processes (locally one process serves every task and
//! every MCP connection: [`background`] keeps them apart).

use super::args::{in_range, parse, schema_for};
use crate::environments::background;
use crate::{BuiltinTool, ToolContext, ToolEntry, ToolError};
use serde_json::{json, Map, Value};
use std::time::Duration;

/// The arguments of `process`: its schema and its parser.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ProcessArgs {
    action: Action,
    /// Id returned by terminal(background=true)
    process_id: Option<String>,
    /// Seconds to wait (action=wait)
    #[serde(default = "default_wait")]
    #[schemars(range(min = 0, max = 3600))]
    timeout: i64,
    /// Text to send (action=write)
    data: Option<String>,
}

// What to do. (No doc comment: it would become the schema's description of `action`, which
// the tool has never had.)
#[derive(serde::Deserialize, schemars::JsonSchema, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum Action {
    List,
    Poll,
    Log,
    Wait,
    Write,
    Kill,
}

fn default_wait() -> i64 {
    30
}

fn entry() -> ToolEntry {
    ToolEntry::new(
        "process",
        "terminal",
        "Manage background processes started with terminal(background=true): action list | poll \
         (new output since the last poll) | log (all buffered output) | wait (until it ends or \
         timeout) | write (send `data` to a pty process's stdin) | kill (its whole process group).",
        schema_for::<ProcessArgs>(),
        process,
    )
    .with_emoji("⚙️")
}

inventory::submit! { BuiltinTool(entry) }

fn status(p: &background::BackgroundProcess) -> Value {
    match p.exit_code() {
        Some(c) => json!({"status": "exited", "exit_code": c}),
        None => json!({"status": "running", "exit_code": Value::Null}),
    }
}

fn process(args: &Map<String, Value>, ctx: &ToolContext) -> Result<Value, ToolError> {
    let a: ProcessArgs = parse(args)?;
    let action = match a.action {
        Action::List => "list",
        Action::Poll => "poll",
        Action::Log => "log",
        Action::Wait => "wait",
        Action::Write => "write",
        Action::Kill => "kill",
    };
    // With a remote backend, background commands run under the task's tool agent there.
    let wait = if action == "wait" {
        in_range("timeout", a.timeout, 0, 3600)?
    } else {
        0
    };
    if let (Action::Write, Some(data)) = (a.action, a.data.as_deref()) {
        check_what_is_written(data, ctx)?;
        // And what the shell there will run once this write is typed after the earlier ones.
        if let Some(id) = a.process_id.as_deref() {
            let task = ctx.task_id.as_deref();
            let typed = super::typed_line::text_to_judge(task, id, data);
            if typed != data {
                check_what_is_written(&typed, ctx)?;
            }
            super::typed_line::record(task, id, data);
        }
    }
    if let Some(result) = crate::environments::agent::forward(
        "process",
        args,
        ctx,
        Duration::from_secs(wait as u64 + 60),
    ) {
        return crate::redact::redact_forwarded(result, ctx);
    }
    if action == "list" {
        let procs: Vec<Value> = background::list_processes(ctx.task_id.as_deref())
            .iter()
            .map(|p| {
                let mut v = json!({
                    "process_id": p.id,
                    "command": p.command,
                    "cwd": p.cwd,
                    "pid": p.pid,
                    "pty": p.pty,
                    "uptime_seconds": p.started.elapsed().as_secs(),
                });
                if let (Some(o), Value::Object(s)) = (v.as_object_mut(), status(p)) {
                    o.extend(s);
                }
                v
            })
            .collect();
        return Ok(json!({"processes": procs}));
    }
    let id = a
        .process_id
        .as_deref()
        .ok_or_else(|| ToolError::invalid_args(format!("action `{action}` needs `process_id`")))?;
    let p = background::get_process(ctx.task_id.as_deref(), id)
        .map_err(|e| ToolError::new(crate::ToolErrorKind::UnknownProcess, e.to_string()))?;
    let poll_json = |from_start: bool| {
        let r = p.poll(from_start);
        // Background output reaches the model like foreground output: cut to the same 50 KB
        // (its first 40% and last 60%; a poll handed the model the whole 1 MiB buffer), then
        // redacted.
        let mut kept = crate::capture::HeadTail::new(super::terminal::OUTPUT_CAP);
        kept.push(r.output.as_bytes());
        let truncated = kept.truncated();
        let output = if truncated {
            kept.render("output")
        } else {
            r.output
        };
        let (output, redactions) = crate::redact::redact_command_output(output, ctx);
        let mut v = json!({
            "process_id": p.id,
            "output": output,
            "truncated": truncated,
            "redactions": redactions,
            "lost_bytes": r.lost_bytes,
            "total_bytes": r.total_bytes,
        });
        if let (Some(o), Value::Object(s)) = (v.as_object_mut(), status(&p)) {
            o.extend(s);
        }
        v
    };
    match action {
        "poll" => Ok(poll_json(false)),
        "log" => Ok(poll_json(true)),
        "wait" => {
            let secs = in_range("timeout", a.timeout, 0, 3600)?;
            let done = p.wait(Duration::from_secs(secs as u64)).is_some();
            let mut v = poll_json(false);
            if let Some(o) = v.as_object_mut() {
                o.insert("waited_until_exit".into(), Value::Bool(done));
            }
            Ok(v)
        }
        "write" => {
            let data = a
                .data
                .as_deref()
                .ok_or_else(|| ToolError::invalid_args("missing required argument `data`"))?;
            p.write_stdin(data.as_bytes())
                .map_err(|e| ToolError::new(crate::ToolErrorKind::WriteError, e))?;
            Ok(json!({"process_id": p.id, "bytes_written": data.len()}))
        }
        "kill" => {
            // One that had already exited is reported as such, with its own exit code: "killed"
            // with exit code 0 told the caller a signal ended a process that had finished.
            let already = p.exit_code();
            let code = p.kill();
            let out = poll_json(false);
            background::remove_process(id);
            let mut v = json!({
                "process_id": id,
                "killed": already.is_none(),
                "exit_code": code,
                "output": out["output"],
            });
            if let (Some(c), Some(o)) = (already, v.as_object_mut()) {
                o.insert("already_exited".into(), Value::Bool(true));
                o.insert(
                    "note".into(),
                    Value::String(format!(
                        "{id} had already exited (exit code {c}); nothing was killed"
                    )),
                );
            }
            Ok(v)
        }
        other => Err(ToolError::invalid_args(format!(
            "unknown action `{other}`; use list, poll, log, wait, write or kill"
        ))),
    }
}

/// Text written to a background process's stdin is, for a shell there (`bash` started with
/// `background=true`), a command line like terminal's: it goes through the same approval
/// (SPEC §8), or writing `rm -rf …` into such a shell would run what terminal refuses. Skipped
/// where terminal skips it (an isolated backend with `approvals.skip_in_isolated_backends`).
fn check_what_is_written(data: &str, ctx: &ToolContext) -> Result<(), ToolError> {
    if let Some(env) = crate::environments::remote_for(ctx)? {
        if super::terminal::approval_skipped_in(env.as_ref()) {
            return Ok(());
        }
    }
    match crate::approval::check_command(data, ctx) {
        crate::approval::Decision::Deny { message } => {
            Err(ToolError::new(crate::ToolErrorKind::CommandDenied, message))
        }
        crate::approval::Decision::Allow { .. } => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_and_parser_come_from_one_definition() {
        super::super::args::assert_schema_and_parser_agree::<ProcessArgs>(
            &entry().schema,
            json!({
                "type": "object",
                "properties": {
                    "action": {"type": "string", "enum": ["list", "poll", "log", "wait", "write", "kill"]},
                    "process_id": {"type": "string", "description": "Id returned by terminal(background=true)"},
                    "timeout": {"type": "integer", "minimum": 0, "maximum": 3600, "default": 30, "description": "Seconds to wait (action=wait)"},
                    "data": {"type": "string", "description": "Text to send (action=write)"}
                },
                "required": ["action"]
            }),
            json!({"action": "wait", "process_id": "proc_1", "timeout": 10}),
            json!({"action": "explode"}),
        );
    }
}
