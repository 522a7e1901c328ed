//! Errors of tools and of registration.

/// What kind of failure a [`ToolError`] is. The built-in tools' kinds are variants, so a typo
/// is a compile error; kinds from elsewhere (a Python exception type, an MCP server, a plugin)
/// are [`ToolErrorKind::Other`]. On the wire a kind is its name, exactly as before
/// (`Tool execution failed: <kind>: <message>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ToolErrorKind {
    /// The arguments do not fit the tool's schema.
    InvalidArguments,
    /// A path does not exist.
    FileNotFound,
    /// The OS refused access.
    PermissionDenied,
    /// The path already exists.
    AlreadyExists,
    /// A file was expected, a directory found.
    IsADirectory,
    /// A directory was expected.
    NotADirectory,
    /// Another I/O error.
    IoError,
    /// Not a regular file (device, FIFO, socket).
    NotARegularFile,
    /// The file is not text.
    BinaryFile,
    /// The file is over the tool's size limit.
    FileTooLarge,
    /// The file is not UTF-8 text.
    NotUtf8,
    /// A strict script's path leads outside its allowed roots.
    OutsideSandbox,
    /// A hard link out of the allowed roots.
    HardLinkRefused,
    /// The execution's disk budget is spent.
    DiskBudgetExceeded,
    /// Writing failed.
    WriteError,
    /// A patch does not apply.
    PatchError,
    /// The text to replace occurs more than once.
    AmbiguousMatch,
    /// The text to replace does not occur.
    NoMatch,
    /// A search pattern does not compile.
    InvalidRegex,
    /// Dangerous-command approval refused the command.
    CommandDenied,
    /// A command could not be started.
    SpawnError,
    /// No such background process.
    UnknownProcess,
    /// The execution backend failed.
    BackendError,
    /// The web search backend failed.
    SearchBackendError,
    /// The HTTP client could not be set up.
    HttpClientError,
    /// The tool needs configuration it does not have.
    NotConfigured,
    /// The operation is not supported here.
    Unsupported,
    /// No tool of that name.
    UnknownTool,
    /// A toolset cannot be resolved.
    ToolsetError,
    /// An agent-loop tool reached dispatch.
    AgentLoopTool,
    /// No async runtime could run the handler.
    AsyncRuntimeUnavailable,
    /// The handler panicked.
    Panic,
    /// An MCP server returned a protocol error.
    McpError,
    /// An MCP tool reported an error.
    McpToolError,
    /// An MCP call timed out.
    McpTimeout,
    /// The MCP server is no longer connected.
    McpServerGone,
    /// The MCP server is not running.
    McpServerDown,
    /// The MCP server crashed.
    McpServerCrashed,
    /// The MCP server answered with a message larger than the client accepts.
    McpResponseTooLarge,
    /// The execution the call belonged to ended first; nothing waits for the answer.
    CallAbandoned,
    /// A kind named by code outside this crate (e.g. a Python exception type).
    Other(String),
}

impl ToolErrorKind {
    /// The kind's name as it appears in messages.
    pub fn as_str(&self) -> &str {
        match self {
            ToolErrorKind::InvalidArguments => "InvalidArguments",
            ToolErrorKind::FileNotFound => "FileNotFound",
            ToolErrorKind::PermissionDenied => "PermissionDenied",
            ToolErrorKind::AlreadyExists => "AlreadyExists",
            ToolErrorKind::IsADirectory => "IsADirectory",
            ToolErrorKind::NotADirectory => "NotADirectory",
            ToolErrorKind::IoError => "IOError",
            ToolErrorKind::NotARegularFile => "NotARegularFile",
            ToolErrorKind::BinaryFile => "BinaryFile",
            ToolErrorKind::FileTooLarge => "FileTooLarge",
            ToolErrorKind::NotUtf8 => "NotUtf8",
            ToolErrorKind::OutsideSandbox => "OutsideSandbox",
            ToolErrorKind::HardLinkRefused => "HardLinkRefused",
            ToolErrorKind::DiskBudgetExceeded => "DiskBudgetExceeded",
            ToolErrorKind::WriteError => "WriteError",
            ToolErrorKind::PatchError => "PatchError",
            ToolErrorKind::AmbiguousMatch => "AmbiguousMatch",
            ToolErrorKind::NoMatch => "NoMatch",
            ToolErrorKind::InvalidRegex => "InvalidRegex",
            ToolErrorKind::CommandDenied => "CommandDenied",
            ToolErrorKind::SpawnError => "SpawnError",
            ToolErrorKind::UnknownProcess => "UnknownProcess",
            ToolErrorKind::BackendError => "BackendError",
            ToolErrorKind::SearchBackendError => "SearchBackendError",
            ToolErrorKind::HttpClientError => "HttpClientError",
            ToolErrorKind::NotConfigured => "NotConfigured",
            ToolErrorKind::Unsupported => "Unsupported",
            ToolErrorKind::UnknownTool => "UnknownTool",
            ToolErrorKind::ToolsetError => "ToolsetError",
            ToolErrorKind::AgentLoopTool => "AgentLoopTool",
            ToolErrorKind::AsyncRuntimeUnavailable => "AsyncRuntimeUnavailable",
            ToolErrorKind::Panic => "Panic",
            ToolErrorKind::McpError => "McpError",
            ToolErrorKind::McpToolError => "McpToolError",
            ToolErrorKind::McpTimeout => "McpTimeout",
            ToolErrorKind::McpServerGone => "McpServerGone",
            ToolErrorKind::McpServerDown => "McpServerDown",
            ToolErrorKind::McpServerCrashed => "McpServerCrashed",
            ToolErrorKind::McpResponseTooLarge => "McpResponseTooLarge",
            ToolErrorKind::CallAbandoned => "CallAbandoned",
            ToolErrorKind::Other(name) => name,
        }
    }
}

