//! The docker backend (also podman, `terminal.docker_binary: podman`): one container per task.
//!
//! Talks to the engine through its CLI (`DOCKER_HOST` and the engine's own config apply as
//! usual); docs/backends.md records why the CLI and not the Engine API. A container is created
//! on first use with the labels `vibeos-exec=1`, `vibeos-exec.task=<id>` and the owning
//! process, no network (`--network none` unless `terminal.docker_network`), every capability
//! dropped, no-new-privileges, pids/cpu/memory limits, and no host mounts except two the
//! product needs: the per-environment RPC directory (sockets of its executions live in
//! subdirectories, so a re-created socket is always the one the container sees) and the
//! vibeos-exec binary, read-only, which runs there as the tool agent. Its PID 1 is a tiny
//! Python reaper so orphans of scripts never pile up as zombies.

use super::agent::{checked_agent_binary, AgentClient, AgentLaunch, AgentSocket};
use super::owner::{owner_alive, owner_label};
use super::process::{group_kill, group_wrapper, tree_kill_argv};
use super::settings::BackendSettings;
use super::shared_dir::ExecutionDir;
use super::Site;
use super::{
    run_client, Channel, ClientProcess, CommandOutput, Connections, EnvError, Environment,
    ExecSpec, Spawned,
};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Where the RPC directory appears inside the container.
pub const RPC_MOUNT: &str = "/run/vibeos-rpc";
/// Where the tool agent binary appears inside the container.
pub const AGENT_PATH: &str = "/usr/local/libexec/vibeos-exec";
/// Label every container carries.
pub const LABEL: &str = "vibeos-exec=1";
use super::shape::SHAPE_LABEL;
/// How long `spawn_leader` waits for the leader to record its pid (its interpreter's start).
const LEADER_RECORD_TIMEOUT: Duration = Duration::from_secs(30);

/// How long an engine command may take before the engine counts as hung.
const ENGINE_TIMEOUT: Duration = Duration::from_secs(120);

/// PID 1 of a container: reaps every orphan and exits on SIGTERM.
const INIT: &str = include_str!("container_init.py");

/// A running container of one task.
pub struct DockerEnv {
    /// What makes, finds and revives the container: shared with the tool agent's launcher,
    /// which brings a container stopped or removed from outside back before it starts the
    /// agent again (a direct tool call recovers as an execution does).
    core: Arc<Core>,
    site: Site,
    isolated: bool,
    agent: AgentClient,
    /// A persistent container's users file, held with a shared `flock` while this process
    /// uses the container (see [`users_lock`]); `None` for a container of our own.
    users: Option<std::fs::File>,
}

/// The container itself: its name, RPC dir and how it is made.
pub struct Core {
    binary: String,
    name: String,
    persistent: bool,
    rpc_dir: PathBuf,
    /// What `docker run` makes the container from, kept to make it again when it was removed
    /// behind our back ([`Core::revive`]).
    made: Made,
    /// One revival at a time: two executions that find the container stopped start it once.
    revive_lock: std::sync::Mutex<()>,
}

impl std::ops::Deref for DockerEnv {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}

/// Whether a container on `network` (`terminal.docker_network`) has a network namespace of
/// its own, away from the host's: `none`, `bridge`, `default`, `private` and named networks
/// do; `host` (the host's own, with its loopback services), `container:<id>` and `ns:<path>`
/// (another namespace, which may be the host's), and podman's user-mode `slirp4netns` and
/// `pasta` (which can map the host's loopback) do not — nor does any other `mode:options`
/// form, whose reach is not known here. Only an isolated container may skip approvals.
pub(crate) fn network_isolated(network: &str) -> bool {
    let n = network.trim().to_ascii_lowercase();
    !n.is_empty() && !n.contains(':') && !matches!(n.as_str(), "host" | "slirp4netns" | "pasta")
}

/// The `docker run` of a container: everything but its name and RPC dir.
#[derive(Debug)]
struct Made {
    settings: BackendSettings,
    task: String,
    image: String,
    shape: String,
    agent_bin: PathBuf,
    mount_cwd: Option<PathBuf>,
    workdir: String,
}

/// The file every process using the persistent container `rpc_dir` belongs to holds a shared
/// `flock` on: the container is stopped only by the process that can take it exclusively, i.e.
/// its last user, so one process finishing never stops it under another's running execution.
/// Beside the RPC dir, not in it: the container must not be able to lock it. flock locks die
/// with their process, so a crashed user never keeps a container up for ever (`backends gc
/// --all` and the next last user still stop it).
fn users_lock(rpc_dir: &std::path::Path) -> Result<std::fs::File, std::io::Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut path = rpc_dir.as_os_str().to_os_string();
    path.push(".users");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)?;
    // Blocks while a last user is stopping the container, so we find it stopped and start it.
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockShared)?;
    Ok(file)
}

/// Removes the RPC dir of a container that failed to start, unless disarmed.
struct DirGuard(Option<PathBuf>);

