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
use super::process::{exec_line, group_kill, group_wrapper};
use super::route::Router;
use super::settings::{BackendSettings, KnownHosts};
use super::Site;
use super::{
    run_client, run_client_reading, shell_quote, Channel, ClientProcess, Connections, EnvError,
    Environment, ExecSpec, Spawned,
};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// In a control dir: the owner (`PID:START`), the host and the remote environment dir, one a
/// line.
const OWNER_FILE: &str = "owner";
/// How control dirs are named (in the temp dir, or /tmp).
const CONTROL_PREFIX: &str = "vibeos-ssh-";
const OP_TIMEOUT: Duration = Duration::from_secs(30);
/// Keepalives on every connection (the master's, and the fresh ones of the sweep): a host
/// that stops answering while the TCP connection stays open (a stopped sshd, a frozen VM, a
/// network that drops packets silently) ends the connection after about
/// `interval × (count + 1)` = 15–20 s with "Timeout, server not responding", instead of
/// hanging every call for as long as the kernel keeps the connection (minutes).
const SERVER_ALIVE_INTERVAL: u32 = 5;
/// Unanswered keepalives before the connection counts as dead.
const SERVER_ALIVE_COUNT_MAX: u32 = 3;

/// Connection options shared by the master and every command over it.
#[derive(Clone)]
struct Target {
    host: String,
    user: Option<String>,
    port: Option<u16>,
    key: Option<PathBuf>,
    known_hosts: KnownHosts,
    control: PathBuf,
    /// Printed by every remote command line before anything of ours runs, on stdout and on
    /// stderr: what the login shell printed before it (a `~/.bashrc` that echoes — bash reads
    /// it even for `ssh host cmd`) is dropped up to it. See [`AfterMarker`].
    marker: String,
    /// The master connection: opened again when it is found gone.
    master: Arc<Master>,
}

/// The master connection of an environment, shared by every clone of its [`Target`].
struct Master {
    /// How many times it was opened (0: not yet); held while it is checked or opened, so
    /// callers that find it gone open it once.
    generation: std::sync::Mutex<u64>,
    /// The environment's private dir on the host, made again with a new master.
    env_dir: String,
}

