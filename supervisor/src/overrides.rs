//! The per-call overrides of execute_code — `mode`, `timeout`, `max_tool_calls`,
//! `stdout_limit`, `stderr_limit` (SPEC §5: every limit is overridable per call) — checked in
//! one place for every face: the CLI's flags, the Python package's keyword arguments, the MCP
//! server's and the agent path's JSON arguments. Each face only says how its caller spells the
//! names ([`Spelling`]), so a bad value gets the same judgement and the same message everywhere.

use crate::config::{positive_seconds, Config, Mode};
use crate::request::ExecutionRequest;
use serde_json::{Map, Value};
use std::time::Duration;

/// How the caller names an override in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// Command-line flags: `--timeout`.
    Flag,
    /// JSON arguments of a tool call (execute_code over MCP or the registry): ``argument
    /// `timeout` ``, as the registry names a tool's arguments.
    Argument,
    /// Keyword arguments of a Python function: `timeout`, as the package's own argument
    /// errors name them (`timeout must be …`), so one call's errors read alike.
    Keyword,
}

impl Spelling {
    fn name(self, base: &str) -> String {
        match self {
            Spelling::Flag => format!("--{}", base.replace('_', "-")),
            Spelling::Argument => format!("argument `{base}`"),
            Spelling::Keyword => base.to_string(),
        }
    }
}

/// Which override was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverrideKind {
    /// `mode`: neither `project` nor `strict`.
    Mode,
    /// `timeout`: not a positive number of seconds up to a day.
    Timeout,
    /// `timeout`: positive but under a nanosecond, the shortest a timer waits (`1e-320` was a
    /// zero duration: the script was killed at once, "timed out after 0s").
    TimeoutTooShort,
    /// `max_tool_calls`: not a whole number of calls.
    MaxToolCalls,
    /// `stdout_limit`: not a number of bytes in range.
    StdoutLimit,
    /// `stderr_limit`: not a number of bytes in range.
    StderrLimit,
}

/// The output caps a call may ask for: the same range as `code_execution.*_limit`, defined
/// once with the config's checks.
pub use crate::config::{MAX_OUTPUT_LIMIT, MIN_OUTPUT_LIMIT};

impl OverrideKind {
    fn base(self) -> &'static str {
        match self {
            OverrideKind::Mode => "mode",
            OverrideKind::Timeout | OverrideKind::TimeoutTooShort => "timeout",
            OverrideKind::MaxToolCalls => "max_tool_calls",
            OverrideKind::StdoutLimit => "stdout_limit",
            OverrideKind::StderrLimit => "stderr_limit",
        }
    }

    /// What the value must be, as an argument's message says it.
    fn wanted(self) -> String {
        match self {
            OverrideKind::Mode => "project or strict".into(),
            OverrideKind::Timeout => "a positive number of seconds (at most 86400)".into(),
            OverrideKind::TimeoutTooShort => {
                "at least a nanosecond (1e-9 seconds, the shortest a timer waits)".into()
            }
            OverrideKind::MaxToolCalls => "a whole number of calls, 0 or more".into(),
            OverrideKind::StdoutLimit | OverrideKind::StderrLimit => format!(
                "a whole number of bytes from {MIN_OUTPUT_LIMIT} to {MAX_OUTPUT_LIMIT} (64 MiB)"
            ),
        }
    }

    /// What is wrong with the value, as a flag's message says it.
    fn flag_problem(self) -> String {
        match self {
            OverrideKind::Mode => "is not a mode; use project or strict".into(),
            OverrideKind::Timeout => {
                "is not a usable number of seconds (positive, at most 86400)".into()
            }
            OverrideKind::TimeoutTooShort => {
                "is shorter than a nanosecond; give at least 1e-9 seconds (the shortest a timer \
                 waits)"
                    .into()
            }
            OverrideKind::MaxToolCalls => {
                "is not a usable call budget (a whole number, 0 or more)".into()
            }
            OverrideKind::StdoutLimit | OverrideKind::StderrLimit => format!(
                "is not a usable number of bytes (a whole number from {MIN_OUTPUT_LIMIT} to \
                 {MAX_OUTPUT_LIMIT})"
            ),
        }
    }
}