impl Drop for DirGuard {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// `key=value` as one field of `--mount` (a CSV line): quoted when the value has a comma or
/// a quote, which would otherwise split the field.
fn mount_field(key: &str, value: &str) -> String {
    if value.contains([',', '"']) {
        format!("\"{key}={}\"", value.replace('"', "\"\""))
    } else {
        format!("{key}={value}")
    }
}

fn engine(binary: &str, args: &[&str]) -> Result<CommandOutput, EnvError> {
    let mut cmd = Command::new(binary);
    cmd.args(args);
    run_client(
        "docker",
        &mut cmd,
        b"",
        ENGINE_TIMEOUT,
        &format!("{binary} {}", args.first().copied().unwrap_or("")),
    )
}

/// Turns an engine's error output into an error that says what to do.
fn engine_error(binary: &str, what: &str, out: &CommandOutput) -> EnvError {
    let text = out.stderr_text();
    let lower = text.to_ascii_lowercase();
    if lower.contains("cannot connect")
        || lower.contains("connection refused")
        || lower.contains("is the docker daemon running")
        || lower.contains("no such file or directory") && lower.contains(".sock")
    {
        return EnvError::Unreachable {
            backend: "docker",
            message: format!(
                "{binary} cannot reach its engine ({text}); start the daemon or set DOCKER_HOST"
            ),
        };
    }
    EnvError::Command {
        backend: "docker",
        what: what.to_string(),
        message: if text.is_empty() {
            format!("{binary} exited with {:?}", out.code)
        } else {
            text
        },
    }
}

/// The subdir of a container's RPC dir that is bind-mounted at [`RPC_MOUNT`]: the RPC dir
/// itself stays the host's, 0700, out of the container's reach.
///
/// The container's root is the host's root with a rootful engine, and owns what it makes in
/// the mount. Mounted directly, the RPC dir was the mount's root, so a script could `chmod`
/// it open and leave a setuid-root copy of an interpreter in it: any local user ran it and
/// read `/etc/shadow` (stop 58's docker probe), for as long as a persistent container's dir
/// stays on the host. One level down, whatever the script makes or opens up sits in a dir no
/// other user can enter.
pub(crate) const MOUNTED_SUBDIR: &str = "m";

/// Longest path a Unix socket address can hold (sun_path minus its NUL).
const MAX_SOCKET_PATH: usize = 107;
/// Characters of an execution id naming its socket dir (64 random bits: unique among the
/// executions of one container, and short enough for sun_path).
pub(crate) const EXEC_DIR_CHARS: usize = 16;

/// The host dir whose [`MOUNTED_SUBDIR`] is bind-mounted at [`RPC_MOUNT`]. Its name does not
/// embed the container name (up to 69 characters with a long task id): the execution sockets
/// below it, `<dir>/m/<16 hex>/rpc.sock`, must fit in sun_path. A persistent container's mount source
/// must survive host restarts, so its name is stable; every other one is unguessable. When
/// `$TMPDIR` itself is too long for that, `/tmp` is used.
pub(crate) fn rpc_dir_for(name: &str, persistent: bool) -> PathBuf {
    let tag = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let leaf = if persistent {
        format!("vibeos-rpc-{tag:016x}")
    } else {
        format!("vibeos-rpc-{tag:016x}-{}", super::random_hex(8))
    };
    let tail = 1 + MOUNTED_SUBDIR.len() + 1 + EXEC_DIR_CHARS + "/rpc.sock".len();
    let base = std::env::temp_dir();
    let fits = |b: &std::path::Path| b.join(&leaf).as_os_str().len() + tail <= MAX_SOCKET_PATH;
    if fits(&base) {
        base.join(leaf)
    } else {
        PathBuf::from("/tmp").join(leaf)
    }
}

fn container_name(task: &str, persistent: bool) -> String {
    let clean: String = task
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    // FNV-1a: a stable short tag, so distinct task ids never share a name after cleaning.
    let hash = task.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    if persistent {
        format!("vibeos-exec-{clean}-{:08x}", hash as u32)
    } else {
        format!(
            "vibeos-exec-{clean}-{:08x}-{}",
            hash as u32,
            std::process::id()
        )
    }
}

/// What a container is made from, as the JSON text of its [`SHAPE_LABEL`]: image,
/// interpreter, network, limits, mounts and default working directory. A persistent container
/// is reused only when the current settings would make the same one ([`shape_change`]).
fn container_shape(
    image: &str,
    settings: &BackendSettings,
    mount_cwd: Option<&std::path::Path>,
    workdir: Option<&str>,
    agent_bin: &std::path::Path,
) -> String {
    let volumes: Vec<serde_json::Value> = settings
        .docker_volumes
        .iter()
        .map(|v| serde_json::json!([v.host, v.container, v.read_only]))
        .collect();
    serde_json::json!({
        "image": image,
        "python": settings.python,
        "network": settings.docker_network,
        "pids": settings.container_pids,
        "cpu": settings.container_cpu,
        "memory_mb": settings.container_memory,
        "volumes": volumes,
        "workspace": mount_cwd,
        "workdir": workdir,
        "agent": agent_bin,
        // Containers made before the RPC dir had a private parent mount it directly.
        "rpc_mount": MOUNTED_SUBDIR,
    })
    .to_string()
}

/// How the settings a container was made from (`made_from`, its [`SHAPE_LABEL`]) differ from
/// `now`, naming the settings ([`super::shape::change`]).
fn shape_change(made_from: &str, now: &str) -> Option<String> {
    super::shape::change(made_from, now, |key| match key {
        "image" => "terminal.docker_image",
        "python" => "terminal.python",
        "network" => "terminal.docker_network",
        "pids" => "terminal.container_pids",
        "cpu" => "terminal.container_cpu",
        "memory_mb" => "terminal.container_memory",
        "volumes" => "terminal.docker_volumes",
        "workspace" => "terminal.docker_mount_cwd_to_workspace or the session's cwd",
        "workdir" => "its default working directory",
        "agent" => "the path of the vibeos-exec binary mounted in it",
        "rpc_mount" => {
            "its RPC mount, which a container made before stop 58 shares with host users"
        }
        other => other,
    })
}

impl DockerEnv {
    /// Creates (or, when persistent, restarts) the container of `task`.
    pub fn start(settings: &BackendSettings, task: &str) -> Result<DockerEnv, EnvError> {
        let binary = settings.docker_binary.clone();
        let image = settings.docker_image.clone().ok_or(EnvError::Command {
            backend: "docker",
            what: "start".into(),
            message: "terminal.docker_image is not set".into(),
        })?;
        // Settings built without the config file's checks (an embedding caller) too: a
        // leading `-` would be an option of `docker run`, not an image.
        if !super::settings::image_reference_ok(&image) {
            return Err(EnvError::Command {
                backend: "docker",
                what: "start".into(),
                message: format!(
                    "terminal.docker_image `{image}` is not a valid image reference: it must not \
                     be empty, start with `-` or contain spaces; set it to an image name"
                ),
            });
        }
        if let Some(mb) = settings.container_disk {
            // `--storage-opt size=` needs an xfs data root with project quotas, which an
            // engine cannot be assumed to have: said, not silently dropped.
            tracing::warn!(
                "backends: terminal.container_disk ({mb} MB) is not applied by the docker backend; \
                 the container's disk is bounded only by the engine's storage"
            );
        }
        let persistent = settings.container_persistent;
        let name = container_name(task, persistent);
        let agent_bin = checked_agent_binary("docker", settings.agent_binary.as_deref())?;
        let mount_cwd = settings
            .docker_mount_cwd_to_workspace
            .then(|| settings.host_cwd.clone())
            .flatten();
        let workdir = settings.cwd.clone().unwrap_or_else(|| {
            if mount_cwd.is_some() {
                "/workspace".into()
            } else {
                "/root".into()
            }
        });
        let rpc_dir = rpc_dir_for(&name, persistent);
        let users = if persistent {
            Some(users_lock(&rpc_dir).map_err(|e| EnvError::Command {
                backend: "docker",
                what: "locking the persistent container's users file".into(),
                message: format!("{}.users: {e}", rpc_dir.display()),
            })?)
        } else {
            None
        };
        let shape = container_shape(
            &image,
            settings,
            mount_cwd.as_deref(),
            settings.cwd.is_none().then_some(workdir.as_str()),
            &agent_bin,
        );
        let core = Arc::new(Core {
            binary: binary.clone(),
            name: name.clone(),
            persistent,
            rpc_dir: rpc_dir.clone(),
            made: Made {
                settings: settings.clone(),
                task: task.to_string(),
                image: image.clone(),
                shape: shape.clone(),
                agent_bin: agent_bin.clone(),
                mount_cwd: mount_cwd.clone(),
                workdir: workdir.clone(),
            },
            revive_lock: std::sync::Mutex::new(()),
        });
        let env = DockerEnv {
            agent: Core::agent_client(Arc::clone(&core), settings.shell_session),
            core,
            site: Site {
                workdir: workdir.clone(),
                python: settings.python.clone(),
            },
            // A host mount, or the host's network, reaches the host: never isolated.
            isolated: settings.docker_volumes.is_empty()
                && mount_cwd.is_none()
                && network_isolated(&settings.docker_network),
            users,
        };
        if persistent {
            let out = engine(
                &binary,
                &[
                    "inspect",
                    "-f",
                    &format!(
                        "{{{{.State.Running}}}}\t{{{{index .Config.Labels \"{SHAPE_LABEL}\"}}}}"
                    ),
                    &name,
                ],
            )?;
            if out.success() {
                let text = String::from_utf8_lossy(&out.stdout);
                let (running, made_from) = text.trim_end().split_once('\t').unwrap_or((&text, ""));
                // Reused as it is, a container made from other settings would run another
                // image, lack a volume or keep one the settings dropped (and then count as
                // isolated for approvals while a host directory is mounted in it).
                if let Some(changed) = shape_change(made_from, &shape) {
                    return Err(EnvError::Command {
                        backend: "docker",
                        what: "reusing the persistent container".into(),
                        message: format!(
                            "container `{name}` was made with other settings ({changed}); \
                             making it again would lose what is in it, so it is left as it is. \
                             Remove it (`vibeos-exec backends gc --all`, or `{binary} rm -f \
                             {name}`) to have it made from the current settings, or restore them"
                        ),
                    });
                }
                if running.trim() != "true" {
                    env.start_stopped("restarting the persistent container")?;
                }
                return Ok(env);
            }
        }
        let _ = std::fs::remove_dir_all(&rpc_dir);
        std::fs::create_dir(&rpc_dir).map_err(|e| env.io("create the RPC dir", &e))?;
        // Any failure from here on (an engine that cannot even be run included) leaves no
        // empty RPC dir on the host.
        let mut dir_guard = DirGuard(Some(rpc_dir.clone()));
        env.private_rpc_dir()?;
        env.run_container()?;
        dir_guard.0 = None;
        tracing::info!(container = %name, task, "backends: docker container started");
        Ok(env)
    }
}

impl Core {
    /// `docker run` of the container, named and mounted as this environment says; it is
    /// checked to be running, and removed again when it is not.
    fn run_container(&self) -> Result<(), EnvError> {
        let Made {
            settings,
            task,
            image,
            shape,
            agent_bin,
            mount_cwd,
            workdir,
        } = &self.made;
        let (binary, name, rpc_dir, persistent) = (
            self.binary.clone(),
            self.name.clone(),
            self.rpc_dir.clone(),
            self.persistent,
        );
        let mut args: Vec<String> = vec![
            "run".into(),
            "-d".into(),
            "--name".into(),
            name.clone(),
            "--label".into(),
            LABEL.into(),
            "--label".into(),
            format!("vibeos-exec.task={task}"),
            "--label".into(),
            format!("vibeos-exec.owner={}", owner_label()),
            "--label".into(),
            format!("vibeos-exec.persistent={}", u8::from(persistent)),
            "--label".into(),
            format!("{SHAPE_LABEL}={shape}"),
            "--network".into(),
            settings.docker_network.clone(),
            "--cap-drop".into(),
            "ALL".into(),
            "--security-opt".into(),
            "no-new-privileges".into(),
            "--pids-limit".into(),
            settings.container_pids.to_string(),
            "-v".into(),
            format!("{}:{RPC_MOUNT}", rpc_dir.join(MOUNTED_SUBDIR).display()),
            // `--mount`, not `-v`: `-v` creates a missing source on the host (as an empty
            // root-owned directory), `--mount` refuses it.
            "--mount".into(),
            format!(
                "type=bind,{},target={AGENT_PATH},readonly",
                mount_field("source", &agent_bin.display().to_string())
            ),
        ];
        // `docker run -w` creates a missing directory, so a configured terminal.cwd is not
        // passed here: the bootstrap and the tools enter it themselves and report a missing
        // one naming the key, as every other backend does. The defaults are always there.
        if settings.cwd.is_none() {
            args.extend(["-w".into(), workdir.clone()]);
        }
        if let Some(cpu) = settings.container_cpu {
            args.extend(["--cpus".into(), format!("{cpu}")]);
        }
        if let Some(mb) = settings.container_memory {
            args.extend(["--memory".into(), format!("{mb}m")]);
        }
        // `--mount` (see the agent's): a missing host directory is an error, not an empty
        // root-owned directory made on the host; and its fields are quoted, so a path with
        // `:` or `,` mounts as given.
        for v in &settings.docker_volumes {
            let mut spec = format!(
                "type=bind,{},{}",
                mount_field("source", &v.host.display().to_string()),
                mount_field("target", &v.container)
            );
            if v.read_only {
                spec.push_str(",readonly");
            }
            args.extend(["--mount".into(), spec]);
        }
        if let Some(cwd) = &mount_cwd {
            args.extend([
                "--mount".into(),
                format!(
                    "type=bind,{},target=/workspace",
                    mount_field("source", &cwd.display().to_string())
                ),
            ]);
        }
        args.extend([
            "--entrypoint".into(),
            settings.python.clone(),
            image.clone(),
            "-c".into(),
            INIT.lines()
                .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
                .collect::<Vec<_>>()
                .join("\n"),
        ]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = engine(&binary, &refs)?;
        if !out.success() {
            // `run` may have created the container before it failed to start it (an image
            // without terminal.python): remove it, or every attempt leaves one behind.
            let _ = engine(&binary, &["rm", "-f", &name]);
            let text = out.stderr_text();
            let lower = text.to_ascii_lowercase();
            if lower.contains("unable to find image")
                || lower.contains("no such image")
                || lower.contains("image not known")
                || lower.contains("pull access denied")
                || lower.contains("repository does not exist")
            {
                return Err(EnvError::Command {
                    backend: "docker",
                    what: "creating the container".into(),
                    message: format!("image `{image}` is not available to {binary} ({text}); build or pull it, or fix terminal.docker_image"),
                });
            }
            if lower.contains("executable file not found")
                || lower.contains("no such file or directory") && lower.contains("exec")
            {
                return Err(EnvError::Command {
                    backend: "docker",
                    what: "creating the container".into(),
                    message: format!(
                        "image `{image}` has no `{}` ({text}); set terminal.python to its Python 3 interpreter",
                        settings.python
                    ),
                });
            }
            return Err(engine_error(&binary, "creating the container", &out));
        }
        // An image without the interpreter makes PID 1 exit at once: say so now, not as a
        // puzzling "container is not running" on the first exec.
        let state = engine(&binary, &["inspect", "-f", "{{.State.Running}}", &name])?;
        if String::from_utf8_lossy(&state.stdout).trim() != "true" {
            let logs = engine(&binary, &["logs", "--tail", "5", &name])
                .map(|o| {
                    format!(
                        "{} {}",
                        o.stderr_text(),
                        String::from_utf8_lossy(&o.stdout).trim()
                    )
                })
                .unwrap_or_default();
            let _ = engine(&binary, &["rm", "-f", &name]);
            let _ = std::fs::remove_dir_all(&rpc_dir);
            return Err(EnvError::Command {
                backend: "docker",
                what: "starting the container".into(),
                message: format!(
                    "it exited at once ({}); does image `{image}` have `{}` (terminal.python)?",
                    logs.trim(),
                    settings.python
                ),
            });
        }
        Ok(())
    }
}

impl DockerEnv {
    /// One `docker exec` of the execution's leader, and whether the leader recorded its pid
    /// (or the record cannot be read from here) before the exec ended.
    fn spawn_leader_once(
        &self,
        build: &dyn Fn(Option<&str>) -> ExecSpec,
    ) -> Result<(Spawned, bool), EnvError> {
        // The command records its own group: the engine starts it directly, without the
        // wrapper's `sh` and `setsid`.
        let pgid_file = self.pgid_file();
        let spec = build(Some(&pgid_file));
        spec.check("docker")?;
        let mut cmd = Command::new(&self.binary);
        cmd.args(["exec", "-i"]);
        if let Some(cwd) = &spec.cwd {
            cmd.arg("-w").arg(cwd);
        }
        for (k, v) in &spec.env {
            cmd.arg("-e").arg(format!("{k}={v}"));
        }
        cmd.arg(&self.name).args(&spec.argv);
        let leader = Arc::new(OnceLock::new());
        let host_file = self
            .mounted_dir()
            .join(pgid_file.rsplit('/').next().unwrap_or_default());
        let spawned = ClientProcess::spawn(
            "docker",
            cmd,
            Some(self.tree_killer(pgid_file, Arc::clone(&leader))),
        )?;
        // The leader writes its own pid there before it reads its stdin, and the script only
        // runs once the caller has written that stdin (after we return): the pid read now
        // cannot have been forged by the script, which may rewrite the file later.
        let deadline = std::time::Instant::now() + LEADER_RECORD_TIMEOUT;
        let mut recorded = false;
        loop {
            // Never followed, never waited on: another script of this container may have
            // put a link or a FIFO under the name (see `shared_dir`).
            match super::shared_dir::read_small_file(&host_file, 32) {
                Ok(None) => {}
                Ok(Some(bytes)) => {
                    let text = String::from_utf8_lossy(&bytes);
                    if let Ok(pid) = text.trim().parse::<i32>() {
                        if pid > 1 {
                            let _ = leader.set(pid);
                            recorded = true;
                            break;
                        }
                    }
                }
                // Unreadable from here (a rootful engine and a non-root host), or not a plain
                // file: the kill falls back to reading the file inside the container.
                Err(_) => {
                    recorded = true;
                    break;
                }
            }
            if !matches!(spawned.process.try_wait(), Ok(None))
                || std::time::Instant::now() > deadline
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok((spawned, recorded))
    }
}

impl Core {
    /// The RPC dir and its mounted subdir, made again if they are gone (a temp-dir cleaner
    /// may take a stopped persistent container's) and private, as at the container's creation.
    /// The RPC dir's mode is what keeps other users out of whatever a script leaves in the
    /// mount; the subdir's a script can change.
    fn private_rpc_dir(&self) -> Result<(), EnvError> {
        let mounted = self.mounted_dir();
        std::fs::create_dir_all(&mounted).map_err(|e| self.io("create the RPC dir", &e))?;
        for dir in [&self.rpc_dir, &mounted] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| self.io("protect the RPC dir", &e))?;
        }
        Ok(())
    }

