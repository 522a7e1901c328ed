//! The per-execution reaper: nothing a script starts outlives its execution.
//!
//! `killpg` alone is not enough: a script's child can `setsid()` or double-fork out of the
//! process group. So every execution gets its own *reaper* process, forked between the
//! supervisor and the interpreter:
//!
//! ```text
//! supervisor ── reaper (own session, PR_SET_CHILD_SUBREAPER) ── python script.py ── ...
//! ```
//!
//! Because the reaper is a child subreaper, any descendant that is orphaned — however it
//! detached — is re-parented to it, never to init. When the script exits, the reaper kills every
//! process still below it (repeating until none is left) and then exits with the script's
//! status. On SIGTERM (timeout, interrupt) it sends SIGTERM to the whole tree, and SIGKILL after
//! the grace period. A pipe (the "lifeline") whose write end only the supervisor holds tells the
//! reaper when the supervisor died, so even a SIGKILLed supervisor leaves nothing running.
//!
//! The reaper runs between `fork` and `exec` of a multi-threaded program, so it uses only
//! async-signal-safe system calls: no allocation, no locks, no Rust std I/O.
//!
//! Alternatives considered (see docs/process-containment.md): a PID namespace needs privileges
//! or a user namespace and changes what the script sees; a cgroup needs a delegated writable
//! hierarchy. The subreaper works for any user on any Linux ≥ 3.4 and composes with both, which
//! strict mode adds on top.

use crate::fds::{cloexec_pipe, close_all_except};
use crate::staging_sweep::StagingPath;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// The supervisor's end of a reaper's lifeline. Dropping it tells the reaper to stop the tree.
#[derive(Debug)]
pub struct Lifeline {
    // Held, never read: dropping it closes the pipe, which is the reaper's signal.
    _write_end: OwnedFd,
}

/// The reaper's end, moved into the `pre_exec` closure.
#[derive(Debug, Clone, Copy)]
pub struct ReaperSetup {
    read_fd: RawFd,
    write_fd: RawFd,
    /// Write end of the status report pipe ([`status_report`]), -1 for none.
    status_fd: RawFd,
    grace_ms: u64,
    /// The staging dir the reaper removes if the supervisor dies without doing it.
    staging: StagingPath,
}

/// Creates the lifeline pipe for one execution; `staging` is the dir the reaper sweeps when it
/// outlives the supervisor.
pub fn lifeline(
    grace: Duration,
    staging: Option<&std::path::Path>,
) -> io::Result<(Lifeline, ReaperSetup, OwnedFd)> {
    let (read_end, write_end) = cloexec_pipe()?;
    let setup = ReaperSetup {
        read_fd: read_end.as_raw_fd(),
        write_fd: write_end.as_raw_fd(),
        status_fd: -1,
        grace_ms: grace.as_millis().min(u64::MAX as u128) as u64,
        staging: staging.map_or_else(StagingPath::none, StagingPath::new),
    };
    Ok((
        Lifeline {
            _write_end: write_end,
        },
        setup,
        read_end,
    ))
}

impl ReaperSetup {
    /// Makes the reaper write the script's wait status, as a decimal line, on `fd` once the
    /// script is reaped and every descendant is gone, before its own exit. `fd` must stay open
    /// in the supervisor until the spawn returns.
    pub fn report_status_on(&mut self, fd: RawFd) {
        self.status_fd = fd;
    }
}

/// A pipe for a reaper's status report: the read end (the supervisor's) and the write end (the
/// reaper's, close-on-exec so the interpreter never holds it; the supervisor drops its copy once
/// the spawn returns).
///
/// Why not `wait`: a wait returns only once the reaper is gone, after the kernel has torn down
/// its address space (a copy of the supervisor's, a few hundred microseconds), and std's wait
/// blocks, which cost a cold run a blocking-pool thread (its start, and the runtime's wait for
/// it at shutdown). The report is read on the runtime's own poller, as a forked reaper's is.
pub fn status_report() -> io::Result<(std::fs::File, OwnedFd)> {
    let (read_end, write_end) = cloexec_pipe()?;
    Ok((std::fs::File::from(read_end), write_end))
}

