//! How busy the fork servers are: forked executions in flight and when the last one was forked.
//!
//! Its own module, below both users, because the fork server ([`crate::zygote`]) counts its
//! executions here and the pool's refill thread ([`crate::pool`]) waits here for a lull, while
//! the fork server already depends on the pool (for which variables affect startup).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Forked executions not yet over.
static IN_FLIGHT: AtomicU64 = AtomicU64::new(0);
/// When the last execution was forked.
static LAST_FORK: Mutex<Option<Instant>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One forked execution in flight, for [`wait_until_idle`].
#[derive(Debug)]
pub(crate) struct InFlight;

impl InFlight {
    /// Counts one forked execution from now until the value is dropped.
    pub(crate) fn new() -> InFlight {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        *lock(&LAST_FORK) = Some(Instant::now());
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether no forked execution is in flight and none was forked within `quiet`.
pub(crate) fn idle_for(quiet: Duration) -> bool {
    IN_FLIGHT.load(Ordering::SeqCst) == 0 && lock(&LAST_FORK).is_none_or(|t| t.elapsed() >= quiet)
}

/// How long no fork may have been requested before the servers count as idle.
const QUIET: Duration = Duration::from_millis(50);

/// Blocks while the fork servers are serving (an execution forked within [`QUIET`], or one
/// still running), for at most `max`, or until `stop` says to give up.
///
/// The pool's refill thread calls this before it starts an interpreter: a whole interpreter
/// start takes a core from the forked scripts of a burst for tens of milliseconds (16 callers
/// got 181/s with refills running against 254/s without, docs/warm-pool.md), while the fork
/// server serves the burst without the pool; the refill is only needed for the next paced call.
pub(crate) fn wait_until_idle(max: Duration, stop: impl Fn() -> bool) {
    let deadline = Instant::now() + max;
    loop {
        let busy = !idle_for(QUIET);
        let since = lock(&LAST_FORK).map(|t| t.elapsed());
        let left = deadline.saturating_duration_since(Instant::now());
        if !busy || left.is_zero() || stop() {
            return;
        }
        let nap = since
            .map_or(QUIET, |d| QUIET.saturating_sub(d))
            .max(Duration::from_millis(5));
        std::thread::sleep(nap.min(left));
    }
}
