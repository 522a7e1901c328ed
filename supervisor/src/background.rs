//! Threads that work for a call yet to come (preparing the next spare, removing a finished
//! call's staging dir) run below the threads that serve the call under way.
//!
//! On two cores, such a thread woken at normal priority took the CPU from the thread about to
//! return the call that woke it (docs/warm-pool.md, "Background work off the call's path").
//! The fork server does the same for itself and its spares (zygote_boot.py `_background`).

/// The nice value background threads run at, at least.
const BACKGROUND_NICE: i32 = 10;

/// Lowers the calling thread: `SCHED_BATCH`, whose wake-ups never preempt a running thread,
/// and nice [`BACKGROUND_NICE`], so that under load it takes a smaller share. Only ever
/// lowers: a thread of a host started under another policy (`chrt`) or at a higher nice
/// value keeps them. Neither change needs privilege, and both apply to this thread only; a
/// refusal leaves it as it was, since only timing depends on it.
pub(crate) fn lower_this_thread() {
    // SAFETY: sched_getscheduler and sched_setscheduler with pid 0 act on the calling thread
    // only; `param` is a valid sched_param (SCHED_BATCH takes priority 0) that outlives the call.
    unsafe {
        if libc::sched_getscheduler(0) == libc::SCHED_OTHER {
            // All zero: the priority SCHED_BATCH takes, and musl's other fields.
            let param: libc::sched_param = std::mem::zeroed();
            libc::sched_setscheduler(0, libc::SCHED_BATCH, &param);
        }
    }
    let Some(nice) = own_nice() else {
        return;
    };
    if nice < BACKGROUND_NICE {
        // SAFETY: setpriority on this thread's own id; only its nice value changes.
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, own_tid(), BACKGROUND_NICE);
        }
    }
}

/// The calling thread's id, as setpriority and getpriority take it.
fn own_tid() -> libc::id_t {
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    tid as libc::id_t
}

/// The calling thread's nice value; `None` if it cannot be read.
fn own_nice() -> Option<i32> {
    // getpriority may return -1 as a value, so errno tells a failure apart.
    // SAFETY: __errno_location returns this thread's errno; clearing it has no other effect.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: getpriority on this thread's own id only reads its nice value.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, own_tid()) };
    // SAFETY: as above, reading this thread's errno.
    let failed = nice == -1 && unsafe { *libc::__errno_location() } != 0;
    (!failed).then_some(nice)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy_and_nice() -> (i32, i32) {
        // SAFETY: pid 0 is the calling thread; the call only reads its policy.
        let policy = unsafe { libc::sched_getscheduler(0) };
        let nice = own_nice().expect("own nice value");
        (policy, nice)
    }

    #[test]
    fn a_background_thread_is_batch_at_nice_ten_and_the_others_are_untouched() {
        let before = policy_and_nice();
        let lowered = std::thread::spawn(|| {
            lower_this_thread();
            policy_and_nice()
        })
        .join()
        .expect("thread");
        assert_eq!(
            before.0,
            libc::SCHED_OTHER,
            "the test runs at the default policy"
        );
        assert_eq!(lowered, (libc::SCHED_BATCH, BACKGROUND_NICE.max(before.1)));
        assert_eq!(policy_and_nice(), before, "only the calling thread changed");
    }

    #[test]
    fn a_thread_already_lower_is_never_raised() {
        let kept = std::thread::spawn(|| {
            // SAFETY: setpriority on this thread's own id; only its nice value changes.
            let set = unsafe { libc::setpriority(libc::PRIO_PROCESS, own_tid(), 15) };
            assert_eq!(set, 0, "raising this thread's nice value");
            lower_this_thread();
            policy_and_nice()
        })
        .join()
        .expect("thread");
        assert_eq!(kept, (libc::SCHED_BATCH, 15));
    }
}
