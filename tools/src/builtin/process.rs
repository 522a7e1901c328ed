//! `process`: manage background processes started with `terminal(background=true)` — list them,
//! poll new output, wait, write to a PTY process's stdin, kill. Agent only: scripts cannot start
//! background processes, so it is not among the script tools. With a remote backend the
//! processes live under the task's tool agent there, and the call is forwarded to it.

use super::args::{int_in_range, optional_str, required_str};
use crate::environments::local;
use crate::{BuiltinTool, ToolContext, ToolEntry, ToolError};
use serde_json::{json, Map, Value};
use std::time::Duration;

fn entry() -> ToolEntry {
    ToolEntry::new(
        "process",
        "terminal",
        "Manage background processes started with terminal(background=true): action list | poll \
         (new output since the last poll) | log (all buffered output) | wait (until it ends or \
         timeout) | write (send `data` to a pty process's stdin) | kill (its whole process group).",
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
        process,
    )
    .with_emoji("⚙️")
}

inventory::submit! { BuiltinTool(entry) }

fn status(p: &local::BackgroundProcess) -> Value {
    match p.exit_code() {
        Some(c) => json!({"status": "exited", "exit_code": c}),
        None => json!({"status": "running", "exit_code": Value::Null}),
    }
}

fn process(args: &Map<String, Value>, ctx: &ToolContext) -> Result<Value, ToolError> {
    let action = required_str(args, "action")?;
    // With a remote backend, background commands run under the task's tool agent there.
    let wait = if action == "wait" {
        int_in_range(args, "timeout", 30, 0, 3600)?
    } else {
        0
    };
    if let Some(result) = crate::environments::agent::forward(
        "process",
        args,
        ctx,
        Duration::from_secs(wait as u64 + 60),
    ) {
        return result;
    }
    if action == "list" {
        let procs: Vec<Value> = local::list_processes()
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
    let id = optional_str(args, "process_id")?
        .ok_or_else(|| ToolError::invalid_args(format!("action `{action}` needs `process_id`")))?;
    let p = local::get_process(id).map_err(|e| ToolError::new("UnknownProcess", e.to_string()))?;
    let poll_json = |from_start: bool| {
        let r = p.poll(from_start);
        // Background output reaches the model like foreground output: redacted.
        let (output, redactions) = crate::redact::redact_command_output(r.output, ctx);
        let mut v = json!({
            "process_id": p.id,
            "output": output,
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
            let secs = int_in_range(args, "timeout", 30, 0, 3600)?;
            let done = p.wait(Duration::from_secs(secs as u64)).is_some();
            let mut v = poll_json(false);
            if let Some(o) = v.as_object_mut() {
                o.insert("waited_until_exit".into(), Value::Bool(done));
            }
            Ok(v)
        }
        "write" => {
            let data = required_str(args, "data")?;
            p.write_stdin(data.as_bytes())
                .map_err(|e| ToolError::new("WriteError", e))?;
            Ok(json!({"process_id": p.id, "bytes_written": data.len()}))
        }
        "kill" => {
            let code = p.kill();
            let out = poll_json(false);
            local::remove_process(id);
            Ok(
                json!({"process_id": id, "killed": true, "exit_code": code, "output": out["output"]}),
            )
        }
        other => Err(ToolError::invalid_args(format!(
            "unknown action `{other}`; use list, poll, log, wait, write or kill"
        ))),
    }
}
