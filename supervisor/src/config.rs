//! `$VIBEOS_HOME/config.yaml`: the settings execute_code reads.
//!
//! The file is parsed once, into the typed [`ConfigFile`] of the tools crate (which rejects
//! unknown keys and wrong types, naming the key path and the file); this module checks the
//! values of the keys execute_code uses and applies the defaults. Other parts read their own
//! sections from [`Config::file`], the same parsed document.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
pub use vibeos_tools::config_file::{ConfigFile, ConfigFileError};

/// Smallest `code_execution.stdout_limit` / `stderr_limit`, and of the flags and call
/// arguments that override them.
pub const MIN_OUTPUT_LIMIT: u64 = 64;
/// Largest output cap, from the config file, a flag or a call: the kept head and tail are held
/// in the supervisor's memory, and no setting may make that unbounded.
pub const MAX_OUTPUT_LIMIT: u64 = 64 * 1024 * 1024;

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
    /// The embedding host's own interpreter (the Python package sets its `sys.executable`):
    /// the default when `code_execution.python` is unset. Never read from the file; kept apart
    /// from `python` so logs name where the interpreter came from.
    pub host_python: Option<PathBuf>,
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
    /// The whole parsed file, for the sections other modules and crates interpret.
    pub file: Arc<ConfigFile>,
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
            host_python: None,
            stdout_limit: DEFAULT_STDOUT_LIMIT,
            stderr_limit: DEFAULT_STDERR_LIMIT,
            env_passthrough: Vec::new(),
            pool_size: DEFAULT_POOL_SIZE,
            log_level: None,
            file: Arc::new(ConfigFile::default()),
            warnings: Vec::new(),
        }
    }
}

/// config.yaml could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read, is too large, is not valid YAML, or has an unknown key or a
    /// value of the wrong type.
    #[error(transparent)]
    File(#[from] ConfigFileError),
    /// A key holds an impossible value.
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
    vibeos_tools::settings::vibeos_home()
}

/// The config file to read: an explicit path, else the pinned one, else `$VIBEOS_CONFIG`, else
/// `$VIBEOS_HOME/config.yaml`. The flag says whether it must exist. One resolver for the whole
/// product: [`vibeos_tools::settings::resolve_config_path`].
pub fn config_path(explicit: Option<&Path>) -> (PathBuf, bool) {
    vibeos_tools::settings::resolve_config_path(explicit)
}

