//! The script process's start from the reaper: a child that shares the reaper's memory until its
//! exec, so that starting it copies no page tables and its exec tears none down.
//!
//! A cold `run` starts two processes before the interpreter runs: the reaper (a fork of the
//! supervisor, see [`crate::reaper`]) and the script process below it. Forking the second one
//! copied the reaper's page tables (a copy of the supervisor's) only for the exec to throw them
//! away a moment later, on the critical path of every cold run (docs/cold-start.md, "Stop 33").
//! The script process is now a `CLONE_VM | CLONE_VFORK` clone, as `posix_spawn` makes one: it
//! runs on a stack of its own, applies the limits and the confinement exactly as the forked one
//! did, and execs; the reaper sleeps until then.
//!
//! Because the child writes into the reaper's memory, everything it needs is prepared before
//! the supervisor forks the reaper ([`ScriptExec`]): the program, argv and envp as C strings.
//! Its stack is a static buffer of which every reaper has its own copy. Between clone and exec
//! it makes only async-signal-safe system calls, allocates nothing, and reports a failure
//! through one integer the reaper reads once it runs again.

use std::ffi::{c_char, c_int, c_void, CString, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The stack the script process runs on until its exec. The confinement's steps use a few KiB
/// (the reveal's mount table is the largest frame); debug builds use several times what release
/// builds do, so this leaves wide room, and only the pages touched cost anything (it lives in
/// `.bss`).
const STACK_BYTES: usize = 256 * 1024;

/// Everything the script process execs, prepared before the reaper is forked.
#[derive(Debug)]
pub(crate) struct ScriptExec {
    program: CString,
    argv: CStringArray,
    envp: CStringArray,
}

/// Why a script process's exec could not be prepared.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PrepareError {
    /// A string of the exec holds a NUL byte, which an exec cannot carry.
    #[error("{what} holds a NUL byte, which cannot be passed to the interpreter; remove it")]
    Nul {
        /// Which string: the interpreter path, an argument (quoted), or an environment variable
        /// (named by its key only: its value may be a secret).
        what: String,
    },
}

impl ScriptExec {
    /// The exec of `program` with `args` (argv[0] is `program` itself, as a `Command` would make
    /// it) in exactly the environment `env`.
    pub(crate) fn new<'a>(
        program: &Path,
        args: impl IntoIterator<Item = &'a OsStr>,
        env: impl IntoIterator<Item = (&'a OsStr, &'a OsStr)>,
    ) -> Result<ScriptExec, PrepareError> {
        let nul = |what: String| move |_| PrepareError::Nul { what };
        let program = CString::new(program.as_os_str().as_bytes())
            .map_err(nul("the interpreter path".into()))?;
        let mut argv = vec![program.clone()];
        for arg in args {
            argv.push(
                CString::new(arg.as_bytes())
                    .map_err(nul(format!("the argument {:?}", arg.to_string_lossy())))?,
            );
        }
        let mut envp = Vec::new();
        for (key, value) in env {
            let mut entry = Vec::with_capacity(key.len() + value.len() + 1);
            entry.extend_from_slice(key.as_bytes());
            entry.push(b'=');
            entry.extend_from_slice(value.as_bytes());
            envp.push(CString::new(entry).map_err(nul(format!(
                "the environment variable {:?}",
                key.to_string_lossy()
            )))?);
        }
        Ok(ScriptExec {
            program,
            argv: CStringArray::new(argv),
            envp: CStringArray::new(envp),
        })
    }
}

/// Owned C strings and the NULL-terminated pointer array an exec takes.
#[derive(Debug)]
struct CStringArray {
    // Held for `ptrs`, which points into them; a CString's bytes never move.
    _strings: Vec<CString>,
    ptrs: Vec<*const c_char>,
}

impl CStringArray {
    fn new(strings: Vec<CString>) -> CStringArray {
        let mut ptrs: Vec<*const c_char> = strings.iter().map(|s| s.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        CStringArray {
            _strings: strings,
            ptrs,
        }
    }
}

/// The script process's stack: a static buffer, so that preparing an exec maps nothing and
/// the supervisor never touches it. Every reaper is a forked copy of the supervisor and has its
/// own copy of the buffer (zero pages until written), which only its script process, while the
/// reaper sleeps in the clone, runs on; concurrent executions therefore never share one.
struct ChildStack(std::cell::UnsafeCell<[u8; STACK_BYTES]>);

// SAFETY: the supervisor never reads or writes the buffer; each reaper's copy is used by one
// script process at a time (see above).
unsafe impl Sync for ChildStack {}

static CHILD_STACK: ChildStack = ChildStack(std::cell::UnsafeCell::new([0; STACK_BYTES]));

/// The initial stack pointer for a script process: the top of [`CHILD_STACK`] (x86_64 and
/// aarch64 stacks grow down), 16-byte aligned as both ABIs require.
fn child_stack_top() -> *mut c_void {
    let top = CHILD_STACK.0.get() as usize + STACK_BYTES;
    (top & !15) as *mut c_void
}

// SAFETY: the raw pointers point into memory this value owns (the C strings) and
// are only read, by the spawned child of a copy of this process; moving the value to another
// thread or sharing it moves or shares nothing else.
unsafe impl Send for ScriptExec {}
// SAFETY: as above: no method mutates through the pointers.
unsafe impl Sync for ScriptExec {}

/// What the script process does between its clone and its exec, in order: the steps of the
/// forked grandchild it replaces.
pub(crate) struct Steps<'a> {
    /// The reaper's pid: a script process whose parent is not it must not run.
    pub(crate) reaper_pid: libc::pid_t,
    /// The reaper's descriptors, which the script process must not hold.
    pub(crate) close: [c_int; 2],
    /// Strict mode's privilege drop and seal.
    pub(crate) confinement: Option<&'a crate::confine::child::ChildConfinement>,
    /// Descriptors the interpreter inherits (the pool's control and ready pipes), -1 for none.
    pub(crate) inherit: [c_int; 2],
}

