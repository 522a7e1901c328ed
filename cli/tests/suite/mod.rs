//! One module per area; see each module's docs.

mod approval_tty;
mod backend_background;
mod backend_contract;
mod backend_daytona;
mod backend_docker;
mod backend_modal;
mod backend_podman;
mod backend_singularity;
mod backend_ssh;
mod backends_cli;
mod builtin_tools;
mod common;
mod config_validation;
mod core_run;
mod daytona_standin;
mod env_and_interpreter;
mod mcp_serve;
mod mcp_servers;
mod modal_conformance;
mod parity;
mod prestart;
mod process_start;
mod redaction;
mod spec_audit;
mod strict_benign;
mod strict_escapes;
mod terminal_tty;
mod tools_cli;

/// Every sshd the suite starts points the home of the one test user ([`SSH_USER`]) at its own
/// dir: the tests that log in over ssh hold this lock, so they take turns. (The process-wide
/// backend choice no longer needs a lock: the tests that switch it run in processes of their
/// own, [`common::in_own_process`]; a test that does both takes this lock before it starts its
/// child, which then runs while the parent holds it.)
///
/// [`SSH_USER`]: vibeos_testkit::backends::SSH_USER
pub(crate) fn ssh_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that failed while holding it leaves nothing behind that the next one relies on.
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// How an ssh test starts: its turn with the test user ([`ssh_lock`]), then (in a process of its
/// own when `own_process`, see [`common::in_own_process`]) a fresh sshd. `None` when the test has
/// nothing left to do: this is the parent and the test ran in its child, or sshd cannot start
/// here (recorded as a skip, a failure with `CI=true`).
pub(crate) fn ssh_turn(
    own_process: bool,
) -> Option<(
    std::sync::MutexGuard<'static, ()>,
    vibeos_testkit::backends::Sshd,
)> {
    let turn = ssh_lock();
    if own_process && common::in_own_process() {
        return None;
    }
    match vibeos_testkit::backends::start_sshd() {
        Ok(sshd) => Some((turn, sshd)),
        Err(why) => {
            vibeos_testkit::backends::unavailable(&why);
            None
        }
    }
}
