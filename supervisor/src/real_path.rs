//! A path with every symlink resolved, in three system calls.
//!
//! `std::fs::canonicalize` is libc's `realpath`, which calls `readlink` on every component of
//! the path and of each link's target: fifteen calls or so for a venv's `bin/python`. A warm
//! call resolved its interpreter twice (its version from the file name, and whether its fork
//! server's interpreter still resolves to the same file) and its session dir once, about
//! forty system calls before its script could start. The kernel has resolved the path once
//! the file is open: an `O_PATH` descriptor's `/proc/self/fd` link names the file it reached.

use std::io;
use std::path::{Path, PathBuf};

/// `path` with every symlink and `.`/`..` resolved, as `std::fs::canonicalize` gives it. Falls
/// back to that when `/proc` cannot say (not mounted, or the name it gives is not a plain
/// absolute path: a file deleted since it was opened).
pub(crate) fn canonical(path: &Path) -> io::Result<PathBuf> {
    use rustix::fs::{Mode, OFlags};
    use std::os::fd::AsRawFd;
    let fd = rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?;
    match std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())) {
        Ok(real)
            if real.is_absolute()
                && !real.as_os_str().as_encoded_bytes().ends_with(b" (deleted)") =>
        {
            Ok(real)
        }
        _ => std::fs::canonicalize(path),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn links_dots_and_relative_paths_resolve_as_canonicalize_resolves_them() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("real/bin")).unwrap();
        std::fs::write(root.join("real/bin/python3.11"), "").unwrap();
        std::os::unix::fs::symlink("python3.11", root.join("real/bin/python3")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("venv")).unwrap();
        std::os::unix::fs::symlink("../venv/bin/python3", root.join("real/python")).unwrap();
        for p in [
            root.join("venv/bin/python3"),
            root.join("real/python"),
            root.join("venv/bin/../bin/./python3"),
            root.join("venv"),
            root.join("real/bin/python3.11"),
        ] {
            assert_eq!(
                canonical(&p).unwrap(),
                std::fs::canonicalize(&p).unwrap(),
                "{p:?}"
            );
        }
        assert_eq!(
            canonical(&root.join("venv/bin/python3")).unwrap(),
            root.join("real/bin/python3.11")
        );
        // Missing files and dangling links are errors, as for canonicalize.
        std::os::unix::fs::symlink(root.join("nowhere"), root.join("dangling")).unwrap();
        assert!(canonical(&root.join("missing")).is_err());
        assert!(canonical(&root.join("dangling")).is_err());
    }
}