    /// The host side of [`RPC_MOUNT`].
    fn mounted_dir(&self) -> PathBuf {
        self.rpc_dir.join(MOUNTED_SUBDIR)
    }

    /// `docker start` of the container, which exists but is stopped; its RPC dir first.
    fn start_stopped(&self, what: &str) -> Result<(), EnvError> {
        self.private_rpc_dir()?;
        let out = engine(&self.binary, &["start", &self.name])?;
        if !out.success() {
            return Err(engine_error(&self.binary, what, &out));
        }
        Ok(())
    }

    /// Brings a container that stopped (its PID 1 killed, `docker stop`, a daemon restart) or
    /// was removed behind our back back up, under the same name and RPC dir, so the task's
    /// next execution runs instead of failing until the environment goes idle. Returns whether
    /// it did anything (false: the container was running). A stopped container keeps its
    /// files; one that was removed is made anew.
    fn revive(&self) -> Result<bool, EnvError> {
        let _one = self.revive_lock.lock().unwrap_or_else(|p| p.into_inner());
        let out = engine(
            &self.binary,
            &["inspect", "-f", "{{.State.Running}}", &self.name],
        )?;
        if out.success() {
            if String::from_utf8_lossy(&out.stdout).trim() == "true" {
                return Ok(false);
            }
            self.start_stopped("restarting the stopped container")?;
            tracing::warn!(container = %self.name, "backends: the docker container had stopped; started it again");
        } else {
            self.private_rpc_dir()?;
            self.run_container()?;
            tracing::warn!(container = %self.name, "backends: the docker container was removed; made it again");
        }
        Ok(true)
    }

