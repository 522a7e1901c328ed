//! What std's start-up does for a Rust `main`, minus the part a cold `run` cannot afford.
//!
//! std's start-up locates the main thread's stack to install a stack-overflow handler: glibc's
//! `pthread_getattr_np` reads and parses `/proc/self/maps` for it, about 0.15 ms of every start
//! on these machines, on the path of every cold `run` (docs/cold-start.md, "Stop 35"). The binary
//! therefore has its own C `main` (`#![no_main]`), and this module keeps the rest of what std
//! did there:
//!
//! - the standard descriptors: a caller that starts us with fd 0, 1 or 2 closed gets them opened
//!   on `/dev/null`, so that no file, pipe or socket we open later takes their place and
//!   receives what is meant for stdout;
//! - `SIGPIPE` ignored, so that writing to a reader that left is an `EPIPE` error, not death;
//!   std's `Command` still resets it to the default in every child it starts, as before.
//!
//! What is given up: a stack overflow ends the process with `SIGSEGV` instead of std's message
//! first, and the main thread has no name in panic messages.

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

/// Prepares the process as std's start-up would (see the module docs).
pub fn prepare() {
    open_missing_standard_descriptors();
    ignore_sigpipe();
}

fn open_missing_standard_descriptors() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // SAFETY: `fds` is a valid, writable array of three `pollfd`s for the duration of the call;
    // poll only reads descriptor numbers and reports one that is not open as POLLNVAL.
    if unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) } < 0 {
        return;
    }
    for missing in fds.iter().filter(|p| p.revents & libc::POLLNVAL != 0) {
        // The lowest free descriptor is the missing one: opening in order fills 0, 1, 2. The
        // descriptor stays open (and inherited, like the one it stands for) for the process's
        // life.
        match nix::fcntl::open("/dev/null", OFlag::O_RDWR, Mode::empty()) {
            Ok(null) => std::mem::forget(null),
            Err(e) => {
                // std aborts here too: a process whose stdout could become any file it opens
                // must not go on.
                eprintln!(
                    "vibeos-exec: descriptor {} was closed at start and /dev/null cannot be \
                     opened in its place ({e}); start vibeos-exec with stdin, stdout and stderr open",
                    missing.fd
                );
                std::process::abort();
            }
        }
    }
}

fn ignore_sigpipe() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: installing SIG_IGN runs no handler code; nothing else in the process has started
    // yet, so no thread observes the change half-made.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigIgn) };
}