const WATCHED: [libc::c_int; 5] = [
    libc::SIGCHLD,
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
];

/// Runs in the forked child before exec (from `Command::pre_exec`) and turns it into the reaper:
/// it starts the script process, which execs `exec` ([`crate::script_exec`]), and then watches
/// the tree until the script is done. It returns only when the script process could not be
/// started, with the error that `Command` then reports to the supervisor's spawn.
///
/// With `confinement` (strict mode) the script process is confined just before its exec, and
/// only it: the reaper stays as the supervisor made it (root, unconfined) because it must read
/// every descendant's `/proc` entries and signal processes running under the script's uid; it
/// runs no script code, and the script cannot signal or trace it (landlock's signal scope,
/// seccomp, a different uid). `inherit` are descriptors the interpreter keeps (-1 for none).
///
/// # Safety
/// Must be called only between fork and exec (from `Command::pre_exec`), with `exec` prepared
/// before the fork.
pub unsafe fn become_reaper(
    setup: ReaperSetup,
    confinement: Option<&crate::confine::child::ChildConfinement>,
    inherit: [libc::c_int; 2],
    exec: &crate::script_exec::ScriptExec,
) -> io::Error {
    // SAFETY: (the whole function) only async-signal-safe libc calls on plain integers and stack
    // buffers; no allocation or locking happens between fork and exec/_exit.
    unsafe {
        libc::close(setup.write_fd);
        if libc::setsid() < 0 {
            return io::Error::last_os_error();
        }
        // The script's parent: its `/proc/PID/environ` is the host's whole environment (this is
        // a fork of the host), which a project-mode script could read as the same user. Not
        // dumpable, it takes more than the same uid (the script itself is exec'd, dumpable).
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut mask);
        for s in WATCHED {
            libc::sigaddset(&mut mask, s);
        }
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_BLOCK, &mask, &mut old);
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            return io::Error::last_os_error();
        }
        let steps = crate::script_exec::Steps {
            reaper_pid: libc::getpid(),
            close: [setup.read_fd, setup.status_fd],
            confinement,
            inherit,
        };
        match crate::script_exec::spawn(&steps, exec) {
            Ok(pid) => reaper_main(pid, setup, &mask),
            Err(e) => e,
        }
    }
}

