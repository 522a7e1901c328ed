//! The host's side of the backend choice: reading it from config and `--backend`, activating
//! it for a run or a server, stopping its environments at exit, `backends gc` and doctor's
//! backend report. The backends themselves live in `vibeos_tools::environments`.

use crate::config::Config;
use serde_json::{json, Value};
use std::path::Path;
use vibeos_tools::environments::{self, BackendKind, BackendSettings, SettingsError};

/// The backend settings of `config`, `--backend` applied. The error names the backend or key.
pub fn settings(config: &Config, flag: Option<&str>) -> Result<BackendSettings, String> {
    BackendSettings::from_document(&config.file, flag).map_err(|e| in_file(&e, config, flag))
}

/// The error, naming the config file when the file is what is wrong (a bad or missing
/// `terminal.*` value, a backend named by `terminal.backend`), as every other config error
/// does; a `--backend` flag or a missing environment variable is not the file's.
fn in_file(e: &SettingsError, config: &Config, flag: Option<&str>) -> String {
    let from_file = match e {
        SettingsError::Missing { .. } | SettingsError::BadValue { .. } => true,
        SettingsError::UnknownBackend(_) => flag.is_none(),
        SettingsError::MissingEnv { .. } => false,
    };
    match &config.source {
        Some(path) if from_file => format!("config file {}: {e}", path.display()),
        _ => e.to_string(),
    }
}

/// The backend `flag` or the configuration selects, by name only: for what needs no more of
/// its settings (`env audit` tells what a script there would get before they are complete).
pub fn selected_kind(config: &Config, flag: Option<&str>) -> Result<BackendKind, String> {
    let configured = config
        .file
        .terminal
        .as_ref()
        .and_then(|t| t.backend.clone());
    match flag.map(str::to_string).or(configured) {
        None => Ok(BackendKind::Local),
        Some(name) => {
            environments::settings::parse_backend(&name).map_err(|e| in_file(&e, config, flag))
        }
    }
}

/// Makes `settings` the process's backend; `cwd` is the session dir (`--cwd`) a container may
/// mount at /workspace.
pub fn activate(mut settings: BackendSettings, cwd: Option<&Path>) {
    environments::session::set_enabled(settings.shell_session);
    settings.host_cwd = match cwd {
        Some(c) => Some(c.to_path_buf()),
        None => crate::request::session_cwd(None).ok(),
    };
    let kind = settings.backend;
    environments::activate(settings);
    if kind != BackendKind::Local {
        tracing::info!("backends: using the {} backend", kind.as_str());
    }
}

/// Stops every environment and forgets shell sessions (host exit).
pub fn shutdown() {
    environments::shutdown();
    environments::session::clear_all();
    environments::modal_sidecar::Sidecar::shutdown();
}

/// `vibeos-exec backends gc`: removes the containers and cloud sandboxes a crashed host left
/// (see [`crate::leftovers`]). Returns the exit code.
pub fn gc(settings: &BackendSettings, all: bool, json_out: bool) -> Result<u8, String> {
    crate::leftovers::gc(settings, all, json_out)
}

/// One line of doctor's backend report.
#[derive(Debug, Clone)]
pub struct BackendStatus {
    /// Backend name.
    pub name: &'static str,
    /// Whether config selects it.
    pub selected: bool,
    /// Whether its required keys are set.
    pub configured: bool,
    /// Reachable (with a detail) or why not.
    pub reachable: Result<String, String>,
}

