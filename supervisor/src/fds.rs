//! Descriptor helpers for code that forks: pipes made close-on-exec from the start, and the
//! clean-up a forked child of a multi-threaded process does before anything else. Below both
//! the reaper and the confinement code, which each fork children of their own.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// A pipe with both ends close-on-exec: (read end, write end).
pub(crate) fn cloexec_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Closes every descriptor but `keep` and `also` (either -1 for none).
///
/// # Safety
/// Only in a child right after `fork`, before it touches any descriptor the parent's code
/// owns: every `OwnedFd` or `File` of the parent's becomes a closed number here.
pub(crate) unsafe fn close_all_except(keep: RawFd, also: RawFd) {
    // Descriptors below 3 are closed one by one; from 3 up, close_range spans the gaps between
    // the kept ones (at most three spans), falling back to closing one at a time.
    let mut kept = [keep, also];
    kept.sort_unstable();
    // SAFETY: close_range/close on integer descriptors.
    unsafe {
        for fd in 0..3 {
            if !kept.contains(&fd) {
                libc::close(fd);
            }
        }
        let mut from: RawFd = 3;
        let mut ok = true;
        for k in kept {
            if k < from {
                continue;
            }
            if k > from {
                ok &= libc::syscall(libc::SYS_close_range, from as u32, (k - 1) as u32, 0u32) == 0;
            }
            from = k + 1;
        }
        ok &= libc::syscall(libc::SYS_close_range, from as u32, u32::MAX, 0u32) == 0;
        if !ok {
            for fd in 3..65536 {
                if !kept.contains(&fd) {
                    libc::close(fd);
                }
            }
        }
    }
}