impl Config {
    /// Loads the config: an explicit path must exist; the default one may be absent (defaults).
    /// The file is parsed once per version on disk (the tools crate's cache), so the
    /// supervisor and the tools share one parse.
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        let (path, required) = config_path(explicit);
        let file = vibeos_tools::settings::load_at(&path, required)?;
        let exists = path.exists();
        let mut cfg = Config::from_file(file, &path)?;
        if !exists {
            cfg.source = None;
        }
        Ok(cfg)
    }

    /// Parses config text read from `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        Config::from_file(Arc::new(ConfigFile::parse(text, path)?), path)
    }

    /// Checks the values execute_code uses in a parsed file read from `path`.
    pub fn from_file(file: Arc<ConfigFile>, path: &Path) -> Result<Config, ConfigError> {
        let bad = |key: &str, problem: String| ConfigError::BadValue {
            path: path.to_path_buf(),
            key: key.to_string(),
            problem,
        };
        let mut cfg = Config {
            source: Some(path.to_path_buf()),
            ..Config::default()
        };
        if let Some(ce) = &file.code_execution {
            if let Some(s) = &ce.mode {
                let (mode, warning) = Mode::parse_or_project(s);
                cfg.mode = mode;
                cfg.warnings.extend(warning);
            }
            if let Some(secs) = ce.timeout {
                cfg.timeout = positive_seconds(secs).ok_or_else(|| {
                    bad(
                        "code_execution.timeout",
                        // The same range, in the same words, as the `--timeout` flag's message.
                        format!(
                            "must be a number of seconds (positive, at most {MAX_TIMEOUT_SECS}), found {secs}"
                        ),
                    )
                })?;
            }
            if let Some(n) = ce.max_tool_calls {
                cfg.max_tool_calls = usize::try_from(n).map_err(|_| {
                    bad(
                        "code_execution.max_tool_calls",
                        format!("must be a whole number ≥ 0, found {n}"),
                    )
                })?;
            }
            if let Some(s) = &ce.python {
                if s.trim().is_empty() {
                    return Err(bad(
                        "code_execution.python",
                        "must be a path to a Python interpreter, found an empty string".into(),
                    ));
                }
                cfg.python = Some(PathBuf::from(s));
            }
            if let Some(n) = ce.pool_size {
                cfg.pool_size = usize::try_from(n)
                    .ok()
                    .filter(|n| *n <= MAX_POOL_SIZE)
                    .ok_or_else(|| {
                        bad(
                            "code_execution.pool_size",
                            format!(
                                "must be a whole number from 0 (no pool) to {}, found {n}",
                                MAX_POOL_SIZE,
                            ),
                        )
                    })?;
            }
            // The range of the `--stdout-limit` flags and of a call's arguments: the kept head
            // and tail are held in the supervisor's memory, so no face may make it unbounded.
            for (key, value, slot) in [
                ("stdout_limit", ce.stdout_limit, &mut cfg.stdout_limit),
                ("stderr_limit", ce.stderr_limit, &mut cfg.stderr_limit),
            ] {
                if let Some(n) = value {
                    *slot = (MIN_OUTPUT_LIMIT..=MAX_OUTPUT_LIMIT)
                        .contains(&n)
                        .then(|| usize::try_from(n).ok())
                        .flatten()
                        .ok_or_else(|| {
                            bad(
                                &format!("code_execution.{key}"),
                                format!(
                                    "must be a whole number of bytes from {MIN_OUTPUT_LIMIT} to \
                                     {MAX_OUTPUT_LIMIT} (64 MiB), found {n}"
                                ),
                            )
                        })?;
                }
            }
        }
        if let Some(list) = file
            .terminal
            .as_ref()
            .and_then(|t| t.env_passthrough.as_ref())
        {
            for (i, name) in list.iter().enumerate() {
                if !valid_env_name(name) {
                    return Err(bad(
                        &format!("terminal.env_passthrough[{i}]"),
                        format!("must be an environment variable name, found {name:?}"),
                    ));
                }
                // Loaded, such an entry matched nothing, silently: `AWS_*` kept no AWS_ variable.
                if name.contains(['*', '?', '[']) || name.trim() != name {
                    return Err(bad(
                        &format!("terminal.env_passthrough[{i}]"),
                        format!(
                            "takes exact variable names, not patterns or names with blanks \
                             around them; found {name:?}: list each variable by its name"
                        ),
                    ));
                }
                cfg.env_passthrough.push(name.clone());
            }
        }
        // `approvals:` is read by the approval check at every command (a later edit falls back
        // with a warning there); a file that is wrong from the start is refused like the rest.
        if let Some(approvals) = &file.approvals {
            if let Some(Err(e)) = approvals
                .mode
                .as_ref()
                .map(vibeos_tools::approval_policy::ApprovalMode::from_config)
            {
                return Err(bad("approvals.mode", e));
            }
            if let Some(Err(e)) = approvals
                .timeout
                .map(vibeos_tools::approval_policy::approval_timeout)
            {
                return Err(bad("approvals.timeout", e));
            }
        }
        // The plugin host is a server named `plugins` (its `tools list` row, its log lines): an
        // entry of that name gave two rows named `plugins`, and its log lines said "the plugin
        // host".
        if let Some(servers) = &file.mcp_servers {
            let host = vibeos_tools::mcp_client::PLUGIN_HOST;
            if servers.contains_key(host) {
                return Err(bad(
                    &format!("mcp_servers.{host}"),
                    format!(
                        "is a name reserved for the plugin host (configured under `{host}:`); \
                         choose another name for this MCP server"
                    ),
                ));
            }
        }
        // The plugin host's timeouts, under their own names: checked later, when the host's
        // spec was built, they were logged as `mcp_servers.plugins.timeout` and the host was
        // skipped while the run went on (exit 0).
        if let Some(plugins) = &file.plugins {
            for (key, value) in [
                ("plugins.timeout", plugins.timeout),
                ("plugins.connect_timeout", plugins.connect_timeout),
            ] {
                if let Some(secs) = value {
                    if positive_seconds(secs).is_none() {
                        return Err(bad(
                            key,
                            format!(
                                "must be a number of seconds (positive, at most \
                                 {MAX_TIMEOUT_SECS}), found {secs}"
                            ),
                        ));
                    }
                }
            }
        }
        if let Some(level) = file.logging.as_ref().and_then(|l| l.level.clone()) {
            // Checked here, where the file and key are known: the logger would reject it too,
            // but naming neither.
            crate::logging::validate_level(&level).map_err(|e| {
                bad(
                    "logging.level",
                    format!(
                        "must be error, warn, info, debug, trace or off, found {:?} ({})",
                        e.level, e.reason
                    ),
                )
            })?;
            cfg.log_level = Some(level);
        }
        cfg.file = file;
        Ok(cfg)
    }
}

