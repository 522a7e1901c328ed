//! The `mcp_servers:` section of config.yaml, as the MCP client reads it.
//!
//! Kept apart from the client so the supervisor can parse and check the whole section (and
//! report every bad entry by name) before any server is started.

use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

/// Name of the plugin host's server (its row in `tools list`, its log lines); reserved: no
/// `mcp_servers` entry may take it.
pub const PLUGIN_HOST: &str = "plugins";

/// Default per-call timeout of an MCP tool call.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Default time a server gets to start and answer `initialize` and `tools/list`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// When a server is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Startup {
    /// When the registry is built (the CLI starts, the Python package loads extensions).
    Eager,
    /// On the first definitions build that needs its tools (or first script build when the
    /// server is script-callable). The default: an agent that never lists tools pays nothing.
    #[default]
    Lazy,
}

impl Startup {
    /// The name written in config.
    pub fn as_str(self) -> &'static str {
        match self {
            Startup::Eager => "eager",
            Startup::Lazy => "lazy",
        }
    }
}

/// `script_callable:` — `false` (default), `true` (every tool of the server) or a list of tool
/// names. Only the operator's config can open MCP tools to scripts (SPEC §2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptCallable {
    /// All tools (`true`) or none (`false`).
    All(bool),
    /// Only these tools.
    Only(BTreeSet<String>),
}

impl<'de> Deserialize<'de> for ScriptCallable {
    /// One shape at a time, said in the config's terms: an untagged enum reported a mistake
    /// (`script_callable: "yes"`) as "data did not match any variant of untagged enum
    /// ScriptCallable".
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ScriptCallable;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("true, false or a list of tool names, e.g. [search, fetch]")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<ScriptCallable, E> {
                Ok(ScriptCallable::All(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<ScriptCallable, A::Error> {
                let mut names = BTreeSet::new();
                while let Some(ToolName(name)) = seq.next_element()? {
                    names.insert(name);
                }
                Ok(ScriptCallable::Only(names))
            }
        }
        /// One entry of the list: a tool name, as text.
        struct ToolName(String);
        impl<'de> Deserialize<'de> for ToolName {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct N;
                impl serde::de::Visitor<'_> for N {
                    type Value = ToolName;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("a tool name (quote one YAML reads as a number or a boolean)")
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ToolName, E> {
                        Ok(ToolName(v.to_owned()))
                    }
                }
                d.deserialize_any(N)
            }
        }
        // `deserialize_any` reports a quoted scalar as a string, so `"true"` is refused rather
        // than read as the boolean.
        d.deserialize_any(V)
    }
}

impl Default for ScriptCallable {
    fn default() -> Self {
        ScriptCallable::All(false)
    }
}

impl ScriptCallable {
    /// `None` when scripts may not call the server; `Some(None)` for all its tools;
    /// `Some(Some(names))` for the listed ones.
    pub fn opened(&self) -> Option<Option<BTreeSet<String>>> {
        match self {
            ScriptCallable::All(false) => None,
            ScriptCallable::All(true) => Some(None),
            ScriptCallable::Only(names) => Some(Some(names.clone())),
        }
    }
}

/// One entry of `mcp_servers:`: a stdio server (`command`) or an HTTP one (`url`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct McpServerConfig {
    /// Program of a stdio server (looked up on PATH).
    #[serde(deserialize_with = "crate::config_types::opt_string")]
    pub command: Option<String>,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables set for a stdio server on top of the scrubbed environment. An explicit value
    /// here is the operator's choice and passes even a provider credential.
    pub env: BTreeMap<String, String>,
    /// Working directory of a stdio server (default: the CLI's).
    #[serde(deserialize_with = "crate::config_types::opt_path")]
    pub cwd: Option<PathBuf>,
    /// URL of a streamable-HTTP server.
    #[serde(deserialize_with = "crate::config_types::opt_string")]
    pub url: Option<String>,
    /// HTTP headers sent to an HTTP server (e.g. `Authorization`).
    pub headers: BTreeMap<String, String>,
    /// `eager` or `lazy` (default).
    pub startup: Startup,
    /// Per-call timeout in seconds (default 60).
    #[serde(deserialize_with = "crate::config_types::opt_f64")]
    pub timeout: Option<f64>,
    /// Start-up timeout in seconds (default 30).
    #[serde(deserialize_with = "crate::config_types::opt_f64")]
    pub connect_timeout: Option<f64>,
    /// Whether scripts may call this server's tools (default `false`).
    pub script_callable: ScriptCallable,
    /// `false` skips the server without removing its entry.
    #[serde(deserialize_with = "crate::config_types::opt_bool")]
    pub enabled: Option<bool>,
}