/// What the ssh client printed, as one line: it ends its lines with \r\n (it may hold a
/// tty).
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Target {
    fn ssh(&self) -> Command {
        self.ssh_via(true)
    }

    /// An ssh client over the master (`shared`), or on a connection of its own: a fresh
    /// `sshd` session that no process of the environment's executions can have stopped (the
    /// master's session process runs as the script's user).
    fn ssh_via(&self, shared: bool) -> Command {
        let mut cmd = Command::new("ssh");
        cmd.args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o"])
            .arg(format!("ServerAliveInterval={SERVER_ALIVE_INTERVAL}"))
            .arg("-o")
            .arg(format!("ServerAliveCountMax={SERVER_ALIVE_COUNT_MAX}"))
            .arg("-o")
            .arg(if shared {
                format!("ControlPath={}", ssh_option_path(&self.control))
            } else {
                "ControlPath=none".to_string()
            });
        match &self.known_hosts {
            KnownHosts::Strict => {
                cmd.args(["-o", "StrictHostKeyChecking=yes"]);
            }
            KnownHosts::AcceptNew => {
                cmd.args(["-o", "StrictHostKeyChecking=accept-new"]);
            }
            KnownHosts::File(f) => {
                cmd.args(["-o", "StrictHostKeyChecking=yes", "-o"])
                    .arg(format!("UserKnownHostsFile={}", ssh_option_path(f)));
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

    /// Whether the master answers on its control socket (a connect, no round trip: a master
    /// that exited removed the socket, a killed one left it refusing).
    fn master_alive(&self) -> bool {
        std::os::unix::net::UnixStream::connect(&self.control).is_ok()
    }

    /// The master's generation, after opening it when it is not there: the first time, and
    /// again when it was lost (killed, ended by its keepalives, the network gone). A new
    /// master has none of the old one's forwards; callers that set one up compare the
    /// generation they did it on ([`SshEnv::router`]; the agent's is set up at its start).
    fn ensure_master(&self) -> Result<u64, EnvError> {
        let mut generation = self
            .master
            .generation
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *generation > 0 && self.master_alive() {
            return Ok(*generation);
        }
        let again = *generation > 0;
        if again {
            tracing::warn!(host = %self.host, "backends: the ssh master connection was lost; connecting again");
        }
        // A killed master leaves its socket; a new one would not bind over it.
        let _ = std::fs::remove_file(&self.control);
        let mut master = self.ssh();
        master
            .args(["-o", "ControlMaster=yes", "-o", "ControlPersist=yes", "-fN"])
            .arg(&self.host);
        let out = run_client("ssh", &mut master, b"", CONNECT_TIMEOUT, "ssh master")?;
        if !out.success() {
            return Err(EnvError::Unreachable {
                backend: "ssh",
                message: format!(
                    "cannot connect to {}: {}; check terminal.ssh_host/ssh_port/ssh_user/ssh_key and the host key",
                    self.host,
                    one_line(&out.stderr_text())
                ),
            });
        }
        if again {
            // The host may have lost the dir (a reboot), and keeps the old forwards' sockets,
            // which a new forward could not bind over.
            let dir = shell_quote(&self.master.env_dir);
            let out = self.run(
                &format!("mkdir -p -m 0700 {dir} && rm -f {dir}/rpc.sock {dir}/agent.sock"),
                "preparing the remote socket dir again",
            )?;
            if !out.success() {
                return Err(ssh_error("preparing the remote socket dir again", &out));
            }
        }
        *generation += 1;
        Ok(*generation)
    }

    /// A client running the shell line `script` on the host over the master, after the
    /// marker (read its output through [`AfterMarker`] or [`Target::run`]).
    fn remote(&self, script: &str) -> Command {
        let mut cmd = self.ssh();
        cmd.arg(&self.host).arg("--").arg(format!(
            "printf %s {m}; printf %s {m} >&2; {script}",
            m = self.marker
        ));
        cmd
    }

    /// Runs the shell line `script` on the host to completion (administration: no wrapper),
    /// its output without what the login shell printed first.
    fn run(&self, script: &str, what: &str) -> Result<super::CommandOutput, EnvError> {
        let mut out = run_client("ssh", &mut self.remote(script), b"", OP_TIMEOUT, what)?;
        out.stdout = after_marker(out.stdout, self.marker.as_bytes());
        out.stderr = after_marker(out.stderr, self.marker.as_bytes());
        Ok(out)
    }

    /// Spawns the shell line `script` on the host, its output streams starting after the
    /// marker.
    fn spawn(
        &self,
        script: &str,
        kill: Option<super::process::RemoteKill>,
    ) -> Result<Spawned, EnvError> {
        let mut spawned = ClientProcess::spawn("ssh", self.remote(script), kill)?;
        self.strip_noise(&mut spawned);
        Ok(spawned)
    }

    fn strip_noise(&self, spawned: &mut Spawned) {
        let marker = self.marker.as_bytes().to_vec();
        spawned.stdout = spawned
            .stdout
            .take()
            .map(|s| Box::new(AfterMarker::new(s, marker.clone())) as Box<dyn Read + Send>);
        spawned.stderr = spawned
            .stderr
            .take()
            .map(|s| Box::new(AfterMarker::new(s, marker)) as Box<dyn Read + Send>);
    }
}

/// `out` from just after the first `marker`; all of it when there is none (the shell failed
/// before our line ran, and what it said is the error).
fn after_marker(out: Vec<u8>, marker: &[u8]) -> Vec<u8> {
    match out.windows(marker.len()).position(|w| w == marker) {
        Some(i) => out[i + marker.len()..].to_vec(),
        None => out,
    }
}

/// How much start-up noise is held while looking for the marker; beyond it the oldest bytes
/// are dropped (they can only be noise: the marker has not come yet).
const NOISE_MAX: usize = 1 << 20;

/// A remote command's output stream from just after the marker its command line prints first
/// (see [`Target::remote`]). At EOF without the marker, everything held is passed on.
pub(crate) struct AfterMarker {
    inner: Box<dyn Read + Send>,
    marker: Vec<u8>,
    /// Bytes read while looking for the marker; `None` once found.
    held: Option<Vec<u8>>,
    /// Bytes after the marker not yet returned.
    pending: Vec<u8>,
}

impl AfterMarker {
    pub(crate) fn new(inner: Box<dyn Read + Send>, marker: Vec<u8>) -> Self {
        AfterMarker {
            inner,
            marker,
            held: Some(Vec::new()),
            pending: Vec::new(),
        }
    }
}

impl Read for AfterMarker {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while let Some(held) = self.held.as_mut() {
            let mut chunk = [0u8; 8192];
            let n = self.inner.read(&mut chunk)?;
            if n == 0 {
                self.pending = std::mem::take(held);
                self.held = None;
                break;
            }
            held.extend_from_slice(&chunk[..n]);
            if let Some(i) = held
                .windows(self.marker.len())
                .position(|w| w == self.marker)
            {
                self.pending = held.split_off(i + self.marker.len());
                self.held = None;
            } else if held.len() > NOISE_MAX {
                let drop_to = held.len() - self.marker.len();
                held.drain(..drop_to);
            }
        }
        if !self.pending.is_empty() {
            let n = buf.len().min(self.pending.len());
            buf[..n].copy_from_slice(&self.pending[..n]);
            self.pending.drain(..n);
            return Ok(n);
        }
        self.inner.read(buf)
    }
}

/// One remote host, reached through its master connection.
pub struct SshEnv {
    target: Target,
    /// The shared RPC socket there (`<remote_env_dir>/rpc.sock`).
    rpc_remote: String,
    /// Its host end, set up with the first execution, and the master generation its forward
    /// was added to (a new master needs it again).
    router: std::sync::Mutex<Option<(Arc<Router>, u64)>>,
    /// A private 0700 dir on the host for this environment's forwarded sockets.
    remote_env_dir: String,
    _control_dir: tempfile::TempDir,
    site: Site,
    agent: AgentClient,
}

fn ssh_error(what: &str, out: &super::CommandOutput) -> EnvError {
    // The client ends its lines with \r\n (it may hold a tty): one line, spaces between what
    // it said, and the exit as a reader writes it.
    let said = one_line(&out.stderr_text());
    let exit = match out.code {
        Some(code) if code < 0 => format!("killed by signal {}", -code),
        Some(code) => format!("exit {code}"),
        None => "timed out".to_string(),
    };
    let message = if said.is_empty() {
        format!("the ssh client said nothing ({exit})")
    } else {
        format!("{said} ({exit})")
    };
    EnvError::Command {
        backend: "ssh",
        what: what.into(),
        message,
    }
}

/// [`ssh_error`] for a UNIX-socket forward, with the server setting that refuses them: a
/// hardened sshd (`AllowStreamLocalForwarding no`, `DisableForwarding yes`) fails every
/// execution here, even a script that calls no tool, and the client's words name no setting.
fn forward_error(what: &str, out: &super::CommandOutput) -> EnvError {
    match ssh_error(what, out) {
        EnvError::Command {
            backend,
            what,
            message,
        } => EnvError::Command {
            backend,
            what,
            message: format!(
                "{message}; the ssh server must allow forwarding UNIX sockets (sshd_config: \
                 `AllowStreamLocalForwarding yes`, and no `DisableForwarding yes`), which \
                 carries every execution's tool channel"
            ),
        },
        other => other,
    }
}

impl SshEnv {
    /// Opens the master connection to `terminal.ssh_host`.
    pub fn start(settings: &BackendSettings, _task: &str) -> Result<SshEnv, EnvError> {
        let host = settings.ssh_host.clone().ok_or(EnvError::Unreachable {
            backend: "ssh",
            message: "terminal.ssh_host is not set".into(),
        })?;
        // The master's socket (`cm.` plus 16 characters while it starts) and the forwarded
        // sockets live in this dir: below a long $TMPDIR they would not fit in sun_path
        // ("unix_listener: path too long"), so such a TMPDIR is passed over for /tmp.
        let mut base = std::env::temp_dir();
        if base.as_os_str().len() + "/vibeos-ssh-XXXXXX/cm.XXXXXXXXXXXXXXXX".len() > 107 {
            base = "/tmp".into();
        }
        let control_dir = tempfile::Builder::new()
            .prefix("vibeos-ssh-")
            .tempdir_in(base)
            .map_err(|e| EnvError::Unreachable {
                backend: "ssh",
                message: format!("cannot create the control socket dir: {e}"),
            })?;
        let _ =
            std::fs::set_permissions(control_dir.path(), std::fs::Permissions::from_mode(0o700));
        let remote_env_dir = format!("/tmp/vibeos-exec-env-{}", super::random_hex(8));
        // Who owns this master, and what it keeps over there: `backends gc` ends the masters
        // of crashed owners (ControlPersist keeps them up for ever) and removes those dirs.
        let _ = std::fs::write(
            control_dir.path().join(OWNER_FILE),
            format!(
                "{}\n{host}\n{remote_env_dir}\n",
                super::owner::owner_label()
            ),
        );
        let target = Target {
            host: host.clone(),
            user: settings.ssh_user.clone(),
            port: settings.ssh_port,
            key: settings.ssh_key.clone(),
            known_hosts: settings.ssh_known_hosts.clone(),
            control: control_dir.path().join("cm"),
            marker: format!("vibeos-ssh-{}:", super::random_hex(8)),
            master: Arc::new(Master {
                generation: std::sync::Mutex::new(0),
                env_dir: remote_env_dir.clone(),
            }),
        };
        target.ensure_master()?;
        let agent_target = target.clone();
        let agent_bin = agent_binary(settings.agent_binary.as_deref());
        let session_flag = if settings.shell_session {
            ""
        } else {
            " --no-shell-session"
        };
        let agent_remote = format!("{remote_env_dir}/agent.sock");
        let agent_local = control_dir.path().join("agent.sock");
        let agent = AgentClient::new("ssh", move || {
            let bin = agent_bin.clone().map_err(|message| EnvError::Agent {
                backend: "ssh",
                message,
            })?;
            // The agent is (re)started when the last one is gone: the master may have gone with
            // it. And its cached copy is checked every time: another host's upload may have
            // pruned it since (see `upload_agent`).
            agent_target.ensure_master()?;
            let remote = upload_agent(&agent_target, &bin)?;
            let mut cmd = agent_target.remote(&format!(
                "{remote} backend-agent --listen {}{session_flag}",
                shell_quote(&agent_remote)
            ));
            // Killing the client closes the agent's lifeline, which ends it.
            cmd.process_group(0);
            let mut process = ClientProcess::spawn("ssh", cmd, None)?;
            agent_target.strip_noise(&mut process);
            let (target, local, remote_sock) = (
                agent_target.clone(),
                agent_local.clone(),
                agent_remote.clone(),
            );
            let _ = std::fs::remove_file(&local);
            Ok(AgentLaunch {
                process,
                socket: Some(AgentSocket {
                    local: agent_local.clone(),
                    prepare: Some(Box::new(move || {
                        // A restarted agent on the same master: the master still holds the
                        // last one's forward, and would take the same one again as a no-op
                        // while its socket file is removed below (every later call then
                        // failed with "cannot connect"). Cancelled first; an error (no such
                        // forward) is expected on a new master.
                        let spec = format!("{}:{remote_sock}", local.display());
                        let mut cancel = target.ssh();
                        cancel
                            .args(["-O", "cancel", "-L"])
                            .arg(&spec)
                            .arg(&target.host);
                        let _ = run_client("ssh", &mut cancel, b"", OP_TIMEOUT, "agent forward");
                        let _ = std::fs::remove_file(&local);
                        let mut fwd = target.ssh();
                        fwd.args(["-O", "forward", "-L"])
                            .arg(format!("{}:{remote_sock}", local.display()))
                            .arg(&target.host);
                        let out = run_client("ssh", &mut fwd, b"", OP_TIMEOUT, "agent forward")?;
                        if out.success() {
                            Ok(())
                        } else {
                            Err(forward_error("forwarding the agent socket", &out))
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

/// Run after a new agent copy is in place: removes the older copies, which each host build
/// left behind (~144 MB each). Only files named by this scheme (`agent-<size>-<mtime>`, digits
/// only: not a `.part` being written) and unused for over a day (`-mtime +0`): every host
/// renews its copy's mtime when it starts an environment or restarts its agent, so a copy that
/// another host may be about to run is never taken; a running agent whose file goes on
/// running, and its host checks (and uploads again) before it starts the next one. Best
/// effort: a failure here never fails the upload.
const PRUNE_AGENTS: &str = "find \"$HOME\"/.cache/vibeos-exec -maxdepth 1 -type f -name 'agent-*' \
     ! -name 'agent-*[!0-9-]*' -mtime +0 -exec rm -f {} + 2>/dev/null; exit 0";

/// Copies the agent binary to the host once (keyed by size and mtime) and returns its path
/// as a shell word that the remote shell expands.
///
/// A cached copy is used only when it is executable and has the binary's size: a copy cut
/// short (a full disk, a killed upload of an older version, a user's mistake) would otherwise
/// fail every tool for good ("it exited before listening") and never be replaced. Comparing
/// the size costs next to nothing (GNU and BSD `wc -c` take a regular file's size from its
/// metadata); a checksum would read the whole binary on every environment start. A new copy is written to a name of its
/// own (`.part.<pid>`) and renamed over the cached name: the final name never holds a
/// half-written file, and two hosts uploading at once do not write into one file.
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
    let size = meta.len();
    let name = format!("\"$HOME\"/.cache/vibeos-exec/agent-{size}-{mtime}");
    // The cached copy's size as its own word (BSD `wc` pads it with blanks). A copy in use
    // has its mtime renewed, so the pruning of another host's upload spares it.
    let cached = format!(
        "if test -x {name}; then s=$(wc -c < {name} 2>/dev/null); test \"$s\" && test $s -eq {size} && touch -c {name} && exit 0; fi; exit 3"
    );
    // First only the check, with no input: the binary (~144 MB) is read only when it must be
    // sent, and then streamed, never held in memory whole (a valid cache read it all anyway,
    // twice: ~300 MB of peak RSS per environment start).
    let mut check = target.ssh();
    check.arg(&target.host).arg("--").arg(&cached);
    let out = run_client("ssh", &mut check, b"", OP_TIMEOUT, "agent cache check")?;
    if out.success() {
        return Ok(name);
    }
    let script = format!(
        "mkdir -p \"$HOME\"/.cache/vibeos-exec && chmod 700 \"$HOME\"/.cache/vibeos-exec || exit; \
         t={name}.part.$$; trap 'rm -f \"$t\"' EXIT; \
         cat > \"$t\" || exit; s=$(wc -c < \"$t\"); \
         if test $s -ne {size}; then echo \"the copy there has $s of {size} bytes\" >&2; exit 1; fi; \
         chmod 700 \"$t\" && mv -f \"$t\" {name} || exit; {PRUNE_AGENTS}"
    );
    let data = std::fs::File::open(bin).map_err(|e| EnvError::Agent {
        backend: "ssh",
        message: format!("cannot read {}: {e}", bin.display()),
    })?;
    let mut cmd = target.ssh();
    cmd.arg(&target.host).arg("--").arg(&script);
    let out = run_client_reading(
        "ssh",
        &mut cmd,
        Box::new(data),
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
        let generation = self.target.ensure_master()?;
        let mut slot = self.router.lock().unwrap_or_else(|p| p.into_inner());
        let local = self._control_dir.path().join("rpc.sock");
        let router = match slot.take() {
            Some((r, g)) if g == generation => {
                *slot = Some((Arc::clone(&r), g));
                return Ok(r);
            }
            // Forwarded on a master that is gone: the same listener, forwarded again.
            Some((r, _)) => r,
            None => Arc::new(Router::listen(&local).map_err(|e| EnvError::Command {
                backend: "ssh",
                what: "listening for the RPC forward".into(),
                message: format!("{}: {e}", local.display()),
            })?),
        };
        // Kept, not forwarded yet, when the forward fails: the next call tries again.
        *slot = Some((Arc::clone(&router), 0));
        let mut fwd = self.target.ssh();
        fwd.args(["-O", "forward", "-R"])
            .arg(format!("{}:{}", self.rpc_remote, local.display()))
            .arg(&self.target.host);
        let out = run_client("ssh", &mut fwd, b"", OP_TIMEOUT, "RPC forward")?;
        if !out.success() {
            return Err(forward_error("forwarding the RPC socket", &out));
        }
        *slot = Some((Arc::clone(&router), generation));
        Ok(router)
    }
}

impl SshEnv {
    /// A fresh name for a process group's id file, in the environment's private 0700 dir.
    fn pgid_file(&self) -> String {
        format!("{}/pg-{}", self.remote_env_dir, super::random_hex(8))
    }

    /// Signals the group recorded in `pgid_file` over the master.
    fn group_killer(&self, pgid_file: String) -> super::process::RemoteKill {
        let target = self.target.clone();
        Box::new(move |signal| {
            let out = target.run(&group_kill(&pgid_file, signal), "killing a process group")?;
            if out.success() {
                Ok(())
            } else {
                Err(ssh_error("killing a process group", &out))
            }
        })
    }
}

impl Environment for SshEnv {
    fn backend(&self) -> &'static str {
        "ssh"
    }

    fn isolated(&self) -> bool {
        false
    }

    fn still_up(&self) -> bool {
        // A round trip through the master, not just a connect: one that is ending (its
        // keepalives gave up) may still accept.
        let mut check = self.target.ssh();
        check.args(["-O", "check"]).arg(&self.target.host);
        run_client(
            "ssh",
            &mut check,
            b"",
            Duration::from_secs(5),
            "ssh -O check",
        )
        .is_ok_and(|o| o.success())
    }

    fn site(&self) -> &Site {
        &self.site
    }

    fn spawn(&self, spec: &ExecSpec) -> Result<Spawned, EnvError> {
        spec.check("ssh")?;
        self.target.ensure_master()?;
        let pgid_file = self.pgid_file();
        let wrapper = group_wrapper(spec, &pgid_file, &self.site.python);
        self.target.spawn(
            &format!("sh -c {}", shell_quote(&wrapper)),
            Some(self.group_killer(pgid_file)),
        )
    }

    fn fresh_runner(&self) -> Option<super::FreshRun> {
        let target = self.target.clone();
        Some(Arc::new(move |argv: &[String]| {
            let line = super::process::shell_line(argv);
            let mut cmd = target.ssh_via(false);
            // `exec`: the login shell becomes the command, so nothing but it holds the argv.
            cmd.arg(&target.host).arg("--").arg(format!("exec {line}"));
            let out = run_client("ssh", &mut cmd, b"", OP_TIMEOUT, "a fresh ssh command")?;
            if out.success() {
                Ok(())
            } else {
                Err(ssh_error("running a command on a fresh connection", &out))
            }
        }))
    }

    fn spawn_leader(&self, build: &dyn Fn(Option<&str>) -> ExecSpec) -> Result<Spawned, EnvError> {
        // The command records its own group: the login shell execs it directly, without the
        // wrapper's `sh` and `setsid` (about a third of a no-op's cost over the plain command).
        let pgid_file = self.pgid_file();
        let spec = build(Some(&pgid_file));
        spec.check("ssh")?;
        self.target.ensure_master()?;
        self.target
            .spawn(&exec_line(&spec), Some(self.group_killer(pgid_file)))
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

/// `vibeos-exec backends gc` for ssh: ends the ControlMaster of every environment whose owner
/// process is gone (a crashed host; `ControlPersist=yes` would keep it for ever), removes that
/// environment's dir on the host through it first, and removes the local control dir. The
/// scripts and agents over there have already ended: their lifelines were sessions of that
/// master (or of clients whose stdin closed with the host). Only this user's dirs are looked at.
pub fn gc() -> Result<super::docker::GcReport, EnvError> {
    let mut report = super::docker::GcReport::default();
    for (dir, _) in super::host_dirs::own_dirs(CONTROL_PREFIX) {
        let info = std::fs::read_to_string(dir.join(OWNER_FILE)).unwrap_or_default();
        let mut lines = info.lines();
        let (owner, host, remote) = (lines.next(), lines.next(), lines.next());
        // A dir without an owner file (written right after it is made) is one being set up,
        // or an older version's: judged by whether a process still uses it.
        let alive = match owner {
            Some(o) => super::owner::owner_alive(o),
            None => !users_of(&dir).is_empty(),
        };
        if alive {
            report.kept.push(dir.display().to_string());
            continue;
        }
        end_master(&dir, host, remote);
        let _ = std::fs::remove_dir_all(&dir);
        report.removed.push(dir.display().to_string());
    }
    Ok(report)
}

/// A path as the value of an ssh `-o` option: ssh splits a value at whitespace (the words after
/// the first name more files, or are an error) and expands `%` tokens in these paths, so a
/// `TMPDIR` or known-hosts path with a space, or a `%` in it, named another file. Quoted, with
/// `\` and `"` escaped and `%` doubled, it is the path as written.
fn ssh_option_path(path: &std::path::Path) -> String {
    let text = path.to_string_lossy();
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '\\' | '"' => {
                out.push('\\');
                out.push(c);
            }
            '%' => out.push_str("%%"),
            _ => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Removes `remote` on `host` through the master in `dir` (when it still answers), closes the
/// master, and ends whatever process still names its socket.
fn end_master(dir: &std::path::Path, host: Option<&str>, remote: Option<&str>) {
    let control = format!("ControlPath={}", ssh_option_path(&dir.join("cm")));
    let host = host.unwrap_or("localhost");
    let ssh = |args: &[&str]| {
        let mut cmd = Command::new("ssh");
        cmd.args([
            "-o",
            "BatchMode=yes",
            "-o",
            "ControlMaster=no",
            "-o",
            &control,
        ]);
        cmd.args(args);
        run_client("ssh", &mut cmd, b"", Duration::from_secs(10), "gc").ok()
    };
    if let Some(remote) = remote.filter(|r| r.starts_with("/tmp/vibeos-exec-env-")) {
        if ssh(&["-O", "check", host]).is_some_and(|o| o.success()) {
            let _ = ssh(&[host, "--", &format!("rm -rf {}", shell_quote(remote))]);
        }
    }
    let _ = ssh(&["-O", "exit", host]);
    for pid in users_of(dir) {
        // SAFETY: kill with a pid just read from /proc; at worst it exited meanwhile.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

/// Pids of this user's ssh processes whose command line names the control socket in `dir`.
fn users_of(dir: &std::path::Path) -> Vec<i32> {
    let needle = format!("ControlPath={}", ssh_option_path(&dir.join("cm")));
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline);
            (pid != me && cmdline.split('\0').any(|a| a == needle)).then_some(pid)
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_client_failure_reads_as_one_line_with_its_exit() {
        let out = super::super::CommandOutput {
            code: Some(255),
            stdout: Vec::new(),
            stderr: b"mux_client_forward: forwarding request failed:\r\nPort forwarding failed\r\n"
                .to_vec(),
        };
        assert_eq!(
            ssh_error("forwarding the RPC socket", &out).to_string(),
            "ssh backend: forwarding the RPC socket failed: mux_client_forward: forwarding \
             request failed: Port forwarding failed (exit 255)"
        );
        let silent = super::super::CommandOutput {
            code: None,
            stdout: Vec::new(),
            stderr: Vec::new(),
        };
        assert_eq!(
            ssh_error("agent forward", &silent).to_string(),
            "ssh backend: agent forward failed: the ssh client said nothing (timed out)"
        );
    }

    #[test]
    fn a_refused_forward_names_the_server_setting() {
        let out = super::super::CommandOutput {
            code: Some(255),
            stdout: Vec::new(),
            stderr: b"remote port forwarding failed for listen path /tmp/x/rpc.sock\r\n".to_vec(),
        };
        let text = forward_error("forwarding the RPC socket", &out).to_string();
        assert!(
            text.contains("listen path /tmp/x/rpc.sock (exit 255)")
                && text.contains("AllowStreamLocalForwarding yes"),
            "{text}"
        );
    }

    #[test]
    fn an_ssh_timeout_names_the_login_shells_start_up_files() {
        let timeout = |backend| {
            crate::environments::EnvError::Timeout {
                backend,
                what: "preparing the remote socket dir".into(),
                seconds: 30,
            }
            .to_string()
        };
        assert!(timeout("ssh").contains("~/.bashrc"), "{}", timeout("ssh"));
        assert!(
            !timeout("docker").contains("bashrc"),
            "{}",
            timeout("docker")
        );
    }

    /// The ssh client itself reads the quoted value back as the path (`ssh -G` prints the
    /// configuration it would use and connects nowhere).
    #[test]
    fn paths_with_spaces_quotes_and_percent_reach_ssh_as_written() {
        let path = std::path::Path::new("/tmp/a b/c%u \"q\" \\x/cm");
        let out = Command::new("ssh")
            .arg("-G")
            .arg("-o")
            .arg(format!("ControlPath={}", ssh_option_path(path)))
            .arg("-o")
            .arg(format!("UserKnownHostsFile={}", ssh_option_path(path)))
            .arg("localhost")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        for key in ["controlpath", "userknownhostsfile"] {
            let value = text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key} ")))
                .unwrap_or_else(|| panic!("{key} missing: {text}"));
            assert_eq!(value, path.to_str().unwrap(), "{key}");
        }
    }
}
