//! The modal backend: one Modal sandbox per task (SPEC §9), driven through the official SDK in
//! a sidecar process ([`super::modal_sidecar`]).
//!
//! Commands run as sandbox execs under the same process-group wrapper the CLI backends use, so
//! an interrupt or a timeout kills the command's whole group inside the sandbox (one more exec
//! running `kill`) and the sandbox lives on — Modal itself offers no per-exec kill, and
//! terminating the sandbox, as the system this replaces does, would lose the task's state.
//! Tools run in the sandbox through the tool agent (uploaded once per sandbox, spoken to over
//! one streaming exec). Files move with the SDK's filesystem API. A sandbox that Modal ended
//! (its lifetime ran out, or it was terminated elsewhere) is recreated once, with a log line
//! saying so; the task's files there are gone, which the log says too.

use super::agent::{checked_agent_binary, AgentClient, AgentLaunch};
use super::modal_sidecar::{Sidecar, SidecarExec, HELLO_TIMEOUT, OP_TIMEOUT};
use super::process::{group_kill, group_wrapper};
use super::Site;
use super::{
    BackendSettings, Channel, EnvError, Environment, ExecSpec, GroupSignal, Process, Spawned,
};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where the agent binary is uploaded in a sandbox.
const AGENT_DIR: &str = "/tmp/.vibeos-exec-agent";

/// The private dir of process-group files in a sandbox.
const PG_DIR: &str = "/tmp/.vibeos-exec-pg";

/// Modal's longest sandbox lifetime; idle sandboxes are stopped earlier by
/// `terminal.lifetime_seconds`.
const SANDBOX_TIMEOUT_SECS: u64 = 24 * 3600;

/// How long a kill exec may take.
const KILL_TIMEOUT: Duration = Duration::from_secs(30);

/// The sandbox of one task.
pub struct ModalEnv {
    inner: Arc<Inner>,
    agent: AgentClient,
}

/// What the environment and its agent's launcher share.
struct Inner {
    task: String,
    image: String,
    sidecar: Arc<Sidecar>,
    sandbox: Mutex<Sandbox>,
    site: Site,
    cpu: Option<f64>,
    memory: Option<u64>,
    /// Whether `site.workdir` is the user's terminal.cwd (not our default).
    configured_cwd: bool,
}

struct Sandbox {
    id: String,
    /// Whether the agent binary is in this sandbox.
    agent_uploaded: bool,
    /// Set once the sandbox had to be recreated: a second loss is an error, not a loop.
    recreated: bool,
}

fn modal_err(what: &str, message: impl Into<String>) -> EnvError {
    EnvError::Command {
        backend: "modal",
        what: what.into(),
        message: message.into(),
    }
}

impl ModalEnv {
    /// Checks the credentials and the service, then creates the sandbox of `task`.
    pub fn start(settings: &BackendSettings, task: &str) -> Result<ModalEnv, EnvError> {
        let image = settings.modal_image.clone().ok_or_else(|| {
            modal_err(
                "start",
                "terminal.modal_image is not set; name a registry image or a Modal image id",
            )
        })?;
        require_tokens()?;
        // Said, not silently dropped: a Modal sandbox ends with its host here.
        if settings.container_persistent {
            tracing::warn!(
                "backends: terminal.container_persistent is not applied by the modal backend; \
                 the sandbox is terminated when this host is done with it"
            );
        }
        if let Some(mb) = settings.container_disk {
            tracing::warn!(
                "backends: terminal.container_disk ({mb} MB) is not applied by the modal backend"
            );
        }
        // Before the sandbox exists: a failure after it would leave one behind.
        let agent_bin = checked_agent_binary("modal", settings.agent_binary.as_deref())?;
        let sidecar = Sidecar::get(&settings.modal_python)?;
        hello(&sidecar)?;
        let workdir = settings.cwd.clone().unwrap_or_else(|| "/root".into());
        let inner = Arc::new(Inner {
            task: task.to_string(),
            image,
            sidecar: Arc::clone(&sidecar),
            sandbox: Mutex::new(Sandbox {
                id: String::new(),
                agent_uploaded: false,
                recreated: false,
            }),
            site: Site {
                workdir,
                python: settings.python.clone(),
            },
            cpu: settings.container_cpu,
            memory: settings.container_memory,
            configured_cwd: settings.cwd.is_some(),
        });
        let id = inner.create()?;
        inner.lock().id = id;
        let agent = agent_client(Arc::clone(&inner), agent_bin, settings.shell_session);
        Ok(ModalEnv { inner, agent })
    }