    /// Whether the container runs (`false` also when the engine cannot say).
    fn running(&self) -> bool {
        engine(
            &self.binary,
            &["inspect", "-f", "{{.State.Running}}", &self.name],
        )
        .is_ok_and(|o| o.success() && String::from_utf8_lossy(&o.stdout).trim() == "true")
    }

    fn agent_client(core: Arc<Core>, shell_session: bool) -> AgentClient {
        let local = core.mounted_dir().join("agent.sock");
        AgentClient::new("docker", move || {
            // The agent is (re)started when the last one is gone: if that is because the
            // container was stopped or removed from outside, it is brought back first (with a
            // warning), or every later tool call would fail until an execution revived it.
            core.revive()?;
            let mut cmd = Command::new(&core.binary);
            cmd.args([
                "exec",
                "-i",
                &core.name,
                AGENT_PATH,
                "backend-agent",
                "--listen",
            ])
            .arg(format!("{RPC_MOUNT}/agent.sock"));
            if !shell_session {
                cmd.arg("--no-shell-session");
            }
            // Killing the client closes the agent's lifeline, which ends it.
            cmd.process_group(0);
            Ok(AgentLaunch {
                process: ClientProcess::spawn("docker", cmd, None)?,
                socket: Some(AgentSocket {
                    local: local.clone(),
                    prepare: None,
                }),
            })
        })
    }

