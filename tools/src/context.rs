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
    /// The toolsets the agent's session selected, for an `execute_code` call: its script gets
    /// only the script tools this selection keeps, the ones the execute_code definition the
    /// model read names. `None`: every available script tool.
    pub toolsets: Option<Arc<ToolsetSelection>>,
}

/// A session's toolsets, as `get_tool_definitions` takes them: `enabled` alone, every toolset
/// minus `disabled`, or (no `enabled` list, `disabled` empty) every toolset.
///
/// `enabled: Some(vec![])` selects no toolset at all (fail closed): an empty list a host passes
/// means "none of them", not "no selection" (the Python package's `enabled_toolsets=[]` selected
/// every tool before stop 55). The flags of the CLI, where an absent flag is an empty list, go
/// through [`ToolsetSelection::from_lists`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolsetSelection {
    /// Only these toolsets (composites and legacy names resolved); `None`: every toolset.
    pub enabled: Option<Vec<String>>,
    /// Every toolset but these.
    pub disabled: Vec<String>,
}

impl ToolsetSelection {
    /// The selection of two list flags, where an empty `enabled` means the flag was not given
    /// (every toolset).
    pub fn from_lists(enabled: &[String], disabled: &[String]) -> Self {
        ToolsetSelection {
            enabled: (!enabled.is_empty()).then(|| enabled.to_vec()),
            disabled: disabled.to_vec(),
        }
    }

    /// Whether it selects every toolset (nothing to narrow): no `enabled` list and no disabled
    /// toolset. A list holding an empty name is not "everything": the registry refuses it; an
    /// empty `enabled` list selects nothing.
    pub fn is_everything(&self) -> bool {
        self.enabled.is_none() && self.disabled.is_empty()
    }
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
            toolsets: None,
        }
    }

    /// Resolves a user-supplied path against the call's working directory. A leading `~` (or
    /// `~/`) is the caller's home, as `os.path.expanduser` in the script would read it: the
    /// script's `HOME` for script calls (its staging dir in strict mode), else this process's.
    /// Taken literally, `write_file("~/notes.txt")` made a directory named `~` in the cwd.
    pub fn resolve(&self, path: &str) -> PathBuf {
        if path == "~" || path.starts_with("~/") {
            if let Some(home) = self.home() {
                let rest = path.trim_start_matches('~').trim_start_matches('/');
                return if rest.is_empty() {
                    home
                } else {
                    home.join(rest)
                };
            }
        }
        let p = Path::new(path);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.cwd.join(p)
        }
    }

    /// The caller's home: `HOME` of the call's environment, else of this process; `None` when
    /// unset or relative.
    fn home(&self) -> Option<PathBuf> {
        let home = match &self.env {
            Some(env) => env.iter().find(|(k, _)| k == "HOME").map(|(_, v)| v.into()),
            None => std::env::var_os("HOME").map(PathBuf::from),
        }?;
        home.is_absolute().then_some(home)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leading_tilde_is_the_callers_home() {
        let mut ctx = ToolContext::agent("/work");
        ctx.env = Some(Arc::new(vec![("HOME".into(), "/home/script".into())]));
        assert_eq!(
            ctx.resolve("~/notes.txt"),
            Path::new("/home/script/notes.txt")
        );
        assert_eq!(ctx.resolve("~"), Path::new("/home/script"));
        assert_eq!(ctx.resolve("~user/x"), Path::new("/work/~user/x"));
        assert_eq!(ctx.resolve("a/~/b"), Path::new("/work/a/~/b"));
        assert_eq!(ctx.resolve("/abs"), Path::new("/abs"));
        ctx.env = Some(Arc::new(vec![("HOME".into(), "relative".into())]));
        assert_eq!(ctx.resolve("~/x"), Path::new("/work/~/x"));
    }
}
