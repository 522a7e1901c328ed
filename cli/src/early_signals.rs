//! SIGINT, SIGTERM and SIGHUP before `run` can stop an execution.
//!
//! `run` stops its script on these signals once its async runtime watches them
//! (`watch_signals`). Before that, two phases of a `run` matter:
//!
//! - reading the script: `run -` waits on stdin as long as its writer likes, and a caller that
//!   gives up (Ctrl-C, a harness's SIGTERM) must still get the result object `--json` promises;
//! - between the interpreter's prestart and the runtime's watch: killed there, the CLI would
//!   leave the prestarted interpreter's staging dir behind.
//!
//! So the CLI installs one small handler first thing. Until [`read_script`] starts, the handler
//! ends the process by the signal as the default action would (nothing exists yet to clean up,
//! and a blocking `open` of a FIFO must stay killable); from then on it only records the signal,
//! the read returns at once, and `run` turns the record into status `interrupted`. Commands other
//! than `run` get the signals' dispositions back ([`hand_back`]) before they install handlers of
//! their own, so `serve` still stops cleanly and the rest still die by them.
//!
//! A SIGHUP the caller ignored (`nohup`) is left ignored, in every phase of `run`: the caller
//! asked for the run to outlive its terminal. SIGINT and SIGTERM stop a `run` even when the
//! caller ignored them — a shell without job control starts every background job with SIGINT
//! ignored, by accident rather than on request, and SIGINT is how a user interrupts an
//! execution (SPEC §5). Other commands get the caller's dispositions back ([`hand_back`]).

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use nix::poll::{ppoll, PollFd, PollFlags};
use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};

/// The signals that stop an execution.
const STOPPING: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// Whether the handler records a signal (true) or ends the process by it (false).
static RECORDING: AtomicBool = AtomicBool::new(false);
/// The first signal recorded, or 0.
static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// Which of [`STOPPING`] got our handler (SIGHUP is left alone when the caller ignored it).
static INSTALLED: [AtomicBool; 3] = [
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
];
/// Which of [`STOPPING`] the caller had ignored when the process started.
static IGNORED_BY_CALLER: [AtomicBool; 3] = [
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
];

extern "C" fn on_stopping_signal(sig: libc::c_int) {
    if RECORDING.load(Ordering::SeqCst) {
        let _ = RECEIVED.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
        return;
    }
    // SAFETY: `signal` and `raise` are async-signal-safe. The signal is blocked while its
    // handler runs, so the raised one stays pending and is delivered, with the default action
    // (termination) just restored, as soon as this handler returns.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Installs the handler for the stopping signals (but a SIGHUP the caller ignored). Called
/// once, first thing, while the process has one thread.
pub fn handle_from_start() {
    for ((slot, ignored), sig) in INSTALLED.iter().zip(&IGNORED_BY_CALLER).zip(STOPPING) {
        // SAFETY: a zeroed `sigaction` is a valid value to pass as the new action; its handler
        // only touches atomics and calls async-signal-safe functions; `old` is a valid, writable
        // `sigaction`. No SA_RESTART: a blocked read returns EINTR to [`read_script`].
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_stopping_signal as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut new.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig as libc::c_int, &new, &mut old) != 0 {
                continue;
            }
            if old.sa_sigaction == libc::SIG_IGN {
                ignored.store(true, Ordering::SeqCst);
                if sig == Signal::SIGHUP {
                    libc::sigaction(sig as libc::c_int, &old, std::ptr::null_mut());
                    continue;
                }
            }
        }
        slot.store(true, Ordering::SeqCst);
    }
}

/// Whether `run` stops on `sig`: not on a SIGHUP its caller ignored (`nohup`).
pub fn stops_run(sig: Signal) -> bool {
    sig != Signal::SIGHUP
        || !STOPPING
            .iter()
            .zip(&IGNORED_BY_CALLER)
            .any(|(s, ignored)| *s == sig && ignored.load(Ordering::SeqCst))
}

/// Gives the signals the dispositions the caller started us with back, for commands that do
/// not run a script.
pub fn hand_back() {
    for ((slot, ignored), sig) in INSTALLED.iter().zip(&IGNORED_BY_CALLER).zip(STOPPING) {
        if slot.swap(false, Ordering::SeqCst) {
            let action = if ignored.load(Ordering::SeqCst) {
                libc::SIG_IGN
            } else {
                libc::SIG_DFL
            };
            // SAFETY: restoring SIG_DFL or SIG_IGN runs no code of ours.
            unsafe {
                libc::signal(sig as libc::c_int, action);
            }
        }
    }
}

/// The signal recorded since [`read_script`] started, if any.
pub fn received() -> Option<Signal> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        sig => Signal::try_from(sig).ok(),
    }
}

/// Reads `source` to its end, at most `limit` bytes, and returns early
/// (`ErrorKind::Interrupted`) when a stopping signal arrives. From here on signals are recorded.
///
/// The signals are blocked in this thread except inside `ppoll`, which unblocks them atomically
/// while it waits: a signal can only arrive where the wait sees it, never between the check of
/// [`received`] and the wait (the race a plain `read` loop has).
pub fn read_script(source: impl AsFd, limit: u64) -> io::Result<Vec<u8>> {
    RECORDING.store(true, Ordering::SeqCst);
    let mut stopping = SigSet::empty();
    for sig in STOPPING {
        stopping.add(sig);
    }
    let mut before = SigSet::empty();
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&stopping), Some(&mut before))?;
    let read = read_unless_stopped(source.as_fd(), limit, &before);
    pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None)?;
    read
}

fn read_unless_stopped(
    fd: BorrowedFd<'_>,
    limit: u64,
    waiting_mask: &SigSet,
) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    // Each read goes straight into `bytes`, in chunks that start small and double while reads
    // fill them: a script is a few KB, and a zeroed 64 KiB chunk cost a cold run 13 page
    // faults (docs/cold-start.md, "Stop 45").
    let mut chunk = 8 * 1024;
    loop {
        if let Some(sig) = received() {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                format!("stopped by {sig}"),
            ));
        }
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match ppoll(&mut fds, None, Some(*waiting_mask)) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        let have = bytes.len();
        let room = limit.saturating_sub(have as u64);
        let want = chunk.min(usize::try_from(room).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(bytes);
        }
        bytes.resize(have + want, 0);
        let read = nix::unistd::read(fd, &mut bytes[have..]);
        match read {
            Ok(0) => {
                bytes.truncate(have);
                return Ok(bytes);
            }
            Ok(n) => {
                bytes.truncate(have + n);
                if n == want {
                    chunk = (chunk * 2).min(MAX_CHUNK);
                }
            }
            // A descriptor left non-blocking by the caller: wait for it again.
            Err(nix::errno::Errno::EAGAIN) => bytes.truncate(have),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The largest single read of the script.
const MAX_CHUNK: usize = 64 * 1024;