/// An override value that cannot be used. Flags read `--timeout 0 is not a usable number of
/// seconds (…)`, arguments read ``argument `timeout` must be …, got 0``.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverrideError {
    /// Which override.
    pub kind: OverrideKind,
    /// The value given, as the caller wrote it.
    pub value: String,
    /// How the caller names it.
    pub spelling: Spelling,
}

impl std::fmt::Display for OverrideError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self.spelling.name(self.kind.base());
        let value = shown(&self.value);
        match self.spelling {
            Spelling::Flag => write!(f, "{name} {value} {}", self.kind.flag_problem()),
            Spelling::Argument | Spelling::Keyword => {
                write!(f, "{name} must be {}, got {value}", self.kind.wanted())
            }
        }
    }
}

/// The longest value an error quotes whole.
const SHOWN_CHARS: usize = 64;

/// `value` as an error quotes it: a number far out of range in scientific notation (`1e300`
/// printed 301 digits), anything else cut after [`SHOWN_CHARS`] characters.
fn shown(value: &str) -> std::borrow::Cow<'_, str> {
    if value.len() > 24 {
        if let Ok(n) = value.parse::<f64>() {
            return format!("{n:e}").into();
        }
    }
    match value.char_indices().nth(SHOWN_CHARS) {
        Some((cut, _)) => {
            format!("{}… ({} characters)", &value[..cut], value.chars().count()).into()
        }
        None => value.into(),
    }
}

impl std::error::Error for OverrideError {}

/// Overrides one call asked for, checked; `None` keeps the configured value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// Mode of the execution.
    pub mode: Option<Mode>,
    /// Wall-clock limit.
    pub timeout: Option<Duration>,
    /// Tool-call budget.
    pub max_tool_calls: Option<usize>,
    /// Bytes of stdout kept.
    pub stdout_limit: Option<usize>,
    /// Bytes of stderr kept.
    pub stderr_limit: Option<usize>,
}

/// The overrides a caller asked for, as given (unchecked); `None` keeps the configured value.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Requested<'a> {
    /// `mode`.
    pub mode: Option<&'a str>,
    /// `timeout` in seconds.
    pub timeout: Option<f64>,
    /// `max_tool_calls`.
    pub max_tool_calls: Option<u64>,
    /// `stdout_limit` in bytes.
    pub stdout_limit: Option<u64>,
    /// `stderr_limit` in bytes.
    pub stderr_limit: Option<u64>,
}

impl Overrides {
    /// Checks typed values (flags, keyword arguments).
    pub fn check(requested: Requested<'_>, spelling: Spelling) -> Result<Overrides, OverrideError> {
        let Requested {
            mode,
            timeout,
            max_tool_calls,
            stdout_limit,
            stderr_limit,
        } = requested;
        let mode = mode
            .map(|m| {
                Mode::parse(m).ok_or_else(|| OverrideError {
                    kind: OverrideKind::Mode,
                    value: format!("{m:?}"),
                    spelling,
                })
            })
            .transpose()?;
        let timeout = timeout
            .map(|t| {
                positive_seconds(t).ok_or_else(|| OverrideError {
                    // Positive and finite but refused: under a nanosecond.
                    kind: if t > 0.0 && t < crate::config::MIN_TIMEOUT_SECS {
                        OverrideKind::TimeoutTooShort
                    } else {
                        OverrideKind::Timeout
                    },
                    value: t.to_string(),
                    spelling,
                })
            })
            .transpose()?;
        let max_tool_calls = max_tool_calls
            .map(|n| {
                usize::try_from(n).map_err(|_| OverrideError {
                    kind: OverrideKind::MaxToolCalls,
                    value: n.to_string(),
                    spelling,
                })
            })
            .transpose()?;
        let bytes = |value: Option<u64>, kind| {
            value
                .map(|n| {
                    (MIN_OUTPUT_LIMIT..=MAX_OUTPUT_LIMIT)
                        .contains(&n)
                        .then(|| usize::try_from(n).ok())
                        .flatten()
                        .ok_or_else(|| OverrideError {
                            kind,
                            value: n.to_string(),
                            spelling,
                        })
                })
                .transpose()
        };
        Ok(Overrides {
            mode,
            timeout,
            max_tool_calls,
            stdout_limit: bytes(stdout_limit, OverrideKind::StdoutLimit)?,
            stderr_limit: bytes(stderr_limit, OverrideKind::StderrLimit)?,
        })
    }

