//! The host's side of a directory that a container also writes: the RPC dir bind-mounted into a
//! docker container or a singularity instance.
//!
//! The script runs as root in the container (or as the supervisor's own user under singularity)
//! and can remove, replace or link anything in that directory. What the host reads or makes
//! there must therefore be the thing the container could make, never a host path it points to:
//! a symlink at `agent.sock` must not make the supervisor connect to a host socket of the
//! script's choosing (and send it the agent's token), a FIFO in place of a leader record must
//! not block the supervisor's thread for ever, and a symlink put in place of a fresh
//! execution's socket dir must not make the supervisor bind its socket in a host directory.
//!
//! The rule each function follows: the last component is opened without following links
//! (`O_NOFOLLOW`), its type is checked on the open descriptor, and the kernel is given the
//! descriptor (`/proc/self/fd/N`) rather than the name again, so nothing can be swapped between
//! the check and the use. The directories above the last component are the host's own.

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};

/// Opens `path`'s last component without following a link: `O_PATH` when `flags` is empty.
fn open_no_follow(path: &Path, flags: OFlags) -> std::io::Result<OwnedFd> {
    let base = if flags.is_empty() {
        OFlags::PATH
    } else {
        flags
    };
    rustix::fs::open(
        path,
        base | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(std::io::Error::from)
}

/// What a descriptor of ours is called through procfs: the object itself, not a name that
/// could be replaced.
fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

fn file_type(fd: &OwnedFd) -> std::io::Result<FileType> {
    let st = rustix::fs::fstat(fd).map_err(std::io::Error::from)?;
    Ok(FileType::from_raw_mode(st.st_mode))
}

fn not_a(path: &Path, what: &str, found: FileType) -> std::io::Error {
    std::io::Error::other(format!(
        "{} is not a {what} but a {found:?}: something in the environment replaced it",
        path.display()
    ))
}

/// Connects to the UNIX socket at `path`, which must be a socket itself, not a link to one.
pub fn connect_socket(path: &Path) -> std::io::Result<UnixStream> {
    let fd = open_no_follow(path, OFlags::empty())?;
    match file_type(&fd)? {
        FileType::Socket => UnixStream::connect(fd_path(&fd)),
        other => Err(not_a(path, "socket", other)),
    }
}

/// Reads at most `limit` bytes of the regular file at `path`; `Ok(None)` when there is no such
/// file yet. A link, a FIFO or a device there is an error, and reading never waits.
pub fn read_small_file(path: &Path, limit: usize) -> std::io::Result<Option<Vec<u8>>> {
    // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
    let fd = match open_no_follow(path, OFlags::RDONLY | OFlags::NONBLOCK) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match file_type(&fd)? {
        FileType::RegularFile => {}
        other => return Err(not_a(path, "regular file", other)),
    }
    let mut data = Vec::new();
    std::fs::File::from(fd)
        .take(limit as u64)
        .read_to_end(&mut data)?;
    Ok(Some(data))
}

/// A directory the host made in a shared directory for one execution, held open: sockets bound
/// through [`ExecutionDir::socket_path`] land in it even if its name was replaced since.
/// Removed (by name, which never follows a link) when dropped.
pub struct ExecutionDir {
    path: PathBuf,
    fd: OwnedFd,
}

impl ExecutionDir {
    /// Makes `path` 0700 (never wider, whatever the umask) and opens it.
    pub fn create(path: PathBuf) -> std::io::Result<ExecutionDir> {
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        let fd = open_no_follow(&path, OFlags::PATH | OFlags::DIRECTORY)?;
        Ok(ExecutionDir { path, fd })
    }

    /// The path to bind `name` at, inside this very directory.
    pub fn socket_path(&self, name: &str) -> PathBuf {
        fd_path(&self.fd).join(name)
    }
}

impl Drop for ExecutionDir {
    fn drop(&mut self) {
        // std's remove_dir_all removes a link in the dir's place, not what it points to; the
        // dir itself, if it was moved aside, goes with the environment's RPC dir.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixListener;

    #[test]
    fn a_link_at_the_socket_is_not_followed() {
        let shared = tempfile::tempdir().unwrap();
        let host = tempfile::tempdir().unwrap();
        let target = host.path().join("host.sock");
        let _listener = UnixListener::bind(&target).unwrap();
        let planted = shared.path().join("agent.sock");
        std::os::unix::fs::symlink(&target, &planted).unwrap();
        let err = connect_socket(&planted).unwrap_err();
        assert!(err.to_string().contains("agent.sock"), "{err}");
        // The real thing still connects.
        let real = shared.path().join("real.sock");
        let _l2 = UnixListener::bind(&real).unwrap();
        connect_socket(&real).unwrap();
    }

    #[test]
    fn a_fifo_or_a_link_in_place_of_a_record_is_refused_at_once() {
        let shared = tempfile::tempdir().unwrap();
        let fifo = shared.path().join("pg-1");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert!(read_small_file(&fifo, 32).is_err());
        let link = shared.path().join("pg-2");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(read_small_file(&link, 32).is_err());
        let file = shared.path().join("pg-3");
        std::fs::write(&file, b"1234567890").unwrap();
        assert_eq!(read_small_file(&file, 4).unwrap().unwrap(), b"1234");
        assert!(read_small_file(&shared.path().join("none"), 4)
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_socket_is_bound_in_the_dir_made_even_after_its_name_is_replaced() {
        let shared = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let path = shared.path().join("exec");
        let dir = ExecutionDir::create(path.clone()).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o700
        );
        std::fs::rename(&path, shared.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), &path).unwrap();
        let _l = UnixListener::bind(dir.socket_path("rpc.sock")).unwrap();
        assert!(shared.path().join("moved/rpc.sock").exists());
        assert!(!elsewhere.path().join("rpc.sock").exists());
        drop(dir);
        // The link is gone; what it pointed to is untouched.
        assert!(std::fs::symlink_metadata(&path).is_err());
        assert!(elsewhere.path().exists());
    }
}
