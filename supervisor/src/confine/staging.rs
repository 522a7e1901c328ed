//! Creating staging dirs so that nobody can get in between: no window in which another process
//! can watch, list or plant anything (SPEC §6).
//!
//! - Every staging dir lives under one parent per supervisor user, `<root>/vibeos-staging-<euid>`
//!   ([`staging_root`]: `$TMPDIR`, else `/dev/shm` for a root supervisor, else `/tmp`),
//!   owned by that user and mode 0711: others may pass through it to a dir whose name they
//!   know (a strict script's uid needs to reach its own), but not list it or create in it.
//!   The parent is checked on every use (a directory, not a symlink, ours) and its mode fixed.
//! - The staging dir itself is created 0700 by the `mkdir` that makes it (not 0755 and then
//!   chmod'ed: a watcher or a symlink planted in between would survive).
//! - Strict mode as root: a size-capped tmpfs is mounted on it before anything is written, so
//!   the script's files and its TMPDIR (the staging dir) have a disk budget
//!   (`code_execution.strict.disk_mb`); filling it is ENOSPC for that script alone.
//! - Every file the supervisor or the pool writes into it is created relative to a descriptor
//!   of the dir with `O_CREAT | O_EXCL | O_NOFOLLOW`: a name planted in advance makes the write
//!   fail instead of being followed.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

/// Prefix of the per-user parent dir under TMPDIR.
pub const PARENT_PREFIX: &str = vibeos_tools::path_policy::STAGING_PARENT_PREFIX;

/// The parent dir for staging dirs under `tmp`, created or checked.
pub fn parent_in(tmp: &Path) -> io::Result<PathBuf> {
    let euid = rustix::process::geteuid().as_raw();
    let parent = tmp.join(format!("{PARENT_PREFIX}{euid}"));
    match std::fs::DirBuilder::new().mode(0o711).create(&parent) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    // Check what is there now through a descriptor that did not follow a symlink, and fix the
    // mode through that same descriptor.
    let fd = nix::fcntl::open(
        &parent,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!(
                "{} is not a directory of ours ({e}); remove it or set TMPDIR elsewhere",
                parent.display()
            ),
        )
    })?;
    let file = std::fs::File::from(fd);
    let meta = file.metadata()?;
    if meta.uid() != euid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} belongs to uid {}, not to this supervisor (uid {euid}); someone may be \
                 trying to intercept staging dirs: remove it or set TMPDIR elsewhere",
                parent.display(),
                meta.uid()
            ),
        ));
    }
    if meta.mode() & 0o7777 != 0o711 {
        file.set_permissions(std::fs::Permissions::from_mode(0o711))?;
    }
    Ok(parent)
}

/// A fresh staging dir, mode 0700 from its creation, under [`parent_in`] of [`staging_root`].
/// A dir that cannot be made in the memory filesystem (full, or its parent taken by someone
/// else) is made in the system temp dir instead.
pub fn create_dir() -> io::Result<tempfile::TempDir> {
    create_dir_named("vibeos-exec-")
}

/// [`create_dir`] with a name of its own: a dir that lives in the staging area, out of the
/// tools' reach, but is no execution's (a fork server's).
pub fn create_dir_named(prefix: &str) -> io::Result<tempfile::TempDir> {
    let root = staging_root();
    let system = std::env::temp_dir();
    match create_dir_in(&root, prefix) {
        Err(e) if root != system => {
            tracing::debug!(
                "execute_code: no staging dir in {} ({e}); using {}",
                root.display(),
                system.display()
            );
            create_dir_in(&system, prefix)
        }
        made => made,
    }
}

fn create_dir_in(tmp: &Path, prefix: &str) -> io::Result<tempfile::TempDir> {
    let mut last = None;
    // A concurrent cleanup may remove an empty parent between our check and our mkdir.
    for _ in 0..5 {
        let parent = parent_in(tmp)?;
        match tempfile::Builder::new()
            .prefix(prefix)
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(&parent)
        {
            Ok(dir) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::NotFound => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("the staging parent kept disappearing")))
}

