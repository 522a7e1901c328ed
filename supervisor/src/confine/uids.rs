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
//! reaper could act) is skipped as well. That check reads all of `/proc`, so a few uids are
//! leased first and checked in one pass; those not used at once stay leased (and so empty)
//! until later executions of the same process take them, one uid per execution as before.
//!
//! A pinned uid (`code_execution.strict.uid`) is leased the same way: a second concurrent
//! execution is refused with an error saying so, and a warm pool, which keeps interpreters of
//! several executions alive at once, cannot be combined with it.

use super::ConfineError;
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Random uids tried per lease before giving up.
const MAX_TRIES: usize = 64;

/// Uids leased together and checked with one pass over `/proc`. That pass cost about 0.3 ms of
/// CPU per strict execution (a directory read and a stat per process), the largest part of
/// preparing one; the leases it checks beyond the first are held until later executions of
/// this process take them, so they are never used by anyone else in between.
const LEASED_PER_SCAN: usize = 4;

/// Leases found free by an earlier check, with the process that checked them: a child forked
/// from a host (`multiprocessing`) inherits this memory and the lock descriptors, and must not
/// hand the same uids out again.
static CHECKED: std::sync::Mutex<(u32, Vec<UidLease>)> = std::sync::Mutex::new((0, Vec::new()));

fn checked() -> std::sync::MutexGuard<'static, (u32, Vec<UidLease>)> {
    CHECKED.lock().unwrap_or_else(|p| p.into_inner())
}

/// A lease checked earlier by this process, if one in `base..base+span` is left.
fn take_checked(base: u32, span: u32) -> Option<UidLease> {
    take_checked_as(std::process::id(), base, span)
}

/// [`take_checked`] for the process `me`.
fn take_checked_as(me: u32, base: u32, span: u32) -> Option<UidLease> {
    let mut checked = checked();
    if checked.0 != me {
        // Inherited through a fork: the parent still holds these uids. Dropping the copies
        // closes this process's descriptors only; the parent's locks stay.
        checked.1.clear();
        return None;
    }
    let at = checked
        .1
        .iter()
        .rposition(|l| (base..base.saturating_add(span)).contains(&l.uid))?;
    Some(checked.1.swap_remove(at))
}

