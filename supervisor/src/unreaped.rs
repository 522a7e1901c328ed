//! Spawned reapers that reported their script's status and are about to exit: reaped here,
//! off the result's path.
//!
//! A cold execution's result comes from the reaper's status report ([`crate::forked::StatusReport`]),
//! written before the reaper exits; the kernel's teardown of the reaper (a copy of the
//! supervisor's address space) then happens while the supervisor finishes the execution. The
//! reaper is still our child and must be reaped: a long-lived host reaps it as soon as its pidfd
//! says it is gone, on the runtime's poller; a one-shot host (`vibeos-exec run`) waits for every
//! one before it exits ([`wait_for_reapers`]), so no zombie of ours is left for whoever adopts
//! our children (a container's pid 1 may never reap one).

use std::os::fd::OwnedFd;
use std::process::Child;
use std::sync::{Mutex, MutexGuard};

/// Reapers not yet reaped.
static UNREAPED: Mutex<Vec<Child>> = Mutex::new(Vec::new());

fn unreaped() -> MutexGuard<'static, Vec<Child>> {
    UNREAPED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reaps `child` once it has exited: at once if it is gone already, else when `pidfd` (the
/// child's) becomes readable, or by [`wait_for_reapers`]. Without a pidfd (kernels before 5.3)
/// a thread of the blocking pool waits. Must be called within a tokio runtime.
pub(crate) fn reap_when_gone(mut child: Child, pidfd: Option<OwnedFd>) {
    if !matches!(child.try_wait(), Ok(None)) {
        return;
    }
    let watched = pidfd.and_then(|fd| {
        // SAFETY: the AsyncFd owns the OwnedFd, which stays open and refers to the same pidfd
        // until the AsyncFd is dropped; nothing here reaches it through another path.
        unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
        }
        .ok()
    });
    let Some(watched) = watched else {
        drop(tokio::task::spawn_blocking(move || {
            let _ = child.wait();
        }));
        return;
    };
    unreaped().push(child);
    // Dropped unfinished if the runtime goes first; the child stays listed for
    // `wait_for_reapers` or the next pass.
    drop(tokio::spawn(async move {
        if watched.readable().await.is_ok() {
            reap_exited();
        }
    }));
}

/// Reaps every listed reaper that has exited, keeping the others.
fn reap_exited() {
    unreaped().retain_mut(|c| matches!(c.try_wait(), Ok(None)));
}

/// Waits until every reaper that reported its script's status has exited, and reaps it. A
/// one-shot host calls this before it exits; each such reaper has nothing left to do but exit,
/// so the wait is its teardown at most.
pub fn wait_for_reapers() {
    let children = std::mem::take(&mut *unreaped());
    for mut child in children {
        let _ = child.wait();
    }
}
