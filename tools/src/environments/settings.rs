//! The `terminal.*` backend keys of config.yaml (SPEC §9), checked once at start-up.
//!
//! Names follow the system this product replaces, so existing configs keep working. A wrong
//! type, an unknown backend or a key the chosen backend cannot do without is an error naming
//! the key: the CLI turns it into exit code 2 before anything runs.

use crate::config_file::ConfigFile;
use std::path::PathBuf;
use std::time::Duration;

/// Default `terminal.lifetime_seconds`.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);

/// Which backend runs commands, tools and scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendKind {
    /// This machine.
    #[default]
    Local,
    /// A container per task (docker or podman CLI).
    Docker,
    /// A remote host over one OpenSSH ControlMaster connection.
    Ssh,
    /// A Modal sandbox per task, driven through the official SDK in a sidecar.
    Modal,
    /// A Daytona sandbox per task, through the service's REST API.
    Daytona,
    /// An Apptainer/Singularity instance per task (HPC clusters without Docker).
    Singularity,
}

impl BackendKind {
    /// The name as written in config.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Local => "local",
            BackendKind::Docker => "docker",
            BackendKind::Ssh => "ssh",
            BackendKind::Modal => "modal",
            BackendKind::Daytona => "daytona",
            BackendKind::Singularity => "singularity",
        }
    }
}

/// Known-hosts policy of the ssh backend (`terminal.ssh_known_hosts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KnownHosts {
    /// `StrictHostKeyChecking=yes` against the user's known_hosts (default).
    Strict,
    /// `accept-new`: trust on first use, refuse changed keys.
    AcceptNew,
    /// Check against this file only.
    File(PathBuf),
}

/// One `terminal.docker_volumes` entry: `host:container[:ro]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    /// Host path.
    pub host: PathBuf,
    /// Path inside the container.
    pub container: String,
    /// Mounted read-only.
    pub read_only: bool,
}

/// Every backend setting, with defaults applied.
#[derive(Debug, Clone)]
pub struct BackendSettings {
    /// `terminal.backend`.
    pub backend: BackendKind,
    /// `terminal.cwd`: the working dir inside the backend.
    pub cwd: Option<String>,
    /// `terminal.lifetime_seconds`: idle time before an environment is stopped.
    pub lifetime: Duration,
    /// `terminal.python`: interpreter inside the backend.
    pub python: String,
    /// `terminal.docker_image`.
    pub docker_image: Option<String>,
    /// `terminal.docker_volumes`.
    pub docker_volumes: Vec<Volume>,
    /// `terminal.docker_mount_cwd_to_workspace`: mount the session dir at /workspace.
    pub docker_mount_cwd_to_workspace: bool,
    /// `terminal.docker_network`: `none` unless configured.
    pub docker_network: String,
    /// `terminal.docker_binary`: `docker` or `podman` (or a path).
    pub docker_binary: String,
    /// `terminal.container_cpu`: CPUs.
    pub container_cpu: Option<f64>,
    /// `terminal.container_memory`: MB.
    pub container_memory: Option<u64>,
    /// `terminal.container_disk`: MB (daytona rounds up to whole GiB).
    pub container_disk: Option<u64>,
    /// `terminal.daytona_image`: the image a new Daytona sandbox is built from (the service's
    /// default snapshot when unset).
    pub daytona_image: Option<String>,
    /// `terminal.singularity_image`: a SIF file, a sandbox dir or a `docker://` reference
    /// (built once into a cached SIF).
    pub singularity_image: Option<String>,
    /// `terminal.container_pids`: process limit.
    pub container_pids: u64,
    /// `terminal.container_persistent`: keep the container (stopped) instead of removing it.
    pub container_persistent: bool,
    /// `terminal.ssh_host`.
    pub ssh_host: Option<String>,
    /// `terminal.ssh_user`.
    pub ssh_user: Option<String>,
    /// `terminal.ssh_port`.
    pub ssh_port: Option<u16>,
    /// `terminal.ssh_key`.
    pub ssh_key: Option<PathBuf>,
    /// `terminal.ssh_known_hosts`: `strict` (default), `accept-new`, or a file path.
    pub ssh_known_hosts: KnownHosts,
    /// `terminal.modal_image`: a registry image (`python:3.12-slim`) or a Modal image id
    /// (`im-…`) for the modal backend.
    pub modal_image: Option<String>,
    /// `terminal.modal_python`: the host interpreter with the `modal` package that runs the
    /// SDK sidecar.
    pub modal_python: String,
    /// `terminal.shell_session`: `cd`/`export` persist between calls of one task.
    pub shell_session: bool,
    /// `terminal.agent_binary`: the vibeos-exec binary run as tool agent inside the backend.
    pub agent_binary: Option<PathBuf>,
    /// `approvals.skip_in_isolated_backends`.
    pub skip_approvals_isolated: bool,
    /// The host's session dir (for `docker_mount_cwd_to_workspace`), set by the host.
    pub host_cwd: Option<PathBuf>,
}

