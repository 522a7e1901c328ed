//! A process forked by a fork server ([`crate::zygote`]): the execution's reaper, which is not
//! our child, so its status arrives on a pipe. Its own module because a launch
//! ([`crate::launch::Proc`]) holds one and the fork server, which launches through
//! [`crate::launch`], creates one: defined here, below both.

use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

/// A process forked by a fork server: the execution's reaper.
#[derive(Debug)]
pub struct Forked {
    /// The reaper's pid.
    pub(crate) pid: u32,
    pub(crate) stdout: Option<std::process::ChildStdout>,
    pub(crate) stderr: Option<std::process::ChildStderr>,
    /// Read end of the pipe the reaper writes the script's wait status on.
    pub(crate) status: Option<std::fs::File>,
    /// The status once read.
    pub(crate) done: Option<std::process::ExitStatus>,
}

impl Forked {
    /// Blocks until the reaper reports the script's status. A reaper that died without
    /// reporting (SIGKILLed) counts as the script killed by SIGKILL.
    pub(crate) fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        if let Some(done) = self.done {
            return Ok(done);
        }
        let mut text = String::new();
        if let Some(mut f) = self.status.take() {
            f.read_to_string(&mut text)?;
        }
        let raw = text.trim().parse::<i32>().unwrap_or(libc::SIGKILL);
        let status = std::process::ExitStatus::from_raw(raw);
        self.done = Some(status);
        Ok(status)
    }

    /// The status if the reaper already reported it.
    pub(crate) fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        if self.done.is_some() {
            return Ok(self.done);
        }
        let ready = self
            .status
            .as_ref()
            .is_none_or(|f| poll_in(f.as_raw_fd(), Duration::ZERO));
        if ready {
            self.wait().map(Some)
        } else {
            Ok(None)
        }
    }
}

/// Whether `fd` becomes readable within `timeout` (retrying after signals).
pub(crate) fn poll_in(fd: RawFd, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n > 0 {
            return pfd.revents & libc::POLLIN != 0;
        }
        if n == 0 {
            return false;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return false;
        }
    }
}
