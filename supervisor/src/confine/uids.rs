//! One uid per live strict execution, never shared (SPEC §6).
//!
//! Executions that share a uid can renice, pin and signal each other's processes, exhaust each
//! other's `RLIMIT_NPROC` and chmod each other's staging dirs. A random pick from 65536 uids
//! makes a collision unlikely, not impossible, and two supervisor processes on one machine
//! (two CI jobs, `serve` next to `run`) know nothing of each other's picks. So a uid is
//! *leased*: an exclusive `flock` on `<uid>.lock` in a root-only directory, taken with
//! `LOCK_NB` (a busy uid is skipped, never waited for) and held until the execution's staging
//! dir is dropped — after its reaper has killed every process of it. flock locks belong to
//! the open file description, so they serve threads of one supervisor and separate
//! supervisors alike, and the kernel drops them when a supervisor dies, so a crash leaks no
//! lease. A uid that still has processes (left by a supervisor killed with SIGKILL before its
//! reaper could act) is skipped as well.
//!
//! A pinned uid (`code_execution.strict.uid`) is leased the same way: a second concurrent
//! execution is refused with an error saying so, and a warm pool, which keeps interpreters of
//! several executions alive at once, cannot be combined with it.

use super::ConfineError;
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Root-only directory of the lease files.
const LOCK_DIRS: [&str; 2] = ["/run/vibeos-exec/uids", "/var/lock/vibeos-exec-uids"];

/// An exclusive claim on a uid for one execution; released when dropped.
#[derive(Debug)]
pub struct UidLease {
    uid: u32,
    _lock: File,
}

impl UidLease {
    /// The leased uid.
    pub fn uid(&self) -> u32 {
        self.uid
    }
}

fn lock_dir() -> Result<PathBuf, ConfineError> {
    let mut problems = Vec::new();
    for dir in LOCK_DIRS {
        let dir = Path::new(dir);
        let made = std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir);
        if let Err(e) = made {
            problems.push(format!("{}: {e}", dir.display()));
            continue;
        }
        match std::fs::symlink_metadata(dir) {
            Ok(m) if m.is_dir() && m.uid() == 0 && m.mode() & 0o022 == 0 => {
                return Ok(dir.to_path_buf())
            }
            Ok(_) => problems.push(format!(
                "{} is not a root-owned directory closed to others",
                dir.display()
            )),
            Err(e) => problems.push(format!("{}: {e}", dir.display())),
        }
    }
    Err(ConfineError::Unsupported(format!(
        "no directory to lease strict-mode uids in ({}); create /run/vibeos-exec/uids as root, \
         mode 0700",
        problems.join("; ")
    )))
}

/// Tries to lease `uid`: `Ok(None)` when another live execution holds it.
fn try_lease(dir: &Path, uid: u32) -> Result<Option<UidLease>, ConfineError> {
    let path = dir.join(format!("{uid}.lock"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|source| ConfineError::Io {
            what: format!("opening the uid lease {}", path.display()),
            source,
        })?;
    match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => return Ok(Some(UidLease { uid, _lock: file })),
        Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
        Err(_) => {}
    }
    Err(ConfineError::Io {
        what: format!("locking the uid lease {}", path.display()),
        source: std::io::Error::last_os_error(),
    })
}

/// Leases a uid for one execution: `pinned` if set (refused while another execution holds
/// it), else a free one from `base..base+span`.
pub fn lease(pinned: Option<u32>, base: u32, span: u32) -> Result<UidLease, ConfineError> {
    let dir = lock_dir()?;
    if let Some(uid) = pinned {
        return try_lease(&dir, uid)?.ok_or_else(|| {
            ConfineError::Config(format!(
                "code_execution.strict.uid {uid} is in use by another live strict execution; a \
                 pinned uid allows one execution at a time (executions sharing a uid could slow \
                 and watch each other): remove code_execution.strict.uid to give every \
                 execution its own uid"
            ))
        });
    }
    for _ in 0..64 {
        let uid = base + rand::random::<u32>() % span;
        if let Some(lease) = try_lease(&dir, uid)? {
            if super::tasks_of_uid(uid) == 0 {
                return Ok(lease);
            }
        }
    }
    Err(ConfineError::Unsupported(format!(
        "no free strict-mode uid found in {base}..{} after 64 tries; too many executions are \
         running at once",
        base + span
    )))
}
