//! Asking an interpreter about itself before a script runs: its version (an environment whose
//! layout does not say it, [`crate::interpreter`]) or the executable a `#!` wrapper ends up
//! running ([`crate::interpreter_shim`]).
//!
//! A probe is a command like any other the supervisor starts, so it follows the same rules:
//!
//! - **Environment.** The probe gets the environment a script child would get from the same
//!   caller environment: scrubbed by the execute_code policy (`policies/env.json`, with the
//!   configured passthrough), so provider credentials and secret-looking names never reach it
//!   (SPEC §4). Chosen over a hand-picked minimal set (PATH, HOME, LANG) because the probe's
//!   answer must be the one the script will see: a wrapper that picks its interpreter from the
//!   environment then picks it from the environment the script runs with. One addition:
//!   `PYENV_VERSION`, a version name that pyenv's shims read to choose the interpreter, so
//!   strict mode keeps running the Python the caller selected (its shim cache is keyed by it).
//!   `-I` keeps `PYTHON*` variables and the user's site directory from changing the answer.
//! - **Bounded.** A probe that does not answer within its timeout is killed. It runs in a
//!   process group of its own, and the whole group is killed when the probe ends (answered or
//!   not): a wrapper's background children (`sleep 30 &`) do not outlive the question. Output
//!   is read without blocking and capped, so neither a process that keeps the pipe open nor one
//!   that floods it can stall the execution past the timeout.

use crate::env_policy::EnvPolicy;
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a probe's answer is reused before the interpreter is asked again (a wrapper's
/// `sys.executable` that it did report is kept for good, [`crate::interpreter_shim`]): long
/// enough that the executions of one run (a `run` resolves its interpreter at prestart and
/// again at execute) start one probe, and wait for a hanging one once; short enough that a
/// long-lived host soon notices an environment that was fixed or changed.
pub(crate) const PROBE_ANSWER_TTL: Duration = Duration::from_secs(30);

/// Variables kept for a probe on top of the scrubbed environment (see the module docs).
const SELECTORS: &[&str] = &["PYENV_VERSION"];

/// Most stdout a probe's answer may have; the rest is read and dropped.
const MAX_ANSWER_BYTES: usize = 64 << 10;

/// Reads of the probe's stdout per turn of the wait loop, so a flood cannot keep the loop from
/// checking the deadline.
const READS_PER_TURN: usize = 16;

/// What a probe's environment is made of: the caller's environment and the names passed
/// through (`terminal.env_passthrough` and skills), as for the script child.
#[derive(Debug, Clone, Default)]
pub struct ProbeEnv {
    /// The caller's environment; `None` for this process's own.
    base: Option<Vec<(OsString, OsString)>>,
    /// Names passed through the policy.
    passthrough: BTreeSet<String>,
}

impl ProbeEnv {
    /// The environment of a caller whose variables are `base` (`None`: this process's own).
    pub fn new(base: Option<Vec<(OsString, OsString)>>, passthrough: BTreeSet<String>) -> Self {
        ProbeEnv { base, passthrough }
    }

    /// The caller's value of `name`, non-empty.
    pub(crate) fn var(&self, name: &str) -> Option<OsString> {
        let value = match &self.base {
            Some(vars) => vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()),
            None => std::env::var_os(name),
        };
        value.filter(|v| !v.is_empty())
    }

    /// The environment a probe runs with: the caller's, scrubbed, plus [`SELECTORS`].
    fn vars(&self) -> Vec<(OsString, OsString)> {
        let base: Vec<(OsString, OsString)> = match &self.base {
            Some(vars) => vars.clone(),
            None => std::env::vars_os().collect(),
        };
        let mut env = match EnvPolicy::builtin() {
            Ok(policy) => policy.scrub_quiet(base, &self.passthrough).kept,
            // Fail closed: nothing of the caller's but where to find programs.
            Err(e) => {
                tracing::error!("execute_code: {e}; probing the interpreter with PATH only");
                base.into_iter().filter(|(k, _)| k == "PATH").collect()
            }
        };
        for name in SELECTORS {
            if !env.iter().any(|(k, _)| k == *name) {
                if let Some(v) = self.var(name) {
                    env.push((OsString::from(name), v));
                }
            }
        }
        env
    }
}

/// Why a probe gave no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    /// The interpreter could not be started at all.
    #[error("it cannot be started: {0}")]
    Spawn(std::io::Error),
    /// It did not exit within the timeout (it was killed, with its process group).
    #[error("it did not answer within {} s", .0.as_secs())]
    TimedOut(Duration),
    /// Waiting for it failed.
    #[error("waiting for it failed: {0}")]
    Wait(std::io::Error),
}

/// What a probe printed and how it ended.
#[derive(Debug)]
pub(crate) struct Answer {
    /// Its exit status.
    pub(crate) status: ExitStatus,
    /// Its stdout (at most [`MAX_ANSWER_BYTES`]), lossily decoded.
    pub(crate) stdout: String,
}

