//! The singularity backend: one Apptainer (or SingularityCE) instance per task, for HPC
//! clusters where Docker is not allowed. See docs/backends.md, "singularity".
//!
//! Driven through the CLI: `apptainer`, falling back to `singularity`. The instance is started
//! with `--containall --no-home` (no host home, PID/IPC namespaces, a clean environment), a
//! writable tmpfs (or, with `container_persistent`, a per-task overlay directory kept between
//! runs), and only explicit binds: the per-environment RPC directory (like docker, sockets of
//! executions live in subdirectories), the vibeos-exec binary read-only as the tool agent, and
//! the session dir at /workspace when `docker_mount_cwd_to_workspace` asks for it. A
//! `docker://` image is built once into a SIF in the user's cache and reused. Commands run as
//! `exec instance://NAME sh -c <group wrapper>`, so a timeout kills their whole group there.

use super::agent::{agent_binary, AgentClient, AgentLaunch, AgentSocket};
use super::docker::{AGENT_PATH, RPC_MOUNT};
use super::process::{group_kill, group_wrapper};
use super::settings::BackendSettings;
use super::Site;
use super::{
    run_client, Channel, ClientProcess, CommandOutput, Connections, EnvError, Environment,
    ExecSpec, Spawned,
};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const BACKEND: &str = "singularity";
/// Instance start and stop; an image build has its own, longer limit.
const CLI_TIMEOUT: Duration = Duration::from_secs(120);
const BUILD_TIMEOUT: Duration = Duration::from_secs(1800);

/// The CLI to use: `apptainer` if on PATH, else `singularity`.
pub fn find_binary() -> Result<PathBuf, EnvError> {
    find_binary_in(std::env::var_os("PATH"))
}

/// [`find_binary`] on a given search path.
pub fn find_binary_in(path: Option<std::ffi::OsString>) -> Result<PathBuf, EnvError> {
    for name in ["apptainer", "singularity"] {
        let found = path
            .iter()
            .flat_map(std::env::split_paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file());
        if let Some(p) = found {
            return Ok(p);
        }
    }
    Err(EnvError::Unreachable {
        backend: BACKEND,
        message: "neither apptainer nor singularity is on PATH; install Apptainer (or load its module on the cluster)".into(),
    })
}

/// Where a `docker://` image is cached as a SIF: one file per reference, under `cache`.
pub fn sif_path(cache: &Path, image: &str) -> PathBuf {
    let name: String = image
        .trim_start_matches("docker://")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    cache.join(format!("{name}.sif"))
}

/// `build SIF docker://…`: run once per image, into a temporary name renamed into place.
pub fn build_args(sif_part: &Path, image: &str) -> Vec<String> {
    vec!["build".into(), sif_part.display().to_string(), image.into()]
}

/// What an instance is started with.
#[derive(Debug, Clone, PartialEq)]
pub struct InstancePlan {
    /// Instance name.
    pub name: String,
    /// SIF file, sandbox dir, or any image reference the CLI accepts.
    pub image: String,
    /// The per-environment RPC dir on the host (bound at [`RPC_MOUNT`]).
    pub rpc_dir: PathBuf,
    /// The tool agent binary on the host (bound read-only at [`AGENT_PATH`]).
    pub agent: PathBuf,
    /// A persistent overlay dir (container_persistent) instead of a writable tmpfs.
    pub overlay: Option<PathBuf>,
    /// The session dir, bound at /workspace.
    pub workspace: Option<PathBuf>,
    /// Extra `host:container[:ro]` binds (`terminal.docker_volumes`).
    pub binds: Vec<String>,
}

/// `instance start --containall --no-home … IMAGE NAME`.
pub fn start_args(plan: &InstancePlan) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "instance".into(),
        "start".into(),
        "--containall".into(),
        "--no-home".into(),
    ];
    match &plan.overlay {
        Some(dir) => {
            a.push("--overlay".into());
            a.push(dir.display().to_string());
        }
        None => a.push("--writable-tmpfs".into()),
    }
    let mut bind = |s: String| {
        a.push("--bind".into());
        a.push(s);
    };
    bind(format!("{}:{RPC_MOUNT}", plan.rpc_dir.display()));
    bind(format!("{}:{AGENT_PATH}:ro", plan.agent.display()));
    if let Some(ws) = &plan.workspace {
        bind(format!("{}:/workspace", ws.display()));
    }
    for b in &plan.binds {
        bind(b.clone());
    }
    a.push(plan.image.clone());
    a.push(plan.name.clone());
    a
}