    fn io(&self, what: &str, e: &std::io::Error) -> EnvError {
        EnvError::Command {
            backend: "docker",
            what: what.into(),
            message: format!("{}: {e}", self.rpc_dir.display()),
        }
    }

    /// The container's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl DockerEnv {
    /// A fresh name for a process group's id file, in the bind-mounted RPC dir: private to
    /// this environment.
    fn pgid_file(&self) -> String {
        format!("{RPC_MOUNT}/pg-{}", super::random_hex(8))
    }

    /// Signals the group recorded in `pgid_file` through the engine.
    fn group_killer(&self, pgid_file: String) -> super::process::RemoteKill {
        let (binary, name) = (self.binary.clone(), self.name.clone());
        Box::new(move |signal| {
            let script = group_kill(&pgid_file, signal);
            exec_in_container(
                &binary,
                &name,
                &["sh", "-c", &script],
                "killing a process group",
            )
        })
    }
}

/// Runs `argv` to completion in container `name` as a new `docker exec`, the engine's failure
/// or a nonzero exit named as the failure of `what`.
fn exec_in_container(binary: &str, name: &str, argv: &[&str], what: &str) -> Result<(), EnvError> {
    let mut args = vec!["exec", name];
    args.extend_from_slice(argv);
    let out = engine(binary, &args)?;
    if out.success() {
        Ok(())
    } else {
        Err(engine_error(binary, what, &out))
    }
}

impl DockerEnv {
    /// Signals everything an execution's leader started, found from the leader's pid
    /// (`leader`, read once before the script ran), in a fresh process the engine starts as
    /// the container's user (root without capabilities could not signal another image USER):
    /// nothing the script can change or stop (the pgid file, the leader) decides the kill.
    /// Without a known leader, the group recorded in `pgid_file`.
    fn tree_killer(
        &self,
        pgid_file: String,
        leader: Arc<OnceLock<i32>>,
    ) -> super::process::RemoteKill {
        let (binary, name, python) = (
            self.binary.clone(),
            self.name.clone(),
            self.site.python.clone(),
        );
        let by_file = self.group_killer(pgid_file);
        Box::new(move |signal| {
            let Some(pid) = leader.get() else {
                return by_file(signal);
            };
            let argv = tree_kill_argv(&python, *pid, signal);
            let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
            exec_in_container(&binary, &name, &refs, "killing an execution's processes")
        })
    }
}

impl Environment for DockerEnv {
    fn backend(&self) -> &'static str {
        "docker"
    }

