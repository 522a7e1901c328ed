//! Errors of tools and of registration.

/// A tool failed. `kind` names the failure (like an exception type) and appears in the wrapped
/// message the caller sees: `Tool execution failed: <kind>: <message>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ToolError {
    /// Short name of the failure, e.g. `FileNotFound`.
    pub kind: String,
    /// What went wrong and, where it helps, what to do.
    pub message: String,
}

impl ToolError {
    /// A tool error of the given kind.
    pub fn new(kind: impl Into<String>, message: impl Into<String>) -> Self {
        ToolError {
            kind: kind.into(),
            message: message.into(),
        }
    }

    /// The arguments do not fit the tool.
    pub fn invalid_args(message: impl Into<String>) -> Self {
        Self::new("InvalidArguments", message)
    }

    /// An I/O error on `path`, named by what happened.
    pub fn io(path: &std::path::Path, err: &std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        let kind = match err.kind() {
            K::NotFound => "FileNotFound",
            K::PermissionDenied => "PermissionDenied",
            K::AlreadyExists => "AlreadyExists",
            K::IsADirectory => "IsADirectory",
            K::NotADirectory => "NotADirectory",
            _ => "IOError",
        };
        Self::new(kind, format!("{}: {err}", path.display()))
    }
}

/// A tool could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistrationError {
    /// The name is empty or has characters a model or a script cannot call.
    #[error("cannot register tool `{0}`: names must be non-empty and use only letters, digits, `_` and `-`")]
    BadName(String),
    /// The schema is not a JSON-schema object description.
    #[error("cannot register tool `{name}`: its schema {reason}")]
    BadSchema {
        /// The tool's name.
        name: String,
        /// What is wrong with the schema.
        reason: String,
    },
    /// A plugin or MCP tool would replace a built-in the override policy does not open.
    #[error("cannot register tool `{name}` from {by}: it would replace the built-in tool of toolset `{toolset}`, and the plugin override policy does not allow that; rename the tool or allow it in the policy")]
    OverrideRefused {
        /// The tool's name.
        name: String,
        /// Who tried to register it.
        by: String,
        /// Toolset of the built-in it would replace.
        toolset: String,
    },
    /// A tool would shadow a tool of a different toolset without `override`.
    #[error("cannot register tool `{name}` in toolset `{toolset}`: a tool of that name already belongs to toolset `{existing_toolset}`; register it in `{existing_toolset}` to replace it, pass override=True to shadow it, or rename it")]
    ShadowRefused {
        /// The tool's name.
        name: String,
        /// Toolset of the new registration.
        toolset: String,
        /// Toolset of the registered tool it would shadow.
        existing_toolset: String,
    },
    /// A tool cannot be opened to execute_code scripts.
    #[error("cannot let scripts call `{name}`: {reason}")]
    NotScriptCallable {
        /// The tool's name.
        name: String,
        /// Why it must stay closed.
        reason: String,
    },
}
