//! The whole of `config.yaml` as one typed document, parsed in one place.
//!
//! Every part of the product reads its settings from this struct instead of picking keys out of
//! a loosely typed YAML value: serde derive checks the types, `deny_unknown_fields` turns a typo
//! into an error instead of a silently ignored key, and `serde_path_to_error` names the key path
//! of whatever is wrong (`code_execution.strict.disk_mb: invalid type: …`). What a value *means*
//! (ranges, the mode name, volume syntax) is checked by the part that uses it, against these
//! fields.
//!
//! The parser is serde-saphyr (docs/config.md says why): it works on the YAML events without
//! building a tree, and its budget caps nesting depth and node counts, so a hostile file is
//! refused at once. The file size is capped before parsing.

use indexmap::IndexMap;
use serde::Deserialize;
use std::path::{Path, PathBuf};

use crate::mcp_client::{McpServerConfig, PluginsConfig};

/// Largest config file accepted. A real config is a few KB; anything near this is a mistake or
/// an attack, and is refused before parsing.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// Deepest nesting of mappings and lists accepted. The deepest real key
/// (`mcp_servers.NAME.env.VAR`) is four levels down.
pub const MAX_CONFIG_DEPTH: usize = 32;
/// Most YAML nodes (scalars, mappings, lists) accepted in one file.
pub const MAX_CONFIG_NODES: usize = 100_000;

/// config.yaml, every section optional. Unknown keys are errors at every level.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// `code_execution:` — the execute_code tool (SPEC §3, §5, §6).
    pub code_execution: Option<CodeExecutionSection>,
    /// `terminal:` — the terminal tool and the execution backends (SPEC §4, §9).
    pub terminal: Option<TerminalSection>,
    /// `logging:`.
    pub logging: Option<LoggingSection>,
    /// `approvals:` — dangerous-command approval (SPEC §8).
    pub approvals: Option<ApprovalsSection>,
    /// `command_allowlist:` — pattern keys or command globs approved for good.
    #[serde(default, deserialize_with = "crate::config_types::opt_string_list")]
    pub command_allowlist: Option<Vec<String>>,
    /// `command_denylist:` — pattern keys or command globs always denied.
    #[serde(default, deserialize_with = "crate::config_types::opt_string_list")]
    pub command_denylist: Option<Vec<String>>,
    /// `web:` — backends of web_search and web_extract.
    pub web: Option<WebSection>,
    /// `security:`.
    pub security: Option<SecuritySection>,
    /// `mcp_servers:` — external MCP servers, in file order.
    pub mcp_servers: Option<IndexMap<String, McpServerConfig>>,
    /// `plugins:` — the plugin host.
    pub plugins: Option<PluginsConfig>,
}

/// `code_execution:`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeExecutionSection {
    /// `mode`: `project` or `strict` (an unknown name falls back to project with a warning).
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub mode: Option<String>,
    /// `timeout` in seconds.
    #[serde(default, deserialize_with = "crate::config_types::opt_f64")]
    pub timeout: Option<f64>,
    /// `max_tool_calls` per execution.
    #[serde(default, deserialize_with = "crate::config_types::opt_u64")]
    pub max_tool_calls: Option<u64>,
    /// `python`: the default interpreter.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub python: Option<String>,
    /// `pool_size`: pre-started interpreters of a long-lived host.
    #[serde(default, deserialize_with = "crate::config_types::opt_u64")]
    pub pool_size: Option<u64>,
    /// `stdout_limit` in bytes.
    #[serde(default, deserialize_with = "crate::config_types::opt_u64")]
    pub stdout_limit: Option<u64>,
    /// `stderr_limit` in bytes.
    #[serde(default, deserialize_with = "crate::config_types::opt_u64")]
    pub stderr_limit: Option<u64>,
    /// `strict:` — strict-mode confinement.
    pub strict: Option<StrictSection>,
}