/// `exec [--pwd DIR] instance://NAME sh -c LINE`.
pub fn exec_args(name: &str, pwd: Option<&str>, line: &str) -> Vec<String> {
    let mut a: Vec<String> = vec!["exec".into()];
    if let Some(p) = pwd {
        a.push("--pwd".into());
        a.push(p.into());
    }
    a.push(format!("instance://{name}"));
    a.extend(["sh".into(), "-c".into(), line.into()]);
    a
}

/// `instance stop NAME`.
pub fn stop_args(name: &str) -> Vec<String> {
    vec!["instance".into(), "stop".into(), name.into()]
}

fn cli(binary: &Path, args: &[String], timeout: Duration) -> Result<CommandOutput, EnvError> {
    let mut cmd = Command::new(binary);
    cmd.args(args);
    run_client(
        BACKEND,
        &mut cmd,
        b"",
        timeout,
        &format!(
            "{} {}",
            binary.display(),
            args.first().map(String::as_str).unwrap_or("")
        ),
    )
}

fn failed(what: &str, out: &CommandOutput) -> EnvError {
    EnvError::Command {
        backend: BACKEND,
        what: what.into(),
        message: out.stderr_text(),
    }
}

fn cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("vibeos-exec")
}

/// A running instance of one task.
pub struct SingularityEnv {
    binary: PathBuf,
    name: String,
    site: Site,
    persistent: bool,
    rpc_dir: PathBuf,
    agent: AgentClient,
}

impl SingularityEnv {
    /// Starts the instance of `task` (building a `docker://` image into the SIF cache first).
    pub fn start(settings: &BackendSettings, task: &str) -> Result<SingularityEnv, EnvError> {
        let binary = find_binary()?;
        let image = settings
            .singularity_image
            .clone()
            .ok_or(EnvError::Unreachable {
                backend: BACKEND,
                message: "terminal.singularity_image is not set".into(),
            })?;
        let image = if image.starts_with("docker://") {
            let dir = cache_dir().join("sif");
            std::fs::create_dir_all(&dir).map_err(|e| io("create the SIF cache", &dir, &e))?;
            let sif = sif_path(&dir, &image);
            if !sif.exists() {
                tracing::info!(image = %image, sif = %sif.display(), "backends: building the SIF once");
                let part = sif.with_extension(format!("part-{}", super::random_hex(4)));
                let out = cli(&binary, &build_args(&part, &image), BUILD_TIMEOUT)?;
                if !out.success() {
                    let _ = std::fs::remove_file(&part);
                    return Err(failed(&format!("building {image}"), &out));
                }
                std::fs::rename(&part, &sif).map_err(|e| io("store the SIF", &sif, &e))?;
            }
            sif.display().to_string()
        } else {
            image
        };
        let safe: String = task
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .take(40)
            .collect();
        let name = if settings.container_persistent {
            format!("vibeos_{safe}")
        } else {
            format!("vibeos_{safe}_{}", super::random_hex(4))
        };
        // Named like docker's, so the execution sockets below it fit in sun_path.
        let rpc_dir = super::docker::rpc_dir_for(&name, false);
        std::fs::create_dir_all(&rpc_dir).map_err(|e| io("create the RPC dir", &rpc_dir, &e))?;
        std::fs::set_permissions(&rpc_dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io("protect the RPC dir", &rpc_dir, &e))?;
        let overlay = if settings.container_persistent {
            let dir = cache_dir().join("overlays").join(&name);
            std::fs::create_dir_all(&dir).map_err(|e| io("create the overlay", &dir, &e))?;
            Some(dir)
        } else {
            None
        };
        let agent_path =
            agent_binary(settings.agent_binary.as_deref()).map_err(|message| EnvError::Agent {
                backend: BACKEND,
                message,
            })?;
        let plan = InstancePlan {
            name: name.clone(),
            image,
            rpc_dir: rpc_dir.clone(),
            agent: agent_path,
            overlay,
            workspace: settings
                .docker_mount_cwd_to_workspace
                .then(|| settings.host_cwd.clone())
                .flatten(),
            binds: settings
                .docker_volumes
                .iter()
                .map(|v| {
                    format!(
                        "{}:{}{}",
                        v.host.display(),
                        v.container,
                        if v.read_only { ":ro" } else { "" }
                    )
                })
                .collect(),
        };
        let out = cli(&binary, &start_args(&plan), CLI_TIMEOUT)?;
        if !out.success() {
            let _ = std::fs::remove_dir_all(&rpc_dir);
            return Err(failed(&format!("starting instance {name}"), &out));
        }
        tracing::info!(instance = %name, "backends: singularity instance started");
        let workdir = settings.cwd.clone().unwrap_or_else(|| {
            if plan.workspace.is_some() {
                "/workspace".into()
            } else {
                "/tmp".into()
            }
        });
        let (agent_bin, agent_name, local) =
            (binary.clone(), name.clone(), rpc_dir.join("agent.sock"));
        let shell_session = settings.shell_session;
        let agent = AgentClient::new(BACKEND, move || {
            let mut argv = vec![
                AGENT_PATH.to_string(),
                "backend-agent".into(),
                "--listen".into(),
            ];
            argv.push(format!("{RPC_MOUNT}/agent.sock"));
            if !shell_session {
                argv.push("--no-shell-session".into());
            }
            let mut cmd = Command::new(&agent_bin);
            cmd.arg("exec")
                .arg(format!("instance://{agent_name}"))
                .args(&argv);
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
            Ok(AgentLaunch {
                process: ClientProcess::spawn(BACKEND, cmd, None)?,
                socket: Some(AgentSocket {
                    local: local.clone(),
                    prepare: None,
                }),
            })
        });
        Ok(SingularityEnv {
            binary,
            name,
            site: Site {
                workdir,
                python: settings.python.clone(),
            },
            persistent: settings.container_persistent,
            rpc_dir,
            agent,
        })
    }
}