impl BackendSettings {
    /// Whether the backend mounts this host's session dir (`docker_mount_cwd_to_workspace`
    /// with docker or singularity): then the session dir is a host path, fixed when the
    /// container is made. Every other non-local backend takes its working dir by name over
    /// there (`terminal.cwd`, or a per-run override).
    pub fn mounts_host_cwd(&self) -> bool {
        self.docker_mount_cwd_to_workspace
            && matches!(self.backend, BackendKind::Docker | BackendKind::Singularity)
    }

    /// Whether a session dir given for a run (`--cwd`, `execute_code(cwd=...)`) names a
    /// directory inside the backend rather than on this host.
    pub fn cwd_is_remote(&self) -> bool {
        self.backend != BackendKind::Local && !self.mounts_host_cwd()
    }
}

impl Default for BackendSettings {
    fn default() -> Self {
        BackendSettings {
            backend: BackendKind::Local,
            cwd: None,
            lifetime: DEFAULT_LIFETIME,
            python: "python3".into(),
            docker_image: None,
            docker_volumes: Vec::new(),
            docker_mount_cwd_to_workspace: false,
            docker_network: "none".into(),
            docker_binary: "docker".into(),
            container_cpu: None,
            container_memory: None,
            container_disk: None,
            daytona_image: None,
            singularity_image: None,
            container_pids: 512,
            container_persistent: false,
            ssh_host: None,
            ssh_user: None,
            ssh_port: None,
            ssh_key: None,
            ssh_known_hosts: KnownHosts::Strict,
            modal_image: None,
            modal_python: "python3".into(),
            shell_session: true,
            agent_binary: None,
            skip_approvals_isolated: true,
            host_cwd: None,
        }
    }
}

/// The backend settings are unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// `terminal.backend` (or `--backend`) names no backend.
    #[error(
        "unknown backend `{0}` (terminal.backend / --backend); use one of: local, docker, ssh, daytona, singularity, modal"
    )]
    UnknownBackend(String),
    /// The chosen backend needs a key that is not set.
    #[error("backend `{backend}` needs `{key}` in the config file; {hint}")]
    Missing {
        /// The backend.
        backend: &'static str,
        /// The key.
        key: &'static str,
        /// What to put there.
        hint: &'static str,
    },
    /// The chosen backend needs a variable in the environment (a credential, never config).
    #[error("backend `{backend}` needs the environment variable {var}; {hint}")]
    MissingEnv {
        /// The backend.
        backend: &'static str,
        /// The variable.
        var: &'static str,
        /// What to put there.
        hint: &'static str,
    },
    /// A key has the wrong type or value.
    #[error("`{key}` {problem}")]
    BadValue {
        /// Dotted key.
        key: String,
        /// What is wrong and what is expected.
        problem: String,
    },
}