/// The reaper's life. Never returns.
unsafe fn reaper_main(script: libc::pid_t, setup: ReaperSetup, mask: &libc::sigset_t) -> ! {
    // SAFETY: see `become_reaper`; everything below is a plain system call.
    unsafe {
        // Keep only the lifeline. The supervisor's pipes (stdout, stderr, the exec-error pipe of
        // the spawn) must not be held open by the reaper, or the supervisor would wait on them.
        close_all_except(setup.read_fd, setup.status_fd);
        // Our parent is the supervisor; once it is not, the supervisor died.
        let supervisor = libc::getppid();
        let sfd = libc::signalfd(-1, mask, libc::SFD_CLOEXEC);
        let mut lifeline = setup.read_fd;
        let mut script_status: Option<libc::c_int> = None;
        let mut kill_at: Option<u64> = None;
        let mut terminating = false;
        loop {
            // Reap whatever has exited.
            loop {
                let mut st: libc::c_int = 0;
                let r = libc::waitpid(-1, &mut st, libc::WNOHANG);
                if r > 0 {
                    if r == script {
                        script_status = Some(st);
                    }
                    continue;
                }
                break;
            }
            if let Some(st) = script_status {
                kill_everything_below(libc::getpid());
                // The lifeline reaches EOF when the supervisor's last thread closes its files,
                // before the kernel reparents us: a supervisor killed a moment ago can still be
                // our parent here, so a parent that is exiting counts as gone.
                let gone =
                    libc::getppid() != supervisor || (lifeline < 0 && is_exiting(supervisor));
                if gone {
                    // Nobody else will remove the staging dir now.
                    setup.staging.sweep();
                }
                report_status(setup.status_fd, st);
                exit_like(st);
            }
            let now = now_ms();
            if let Some(at) = kill_at {
                if now >= at {
                    signal_tree(libc::getpid(), libc::SIGKILL);
                    kill_at = None;
                }
            }
            let timeout: libc::c_int = match kill_at {
                Some(at) => (at.saturating_sub(now)).min(i32::MAX as u64) as libc::c_int,
                None => -1,
            };
            let mut fds = [
                libc::pollfd {
                    fd: sfd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: lifeline,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let n = libc::poll(fds.as_mut_ptr(), 2, if sfd < 0 { 50 } else { timeout });
            if n < 0 {
                continue;
            }
            let mut stop = false;
            if fds[1].revents != 0 {
                // EOF (or error): the supervisor is gone or asked us to stop.
                libc::close(lifeline);
                lifeline = -1;
                stop = true;
            }
            if sfd >= 0 && fds[0].revents & libc::POLLIN != 0 {
                let mut info: [libc::signalfd_siginfo; 8] = std::mem::zeroed();
                let size = std::mem::size_of::<libc::signalfd_siginfo>();
                let r = libc::read(sfd, info.as_mut_ptr().cast(), size * info.len());
                if r > 0 {
                    for i in info.iter().take(r as usize / size) {
                        if i.ssi_signo as libc::c_int != libc::SIGCHLD {
                            stop = true;
                        }
                    }
                }
            }
            if stop && !terminating {
                terminating = true;
                signal_tree(libc::getpid(), libc::SIGTERM);
                kill_at = Some(now_ms() + setup.grace_ms);
            }
        }
    }
}

/// Whether `pid` is exiting or has exited (`PF_EXITING` in the flags of `/proc/PID/stat`, the
/// ninth field); false when that cannot be read.
///
/// # Safety
/// Async-signal-safe: only open, read and close, parsing on the stack.
unsafe fn is_exiting(pid: libc::pid_t) -> bool {
    const PF_EXITING: u64 = 0x4;
    let mut path = PathBuf64::new();
    path.push(b"/proc/");
    path.push_num(pid as u64);
    path.push(b"/stat\0");
    let mut buf = [0u8; 512];
    // SAFETY: `path` is NUL-terminated and `buf` is a valid buffer of its length.
    let len = unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let r = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        r
    };
    if len <= 0 {
        return false;
    }
    let text = &buf[..len as usize];
    // The command name may hold spaces and parentheses: fields count from the last ')'.
    let Some(close) = text.iter().rposition(|&b| b == b')') else {
        return false;
    };
    let Some(field) = text[close + 1..]
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty())
        .nth(6)
    else {
        return false;
    };
    parse_num(field).is_some_and(|flags| flags & PF_EXITING != 0)
}

/// Writes `status` as a decimal line on `fd` (none when `fd` is -1). A supervisor that is gone
/// has closed the read end: the write then fails with EPIPE, which must not kill the reaper
/// before it has exited like the script.
///
/// # Safety
/// Async-signal-safe: a digit buffer on the stack, sigaction and write.
unsafe fn report_status(fd: RawFd, status: libc::c_int) {
    if fd < 0 {
        return;
    }
    let mut line = PathBuf64::new();
    line.push_num(u64::from(status as u32));
    line.push(b"\n");
    // SAFETY: plain system calls on a stack buffer of `line.len` initialised bytes.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        libc::write(fd, line.buf.as_ptr().cast(), line.len);
        libc::close(fd);
    }
}

/// Exits with the same status as the script: its code, or death by the same signal.
unsafe fn exit_like(status: libc::c_int) -> ! {
    // SAFETY: plain system calls in a single-threaded process about to exit.
    unsafe {
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(libc::WEXITSTATUS(status))
    }
}

