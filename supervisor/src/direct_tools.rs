//! Registry tools called directly, outside any script, by a host that runs in strict mode:
//! `serve --mode strict --toolsets …` offers them as MCP tools.
//!
//! A strict script's tool calls act only beneath its roots, and `terminal` is closed to it
//! (SPEC §6, `confine/tools.rs`). A direct call runs in the same process with the same rights
//! (root in CI), so without the same rules a client would reach through `read_file`,
//! `write_file` or `terminal` what no strict script can, and the operator's strict mode would be
//! strict for scripts only. [`DirectTools`] applies those rules to direct calls: which tools are
//! offered at all, and the path policy (and, for `terminal`, the scrubbed environment) each
//! call carries. In project mode it changes nothing.

use crate::config::{Config, Mode};
use crate::confine::{ConfineError, StrictOptions};
use crate::env_policy::EnvPolicy;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use vibeos_tools::ToolContext;

/// Why a direct call cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirectCallError {
    /// Strict mode does not offer this tool directly.
    #[error("`{tool}` is not offered: {reason}")]
    NotOffered {
        /// The tool.
        tool: String,
        /// Why, and what would offer it.
        reason: String,
    },
    /// `code_execution.strict` is unusable (a bad value, a root that does not exist): strict
    /// mode then refuses direct calls as it refuses executions, rather than run them unconfined.
    #[error("strict mode is misconfigured, so direct tool calls are refused: {0}")]
    Config(String),
}

/// How direct calls of one host are confined: nothing in project mode, the rules of strict
/// scripts in strict mode.
#[derive(Debug, Clone)]
pub struct DirectTools {
    /// `Some` in strict mode.
    strict: Option<StrictOptions>,
    /// `terminal.env_passthrough`, for the environment of commands in strict mode.
    passthrough: BTreeSet<String>,
}

impl DirectTools {
    /// The rules for a host configured with `config` (its mode after `--mode`).
    pub fn new(config: &Config) -> Self {
        DirectTools {
            strict: (config.mode == Mode::Strict).then(|| StrictOptions::from_config(config)),
            passthrough: config.env_passthrough.iter().cloned().collect(),
        }
    }

    /// Whether the host runs in strict mode.
    pub fn is_strict(&self) -> bool {
        self.strict.is_some()
    }

    /// Whether `tool` may be offered directly; every tool may in project mode.
    pub fn offered(&self, tool: &str) -> Result<(), DirectCallError> {
        match &self.strict {
            None => Ok(()),
            Some(options) => crate::confine::tools::direct_offer(options, tool).map_err(|reason| {
                DirectCallError::NotOffered {
                    tool: tool.to_string(),
                    reason,
                }
            }),
        }
    }

    /// The context of one direct call of `tool` in the session dir `cwd`. In strict mode it
    /// carries the strict path policy (session cwd plus the configured roots, built afresh for
    /// each call so a root replaced meanwhile is not held open), which also keeps `web_extract`
    /// on public hosts; `terminal`, when `code_execution.strict.terminal` opens it, gets the
    /// scrubbed execute_code environment (without a staging dir, `HOME` stays the host's).
    pub fn context(&self, tool: &str, cwd: &Path) -> Result<ToolContext, DirectCallError> {
        let mut ctx = ToolContext::agent(cwd);
        let Some(options) = &self.strict else {
            return Ok(ctx);
        };
        if let Some(problem) = &options.invalid {
            return Err(DirectCallError::Config(problem.clone()));
        }
        self.offered(tool)?;
        let policy = crate::confine::tools::direct_path_policy(options, cwd).map_err(|e| {
            DirectCallError::Config(match e {
                ConfineError::Config(problem) => problem,
                other => other.to_string(),
            })
        })?;
        ctx.paths = Some(Arc::new(policy));
        if tool == "terminal" {
            ctx.env = Some(Arc::new(scrubbed_env(
                std::env::vars_os(),
                &self.passthrough,
            )?));
        }
        Ok(ctx)
    }
}

