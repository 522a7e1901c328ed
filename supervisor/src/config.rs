//! `$VIBEOS_HOME/config.yaml`: the settings execute_code reads.
//!
//! Only the keys this crate uses are interpreted; other sections belong to other parts of the
//! product and are left alone. A key with the wrong type is an error naming the key and the
//! file, so a typo never silently becomes a default.

use serde_yaml_ng::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Default `code_execution.timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Default `code_execution.max_tool_calls`.
pub const DEFAULT_MAX_TOOL_CALLS: usize = 50;
/// Default stdout cap in bytes.
pub const DEFAULT_STDOUT_LIMIT: usize = 50 * 1024;
/// Default stderr cap in bytes.
pub const DEFAULT_STDERR_LIMIT: usize = 10 * 1024;
/// Default `code_execution.pool_size`.
pub const DEFAULT_POOL_SIZE: usize = 2;
/// Largest accepted `code_execution.pool_size`.
pub const MAX_POOL_SIZE: usize = 64;

/// Where a script runs and with which interpreter (SPEC §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// The session's working dir and the active virtualenv/conda interpreter.
    #[default]
    Project,
    /// The staging dir and the default interpreter, confined by landlock and seccomp.
    Strict,
}

impl Mode {
    /// Parses a mode name; `None` for unknown names.
    pub fn parse(s: &str) -> Option<Mode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "project" => Some(Mode::Project),
            "strict" => Some(Mode::Strict),
            _ => None,
        }
    }

    /// The mode's name as written in config.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Project => "project",
            Mode::Strict => "strict",
        }
    }

    /// Parses a configured mode; an unknown value means `project` (SPEC §3), with the warning
    /// to log.
    pub fn parse_or_project(s: &str) -> (Mode, Option<String>) {
        match Mode::parse(s) {
            Some(m) => (m, None),
            None => (
                Mode::Project,
                Some(format!(
                    "code_execution.mode {s:?} is not a known mode (project, strict); using project"
                )),
            ),
        }
    }
}

/// The settings of config.yaml that execute_code uses.
#[derive(Debug, Clone)]
pub struct Config {
    /// File the settings came from, if any.
    pub source: Option<PathBuf>,
    /// `code_execution.mode`.
    pub mode: Mode,
    /// `code_execution.timeout`.
    pub timeout: Duration,
    /// `code_execution.max_tool_calls`.
    pub max_tool_calls: usize,
    /// `code_execution.python`: the default interpreter.
    pub python: Option<PathBuf>,
    /// `code_execution.stdout_limit` in bytes.
    pub stdout_limit: usize,
    /// `code_execution.stderr_limit` in bytes.
    pub stderr_limit: usize,
    /// `terminal.env_passthrough`.
    pub env_passthrough: Vec<String>,
    /// `code_execution.pool_size`: pre-started interpreters a long-lived host keeps (0: none).
    /// Only hosts that call [`crate::pool::enable`] use it; the one-shot CLI never does. Those
    /// hosts also fork warm executions from a fork server ([`crate::zygote`]) when it is > 0.
    pub pool_size: usize,
    /// `logging.level`.
    pub log_level: Option<String>,
    /// The whole parsed document, for sections other crates interpret.
    pub document: Value,
    /// Problems that did not stop loading (e.g. an unknown mode), to log once logging is up.
    pub warnings: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            source: None,
            mode: Mode::Project,
            timeout: DEFAULT_TIMEOUT,
            max_tool_calls: DEFAULT_MAX_TOOL_CALLS,
            python: None,
            stdout_limit: DEFAULT_STDOUT_LIMIT,
            stderr_limit: DEFAULT_STDERR_LIMIT,
            env_passthrough: Vec::new(),
            pool_size: DEFAULT_POOL_SIZE,
            log_level: None,
            document: Value::Null,
            warnings: Vec::new(),
        }
    }
}

/// config.yaml could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file exists (or was named) but cannot be read.
    #[error("cannot read config file {path}: {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid YAML.
    #[error("config file {path} is not valid YAML: {message}")]
    Syntax {
        /// The file.
        path: PathBuf,
        /// What the parser said, with the position.
        message: String,
    },
    /// A key holds the wrong type or an impossible value.
    #[error("config file {path}: `{key}` {problem}")]
    BadValue {
        /// The file.
        path: PathBuf,
        /// Dotted key, e.g. `code_execution.timeout`.
        key: String,
        /// What is wrong and what is expected.
        problem: String,
    },
}

/// The vibeos home dir: `$VIBEOS_HOME`, else `~/.vibeos`.
pub fn vibeos_home() -> PathBuf {
    if let Some(h) = std::env::var_os("VIBEOS_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"));
    home.join(".vibeos")
}

/// The config file to read: an explicit path, else `$VIBEOS_CONFIG`, else
/// `$VIBEOS_HOME/config.yaml`. The flag says whether it must exist.
pub fn config_path(explicit: Option<&Path>) -> (PathBuf, bool) {
    if let Some(p) = explicit {
        return (p.to_path_buf(), true);
    }
    if let Some(p) = std::env::var_os("VIBEOS_CONFIG").filter(|p| !p.is_empty()) {
        return (PathBuf::from(p), true);
    }
    (vibeos_home().join("config.yaml"), false)
}

impl Config {
    /// Loads the config: an explicit path must exist; the default one may be absent (defaults).
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        let (path, required) = config_path(explicit);
        match std::fs::read_to_string(&path) {
            Ok(text) => Config::parse(&text, &path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                Ok(Config::default())
            }
            Err(source) => Err(ConfigError::Unreadable { path, source }),
        }
    }

    /// Parses config text read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let doc: Value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Syntax {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?
        };
        let bad = |key: &str, problem: String| ConfigError::BadValue {
            path: path.to_path_buf(),
            key: key.to_string(),
            problem,
        };
        if !matches!(doc, Value::Mapping(_) | Value::Null) {
            return Err(bad("(top level)", "must be a mapping of sections".into()));
        }
        let mut cfg = Config {
            source: Some(path.to_path_buf()),
            ..Config::default()
        };
        let section = |name: &str| -> Result<Option<&Value>, ConfigError> {
            match doc.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(v @ Value::Mapping(_)) => Ok(Some(v)),
                Some(other) => Err(bad(
                    name,
                    format!("must be a mapping, found {}", yaml_type(other)),
                )),
            }
        };
        if let Some(ce) = section("code_execution")? {
            if let Some(v) = present(ce.get("mode")) {
                let s = v.as_str().ok_or_else(|| {
                    bad(
                        "code_execution.mode",
                        format!(
                            "must be a string (project or strict), found {}",
                            yaml_type(v)
                        ),
                    )
                })?;
                let (mode, warning) = Mode::parse_or_project(s);
                cfg.mode = mode;
                cfg.warnings.extend(warning);
            }
            if let Some(v) = present(ce.get("timeout")) {
                let secs = v.as_f64().ok_or_else(|| {
                    bad(
                        "code_execution.timeout",
                        format!("must be a number of seconds, found {}", yaml_type(v)),
                    )
                })?;
                cfg.timeout = positive_seconds(secs).ok_or_else(|| {
                    bad(
                        "code_execution.timeout",
                        format!("must be a positive number of seconds, found {secs}"),
                    )
                })?;
            }
            if let Some(v) = present(ce.get("max_tool_calls")) {
                cfg.max_tool_calls = count(v).ok_or_else(|| {
                    bad(
                        "code_execution.max_tool_calls",
                        format!("must be a whole number ≥ 0, found {}", describe(v)),
                    )
                })?;
            }
            if let Some(v) = present(ce.get("python")) {
                let s = v.as_str().filter(|s| !s.trim().is_empty()).ok_or_else(|| {
                    bad(
                        "code_execution.python",
                        format!(
                            "must be a path to a Python interpreter, found {}",
                            describe(v)
                        ),
                    )
                })?;
                cfg.python = Some(PathBuf::from(s));
            }
            if let Some(v) = present(ce.get("pool_size")) {
                cfg.pool_size = count(v).filter(|n| *n <= MAX_POOL_SIZE).ok_or_else(|| {
                    bad(
                        "code_execution.pool_size",
                        format!(
                            "must be a whole number from 0 (no pool) to {}, found {}",
                            MAX_POOL_SIZE,
                            describe(v)
                        ),
                    )
                })?;
            }
            for (key, slot) in [
                ("stdout_limit", &mut cfg.stdout_limit),
                ("stderr_limit", &mut cfg.stderr_limit),
            ] {
                if let Some(v) = present(ce.get(key)) {
                    *slot = count(v).filter(|n| *n >= 64).ok_or_else(|| {
                        bad(
                            &format!("code_execution.{key}"),
                            format!("must be a number of bytes ≥ 64, found {}", describe(v)),
                        )
                    })?;
                }
            }
        }
        if let Some(t) = section("terminal")? {
            if let Some(v) = present(t.get("env_passthrough")) {
                let list = v.as_sequence().ok_or_else(|| {
                    bad(
                        "terminal.env_passthrough",
                        format!("must be a list of variable names, found {}", yaml_type(v)),
                    )
                })?;
                for (i, item) in list.iter().enumerate() {
                    let name = item.as_str().filter(|s| valid_env_name(s)).ok_or_else(|| {
                        bad(
                            &format!("terminal.env_passthrough[{i}]"),
                            format!(
                                "must be an environment variable name, found {}",
                                describe(item)
                            ),
                        )
                    })?;
                    cfg.env_passthrough.push(name.to_string());
                }
            }
        }
        if let Some(l) = section("logging")? {
            if let Some(v) = present(l.get("level")) {
                let s = v.as_str().ok_or_else(|| {
                    bad(
                        "logging.level",
                        format!("must be a string, found {}", yaml_type(v)),
                    )
                })?;
                cfg.log_level = Some(s.to_string());
            }
        }
        cfg.document = doc;
        Ok(cfg)
    }
}

fn present(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null())
}

fn count(v: &Value) -> Option<usize> {
    v.as_u64().and_then(|n| usize::try_from(n).ok())
}

/// Turns seconds into a duration if positive and finite (capped at a day, beyond which a
/// "timeout" is a mistake).
pub fn positive_seconds(secs: f64) -> Option<Duration> {
    (secs.is_finite() && secs > 0.0 && secs <= 86_400.0).then(|| Duration::from_secs_f64(secs))
}

fn valid_env_name(s: &str) -> bool {
    !s.is_empty() && !s.contains('=') && !s.contains('\0')
}

fn yaml_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

fn describe(v: &Value) -> String {
    match v {
        Value::String(s) => format!("the string {s:?}"),
        Value::Number(n) => format!("{n}"),
        other => yaml_type(other).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/x/config.yaml"))
    }

    #[test]
    fn reads_every_key() {
        let c = parse(
            "code_execution:\n  mode: strict\n  timeout: 12.5\n  max_tool_calls: 3\n  python: /usr/bin/python3\nterminal:\n  env_passthrough: [A_KEY, B]\n",
        )
        .unwrap();
        assert_eq!(c.mode, Mode::Strict);
        assert_eq!(c.timeout, Duration::from_millis(12_500));
        assert_eq!(c.max_tool_calls, 3);
        assert_eq!(c.env_passthrough, vec!["A_KEY", "B"]);
        assert_eq!(c.pool_size, DEFAULT_POOL_SIZE);
        assert_eq!(
            parse("code_execution:\n  pool_size: 0\n")
                .unwrap()
                .pool_size,
            0
        );
        let e = parse("code_execution:\n  pool_size: many\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("code_execution.pool_size"), "{e}");
        assert!(parse("code_execution:\n  pool_size: 1000\n").is_err());
    }

    #[test]
    fn wrong_types_name_the_key_and_file() {
        let e = parse("code_execution:\n  timeout: soon\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/x/config.yaml") && e.contains("code_execution.timeout"),
            "{e}"
        );
        let e = parse("code_execution:\n  max_tool_calls: -1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("code_execution.max_tool_calls"), "{e}");
        let e = parse("terminal:\n  env_passthrough: A\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("terminal.env_passthrough"), "{e}");
        let e = parse("code_execution: [1]\n").unwrap_err().to_string();
        assert!(e.contains("`code_execution`"), "{e}");
        let e = parse("code_execution:\n  timeout: 0\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("positive"), "{e}");
        assert!(parse(": : :\n -").is_err());
    }

    #[test]
    fn unknown_mode_falls_back_to_project() {
        assert_eq!(
            parse("code_execution:\n  mode: sandboxy\n").unwrap().mode,
            Mode::Project
        );
        assert_eq!(parse("").unwrap().mode, Mode::Project);
    }
}