/// Largest timeout accepted, in seconds: a day, beyond which a "timeout" is a mistake.
pub const MAX_TIMEOUT_SECS: u32 = 86_400;

/// Shortest timeout accepted, in seconds: a nanosecond, what a `Duration` (and a timer) can
/// hold. Below it (`1e-320`) the duration was zero: the script was killed at once and the run
/// reported "timed out after 0s".
pub const MIN_TIMEOUT_SECS: f64 = 1e-9;

/// Turns seconds into a duration if finite and from [`MIN_TIMEOUT_SECS`] to
/// [`MAX_TIMEOUT_SECS`].
pub fn positive_seconds(secs: f64) -> Option<Duration> {
    (secs.is_finite() && (MIN_TIMEOUT_SECS..=f64::from(MAX_TIMEOUT_SECS)).contains(&secs))
        .then(|| Duration::from_secs_f64(secs))
}

fn valid_env_name(s: &str) -> bool {
    !s.is_empty() && !s.contains('=') && !s.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/x/config.yaml"))
    }

    #[test]
    fn wrong_approval_settings_are_refused_naming_the_key() {
        for (text, key) in [
            ("approvals:\n  mode: smrt\n", "approvals.mode"),
            ("approvals:\n  mode: ''\n", "approvals.mode"),
            ("approvals:\n  mode: true\n", "approvals.mode"),
            ("approvals:\n  timeout: 0\n", "approvals.timeout"),
            ("approvals:\n  timeout: -1\n", "approvals.timeout"),
            ("approvals:\n  timeout: 1e9\n", "approvals.timeout"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
        for ok in [
            "approvals:\n  mode: Smart\n  timeout: 0.5\n",
            "approvals:\n  mode: off\n",
            "approvals:\n  mode: false\n",
        ] {
            assert!(parse(ok).is_ok(), "{ok}");
        }
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
        assert!(e.contains("/x/config.yaml: code_execution: "), "{e}");
        let e = parse("code_execution:\n  timeout: 0\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("positive"), "{e}");
        // Above the cap, the message says what the cap is.
        let e = parse("code_execution:\n  timeout: 100000\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`code_execution.timeout`")
                && e.contains("(positive, at most 86400), found 100000"),
            "{e}"
        );
        assert!(parse(": : :\n -").is_err());
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_errors_naming_the_path() {
        let e = parse("code_execution:\n  strict:\n    disk_mb: x\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/x/config.yaml: code_execution.strict.disk_mb: ") && e.contains("u64"),
            "{e}"
        );
        let e = parse("code_execution:\n  max_tool_cals: 3\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("code_execution") && e.contains("unknown field `max_tool_cals`"),
            "{e}"
        );
        let e = parse("terminal:\n  env_passthrough: ['A=B']\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("terminal.env_passthrough[0]"), "{e}");
        for bad in ["'AWS_*'", "'*'", "' FOO '", "'X?'"] {
            let e = parse(&format!("terminal:\n  env_passthrough: [OK, {bad}]\n"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("terminal.env_passthrough[1]") && e.contains("exact variable names"),
                "{e}"
            );
        }
    }

    #[test]
    fn every_documented_key_is_accepted() {
        // Every key SPEC.md, README and docs/ name, in one file: a valid config keeps loading.
        let c = parse(concat!(
            "code_execution:\n  mode: strict\n  timeout: 300\n  max_tool_calls: 50\n",
            "  python: /usr/bin/python3\n  pool_size: 2\n  stdout_limit: 51200\n",
            "  stderr_limit: 10240\n",
            "  strict:\n    uid: 60000\n    max_processes: 64\n    memory_mb: 512\n",
            "    file_size_mb: 64\n    disk_mb: 256\n    seccomp_policy: /p/s.json\n",
            "    landlock_policy: /p/l.json\n    read_roots: [/data]\n    write_roots: [/out]\n",
            "    terminal: false\n",
            "terminal:\n  backend: local\n  cwd: /work\n  lifetime_seconds: 300\n",
            "  python: python3\n  env_passthrough: [MY_KEY]\n  docker_image: python:3.12\n",
            "  docker_volumes: ['/a:/b:ro']\n  docker_mount_cwd_to_workspace: true\n",
            "  docker_network: none\n  docker_binary: podman\n  container_cpu: 1\n",
            "  container_memory: 512\n  container_disk: 1024\n  container_pids: 256\n",
            "  container_persistent: false\n  ssh_host: h\n  ssh_user: u\n  ssh_port: 22\n",
            "  ssh_key: /k\n  ssh_known_hosts: accept-new\n  shell_session: true\n",
            "  agent_binary: /bin/a\n  singularity_image: docker://python:3.12\n",
            "  modal_image: python:3.12\n  daytona_image: python:3.12\n",
            "logging:\n  level: debug\n",
            "approvals:\n  mode: smart\n  timeout: 60\n  deny: [fork_bomb]\n",
            "  smart_command: /bin/judge\n  skip_in_isolated_backends: true\n",
            "command_allowlist: [git_clean]\ncommand_denylist: [kill_all]\n",
            "web:\n  search_backend: searxng\n  searxng_url: http://127.0.0.1:8888\n",
            "  extract_backend: http\n  timeout: 20\n",
            "security:\n  redact_output: true\n",
            "mcp_servers:\n  github:\n    command: gh-mcp\n    args: [x]\n    env: {A: b}\n",
            "    cwd: /tmp\n    startup: eager\n    timeout: 30\n    connect_timeout: 10\n",
            "    script_callable: [search]\n    enabled: true\n",
            "  docs:\n    url: http://127.0.0.1:1/mcp\n    headers: {Authorization: x}\n",
            "plugins:\n  enabled: true\n  startup: lazy\n  python: /usr/bin/python3\n",
            "  dirs: [/p]\n  timeout: 60\n  connect_timeout: 30\n  entry_points: false\n",
        ))
        .unwrap();
        assert_eq!(c.mode, Mode::Strict);
        assert_eq!(c.log_level.as_deref(), Some("debug"));
        assert_eq!(c.pool_size, 2);
    }

    #[test]
    fn output_limits_take_the_range_of_the_flags() {
        // `stdout_limit: 10000000000` let a script's output grow the supervisor past 1.8 GB.
        for key in ["stdout_limit", "stderr_limit"] {
            for bad in ["63", "67108865", "10000000000", "0"] {
                let e = parse(&format!("code_execution:\n  {key}: {bad}\n"))
                    .unwrap_err()
                    .to_string();
                assert!(
                    e.starts_with("config file /x/config.yaml: ")
                        && e.contains(&format!("`code_execution.{key}`"))
                        && e.contains("from 64 to 67108864")
                        && e.contains(&format!("found {bad}")),
                    "{e}"
                );
            }
        }
        let c = parse("code_execution:\n  stdout_limit: 67108864\n  stderr_limit: 64\n").unwrap();
        assert_eq!(c.stdout_limit as u64, MAX_OUTPUT_LIMIT);
        assert_eq!(c.stderr_limit as u64, MIN_OUTPUT_LIMIT);
    }

    #[test]
    fn plugin_host_timeouts_are_checked_under_their_own_names() {
        for (text, key, found) in [
            ("plugins: {timeout: -1}\n", "plugins.timeout", "found -1"),
            (
                "plugins: {timeout: 1e9}\n",
                "plugins.timeout",
                "found 1000000000",
            ),
            (
                "plugins: {connect_timeout: 0}\n",
                "plugins.connect_timeout",
                "found 0",
            ),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(
                e.starts_with("config file /x/config.yaml: ")
                    && e.contains(&format!("`{key}` must be a number of seconds"))
                    && e.contains(found)
                    && !e.contains("mcp_servers"),
                "{text}: {e}"
            );
        }
        assert!(parse("plugins: {timeout: 0.5, connect_timeout: 86400}\n").is_ok());
    }

    #[test]
    fn an_mcp_server_may_not_take_the_plugin_host_s_name() {
        let e = parse("mcp_servers:\n  plugins:\n    command: x\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("config file /x/config.yaml: `mcp_servers.plugins` ")
                && e.contains("reserved for the plugin host")
                && e.contains("choose another name"),
            "{e}"
        );
        assert!(parse("mcp_servers:\n  my-plugins:\n    command: x\n").is_ok());
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
