//! The ssh backend: commands on a remote host over one OpenSSH ControlMaster connection.
//!
//! The master is opened once per environment (BatchMode, so a missing key or an unknown host
//! key is an error, never a prompt; known-hosts policy from `terminal.ssh_known_hosts`), and
//! every command, the tool agent and the environment's RPC forward ride on it: a command costs
//! one channel open (~14 ms) instead of a new connection (~230 ms). Executions reach the host
//! through one OpenSSH stream-local forward per environment (`-R remote.sock:local.sock`, added
//! to the running master with `-O forward` at the first execution) in a private 0700 dir on the
//! remote side, their connections routed by token ([`super::route`]). Killing the local ssh
//! client does not stop the remote command, so timeouts and interrupts kill the remote process
//! group explicitly.

use super::agent::{agent_binary, AgentClient, AgentLaunch, AgentSocket};
use super::process::{group_kill, group_wrapper};
use super::route::Router;
use super::settings::{BackendSettings, KnownHosts};
use super::Site;
use super::{
    run_client, shell_quote, Channel, ClientProcess, Connections, EnvError, Environment, ExecSpec,
    Spawned,
};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const OP_TIMEOUT: Duration = Duration::from_secs(30);

/// Connection options shared by the master and every command over it.
#[derive(Clone)]
struct Target {
    host: String,
    user: Option<String>,
    port: Option<u16>,
    key: Option<PathBuf>,
    known_hosts: KnownHosts,
    control: PathBuf,
}

impl Target {
    fn ssh(&self) -> Command {
        let mut cmd = Command::new("ssh");
        cmd.args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"])
            .arg("-o")
            .arg(format!("ControlPath={}", self.control.display()));
        match &self.known_hosts {
            KnownHosts::Strict => {
                cmd.args(["-o", "StrictHostKeyChecking=yes"]);
            }
            KnownHosts::AcceptNew => {
                cmd.args(["-o", "StrictHostKeyChecking=accept-new"]);
            }
            KnownHosts::File(f) => {
                cmd.args(["-o", "StrictHostKeyChecking=yes", "-o"])
                    .arg(format!("UserKnownHostsFile={}", f.display()));
            }
        }
        if let Some(k) = &self.key {
            cmd.arg("-i").arg(k).args(["-o", "IdentitiesOnly=yes"]);
        }
        if let Some(p) = self.port {
            cmd.arg("-p").arg(p.to_string());
        }
        if let Some(u) = &self.user {
            cmd.arg("-l").arg(u);
        }
        cmd
    }

    /// A client running the shell line `script` on the host over the master.
    fn remote(&self, script: &str) -> Command {
        let mut cmd = self.ssh();
        cmd.arg(&self.host).arg("--").arg(script);
        cmd
    }

    /// Runs the shell line `script` on the host to completion (administration: no wrapper).
    fn run(&self, script: &str, what: &str) -> Result<super::CommandOutput, EnvError> {
        run_client("ssh", &mut self.remote(script), b"", OP_TIMEOUT, what)
    }
}

/// One remote host, reached through its master connection.
pub struct SshEnv {
    target: Target,
    /// The shared RPC socket there (`<remote_env_dir>/rpc.sock`).
    rpc_remote: String,
    /// Its host end, set up with the first execution.
    router: std::sync::Mutex<Option<Arc<Router>>>,
    /// A private 0700 dir on the host for this environment's forwarded sockets.
    remote_env_dir: String,
    _control_dir: tempfile::TempDir,
    site: Site,
    agent: AgentClient,
}

fn ssh_error(what: &str, out: &super::CommandOutput) -> EnvError {
    EnvError::Command {
        backend: "ssh",
        what: what.into(),
        message: format!("{} (exit {:?})", out.stderr_text(), out.code),
    }
}