fn keep_checked(leases: Vec<UidLease>) {
    if leases.is_empty() {
        return;
    }
    let mut checked = checked();
    let me = std::process::id();
    if checked.0 != me {
        checked.1.clear();
        checked.0 = me;
    }
    checked.1.extend(leases);
}

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
    // A pinned uid this process holds from an earlier check is its own to use, not "in use".
    let (base, span) = match pinned {
        Some(uid) => (uid, 1),
        None => (base, span),
    };
    if let Some(lease) = take_checked(base, span) {
        return Ok(lease);
    }
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
    let mut tries = 0;
    while tries < MAX_TRIES {
        let mut held = Vec::with_capacity(LEASED_PER_SCAN);
        while held.len() < LEASED_PER_SCAN && tries < MAX_TRIES {
            tries += 1;
            let uid = base + rand::random::<u32>() % span;
            if held.iter().any(|l: &UidLease| l.uid == uid) {
                continue;
            }
            if let Some(lease) = try_lease(&dir, uid)? {
                held.push(lease);
            }
        }
        if held.is_empty() {
            continue;
        }
        // Checked after the leases are taken: from then on no other execution can start a
        // process under these uids, so a uid found empty stays empty while it is held.
        let uids: Vec<u32> = held.iter().map(UidLease::uid).collect();
        let in_use = super::uids_in_use(&uids);
        held.retain(|l| !in_use.contains(&l.uid));
        if let Some(lease) = held.pop() {
            keep_checked(held);
            return Ok(lease);
        }
    }
    Err(ConfineError::Unsupported(format!(
        "no free strict-mode uid found in {base}..{} after {MAX_TRIES} tries; too many \
         executions are running at once",
        base + span
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    /// The tests below share [`CHECKED`]; one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A second holder of `uid` is refused while `lease` holds it.
    fn held(uid: u32) -> bool {
        let dir = lock_dir().expect("the lease dir");
        try_lease(&dir, uid)
            .expect("the lease file opens")
            .is_none()
    }

    /// Leases checked in one pass are each handed out once, and stay held until then.
    #[test]
    fn leases_checked_together_are_held_until_used_and_used_once() {
        if !is_root() {
            vibeos_testkit::skip!("needs root for the lease directory under /run");
        }
        let _serial = serial();
        let (base, span) = (3_100_000, 1_000);
        let leases: Vec<UidLease> = (0..2 * LEASED_PER_SCAN)
            .map(|_| lease(None, base, span).expect("a uid is free"))
            .collect();
        let mut uids: Vec<u32> = leases.iter().map(UidLease::uid).collect();
        assert!(
            uids.iter().all(|u| (base..base + span).contains(u)),
            "{uids:?}"
        );
        uids.sort_unstable();
        uids.dedup();
        assert_eq!(uids.len(), leases.len(), "a uid was handed out twice");
        for uid in &uids {
            assert!(held(*uid), "uid {uid} is not held while leased");
        }
        // Those checked beyond the ones used are held too, so nobody else can take them.
        let spare: Vec<u32> = checked().1.iter().map(UidLease::uid).collect();
        for uid in &spare {
            assert!(!uids.contains(uid), "uid {uid} is both used and kept");
            assert!(held(*uid), "kept uid {uid} is not held");
        }
        drop(leases);
        for uid in &uids {
            assert!(
                !held(*uid),
                "uid {uid} stays held after its lease is dropped"
            );
        }
    }

    /// A process forked from a host inherits the checked leases in memory; it must not hand out
    /// uids its parent still holds and will hand out itself.
    #[test]
    fn a_forked_process_does_not_reuse_its_parents_checked_uids() {
        if !is_root() {
            vibeos_testkit::skip!("needs root for the lease directory under /run");
        }
        let _serial = serial();
        let (base, span) = (3_200_000, 1_000);
        let first = lease(None, base, span).expect("a uid is free");
        assert!(
            !checked().1.is_empty(),
            "one pass over /proc checked more than one uid"
        );
        let other_process = std::process::id() + 1;
        assert!(take_checked_as(other_process, base, span).is_none());
        assert!(checked().1.is_empty(), "the inherited leases were kept");
        drop(first);
    }

    /// A pinned uid that this process holds from an earlier check is handed out, not refused
    /// as held by another execution.
    #[test]
    fn a_pinned_uid_kept_from_a_check_is_used_not_refused() {
        if !is_root() {
            vibeos_testkit::skip!("needs root for the lease directory under /run");
        }
        let _serial = serial();
        let (base, span) = (3_300_000, 1_000);
        let first = lease(None, base, span).expect("a uid is free");
        let kept = checked()
            .1
            .iter()
            .map(UidLease::uid)
            .find(|u| (base..base + span).contains(u))
            .expect("the pass kept other uids");
        let pinned = lease(Some(kept), base, span).expect("the kept uid is ours to use");
        assert_eq!(pinned.uid(), kept);
        // And while that execution holds it, a second one is refused.
        assert!(lease(Some(kept), base, span).is_err());
        drop((first, pinned));
    }

    /// The check finds the uid that runs a process and not the one that does not.
    #[test]
    fn the_check_finds_only_the_uids_that_run_something() {
        if !is_root() {
            vibeos_testkit::skip!("needs root to start a process as another uid");
        }
        let (busy, free) = (54_323, 54_324);
        assert!(super::super::uids_in_use(&[busy, free]).is_empty());
        let mut child =
            std::os::unix::process::CommandExt::uid(&mut std::process::Command::new("sleep"), busy)
                .arg("30")
                .spawn()
                .expect("sleep starts");
        let mut seen = Vec::new();
        for _ in 0..200 {
            seen = super::super::uids_in_use(&[free, busy]);
            if !seen.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(seen, vec![busy]);
    }
}