fn bad(key: &str, problem: impl Into<String>) -> SettingsError {
    SettingsError::BadValue {
        key: key.into(),
        problem: problem.into(),
    }
}

/// Parses a backend name.
pub fn parse_backend(name: &str) -> Result<BackendKind, SettingsError> {
    match name.trim().to_ascii_lowercase().as_str() {
        "local" => Ok(BackendKind::Local),
        "docker" | "podman" => Ok(BackendKind::Docker),
        "ssh" => Ok(BackendKind::Ssh),
        "daytona" => Ok(BackendKind::Daytona),
        "singularity" | "apptainer" => Ok(BackendKind::Singularity),
        "modal" => Ok(BackendKind::Modal),
        _ => Err(SettingsError::UnknownBackend(name.into())),
    }
}

impl BackendSettings {
    /// Reads the settings from the parsed config.yaml; `backend_override` is `--backend`.
    /// Types and unknown keys were checked when the file was parsed; this checks values.
    pub fn from_document(
        doc: &ConfigFile,
        backend_override: Option<&str>,
    ) -> Result<BackendSettings, SettingsError> {
        let mut s = BackendSettings::default();
        let t = doc.terminal.clone().unwrap_or_default();
        let string = |key: &str, v: Option<String>| -> Result<Option<String>, SettingsError> {
            match v {
                None => Ok(None),
                Some(v) if !v.trim().is_empty() => Ok(Some(v)),
                Some(_) => Err(bad(
                    &format!("terminal.{key}"),
                    "must be a non-empty string",
                )),
            }
        };
        let number = |key: &str, v: Option<f64>| -> Result<Option<f64>, SettingsError> {
            match v {
                None => Ok(None),
                Some(n) if n.is_finite() && n > 0.0 => Ok(Some(n)),
                Some(_) => Err(bad(&format!("terminal.{key}"), "must be a positive number")),
            }
        };
        let backend_name = match backend_override {
            Some(b) => Some(b.to_string()),
            None => string("backend", t.backend)?,
        };
        if let Some(name) = backend_name {
            s.backend = parse_backend(&name)?;
            if name.trim().eq_ignore_ascii_case("podman") {
                s.docker_binary = "podman".into();
            }
        }
        s.cwd = string("cwd", t.cwd)?;
        // The working dir on the backend's side, where nothing says what a relative one is
        // relative to: refused here (exit 2) rather than by the first execution.
        if s.cwd.as_deref().is_some_and(|c| !c.starts_with('/')) {
            return Err(bad(
                "terminal.cwd",
                "must be an absolute path on the backend's side (e.g. /workspace)",
            ));
        }
        if let Some(n) = number("lifetime_seconds", t.lifetime_seconds)? {
            s.lifetime = Duration::from_secs_f64(n.min(30.0 * 86_400.0));
        }
        if let Some(p) = string("python", t.python)? {
            s.python = p;
        }
        s.docker_image = string("docker_image", t.docker_image)?;
        for (i, text) in t.docker_volumes.unwrap_or_default().iter().enumerate() {
            let key = format!("terminal.docker_volumes[{i}]");
            s.docker_volumes
                .push(parse_volume(text).map_err(|p| bad(&key, p))?);
        }
        if let Some(b) = t.docker_mount_cwd_to_workspace {
            s.docker_mount_cwd_to_workspace = b;
        }
        if let Some(n) = string("docker_network", t.docker_network)? {
            s.docker_network = n;
        }
        if let Some(b) = string("docker_binary", t.docker_binary)? {
            s.docker_binary = b;
        }
        s.container_cpu = number("container_cpu", t.container_cpu)?;
        s.container_memory =
            number("container_memory", t.container_memory)?.map(|m| m.ceil() as u64);
        // docker refuses a memory limit below 6 MB ("Minimum memory limit allowed is 6MB")
        // only when the container is made; no backend runs Python in less.
        if s.container_memory.is_some_and(|m| m < MIN_MEMORY_MB) {
            return Err(bad(
                "terminal.container_memory",
                format!(
                    "must be at least {MIN_MEMORY_MB} (MB): docker refuses a smaller memory limit"
                ),
            ));
        }
        s.container_disk = number("container_disk", t.container_disk)?.map(|m| m.ceil() as u64);
        s.daytona_image = string("daytona_image", t.daytona_image)?;
        s.singularity_image = string("singularity_image", t.singularity_image)?;
        if let Some(p) = number("container_pids", t.container_pids)? {
            s.container_pids = p as u64;
        }
        if let Some(b) = t.container_persistent {
            s.container_persistent = b;
        }
        s.ssh_host = string("ssh_host", t.ssh_host)?;
        s.ssh_user = string("ssh_user", t.ssh_user)?;
        // ssh would read a leading `-` as an option (`-oProxyCommand=…`) and print its usage
        // text; refuse it here with a message naming the key.
        for (key, value) in [
            ("terminal.ssh_host", &s.ssh_host),
            ("terminal.ssh_user", &s.ssh_user),
        ] {
            if let Some(v) = value {
                if v.is_empty()
                    || v.starts_with('-')
                    || v.chars().any(|c| c.is_whitespace() || c.is_control())
                {
                    return Err(bad(
                        key,
                        "is not a valid name: it must not be empty, start with `-` or contain spaces or control characters",
                    ));
                }
            }
        }
        // `docker run`/`apptainer instance start` would read a leading `-` as an option
        // (`--privileged`, `--volume=/:/host`): an image reference never starts with one.
        for (key, value) in [
            ("terminal.docker_image", &s.docker_image),
            ("terminal.singularity_image", &s.singularity_image),
        ] {
            if let Some(v) = value {
                if !image_reference_ok(v) {
                    return Err(bad(
                        key,
                        "is not a valid image reference: it must not be empty, start with `-` or contain spaces or control characters",
                    ));
                }
            }
        }
        if let Some(p) = t.ssh_port {
            let port = u16::try_from(p)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| bad("terminal.ssh_port", "must be a port number 1-65535"))?;
            s.ssh_port = Some(port);
        }
        s.ssh_key = string("ssh_key", t.ssh_key)?.map(PathBuf::from);
        if let Some(k) = string("ssh_known_hosts", t.ssh_known_hosts)? {
            s.ssh_known_hosts = match k.as_str() {
                "strict" | "yes" => KnownHosts::Strict,
                "accept-new" => KnownHosts::AcceptNew,
                // `~/` as ssh_key takes it: ssh expands it (from the user's passwd entry).
                path if path.starts_with('/') || path.starts_with("~/") => {
                    KnownHosts::File(PathBuf::from(path))
                }
                _ => {
                    return Err(bad(
                        "terminal.ssh_known_hosts",
                        "must be strict, accept-new or the path of a known_hosts file, absolute or under ~/",
                    ))
                }
            };
        }
        s.modal_image = string("modal_image", t.modal_image)?;
        if let Some(p) = string("modal_python", t.modal_python)? {
            s.modal_python = p;
        }
        if let Some(b) = t.shell_session {
            s.shell_session = b;
        }
        s.agent_binary = string("agent_binary", t.agent_binary)?.map(PathBuf::from);
        if let Some(b) = doc
            .approvals
            .as_ref()
            .and_then(|a| a.skip_in_isolated_backends)
        {
            s.skip_approvals_isolated = b;
        }
        match s.backend {
            BackendKind::Docker if s.docker_image.is_none() => {
                return Err(SettingsError::Missing {
                    backend: "docker",
                    key: "terminal.docker_image",
                    hint: "name an image with a Python 3 interpreter (e.g. python:3.12-slim)",
                })
            }
            BackendKind::Ssh if s.ssh_host.is_none() => {
                return Err(SettingsError::Missing {
                    backend: "ssh",
                    key: "terminal.ssh_host",
                    hint: "name the host to run on",
                })
            }
            BackendKind::Singularity if s.singularity_image.is_none() => {
                return Err(SettingsError::Missing {
                    backend: "singularity",
                    key: "terminal.singularity_image",
                    hint: "name a SIF file or a docker:// image with a Python 3 interpreter",
                })
            }
            BackendKind::Daytona
                if std::env::var("DAYTONA_API_KEY").map_or(true, |k| k.trim().is_empty()) =>
            {
                return Err(SettingsError::MissingEnv {
                    backend: "daytona",
                    var: "DAYTONA_API_KEY",
                    hint: "export the API key of your Daytona organization (and DAYTONA_API_URL for a self-hosted service)",
                })
            }
            BackendKind::Daytona => daytona_url_usable()?,
            BackendKind::Modal => modal_required(&s)?,
            _ => {}
        }
        Ok(s)
    }
}