impl SshEnv {
    /// Opens the master connection to `terminal.ssh_host`.
    pub fn start(settings: &BackendSettings, _task: &str) -> Result<SshEnv, EnvError> {
        let host = settings.ssh_host.clone().ok_or(EnvError::Unreachable {
            backend: "ssh",
            message: "terminal.ssh_host is not set".into(),
        })?;
        let control_dir = tempfile::Builder::new()
            .prefix("vibeos-ssh-")
            .tempdir()
            .map_err(|e| EnvError::Unreachable {
                backend: "ssh",
                message: format!("cannot create the control socket dir: {e}"),
            })?;
        let _ =
            std::fs::set_permissions(control_dir.path(), std::fs::Permissions::from_mode(0o700));
        let target = Target {
            host: host.clone(),
            user: settings.ssh_user.clone(),
            port: settings.ssh_port,
            key: settings.ssh_key.clone(),
            known_hosts: settings.ssh_known_hosts.clone(),
            control: control_dir.path().join("cm"),
        };
        let mut master = target.ssh();
        master
            .args(["-o", "ControlMaster=yes", "-o", "ControlPersist=yes", "-fN"])
            .arg(&host);
        let out = run_client("ssh", &mut master, b"", CONNECT_TIMEOUT, "ssh master")?;
        if !out.success() {
            return Err(EnvError::Unreachable {
                backend: "ssh",
                message: format!(
                    "cannot connect to {host}: {}; check terminal.ssh_host/ssh_port/ssh_user/ssh_key and the host key",
                    out.stderr_text()
                ),
            });
        }
        let agent_target = target.clone();
        let agent_bin = agent_binary(settings.agent_binary.as_deref());
        let session_flag = if settings.shell_session {
            ""
        } else {
            " --no-shell-session"
        };
        let uploaded = Arc::new(std::sync::Mutex::new(None::<String>));
        let remote_env_dir = format!("/tmp/vibeos-exec-env-{}", super::random_hex(8));
        let agent_remote = format!("{remote_env_dir}/agent.sock");
        let agent_local = control_dir.path().join("agent.sock");
        let agent = AgentClient::new("ssh", move || {
            let bin = agent_bin.clone().map_err(|message| EnvError::Agent {
                backend: "ssh",
                message,
            })?;
            let mut slot = uploaded.lock().unwrap_or_else(|p| p.into_inner());
            let remote = match slot.as_ref() {
                Some(r) => r.clone(),
                None => {
                    let r = upload_agent(&agent_target, &bin)?;
                    *slot = Some(r.clone());
                    r
                }
            };
            let mut cmd = agent_target.remote(&format!(
                "{remote} backend-agent --listen {}{session_flag}",
                shell_quote(&agent_remote)
            ));
            // Killing the client closes the agent's lifeline, which ends it.
            cmd.process_group(0);
            let (target, local, remote_sock) = (
                agent_target.clone(),
                agent_local.clone(),
                agent_remote.clone(),
            );
            let _ = std::fs::remove_file(&local);
            Ok(AgentLaunch {
                process: ClientProcess::spawn("ssh", cmd, None)?,
                socket: Some(AgentSocket {
                    local: agent_local.clone(),
                    prepare: Some(Box::new(move || {
                        let _ = std::fs::remove_file(&local);
                        let mut fwd = target.ssh();
                        fwd.args(["-O", "forward", "-L"])
                            .arg(format!("{}:{remote_sock}", local.display()))
                            .arg(&target.host);
                        let out = run_client("ssh", &mut fwd, b"", OP_TIMEOUT, "agent forward")?;
                        if out.success() {
                            Ok(())
                        } else {
                            Err(ssh_error("forwarding the agent socket", &out))
                        }
                    })),
                }),
            })
        });
        let mut env = SshEnv {
            target: target.clone(),
            rpc_remote: format!("{remote_env_dir}/rpc.sock"),
            router: std::sync::Mutex::new(None),
            remote_env_dir: remote_env_dir.clone(),
            _control_dir: control_dir,
            site: Site {
                workdir: String::new(),
                python: settings.python.clone(),
            },
            agent,
        };
        // One round trip: the private socket dir, and the home dir as default working dir.
        let out = target.run(
            &format!(
                "mkdir -m 0700 {} && cd && pwd",
                shell_quote(&remote_env_dir)
            ),
            "preparing the remote socket dir",
        )?;
        if !out.success() {
            return Err(ssh_error("preparing the remote socket dir", &out));
        }
        env.site.workdir = match &settings.cwd {
            Some(c) => c.clone(),
            None => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        };
        tracing::info!(host = %host, "backends: ssh master connected");
        Ok(env)
    }
}