/// `code_execution.strict:`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StrictSection {
    /// `uid` pinned for the script when the supervisor runs as root.
    #[serde(default, deserialize_with = "crate::config_types::opt_u64")]
    pub uid: Option<u64>,
    /// `max_processes` of the script's uid.
    #[serde(default, deserialize_with = "crate::config_types::opt_u64")]
    pub max_processes: Option<u64>,
    /// `memory_mb` per process.
    #[serde(default, deserialize_with = "crate::config_types::opt_u64")]
    pub memory_mb: Option<u64>,
    /// `file_size_mb`: largest file the script may write.
    #[serde(default, deserialize_with = "crate::config_types::opt_u64")]
    pub file_size_mb: Option<u64>,
    /// `disk_mb`: disk budget of one execution.
    #[serde(default, deserialize_with = "crate::config_types::opt_u64")]
    pub disk_mb: Option<u64>,
    /// `seccomp_policy`: path of a seccompiler JSON policy replacing the built-in one.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub seccomp_policy: Option<String>,
    /// `landlock_policy`: path of a landlock rules file replacing the built-in one.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub landlock_policy: Option<String>,
    /// `read_roots`: extra directories the file tools may read.
    #[serde(default, deserialize_with = "crate::config_types::opt_string_list")]
    pub read_roots: Option<Vec<String>>,
    /// `write_roots`: extra directories the file tools may read and write.
    #[serde(default, deserialize_with = "crate::config_types::opt_string_list")]
    pub write_roots: Option<Vec<String>>,
    /// `terminal`: whether strict scripts get the terminal tool.
    #[serde(default, deserialize_with = "crate::config_types::opt_bool")]
    pub terminal: Option<bool>,
    /// `plugin_tools`: whether strict scripts get the plugin tools their plugins open to
    /// scripts (they run in the plugin host, unconfined).
    #[serde(default, deserialize_with = "crate::config_types::opt_bool")]
    pub plugin_tools: Option<bool>,
}

/// `terminal:`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TerminalSection {
    /// `env_passthrough`: variables kept even when they look secret.
    #[serde(default, deserialize_with = "crate::config_types::opt_string_list")]
    pub env_passthrough: Option<Vec<String>>,
    /// `backend`: local, docker, podman, ssh, singularity, modal, daytona.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub backend: Option<String>,
    /// `cwd` inside the backend.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub cwd: Option<String>,
    /// `lifetime_seconds` an idle environment is kept.
    #[serde(default, deserialize_with = "crate::config_types::opt_f64")]
    pub lifetime_seconds: Option<f64>,
    /// `python` inside the backend.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub python: Option<String>,
    /// `docker_image`.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub docker_image: Option<String>,
    /// `docker_volumes`: `host:container[:ro]` entries.
    #[serde(default, deserialize_with = "crate::config_types::opt_string_list")]
    pub docker_volumes: Option<Vec<String>>,
    /// `docker_mount_cwd_to_workspace`.
    #[serde(default, deserialize_with = "crate::config_types::opt_bool")]
    pub docker_mount_cwd_to_workspace: Option<bool>,
    /// `docker_network`.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub docker_network: Option<String>,
    /// `docker_binary`: docker, podman or a path.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub docker_binary: Option<String>,
    /// `container_cpu`: CPUs.
    #[serde(default, deserialize_with = "crate::config_types::opt_f64")]
    pub container_cpu: Option<f64>,
    /// `container_memory`: MB.
    #[serde(default, deserialize_with = "crate::config_types::opt_f64")]
    pub container_memory: Option<f64>,
    /// `container_disk`: MB (cloud sandboxes).
    #[serde(default, deserialize_with = "crate::config_types::opt_f64")]
    pub container_disk: Option<f64>,
    /// `container_pids`: process limit.
    #[serde(default, deserialize_with = "crate::config_types::opt_f64")]
    pub container_pids: Option<f64>,
    /// `container_persistent`.
    #[serde(default, deserialize_with = "crate::config_types::opt_bool")]
    pub container_persistent: Option<bool>,
    /// `ssh_host`.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub ssh_host: Option<String>,
    /// `ssh_user`.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub ssh_user: Option<String>,
    /// `ssh_port`.
    #[serde(default, deserialize_with = "crate::config_types::opt_u64")]
    pub ssh_port: Option<u64>,
    /// `ssh_key`.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub ssh_key: Option<String>,
    /// `ssh_known_hosts`: strict, accept-new or a file.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub ssh_known_hosts: Option<String>,
    /// `shell_session`: `cd`/`export` persist between calls.
    #[serde(default, deserialize_with = "crate::config_types::opt_bool")]
    pub shell_session: Option<bool>,
    /// `agent_binary`: the tool agent run inside a backend.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub agent_binary: Option<String>,
    /// `singularity_image`.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub singularity_image: Option<String>,
    /// `modal_image`.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub modal_image: Option<String>,
    /// `modal_python`: the host interpreter (with the `modal` package) of the SDK sidecar.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub modal_python: Option<String>,
    /// `daytona_image`.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub daytona_image: Option<String>,
}

