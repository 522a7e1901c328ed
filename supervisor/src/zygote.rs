//! The fork server (zygote): one pre-initialised interpreter per launch key that forks a fresh
//! process per execution, so a warm call costs a `fork` instead of an interpreter start, and a
//! burst of calls is not limited by how fast a pool of single-use interpreters can refill.
//!
//! The server (`zygote_boot.py`) is started by the supervisor with the key's interpreter and
//! environment, imports what the stub imports (from the interpreter's own library only, so no
//! project module is ever loaded), reports ready and then only reads requests from a
//! `SOCK_SEQPACKET` socketpair it inherited: nothing else can reach it, and it runs no script
//! code. Per execution the supervisor prepares everything exactly as for a cold launch
//! ([`crate::launch::open_channel`]): a fresh staging dir with the stub and the script, the RPC
//! channel and token, the scrubbed environment, the lifeline, and in strict mode the uid lease,
//! landlock ruleset, seccomp programs, rlimits and disk-budget tmpfs. It sends one request (the
//! settings as JSON, the descriptors as `SCM_RIGHTS`) and gets back the new process's pid and a
//! pidfd. The forked process becomes the execution's reaper (own session, child subreaper,
//! lifeline, termination relayed with the kill grace, every descendant killed at the end) and
//! forks the script process, which sets up its stdio, closes every other descriptor, applies
//! the confinement in `confine/child.rs`'s order, takes the environment, reseeds what a fork
//! shares, and runs the script as `__main__`. The reaper writes the script's wait status on a
//! pipe, which is what [`Forked::wait`] reads.
//!
//! **Trust.** In strict mode as root the server keeps root and no confinement, because each
//! child needs a different uid and a landlock rule for its own staging dir; it drops both in
//! the child before any script byte is read. That is safe because the server never executes
//! anything but its bootstrap and the standard library, its only input is the socketpair whose
//! other end only this supervisor holds (the child closes its copy before it forks the script),
//! and every script runs in a process that has already dropped the privileges. See
//! docs/warm-pool.md for what a script can still observe of its siblings.

use crate::config::Mode;
use crate::error::StartError;
use crate::forked::poll_in;
pub use crate::forked::Forked;
use crate::launch::{open_channel, with_channel, Channel, LaunchKey, LaunchSpec, Launched};
use crate::launch::{Proc, Staging};
use crate::reaper::lifeline;
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};
use std::ffi::OsString;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The server's program, run with `-c`.
const BOOT: &str = concat!(
    include_str!("script_runner.py"),
    include_str!("zygote_boot.py")
);

/// How long a server may take to start and import before it counts as failed.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a fork request may take before the server counts as hung.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// Failed starts after which a key is no longer served by a fork server.
const MAX_FAILURES: u32 = 3;

/// Servers kept at once; the least recently used one is stopped beyond this.
const MAX_SERVERS: usize = 4;

/// Why a fork server could not start or serve a request.
#[derive(Debug, thiserror::Error)]
pub enum ZygoteError {
    /// Setting up a launch (staging dir, channel, confinement) failed as it would cold.
    #[error(transparent)]
    Start(#[from] StartError),
    /// A socket or pipe could not be made or used.
    #[error("the fork server's channel failed: {0}")]
    Channel(String),
    /// The server exited or never became ready.
    #[error("the fork server is gone ({0}); calls start cold or from the pool")]
    Gone(String),
    /// The server refused a request.
    #[error("the fork server refused the request: {0}")]
    Refused(String),
    /// The call cannot be served by a forked process (the reason is logged, the call starts
    /// another way).
    #[error("not served by the fork server: {0}")]
    Unsuitable(String),
}

/// One running fork server.
struct Server {
    key: LaunchKey,
    /// The environment it started with, computed for `empty` as its staging dir.
    startup_env: Vec<(OsString, OsString)>,
    /// An empty dir standing in for the staging dir in the server's own environment.
    empty: tempfile::TempDir,
    control: Mutex<Option<OwnedFd>>,
    child: Mutex<std::process::Child>,
    last_used: AtomicU64,
}

impl Drop for Server {
    fn drop(&mut self) {
        // EOF on its control channel ends the server; children already forked go on (their
        // lifelines belong to their executions).
        drop(lock(&self.control).take());
        let mut child = lock(&self.child);
        if !matches!(child.try_wait(), Ok(Some(_))) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Default)]
struct Registry {
    servers: Vec<Arc<Server>>,
    failures: Vec<(LaunchKey, u32)>,
}

static ENABLED: AtomicBool = AtomicBool::new(false);
static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
static CLOCK: AtomicU64 = AtomicU64::new(0);
static FORKS: AtomicU64 = AtomicU64::new(0);
static NEXT_REQUEST: AtomicU64 = AtomicU64::new(1);

/// Turns the process-wide fork servers on or off. Off (the default), executions start from the
/// pool or cold; on, every local execution of this process whose key a server can serve is
/// forked from that key's server (started at the first such call). Turning it off stops the
/// servers; executions already forked are not affected.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::SeqCst);
    if !on {
        let old = lock(&REGISTRY).take();
        drop(old);
    }
}

