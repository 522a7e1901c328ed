//! Tools beyond the built-ins (SPEC §7): configured MCP servers and plugins.
//!
//! The registry reads config.yaml's `mcp_servers:` after the built-ins and registers each
//! server's tools, then the plugins' (hosted by `python -m vibeos_exec.plugin_host`, an MCP
//! stdio server, since the CLI embeds no Python). This module turns the config into
//! [`ServerSpec`]s — checking each entry, and computing each stdio child's environment with the
//! same scrubbing policy as execute_code ([`crate::env_policy`], one source of truth) — and
//! hands them to the tools crate's MCP client. The CLI, the Python package and the MCP server
//! all call [`load`].

use crate::config::{vibeos_home, Config, Mode};
use crate::env_policy::EnvPolicy;
use crate::interpreter::Resolution;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
pub use vibeos_tools::mcp_client::PluginsConfig;
use vibeos_tools::mcp_client::{McpManager, McpServerConfig, ServerKind, ServerSpec};
use vibeos_tools::ToolRegistry;

/// Name of the plugin host's server (and its row in `tools list`); defined with the MCP client,
/// below the config module that refuses it as an `mcp_servers` name.
pub use vibeos_tools::mcp_client::PLUGIN_HOST;

/// The environment of a stdio server: this process's environment scrubbed by the execute_code
/// policy (`terminal.env_passthrough` applies), `HOME` and `TZ` kept, then the server's
/// explicit `env:` entries. An explicit entry is the operator's own choice and is passed even
/// when its name is a provider credential the policy would drop from the inherited
/// environment; it is logged (name only) so the choice is visible.
pub fn server_env(
    server: &str,
    config: &Config,
    explicit: &std::collections::BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let parent: Vec<(std::ffi::OsString, std::ffi::OsString)> = std::env::vars_os().collect();
    let passthrough: BTreeSet<String> = config.env_passthrough.iter().cloned().collect();
    let mut env: Vec<(String, String)> = match EnvPolicy::builtin() {
        Ok(policy) => {
            for name in explicit.keys() {
                if policy.is_provider_credential(std::ffi::OsStr::new(name)) {
                    tracing::info!(
                        "MCP server `{server}`: passing provider credential {name} because \
                         mcp_servers.{server}.env sets it explicitly"
                    );
                }
            }
            // Quiet: the dropped VIBEOS_* names are execute_code's line, logged once per
            // execution (SPEC §4), not once more per server.
            policy
                .scrub_quiet(parent.clone(), &passthrough)
                .kept
                .into_iter()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect()
        }
        Err(e) => {
            // Fail closed: no inherited variables at all rather than unscrubbed ones.
            tracing::error!("MCP server `{server}`: {e}; starting it with only its own env");
            Vec::new()
        }
    };
    for keep in ["HOME", "TZ", "PATH"] {
        if !env.iter().any(|(k, _)| k == keep) {
            if let Some(v) = std::env::var_os(keep).and_then(|v| v.into_string().ok()) {
                env.push((keep.to_string(), v));
            }
        }
    }
    env.retain(|(k, _)| !explicit.contains_key(k));
    env.extend(explicit.iter().map(|(k, v)| (k.clone(), v.clone())));
    env
}

/// The server specs of config.yaml: `mcp_servers:` entries in file order (bad ones logged with
/// their name and skipped), then the plugin host unless `plugins.enabled` is false. The project
/// plugin dir is that of the session cwd (`cwd`, else `$TERMINAL_CWD`, else this process's).
pub fn specs(config: &Config, cwd: Option<&Path>) -> Vec<ServerSpec> {
    let mut out = mcp_server_specs(config);
    if let Some(spec) = plugin_host_spec(config, cwd) {
        out.push(spec);
    }
    out
}

/// The `mcp_servers:` specs alone (a Python host loads its plugins in-process instead).
pub fn mcp_server_specs(config: &Config) -> Vec<ServerSpec> {
    let mut out = Vec::new();
    let Some(servers) = &config.file.mcp_servers else {
        return out;
    };
    for (name, cfg) in servers {
        if let Err(e) = cfg.validate(name) {
            let file = config
                .source
                .as_ref()
                .map_or(String::new(), |p| format!("config file {}: ", p.display()));
            tracing::warn!("MCP server `{name}` skipped: {file}{e}");
            continue;
        }
        let env = cfg
            .command
            .is_some()
            .then(|| server_env(name, config, &cfg.env));
        out.push(ServerSpec {
            name: name.clone(),
            config: cfg.clone(),
            env,
            kind: ServerKind::Mcp,
            start_hint: None,
        });
    }
    out
}

/// The plugin dirs the host loads, in order: `$VIBEOS_HOME/plugins`, the project's
/// `<cwd>/.vibeos/plugins` (not in strict mode, which is for scripts and projects nobody
/// vouched for: a planted project plugin would run with the operator's rights), then
/// `plugins.dirs`.
pub fn plugin_dirs(config: &Config, cwd: Option<&Path>) -> Vec<PathBuf> {
    let plugins = config.file.plugins.clone().unwrap_or_default();
    let mut dirs = vec![vibeos_home().join("plugins")];
    if config.mode == Mode::Strict {
        tracing::debug!("strict mode: the project's .vibeos/plugins are not loaded");
    } else if let Ok(cwd) = crate::request::session_cwd(cwd) {
        dirs.push(cwd.join(".vibeos").join("plugins"));
    }
    dirs.extend(plugins.dirs.iter().cloned());
    dirs
}