/// `logging:`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingSection {
    /// `level`: error, warn, info, debug, trace, off (or a tracing filter). A plain `off`, which
    /// YAML reads as the boolean false, means `off`.
    #[serde(default, deserialize_with = "crate::config_types::opt_level")]
    pub level: Option<String>,
}

/// `approvals:`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsSection {
    /// `mode`: manual, smart or off.
    pub mode: Option<TextOrBool>,
    /// `timeout` in seconds a host has to answer.
    #[serde(default, deserialize_with = "crate::config_types::opt_f64")]
    pub timeout: Option<f64>,
    /// `deny`: pattern keys or command globs always denied.
    #[serde(default, deserialize_with = "crate::config_types::opt_string_list")]
    pub deny: Option<Vec<String>>,
    /// `smart_command`: the program asked in smart mode.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub smart_command: Option<String>,
    /// `skip_in_isolated_backends`.
    #[serde(default, deserialize_with = "crate::config_types::opt_bool")]
    pub skip_in_isolated_backends: Option<bool>,
}

/// `web:`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebSection {
    /// `search_backend` (searxng).
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub search_backend: Option<String>,
    /// `searxng_url`.
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub searxng_url: Option<String>,
    /// `extract_backend` (http).
    #[serde(default, deserialize_with = "crate::config_types::opt_string")]
    pub extract_backend: Option<String>,
    /// `timeout` in whole seconds.
    #[serde(default, deserialize_with = "crate::config_types::opt_u64")]
    pub timeout: Option<u64>,
}

/// `security:`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecuritySection {
    /// `redact_output` (default true).
    #[serde(default, deserialize_with = "crate::config_types::opt_bool")]
    pub redact_output: Option<bool>,
}

/// `approvals.mode`: text (`manual`, `smart`, `off`) or a boolean, because YAML 1.1 reads a
/// plain `off` as `false`. Nothing else (a number, a list) is accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextOrBool {
    /// `true` / `false` (and the YAML 1.1 spellings `on`, `off`, `yes`, `no`, unquoted).
    Bool(bool),
    /// Anything else.
    Text(String),
}

impl<'de> Deserialize<'de> for TextOrBool {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = TextOrBool;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("manual, smart or off")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<TextOrBool, E> {
                Ok(TextOrBool::Bool(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TextOrBool, E> {
                Ok(TextOrBool::Text(v.to_owned()))
            }
        }
        // `deserialize_any` reports a quoted scalar as a string and types a plain one, so a
        // number is refused instead of being read as its text.
        d.deserialize_any(V)
    }
}

/// The text of a config file as one read saw it, with the metadata of the file it came from.
#[derive(Debug)]
pub struct ConfigText {
    /// The whole text, at most [`MAX_CONFIG_BYTES`].
    pub text: String,
    /// The metadata of the file the text was read from (the same open file, so a rename over
    /// the path in between cannot pair one file's text with another's stamp).
    pub metadata: std::fs::Metadata,
}

/// Reads the config file at `path` once, through one descriptor, capped at
/// [`MAX_CONFIG_BYTES`]. `Ok(None)` when it does not exist. A pipe (`--config <(...)`) or a
/// FIFO is read like a file (its writer decides when it ends); a device is refused by the cap
/// (`/dev/zero` never ends) or as empty text, and a directory as unreadable.
pub fn read_text(path: &Path) -> Result<Option<ConfigText>, ConfigFileError> {
    use std::io::Read;
    let unreadable = |source| ConfigFileError::Unreadable {
        path: path.to_path_buf(),
        source,
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            absent_or_dangling(path)?;
            return Ok(None);
        }
        Err(e) => return Err(unreadable(e)),
    };
    let metadata = file.metadata().map_err(unreadable)?;
    // Read one byte past the cap to tell "exactly at the cap" from "over it" without
    // trusting a size that can change between stat and read (and that a pipe does not have).
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(ConfigFileError::TooLarge {
            path: path.to_path_buf(),
            limit: MAX_CONFIG_BYTES,
        });
    }
    let text = String::from_utf8(bytes).map_err(|e| ConfigFileError::Invalid {
        path: path.to_path_buf(),
        key: String::new(),
        message: format!("not UTF-8 text ({e})"),
    })?;
    Ok(Some(ConfigText { text, metadata }))
}

/// Called when opening `path` found nothing: `Ok` when there is no entry at all (no config
/// file, so the defaults), an error when `path` is a symbolic link whose target is missing. The
/// operator put a config there: running on the defaults would drop its settings (an
/// `approvals.deny` rule) without a word.
pub fn absent_or_dangling(path: &Path) -> Result<(), ConfigFileError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(ConfigFileError::DanglingLink {
            path: path.to_path_buf(),
            target: std::fs::read_link(path).unwrap_or_default(),
        }),
        _ => Ok(()),
    }
}