/// Whether fork servers are on in this process.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::SeqCst)
}

/// Executions forked by a fork server in this process so far.
pub fn forks() -> u64 {
    FORKS.load(Ordering::SeqCst)
}

/// Starts the server for calls like `request` ahead of the first one; errors are left for the
/// call itself to report. Returns whether a server is ready for it.
pub fn prewarm(request: &crate::ExecutionRequest) -> bool {
    if !enabled() {
        return false;
    }
    match LaunchSpec::for_request(request) {
        Ok(spec) => server_for(&spec).is_ok(),
        Err(_) => false,
    }
}

/// Forks the execution for `spec` from its key's server. `None` means "start another way"
/// (servers off, or this call cannot be served by one; the reason is logged).
pub(crate) fn start(spec: &LaunchSpec, stub: &str, code: &str) -> Option<Launched> {
    if !enabled() {
        return None;
    }
    let server = match server_for(spec) {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!("execute_code: {e}");
            return None;
        }
    };
    match fork(&server, spec, stub, code) {
        Ok(l) => {
            FORKS.fetch_add(1, Ordering::SeqCst);
            Some(l)
        }
        Err(e) => {
            tracing::debug!("execute_code: {e}");
            if matches!(e, ZygoteError::Gone(_) | ZygoteError::Channel(_)) {
                forget(&server);
            }
            None
        }
    }
}

fn forget(server: &Arc<Server>) {
    let removed = {
        let mut reg = lock(&REGISTRY);
        reg.as_mut().and_then(|r| {
            r.servers
                .iter()
                .position(|s| Arc::ptr_eq(s, server))
                .map(|i| r.servers.remove(i))
        })
    };
    drop(removed);
}

/// The server for `spec`'s key, started if needed (or restarted when a variable the
/// interpreter reads at startup changed).
fn server_for(spec: &LaunchSpec) -> Result<Arc<Server>, ZygoteError> {
    if spec.mode == Mode::Strict && spec.strict.uid.is_some() {
        // A pinned uid is one uid for every execution: concurrent ones would share it.
        return Err(ZygoteError::Unsuitable("strict.uid is pinned".into()));
    }
    let key = spec.key();
    let mut reg = lock(&REGISTRY);
    let reg = reg.get_or_insert_with(Registry::default);
    if reg
        .failures
        .iter()
        .any(|(k, n)| *k == key && *n >= MAX_FAILURES)
    {
        return Err(ZygoteError::Unsuitable(
            "its fork server failed to start repeatedly".into(),
        ));
    }
    let mut stale = Vec::new();
    if let Some(i) = reg.servers.iter().position(|s| s.key == key) {
        let s = Arc::clone(&reg.servers[i]);
        let wanted = spec.child_env(s.empty.path(), false)?;
        if startup_names(&wanted) == startup_names(&s.startup_env) && !exited(&s) {
            s.last_used
                .store(CLOCK.fetch_add(1, Ordering::SeqCst), Ordering::SeqCst);
            return Ok(s);
        }
        stale.push(reg.servers.remove(i));
    }
    let started = start_server(spec);
    let server = match started {
        Ok(s) => Arc::new(s),
        Err(e) => {
            match reg.failures.iter_mut().find(|(k, _)| *k == key) {
                Some((_, n)) => *n += 1,
                None => reg.failures.push((key, 1)),
            }
            return Err(e);
        }
    };
    reg.failures.retain(|(k, _)| *k != key);
    reg.servers.push(Arc::clone(&server));
    while reg.servers.len() > MAX_SERVERS {
        let lru = reg
            .servers
            .iter()
            .enumerate()
            .min_by_key(|(_, s)| s.last_used.load(Ordering::SeqCst))
            .map(|(i, _)| i);
        match lru {
            Some(i) => stale.push(reg.servers.remove(i)),
            None => break,
        }
    }
    drop(stale);
    Ok(server)
}

fn exited(s: &Server) -> bool {
    !matches!(lock(&s.child).try_wait(), Ok(None))
}

