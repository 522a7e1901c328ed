//! One module per area; see each module's docs.

mod approval_flow;
mod approval_modes;
mod approval_probe;
mod mcp_client;
mod planner;
mod provider_blocklist;
mod redaction;
mod registry;
mod structure;
mod terminal_agent;
mod terminal_tty;

/// Approval callbacks, session approvals, the config path and the environment are
/// process-wide, and this suite is one process: the tests that set them, and the terminal tests
/// whose commands they decide on, hold this lock so they take turns.
pub(crate) fn process_state_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that failed while holding it has already failed; the next one starts afresh.
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
