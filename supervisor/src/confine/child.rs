//! The part of strict confinement that runs in the script process between fork and exec.
//!
//! The supervisor is multi-threaded, so after `fork` only async-signal-safe calls are allowed:
//! everything here is a raw system call on values the parent prepared ([`ChildConfinement`]) —
//! no allocation, no locks, no Rust std I/O. The order is what makes it stick:
//!
//! 1. mark every descriptor but stdio and the RPC channel close-on-exec (they close at exec,
//!    after the landlock ruleset fd below has been used);
//! 2. resource limits (processes, memory, file size, no core dumps);
//! 3. when root: a private mount namespace that reveals an interpreter or staging dir lying
//!    under a closed directory ([`super::reveal`]), then groups cleared, gid, uid (all three
//!    ids, so nothing can switch back) — no capability survives; then the open-files limit
//!    (after the namespace step, which opens descriptors);
//! 4. (the reaper re-arms its parent-death signal, which a uid change clears);
//! 5. `no_new_privs` — no setuid/file-capability gain at exec, and the precondition of 6 and 7;
//! 6. landlock (filesystem, TCP, scopes);
//! 7. seccomp last, so the filter need not allow any of the calls above.

use seccompiler::BpfProgram;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// A resource limit to set in the child: (resource, soft = hard).
pub type Rlimit = (RlimitResource, u64);

/// The type `setrlimit` takes its resource as: glibc's own enum type, musl's `int`.
#[cfg(target_env = "gnu")]
pub type RlimitResource = libc::__rlimit_resource_t;
/// The type `setrlimit` takes its resource as: glibc's own enum type, musl's `int`.
#[cfg(not(target_env = "gnu"))]
pub type RlimitResource = libc::c_int;

/// Privileges to drop to when the supervisor is root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credentials {
    /// The script's uid (real, effective, saved and filesystem).
    pub uid: libc::uid_t,
    /// The script's gid.
    pub gid: libc::gid_t,
}

/// Everything the child needs, prepared in the parent before fork.
#[derive(Debug)]
pub struct ChildConfinement {
    /// The landlock ruleset, rules already added.
    pub ruleset: OwnedFd,
    /// Seccomp programs in installation order.
    pub filters: Vec<BpfProgram>,
    /// Whom to become; `None` when the supervisor is not root.
    pub credentials: Option<Credentials>,
    /// Limits to set.
    pub rlimits: Vec<Rlimit>,
    /// The script's end of the RPC socketpair; stays open across exec.
    pub rpc: OwnedFd,
    /// Closed directories to cover in a private mount namespace (root only).
    pub reveal: Option<super::reveal::Reveal>,
}

fn check(rc: libc::c_long) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl ChildConfinement {
    /// Steps 1–3: descriptors, limits, privileges.
    ///
    /// # Safety
    /// Only between fork and exec in the script process.
    pub unsafe fn drop_privileges(&self) -> io::Result<()> {
        let rpc = self.rpc.as_raw_fd();
        // SAFETY: raw system calls on integers and on stack/parent-prepared buffers.
        unsafe {
            mark_cloexec_from(3)?;
            check(libc::fcntl(rpc, libc::F_SETFD, 0) as libc::c_long)?;
            // RLIMIT_NOFILE waits until the mount namespace is made: its trees are new
            // descriptors, and the table inherited from a busy supervisor (marked
            // close-on-exec, still open) may already reach the script's limit.
            let nofile = libc::RLIMIT_NOFILE;
            for &(resource, value) in self.rlimits.iter().filter(|(r, _)| *r != nofile) {
                let lim = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                check(libc::setrlimit(resource, &lim) as libc::c_long)?;
            }
            if let Some(reveal) = &self.reveal {
                reveal.apply()?;
            }
            if let Some(c) = self.credentials {
                check(libc::syscall(
                    libc::SYS_setgroups,
                    0usize,
                    std::ptr::null::<libc::gid_t>(),
                ))?;
                check(libc::syscall(libc::SYS_setresgid, c.gid, c.gid, c.gid))?;
                check(libc::syscall(libc::SYS_setresuid, c.uid, c.uid, c.uid))?;
                if libc::getuid() != c.uid || libc::geteuid() != c.uid || libc::getegid() != c.gid {
                    return Err(io::Error::from_raw_os_error(libc::EPERM));
                }
            }
            for &(resource, value) in self.rlimits.iter().filter(|(r, _)| *r == nofile) {
                let lim = libc::rlimit {
                    rlim_cur: value,
                    rlim_max: value,
                };
                check(libc::setrlimit(resource, &lim) as libc::c_long)?;
            }
        }
        Ok(())
    }

    /// Steps 5–7: no_new_privs, landlock, seccomp. Nothing after this may need a syscall the
    /// filter refuses; exec and its error reporting are allowed.
    ///
    /// # Safety
    /// Only between fork and exec in the script process, after [`Self::drop_privileges`].
    pub unsafe fn seal(&self) -> io::Result<()> {
        // SAFETY: raw system calls; the BPF programs are owned by `self`, which outlives them.
        unsafe {
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as libc::c_long)?;
            check(libc::syscall(
                libc::SYS_landlock_restrict_self,
                self.ruleset.as_raw_fd(),
                0u32,
            ))?;
            for program in &self.filters {
                let prog = libc::sock_fprog {
                    len: program.len() as libc::c_ushort,
                    filter: program.as_ptr() as *mut libc::sock_filter,
                };
                check(libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0u32,
                    &prog as *const libc::sock_fprog,
                ))?;
            }
        }
        Ok(())
    }
}

/// Marks every descriptor from `first` up close-on-exec (the RPC fd is cleared again after).
unsafe fn mark_cloexec_from(first: RawFd) -> io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only changes descriptor flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    // Kernels before 5.11: one fcntl per possible descriptor.
    // SAFETY: fcntl on integers; EBADF for closed ones is ignored.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        let max = lim.rlim_cur.min(1 << 20) as RawFd;
        for fd in first..max {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
    Ok(())
}