/// Where staging dirs are made: `$TMPDIR` when it is set; otherwise, for a root supervisor,
/// the machine's shared memory filesystem when it is the usual one (`/dev/shm`: a root-owned,
/// sticky, world-writable tmpfs); otherwise the system temp dir.
///
/// A staging dir lives for one execution and holds a few small files. On the ext4 `/tmp` of
/// these machines, making one and removing it cost 0.4–0.5 ms of the cold run's 6 (against
/// 0.1 ms on tmpfs). Only a root supervisor uses the memory filesystem: there every strict
/// execution's staging dir gets a budgeted tmpfs of its own, so no script can fill the shared
/// one; a non-root supervisor's strict scripts write their TMPDIR (the staging dir) with no
/// budget but `RLIMIT_FSIZE`, and filling `/dev/shm` would take memory from everyone.
pub fn staging_root() -> PathBuf {
    if std::env::var_os("TMPDIR").is_some_and(|v| !v.is_empty()) {
        return std::env::temp_dir();
    }
    memory_root().cloned().unwrap_or_else(std::env::temp_dir)
}

/// `/dev/shm` if this process is root and it is the usual tmpfs; checked once per process.
fn memory_root() -> Option<&'static PathBuf> {
    static ROOT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        if !rustix::process::geteuid().is_root() {
            return None;
        }
        let path = Path::new("/dev/shm");
        let meta = std::fs::symlink_metadata(path).ok()?;
        if !meta.is_dir() || meta.uid() != 0 || meta.mode() & 0o7777 != 0o1777 {
            return None;
        }
        const TMPFS_MAGIC: i64 = 0x0102_1994;
        let fs = rustix::fs::statfs(path).ok()?;
        (fs.f_type as i64 == TMPFS_MAGIC).then(|| path.to_path_buf())
    })
    .as_ref()
}

/// Removes the staging dirs' parent, when empty, once the staging dir it was made for is gone
/// (declared after the `TempDir` it guards, so it drops after it), so no run leaves anything
/// in TMPDIR.
#[derive(Debug)]
pub struct ParentCleanup(pub PathBuf);

impl Drop for ParentCleanup {
    fn drop(&mut self) {
        let named = self
            .0
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(PARENT_PREFIX));
        if named {
            // Fails (ENOTEMPTY) while another execution still has its dir there.
            let _ = std::fs::remove_dir(&self.0);
        }
    }
}

/// Removes a staging dir whose owner cannot run its destructor (the process is exiting while
/// the dir is being set up): its tmpfs (if any) detached, the dir, then the parent if empty.
pub fn remove_at_exit(dir: &Path) {
    // EINVAL when it is not a mount point is fine.
    let _ = rustix::mount::unmount(dir, rustix::mount::UnmountFlags::DETACH);
    let _ = std::fs::remove_dir_all(dir);
    if let Some(parent) = dir.parent() {
        drop(ParentCleanup(parent.to_path_buf()));
    }
}

/// The script's file in a staging dir: what the interpreter is started on.
pub const SCRIPT_FILE: &str = "script.py";

/// The generated stub's file in a staging dir.
pub const STUB_FILE: &str = "vibeos_tools.py";

/// Creates `name` in `dir` with `text`: relative to a descriptor of `dir`, never following a
/// symlink, never reusing an existing name. `owner` receives the file (strict mode as root).
pub fn write_new(dir: &Path, name: &str, text: &str, owner: Option<(u32, u32)>) -> io::Result<()> {
    let mut file = create_new(dir, name, owner)?;
    io::Write::write_all(&mut file, text.as_bytes())
}