/// A `DAYTONA_API_URL` that is set must be an http(s) URL: anything else failed only at the
/// first request, as a runtime error (exit 1) that read like a network problem.
fn daytona_url_usable() -> Result<(), SettingsError> {
    let Some(url) = std::env::var("DAYTONA_API_URL")
        .ok()
        .map(|u| u.trim().to_string())
        .filter(|u| !u.is_empty())
    else {
        return Ok(());
    };
    let scheme_ok = ["http://", "https://"].iter().any(|p| {
        url.len() > p.len()
            && url
                .get(..p.len())
                .is_some_and(|s| s.eq_ignore_ascii_case(p))
    });
    if scheme_ok && reqwest::Url::parse(&url).is_ok_and(|u| u.host_str().is_some()) {
        return Ok(());
    }
    Err(bad(
        "DAYTONA_API_URL",
        format!(
            "is {url:?}, which is not an http(s) URL; set it to the service's API address \
             (https://HOST/api), or unset it for the public service"
        ),
    ))
}

/// What the modal backend cannot start without: an image and both token variables (read
/// here, by the supervisor, and handed to the SDK sidecar alone).
fn modal_required(s: &BackendSettings) -> Result<(), SettingsError> {
    if s.modal_image.is_none() {
        return Err(SettingsError::Missing {
            backend: "modal",
            key: "terminal.modal_image",
            hint: "name a registry image with Python 3 (e.g. python:3.12-slim) or a Modal image id (im-…)",
        });
    }
    for var in ["MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"] {
        if std::env::var_os(var).is_none_or(|v| v.is_empty()) {
            return Err(SettingsError::MissingEnv {
                backend: "modal",
                var,
                hint: "create a token with `modal token new` (or in the Modal dashboard) and export MODAL_TOKEN_ID and MODAL_TOKEN_SECRET",
            });
        }
    }
    Ok(())
}

