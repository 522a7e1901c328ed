//! The bridge that lets synchronous dispatch run asynchronous tool handlers.
//!
//! Dispatch is synchronous (scripts' calls arrive on blocking threads, the agent loop may have no
//! runtime at all), but MCP clients, HTTP tools and execute_code itself are async. Two cases:
//! - no tokio runtime on this thread: the future runs on one persistent, process-wide runtime, so
//!   async clients cached by tools (connection pools, MCP sessions) stay alive between calls;
//! - a runtime is running on this thread (a gateway, or a test inside `#[tokio::test]`): blocking
//!   on another runtime here would panic, so the future is driven by the same persistent runtime
//!   from a short-lived worker thread while this one waits.
//!
//! Parallel worker threads (see [`crate::ToolRegistry::handle_function_calls`]) have no runtime of
//! their own and take the first path concurrently; the persistent runtime is multi-threaded, so
//! their futures make progress side by side.

use crate::ToolError;
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;

/// A boxed, sendable future, as async handlers return.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

fn bridge_runtime() -> Result<&'static tokio::runtime::Runtime, ToolError> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("vibeos-tool-async")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| {
            ToolError::new(
                crate::ToolErrorKind::AsyncRuntimeUnavailable,
                format!("cannot start the runtime for async tools: {e}"),
            )
        })
}

/// Runs `fut` to completion from synchronous code, whatever runtime the calling thread is in.
/// A panic inside the future propagates to the caller (dispatch turns it into an error).
pub fn run_async<T: Send + 'static>(fut: BoxFuture<T>) -> Result<T, ToolError> {
    let runtime = bridge_runtime()?;
    if tokio::runtime::Handle::try_current().is_err() {
        return Ok(runtime.block_on(fut));
    }
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("vibeos-tool-bridge".into())
            .spawn_scoped(scope, move || runtime.block_on(fut))
            .map_err(|e| {
                ToolError::new(
                    crate::ToolErrorKind::AsyncRuntimeUnavailable,
                    format!("cannot start a worker thread for an async tool: {e}"),
                )
            })?;
        match worker.join() {
            Ok(v) => Ok(v),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}