    fn isolated(&self) -> bool {
        self.isolated
    }

    fn still_up(&self) -> bool {
        // Asked right after an exec ended without a report: a container being killed ends
        // its execs before the engine records it as stopped, so a "running" is looked at
        // again for a moment (only on this rare path).
        for _ in 0..5 {
            if !self.running() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        true
    }

    fn site(&self) -> &Site {
        &self.site
    }

    fn spawn(&self, spec: &ExecSpec) -> Result<Spawned, EnvError> {
        spec.check("docker")?;
        let pgid_file = self.pgid_file();
        let mut cmd = Command::new(&self.binary);
        cmd.args(["exec", "-i", &self.name, "sh", "-c"])
            .arg(group_wrapper(spec, &pgid_file, &self.site.python));
        ClientProcess::spawn("docker", cmd, Some(self.group_killer(pgid_file)))
    }

    fn fresh_runner(&self) -> Option<super::FreshRun> {
        // A new `docker exec`: the engine starts it, no process of the container's executions
        // (a stopped or killed bootstrap) is in the way.
        let (binary, name) = (self.binary.clone(), self.name.clone());
        Some(Arc::new(move |argv: &[String]| {
            let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
            exec_in_container(&binary, &name, &refs, "running a command in the container")
        }))
    }

    fn spawn_leader(&self, build: &dyn Fn(Option<&str>) -> ExecSpec) -> Result<Spawned, EnvError> {
        let (spawned, recorded) = self.spawn_leader_once(build)?;
        if recorded || matches!(spawned.process.try_wait(), Ok(None)) {
            return Ok(spawned);
        }
        // The exec ended before the leader could record itself: nothing of the script ran.
        // If that was because the container is not running, bring it back and try once more.
        if self.revive()? {
            drop(spawned);
            return Ok(self.spawn_leader_once(build)?.0);
        }
        Ok(spawned)
    }

    fn open_channel(&self, exec_id: &str, _token: &str) -> Result<Channel, EnvError> {
        // Shortened so the socket path fits in sun_path (see `rpc_dir_for`).
        let short = exec_id.get(..EXEC_DIR_CHARS).unwrap_or(exec_id);
        // Bound through the dir's descriptor: the container can rename or replace the name
        // before the bind, and the socket must not land where a link of its points.
        let dir = ExecutionDir::create(self.mounted_dir().join(short))
            .map_err(|e| self.io("create the execution's socket dir", &e))?;
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
        if let Some(users) = &self.users {
            // Another process still uses this persistent container: leave it running; the
            // last user stops it.
            if rustix::fs::flock(users, rustix::fs::FlockOperation::NonBlockingLockExclusive)
                .is_err()
            {
                tracing::info!(container = %self.name, "backends: persistent container left running: another process is using it");
                return;
            }
        }
        let out = if self.persistent {
            engine(&self.binary, &["stop", "-t", "1", &self.name])
        } else {
            engine(&self.binary, &["rm", "-f", &self.name])
        };
        match out {
            Ok(o) if o.success() => {
                tracing::info!(container = %self.name, "backends: docker container stopped")
            }
            Ok(o) => {
                tracing::warn!(container = %self.name, "backends: cannot stop the container: {}", o.stderr_text())
            }
            Err(e) => {
                tracing::warn!(container = %self.name, "backends: cannot stop the container: {e}")
            }
        }
        if !self.persistent {
            let _ = std::fs::remove_dir_all(&self.rpc_dir);
        }
    }
}

/// What `vibeos-exec backends gc` did.
#[derive(Debug, Default)]
pub struct GcReport {
    /// Containers removed.
    pub removed: Vec<String>,
    /// Containers kept (owner alive, or persistent without `all`).
    pub kept: Vec<String>,
}

/// Removes the containers labelled `vibeos-exec=1` whose owning process is gone (a crashed
/// host); persistent ones only with `all`, and then only those no live process is using.
pub fn gc(binary: &str, all: bool) -> Result<GcReport, EnvError> {
    let out = engine(
        binary,
        &["ps", "-a", "-q", "--filter", &format!("label={LABEL}")],
    )?;
    if !out.success() {
        return Err(engine_error(binary, "listing containers", &out));
    }
    let mut report = GcReport::default();
    for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        // `index .Config.Labels` reads the same in docker and podman.
        let info = engine(
            binary,
            &[
                "inspect",
                "-f",
                "{{.Name}}\t{{index .Config.Labels \"vibeos-exec.owner\"}}\t{{index .Config.Labels \"vibeos-exec.persistent\"}}\t{{range .Mounts}}{{if eq .Destination \"/run/vibeos-rpc\"}}{{.Source}}{{end}}{{end}}",
                id,
            ],
        )?;
        if !info.success() {
            continue; // removed meanwhile
        }
        let text = String::from_utf8_lossy(&info.stdout).trim().to_string();
        let mut parts = text.split('\t');
        let name = parts
            .next()
            .unwrap_or(id)
            .trim_start_matches('/')
            .to_string();
        let owner = parts.next().unwrap_or("");
        let persistent = parts.next().unwrap_or("0") == "1";
        // The RPC dir is the mount source's parent (a container made before stop 58 mounted
        // the RPC dir itself).
        let rpc_source = rpc_dir_of_mount(parts.next().unwrap_or(""));
        // Held (exclusively) while the container goes: a host starting to use it meanwhile
        // waits in `users_lock`, then finds it gone and makes it again.
        let mut _last_user = None;
        let keep = if persistent {
            // `--all` takes persistent containers too, but not one a live process is using
            // (its users file is locked shared): that removal killed a running execution.
            !all || match lock_unused(&rpc_source) {
                Ok(lock) => {
                    _last_user = lock;
                    false
                }
                Err(InUse) => true,
            }
        } else {
            owner_alive(owner)
        };
        if keep {
            report.kept.push(name);
            continue;
        }
        let rm = engine(binary, &["rm", "-f", id])?;
        if !rm.success() {
            return Err(engine_error(binary, &format!("removing {name}"), &rm));
        }
        // Only ever our own socket dir under the temp dir, whatever the label says.
        let source = PathBuf::from(&rpc_source);
        if is_our_rpc_dir(&source) {
            let _ = std::fs::remove_dir_all(&source);
            let mut users = source.into_os_string();
            users.push(".users");
            let _ = std::fs::remove_file(users);
        }
        report.removed.push(name);
    }
    Ok(report)
}

