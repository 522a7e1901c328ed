//! What a tool handler knows about the call it is serving.

use crate::path_policy::PathPolicy;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Who made a tool call. Scripts get a stricter environment for anything they spawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOrigin {
    /// The agent called the tool directly.
    Agent,
    /// An execute_code script called the tool over its RPC channel.
    Script,
}

/// Per-call context handed to every handler.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The agent's task (session) id, when the caller has one.
    pub task_id: Option<String>,
    /// Directory relative paths are resolved against (the session working dir).
    pub cwd: PathBuf,
    /// Environment for processes the tool starts. For script calls this is the scrubbed
    /// execute_code environment, so `terminal("env")` cannot reveal what the script may not see.
    /// `None` means "the tool decides" (agent calls keep the seeds' looser policy).
    pub env: Option<Arc<Vec<(String, String)>>>,
    /// Who is calling.
    pub origin: CallOrigin,
    /// Strict mode: the roots the file tools may act beneath (see [`PathPolicy`]). `None`
    /// outside strict mode, where the tools act with the caller's own rights.
    pub paths: Option<Arc<PathPolicy>>,
}

impl ToolContext {
    /// A context for a direct agent call in `cwd`.
    pub fn agent(cwd: impl Into<PathBuf>) -> Self {
        ToolContext {
            task_id: None,
            cwd: cwd.into(),
            env: None,
            origin: CallOrigin::Agent,
            paths: None,
        }
    }

    /// Resolves a user-supplied path against the call's working directory.
    pub fn resolve(&self, path: &str) -> PathBuf {
        let p = Path::new(path);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.cwd.join(p)
        }
    }
}