/// SIGKILLs every process below `me` until none is left. As a subreaper, orphans come back to
/// us, so killing direct children repeatedly reaches every descendant.
unsafe fn kill_everything_below(me: libc::pid_t) {
    // SAFETY: plain system calls.
    unsafe {
        loop {
            signal_tree(me, libc::SIGKILL);
            let mut st: libc::c_int = 0;
            let r = libc::waitpid(-1, &mut st, 0);
            if r < 0 && *libc::__errno_location() == libc::ECHILD {
                return;
            }
        }
    }
}

/// Sends `sig` to every descendant of `root` (not to `root`), walking
/// `/proc/PID/task/TID/children` depth-first with a fixed-size stack.
unsafe fn signal_tree(root: libc::pid_t, sig: libc::c_int) {
    const MAX: usize = 8192;
    let mut stack = [0 as libc::pid_t; MAX];
    let mut depth = 0usize;
    // SAFETY: plain system calls on stack buffers.
    unsafe {
        for_each_child(root, &mut |child| {
            if depth < MAX {
                stack[depth] = child;
                depth += 1;
            }
        });
        let mut seen = 0usize;
        while depth > 0 {
            depth -= 1;
            let pid = stack[depth];
            // Stop first so it cannot fork while we look at its children, then signal.
            if sig == libc::SIGKILL {
                libc::kill(pid, libc::SIGSTOP);
            }
            for_each_child(pid, &mut |child| {
                if depth < MAX {
                    stack[depth] = child;
                    depth += 1;
                }
            });
            libc::kill(pid, sig);
            if sig == libc::SIGTERM {
                // A stopped process would not act on SIGTERM until continued.
                libc::kill(pid, libc::SIGCONT);
            }
            seen += 1;
            if seen > 1_000_000 {
                break;
            }
        }
    }
}

/// Calls `f` with each child of `pid`, across all its threads.
unsafe fn for_each_child(pid: libc::pid_t, f: &mut dyn FnMut(libc::pid_t)) {
    let mut path = PathBuf64::new();
    path.push(b"/proc/");
    path.push_num(pid as u64);
    path.push(b"/task\0");
    // SAFETY: path is NUL-terminated; the buffers are on the stack.
    unsafe {
        let dir = libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        );
        if dir < 0 {
            return;
        }
        let mut dents = [0u8; 4096];
        loop {
            let n = libc::syscall(libc::SYS_getdents64, dir, dents.as_mut_ptr(), dents.len());
            if n <= 0 {
                break;
            }
            let mut off = 0usize;
            while off + 19 < n as usize {
                let reclen = u16::from_ne_bytes([dents[off + 16], dents[off + 17]]) as usize;
                if reclen == 0 {
                    break;
                }
                let name = &dents[off + 19..off + reclen];
                let tid = parse_num(name);
                off += reclen;
                let Some(tid) = tid else { continue };
                let mut cpath = PathBuf64::new();
                cpath.push(b"/proc/");
                cpath.push_num(pid as u64);
                cpath.push(b"/task/");
                cpath.push_num(tid);
                cpath.push(b"/children\0");
                let fd = libc::open(cpath.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    continue;
                }
                let mut buf = [0u8; 4096];
                let mut carry: u64 = 0;
                let mut in_num = false;
                loop {
                    let r = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                    if r <= 0 {
                        break;
                    }
                    for &b in &buf[..r as usize] {
                        if b.is_ascii_digit() {
                            carry = carry * 10 + (b - b'0') as u64;
                            in_num = true;
                        } else if in_num {
                            f(carry as libc::pid_t);
                            carry = 0;
                            in_num = false;
                        }
                    }
                }
                if in_num {
                    f(carry as libc::pid_t);
                }
                libc::close(fd);
            }
        }
        libc::close(dir);
    }
}

