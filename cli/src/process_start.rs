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
//! - the command line, which std reads from glibc's init array (a glibc extension) but not
//!   from other C libraries (musl): [`args_os`] is what the C runtime passed to `main`, on
//!   every target.
//!
//! What is given up: a stack overflow ends the process with `SIGSEGV` instead of std's message
//! first, and the main thread has no name in panic messages.

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use std::ffi::{c_char, c_int, CStr, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::OnceLock;

static ARGS: OnceLock<Vec<OsString>> = OnceLock::new();

/// Prepares the process as std's start-up would (see the module docs), and keeps the
/// descriptors the caller left open out of everything it starts.
///
/// # Safety
/// `argv` must be the `argv` the C runtime passed to `main`, with `argc` entries, each a
/// NUL-terminated string.
pub unsafe fn prepare(argc: c_int, argv: *const *const c_char) {
    // SAFETY: the caller's contract, passed on.
    let _ = ARGS.set(unsafe { copy_args(argc, argv) });
    open_missing_standard_descriptors();
    ignore_sigpipe();
    keep_inherited_descriptors_to_ourselves();
    keep_our_environment_to_ourselves();
}

/// Makes the process non-dumpable, as ssh-agent does: its `/proc/PID/environ` (and `mem`)
/// then need more than the same uid to read. The CLI holds the caller's whole environment —
/// the secrets it scrubs from every script — and a project-mode script runs as the same user:
/// it could read them back from `/proc/<supervisor>/environ`, or from its reaper's (a fork of
/// this process) at `/proc/$PPID/environ`. A root caller's scripts keep `CAP_SYS_PTRACE` and
/// still can; core dumps of the CLI are given up.
fn keep_our_environment_to_ourselves() {
    // SAFETY: PR_SET_DUMPABLE takes an integer and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}

/// Marks every descriptor above stderr close-on-exec. A shell gives us whatever it had open
/// (`vibeos-exec run x.py 3>secret.log`); a script, its `terminal` commands and every other
/// process we start would otherwise inherit them, which a cold script must not (its reaper
/// only closes its own pipes). Paths like `/dev/fd/63` (`--config <(...)`) still open: that
/// goes through `/proc`, not inheritance.
fn keep_inherited_descriptors_to_ourselves() {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on open descriptors; no
    // memory is involved. A kernel without it (before 5.11) says so and nothing changes.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
    }
}

/// Whether stdout was closed when the process started (see
/// [`open_missing_standard_descriptors`]).
static STDOUT_CLOSED_AT_START: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Whether stdout was closed when the process started: what it writes there is lost.
pub fn stdout_closed_at_start() -> bool {
    STDOUT_CLOSED_AT_START.load(std::sync::atomic::Ordering::Relaxed)
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
        // life. A closed stdout gets /dev/full: the output cannot be delivered, and a write
        // there fails, so the run says so and exits 1 (on /dev/null it reported success).
        let stand_in = if missing.fd == 1 {
            STDOUT_CLOSED_AT_START.store(true, std::sync::atomic::Ordering::Relaxed);
            "/dev/full"
        } else {
            "/dev/null"
        };
        match nix::fcntl::open(stand_in, OFlag::O_RDWR, Mode::empty()) {
            Ok(null) => std::mem::forget(null),
            Err(e) => {
                // std aborts here too: a process whose stdout could become any file it opens
                // must not go on.
                eprintln!(
                    "vibeos-exec: descriptor {} was closed at start and {stand_in} cannot be \
                     opened in its place ({e}); start vibeos-exec with stdin, stdout and stderr open",
                    missing.fd
                );
                std::process::abort();
            }
        }
    }
}

/// The command line the process was started with, program name first.
pub fn args_os() -> &'static [OsString] {
    ARGS.get().map_or(&[], Vec::as_slice)
}

/// # Safety
/// As [`prepare`].
unsafe fn copy_args(argc: c_int, argv: *const *const c_char) -> Vec<OsString> {
    let count = usize::try_from(argc).unwrap_or(0);
    if argv.is_null() {
        return Vec::new();
    }
    (0..count)
        // SAFETY: `argv` holds `argc` valid pointers (the caller's contract); a null entry
        // (which the C standard allows only at `argv[argc]`) ends the list early.
        .map(|i| unsafe { *argv.add(i) })
        .take_while(|arg| !arg.is_null())
        // SAFETY: each non-null entry is a NUL-terminated string that lives as long as the
        // process.
        .map(|arg| OsStr::from_bytes(unsafe { CStr::from_ptr(arg) }.to_bytes()).to_os_string())
        .collect()
}

fn ignore_sigpipe() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: installing SIG_IGN runs no handler code; nothing else in the process has started
    // yet, so no thread observes the change half-made.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigIgn) };
}
