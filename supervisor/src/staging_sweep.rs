//! Removing an execution's staging dir from its reaper when the supervisor died without doing
//! it (SIGKILL, the OOM killer). The reaper outlives the supervisor by design: it notices the
//! lifeline's EOF, stops the process tree, and then — only if its parent is gone, so that it
//! never races a live supervisor's own cleanup — unmounts the strict-mode tmpfs (if any) and
//! deletes the dir, and the per-user staging parent when that is left empty.
//!
//! This runs in the reaper, a forked child of a multi-threaded process: raw system calls on
//! stack buffers only, no allocation. The walk never follows a symlink (`O_NOFOLLOW`,
//! `unlinkat`), so a script cannot point it elsewhere; it gives up below [`MAX_DEPTH`] levels
//! (what is left there stays, as it would with no sweep at all).

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Longest staging path the reaper can hold (staging paths are short: the RPC socket inside
/// one must fit a Unix socket address).
const MAX_PATH: usize = 256;
/// Deepest directory level the sweep descends to.
const MAX_DEPTH: u32 = 32;

/// A staging dir's absolute path, NUL-terminated in a fixed buffer so the reaper can use it
/// after `fork` without allocating.
#[derive(Clone, Copy)]
pub struct StagingPath {
    buf: [u8; MAX_PATH],
    /// Length without the NUL; 0 means "nothing to sweep".
    len: usize,
}

impl std::fmt::Debug for StagingPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("StagingPath")
            .field(&String::from_utf8_lossy(&self.buf[..self.len]))
            .finish()
    }
}

impl StagingPath {
    /// No dir to sweep.
    pub fn none() -> Self {
        StagingPath {
            buf: [0; MAX_PATH],
            len: 0,
        }
    }

    /// The dir at `path`; [`StagingPath::none`] when it cannot be held (relative, too long,
    /// or containing a NUL byte).
    pub fn new(path: &Path) -> Self {
        let bytes = path.as_os_str().as_bytes();
        if !path.is_absolute() || bytes.len() >= MAX_PATH || bytes.contains(&0) {
            return StagingPath::none();
        }
        let mut p = StagingPath::none();
        p.buf[..bytes.len()].copy_from_slice(bytes);
        p.len = bytes.len();
        p
    }

    /// Unmounts and deletes the dir, then removes its parent if empty. Errors are ignored:
    /// there is nobody left to report them to, and what cannot be removed simply stays.
    ///
    /// # Safety
    /// Async-signal-safe; meant for the reaper after `fork`. Must not run while a supervisor
    /// may still be cleaning the same dir.
    pub unsafe fn sweep(&self) {
        if self.len == 0 {
            return;
        }
        let path: *const libc::c_char = self.buf.as_ptr().cast();
        // SAFETY: `path` points at a NUL-terminated buffer that lives as long as `self`; the
        // calls below only read it. The parent is derived in a stack copy.
        unsafe {
            // Strict mode's tmpfs, mounted by the supervisor in this mount namespace. EINVAL
            // (not a mount point) is the common case and harmless.
            libc::umount2(path, libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW);
            let fd = libc::open(
                path,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            );
            if fd >= 0 {
                empty_dir(fd, 0);
                libc::close(fd);
            }
            libc::rmdir(path);
            let mut parent = self.buf;
            if let Some(slash) = parent[..self.len].iter().rposition(|&b| b == b'/') {
                if slash > 0 {
                    parent[slash] = 0;
                    libc::rmdir(parent.as_ptr().cast());
                }
            }
        }
    }
}

/// Deletes everything inside the open directory `dir` (not `dir` itself).
///
/// # Safety
/// `dir` must be an open directory descriptor. Async-signal-safe.
unsafe fn empty_dir(dir: libc::c_int, depth: u32) {
    if depth >= MAX_DEPTH {
        return;
    }
    let mut buf = [0u8; 2048];
    loop {
        // SAFETY: getdents64 fills at most `buf.len()` bytes of `buf`.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir,
                buf.as_mut_ptr(),
                buf.len() as libc::c_uint,
            )
        };
        if n <= 0 {
            return;
        }
        let n = n as usize;
        let mut off = 0;
        // linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8, d_name (NUL-ended).
        while off + 19 < n {
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen == 0 || off + reclen > n {
                return;
            }
            let kind = buf[off + 18];
            let name = &buf[off + 19..off + reclen];
            let name_len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
            let is_dot = matches!(&name[..name_len], b"." | b"..");
            if !is_dot && name_len < name.len() {
                // SAFETY: `name` is NUL-terminated within `buf`.
                unsafe { remove_entry(dir, name.as_ptr().cast(), kind, depth) };
            }
            off += reclen;
        }
    }
}

/// Removes one entry of `dir`: a file or link directly, a directory after emptying it.
///
/// # Safety
/// `dir` must be an open directory descriptor and `name` a NUL-terminated name in it.
unsafe fn remove_entry(dir: libc::c_int, name: *const libc::c_char, kind: u8, depth: u32) {
    // SAFETY: plain system calls on a descriptor and a NUL-terminated name; none follows a
    // symlink (unlinkat never does, openat has O_NOFOLLOW).
    unsafe {
        if kind != libc::DT_DIR && libc::unlinkat(dir, name, 0) == 0 {
            return;
        }
        let sub = libc::openat(
            dir,
            name,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        );
        if sub >= 0 {
            empty_dir(sub, depth + 1);
            libc::close(sub);
        }
        libc::unlinkat(dir, name, libc::AT_REMOVEDIR);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_removes_the_tree_but_follows_no_link() {
        let root = tempfile::tempdir().unwrap();
        let parent = root.path().join("vibeos-staging-test");
        let staging = parent.join("vibeos-exec-x");
        std::fs::create_dir_all(staging.join("rpc/deep/er")).unwrap();
        std::fs::write(staging.join("script.py"), "x").unwrap();
        std::fs::write(staging.join("rpc/deep/er/f"), "x").unwrap();
        // A link out of the dir: the sweep removes the link, never what it points at.
        let outside = root.path().join("precious");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "keep").unwrap();
        std::os::unix::fs::symlink(&outside, staging.join("link")).unwrap();
        // SAFETY: nothing else cleans these paths.
        unsafe { StagingPath::new(&staging).sweep() };
        assert!(!staging.exists());
        assert!(!parent.exists(), "an empty parent goes too");
        assert_eq!(
            std::fs::read_to_string(outside.join("keep")).unwrap(),
            "keep"
        );
    }

    #[test]
    fn paths_it_cannot_hold_are_left_alone() {
        assert_eq!(StagingPath::new(Path::new("relative")).len, 0);
        let long = format!("/{}", "a".repeat(MAX_PATH));
        assert_eq!(StagingPath::new(Path::new(&long)).len, 0);
        // SAFETY: sweeping nothing touches nothing.
        unsafe { StagingPath::none().sweep() };
    }
}