/// config.yaml could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// The path is a symbolic link to nothing.
    #[error("config file {path} is a symbolic link to {target}, which does not exist; point the link at the config file, or remove the link to run on the defaults")]
    DanglingLink {
        /// The link.
        path: PathBuf,
        /// Where it points.
        target: PathBuf,
    },
    /// The file exists (or was named) but cannot be read.
    #[error("cannot read config file {path}: {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_CONFIG_BYTES`].
    #[error("config file {path} is larger than {limit} bytes; a config.yaml is a few KB — check that the path names the right file")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The cap.
        limit: u64,
    },
    /// The text is not valid YAML, breaks a budget, or a key is unknown or of the wrong type.
    #[error("{path}: {}{message}", key_prefix(.key))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Dotted key path of the offending value (empty at the top level).
        key: String,
        /// What the parser said.
        message: String,
    },
}

fn key_prefix(key: &str) -> String {
    if key.is_empty() || key == "." {
        String::new()
    } else {
        format!("{key}: ")
    }
}

impl ConfigFile {
    /// Reads and parses the file at `path`. A missing file is `Ok(None)`, for the caller to
    /// decide whether that is an error (a named file) or the defaults (the default location).
    pub fn read(path: &Path) -> Result<Option<ConfigFile>, ConfigFileError> {
        match read_text(path)? {
            Some(read) => ConfigFile::parse(&read.text, path).map(Some),
            None => Ok(None),
        }
    }

    /// Parses config text; `path` names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<ConfigFile, ConfigFileError> {
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(ConfigFileError::TooLarge {
                path: path.to_path_buf(),
                limit: MAX_CONFIG_BYTES,
            });
        }
        // An empty file (or one with only comments) is the defaults, as an absent one is.
        if text.lines().all(|l| {
            let l = l.trim();
            l.is_empty() || l.starts_with('#') || l == "---"
        }) {
            return Ok(ConfigFile::default());
        }
        let mut key = String::new();
        let parsed =
            serde_saphyr::with_deserializer_from_str_with_options(text, parse_options(), |de| {
                serde_path_to_error::deserialize::<_, Option<ConfigFile>>(de).map_err(|e| {
                    key = e.path().to_string();
                    e.into_inner()
                })
            });
        match parsed {
            Ok(doc) => Ok(doc.unwrap_or_default()),
            Err(e) => {
                let message = match in_config_terms(&e, &mut key) {
                    Some(message) => message,
                    None => {
                        let mut message = e.to_string();
                        // The parser's wording for the nesting cap does not say what the cap is.
                        let lower = message.to_lowercase();
                        if lower.contains("recursion limit") || lower.contains("depth") {
                            message.push_str(&format!(
                                " (config.yaml may nest at most {MAX_CONFIG_DEPTH} levels deep)"
                            ));
                        }
                        message
                    }
                };
                Err(ConfigFileError::Invalid {
                    path: path.to_path_buf(),
                    key,
                    message,
                })
            }
        }
    }
}

/// The parser's errors whose own wording speaks of its options (`set DuplicateKeyPolicy in
/// Options`, `rejected by the configured policy`), said in the config's terms instead; `key`
/// (the path `serde_path_to_error` recorded) is completed where the parser knew more. `None`:
/// the parser's message stands.
fn in_config_terms(e: &serde_saphyr::Error, key: &mut String) -> Option<String> {
    let at = |location: &serde_saphyr::Location| {
        format!(" at line {}, column {}", location.line(), location.column())
    };
    match e.without_snippet() {
        serde_saphyr::Error::DuplicateMappingKey { key: dup, location } => {
            // The path ends in `?` where the duplicated key would be.
            let parent = key.strip_suffix('?').unwrap_or(key.as_str());
            let parent = parent.strip_suffix('.').unwrap_or(parent).to_string();
            Some(match dup {
                Some(dup) => {
                    *key = if parent.is_empty() {
                        dup.clone()
                    } else {
                        format!("{parent}.{dup}")
                    };
                    format!(
                        "`{dup}` is given twice in the same mapping; remove one of them{}",
                        at(location)
                    )
                }
                None => {
                    *key = parent;
                    format!(
                        "a key is given twice in the same mapping; remove one of them{}",
                        at(location)
                    )
                }
            })
        }
        serde_saphyr::Error::NonFiniteFloat { value, location } => {
            let what = if value.to_ascii_lowercase().contains("nan") {
                format!("`{value}` (NaN, not a number) is not allowed here; write a number")
            } else {
                format!(
                    "`{value}` is infinite (or too large for a number), which is not allowed \
                     here; write a finite number"
                )
            };
            Some(format!("{what}{}", at(location)))
        }
        _ => None,
    }
}

