//! The result object of one execution (SPEC §10).

use serde::Serialize;

/// How an execution ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The script exited with code 0.
    Success,
    /// The script failed, or could not be started.
    Error,
    /// The script ran past its timeout and was killed.
    Timeout,
    /// A new user message (API call or SIGINT) stopped the script.
    Interrupted,
}

impl Status {
    /// The status as the result object spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Success => "success",
            Status::Error => "error",
            Status::Timeout => "timeout",
            Status::Interrupted => "interrupted",
        }
    }

    /// Exit code of `vibeos-exec run` without `--json` for this status.
    pub fn exit_code(self) -> i32 {
        match self {
            Status::Success => 0,
            Status::Error => 1,
            Status::Timeout => 124,
            Status::Interrupted => 130,
        }
    }
}

/// What one execute_code call returns.
#[derive(Debug, Clone, Serialize)]
pub struct ExecutionResult {
    /// How it ended.
    pub status: Status,
    /// What the script printed (capped), plus stderr when it failed and the closing notice.
    pub output: String,
    /// Tool calls dispatched (refused ones are not counted).
    pub tool_calls_made: usize,
    /// Wall time of the execution.
    pub duration_seconds: f64,
    /// What went wrong, when not success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The script's exit code; negative for death by signal, null if it never ran.
    pub exit_code: Option<i32>,
    /// Whether stdout or stderr was cut.
    pub truncated: bool,
    /// Bytes the script wrote to stdout.
    pub stdout_bytes: u64,
    /// Stdout bytes left out of `output`.
    pub stdout_bytes_omitted: u64,
    /// Bytes the script wrote to stderr.
    pub stderr_bytes: u64,
    /// Stderr bytes left out.
    pub stderr_bytes_omitted: u64,
    /// Mode the script ran in; left out (empty) by a usage error that names no usable mode.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub mode: &'static str,
    /// Secrets replaced by a marker in `output` and `error` (`security.redact_output`).
    pub redactions: usize,
    /// Interpreter that ran it, when one was chosen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interpreter: Option<String>,
    /// The backend it ran in, when not local (`docker`, `ssh`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
}

/// The notice an interrupted execution's output ends with (SPEC §5).
pub const INTERRUPT_NOTICE: &str = "[execution interrupted — user sent a new message]";

impl ExecutionResult {
    /// A result for an execution that could not start.
    pub fn failed_to_start(mode: &'static str, error: String, duration_seconds: f64) -> Self {
        ExecutionResult {
            status: Status::Error,
            output: String::new(),
            tool_calls_made: 0,
            duration_seconds,
            error: Some(error),
            exit_code: None,
            truncated: false,
            stdout_bytes: 0,
            stdout_bytes_omitted: 0,
            stderr_bytes: 0,
            stderr_bytes_omitted: 0,
            mode,
            redactions: 0,
            interpreter: None,
            backend: None,
        }
    }

    /// The result of an execution interrupted before its script started (SIGINT while the
    /// script was still being read): status `interrupted`, nothing ran, and the output is the
    /// interrupt notice every interrupted execution ends with (SPEC §5).
    pub fn interrupted_before_start(mode: &'static str, error: String) -> Self {
        ExecutionResult {
            status: Status::Interrupted,
            output: INTERRUPT_NOTICE.to_string(),
            ..ExecutionResult::failed_to_start(mode, error, 0.0)
        }
    }

    /// The result as a JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_else(|e| {
            serde_json::json!({"status": "error", "error": format!("result could not be serialised: {e}")})
        })
    }
}
