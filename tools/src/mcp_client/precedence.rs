//! Which server a tool name means when several configured MCP servers (or an MCP server and a
//! plugin) offer a tool of that name: the one listed first in config.yaml, and any MCP server
//! before the plugins, whose host is started after every `mcp_servers:` entry.
//!
//! Servers start in parallel (eager ones together at start-up, lazy ones on first need), so
//! "the last to register wins" made the winner depend on which server happened to answer
//! `tools/list` last, from run to run. Registration order is not something the operator can
//! see or control; the order of `mcp_servers:` in config.yaml is. So a server's tool is left out
//! (logged) when a server listed before it already holds the name, and replaces the tool of a
//! server listed after it; the outcome once both are running is the same whatever starts first.
//! The servers of one [`crate::mcp_client::McpManager`] register one at a time, so the check
//! and the registration cannot interleave with another server's.

use crate::entry::ToolSource;
use crate::registry::ToolRegistry;
use std::sync::{Mutex, MutexGuard};

/// The MCP servers of one manager in config order, then its plugin host, and the lock their
/// registrations take.
#[derive(Debug, Default)]
pub(crate) struct ServerOrder {
    names: Vec<String>,
    /// The plugin host's server name, ranked after every MCP server; its tools are registered
    /// with [`ToolSource::Plugin`] (the plugin's module), not the server's name.
    plugin_host: Option<String>,
    registering: Mutex<()>,
}

impl ServerOrder {
    /// The order of `names` (config order, first wins), then `plugin_host` when there is one.
    pub(crate) fn new(names: Vec<String>, plugin_host: Option<String>) -> Self {
        let mut names = names;
        names.extend(plugin_host.iter().cloned());
        ServerOrder {
            names,
            plugin_host,
            registering: Mutex::new(()),
        }
    }

    /// Held while one server checks and registers its tools.
    pub(crate) fn registering(&self) -> MutexGuard<'_, ()> {
        self.registering.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn rank(&self, server: &str) -> Option<usize> {
        self.names.iter().position(|n| n == server)
    }

    /// The server listed before `server` whose tool `tool` is registered now, if any: then
    /// `server`'s tool of that name must be left out. A tool of a server this order does not
    /// know (another manager's) or of anything but an MCP server or a plugin is not its
    /// concern: the registry's own rules apply.
    pub(crate) fn held_by_earlier(
        &self,
        server: &str,
        registry: &ToolRegistry,
        tool: &str,
    ) -> Option<String> {
        let holder = match &registry.get(tool)?.source {
            ToolSource::Mcp(holder) if holder != server => holder.clone(),
            ToolSource::Plugin(_) => match &self.plugin_host {
                Some(host) if host != server => host.clone(),
                _ => return None,
            },
            _ => return None,
        };
        let (Some(mine), Some(theirs)) = (self.rank(server), self.rank(&holder)) else {
            return None;
        };
        (theirs < mine).then_some(holder)
    }
}