/// `vars` scrubbed by the execute_code environment policy (`policies/env.json`) with the
/// configured passthrough: what a strict script's `terminal` commands get.
fn scrubbed_env(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
    passthrough: &BTreeSet<String>,
) -> Result<Vec<(String, String)>, DirectCallError> {
    let policy = EnvPolicy::builtin().map_err(|e| DirectCallError::Config(e.to_string()))?;
    // Quiet: a direct call is no execution, and the dropped VIBEOS_* names are execute_code's
    // line, logged once per execution (SPEC §4).
    Ok(policy
        .scrub_quiet(vars, passthrough)
        .kept
        .into_iter()
        // Commands take UTF-8 pairs; a name or value that is not UTF-8 is left out.
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> Config {
        Config::parse(yaml, Path::new("/x/config.yaml")).unwrap()
    }

    #[test]
    fn project_mode_offers_everything_and_confines_nothing() {
        let d = DirectTools::new(&config("code_execution:\n  mode: project\n"));
        assert!(!d.is_strict());
        for tool in ["terminal", "process", "read_file", "some_plugin_tool"] {
            assert_eq!(d.offered(tool), Ok(()), "{tool}");
        }
        let ctx = d.context("read_file", Path::new("/tmp")).unwrap();
        assert!(ctx.paths.is_none() && ctx.env.is_none());
    }

    #[test]
    fn strict_mode_offers_only_tools_it_can_confine() {
        let d = DirectTools::new(&config("code_execution:\n  mode: strict\n"));
        assert!(d.is_strict());
        for tool in [
            "read_file",
            "write_file",
            "patch",
            "search_files",
            "web_search",
            "web_extract",
            "execute_code",
        ] {
            assert_eq!(d.offered(tool), Ok(()), "{tool}");
        }
        for tool in ["terminal", "process"] {
            let e = d.offered(tool).unwrap_err().to_string();
            assert!(e.contains("code_execution.strict.terminal: true"), "{e}");
        }
        let e = d.offered("some_plugin_tool").unwrap_err().to_string();
        assert!(e.contains("cannot confine `some_plugin_tool`"), "{e}");
        let cwd = tempfile::tempdir().unwrap();
        assert!(matches!(
            d.context("terminal", cwd.path()),
            Err(DirectCallError::NotOffered { .. })
        ));
    }

    #[test]
    fn strict_terminal_opens_terminal_with_the_scrubbed_environment() {
        let d = DirectTools::new(&config(
            "code_execution:\n  mode: strict\n  strict:\n    terminal: true\n",
        ));
        assert_eq!(d.offered("terminal"), Ok(()));
        assert_eq!(d.offered("process"), Ok(()));
        let cwd = tempfile::tempdir().unwrap();
        let ctx = d.context("terminal", cwd.path()).unwrap();
        assert!(ctx.env.is_some(), "terminal gets the scrubbed environment");
        assert!(ctx.paths.is_some());
        let vars = [
            ("PATH", "/usr/bin"),
            ("OPENAI_API_KEY", "sk-1"),
            ("DEPLOY_TOKEN", "t"),
            ("MY_SETTING", "kept"),
        ]
        .map(|(k, v)| (k.into(), v.into()));
        let passthrough = BTreeSet::from(["MY_SETTING".to_string()]);
        let env = scrubbed_env(vars, &passthrough).unwrap();
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["PATH", "MY_SETTING"], "{env:?}");
    }

    #[test]
    fn strict_calls_act_beneath_the_cwd_and_the_configured_roots_only() {
        let cwd = tempfile::tempdir().unwrap();
        let read_root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        for dir in [&cwd, &read_root, &outside] {
            std::fs::write(dir.path().join("f.txt"), "x").unwrap();
        }
        let d = DirectTools::new(&config(&format!(
            "code_execution:\n  mode: strict\n  strict:\n    read_roots: [{}]\n",
            read_root.path().display()
        )));
        let ctx = d.context("read_file", cwd.path()).unwrap();
        let paths = ctx.paths.expect("a path policy");
        assert!(paths.open_read(&cwd.path().join("f.txt")).is_ok());
        assert!(paths.open_read(&read_root.path().join("f.txt")).is_ok());
        let e = paths.open_read(&outside.path().join("f.txt")).unwrap_err();
        assert_eq!(e.kind, "OutsideSandbox", "{e}");
        let e = paths
            .write_atomic(&read_root.path().join("g.txt"), b"y")
            .unwrap_err();
        assert_eq!(e.kind, "OutsideSandbox", "{e}");
        assert!(paths.write_atomic(&cwd.path().join("g.txt"), b"y").is_ok());
    }

    #[test]
    fn a_missing_root_refuses_strict_calls_instead_of_running_them_unconfined() {
        let d = DirectTools::new(&config(
            "code_execution:\n  mode: strict\n  strict:\n    write_roots: [/no/such/dir]\n",
        ));
        let cwd = tempfile::tempdir().unwrap();
        let e = d.context("read_file", cwd.path()).unwrap_err();
        assert!(matches!(e, DirectCallError::Config(_)), "{e}");
        assert!(e.to_string().contains("write_roots"), "{e}");
    }
}
