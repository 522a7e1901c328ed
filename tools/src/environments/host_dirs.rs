//! The private socket dirs a backend keeps on this host while it runs — the relay's per
//! execution (`vibeos-relay-<backend>-*`, daytona and modal) and the Modal SDK sidecar's
//! (`vibeos-modal-*`) — made so that `vibeos-exec backends gc` can remove them after a host
//! was killed before it could (`kill -9`, the OOM killer).
//!
//! Why an owner file rather than a liveness probe of the socket: connecting to a live
//! execution's RPC socket would be a stranger's connection the server has to turn away, and a
//! dir is briefly socketless between its creation and the bind. The owner is the creating
//! process as `PID:START` ([`super::owner`]), written before anything else goes in, so a
//! reused pid is not mistaken for it.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::time::Duration;

/// The file naming the dir's owner.
const OWNER_FILE: &str = "owner";

/// How old a dir without an owner file (an older version's, or one whose owner file could not
/// be written) must be before gc takes it for abandoned.
const UNOWNED_GRACE: Duration = Duration::from_secs(600);

/// A new 0700 dir `<TMPDIR>/<prefix>XXXXXX` owned by this process, removed when dropped.
/// 0700 from its creation (tempfile's own default is 0777 less the umask): the socket inside
/// is reachable by this user only.
pub fn private_dir(prefix: &str) -> std::io::Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()?;
    std::fs::write(dir.path().join(OWNER_FILE), super::owner::owner_label())?;
    Ok(dir)
}

/// Removes this user's dirs named `<prefix>*` in TMPDIR and /tmp whose owner is gone and
/// returns their paths. A dir that is not this user's, or is a symlink, is not looked at; a
/// live owner's (this process's included) is left alone and not reported: it is in use, not
/// left over.
pub fn gc(prefix: &str) -> Vec<String> {
    let mut removed = Vec::new();
    for (dir, meta) in own_dirs(prefix) {
        let alive = match std::fs::read_to_string(dir.join(OWNER_FILE)) {
            Ok(owner) => super::owner::owner_alive(owner.trim()),
            Err(_) => meta
                .modified()
                .ok()
                .and_then(|m| m.elapsed().ok())
                .is_none_or(|age| age < UNOWNED_GRACE),
        };
        if !alive && std::fs::remove_dir_all(&dir).is_ok() {
            removed.push(dir.display().to_string());
        }
    }
    removed
}

/// This user's directories named `<prefix>*` in TMPDIR and /tmp (not symlinks), with their
/// metadata: where this process and an earlier one (another TMPDIR) may have made them.
pub(crate) fn own_dirs(prefix: &str) -> Vec<(PathBuf, std::fs::Metadata)> {
    let mut bases = vec![std::env::temp_dir(), PathBuf::from("/tmp")];
    bases.dedup();
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    bases
        .iter()
        .filter_map(|base| std::fs::read_dir(base).ok())
        .flat_map(|entries| entries.flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .filter_map(|e| {
            let dir = e.path();
            let meta = std::fs::symlink_metadata(&dir).ok()?;
            (meta.is_dir() && meta.uid() == uid).then_some((dir, meta))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn gc_removes_a_dead_owners_dir_and_keeps_a_live_ones() {
        let prefix = format!("vibeos-hostdirs-test-{}-", std::process::id());
        let live = private_dir(&prefix).unwrap();
        let dead = private_dir(&prefix).unwrap().keep();
        // A pid that runs, with a start time it never had: the owner is gone.
        std::fs::write(dead.join(OWNER_FILE), format!("{}:1", std::process::id())).unwrap();
        std::fs::write(dead.join("rpc.sock"), "").unwrap();
        assert_eq!(gc(&prefix), vec![dead.display().to_string()]);
        assert!(!dead.exists() && live.path().exists());
        let mode = std::fs::metadata(live.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }
}
