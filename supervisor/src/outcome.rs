//! How an ended execution becomes its result: status, error line, output with the closing
//! notice (SPEC §5). Local supervision ([`crate::execute`]) and remote supervision
//! ([`crate::remote`]) both end here, so every launch returns the same object; the module sits
//! below both.

use crate::capture::HeadTail;
use crate::request::ExecutionRequest;
use crate::result::{ExecutionResult, Status, INTERRUPT_NOTICE};
use std::time::{Duration, Instant};

/// Formats seconds the way the timeout notice prints them (`300`, `0.5`, `0.0001`): the
/// shortest decimal that reads back as the same value, so a sub-millisecond timeout is never
/// reported as `0s`.
pub fn format_seconds(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        d.as_secs().to_string()
    } else {
        d.as_secs_f64().to_string()
    }
}

/// The notice a timed-out execution ends with.
pub fn timeout_notice(timeout: Duration) -> String {
    format!(
        "Script timed out after {}s and was killed.",
        format_seconds(timeout)
    )
}

/// How an execution ended, as the supervision saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The script (or its remote client) exited.
    Exited,
    /// The timeout fired.
    Timeout,
    /// [`Interrupt::interrupt`] was called.
    Interrupted,
}

/// How an execution ended and what it left: the supervision's findings, local or remote.
pub(crate) struct Ended<'a> {
    pub(crate) ending: Ending,
    pub(crate) exit_code: Option<i32>,
    pub(crate) stdout: &'a HeadTail,
    pub(crate) stderr: &'a HeadTail,
    pub(crate) tool_calls_made: usize,
}

/// The result object of an ended execution. Shared by local and remote supervision, so every
/// launch returns the same object (a remote one then sets `backend`).
pub(crate) fn ended_result(
    ended: Ended<'_>,
    request: &ExecutionRequest,
    started: Instant,
    interpreter: String,
) -> ExecutionResult {
    let (status, error, output) = compose_output(
        ended.ending,
        ended.exit_code,
        ended.stdout,
        ended.stderr,
        request.timeout,
    );
    ExecutionResult {
        status,
        output,
        tool_calls_made: ended.tool_calls_made,
        duration_seconds: started.elapsed().as_secs_f64(),
        error,
        exit_code: ended.exit_code,
        truncated: ended.stdout.truncated() || ended.stderr.truncated(),
        stdout_bytes: ended.stdout.total(),
        stdout_bytes_omitted: ended.stdout.omitted(),
        stderr_bytes: ended.stderr.total(),
        stderr_bytes_omitted: ended.stderr.omitted(),
        mode: request.mode.as_str(),
        redactions: 0,
        interpreter: Some(interpreter),
        backend: None,
    }
}

/// Status, error line and output of an ended execution: the captured stdout, stderr when it
/// failed, and the closing notice.
fn compose_output(
    ending: Ending,
    exit_code: Option<i32>,
    stdout_cap: &HeadTail,
    stderr_cap: &HeadTail,
    timeout: Duration,
) -> (Status, Option<String>, String) {
    let (status, error) = match ending {
        Ending::Timeout => (Status::Timeout, Some(timeout_notice(timeout))),
        Ending::Interrupted => (
            Status::Interrupted,
            Some("execution interrupted — user sent a new message".to_string()),
        ),
        Ending::Exited => match exit_code {
            Some(0) => (Status::Success, None),
            Some(code) => (Status::Error, Some(exit_error(code, stderr_cap))),
            None => (
                Status::Error,
                Some("the script's exit status was lost".into()),
            ),
        },
    };
    let mut output = stdout_cap.render("output");
    if status != Status::Success && stderr_cap.total() > 0 {
        if !output.is_empty() && !output.ends_with('\n') {
            output.push('\n');
        }
        output.push_str("--- stderr ---\n");
        output.push_str(&stderr_cap.render("stderr"));
    }
    let notice = match status {
        Status::Timeout => Some(timeout_notice(timeout)),
        Status::Interrupted => Some(INTERRUPT_NOTICE.to_string()),
        _ => None,
    };
    if let Some(notice) = notice {
        if !output.is_empty() && !output.ends_with('\n') {
            output.push('\n');
        }
        output.push_str(&notice);
    }
    (status, error, output)
}

/// The capture of an output reader, waiting at most `bound` for it to drain (an empty capture
/// if it does not).
pub(crate) async fn finish(
    task: tokio::task::JoinHandle<HeadTail>,
    bound: Duration,
    limit: usize,
) -> HeadTail {
    let abort = task.abort_handle();
    match tokio::time::timeout(bound, task).await {
        Ok(Ok(cap)) => cap,
        _ => {
            abort.abort();
            HeadTail::new(limit)
        }
    }
}

/// The error line of a failed script: its exit code and the last line of stderr (the
/// exception, for a Python traceback).
pub(crate) fn exit_error(code: i32, stderr: &HeadTail) -> String {
    let text = stderr.render("stderr");
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(str::trim);
    let what = if code < 0 {
        let name = nix::sys::signal::Signal::try_from(-code)
            .map(|s| format!(" ({s})"))
            .unwrap_or_default();
        // A SIGKILL nobody on this side sent is most often the kernel's out-of-memory killer.
        let hint = if -code == libc::SIGKILL {
            " — often the out-of-memory killer: check the memory the script uses against \
             its limit (terminal.container_memory in a container, the machine's memory here)"
        } else {
            ""
        };
        format!("the script was killed by signal {}{name}{hint}", -code)
    } else {
        format!("the script exited with code {code}")
    };
    match last {
        Some(line) => format!("{what}: {line}"),
        None => what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_death_names_the_signal_and_a_sigkill_the_likely_cause() {
        let empty = HeadTail::new(64);
        let e = exit_error(-9, &empty);
        assert!(
            e.starts_with(
                "the script was killed by signal 9 (SIGKILL) — often the out-of-memory killer"
            ),
            "{e}"
        );
        assert_eq!(
            exit_error(-15, &empty),
            "the script was killed by signal 15 (SIGTERM)"
        );
        assert_eq!(exit_error(3, &empty), "the script exited with code 3");
    }

    #[test]
    fn formats_timeouts_like_the_spec() {
        assert_eq!(
            timeout_notice(Duration::from_secs(300)),
            "Script timed out after 300s and was killed."
        );
        assert_eq!(format_seconds(Duration::from_millis(1500)), "1.5");
        assert_eq!(format_seconds(Duration::from_secs_f64(0.0001)), "0.0001");
        assert_eq!(format_seconds(Duration::from_secs(300)), "300");
    }
}