impl From<&str> for ToolErrorKind {
    fn from(name: &str) -> Self {
        match name {
            "InvalidArguments" => ToolErrorKind::InvalidArguments,
            "FileNotFound" => ToolErrorKind::FileNotFound,
            "PermissionDenied" => ToolErrorKind::PermissionDenied,
            "AlreadyExists" => ToolErrorKind::AlreadyExists,
            "IsADirectory" => ToolErrorKind::IsADirectory,
            "NotADirectory" => ToolErrorKind::NotADirectory,
            "IOError" => ToolErrorKind::IoError,
            "NotARegularFile" => ToolErrorKind::NotARegularFile,
            "BinaryFile" => ToolErrorKind::BinaryFile,
            "FileTooLarge" => ToolErrorKind::FileTooLarge,
            "NotUtf8" => ToolErrorKind::NotUtf8,
            "OutsideSandbox" => ToolErrorKind::OutsideSandbox,
            "HardLinkRefused" => ToolErrorKind::HardLinkRefused,
            "DiskBudgetExceeded" => ToolErrorKind::DiskBudgetExceeded,
            "WriteError" => ToolErrorKind::WriteError,
            "PatchError" => ToolErrorKind::PatchError,
            "AmbiguousMatch" => ToolErrorKind::AmbiguousMatch,
            "NoMatch" => ToolErrorKind::NoMatch,
            "InvalidRegex" => ToolErrorKind::InvalidRegex,
            "CommandDenied" => ToolErrorKind::CommandDenied,
            "SpawnError" => ToolErrorKind::SpawnError,
            "UnknownProcess" => ToolErrorKind::UnknownProcess,
            "BackendError" => ToolErrorKind::BackendError,
            "SearchBackendError" => ToolErrorKind::SearchBackendError,
            "HttpClientError" => ToolErrorKind::HttpClientError,
            "NotConfigured" => ToolErrorKind::NotConfigured,
            "Unsupported" => ToolErrorKind::Unsupported,
            "UnknownTool" => ToolErrorKind::UnknownTool,
            "ToolsetError" => ToolErrorKind::ToolsetError,
            "AgentLoopTool" => ToolErrorKind::AgentLoopTool,
            "AsyncRuntimeUnavailable" => ToolErrorKind::AsyncRuntimeUnavailable,
            "Panic" => ToolErrorKind::Panic,
            "McpError" => ToolErrorKind::McpError,
            "McpToolError" => ToolErrorKind::McpToolError,
            "McpTimeout" => ToolErrorKind::McpTimeout,
            "McpServerGone" => ToolErrorKind::McpServerGone,
            "McpServerDown" => ToolErrorKind::McpServerDown,
            "McpServerCrashed" => ToolErrorKind::McpServerCrashed,
            "McpResponseTooLarge" => ToolErrorKind::McpResponseTooLarge,
            "CallAbandoned" => ToolErrorKind::CallAbandoned,
            other => ToolErrorKind::Other(other.to_string()),
        }
    }
}

impl From<String> for ToolErrorKind {
    fn from(name: String) -> Self {
        ToolErrorKind::from(name.as_str())
    }
}

impl std::fmt::Display for ToolErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for ToolErrorKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ToolErrorKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// A tool failed. `kind` names the failure (like an exception type) and appears in the wrapped
/// message the caller sees: `Tool execution failed: <kind>: <message>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ToolError {
    /// What kind of failure, e.g. [`ToolErrorKind::FileNotFound`].
    pub kind: ToolErrorKind,
    /// What went wrong and, where it helps, what to do.
    pub message: String,
}

impl ToolError {
    /// A tool error of the given kind (a variant, or a name: known names map to their variant).
    pub fn new(kind: impl Into<ToolErrorKind>, message: impl Into<String>) -> Self {
        ToolError {
            kind: kind.into(),
            message: message.into(),
        }
    }

    /// The arguments do not fit the tool.
    pub fn invalid_args(message: impl Into<String>) -> Self {
        Self::new(ToolErrorKind::InvalidArguments, message)
    }