fn parse_num(name: &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    let mut any = false;
    for &b in name {
        if b == 0 {
            break;
        }
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((b - b'0') as u64)?;
        any = true;
    }
    any.then_some(v)
}

fn now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// A NUL-terminated path built on the stack.
struct PathBuf64 {
    buf: [u8; 96],
    len: usize,
}

impl PathBuf64 {
    fn new() -> Self {
        PathBuf64 {
            buf: [0; 96],
            len: 0,
        }
    }
    fn push(&mut self, s: &[u8]) {
        for &b in s {
            if self.len < self.buf.len() - 1 {
                self.buf[self.len] = b;
                self.len += 1;
            }
        }
    }
    fn push_num(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let mut tmp = [0u8; 20];
        let len = digits.len() - i;
        tmp[..len].copy_from_slice(&digits[i..]);
        self.push(&tmp[..len]);
    }
    fn as_ptr(&self) -> *const libc::c_char {
        self.buf.as_ptr().cast()
    }
}

/// Whether `pid` is `ancestor` or one of its descendants (walks the parent chain in /proc); a
/// process that is gone is not. Use [`descends_from`] where a failed lookup must not be taken
/// for "no".
pub fn is_descendant(pid: u32, ancestor: u32) -> bool {
    descends_from(pid, ancestor).unwrap_or(false)
}

/// Like [`is_descendant`], but an error reading /proc (other than the process being gone) is
/// reported instead of being taken for "no": out of descriptors, /proc hidden.
pub fn descends_from(pid: u32, ancestor: u32) -> std::io::Result<bool> {
    let mut current = pid;
    for _ in 0..1024 {
        if current == ancestor {
            return Ok(true);
        }
        if current <= 1 {
            return Ok(false);
        }
        match parent_of(current)? {
            Some(p) => current = p,
            None => return Ok(false),
        }
    }
    Ok(false)
}

/// The parent of `pid`; `None` when the process is gone or its stat line is unreadable.
fn parent_of(pid: u32) -> std::io::Result<Option<u32>> {
    let stat = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ESRCH)) => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let Some(close) = stat.rfind(')') else {
        return Ok(None);
    };
    let mut fields = stat[close + 1..].split_whitespace();
    fields.next(); // state
    Ok(fields.next().and_then(|f| f.parse().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exited_process_counts_as_exiting_and_a_live_one_does_not() {
        // SAFETY: reads of /proc only.
        unsafe {
            assert!(!is_exiting(libc::getpid()));
            assert!(!is_exiting(i32::MAX));
        }
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as libc::pid_t;
        // Not reaped yet: a zombie, whose flags keep PF_EXITING.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let zombie = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
        };
        while !zombie() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // SAFETY: reads of /proc only.
        assert!(unsafe { is_exiting(pid) });
        child.wait().unwrap();
    }

    #[test]
    fn stack_paths_are_built_right() {
        let mut p = PathBuf64::new();
        p.push(b"/proc/");
        p.push_num(12345);
        p.push(b"/task\0");
        assert_eq!(&p.buf[..p.len], b"/proc/12345/task\0");
        let mut p = PathBuf64::new();
        p.push_num(0);
        assert_eq!(&p.buf[..p.len], b"0");
    }

    #[test]
    fn parses_task_names() {
        assert_eq!(parse_num(b"123\0\0"), Some(123));
        assert_eq!(parse_num(b".\0"), None);
        assert_eq!(parse_num(b"\0"), None);
    }

    #[test]
    fn this_process_descends_from_itself_and_its_parent() {
        let me = std::process::id();
        assert!(is_descendant(me, me));
        let parent = parent_of(me).unwrap().unwrap();
        assert!(is_descendant(me, parent));
        assert!(!is_descendant(parent, me));
        // A process that is gone is nobody's descendant, and that is not an error.
        assert_eq!(descends_from(u32::MAX - 1, me).ok(), Some(false));
    }
}