fn parse_volume(text: &str) -> Result<Volume, String> {
    let parts: Vec<&str> = text.split(':').collect();
    let (host, container, read_only) = match parts.as_slice() {
        [h, c] => (*h, *c, false),
        [h, c, "ro"] => (*h, *c, true),
        [h, c, "rw"] => (*h, *c, false),
        _ => {
            return Err(format!(
                "{text:?} must be host:container or host:container:ro"
            ))
        }
    };
    if !host.starts_with('/') || !container.starts_with('/') {
        return Err(format!("{text:?}: both paths must be absolute"));
    }
    // Over (or inside) a path the product mounts itself, a volume breaks the container:
    // docker made an empty root-owned `vibeos-exec` file in the host dir for the agent's
    // mount, or refused the RPC dir's as a "Duplicate mount point" only at run time.
    let target = normal_path(container);
    for ours in [super::docker::AGENT_PATH, super::docker::RPC_MOUNT] {
        let ours = std::path::Path::new(ours);
        if target.starts_with(ours) || ours.starts_with(&target) {
            return Err(format!(
                "{text:?}: the container path {} would cover or be inside {}, which vibeos-exec \
                 mounts itself; choose another container path",
                target.display(),
                ours.display()
            ));
        }
    }
    Ok(Volume {
        host: PathBuf::from(host),
        container: container.to_string(),
        read_only,
    })
}