/// Shared between the reaper and the script process, on the reaper's stack.
struct Shared<'a> {
    steps: &'a Steps<'a>,
    exec: &'a ScriptExec,
    /// The errno of the step that failed, written by the script process before it exits; 0 if
    /// it exec'd (or exited on purpose, without an error to report).
    error: c_int,
}

/// Starts the script process and returns its pid once it has exec'd (or exited).
///
/// # Safety
/// Only in the reaper, between fork and exec: single-threaded, with `exec` and the confinement
/// prepared before the fork.
pub(crate) unsafe fn spawn(steps: &Steps<'_>, exec: &ScriptExec) -> io::Result<libc::pid_t> {
    let mut shared = Shared {
        steps,
        exec,
        error: 0,
    };
    // SAFETY: plain system calls. The child runs `script_process` on its own stack, shares our
    // memory only while we sleep in the clone (CLONE_VFORK), and ends in exec or _exit. Every
    // signal is blocked across the clone so that no handler of ours runs in the child before it
    // resets them.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_SETMASK, &all, &mut before);
        let pid = libc::clone(
            script_process,
            child_stack_top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut shared as *mut Shared<'_>).cast(),
        );
        let clone_error = io::Error::last_os_error();
        libc::sigprocmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
        if pid < 0 {
            return Err(clone_error);
        }
        let error = std::ptr::read_volatile(&shared.error);
        if error != 0 {
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            return Err(io::Error::from_raw_os_error(error));
        }
        Ok(pid)
    }
}

/// The script process from its clone to its exec.
extern "C" fn script_process(arg: *mut c_void) -> c_int {
    let shared = arg.cast::<Shared<'_>>();
    // SAFETY: `arg` is the reaper's `Shared`, alive while the reaper sleeps in its clone call,
    // which lasts until this process execs or exits.
    unsafe {
        let error = prepare_and_exec((*shared).steps, (*shared).exec);
        std::ptr::write_volatile(
            &mut (*shared).error,
            error
                .raw_os_error()
                .filter(|&e| e != 0)
                .unwrap_or(libc::EINVAL),
        );
        libc::_exit(127)
    }
}

/// Returns only on failure.
unsafe fn prepare_and_exec(steps: &Steps<'_>, exec: &ScriptExec) -> io::Error {
    // SAFETY: async-signal-safe system calls on integers, stack buffers and memory prepared
    // before the fork.
    unsafe {
        // The reaper's handlers must not run here: this process shares its memory until exec.
        // Every signal is still blocked (see `spawn`), so resetting them first is race-free.
        // SIGRTMAX included: it is a signal number like any other.
        for sig in 1..=libc::SIGRTMAX() {
            let mut action: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut action) != 0 {
                continue;
            }
            if action.sa_sigaction != libc::SIG_DFL && action.sa_sigaction != libc::SIG_IGN {
                action.sa_sigaction = libc::SIG_DFL;
                action.sa_flags = 0;
                libc::sigaction(sig, &action, std::ptr::null_mut());
            }
        }
        // The script process: normal signal mask, dies with its reaper.
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        for fd in steps.close {
            if fd >= 0 {
                libc::close(fd);
            }
        }
        if let Some(c) = steps.confinement {
            if let Err(e) = c.drop_privileges() {
                return e;
            }
        }
        // After any uid change, which clears the parent-death signal.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        if libc::getppid() != steps.reaper_pid {
            libc::_exit(127);
        }
        if let Some(c) = steps.confinement {
            if let Err(e) = c.seal() {
                return e;
            }
        }
        if steps.confinement.is_none() {
            // Project mode: what the host had open without close-on-exec (descriptors a
            // library host inherited from its own caller) stays out of the script. Strict mode
            // does the same in its confinement.
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
        }
        // Clearing close-on-exec is allowed by the strict filter; these descriptors stay open
        // in the supervisor until the spawn returns.
        for fd in steps.inherit {
            if fd >= 0 && libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return io::Error::last_os_error();
            }
        }
        libc::execve(
            exec.program.as_ptr(),
            exec.argv.ptrs.as_ptr(),
            exec.envp.ptrs.as_ptr(),
        );
        io::Error::last_os_error()
    }
}