/// How a probe isolates the interpreter from the caller's `PYTHON*` variables and user site.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Isolation {
    /// `-I`: Python 3.4+ only (Python 2 stops at it, which [`crate::interpreter`] reports).
    Isolated,
    /// `-E -s`: the same for a one-line `-c` that imports only `sys`, and Python 2 answers
    /// it too, so a wrapper that selects a Python 2 can be told "too old" by version.
    IgnoreEnvAndUserSite,
}

/// Runs `exe <isolation> -c code` with the probe environment of `env`, in `cwd` (`None`: this
/// process's), its stdin and stderr on `/dev/null`, for at most `timeout`.
pub(crate) fn ask(
    exe: &Path,
    isolation: Isolation,
    code: &str,
    cwd: Option<&Path>,
    timeout: Duration,
    env: &ProbeEnv,
) -> Result<Answer, ProbeError> {
    let flags: &[&str] = match isolation {
        Isolation::Isolated => &["-I"],
        Isolation::IgnoreEnvAndUserSite => &["-E", "-s"],
    };
    let mut command = std::process::Command::new(exe);
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    let mut child = command
        .args(flags)
        .args(["-c", code])
        .env_clear()
        .envs(env.vars())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // Its own group, so that what it starts can be killed with it.
        .process_group(0)
        .spawn()
        .map_err(ProbeError::Spawn)?;
    // The leader's pid is the group's id; the leader is not reaped before the group is killed
    // (`WNOWAIT` below), so the id cannot have been reused by then.
    let Ok(raw) = i32::try_from(child.id()) else {
        // Not a pid Linux hands out; nothing safe to signal by group.
        let _ = child.kill();
        let _ = child.wait();
        return Err(ProbeError::Wait(std::io::Error::other(
            "its pid is out of range",
        )));
    };
    let group = Pid::from_raw(raw);
    let mut stdout = child.stdout.take();
    if let Some(pipe) = &stdout {
        // Our private end of the pipe: reads must not block when something the probe started
        // keeps the write end open after the probe exited.
        let _ = nix::fcntl::fcntl(
            pipe,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        );
    }
    let mut out = Vec::new();
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    loop {
        match &mut stdout {
            Some(pipe) => {
                let mut fds = [nix::poll::PollFd::new(
                    pipe.as_fd(),
                    nix::poll::PollFlags::POLLIN,
                )];
                let _ = nix::poll::poll(&mut fds, 5u8);
                if !drain(pipe, &mut out) {
                    stdout = None; // end of file: nothing more to read
                }
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(group), flags) {
            Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {}
            Ok(WaitStatus::StillAlive) => {
                timed_out = true;
                break;
            }
            Err(nix::errno::Errno::EINTR) => {}
            // Exited (not yet reaped), or waitid cannot tell: `wait` below says which.
            _ => break,
        }
    }
    // Nothing the probe started outlives it.
    let _ = killpg(group, Signal::SIGKILL);
    let status = child.wait().map_err(ProbeError::Wait)?;
    if timed_out {
        return Err(ProbeError::TimedOut(timeout));
    }
    // What it wrote before it exited is still in the pipe.
    if let Some(pipe) = &mut stdout {
        drain(pipe, &mut out);
    }
    Ok(Answer {
        status,
        stdout: String::from_utf8_lossy(&out).into_owned(),
    })
}

/// Reads what `pipe` holds now into `out` (up to [`MAX_ANSWER_BYTES`]); `false` at end of
/// file or on an error, when there is nothing more to read.
fn drain(pipe: &mut impl Read, out: &mut Vec<u8>) -> bool {
    let mut buf = [0u8; 4096];
    for _ in 0..READS_PER_TURN {
        match pipe.read(&mut buf) {
            Ok(0) => return false,
            Ok(n) => {
                let room = MAX_ANSWER_BYTES.saturating_sub(out.len());
                out.extend_from_slice(&buf[..n.min(room)]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

/// `major.minor` of a version string (`3.11.7`, `3.13t`, `2.7`).
pub(crate) fn parse_version(s: &str) -> Option<(u32, u32)> {
    let mut parts = s.split('.');
    let major = parts.next()?.trim().parse().ok()?;
    let minor_part = parts.next()?;
    let digits: String = minor_part
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, digits.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_environment_is_scrubbed_but_keeps_the_pyenv_selection() {
        let base = vec![
            (OsString::from("PATH"), OsString::from("/bin")),
            (OsString::from("OPENAI_API_KEY"), OsString::from("sk-x")),
            (OsString::from("MY_TOKEN"), OsString::from("t")),
            (OsString::from("PYENV_VERSION"), OsString::from("3.12.1")),
            (OsString::from("MY_PASS"), OsString::from("p")),
        ];
        let pass: BTreeSet<String> = ["MY_PASS".to_string()].into();
        let vars = ProbeEnv::new(Some(base), pass).vars();
        let names: Vec<&str> = vars.iter().filter_map(|(k, _)| k.to_str()).collect();
        assert_eq!(names, ["PATH", "MY_PASS", "PYENV_VERSION"]);
    }
}
