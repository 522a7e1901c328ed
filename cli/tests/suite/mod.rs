//! One module per area; see each module's docs.

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
mod config_validation;
mod core_run;
mod daytona_standin;
mod env_and_interpreter;
mod mcp_serve;
mod mcp_servers;
mod modal_conformance;
mod parity;
mod spec_audit;
mod strict_benign;
mod strict_escapes;
mod tools_cli;

/// The execution backend is process-wide (`environments::activate`), and this suite is one
/// process: the tests that switch it hold this lock, so they take turns.
pub(crate) fn backend_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that failed while holding it leaves nothing behind that the next one relies on.
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