/// How long the plugin host may spend importing one plugin: a third of its start-up bound, so
/// a hung plugin is reported by name and the others still start in time.
fn import_timeout(connect_timeout: Option<f64>) -> f64 {
    let connect = connect_timeout
        .filter(|t| t.is_finite() && *t > 0.0)
        .unwrap_or(vibeos_tools::mcp_client::DEFAULT_CONNECT_TIMEOUT.as_secs_f64());
    (connect / 3.0).clamp(0.5, 20.0)
}

/// The plugin host's spec, or `None` when plugins are disabled or misconfigured (logged).
pub fn plugin_host_spec(config: &Config, cwd: Option<&Path>) -> Option<ServerSpec> {
    let plugins = config.file.plugins.clone().unwrap_or_default();
    if plugins.enabled == Some(false) {
        return None;
    }
    let dirs = plugin_dirs(config, cwd);
    // Without a plugin directory the host runs only when entry points are asked for
    // explicitly: no Python start-up per CLI call for users who have no plugins (and no
    // warning about an interpreter they do not need).
    if !dirs.iter().any(|d| d.is_dir()) && plugins.entry_points != Some(true) {
        return None;
    }
    let python = match plugins.python.clone() {
        Some(p) => p,
        None => match Resolution::from_env(config.python.clone())
            .with_host(config.host_python.clone())
            .default_interpreter()
        {
            Ok(i) => i.path,
            Err(e) => {
                tracing::warn!("plugins skipped: no Python interpreter for the plugin host: {e}");
                return None;
            }
        },
    };
    let mut args = vec!["-m".to_string(), "vibeos_exec.plugin_host".to_string()];
    for d in &dirs {
        // One word, so a dir starting with `-` is not taken for an option.
        args.push(format!("--dir={}", d.display()));
    }
    args.push(format!(
        "--import-timeout={}",
        import_timeout(plugins.connect_timeout)
    ));
    if plugins.entry_points == Some(false) {
        args.push("--no-entry-points".into());
    }
    let command = python.display().to_string();
    let cfg = McpServerConfig {
        command: Some(command.clone()),
        args,
        startup: plugins.startup,
        timeout: plugins.timeout,
        connect_timeout: plugins.connect_timeout,
        ..McpServerConfig::default()
    };
    let env = server_env(PLUGIN_HOST, config, &Default::default());
    Some(ServerSpec {
        name: PLUGIN_HOST.into(),
        config: cfg,
        env: Some(env),
        kind: ServerKind::Plugins,
        start_hint: Some(format!(
            "the plugin host runs `{command} -m vibeos_exec.plugin_host`: if the log says \
             `No module named vibeos_exec`, install the package for that interpreter \
             (or set plugins.python); plugins skipped"
        )),
    })
}

/// Registers the configured MCP servers and plugins into `registry`: eager servers start now,
/// lazy ones on the first definitions build. Failures are logged by name and skipped. Keep the
/// returned manager and call [`McpManager::shutdown`] on exit.
pub fn load(config: &Config, registry: &'static ToolRegistry) -> Arc<McpManager> {
    load_in(config, registry, None)
}

/// [`load`] for a session whose cwd is `cwd` (`run --cwd`, `serve --cwd`): its project plugins.
pub fn load_in(
    config: &Config,
    registry: &'static ToolRegistry,
    cwd: Option<&Path>,
) -> Arc<McpManager> {
    McpManager::start(specs(config, cwd), registry)
}

