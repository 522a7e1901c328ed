//! Handing the script to an interpreter that was started before the script was released.
//!
//! A one-shot host (`vibeos-exec run`) starts the interpreter first and finishes its own start
//! (logging, the tool registry, the stub, the approval guard) while the interpreter starts on the
//! other core ([`crate::prestart`]). The interpreter is exactly `python -u script.py`; only
//! `script.py` is a FIFO when it starts, so its open of the script waits until the supervisor
//! releases it. To release it, a thread opens the FIFO's write end (which returns once the
//! interpreter has opened the read end), renames a regular file holding the same text over the
//! FIFO's name, writes the text and closes. The interpreter reads to end of file before it
//! compiles anything, so by the time any line of the script runs `script.py` is a regular file:
//! tracebacks, `inspect` and a script that reads its own `__file__` find the source as after a
//! cold start.

use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The name the script's text waits under until the interpreter has opened the FIFO.
const PENDING_NAME: &str = ".script.py.pending";

/// Creates `script.py` in `dir` as a FIFO, the supervisor's with mode 0644, like the regular
/// file a cold start writes.
pub(crate) fn make_fifo(dir: &Path) -> io::Result<()> {
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
    Ok(())
}

/// Why the script could not be handed over.
#[derive(Debug, thiserror::Error)]
#[error("the script could not be handed to the interpreter: {0}")]
pub(crate) struct FeedError(io::Error);

/// A release in progress: the thread waiting for the interpreter to open the FIFO.
#[derive(Debug)]
pub(crate) struct ScriptFeed {
    fifo: PathBuf,
    /// Set when the execution ends: a writer whose open returns after that writes nothing.
    abandoned: Arc<AtomicBool>,
    failure: Arc<Mutex<Option<io::Error>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ScriptFeed {
    /// Releases `code` to the interpreter waiting on `dir`'s FIFO.
    pub(crate) fn start(dir: &Path, code: &str) -> io::Result<ScriptFeed> {
        // The supervisor's file, as the cold path writes it.
        crate::confine::staging::write_new(dir, PENDING_NAME, code, None)?;
        let fifo = dir.join(crate::confine::staging::SCRIPT_FILE);
        let pending = dir.join(PENDING_NAME);
        let abandoned = Arc::new(AtomicBool::new(false));
        let failure = Arc::new(Mutex::new(None));
        let text = code.as_bytes().to_vec();
        let (path, gone, failed) = (fifo.clone(), Arc::clone(&abandoned), Arc::clone(&failure));
        let thread = std::thread::Builder::new()
            .name("vibeos-script-feed".into())
            .spawn(move || {
                if let Err(e) = feed(&path, &pending, &text, &gone) {
                    *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                }
            })?;
        Ok(ScriptFeed {
            fifo,
            abandoned,
            failure,
            thread: Some(thread),
        })
    }

    /// Tells the writer to write nothing and opens the FIFO's read end, so a writer still in
    /// its open returns (a writer's open completes once a reader has come, even one that has
    /// gone again). Once the script was released the path is a regular file, and opening it
    /// does nothing.
    fn abandon(&self) -> std::io::Result<std::fs::File> {
        self.abandoned.store(true, Ordering::SeqCst);
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&self.fifo)
    }

    /// Waits for the release to be over; called once every process of the execution is gone.
    /// An interpreter that died before it opened the script leaves the writer waiting in its
    /// open: opening the read end ourselves lets it return, and it then writes nothing.
    pub(crate) fn finish(mut self) -> Result<(), FeedError> {
        let unblock = self.abandon();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        drop(unblock);
        match self
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            Some(e) => Err(FeedError(e)),
            None => Ok(()),
        }
    }
}

impl Drop for ScriptFeed {
    fn drop(&mut self) {
        // Dropped without `finish` (an owner that failed early): let a writer still waiting in
        // its open return if the FIFO is still there, but never wait for it here; a dir already
        // removed leaves it to end with the process.
        if self.thread.take().is_some() {
            drop(self.abandon());
        }
    }
}

/// The writer's side: wait for the reader, swap the FIFO's name to the regular file, write.
fn feed(fifo: &Path, pending: &Path, text: &[u8], abandoned: &AtomicBool) -> io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(fifo)?;
    if abandoned.load(Ordering::SeqCst) {
        return Ok(());
    }
    // Before the text: the interpreter runs nothing until it has read to end of file.
    std::fs::rename(pending, fifo)?;
    match file.write_all(text) {
        // The interpreter died while reading: its end is reported by the supervision.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}