    /// An I/O error on `path`, named by what happened.
    pub fn io(path: &std::path::Path, err: &std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        let kind = match err.kind() {
            K::NotFound => ToolErrorKind::FileNotFound,
            K::PermissionDenied => ToolErrorKind::PermissionDenied,
            K::AlreadyExists => ToolErrorKind::AlreadyExists,
            K::IsADirectory => ToolErrorKind::IsADirectory,
            K::NotADirectory => ToolErrorKind::NotADirectory,
            _ => ToolErrorKind::IoError,
        };
        Self::new(kind, format!("{}: {err}", path.display()))
    }
}

#[cfg(test)]
mod kind_tests {
    use super::*;

    #[test]
    fn kinds_keep_their_wire_names() {
        let e = ToolError::new(ToolErrorKind::FileNotFound, "a: gone");
        assert_eq!(e.to_string(), "FileNotFound: a: gone");
        assert_eq!(ToolErrorKind::IoError.as_str(), "IOError");
        assert_eq!(ToolErrorKind::from("IOError"), ToolErrorKind::IoError);
        assert_eq!(
            ToolErrorKind::from("ValueError"),
            ToolErrorKind::Other("ValueError".into())
        );
        assert_eq!(
            ToolError::new("ValueError", "x").to_string(),
            "ValueError: x"
        );
        assert!(ToolError::new("NoMatch", "x").kind == ToolErrorKind::NoMatch);
        assert_eq!(ToolErrorKind::NoMatch, "NoMatch");
    }
}

/// `text` from elsewhere (an MCP server's error message) as one line of a table or a log:
/// newlines too are written as escapes (see [`escaped_for_display`]), so it can neither clear a
/// terminal nor start a forged log line of its own.
pub(crate) fn one_line(text: &str) -> String {
    escaped_for_display(text, LineBreaks::Escaped)
}

/// Whether text shown by [`escaped_for_display`] keeps its newlines and tabs (a command in a
/// prompt) or becomes one line (a row of a table, a log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LineBreaks {
    /// Newline and tab stay as they are.
    Kept,
    /// Newline and tab are escaped like every other control character.
    Escaped,
}

/// `text` that someone else wrote (a script, an MCP server) as it may be shown on a terminal or
/// in a client's form. Written as escapes (`\r`, `\u{1b}`, `\u{202e}`): control characters (a
/// carriage return and an erase-line sequence could draw a harmless command over the real one;
/// a conceal sequence hid the rest of a prompt; a clear-screen wiped it), Unicode bidirectional
/// controls (which reorder what is shown), zero-width characters and line separators.
pub(crate) fn escaped_for_display(text: &str, breaks: LineBreaks) -> String {
    let kept = |c: char| breaks == LineBreaks::Kept && matches!(c, '\n' | '\t');
    let hidden = |c: char| {
        (c.is_control() && !kept(c))
            || matches!(c,
                '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}' | '\u{061c}' | '\u{feff}')
    };
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if !hidden(c) {
            out.push(c);
        } else if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        }
    }
    out
}

/// A name as an error shows it: control characters escaped (a NUL reached the message raw)
/// and at most 80 characters of it, with its length when cut (a 10,000-character name was
/// repeated whole).
pub(crate) fn shown_name(name: &str) -> String {
    const SHOWN: usize = 80;
    let escaped: String = name.chars().flat_map(char::escape_debug).collect();
    match escaped.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}… ({} characters)", &escaped[..cut], name.chars().count()),
        None => escaped,
    }
}

/// A tool could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistrationError {
    /// The name (escaped, cut to 80 characters) is empty, longer than 64 characters, or has
    /// characters a model or a script cannot call.
    #[error("cannot register tool `{0}`: names must be 1 to 64 characters of letters, digits, `_` and `-` (what model APIs accept as a function name)")]
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
    /// The tool's toolset name is reserved: an alias, or a built-in composite or preset.
    #[error("cannot register tool `{name}` in toolset `{toolset}`: the name is reserved, {reason}; register the tool in a toolset with a name of its own and enable that toolset alongside")]
    ReservedToolset {
        /// The tool's name.
        name: String,
        /// The toolset asked for.
        toolset: String,
        /// What the toolset name already means.
        reason: String,
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

#[cfg(test)]
mod shown_name_tests {
    use super::{one_line, shown_name};

    #[test]
    fn a_foreign_message_is_one_line_with_its_controls_escaped() {
        assert_eq!(
            one_line("bad\u{1b}[2J\r\nWARN forged\u{2028}x"),
            "bad\\u{1b}[2J\\r\\nWARN forged\\u{2028}x"
        );
    }

    #[test]
    fn a_bad_name_is_shown_escaped_and_cut() {
        assert_eq!(shown_name("a\0b"), "a\\0b");
        let long = "x".repeat(10_000);
        let shown = shown_name(&long);
        assert!(
            shown.starts_with(&"x".repeat(80)) && shown.ends_with("… (10000 characters)"),
            "{shown}"
        );
        assert_eq!(shown_name("fine_name"), "fine_name");
    }
}