/// The `plugins:` section of config.yaml.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PluginsConfig {
    /// `false` loads no plugins (default `true`).
    #[serde(deserialize_with = "crate::config_types::opt_bool")]
    pub enabled: Option<bool>,
    /// `eager` or `lazy` (default).
    pub startup: Startup,
    /// Interpreter of the plugin host (default: the default interpreter, `code_execution.python`
    /// or `python3` on PATH).
    #[serde(deserialize_with = "crate::config_types::opt_path")]
    pub python: Option<PathBuf>,
    /// Extra plugin directories, after `$VIBEOS_HOME/plugins` and `<cwd>/.vibeos/plugins`.
    #[serde(deserialize_with = "crate::config_types::path_list")]
    pub dirs: Vec<PathBuf>,
    /// Per-call timeout in seconds (default 60).
    #[serde(deserialize_with = "crate::config_types::opt_f64")]
    pub timeout: Option<f64>,
    /// Start-up timeout in seconds (default 30).
    #[serde(deserialize_with = "crate::config_types::opt_f64")]
    pub connect_timeout: Option<f64>,
    /// Whether installed packages' `vibeos.plugins` entry points are loaded. Unset: loaded when
    /// the host runs, which it does only when a plugin directory exists; `true` runs the host
    /// for entry points alone; `false` never loads them.
    #[serde(deserialize_with = "crate::config_types::opt_bool")]
    pub entry_points: Option<bool>,
}