    /// Checks JSON arguments (`timeout`, `max_tool_calls`, `stdout_limit`, `stderr_limit`, and
    /// `mode` when `allow_mode`); a missing or null value keeps the configured one, a value of
    /// the wrong type is an error naming what was given.
    pub fn from_json(
        args: &Map<String, Value>,
        allow_mode: bool,
    ) -> Result<Overrides, OverrideError> {
        let spelling = Spelling::Argument;
        let present = |key: &str| args.get(key).filter(|v| !v.is_null());
        let mode = match present("mode").filter(|_| allow_mode) {
            None => None,
            Some(Value::String(m)) => Some(m.as_str()),
            Some(other) => {
                return Err(OverrideError {
                    kind: OverrideKind::Mode,
                    value: other.to_string(),
                    spelling,
                })
            }
        };
        let timeout = match present("timeout") {
            None => None,
            Some(v) => Some(v.as_f64().ok_or_else(|| OverrideError {
                kind: OverrideKind::Timeout,
                value: v.to_string(),
                spelling,
            })?),
        };
        let whole = |key: &str, kind| match present(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| OverrideError {
                kind,
                value: v.to_string(),
                spelling,
            }),
        };
        let requested = Requested {
            mode,
            timeout,
            max_tool_calls: whole("max_tool_calls", OverrideKind::MaxToolCalls)?,
            stdout_limit: whole("stdout_limit", OverrideKind::StdoutLimit)?,
            stderr_limit: whole("stderr_limit", OverrideKind::StderrLimit)?,
        };
        Overrides::check(requested, spelling)
    }

    /// Writes the overrides over a request's configured values.
    pub fn apply_to_request(&self, request: &mut ExecutionRequest) {
        self.apply(
            &mut request.mode,
            &mut request.timeout,
            &mut request.max_tool_calls,
            &mut request.stdout_limit,
            &mut request.stderr_limit,
        );
    }

    /// Writes the overrides over the configuration (flags of a one-shot run).
    pub fn apply_to_config(&self, config: &mut Config) {
        self.apply(
            &mut config.mode,
            &mut config.timeout,
            &mut config.max_tool_calls,
            &mut config.stdout_limit,
            &mut config.stderr_limit,
        );
    }

    fn apply(
        &self,
        mode: &mut Mode,
        timeout: &mut Duration,
        max_tool_calls: &mut usize,
        stdout_limit: &mut usize,
        stderr_limit: &mut usize,
    ) {
        if let Some(m) = self.mode {
            *mode = m;
        }
        if let Some(t) = self.timeout {
            *timeout = t;
        }
        if let Some(n) = self.max_tool_calls {
            *max_tool_calls = n;
        }
        if let Some(n) = self.stdout_limit {
            *stdout_limit = n;
        }
        if let Some(n) = self.stderr_limit {
            *stderr_limit = n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn every_face_gets_the_same_verdict_in_its_own_spelling() {
        let timeout = |t| Requested {
            timeout: Some(t),
            ..Requested::default()
        };
        let flag = Overrides::check(timeout(0.0), Spelling::Flag);
        assert_eq!(
            flag.err().map(|e| e.to_string()).unwrap_or_default(),
            "--timeout 0 is not a usable number of seconds (positive, at most 86400)"
        );
        let arg = Overrides::from_json(&args(json!({"timeout": 0})), false);
        assert_eq!(
            arg.err().map(|e| e.to_string()).unwrap_or_default(),
            "argument `timeout` must be a positive number of seconds (at most 86400), got 0"
        );
        let loose = Requested {
            mode: Some("loose"),
            ..Requested::default()
        };
        let mode = Overrides::check(loose, Spelling::Flag);
        assert_eq!(mode.err().map(|e| e.kind), Some(OverrideKind::Mode));
        let budget = Overrides::from_json(&args(json!({"max_tool_calls": -1})), false);
        assert_eq!(
            budget.err().map(|e| e.kind),
            Some(OverrideKind::MaxToolCalls)
        );
        let wrong_type = Overrides::from_json(&args(json!({"timeout": "soon"})), false);
        assert_eq!(
            wrong_type.err().map(|e| e.kind),
            Some(OverrideKind::Timeout)
        );
        for t in [f64::NAN, f64::INFINITY, -1.0, 86_400.5] {
            assert!(Overrides::check(timeout(t), Spelling::Argument).is_err());
        }
        let small = Requested {
            stdout_limit: Some(63),
            ..Requested::default()
        };
        assert_eq!(
            Overrides::check(small, Spelling::Flag)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default(),
            "--stdout-limit 63 is not a usable number of bytes (a whole number from 64 to 67108864)"
        );
        for bad in [
            json!(-1),
            json!(1.5),
            json!("big"),
            json!(MAX_OUTPUT_LIMIT + 1),
        ] {
            let e = Overrides::from_json(&args(json!({ "stderr_limit": bad })), false);
            assert_eq!(e.err().map(|e| e.kind), Some(OverrideKind::StderrLimit));
        }
    }

    #[test]
    fn a_timeout_under_a_nanosecond_is_refused_in_every_spelling() {
        // 1e-320 became a zero duration: the script was killed at once, "timed out after 0s".
        let timeout = |t| Requested {
            timeout: Some(t),
            ..Requested::default()
        };
        let message = |t, spelling| {
            Overrides::check(timeout(t), spelling)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert_eq!(
            message(1e-320, Spelling::Flag),
            "--timeout 1e-320 is shorter than a nanosecond; give at least 1e-9 seconds (the \
             shortest a timer waits)"
        );
        assert_eq!(
            message(5e-10, Spelling::Keyword),
            "timeout must be at least a nanosecond (1e-9 seconds, the shortest a timer waits), \
             got 0.0000000005"
        );
        let json = Overrides::from_json(&args(json!({"timeout": 1e-320})), false);
        assert_eq!(
            json.err().map(|e| e.kind),
            Some(OverrideKind::TimeoutTooShort)
        );
        // A nanosecond is the shortest, and is kept as given.
        let shortest = Overrides::check(timeout(1e-9), Spelling::Flag).unwrap_or_default();
        assert_eq!(shortest.timeout, Some(Duration::from_nanos(1)));
        // The Python package's spelling names the keyword as its own checks do.
        assert_eq!(
            message(-1.0, Spelling::Keyword),
            "timeout must be a positive number of seconds (at most 86400), got -1"
        );
    }

    #[test]
    fn good_values_override_and_absent_ones_keep_the_configuration() {
        let o = Overrides::from_json(
            &args(
                json!({"timeout": 1.5, "max_tool_calls": 0, "mode": "strict", "stdout_limit": 64}),
            ),
            true,
        )
        .unwrap_or_default();
        let mut config = Config::default();
        o.apply_to_config(&mut config);
        assert_eq!(
            (
                config.mode,
                config.timeout,
                config.max_tool_calls,
                config.stdout_limit,
                config.stderr_limit
            ),
            (
                Mode::Strict,
                Duration::from_millis(1500),
                0,
                64,
                Config::default().stderr_limit
            )
        );
        let none = Overrides::from_json(&args(json!({"timeout": null, "mode": "strict"})), false)
            .unwrap_or_default();
        assert_eq!(
            none,
            Overrides::default(),
            "mode is not taken where not allowed"
        );
    }

    #[test]
    fn an_enormous_value_is_quoted_short() {
        let e = Overrides::check(
            Requested {
                timeout: Some(1e300),
                ..Requested::default()
            },
            Spelling::Argument,
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(e.ends_with("got 1e300"), "{e}");
        let long = serde_json::json!({"timeout": "x".repeat(500)});
        let e = Overrides::from_json(long.as_object().unwrap(), false)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.len() < 200 && e.contains("(502 characters)"), "{e}");
    }
}