/// Copies the agent binary to the host once (keyed by size and mtime) and returns its path
/// as a shell word that the remote shell expands.
fn upload_agent(target: &Target, bin: &std::path::Path) -> Result<String, EnvError> {
    let meta = std::fs::metadata(bin).map_err(|e| EnvError::Agent {
        backend: "ssh",
        message: format!("cannot read {}: {e}", bin.display()),
    })?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let name = format!("\"$HOME\"/.cache/vibeos-exec/agent-{}-{mtime}", meta.len());
    let script = format!(
        "test -x {name} && exit 0; mkdir -p \"$HOME\"/.cache/vibeos-exec && chmod 700 \"$HOME\"/.cache/vibeos-exec && cat > {name}.part && chmod 700 {name}.part && mv {name}.part {name}"
    );
    let data = std::fs::read(bin).map_err(|e| EnvError::Agent {
        backend: "ssh",
        message: format!("cannot read {}: {e}", bin.display()),
    })?;
    let mut cmd = target.ssh();
    cmd.arg(&target.host).arg("--").arg(&script);
    let out = run_client(
        "ssh",
        &mut cmd,
        &data,
        Duration::from_secs(300),
        "agent upload",
    )?;
    if !out.success() {
        return Err(ssh_error("uploading the tool agent", &out));
    }
    Ok(name)
}

impl SshEnv {
    /// The environment's shared RPC socket: forwarded once over the master, its connections
    /// routed to executions by token (see [`super::route`]).
    fn router(&self) -> Result<Arc<Router>, EnvError> {
        let mut slot = self.router.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = slot.as_ref() {
            return Ok(Arc::clone(r));
        }
        let local = self._control_dir.path().join("rpc.sock");
        let router = Router::listen(&local).map_err(|e| EnvError::Command {
            backend: "ssh",
            what: "listening for the RPC forward".into(),
            message: format!("{}: {e}", local.display()),
        })?;
        let mut fwd = self.target.ssh();
        fwd.args(["-O", "forward", "-R"])
            .arg(format!("{}:{}", self.rpc_remote, local.display()))
            .arg(&self.target.host);
        let out = run_client("ssh", &mut fwd, b"", OP_TIMEOUT, "RPC forward")?;
        if !out.success() {
            return Err(ssh_error("forwarding the RPC socket", &out));
        }
        let router = Arc::new(router);
        *slot = Some(Arc::clone(&router));
        Ok(router)
    }
}

impl Environment for SshEnv {
    fn backend(&self) -> &'static str {
        "ssh"
    }

    fn isolated(&self) -> bool {
        false
    }

    fn site(&self) -> &Site {
        &self.site
    }

    fn spawn(&self, spec: &ExecSpec) -> Result<Spawned, EnvError> {
        spec.check("ssh")?;
        let pgid_file = format!("{}/pg-{}", self.remote_env_dir, super::random_hex(8));
        let wrapper = group_wrapper(spec, &pgid_file, &self.site.python);
        let cmd = self
            .target
            .remote(&format!("sh -c {}", shell_quote(&wrapper)));
        let target = self.target.clone();
        ClientProcess::spawn(
            "ssh",
            cmd,
            Some(Box::new(move |signal| {
                let out = target.run(&group_kill(&pgid_file, signal), "killing a process group")?;
                if out.success() {
                    Ok(())
                } else {
                    Err(ssh_error("killing a process group", &out))
                }
            })),
        )
    }

    fn open_channel(&self, exec_id: &str, token: &str) -> Result<Channel, EnvError> {
        let (route, incoming) = self.router()?.register(token);
        Ok(Channel {
            connections: Connections::Routed(incoming),
            remote_socket: self.rpc_remote.clone(),
            remote_dir: format!("/tmp/vibeos-exec-{exec_id}"),
            hello: true,
            guard: Box::new(route),
        })
    }

    fn agent(&self) -> Option<&AgentClient> {
        Some(&self.agent)
    }

    fn stop(&self) {
        self.agent.stop();
        let _ = self.target.run(
            &format!("rm -rf {}", shell_quote(&self.remote_env_dir)),
            "remove socket dir",
        );
        let mut exit = self.target.ssh();
        exit.args(["-O", "exit"]).arg(&self.target.host);
        let _ = run_client("ssh", &mut exit, b"", OP_TIMEOUT, "ssh -O exit");
    }
}

impl Drop for SshEnv {
    fn drop(&mut self) {
        self.stop();
    }
}