/// The parser's options: budgets sized for a config file, no source snippets in messages
/// (errors go to one log or stderr line).
fn parse_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_CONFIG_DEPTH;
    budget.flow_nesting_limit = MAX_CONFIG_DEPTH;
    budget.max_nodes = MAX_CONFIG_NODES;
    budget.max_reader_input_bytes = Some(MAX_CONFIG_BYTES as usize);
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options.with_snippet = false;
    options
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConfigFile, ConfigFileError> {
        ConfigFile::parse(text, Path::new("/x/config.yaml"))
    }

    #[test]
    fn reads_typed_sections() {
        let c = parse(
            "code_execution:\n  mode: strict\n  timeout: 12\n  strict:\n    disk_mb: 64\n    read_roots: [/a]\nterminal:\n  ssh_user: '1000'\n  env_passthrough: [A]\n  daytona_image: img\napprovals:\n  mode: off\n  deny: [rm]\ncommand_allowlist: [a, b]\nmcp_servers:\n  z: {command: zz}\n  a: {url: 'http://127.0.0.1:1/mcp'}\n",
        )
        .unwrap();
        let ce = c.code_execution.unwrap();
        assert_eq!(ce.mode.as_deref(), Some("strict"));
        assert_eq!(ce.timeout, Some(12.0));
        let strict = ce.strict.unwrap();
        assert_eq!(strict.disk_mb, Some(64));
        assert_eq!(strict.read_roots, Some(vec!["/a".to_string()]));
        let t = c.terminal.unwrap();
        assert_eq!(t.ssh_user.as_deref(), Some("1000"));
        assert_eq!(t.daytona_image.as_deref(), Some("img"));
        let a = c.approvals.unwrap();
        // YAML 1.1 reads a plain `off` as false; approvals takes that as the mode off.
        assert_eq!(a.mode, Some(TextOrBool::Bool(false)));
        assert_eq!(a.deny.unwrap(), vec!["rm"]);
        assert_eq!(c.command_allowlist.unwrap(), vec!["a", "b"]);
        let names: Vec<_> = c.mcp_servers.unwrap().keys().cloned().collect();
        assert_eq!(names, ["z", "a"], "file order is kept");
    }

    #[test]
    fn empty_and_null_sections_are_defaults() {
        assert!(parse("").unwrap().code_execution.is_none());
        assert!(parse("# nothing\n").unwrap().terminal.is_none());
        assert!(parse("code_execution:\n").unwrap().code_execution.is_none());
        let c = parse("code_execution:\n  timeout: null\n").unwrap();
        assert_eq!(c.code_execution.unwrap().timeout, None);
    }

    #[test]
    fn errors_name_the_file_and_key_path() {
        let e = parse("code_execution:\n  strict:\n    disk_mb: x\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/x/config.yaml: code_execution.strict.disk_mb: "),
            "{e}"
        );
        assert!(e.contains("invalid type") || e.contains("invalid"), "{e}");
        let e = parse("terminal:\n  env_passthrough: [A, [B]]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("terminal.env_passthrough[1]"), "{e}");
    }

    #[test]
    fn each_key_takes_only_its_documented_type() {
        // A quoted string where a boolean, a number or a list is meant, a number or a boolean
        // where a string is meant, a scalar where a list is meant: each is an error naming the
        // file and the key path, not a silent conversion.
        for (text, key) in [
            (
                "security:\n  redact_output: \"no\"\n",
                "security.redact_output",
            ),
            (
                "security:\n  redact_output: 'yes'\n",
                "security.redact_output",
            ),
            ("security:\n  redact_output: 0\n", "security.redact_output"),
            (
                "terminal:\n  env_passthrough: [1, 2]\n",
                "terminal.env_passthrough[0]",
            ),
            (
                "terminal:\n  env_passthrough: [A, true]\n",
                "terminal.env_passthrough[1]",
            ),
            (
                "terminal:\n  env_passthrough: A\n",
                "terminal.env_passthrough",
            ),
            ("command_allowlist: notalist\n", "command_allowlist"),
            ("command_denylist: x\n", "command_denylist"),
            ("command_allowlist: [a, 3]\n", "command_allowlist[1]"),
            ("approvals:\n  deny: rm\n", "approvals.deny"),
            ("approvals:\n  mode: 3\n", "approvals.mode"),
            ("approvals:\n  timeout: '60'\n", "approvals.timeout"),
            (
                "approvals:\n  skip_in_isolated_backends: 'true'\n",
                "approvals.skip_in_isolated_backends",
            ),
            (
                "code_execution:\n  timeout: '12'\n",
                "code_execution.timeout",
            ),
            (
                "code_execution:\n  max_tool_calls: '3'\n",
                "code_execution.max_tool_calls",
            ),
            (
                "code_execution:\n  max_tool_calls: 2.5\n",
                "code_execution.max_tool_calls",
            ),
            (
                "code_execution:\n  max_tool_calls: -1\n",
                "code_execution.max_tool_calls",
            ),
            ("code_execution:\n  mode: 1\n", "code_execution.mode"),
            ("code_execution:\n  python: 3.12\n", "code_execution.python"),
            (
                "code_execution:\n  strict:\n    terminal: 'no'\n",
                "code_execution.strict.terminal",
            ),
            (
                "code_execution:\n  strict:\n    read_roots: /a\n",
                "code_execution.strict.read_roots",
            ),
            ("terminal:\n  ssh_user: 1000\n", "terminal.ssh_user"),
            ("terminal:\n  ssh_port: '22'\n", "terminal.ssh_port"),
            (
                "terminal:\n  shell_session: 'on'\n",
                "terminal.shell_session",
            ),
            (
                "terminal:\n  docker_volumes: '/a:/b'\n",
                "terminal.docker_volumes",
            ),
            (
                "terminal:\n  container_cpu: '1'\n",
                "terminal.container_cpu",
            ),
            ("logging:\n  level: 3\n", "logging.level"),
            ("logging:\n  level: true\n", "logging.level"),
            ("web:\n  timeout: '20'\n", "web.timeout"),
            ("web:\n  searxng_url: 8888\n", "web.searxng_url"),
            (
                "mcp_servers:\n  s:\n    command: x\n    enabled: 'no'\n",
                "mcp_servers.s.enabled",
            ),
            (
                "mcp_servers:\n  s:\n    command: x\n    timeout: '30'\n",
                "mcp_servers.s.timeout",
            ),
            (
                "plugins:\n  entry_points: 'false'\n",
                "plugins.entry_points",
            ),
            ("plugins:\n  dirs: /p\n", "plugins.dirs"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("/x/config.yaml: {key}: ")),
                "{text:?}: {e}"
            );
        }
        // The right types, including the YAML 1.1 booleans the docs use, keep working.
        let c = parse(concat!(
            "security:\n  redact_output: no\n",
            "terminal:\n  shell_session: on\n  ssh_user: '1000'\n  ssh_port: 22\n",
            "  container_cpu: 1.5\n  env_passthrough: []\n",
            "code_execution:\n  timeout: 12\n  strict:\n    terminal: yes\n",
            "approvals:\n  mode: 'off'\n  timeout: 0.5\n",
            "logging:\n  level: off\n",
            "command_allowlist: ['git_force_push', \"rm -rf *\"]\n",
        ))
        .unwrap();
        assert_eq!(c.security.unwrap().redact_output, Some(false));
        let t = c.terminal.unwrap();
        assert_eq!(t.shell_session, Some(true));
        assert_eq!(t.ssh_port, Some(22));
        assert_eq!(t.container_cpu, Some(1.5));
        assert_eq!(t.env_passthrough, Some(vec![]));
        let ce = c.code_execution.unwrap();
        assert_eq!(ce.timeout, Some(12.0));
        assert_eq!(ce.strict.unwrap().terminal, Some(true));
        assert_eq!(
            c.approvals.unwrap().mode,
            Some(TextOrBool::Text("off".into()))
        );
        assert_eq!(c.logging.unwrap().level.as_deref(), Some("off"));
        assert_eq!(c.command_allowlist.unwrap(), ["git_force_push", "rm -rf *"]);
    }

    #[test]
    fn script_callable_says_what_it_takes() {
        use crate::mcp_client::ScriptCallable;
        for (value, found) in [
            ("\"yes\"", "string \"yes\""),
            ("3", "integer `3`"),
            ("{a: 1}", "map"),
            ("[search, 3]", "integer `3`"),
        ] {
            let text =
                format!("mcp_servers:\n  s:\n    command: x\n    script_callable: {value}\n");
            let e = parse(&text).unwrap_err().to_string();
            assert!(
                e.starts_with("/x/config.yaml: mcp_servers.s.script_callable")
                    && e.contains(found)
                    && !e.contains("untagged")
                    && !e.contains("ScriptCallable"),
                "{value}: {e}"
            );
            assert!(
                e.contains("true, false or a list of tool names") || e.contains("a tool name"),
                "{value}: {e}"
            );
        }
        let opened = |value: &str| {
            let text =
                format!("mcp_servers:\n  s:\n    command: x\n    script_callable: {value}\n");
            parse(&text).unwrap().mcp_servers.unwrap()["s"]
                .script_callable
                .clone()
        };
        assert_eq!(opened("true"), ScriptCallable::All(true));
        assert_eq!(opened("no"), ScriptCallable::All(false));
        assert_eq!(
            opened("[b, a, '1']"),
            ScriptCallable::Only(["a", "b", "1"].map(String::from).into())
        );
    }

    #[test]
    fn parser_policies_are_said_in_the_config_s_terms() {
        // The parser's own wording named its options ("set DuplicateKeyPolicy in Options",
        // "rejected by the configured policy") or a float no one wrote.
        for (text, starts, says) in [
            (
                "code_execution:\n  timeout: 3\n  timeout: 4\n",
                "/x/config.yaml: code_execution.timeout: ",
                "`timeout` is given twice in the same mapping; remove one of them at line 3",
            ),
            (
                "code_execution: {}\ncode_execution: {}\n",
                "/x/config.yaml: code_execution: ",
                "`code_execution` is given twice",
            ),
            (
                "mcp_servers:\n  a: {command: x, env: {K: '1', K: '2'}}\n",
                "/x/config.yaml: mcp_servers.a.env.K: ",
                "`K` is given twice",
            ),
            (
                "code_execution:\n  timeout: .nan\n",
                "/x/config.yaml: code_execution.timeout: ",
                "`.nan` (NaN, not a number) is not allowed here; write a number at line 2",
            ),
            (
                "code_execution:\n  max_tool_calls: .NaN\n",
                "/x/config.yaml: code_execution.max_tool_calls: ",
                "(NaN, not a number) is not allowed here",
            ),
            (
                "approvals:\n  timeout: -.inf\n",
                "/x/config.yaml: approvals.timeout: ",
                "`-.inf` is infinite",
            ),
            (
                "code_execution:\n  max_tool_calls: 18446744073709551616\n",
                "/x/config.yaml: code_execution.max_tool_calls: ",
                "the number is too large: a whole number from 0 to 18446744073709551615 is expected",
            ),
            (
                "terminal:\n  ssh_port: -99999999999999999999\n",
                "/x/config.yaml: terminal.ssh_port: ",
                "the number is negative",
            ),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.starts_with(starts) && e.contains(says), "{text:?}: {e}");
            for internal in ["Policy", "policy", "Options", "?", "floating point"] {
                assert!(!e.contains(internal), "{text:?}: {e}");
            }
        }
        // The largest whole number is still one.
        let c = parse("code_execution:\n  max_tool_calls: 18446744073709551615\n").unwrap();
        assert_eq!(c.code_execution.unwrap().max_tool_calls, Some(u64::MAX));
        // A fraction is still a type error.
        let e = parse("code_execution:\n  max_tool_calls: 2.5\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected a whole number"), "{e}");
    }

    #[test]
    fn the_always_rewrite_keeps_every_value_of_its_type() {
        // `approval::persist_always` rewrites the file through a JSON value: a string that
        // looks like a number or a boolean must come back quoted, or the strict types would
        // refuse the file it wrote.
        let text = "terminal:\n  ssh_user: '1000'\n  docker_network: 'on'\n  ssh_port: 22\nsecurity:\n  redact_output: no\napprovals:\n  mode: off\ncommand_allowlist: ['123', x]\n";
        let before = parse(text).unwrap();
        let doc: serde_json::Value = serde_saphyr::from_str(text).unwrap();
        let written = serde_saphyr::to_string(&doc).unwrap();
        let after = parse(&written).unwrap_or_else(|e| panic!("{e}\n{written}"));
        let (b, a) = (before.terminal.unwrap(), after.terminal.unwrap());
        assert_eq!(a.ssh_user, b.ssh_user);
        assert_eq!(a.docker_network, b.docker_network);
        assert_eq!(a.ssh_port, b.ssh_port);
        assert_eq!(after.security.unwrap().redact_output, Some(false));
        assert_eq!(after.approvals.unwrap().mode, Some(TextOrBool::Bool(false)));
        assert_eq!(after.command_allowlist, before.command_allowlist);
    }

    #[test]
    fn unknown_keys_are_rejected_at_every_level() {
        for (text, key) in [
            ("colour: blue\n", "colour"),
            ("code_execution:\n  timeot: 5\n", "timeot"),
            ("code_execution:\n  strict:\n    dsk_mb: 5\n", "dsk_mb"),
            ("terminal:\n  dockr_image: x\n", "dockr_image"),
            ("approvals:\n  mod: off\n", "mod"),
            ("web:\n  url: x\n", "url"),
            ("mcp_servers:\n  s:\n    comand: x\n", "comand"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(
                e.contains("/x/config.yaml") && e.contains(key),
                "{text}: {e}"
            );
            assert!(e.contains("unknown field"), "{text}: {e}");
        }
    }

    #[test]
    fn deep_nesting_is_refused_by_the_budget() {
        // The file of the issue: 200 KB nested 100k deep. Every key reads one documented
        // shape, so the first nested entry is already the wrong type (script_callable too,
        // since it stopped being an untagged enum read generically); the parser's depth cap
        // stops a value read generically (checked directly below) before it recurses.
        let depth = 100_000;
        let cases = [
            format!(
                "mcp_servers:\n  s:\n    command: x\n    script_callable: {}{}\n",
                "[".repeat(depth),
                "]".repeat(depth)
            ),
            format!(
                "mcp_servers:\n  s:\n    command: x\n    script_callable: {}{}\n",
                "{a: ".repeat(depth),
                "}".repeat(depth)
            ),
            format!(
                "command_allowlist: {}{}\n",
                "[".repeat(depth),
                "]".repeat(depth)
            ),
            format!(
                "approvals:\n  deny: {}{}\n",
                "{a: ".repeat(depth),
                "}".repeat(depth)
            ),
            format!(
                "command_allowlist:\n{}x\n",
                (0..200)
                    .map(|i| format!("{}- ", "  ".repeat(i)))
                    .collect::<String>()
            ),
        ];
        for text in &cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.starts_with("/x/config.yaml: "), "{e}");
            let lower = e.to_lowercase();
            let too_deep =
                lower.contains("depth") || lower.contains("nest") || lower.contains("recursion");
            assert!(too_deep || lower.contains("invalid type"), "{e}");
        }
        // A value read generically stops at the cap.
        let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let e = serde_saphyr::from_str_with_options::<serde_json::Value>(&deep, parse_options())
            .unwrap_err()
            .to_string()
            .to_lowercase();
        assert!(
            e.contains("depth") || e.contains("nest") || e.contains("recursion"),
            "{e}"
        );
        // At the top level, the first key already fails.
        let e = parse(&format!("a: {}{}", "[".repeat(depth), "]".repeat(depth)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `a`"), "{e}");
        // Nesting within the cap is fine where the type allows it.
        assert!(parse("mcp_servers:\n  s:\n    env:\n      A: b\n").is_ok());
    }

    #[test]
    fn a_dangling_symlink_is_an_error_and_a_missing_file_the_defaults() {
        // A link to /nonexistent was read as "no config" and the defaults applied, dropping
        // the settings the operator meant to give (approvals.deny, say).
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("config.yaml");
        std::os::unix::fs::symlink("/nonexistent/config.yaml", &link).unwrap();
        let e = ConfigFile::read(&link).unwrap_err();
        assert!(matches!(e, ConfigFileError::DanglingLink { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains(&link.display().to_string())
                && text.contains("symbolic link to /nonexistent/config.yaml, which does not exist"),
            "{text}"
        );
        assert!(read_text(&link).is_err());
        assert!(ConfigFile::read(&dir.path().join("absent.yaml"))
            .unwrap()
            .is_none());
        // A link to a file that exists is read through.
        let real = dir.path().join("real.yaml");
        std::fs::write(&real, "code_execution:\n  timeout: 9\n").unwrap();
        let good = dir.path().join("good.yaml");
        std::os::unix::fs::symlink(&real, &good).unwrap();
        let c = ConfigFile::read(&good).unwrap().unwrap();
        assert_eq!(c.code_execution.unwrap().timeout, Some(9.0));
    }

    #[test]
    fn oversized_files_are_refused_before_parsing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.yaml");
        let filler = format!("# {}\n", "x".repeat(1000));
        std::fs::write(&p, filler.repeat(1100)).unwrap();
        let e = ConfigFile::read(&p).unwrap_err();
        assert!(matches!(e, ConfigFileError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains("larger than"), "{e}");
        assert!(ConfigFile::read(&dir.path().join("absent.yaml"))
            .unwrap()
            .is_none());
    }
}