/// Why an `mcp_servers` entry cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum McpConfigError {
    /// Neither or both of `command` and `url`.
    #[error(
        "mcp_servers.{0}: give exactly one of `command` (a stdio server) or `url` (an HTTP server)"
    )]
    Transport(String),
    /// A timeout that is not a positive number of seconds.
    #[error("mcp_servers.{name}.{key}: {value} is not a usable number of seconds (positive, at most 86400)")]
    Timeout {
        /// Server name.
        name: String,
        /// `timeout` or `connect_timeout`.
        key: &'static str,
        /// The value written.
        value: f64,
    },
    /// A `url` that is not an http(s) URL with a host.
    #[error("mcp_servers.{name}.url: {url} is not usable: give an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000/mcp ({why})")]
    BadUrl {
        /// Server name.
        name: String,
        /// The URL written, its credentials masked.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// A server name that cannot make a toolset name.
    #[error("mcp_servers.{0}: a server name may hold only letters, digits, `_` and `-`")]
    BadName(String),
    /// An `env:` entry a process environment cannot hold.
    #[error("mcp_servers.{name}.env: {var:?} cannot be set for the server: {why}")]
    BadEnv {
        /// Server name.
        name: String,
        /// The variable's name as written.
        var: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A stdio-only key on an HTTP server or the reverse.
    #[error("mcp_servers.{name}: `{key}` applies only to {kind} servers")]
    WrongKind {
        /// Server name.
        name: String,
        /// The misplaced key.
        key: &'static str,
        /// `stdio` or `HTTP`.
        kind: &'static str,
    },
}

fn seconds(
    name: &str,
    key: &'static str,
    v: Option<f64>,
    default: Duration,
) -> Result<Duration, McpConfigError> {
    match v {
        None => Ok(default),
        Some(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(Duration::from_secs_f64(s)),
        Some(value) => Err(McpConfigError::Timeout {
            name: name.into(),
            key,
            value,
        }),
    }
}

/// An HTTP server's `url`: the streamable-HTTP transport speaks http and https only, to a host.
/// `ftp://…` or `not a url` passed the check and failed only at connect time, in the HTTP
/// client's words.
fn check_url(name: &str, url: &str) -> Result<(), McpConfigError> {
    let why = match reqwest::Url::parse(url.trim()) {
        Err(e) => format!("not a URL: {e}"),
        Ok(u) if !matches!(u.scheme(), "http" | "https") => {
            format!("the scheme is `{}`", u.scheme())
        }
        Ok(u) if u.host_str().is_none_or(str::is_empty) => "it names no host".to_string(),
        Ok(_) => return Ok(()),
    };
    Err(McpConfigError::BadUrl {
        name: name.into(),
        url: crate::url_mask::mask_url(url),
        why,
    })
}

impl McpServerConfig {
    /// Checks the entry named `name`: exactly one transport, keys that fit it, usable timeouts.
    pub fn validate(&self, name: &str) -> Result<(), McpConfigError> {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(McpConfigError::BadName(name.into()));
        }
        match (&self.command, &self.url) {
            (Some(_), None) => {
                self.check_env(name)?;
                if !self.headers.is_empty() {
                    return Err(McpConfigError::WrongKind {
                        name: name.into(),
                        key: "headers",
                        kind: "HTTP",
                    });
                }
            }
            (None, Some(url)) => {
                check_url(name, url)?;
                for (key, set) in [
                    ("args", !self.args.is_empty()),
                    ("env", !self.env.is_empty()),
                    ("cwd", self.cwd.is_some()),
                ] {
                    if set {
                        return Err(McpConfigError::WrongKind {
                            name: name.into(),
                            key,
                            kind: "stdio",
                        });
                    }
                }
            }
            _ => return Err(McpConfigError::Transport(name.into())),
        }
        self.call_timeout(name)?;
        self.start_timeout(name)?;
        Ok(())
    }

    /// Each `env:` entry can be put in a process environment: a name that is not empty and
    /// holds no `=` (the kernel's `NAME=value` would split it elsewhere, setting another
    /// variable) or NUL, and a value without NUL (the spawn would fail only at start-up).
    fn check_env(&self, name: &str) -> Result<(), McpConfigError> {
        for (var, value) in &self.env {
            let why = if var.is_empty() {
                "a variable needs a name"
            } else if var.contains('=') {
                "a variable's name cannot hold `=`"
            } else if var.contains('\0') || value.contains('\0') {
                "a NUL byte cannot be passed in an environment"
            } else {
                continue;
            };
            return Err(McpConfigError::BadEnv {
                name: name.into(),
                var: var.clone(),
                why,
            });
        }
        Ok(())
    }

    /// The per-call timeout.
    pub fn call_timeout(&self, name: &str) -> Result<Duration, McpConfigError> {
        seconds(name, "timeout", self.timeout, DEFAULT_CALL_TIMEOUT)
    }

    /// The start-up timeout.
    pub fn start_timeout(&self, name: &str) -> Result<Duration, McpConfigError> {
        seconds(
            name,
            "connect_timeout",
            self.connect_timeout,
            DEFAULT_CONNECT_TIMEOUT,
        )
    }

    /// Whether the entry is enabled (default yes).
    pub fn is_enabled(&self) -> bool {
        self.enabled.unwrap_or(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(url: &str) -> McpServerConfig {
        McpServerConfig {
            url: Some(url.into()),
            ..Default::default()
        }
    }

    #[test]
    fn only_http_urls_with_a_host_are_usable() {
        for (url, why) in [
            ("ftp://example.com/mcp", "the scheme is `ftp`"),
            ("not a url", "not a URL"),
            ("file:///tmp/sock", "the scheme is `file`"),
            ("http://", "not a URL"),
            ("mailto:a@b.c", "the scheme is `mailto`"),
        ] {
            let e = http(url).validate("remote").unwrap_err();
            assert!(matches!(e, McpConfigError::BadUrl { .. }), "{url}: {e}");
            let text = e.to_string();
            assert!(
                text.starts_with("mcp_servers.remote.url: ")
                    && text.contains("give an http:// or https:// URL with a host")
                    && text.contains(why),
                "{url}: {text}"
            );
        }
        // Credentials in a refused URL are masked, as everywhere else.
        let text = http("ftp://alice:s3cr3t@example.com/")
            .validate("remote")
            .unwrap_err()
            .to_string();
        assert!(!text.contains("s3cr3t"), "{text}");
        for ok in [
            "http://127.0.0.1:8000/mcp",
            "https://example.com/mcp",
            "HTTPS://Example.com",
            "http://[::1]:9/mcp",
        ] {
            assert_eq!(http(ok).validate("remote"), Ok(()), "{ok}");
        }
    }

    #[test]
    fn env_entries_a_process_environment_cannot_hold_are_refused() {
        let stdio = |var: &str, value: &str| McpServerConfig {
            command: Some("server".into()),
            env: BTreeMap::from([(var.to_string(), value.to_string())]),
            ..Default::default()
        };
        for (var, value, why) in [
            ("A=B", "x", "cannot hold `=`"),
            ("", "x", "needs a name"),
            ("A\0B", "x", "NUL"),
            ("TOKEN", "x\0y", "NUL"),
        ] {
            let text = stdio(var, value).validate("local").unwrap_err().to_string();
            assert!(
                text.starts_with("mcp_servers.local.env: ") && text.contains(why),
                "{var:?}: {text}"
            );
        }
        assert_eq!(stdio("API_TOKEN", "a=b c").validate("local"), Ok(()));
    }
}
