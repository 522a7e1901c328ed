//! The whole-script guard (SPEC §8): where approvals are interactive, an execute_code script
//! whose source matches a dangerous pattern is asked about before it runs.
//!
//! A project-mode script can run `subprocess.run("rm -rf …")` or `os.system(...)` without ever
//! calling `terminal`, so the per-command check never sees it. Checking the source first closes
//! the obvious path where someone can be asked. Headless runs (no host callback, no TTY) keep
//! today's policy — the script runs, each `terminal` command is still checked — because denying
//! every script that merely mentions `rm -r` would break CI for no gain: a static check is
//! easily evaded (string building, encoding, a second file). docs/strict-mode.md lists the
//! limits; strict mode is the boundary.

use crate::request::ExecutionRequest;
use vibeos_tools::approval::{approvals_interactive, check_script, Decision};

/// Why the script must not run, when the guard (or the person or host it asked) refuses.
pub async fn refusal(request: &ExecutionRequest) -> Option<String> {
    // Headless (the usual case) the guard allows at once: answer here rather than start a
    // blocking-pool thread for it (a thread costs a one-shot `run` about 0.2 ms).
    if !approvals_interactive(request.task_id.as_deref()) {
        return None;
    }
    let source = request.code.clone();
    let task_id = request.task_id.clone();
    // Asking may wait for a person (up to approvals.timeout): off the async workers.
    let decision = tokio::task::spawn_blocking(move || check_script(&source, task_id.as_deref()))
        .await
        .unwrap_or_else(|e| Decision::Deny {
            message: format!("the script approval check failed: {e}"),
        });
    match decision {
        Decision::Allow { .. } => None,
        Decision::Deny { message } => Some(format!(
            "The script was not run: {message} (the whole script is checked before it runs \
             when approvals are interactive)"
        )),
    }
}
