//! A process forked by a fork server ([`crate::zygote`]): the execution's reaper, which is not
//! our child, so its status arrives on a pipe ([`StatusReport`], which a spawned reaper writes
//! too). Its own module because a launch ([`crate::launch::Proc`]) holds one and the fork
//! server, which launches through [`crate::launch`], creates one: defined here, below both.

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
    /// The script's status, as the reaper reports it.
    pub(crate) report: StatusReport,
}

impl Forked {
    /// Blocks until the reaper reports the script's status ([`StatusReport::wait`]).
    pub(crate) fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.report.wait()
    }

    /// The status if the reaper already reported it.
    pub(crate) fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        self.report.try_wait()
    }
}

/// The script's wait status as its reaper reports it: one decimal line on a pipe, written once
/// the script is reaped and every descendant is gone. Every local launch reads it (a forked
/// reaper is not our child, and a spawned one is reaped later, off the result's path).
#[derive(Debug)]
pub(crate) struct StatusReport {
    /// Read end of the pipe; taken by the first wait.
    pipe: Option<std::fs::File>,
    /// The status once read.
    done: Option<std::process::ExitStatus>,
}

impl StatusReport {
    /// A report to be read from `pipe`.
    pub(crate) fn new(pipe: std::fs::File) -> StatusReport {
        StatusReport {
            pipe: Some(pipe),
            done: None,
        }
    }

    /// Blocks until the reaper reports the script's status. A reaper that died without
    /// reporting (SIGKILLed) counts as the script killed by SIGKILL.
    ///
    /// Reading stops at the report's newline rather than at EOF, which would also wait for the
    /// reaper's own exit (the teardown of its address space, most of a millisecond).
    pub(crate) fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        if let Some(done) = self.done {
            return Ok(done);
        }
        let mut text = Vec::with_capacity(16);
        if let Some(f) = self.pipe.take() {
            read_line(f, &mut text)?;
        }
        Ok(self.settle(&text))
    }

    /// [`StatusReport::wait`] on the runtime's own poller instead of a blocking thread: the
    /// pipe is ours alone, so it can be non-blocking. A blocking wait costs every execution two
    /// thread hand-offs (a pool thread woken to read, the worker woken by it), each a wake-up of
    /// an idle CPU when calls are paced, and a cold run the start of that thread.
    pub(crate) async fn wait_async(&mut self) -> std::io::Result<std::process::ExitStatus> {
        use tokio::io::AsyncReadExt;
        if let Some(done) = self.done {
            return Ok(done);
        }
        let mut line = Vec::with_capacity(16);
        if let Some(f) = self.pipe.take() {
            let mut pipe = tokio::net::unix::pipe::Receiver::from_file(f)?;
            let mut chunk = [0u8; 64];
            while !line.contains(&b'\n') && line.len() < chunk.len() {
                match pipe.read(&mut chunk).await {
                    Ok(0) => break,
                    Ok(n) => line.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(self.settle(&line))
    }

    /// The status a report says, remembered: a report that is missing or unreadable (a reaper
    /// that died without reporting) counts as the script killed by SIGKILL.
    fn settle(&mut self, report: &[u8]) -> std::process::ExitStatus {
        let raw = std::str::from_utf8(report)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
            .unwrap_or(libc::SIGKILL);
        let status = std::process::ExitStatus::from_raw(raw);
        self.done = Some(status);
        status
    }

    /// The status if the reaper already reported it.
    pub(crate) fn try_wait(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        if self.done.is_some() {
            return Ok(self.done);
        }
        let ready = self
            .pipe
            .as_ref()
            .is_none_or(|f| poll_in(f.as_raw_fd(), Duration::ZERO));
        if ready {
            self.wait().map(Some)
        } else {
            Ok(None)
        }
    }
}

/// Reads `from` into `line` up to and including the first newline, or to EOF. A status report
/// is a few bytes; anything past 64 is not one, and what was read is left to fail parsing.
fn read_line(mut from: std::fs::File, line: &mut Vec<u8>) -> std::io::Result<()> {
    let mut chunk = [0u8; 64];
    while !line.contains(&b'\n') && line.len() < chunk.len() {
        match from.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => line.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
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