/// [`load`] without the plugin host: for hosts that load plugins in their own Python
/// (`vibeos_exec.load_plugins()`).
pub fn load_mcp_servers(config: &Config, registry: &'static ToolRegistry) -> Arc<McpManager> {
    McpManager::start(mcp_server_specs(config), registry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use vibeos_tools::mcp_client::Startup;

    fn config(yaml: &str) -> Config {
        Config::parse(yaml, Path::new("/test/config.yaml")).unwrap()
    }

    #[test]
    fn entries_are_parsed_and_bad_ones_skipped_by_name() {
        let cfg = config(
            "mcp_servers:\n  good:\n    command: srv\n    args: [a, b]\n    startup: eager\n    script_callable: [t1]\n  http:\n    url: http://127.0.0.1:9/mcp\n    headers: {X-A: b}\n  both:\n    command: x\n    url: http://x\n  slow:\n    command: x\n    timeout: -1\n  bad.name:\n    command: x\nplugins:\n  enabled: false\n",
        );
        let specs = specs(&cfg, None);
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["good", "http"]);
        assert_eq!(specs[0].config.args, ["a", "b"]);
        assert_eq!(specs[0].config.startup, Startup::Eager);
        assert_eq!(
            specs[0].config.script_callable.opened(),
            Some(Some(["t1".to_string()].into()))
        );
        assert!(specs[0].env.is_some(), "stdio servers get a computed env");
        assert!(specs[1].env.is_none(), "HTTP servers start no process");
        assert_eq!(specs[1].config.startup, Startup::Lazy);
    }

    #[test]
    fn a_mistyped_entry_or_section_is_a_config_error_naming_it() {
        let parse = |yaml: &str| {
            Config::parse(yaml, Path::new("/test/config.yaml"))
                .unwrap_err()
                .to_string()
        };
        let e = parse("mcp_servers:\n  typo:\n    comand: x\n");
        assert!(
            e.starts_with("/test/config.yaml: mcp_servers.typo") && e.contains("comand"),
            "{e}"
        );
        let e = parse("mcp_servers: [a, b]\n");
        assert!(e.starts_with("/test/config.yaml: mcp_servers: "), "{e}");
        let e = parse("plugins:\n  dirs: 3\n");
        assert!(e.starts_with("/test/config.yaml: plugins.dirs: "), "{e}");
        assert!(mcp_server_specs(&config("plugins: {}\n")).is_empty());
    }

    #[test]
    fn server_env_scrubs_credentials_and_passes_explicit_entries() {
        // The test process's own env is the parent env here; a provider credential set in it
        // must not reach the server, an explicit value must.
        std::env::set_var("OPENAI_API_KEY", "sk-parent");
        let explicit: std::collections::BTreeMap<String, String> = [
            ("ANTHROPIC_API_KEY".to_string(), "from-config".to_string()),
            ("PATH".to_string(), "/custom/bin".to_string()),
        ]
        .into();
        let env = server_env("t", &Config::default(), &explicit);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("OPENAI_API_KEY"), None);
        assert_eq!(get("ANTHROPIC_API_KEY"), Some("from-config"));
        assert_eq!(get("PATH"), Some("/custom/bin"), "explicit entries win");
        assert_eq!(env.iter().filter(|(n, _)| n == "PATH").count(), 1);
    }

    #[test]
    fn the_project_plugins_are_the_session_cwds_and_not_loaded_in_strict_mode() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("proj");
        std::fs::create_dir_all(project.join(".vibeos/plugins")).unwrap();
        let dash = dir.path().join("-dashdir");
        std::fs::create_dir_all(&dash).unwrap();
        let yaml = |mode: &str| {
            format!(
                "code_execution:\n  mode: {mode}\nplugins:\n  python: /usr/bin/python3\n  \
                 entry_points: false\n  dirs: ['{}']\n",
                dash.display()
            )
        };
        let project_dir = format!("--dir={}", project.join(".vibeos/plugins").display());
        let spec = plugin_host_spec(&config(&yaml("project")), Some(&project)).unwrap();
        assert!(
            spec.config.args.contains(&project_dir),
            "{:?}",
            spec.config.args
        );
        // A dir starting with `-` travels as one word, not as an option of its own.
        assert!(spec
            .config
            .args
            .contains(&format!("--dir={}", dash.display())));
        assert!(spec
            .config
            .args
            .iter()
            .any(|a| a.starts_with("--import-timeout=")));
        // Strict mode: the project's plugins are not the operator's; they are not loaded.
        let spec = plugin_host_spec(&config(&yaml("strict")), Some(&project)).unwrap();
        assert!(
            !spec.config.args.contains(&project_dir),
            "{:?}",
            spec.config.args
        );
        assert_eq!(import_timeout(Some(30.0)), 10.0);
        assert_eq!(import_timeout(Some(600.0)), 20.0);
        assert_eq!(import_timeout(None), 10.0);
    }

    #[test]
    fn the_plugin_host_runs_only_with_a_plugin_dir_or_entry_points() {
        let dir = tempfile::tempdir().unwrap();
        let yaml = |extra: &str| {
            format!(
                "plugins:\n  python: /usr/bin/python3\n  entry_points: false\n  dirs: [{}]\n{extra}",
                dir.path().join("none").display()
            )
        };
        // No directory exists: no host.
        assert!(plugin_host_spec(&config(&yaml("")), None).is_none());
        std::fs::create_dir_all(dir.path().join("none")).unwrap();
        let spec = plugin_host_spec(&config(&yaml("")), None).expect("host with a plugin dir");
        assert_eq!(spec.kind, ServerKind::Plugins);
        assert_eq!(spec.config.command.as_deref(), Some("/usr/bin/python3"));
        assert!(spec
            .config
            .args
            .contains(&"vibeos_exec.plugin_host".to_string()));
        assert!(spec.config.args.contains(&"--no-entry-points".to_string()));
        let on = "plugins:\n  python: /usr/bin/python3\n  entry_points: true\n";
        assert!(
            plugin_host_spec(&config(on), None).is_some(),
            "entry points alone"
        );
        assert!(plugin_host_spec(
            &config("plugins:\n  enabled: false\n  entry_points: true\n"),
            None
        )
        .is_none());
        let e = Config::parse("plugins:\n  bogus: 1\n", Path::new("/test/config.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("plugins.bogus") && e.contains("unknown field"),
            "{e}"
        );
    }
}
