//! Single-steps a command, and every thread and process it starts, with `ptrace`.
//!
//! Sampling (`perf record`) misses the small functions a run executes once, and each one it
//! misses leaves a 64 KB window of cold code to be mapped; stepping every instruction is slow
//! (about 70 µs a step on these VMs, a few minutes for a run) but complete. A process is let
//! go when it executes a program other than the binary (the interpreter a run starts).

use std::collections::HashMap;
use std::ffi::CString;
use std::path::Path;

use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::{raise, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{execvp, fork, ForkResult, Pid};

use crate::symbols::FunctionTable;
use crate::LinkOrderError;

/// Where the binary is mapped in one traced process.
struct Image {
    /// Runtime address minus link-time address.
    bias: u64,
    /// The binary's executable mappings, as runtime address ranges.
    code: Vec<(u64, u64)>,
}

impl Image {
    /// Reads `/proc/<pid>/maps`; `None` when the process does not run `binary`.
    fn of(pid: Pid, binary: &Path, image_base: u64) -> Option<Self> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        let mut lowest = None;
        let mut code = Vec::new();
        for line in maps.lines() {
            // address perms offset dev inode path; the path may hold spaces.
            let fields: Vec<&str> = line.splitn(6, ' ').collect();
            if fields.len() < 6 || Path::new(fields[5].trim_start()) != binary {
                continue;
            }
            let (start, end) = fields[0].split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            let end = u64::from_str_radix(end, 16).ok()?;
            lowest = Some(lowest.map_or(start, |low: u64| low.min(start)));
            if fields[1].contains('x') {
                code.push((start, end));
            }
        }
        Some(Self {
            bias: lowest?.checked_sub(image_base)?,
            code,
        })
    }

    /// The link-time address of `ip`, if it lies in the binary's code.
    fn link_address(&self, ip: u64) -> Option<u64> {
        self.code
            .iter()
            .any(|&(start, end)| (start..end).contains(&ip))
            .then(|| ip - self.bias)
    }
}

/// Runs `command` and returns the indices (in `table`) of the functions of `binary` it
/// executed, in the order each first ran.
pub fn functions_executed(
    binary: &Path,
    table: &FunctionTable,
    command: &[String],
) -> Result<Vec<usize>, LinkOrderError> {
    let binary = std::fs::canonicalize(binary).map_err(|source| LinkOrderError::ReadBinary {
        path: binary.to_owned(),
        source,
    })?;
    let spawn_error = |reason: String| LinkOrderError::Spawn {
        command: command.join(" "),
        reason,
    };
    let argv = command
        .iter()
        .map(|arg| CString::new(arg.as_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| spawn_error("an argument holds a NUL byte".to_owned()))?;
    let program = argv
        .first()
        .ok_or_else(|| spawn_error("no command given".to_owned()))?;

    // SAFETY: this tool has a single thread, so the child cannot inherit a lock held by
    // another; it only calls ptrace, raise, execvp and _exit on data built before the fork.
    let root = match unsafe { fork() }.map_err(|errno| spawn_error(errno.to_string()))? {
        ForkResult::Child => {
            let _ = ptrace::traceme();
            let _ = raise(Signal::SIGSTOP);
            let _ = execvp(program, &argv);
            // SAFETY: _exit ends the forked child without running the parent's destructors.
            unsafe { nix::libc::_exit(127) }
        }
        ForkResult::Parent { child } => child,
    };
    let trace = |step: &'static str| move |source: Errno| LinkOrderError::Trace { step, source };
    waitpid(root, Some(WaitPidFlag::__WALL)).map_err(trace("the first stop"))?;
    ptrace::setoptions(
        root,
        ptrace::Options::PTRACE_O_TRACECLONE
            | ptrace::Options::PTRACE_O_TRACEFORK
            | ptrace::Options::PTRACE_O_TRACEVFORK
            | ptrace::Options::PTRACE_O_TRACEEXEC
            | ptrace::Options::PTRACE_O_EXITKILL,
    )
    .map_err(trace("setting options"))?;
    ptrace::cont(root, None).map_err(trace("starting the command"))?;

    let mut seen = vec![false; table.len()];
    let mut order = Vec::new();
    // `None`: the process does not run the binary (yet); it runs on untraced.
    let mut images: HashMap<Pid, Option<Image>> = HashMap::new();
    let mut ran_binary = false;
    loop {
        let status = match waitpid(None, Some(WaitPidFlag::__WALL)) {
            Ok(status) => status,
            Err(Errno::ECHILD) => break,
            Err(Errno::EINTR) => continue,
            Err(errno) => return Err(trace("waiting for the command")(errno)),
        };
        let (pid, deliver) = match status {
            WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _) => {
                images.remove(&pid);
                continue;
            }
            WaitStatus::PtraceEvent(pid, _, event) if event == nix::libc::PTRACE_EVENT_EXEC => {
                let image = Image::of(pid, &binary, table.image_base());
                if image.is_none() {
                    // Another program (the interpreter): let it run at full speed.
                    images.remove(&pid);
                    let _ = ptrace::detach(pid, None);
                    continue;
                }
                ran_binary = true;
                images.insert(pid, image);
                (pid, None)
            }
            WaitStatus::PtraceEvent(pid, _, _) => (pid, None),
            WaitStatus::Stopped(pid, signal) => {
                let deliver = match signal {
                    Signal::SIGTRAP | Signal::SIGSTOP => None,
                    other => Some(other),
                };
                (pid, deliver)
            }
            _ => continue,
        };
        let image = images
            .entry(pid)
            .or_insert_with(|| Image::of(pid, &binary, table.image_base()));
        let Some(image) = image else {
            let _ = ptrace::cont(pid, deliver);
            continue;
        };
        if let Ok(registers) = ptrace::getregs(pid) {
            if let Some(index) = image
                .link_address(registers.rip)
                .and_then(|address| table.function_at(address))
            {
                if !seen[index] {
                    seen[index] = true;
                    order.push(index);
                }
            }
        }
        // A process that died between its stop and this call is reported by the next wait.
        let _ = ptrace::step(pid, deliver);
    }
    if !ran_binary {
        return Err(LinkOrderError::NeverRan { binary });
    }
    Ok(order)
}