    /// The current sandbox id.
    pub fn sandbox_id(&self) -> String {
        self.inner.sandbox_id()
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Sandbox> {
        self.sandbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn sandbox_id(&self) -> String {
        self.lock().id.clone()
    }

    fn create(&self) -> Result<String, EnvError> {
        let (reply, _) = self.sidecar.call(
            "creating the sandbox",
            json!({
                "op": "create",
                "image": self.image,
                // A sandbox's workdir is created when missing: a configured terminal.cwd is
                // entered by the bootstrap and the tools instead, which report a missing one
                // naming the key (as every other backend does).
                "workdir": if self.configured_cwd { None } else { Some(&self.site.workdir) },
                "timeout": SANDBOX_TIMEOUT_SECS,
                "cpu": self.cpu,
                "memory": self.memory,
                "tags": super::owner::cloud_labels(&self.task, false),
            }),
            b"",
            OP_TIMEOUT,
        )?;
        let id = reply
            .get("sandbox_id")
            .and_then(|v| v.as_str())
            .ok_or_else(|| modal_err("creating the sandbox", "the reply has no sandbox id"))?
            .to_string();
        // The private dir of process-group files, before any command runs. A sandbox that
        // cannot be prepared is terminated: nobody would ever stop it otherwise.
        let prepared = self
            .sidecar
            .exec(
                &id,
                &[
                    "sh".into(),
                    "-c".into(),
                    format!("umask 077 && mkdir -p {PG_DIR} {AGENT_DIR}"),
                ],
                None,
                &[],
            )
            .and_then(|made| finish(made, KILL_TIMEOUT))
            .and_then(|code| match code {
                0 => Ok(()),
                _ => Err(modal_err(
                    "preparing the sandbox",
                    format!(
                        "mkdir exited with {code}; does image `{}` have a shell?",
                        self.image
                    ),
                )),
            });
        if let Err(e) = prepared {
            let _ = self.sidecar.call(
                "terminating the sandbox",
                json!({"op": "terminate", "sandbox_id": id}),
                b"",
                OP_TIMEOUT,
            );
            return Err(e);
        }
        tracing::info!(sandbox = %id, task = %self.task, image = %self.image, "backends: modal sandbox created");
        Ok(id)
    }

    /// Whether Modal still runs the sandbox.
    fn alive(&self, id: &str) -> bool {
        self.sidecar
            .call(
                "checking the sandbox",
                json!({"op": "alive", "sandbox_id": id}),
                b"",
                HELLO_TIMEOUT,
            )
            .ok()
            .and_then(|(v, _)| v.get("alive").and_then(|a| a.as_bool()))
            .unwrap_or(false)
    }

    /// Runs `op` against the sandbox; if it fails because Modal ended the sandbox, creates a
    /// new one — once per environment — and runs `op` again there.
    fn with_sandbox<T>(&self, op: impl Fn(&str) -> Result<T, EnvError>) -> Result<T, EnvError> {
        let id = self.sandbox_id();
        let first = match op(&id) {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if self.alive(&id) {
            return Err(first);
        }
        {
            let mut sb = self.lock();
            if sb.id == id {
                if sb.recreated {
                    return Err(modal_err(
                        "using the sandbox",
                        format!("sandbox {id} of task {} ended again after it was recreated once ({first}); check the Modal dashboard and the sandbox's lifetime", self.task),
                    ));
                }
                tracing::warn!(
                    sandbox = %id,
                    task = %self.task,
                    "backends: modal sandbox {id} of task {} has ended (expired or terminated outside vibeos-exec); creating a new one once — files written there are gone",
                    self.task
                );
                let new_id = self.create()?;
                sb.id = new_id;
                sb.agent_uploaded = false;
                sb.recreated = true;
            }
        }
        let id = self.sandbox_id();
        op(&id)
    }
}

/// The agent's launcher: uploads the binary once per sandbox and starts it in a streaming
/// exec — through [`Inner::with_sandbox`], so an ended sandbox is recreated here too.
fn agent_client(
    inner: Arc<Inner>,
    agent_bin: std::path::PathBuf,
    shell_session: bool,
) -> AgentClient {
    AgentClient::new("modal", move || {
        let target = format!("{AGENT_DIR}/vibeos-exec");
        inner.with_sandbox(|id| {
            let uploaded = inner.lock().agent_uploaded;
            if !uploaded {
                let data = std::fs::read(&agent_bin).map_err(|e| EnvError::Agent {
                    backend: "modal",
                    message: format!("cannot read {}: {e}", agent_bin.display()),
                })?;
                write_file(&inner.sidecar, id, &target, &data)?;
                let chmod = inner.sidecar.exec(
                    id,
                    &["chmod".into(), "0755".into(), target.clone()],
                    None,
                    &[],
                )?;
                if finish(chmod, KILL_TIMEOUT)? != 0 {
                    return Err(modal_err("installing the tool agent", "chmod failed"));
                }
                let mut sb = inner.lock();
                if sb.id == id {
                    sb.agent_uploaded = true;
                }
            }
            let mut argv = vec![target.clone(), "backend-agent".to_string()];
            if !shell_session {
                argv.push("--no-shell-session".into());
            }
            Ok(AgentLaunch {
                process: spawn_in(&inner.sidecar, id, &ExecSpec::new(argv), &inner.site.python)?,
                socket: None,
            })
        })
    })
}

/// Starts `spec` in sandbox `id` in its own process group.
fn spawn_in(
    sidecar: &Arc<Sidecar>,
    id: &str,
    spec: &ExecSpec,
    python: &str,
) -> Result<Spawned, EnvError> {
    if spec.argv.is_empty() {
        return Err(modal_err("starting a command", "empty argv"));
    }
    let pgid_file = format!("{PG_DIR}/pg-{}", super::random_hex(8));
    // Variables travel in the exec request (not in argv, where `ps` in the sandbox shows
    // them); the wrapper does the `cd`, so a missing directory is the same error as elsewhere.
    let bare = ExecSpec {
        argv: spec.argv.clone(),
        cwd: spec.cwd.clone(),
        env: Vec::new(),
    };
    let argv = vec![
        "sh".to_string(),
        "-c".to_string(),
        group_wrapper(&bare, &pgid_file, python),
    ];
    let SidecarExec {
        stdin,
        stdout,
        stderr,
        exit,
    } = sidecar.exec(id, &argv, None, &spec.env)?;
    Ok(Spawned {
        stdin: Some(Box::new(stdin)),
        stdout: Some(Box::new(stdout)),
        stderr: Some(Box::new(stderr)),
        process: Arc::new(ModalProcess {
            sidecar: Arc::clone(sidecar),
            sandbox_id: id.to_string(),
            pgid_file,
            exit,
        }),
    })
}

/// Runs a started helper exec to its end (stdin closed, output discarded) within `timeout`.
fn finish(exec: SidecarExec, timeout: Duration) -> Result<i32, EnvError> {
    let SidecarExec {
        stdin,
        mut stdout,
        mut stderr,
        exit,
    } = exec;
    drop(stdin);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut stdout, &mut std::io::sink());
    });
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut stderr, &mut std::io::sink());
    });
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(code) = exit.try_get() {
            return Ok(code);
        }
        if std::time::Instant::now() > deadline {
            return Err(EnvError::Timeout {
                backend: "modal",
                what: "a helper command in the sandbox".into(),
                seconds: timeout.as_secs(),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn write_file(sidecar: &Sidecar, id: &str, path: &str, data: &[u8]) -> Result<(), EnvError> {
    sidecar.call(
        &format!("uploading {path}"),
        json!({"op": "write", "sandbox_id": id, "path": path, "size": data.len()}),
        data,
        OP_TIMEOUT,
    )?;
    Ok(())
}

fn hello(sidecar: &Sidecar) -> Result<(), EnvError> {
    sidecar.call(
        "checking the Modal credentials and API",
        json!({"op": "hello", "timeout": HELLO_TIMEOUT.as_secs() - 5}),
        b"",
        HELLO_TIMEOUT,
    )?;
    Ok(())
}

/// Checks that the Modal API answers and takes the credentials (doctor).
pub fn probe(python: &str) -> Result<String, EnvError> {
    require_tokens()?;
    let sidecar = Sidecar::get(python)?;
    let (reply, _) = sidecar.call(
        "checking the Modal credentials and API",
        json!({"op": "hello", "timeout": HELLO_TIMEOUT.as_secs() - 5}),
        b"",
        HELLO_TIMEOUT,
    )?;
    Ok(format!(
        "{} (modal SDK {})",
        super::modal_sidecar::server_url(),
        reply.get("sdk").and_then(|v| v.as_str()).unwrap_or("?")
    ))
}

/// The credentials the sidecar's SDK reads must be in this process's environment.
fn require_tokens() -> Result<(), EnvError> {
    for var in ["MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"] {
        if std::env::var_os(var).is_none_or(|v| v.is_empty()) {
            return Err(EnvError::Unreachable {
                backend: "modal",
                message: format!("{var} is not set in the environment of vibeos-exec"),
            });
        }
    }
    Ok(())
}

/// `vibeos-exec backends gc` for Modal: terminates the running sandboxes of this product's app
/// tagged `vibeos-exec=1` whose owner on this machine is gone (the same rule as daytona's, see
/// [`super::owner::cloud_verdict`]). Modal would end them only when their lifetime (a day) ran
/// out. `python` is `terminal.modal_python`.
pub fn gc(python: &str, all: bool) -> Result<super::docker::GcReport, EnvError> {
    require_tokens()?;
    let sidecar = Sidecar::get(python)?;
    hello(&sidecar)?;
    let (reply, _) = sidecar.call(
        "listing sandboxes",
        json!({"op": "list", "tags": {super::owner::PRODUCT: "1"}}),
        b"",
        OP_TIMEOUT,
    )?;
    let mut report = super::docker::GcReport::default();
    let listed = reply.get("sandboxes").and_then(|v| v.as_array());
    for sb in listed.map(Vec::as_slice).unwrap_or_default() {
        let Some(id) = sb.get("sandbox_id").and_then(|v| v.as_str()) else {
            continue;
        };
        let tags = sb.get("tags").cloned().unwrap_or_default();
        match super::owner::cloud_verdict(&tags, all) {
            super::owner::Verdict::Keep(why) => {
                tracing::info!(sandbox = %id, "backends gc: modal sandbox kept: {why}");
                report.kept.push(id.to_string());
            }
            super::owner::Verdict::Remove => {
                sidecar.call(
                    &format!("terminating sandbox {id}"),
                    json!({"op": "terminate", "sandbox_id": id}),
                    b"",
                    OP_TIMEOUT,
                )?;
                report.removed.push(id.to_string());
            }
        }
    }
    Ok(report)
}

/// A command running in a sandbox.
struct ModalProcess {
    sidecar: Arc<Sidecar>,
    sandbox_id: String,
    pgid_file: String,
    exit: Arc<super::modal_sidecar::ExitCell>,
}

impl Process for ModalProcess {
    fn wait(&self) -> Result<i32, EnvError> {
        Ok(self.exit.wait())
    }

    fn try_wait(&self) -> Result<Option<i32>, EnvError> {
        Ok(self.exit.try_get())
    }

    fn kill(&self, signal: GroupSignal) -> Result<(), EnvError> {
        if self.exit.try_get().is_some() {
            return Ok(());
        }
        let argv = [
            "sh".to_string(),
            "-c".to_string(),
            group_kill(&self.pgid_file, signal),
        ];
        let exec = self.sidecar.exec(&self.sandbox_id, &argv, None, &[])?;
        finish(exec, KILL_TIMEOUT).map(|_| ())
    }
}

impl Environment for ModalEnv {
    fn fresh_runner(&self) -> Option<super::FreshRun> {
        // A sandbox exec through the SDK: Modal starts it, no process of the sandbox's
        // executions is in the way.
        let inner = Arc::clone(&self.inner);
        Some(Arc::new(move |argv: &[String]| {
            let id = inner.sandbox_id();
            let made = inner.sidecar.exec(&id, argv, None, &[])?;
            finish(made, KILL_TIMEOUT).map(|_| ())
        }))
    }

    fn backend(&self) -> &'static str {
        "modal"
    }

    fn isolated(&self) -> bool {
        true
    }

    fn site(&self) -> &Site {
        &self.inner.site
    }

    fn spawn(&self, spec: &ExecSpec) -> Result<Spawned, EnvError> {
        self.inner
            .with_sandbox(|id| spawn_in(&self.inner.sidecar, id, spec, &self.inner.site.python))
    }

    fn upload(&self, data: &[u8], path: &str, mode: u32) -> Result<(), EnvError> {
        self.inner.with_sandbox(|id| {
            write_file(&self.inner.sidecar, id, path, data)?;
            let chmod = self.inner.sidecar.exec(
                id,
                &["chmod".into(), format!("{mode:o}"), path.to_string()],
                None,
                &[],
            )?;
            match finish(chmod, KILL_TIMEOUT)? {
                0 => Ok(()),
                code => Err(modal_err(
                    &format!("setting the mode of {path}"),
                    format!("chmod exited with {code}"),
                )),
            }
        })
    }

    fn download(&self, path: &str) -> Result<Vec<u8>, EnvError> {
        self.inner.with_sandbox(|id| {
            self.inner
                .sidecar
                .call(
                    &format!("downloading {path}"),
                    json!({"op": "read", "sandbox_id": id, "path": path}),
                    b"",
                    OP_TIMEOUT,
                )
                .map(|(_, data)| data)
        })
    }

    fn open_channel(&self, exec_id: &str, _token: &str) -> Result<Channel, EnvError> {
        super::relay::channel("modal", exec_id)
    }

    fn relayed(&self) -> bool {
        true
    }

    fn agent(&self) -> Option<&AgentClient> {
        Some(&self.agent)
    }

    fn stop(&self) {
        self.agent.stop();
        let id = self.sandbox_id();
        match self.inner.sidecar.call(
            "terminating the sandbox",
            json!({"op": "terminate", "sandbox_id": id}),
            b"",
            HELLO_TIMEOUT,
        ) {
            Ok(_) => {
                tracing::info!(sandbox = %id, task = %self.inner.task, "backends: modal sandbox terminated")
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, "backends: cannot terminate the modal sandbox: {e}")
            }
        }
    }
}
