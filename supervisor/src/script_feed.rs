//! Handing the script to an interpreter that was started before the script was released.
//!
//! A one-shot host (`vibeos-exec run`) starts the interpreter first and finishes its own start
//! (logging, the tool registry, the stub, the approval guard) while the interpreter starts on the
//! other core ([`crate::prestart`]). The interpreter is exactly `python -u script.py`; only
//! `script.py` is a FIFO when it starts, and the interpreter's read of it waits until the
//! supervisor releases the script.
//!
//! The supervisor opens the FIFO read-write before the interpreter starts (on Linux that open
//! never waits for a reader, and it keeps a writer on the FIFO, so the interpreter's open of the
//! script never waits either). To release the script it writes the text into the FIFO, renames
//! a regular file holding the same text over the FIFO's name, and closes its end. Whichever the
//! interpreter opened, it reads the whole text, and it reads end of file only after the rename:
//! it compiles nothing before end of file, so by the time any line of the script runs
//! `script.py` is a regular file (tracebacks, `inspect` and a script that reads its own
//! `__file__` find the source as after a cold start). A script that fits the FIFO's buffer
//! (64 KiB) is released at once, with no thread and no wake-up on the interpreter's path; a
//! larger one is written by a thread as the interpreter reads.

use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The name the script's text waits under until it is released.
const PENDING_NAME: &str = ".script.py.pending";

/// Creates `script.py` in `dir` as a FIFO, the supervisor's with mode 0644, like the regular
/// file a cold start writes, and opens the supervisor's end of it.
pub(crate) fn make_fifo(dir: &Path) -> io::Result<ScriptFeed> {
    let fifo = dir.join(crate::confine::staging::SCRIPT_FILE);
    let mode = nix::sys::stat::Mode::from_bits_truncate(0o644);
    nix::unistd::mkfifo(&fifo, mode)?;
    // Not what the host's umask leaves (077: 0600, closed to a strict script's uid).
    nix::sys::stat::fchmodat(
        nix::fcntl::AT_FDCWD,
        &fifo,
        mode,
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )?;
    // Read-write: returns at once with no reader, and the interpreter's open finds a writer.
    // Close-on-exec: the interpreter must see end of file when this end closes, so no other
    // program may keep a copy (the reaper, which does not exec, closes its copy at its start).
    let end = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&fifo)?;
    Ok(ScriptFeed {
        dir: dir.to_path_buf(),
        state: State::Holding(end),
    })
}

/// Why the script could not be handed over.
#[derive(Debug, thiserror::Error)]
#[error("the script could not be handed to the interpreter: {0}")]
pub(crate) struct FeedError(io::Error);

/// The supervisor's end of a prestarted interpreter's FIFO, from before the interpreter starts
/// until the execution is over.
#[derive(Debug)]
pub(crate) struct ScriptFeed {
    /// The staging dir the FIFO is in, as `SCRIPT_FILE`.
    dir: PathBuf,
    state: State,
}

#[derive(Debug)]
enum State {
    /// Not released yet: the FIFO's end, which keeps the interpreter waiting in its read.
    Holding(std::fs::File),
    /// A script larger than the FIFO's buffer: a thread writes the rest as the interpreter
    /// reads it. Dropping `stop` tells it to give up (the execution is over); the thread's
    /// result is whether its writes and the rename went through.
    Writing {
        stop: OwnedFd,
        thread: std::thread::JoinHandle<io::Result<()>>,
    },
    /// Released, or given up.
    Done,
}

impl ScriptFeed {
    /// Releases `code` to the interpreter waiting on the FIFO.
    pub(crate) fn release(&mut self, code: &str) -> io::Result<()> {
        let State::Holding(mut end) = std::mem::replace(&mut self.state, State::Done) else {
            return Err(io::Error::other("the script was released already"));
        };
        // The supervisor's file, as the cold path writes it.
        crate::confine::staging::write_new(&self.dir, PENDING_NAME, code, None)?;
        let pending = self.dir.join(PENDING_NAME);
        let fifo = self.dir.join(crate::confine::staging::SCRIPT_FILE);
        let text = code.as_bytes();
        let written = write_what_fits(&mut end, text)?;
        if written == text.len() {
            // Before the end closes: the interpreter runs nothing until end of file.
            return std::fs::rename(&pending, &fifo);
        }
        let rest = text[written..].to_vec();
        let (stop_seen, stop) = crate::fds::cloexec_pipe()?;
        let thread = std::thread::Builder::new()
            .name("vibeos-script-feed".into())
            .spawn(move || write_rest(end, &rest, &stop_seen, &pending, &fifo))?;
        self.state = State::Writing { stop, thread };
        Ok(())
    }

    /// Ends the release; called once every process of the execution is gone. A writer still
    /// waiting for the interpreter to read (it died first) gives up and writes nothing more.
    pub(crate) fn finish(mut self) -> Result<(), FeedError> {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Writing { stop, thread } => {
                drop(stop);
                match thread.join() {
                    Ok(written) => written.map_err(FeedError),
                    Err(_) => Err(FeedError(io::Error::other(
                        "the script's writer thread panicked",
                    ))),
                }
            }
            State::Holding(_) | State::Done => Ok(()),
        }
    }
}

/// Writes as much of `text` as the FIFO's buffer takes now; returns how much that was.
fn write_what_fits(end: &mut std::fs::File, text: &[u8]) -> io::Result<usize> {
    let mut written = 0;
    while written < text.len() {
        match end.write(&text[written..]) {
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}

/// The writer thread of a large script: the rest of the text as the interpreter reads it,
/// then the rename, then end of file. Returns early, writing nothing more, once `stop` closes.
fn write_rest(
    mut end: std::fs::File,
    mut rest: &[u8],
    stop: &OwnedFd,
    pending: &Path,
    fifo: &Path,
) -> io::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    while !rest.is_empty() {
        let mut fds = [
            PollFd::new(end.as_fd(), PollFlags::POLLOUT),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            return Ok(());
        }
        let n = write_what_fits(&mut end, rest)?;
        rest = &rest[n..];
    }
    std::fs::rename(pending, fifo)
}