fn io(what: &str, path: &Path, e: &std::io::Error) -> EnvError {
    EnvError::Command {
        backend: BACKEND,
        what: what.into(),
        message: format!("{}: {e}", path.display()),
    }
}

impl Environment for SingularityEnv {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn isolated(&self) -> bool {
        // The instance shares the host's network and, under the same user, its processes'
        // view of the network: never treated as isolated.
        false
    }

    fn site(&self) -> &Site {
        &self.site
    }

    fn spawn(&self, spec: &ExecSpec) -> Result<Spawned, EnvError> {
        spec.check(BACKEND)?;
        let pgid_file = format!("{RPC_MOUNT}/pg-{}", super::random_hex(8));
        let mut cmd = Command::new(&self.binary);
        cmd.args(exec_args(
            &self.name,
            None,
            &group_wrapper(spec, &pgid_file, &self.site.python),
        ));
        let (binary, name) = (self.binary.clone(), self.name.clone());
        ClientProcess::spawn(
            BACKEND,
            cmd,
            Some(Box::new(move |signal| {
                let out = cli(
                    &binary,
                    &exec_args(&name, None, &group_kill(&pgid_file, signal)),
                    CLI_TIMEOUT,
                )?;
                if out.success() {
                    Ok(())
                } else {
                    Err(failed("killing a process group", &out))
                }
            })),
        )
    }

    fn open_channel(&self, exec_id: &str, _token: &str) -> Result<Channel, EnvError> {
        let short = exec_id
            .get(..super::docker::EXEC_DIR_CHARS)
            .unwrap_or(exec_id);
        let path = self.rpc_dir.join(short);
        // As docker's: bound through the dir's descriptor, whatever the instance did to its name.
        let dir = super::shared_dir::ExecutionDir::create(path.clone())
            .map_err(|e| io("create the execution's socket dir", &path, &e))?;
        Ok(Channel {
            connections: Connections::Bind(dir.socket_path("rpc.sock")),
            remote_socket: format!("{RPC_MOUNT}/{short}/rpc.sock"),
            remote_dir: format!("/tmp/vibeos-exec-{exec_id}"),
            hello: false,
            guard: Box::new(dir),
        })
    }

    fn agent(&self) -> Option<&AgentClient> {
        Some(&self.agent)
    }

    fn stop(&self) {
        self.agent.stop();
        match cli(&self.binary, &stop_args(&self.name), CLI_TIMEOUT) {
            Ok(o) if o.success() => {
                tracing::info!(instance = %self.name, "backends: singularity instance stopped")
            }
            Ok(o) => {
                tracing::warn!(instance = %self.name, "backends: cannot stop the instance: {}", o.stderr_text())
            }
            Err(e) => {
                tracing::warn!(instance = %self.name, "backends: cannot stop the instance: {e}")
            }
        }
        if !self.persistent {
            let _ = std::fs::remove_dir_all(&self.rpc_dir);
        }
    }
}