/// The RPC dir of a container whose [`RPC_MOUNT`] source is `source`.
fn rpc_dir_of_mount(source: &str) -> String {
    let path = std::path::Path::new(source);
    match (path.file_name(), path.parent()) {
        (Some(leaf), Some(parent)) if leaf == MOUNTED_SUBDIR => parent.display().to_string(),
        _ => source.to_string(),
    }
}

/// Whether `dir` (a container's RPC dir, from its `/run/vibeos-rpc` source) is an RPC dir this
/// backend made: a `vibeos-rpc-*` dir directly in the temp dir.
fn is_our_rpc_dir(dir: &std::path::Path) -> bool {
    let ours = |p: &std::path::Path| p == std::env::temp_dir() || p == std::path::Path::new("/tmp");
    dir.parent().is_some_and(ours)
        && dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("vibeos-rpc-"))
}

/// A persistent container a live process uses ([`users_lock`] held shared).
struct InUse;

/// The users file of the persistent container whose RPC dir is `rpc_dir`, locked exclusively
/// (`None`: it has none), or [`InUse`] when a process holds it.
fn lock_unused(rpc_dir: &str) -> Result<Option<std::fs::File>, InUse> {
    let dir = std::path::Path::new(rpc_dir);
    if !is_our_rpc_dir(dir) {
        return Ok(None);
    }
    let mut path = dir.as_os_str().to_os_string();
    path.push(".users");
    let Ok(file) = std::fs::OpenOptions::new().write(true).open(&path) else {
        return Ok(None);
    };
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(file)),
        Err(_) => Err(InUse),
    }
}

