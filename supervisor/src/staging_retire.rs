//! Removing a finished execution's staging dir after its result is returned, in a long-lived
//! host.
//!
//! Removing a staging dir is a handful of unlinks, an rmdir and, in strict mode as root, an
//! unmount: about half a millisecond on ext4, more where the file system discards freed blocks
//! synchronously. For a warm execution that is a tenth of the call, spent after the script is
//! over and before its result goes back. A long-lived host (fork servers or the warm pool on)
//! hands the dir to one background thread instead; a one-shot `run` removes it inline, since
//! its process exits right after and a thread would be cut off halfway.
//!
//! Nothing of the execution can use the dir any more when it is retired: every process of it is
//! gone (the reaper reported) and the RPC channel is closed. At the host's normal exit, a hook
//! waits (bounded) until every retired dir is removed, so no run leaves anything in TMPDIR.

use crate::launch::Staging;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, Once};
use std::time::{Duration, Instant};

/// Retired dirs not yet removed.
static PENDING: AtomicUsize = AtomicUsize::new(0);
/// The remover thread's queue, started at the first background retirement.
static QUEUE: Mutex<Option<Sender<Staging>>> = Mutex::new(None);
static AT_EXIT: Once = Once::new();

/// How long the exit hook waits for the remover to empty its queue.
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// Removes `staging`: on the remover thread when `background` (a long-lived host), else here.
/// If the thread cannot be started, the dir is removed here.
pub(crate) fn retire(staging: Staging, background: bool) {
    if !background {
        drop(staging);
        return;
    }
    vibeos_tools::exit_hook::register(
        &AT_EXIT,
        wait_at_exit,
        "staging dirs retired just before exit may be left in TMPDIR",
    );
    let mut queue = QUEUE.lock().unwrap_or_else(|p| p.into_inner());
    if queue.is_none() {
        *queue = start_remover();
    }
    let Some(sender) = queue.as_ref() else {
        drop(queue);
        drop(staging);
        return;
    };
    PENDING.fetch_add(1, Ordering::SeqCst);
    if let Err(returned) = sender.send(staging) {
        // The thread is gone (it never panics on a drop, but be sure): remove it here.
        *queue = None;
        drop(queue);
        PENDING.fetch_sub(1, Ordering::SeqCst);
        drop(returned.0);
    }
}

/// Starts the remover; `None` if no thread can be started.
fn start_remover() -> Option<Sender<Staging>> {
    let (sender, receiver) = channel::<Staging>();
    std::thread::Builder::new()
        .name("vibeos-staging-remove".into())
        .spawn(move || {
            crate::background::lower_this_thread();
            for staging in receiver {
                drop(staging);
                PENDING.fetch_sub(1, Ordering::SeqCst);
            }
        })
        .map_err(|e| tracing::debug!("execute_code: no staging remover thread: {e}"))
        .ok()?;
    Some(sender)
}

/// At normal exit, waits until every retired dir has been removed or [`EXIT_WAIT`] has passed:
/// never on a lock, only on the counter the remover lowers. No logging here: the subscriber may
/// already be gone.
extern "C" fn wait_at_exit() {
    let deadline = Instant::now() + EXIT_WAIT;
    while PENDING.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(200));
    }
}