/// doctor: the CLI found and its version, or why not.
pub fn probe() -> Result<String, EnvError> {
    let binary = find_binary()?;
    let out = cli(&binary, &["--version".to_string()], Duration::from_secs(20))?;
    if out.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(failed("--version", &out))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn plan() -> InstancePlan {
        InstancePlan {
            name: "vibeos_t_ab12".into(),
            image: "/cache/python_3.12.sif".into(),
            rpc_dir: "/tmp/x.rpc".into(),
            agent: "/opt/vibeos-exec".into(),
            overlay: None,
            workspace: None,
            binds: vec![],
        }
    }

    #[test]
    fn instance_start_is_contained_with_explicit_binds_only() {
        let a = start_args(&plan());
        assert_eq!(
            a,
            [
                "instance",
                "start",
                "--containall",
                "--no-home",
                "--writable-tmpfs",
                "--bind",
                "/tmp/x.rpc:/run/vibeos-rpc",
                "--bind",
                "/opt/vibeos-exec:/usr/local/libexec/vibeos-exec:ro",
                "/cache/python_3.12.sif",
                "vibeos_t_ab12"
            ]
        );
        // Persistent: an overlay instead of the tmpfs; the workspace and volumes bound explicitly.
        let mut p = plan();
        p.overlay = Some("/cache/overlays/vibeos_t".into());
        p.workspace = Some("/home/me/proj".into());
        p.binds = vec!["/data:/data:ro".into()];
        let a = start_args(&p).join(" ");
        assert!(a.contains("--overlay /cache/overlays/vibeos_t"), "{a}");
        assert!(!a.contains("--writable-tmpfs"), "{a}");
        assert!(a.contains("--bind /home/me/proj:/workspace"), "{a}");
        assert!(a.contains("--bind /data:/data:ro"), "{a}");
        assert!(a.ends_with("/cache/python_3.12.sif vibeos_t_ab12"), "{a}");
    }

    #[test]
    fn exec_and_stop_address_the_instance() {
        assert_eq!(
            exec_args("n", Some("/w"), "echo hi"),
            ["exec", "--pwd", "/w", "instance://n", "sh", "-c", "echo hi"]
        );
        assert_eq!(exec_args("n", None, "x")[1], "instance://n");
        assert_eq!(stop_args("n"), ["instance", "stop", "n"]);
    }

    #[test]
    fn docker_images_are_built_once_into_a_cached_sif() {
        let cache = Path::new("/c");
        let sif = sif_path(cache, "docker://python:3.12-slim");
        assert_eq!(sif, Path::new("/c/python_3.12-slim.sif"));
        assert_eq!(
            sif_path(cache, "docker://ghcr.io/a/b:1"),
            Path::new("/c/ghcr.io_a_b_1.sif")
        );
        assert_eq!(
            build_args(Path::new("/c/x.part"), "docker://python:3.12-slim"),
            ["build", "/c/x.part", "docker://python:3.12-slim"]
        );
    }

    #[test]
    fn config_selects_it_and_names_the_missing_image() {
        let at = Path::new("/t/config.yaml");
        let doc = crate::config_file::ConfigFile::parse(
            "terminal:\n  backend: singularity\n  singularity_image: docker://python:3.12-slim\n",
            at,
        )
        .unwrap();
        let s = BackendSettings::from_document(&doc, None).unwrap();
        assert_eq!(s.backend, super::super::BackendKind::Singularity);
        assert_eq!(
            s.singularity_image.as_deref(),
            Some("docker://python:3.12-slim")
        );
        let doc = crate::config_file::ConfigFile::parse("terminal: {}\n", at).unwrap();
        let e = BackendSettings::from_document(&doc, Some("apptainer")).unwrap_err();
        assert!(e.to_string().contains("terminal.singularity_image"), "{e}");
    }

    #[test]
    fn apptainer_is_preferred_and_a_missing_cli_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let make = |name: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        let path = || Some(dir.path().as_os_str().to_owned());
        let none = find_binary_in(path()).unwrap_err().to_string();
        assert!(none.contains("neither apptainer nor singularity"), "{none}");
        make("singularity");
        assert!(find_binary_in(path()).unwrap().ends_with("singularity"));
        make("apptainer");
        assert!(find_binary_in(path()).unwrap().ends_with("apptainer"));
    }
}