/// The variables the interpreter reads at startup, with their values.
fn startup_names(env: &[(OsString, OsString)]) -> Vec<(OsString, OsString)> {
    let mut v: Vec<_> = env
        .iter()
        .filter(|(k, _)| k.to_str().is_none_or(crate::pool::affects_startup))
        .cloned()
        .collect();
    v.sort();
    v
}

fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd), ZygoteError> {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| ZygoteError::Channel(format!("socketpair: {e}")))
}

fn start_server(spec: &LaunchSpec) -> Result<Server, ZygoteError> {
    let empty = tempfile::Builder::new()
        .prefix("vibeos-zygote-")
        .tempdir()
        .map_err(|e| ZygoteError::Channel(format!("cannot create the server's dir: {e}")))?;
    let startup_env = spec.child_env(empty.path(), false)?;
    let (ours, theirs) = seqpacket_pair()?;
    let theirs_fd = theirs.as_raw_fd();
    let mut command = std::process::Command::new(&spec.interpreter.path);
    command
        .arg("-u")
        .arg("-c")
        .arg(BOOT)
        .arg(theirs_fd.to_string())
        .arg(empty.path())
        .env_clear()
        .envs(startup_env.iter().map(|(k, v)| (k, v)))
        .current_dir(empty.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: setsid and fcntl are async-signal-safe and act on this process and a descriptor
    // the parent keeps open until the spawn returns.
    unsafe {
        command.pre_exec(move || {
            // Its own session: a terminal's Ctrl-C or hangup is not meant for it.
            if libc::setsid() < 0 || libc::fcntl(theirs_fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command.spawn().map_err(|source| StartError::Spawn {
        interpreter: spec.interpreter.path.clone(),
        source,
    })?;
    drop(theirs);
    let server = Server {
        key: spec.key(),
        startup_env,
        empty,
        control: Mutex::new(Some(ours)),
        child: Mutex::new(child),
        last_used: AtomicU64::new(CLOCK.fetch_add(1, Ordering::SeqCst)),
    };
    let ready = {
        let control = lock(&server.control);
        let fd = control.as_ref().map_or(-1, AsRawFd::as_raw_fd);
        let mut byte = [0u8; 1];
        poll_in(fd, READY_TIMEOUT)
            // SAFETY: reading into a valid one-byte buffer from an open descriptor.
            && unsafe { libc::recv(fd, byte.as_mut_ptr().cast(), 1, 0) } == 1
            && byte[0] == b'R'
    };
    if !ready {
        return Err(ZygoteError::Gone(
            "it exited or was not ready in time; run a script cold to see the interpreter's error"
                .into(),
        ));
    }
    Ok(server)
}

fn pipe() -> Result<(OwnedFd, OwnedFd), ZygoteError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| ZygoteError::Channel(format!("pipe: {e}")))
}

fn text(s: &OsString) -> Result<&str, ZygoteError> {
    s.to_str()
        .ok_or_else(|| ZygoteError::Unsuitable("an environment variable is not UTF-8".into()))
}

/// Sets up one execution as a cold launch would and has `server` fork it.
fn fork(
    server: &Server,
    spec: &LaunchSpec,
    stub: &str,
    code: &str,
) -> Result<Launched, ZygoteError> {
    let mut staging = Staging::create(spec.disk_budget())?;
    staging.write_files(stub, code, None)?;
    let Channel {
        rpc,
        token,
        channel_vars,
        confinement,
        owner,
    } = open_channel(spec, &mut staging)?;
    let tool_env = spec.child_env(staging.path(), true)?;
    let env = with_channel(tool_env.clone(), &channel_vars);
    let (lifeline, _setup, lifeline_read) = lifeline(spec.kill_grace, Some(staging.path()))
        .map_err(|e| ZygoteError::Channel(format!("lifeline: {e}")))?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let (status_r, status_w) = pipe()?;

    let mut request = serde_json::json!({
        "env": env.iter().map(|(k, v)| Ok(vec![text(k)?, text(v)?]))
            .collect::<Result<Vec<_>, ZygoteError>>()?,
        "cwd": spec.child_cwd(staging.path()),
        "staging": staging.path(),
        "script": staging.path().join("script.py"),
        "grace_ms": spec.kill_grace.as_millis() as u64,
    });
    let mut fds: Vec<RawFd> = vec![
        out_w.as_raw_fd(),
        err_w.as_raw_fd(),
        lifeline_read.as_raw_fd(),
        status_w.as_raw_fd(),
    ];
    if let Some(c) = &confinement {
        if let Some(reveal) = &c.reveal {
            request["reveal"] = serde_json::json!(reveal.steps());
        }
        fds.push(c.rpc.as_raw_fd());
        fds.push(c.ruleset.as_raw_fd());
        request["rlimits"] = serde_json::json!(c
            .rlimits
            .iter()
            .map(|(r, v)| (*r as u64, *v))
            .collect::<Vec<_>>());
        request["credentials"] = match c.credentials {
            Some(cr) => serde_json::json!([cr.uid, cr.gid]),
            None => serde_json::Value::Null,
        };
        request["filters"] = serde_json::json!(c
            .filters
            .iter()
            .map(|p| p
                .iter()
                .map(|i| (i.code, i.jt, i.jf, i.k))
                .collect::<Vec<_>>())
            .collect::<Vec<_>>());
        request["syscalls"] = serde_json::json!({
            "landlock_restrict_self": libc::SYS_landlock_restrict_self,
            "seccomp": libc::SYS_seccomp,
            "open_tree": libc::SYS_open_tree,
            "move_mount": libc::SYS_move_mount,
        });
    }
    let id = NEXT_REQUEST.fetch_add(1, Ordering::SeqCst);
    request["id"] = serde_json::json!(id);
    let body = request.to_string();

    let reply = {
        let control = lock(&server.control);
        let Some(ctl) = control.as_ref() else {
            return Err(ZygoteError::Gone("its control channel is closed".into()));
        };
        let cmsg = [ControlMessage::ScmRights(&fds)];
        sendmsg::<()>(
            ctl.as_raw_fd(),
            &[IoSlice::new(body.as_bytes())],
            &cmsg,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|e| ZygoteError::Gone(format!("send: {e}")))?;
        // Replies carry the request's id: one meant for no request of ours (a forked process
        // that still held the channel could have written it) is dropped, never taken as ours.
        let deadline = Instant::now() + REPLY_TIMEOUT;
        loop {
            let (text, pidfd) = receive(ctl, deadline)?;
            let value: serde_json::Value = serde_json::from_slice(&text)
                .map_err(|e| ZygoteError::Channel(format!("bad reply: {e}")))?;
            if value.get("id").and_then(|i| i.as_u64()) == Some(id) {
                break (value, pidfd);
            }
        }
    };
    // Only the forked processes hold these ends now.
    drop((out_w, err_w, lifeline_read, status_w, confinement));
    let (value, pidfd) = reply;
    if let Some(e) = value.get("error").and_then(|e| e.as_str()) {
        return Err(ZygoteError::Refused(e.to_string()));
    }
    let pid = value
        .get("pid")
        .and_then(|p| p.as_u64())
        .ok_or_else(|| ZygoteError::Channel("reply without a pid".into()))?;
    let pidfd = pidfd.ok_or_else(|| ZygoteError::Channel("reply without a pidfd".into()))?;
    Ok(Launched {
        child: Proc::Forked(Forked {
            pid: pid as u32,
            stdout: Some(std::process::ChildStdout::from(out_r)),
            stderr: Some(std::process::ChildStderr::from(err_r)),
            status: Some(std::fs::File::from(status_r)),
            done: None,
        }),
        pidfd: Some(pidfd),
        lifeline,
        staging,
        rpc,
        token,
        env,
        channel_vars,
        tool_env,
        owner,
        on_done: None,
    })
}

/// One reply from the server (its text and the descriptor it carried), waiting until `deadline`.
fn receive(ctl: &OwnedFd, deadline: Instant) -> Result<(Vec<u8>, Option<OwnedFd>), ZygoteError> {
    if !poll_in(
        ctl.as_raw_fd(),
        deadline.saturating_duration_since(Instant::now()),
    ) {
        return Err(ZygoteError::Gone("no reply to a fork request".into()));
    }
    let mut buf = vec![0u8; 4096];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        ctl.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| ZygoteError::Gone(format!("recv: {e}")))?;
    let mut pidfd = None;
    for c in msg
        .cmsgs()
        .map_err(|e| ZygoteError::Channel(format!("recv: {e}")))?
    {
        if let ControlMessageOwned::ScmRights(got) = c {
            for fd in got {
                // SAFETY: SCM_RIGHTS delivered a new descriptor that nobody else owns.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                if pidfd.is_none() {
                    pidfd = Some(owned);
                }
            }
        }
    }
    let len = msg.bytes;
    if len == 0 {
        return Err(ZygoteError::Gone("it closed its control channel".into()));
    }
    Ok((buf[..len].to_vec(), pidfd))
}