/// Creates `name` in `dir`, empty and open for writing, as [`write_new`] does.
pub fn create_new(dir: &Path, name: &str, owner: Option<(u32, u32)>) -> io::Result<std::fs::File> {
    let dirfd = nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let fd: OwnedFd = nix::fcntl::openat(
        dirfd.as_fd(),
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o644),
    )?;
    // The mode is this one whatever the host's umask: under 077 the files were 0600 and, in
    // strict mode, the supervisor's own (the prestarted script) unreadable to the script's uid.
    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(0o644))?;
    let file = std::fs::File::from(fd);
    if let Some((uid, gid)) = owner {
        nix::unistd::fchown(
            &file,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )?;
    }
    Ok(file)
}

/// A size-capped tmpfs mounted on a staging dir (strict mode, root only); unmounted on drop,
/// before the dir itself is removed.
#[derive(Debug)]
pub struct DiskBudget {
    target: PathBuf,
}

impl DiskBudget {
    /// Mounts a tmpfs of `bytes` on `dir`, mode 0700. `Ok(None)` when the supervisor is not
    /// root (it cannot mount; the budget is then only the per-file `RLIMIT_FSIZE`).
    pub fn mount(dir: &Path, bytes: u64) -> io::Result<Option<DiskBudget>> {
        if !rustix::process::geteuid().is_root() {
            return Ok(None);
        }
        // A quarter of the budget in inodes (at least 1024): file-count floods end there too.
        let inodes = (bytes / 4096).max(1024);
        let options = CString::new(format!("size={bytes},nr_inodes={inodes},mode=0700"))
            .map_err(|_| io::Error::other("bad tmpfs options"))?;
        let mounted = rustix::mount::mount(
            "vibeos-exec",
            dir,
            "tmpfs",
            rustix::mount::MountFlags::NOSUID | rustix::mount::MountFlags::NODEV,
            options.as_c_str(),
        );
        if let Err(errno) = mounted {
            let e = io::Error::from(errno);
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "cannot mount the {} MiB disk-budget tmpfs (code_execution.strict.disk_mb) on \
                     {}: {e}; a root supervisor needs CAP_SYS_ADMIN for it (in a container, \
                     run it with that capability)",
                    bytes >> 20,
                    dir.display()
                ),
            ));
        }
        Ok(Some(DiskBudget {
            target: dir.to_path_buf(),
        }))
    }
}

impl Drop for DiskBudget {
    fn drop(&mut self) {
        // DETACH: a process that still holds a file open there (it is being killed) does not
        // keep the dir from going.
        if let Err(e) = rustix::mount::unmount(&self.target, rustix::mount::UnmountFlags::DETACH) {
            tracing::warn!(
                "execute_code: cannot unmount the staging tmpfs {}: {}",
                self.target.display(),
                io::Error::from(e)
            );
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn staging_is_private_from_its_first_moment_and_writes_never_follow_links() {
        let tmp = tempfile::tempdir().unwrap();
        let parent = parent_in(tmp.path()).unwrap();
        assert_eq!(std::fs::metadata(&parent).unwrap().mode() & 0o7777, 0o711);
        std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(parent_in(tmp.path()).unwrap(), parent);
        assert_eq!(
            std::fs::metadata(&parent).unwrap().mode() & 0o7777,
            0o711,
            "a loosened parent is closed again"
        );
        let dir = tempfile::Builder::new()
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(&parent)
            .unwrap();
        write_new(dir.path(), "a.py", "x", None).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a.py")).unwrap(),
            "x"
        );
        assert!(
            write_new(dir.path(), "a.py", "y", None).is_err(),
            "reused a name"
        );
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("b.py")).unwrap();
        assert!(write_new(dir.path(), "b.py", "PWNED", None).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    }

    #[test]
    fn a_symlinked_or_foreign_parent_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let euid = rustix::process::geteuid().as_raw();
        std::os::unix::fs::symlink(
            elsewhere.path(),
            tmp.path().join(format!("{PARENT_PREFIX}{euid}")),
        )
        .unwrap();
        let e = parent_in(tmp.path()).unwrap_err().to_string();
        assert!(e.contains("TMPDIR"), "{e}");
    }
}
