//! What a configured server is ([`ServerSpec`], [`ServerKind`]) and how it stands
//! ([`ServerState`], [`ServerReport`]): the types the supervisor builds and `tools list` shows.

use super::McpServerConfig;

/// What a server's tools are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// An operator's MCP server: toolset `mcp-<name>`, [`crate::ToolSource::Mcp`].
    Mcp,
    /// The plugin host: toolsets `plugin-<module>`, [`crate::ToolSource::Plugin`].
    Plugins,
}

/// Everything needed to start one server.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// Name from config (`plugins` for the plugin host).
    pub name: String,
    /// The config entry.
    pub config: McpServerConfig,
    /// Complete environment of a stdio server (scrubbed by the caller's policy, plus the
    /// explicit `env:` entries). `None` inherits this process's environment.
    pub env: Option<Vec<(String, String)>>,
    /// MCP server or plugin host.
    pub kind: ServerKind,
    /// Added to start-up failures (e.g. how to install the plugin host).
    pub start_hint: Option<String>,
}

/// Where a server is in its life, for `tools list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerState {
    /// Lazy and not needed yet.
    NotStarted,
    /// Connected; holds this many registered tools.
    Running(usize),
    /// Could not start, or died and could not be restarted.
    Failed(String),
    /// Stopped by [`super::McpManager::shutdown`].
    Stopped,
}

impl std::fmt::Display for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerState::NotStarted => f.write_str("lazy (not started)"),
            ServerState::Running(n) => write!(f, "running ({n} tools)"),
            ServerState::Failed(why) => write!(f, "failed: {why}"),
            ServerState::Stopped => f.write_str("stopped"),
        }
    }
}

/// One row of the extension report.
#[derive(Debug, Clone)]
pub struct ServerReport {
    /// Server (or `plugin <module>`) name.
    pub name: String,
    /// `mcp` or `plugin`.
    pub kind: &'static str,
    /// `stdio: <command>` or `http: <url>`.
    pub transport: String,
    /// `eager` or `lazy`.
    pub startup: &'static str,
    /// Its state.
    pub state: ServerState,
    /// Toolsets it registered.
    pub toolsets: Vec<String>,
}