/// The smallest `terminal.container_memory` (MB): docker's minimum memory limit.
pub const MIN_MEMORY_MB: u64 = 6;

/// `path` (absolute) with `.`, `..`, repeated and trailing slashes resolved as docker does.
fn normal_path(path: &str) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in std::path::Path::new(path).components() {
        match c {
            std::path::Component::Normal(n) => out.push(n),
            std::path::Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// Whether `image` can only be read as an image reference by a container CLI: not empty, no
/// leading `-` (an option), no blanks or control characters.
pub(crate) fn image_reference_ok(image: &str) -> bool {
    !image.is_empty()
        && !image.starts_with('-')
        && !image.chars().any(|c| c.is_whitespace() || c.is_control())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parse(text: &str, over: Option<&str>) -> Result<BackendSettings, SettingsError> {
        let doc = ConfigFile::parse(text, std::path::Path::new("/t/config.yaml")).unwrap();
        BackendSettings::from_document(&doc, over)
    }

    #[test]
    fn reads_the_docker_keys() {
        let s = parse(
            "terminal:\n  backend: docker\n  docker_image: img\n  docker_volumes: ['/a:/b:ro', '/c:/d']\n  container_cpu: 1.5\n  container_memory: 512\n  container_persistent: true\n  lifetime_seconds: 10\n  python: python3.11\n",
            None,
        )
        .unwrap();
        assert_eq!(s.backend, BackendKind::Docker);
        assert_eq!(s.docker_volumes.len(), 2);
        assert!(s.docker_volumes[0].read_only);
        assert_eq!(s.container_memory, Some(512));
        assert_eq!(s.lifetime, Duration::from_secs(10));
        assert_eq!(s.python, "python3.11");
    }

    #[test]
    fn errors_name_the_backend_or_key() {
        let e = parse("terminal:\n  backend: docker\n", None).unwrap_err();
        assert!(e.to_string().contains("terminal.docker_image"), "{e}");
        let e = parse("{}", Some("ssh")).unwrap_err();
        assert!(e.to_string().contains("terminal.ssh_host"), "{e}");
        let e = parse("{}", Some("modal")).unwrap_err();
        assert!(e.to_string().contains("terminal.modal_image"), "{e}");
        let e = parse("{}", Some("kubernetes")).unwrap_err();
        assert!(e.to_string().contains("kubernetes"), "{e}");
        let e = parse("terminal:\n  ssh_port: 70000\n", None).unwrap_err();
        assert!(e.to_string().contains("terminal.ssh_port"), "{e}");
        let e = parse("terminal:\n  docker_volumes: ['rel:/x']\n", None).unwrap_err();
        assert!(e.to_string().contains("docker_volumes[0]"), "{e}");
        // A known_hosts file under ~/ is taken as ssh_key's is (ssh expands both).
        let s = parse("terminal:\n  ssh_known_hosts: ~/.ssh/lab_hosts\n", None).unwrap();
        assert!(
            matches!(&s.ssh_known_hosts, KnownHosts::File(p) if p.as_os_str() == "~/.ssh/lab_hosts")
        );
        let e = parse("terminal:\n  ssh_known_hosts: rel/hosts\n", None).unwrap_err();
        assert!(e.to_string().contains("terminal.ssh_known_hosts"), "{e}");
        let e = parse("terminal:\n  cwd: relative/dir\n", None).unwrap_err();
        assert!(e.to_string().contains("terminal.cwd"), "{e}");
        assert_eq!(
            parse("terminal:\n  cwd: /srv/app\n", None)
                .unwrap()
                .cwd
                .as_deref(),
            Some("/srv/app")
        );
        assert_eq!(
            parse("{}", None).unwrap().backend,
            BackendKind::Local,
            "local is the default"
        );
    }
}