/// Whether the engine answers (for `doctor`): its server version, or why not.
pub fn probe(binary: &str) -> Result<String, EnvError> {
    let out = engine(binary, &["version", "--format", "{{.Server.Version}}"])?;
    if out.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(engine_error(binary, "version", &out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_persistent_container_is_reused_only_when_made_from_the_same_settings() {
        let mut settings = BackendSettings::default();
        let agent = std::path::Path::new("/opt/vibeos-exec");
        let shape = |s: &BackendSettings| container_shape("img:1", s, None, Some("/root"), agent);
        let first = shape(&settings);
        assert_eq!(shape_change(&first, &shape(&settings)), None);
        settings
            .docker_volumes
            .push(super::super::settings::Volume {
                host: "/srv/data".into(),
                container: "/data".into(),
                read_only: false,
            });
        settings.container_memory = Some(512);
        let changed = shape_change(&first, &shape(&settings)).unwrap();
        assert!(changed.contains("terminal.docker_volumes"), "{changed}");
        assert!(
            changed.contains("terminal.container_memory: null then, 512 now"),
            "{changed}"
        );
        assert!(!changed.contains("docker_image"), "{changed}");
        // A container without the label (an older version's) cannot be judged.
        assert!(shape_change("", &first)
            .unwrap()
            .contains("another version"));
    }

    #[test]
    fn only_a_network_namespace_of_its_own_is_isolated() {
        for n in ["none", "bridge", "default", "private", "my-net", "NONE"] {
            assert!(network_isolated(n), "{n}");
        }
        for n in [
            "host",
            "HOST",
            "container:web",
            "ns:/proc/1/ns/net",
            "slirp4netns",
            "slirp4netns:allow_host_loopback=true",
            "pasta",
            "pasta:--map-gw",
            "",
        ] {
            assert!(!network_isolated(n), "{n}");
        }
    }

    #[test]
    fn execution_sockets_fit_in_sun_path_for_any_task_id() {
        // The container name embeds up to 40 characters of the task id; the socket path must
        // not (it used to: a task id over ~10 characters failed with "path must be shorter
        // than SUN_LEN").
        let task = "a-rather-long-task-identifier-of-a-host-app-0123456789";
        for persistent in [false, true] {
            let name = container_name(task, persistent);
            let dir = rpc_dir_for(&name, persistent);
            let socket = dir
                .join(
                    "0123456789abcdef0123456789abcdef"
                        .get(..EXEC_DIR_CHARS)
                        .unwrap_or_default(),
                )
                .join("rpc.sock");
            assert!(
                socket.as_os_str().len() <= MAX_SOCKET_PATH,
                "{}",
                socket.display()
            );
            // Stable for a persistent container (its mount source survives restarts),
            // unguessable otherwise.
            assert_eq!(rpc_dir_for(&name, persistent) == dir, persistent);
        }
    }
}