/// Probes every backend: local always works; docker asks its engine; ssh opens (and closes) a
/// master connection when a host is configured; daytona lists sandboxes with the API key;
/// singularity asks its CLI's version; modal asks the API (through the SDK sidecar) whether it
/// takes the credentials, when modal is selected or configured.
pub fn report(settings: &BackendSettings) -> Vec<BackendStatus> {
    let docker_configured = settings.docker_image.is_some();
    let docker = environments::docker::probe(&settings.docker_binary)
        .map(|v| format!("{} engine {v}", settings.docker_binary))
        .map_err(|e| e.to_string());
    let ssh = match &settings.ssh_host {
        None => Err("terminal.ssh_host is not set".to_string()),
        Some(host) => {
            let mut s = settings.clone();
            s.backend = BackendKind::Ssh;
            match environments::ssh::SshEnv::start(&s, "doctor") {
                Ok(_env) => Ok(format!("connected to {host}")),
                Err(e) => Err(e.to_string()),
            }
        }
    };
    let modal = if settings.backend == BackendKind::Modal || settings.modal_image.is_some() {
        environments::modal::probe(&settings.modal_python).map_err(|e| e.to_string())
    } else {
        Err("terminal.modal_image is not set".to_string())
    };
    let daytona = environments::daytona::probe().map_err(|e| e.to_string());
    let singularity = environments::singularity::probe().map_err(|e| e.to_string());
    vec![
        BackendStatus {
            name: "local",
            selected: settings.backend == BackendKind::Local,
            configured: true,
            reachable: Ok("this machine".into()),
        },
        BackendStatus {
            name: "docker",
            selected: settings.backend == BackendKind::Docker,
            configured: docker_configured,
            reachable: docker,
        },
        BackendStatus {
            name: "ssh",
            selected: settings.backend == BackendKind::Ssh,
            configured: settings.ssh_host.is_some(),
            reachable: ssh,
        },
        BackendStatus {
            name: "daytona",
            selected: settings.backend == BackendKind::Daytona,
            configured: std::env::var_os("DAYTONA_API_KEY").is_some(),
            reachable: daytona,
        },
        BackendStatus {
            name: "singularity",
            selected: settings.backend == BackendKind::Singularity,
            configured: settings.singularity_image.is_some(),
            reachable: singularity,
        },
        BackendStatus {
            name: "modal",
            selected: settings.backend == BackendKind::Modal,
            configured: settings.modal_image.is_some()
                && std::env::var_os("MODAL_TOKEN_ID").is_some()
                && std::env::var_os("MODAL_TOKEN_SECRET").is_some(),
            reachable: modal,
        },
    ]
}

/// The report as text.
pub fn report_text(lines: &[BackendStatus]) -> String {
    let mut s = String::from("\nbackends:\n");
    for b in lines {
        s.push_str(&format!(
            "  {:<11} {}{}, {}\n",
            b.name,
            if b.selected { "selected, " } else { "" },
            if b.configured {
                "configured"
            } else {
                "not configured"
            },
            match &b.reachable {
                Ok(d) => format!("reachable ({d})"),
                // One line per backend: a client's message may carry its own line breaks
                // (ssh ends lines with \r\n).
                Err(e) => format!(
                    "not reachable: {}",
                    e.split_whitespace().collect::<Vec<_>>().join(" ")
                ),
            }
        ));
    }
    s
}

/// The report as JSON.
pub fn report_json(lines: &[BackendStatus]) -> Value {
    Value::Array(
        lines
            .iter()
            .map(|b| {
                json!({
                    "name": b.name,
                    "selected": b.selected,
                    "configured": b.configured,
                    "reachable": b.reachable.is_ok(),
                    "detail": match &b.reachable { Ok(d) | Err(d) => d },
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> Config {
        Config::parse(yaml, Path::new("/x/config.yaml")).unwrap()
    }

    #[test]
    fn errors_from_the_file_name_the_file() {
        // `terminal.backend: bogus` and `terminal.lifetime_seconds: -1` named neither the file
        // nor, for the first, which setting held the name.
        for (yaml, says) in [
            ("terminal:\n  backend: bogus\n", "unknown backend `bogus`"),
            (
                "terminal:\n  lifetime_seconds: -1\n",
                "`terminal.lifetime_seconds` must be a positive number",
            ),
            (
                "terminal:\n  backend: docker\n",
                "backend `docker` needs `terminal.docker_image`",
            ),
        ] {
            let e = settings(&config(yaml), None).unwrap_err();
            assert!(
                e.starts_with("config file /x/config.yaml: ") && e.contains(says),
                "{yaml}: {e}"
            );
        }
        let e = selected_kind(&config("terminal:\n  backend: bogus\n"), None).unwrap_err();
        assert!(e.starts_with("config file /x/config.yaml: "), "{e}");
        // A flag's mistake is the flag's, not the file's.
        for e in [
            settings(&config(""), Some("bogus")).unwrap_err(),
            selected_kind(&config(""), Some("bogus")).unwrap_err(),
        ] {
            assert!(e.starts_with("unknown backend `bogus`"), "{e}");
        }
    }
}
