//! Toolsets: named bundles of tools, how they nest, and how a name given by a user becomes a set
//! of tool names.
//!
//! Three kinds of names resolve here:
//! - *declared* toolsets: the static bundles and composites below (including the platform
//!   presets `vibeos-cli`, `vibeos-telegram`, `vibeos-acp`, …) plus dynamic ones added at run time
//!   for MCP servers and plugins ([`crate::ToolRegistry::add_toolset`]);
//! - *implicit* toolsets: every `toolset` field of a registered tool names a bundle holding that
//!   tool, so a tool never needs a hand-kept list to be selectable;
//! - *aliases*: the legacy `*_tools` names (`file_tools` → `file`) and any alias registered at run
//!   time.
//!
//! Composites are resolved depth-first with the path kept on a stack, so a cycle (possible once
//! dynamic toolsets include each other) is reported as an error naming the loop instead of
//! recursing forever.

use std::collections::{BTreeMap, BTreeSet};

/// A named bundle of tools, possibly including other toolsets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolset {
    /// Name users select it by.
    pub name: String,
    /// One line saying what it is for.
    pub description: String,
    /// Tools it holds directly.
    pub tools: Vec<String>,
    /// Toolsets whose tools it also holds (resolved recursively).
    pub includes: Vec<String>,
}

impl Toolset {
    /// A toolset holding `tools` and including `includes`.
    pub fn new(name: &str, description: &str, tools: &[&str], includes: &[&str]) -> Self {
        Toolset {
            name: name.into(),
            description: description.into(),
            tools: tools.iter().map(|s| s.to_string()).collect(),
            includes: includes.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// A toolset name could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolsetError {
    /// No declared, implicit or legacy toolset has this name.
    #[error("unknown toolset `{name}`; valid toolsets: {}", valid.join(", "))]
    Unknown {
        /// The name asked for.
        name: String,
        /// Every name that would have been accepted (legacy aliases excluded).
        valid: Vec<String>,
    },
    /// Composite toolsets include each other in a loop.
    #[error("toolset `{}` includes itself through {}; break the cycle in the toolset definitions", path[0], path.join(" → "))]
    Cycle {
        /// The loop, first name repeated at the end.
        path: Vec<String>,
    },
    /// A run-time toolset or alias would replace a static one.
    #[error("toolset `{0}` is built in and cannot be redefined at run time; choose another name")]
    Static(String),
    /// A run-time toolset or alias name is unusable.
    #[error("toolset name `{0}` is not usable: names must be non-empty and use only letters, digits, `_`, `-`, `.` and `:`")]
    BadName(String),
    /// An empty name among the toolsets asked for (`--enable-toolsets ''`, `[""]`): it names
    /// no toolset, and taking it for "no selection" would select every tool.
    #[error("an empty toolset name in {list} toolsets; name each toolset (e.g. web,file), or give none to select every toolset")]
    EmptyName {
        /// `enabled` or `disabled`.
        list: &'static str,
    },
    /// A run-time toolset would take over a name that means another toolset.
    #[error("toolset `{name}` cannot be defined: {reason}; choose another name")]
    Reserved {
        /// The name asked for.
        name: String,
        /// What the name already means.
        reason: String,
    },
}

/// Where a toolset definition came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolsetKind {
    Static,
    Dynamic,
}

/// The static bundles and composites. Names of tools not registered in this build simply
/// resolve to nothing; the toolset stays a valid name.
pub fn static_toolsets() -> Vec<Toolset> {
    vec![
        // Bundles.
        Toolset::new(
            "file",
            "Read, write, search and patch files",
            &["read_file", "write_file", "search_files", "patch"],
            &[],
        ),
        Toolset::new("terminal", "Run shell commands", &["terminal"], &[]),
        Toolset::new(
            "web",
            "Search the web and extract pages",
            &["web_search", "web_extract"],
            &[],
        ),
        Toolset::new(
            "code_execution",
            "Run a Python script that calls the other tools (execute_code)",
            &["execute_code"],
            &[],
        ),
        Toolset::new("todo", "Task planning (agent loop)", &["todo"], &[]),
        Toolset::new("memory", "Persistent memory (agent loop)", &["memory"], &[]),
        Toolset::new(
            "session_search",
            "Search past sessions (agent loop)",
            &["session_search"],
            &[],
        ),
        Toolset::new(
            "delegation",
            "Spawn sub-agents (agent loop)",
            &["delegate_task"],
            &[],
        ),
        // Composites.
        Toolset::new(
            "coding",
            "Files, terminal and scripts",
            &[],
            &["file", "terminal", "code_execution"],
        ),
        Toolset::new("research", "Web and files", &[], &["web", "file"]),
        Toolset::new(
            "vibeos-core",
            "Every tool the product ships (no agent-loop tools)",
            &[],
            &["coding", "research"],
        ),
        // Platform presets.
        Toolset::new(
            "vibeos-cli",
            "Preset of the interactive CLI",
            &[],
            &[
                "vibeos-core",
                "todo",
                "memory",
                "session_search",
                "delegation",
            ],
        ),
        Toolset::new(
            "vibeos-telegram",
            "Preset of the Telegram gateway",
            &[],
            &["vibeos-core", "todo", "memory", "session_search"],
        ),
        Toolset::new(
            "vibeos-acp",
            "Preset of editor integrations (Agent Client Protocol)",
            &[],
            &["coding", "web", "todo"],
        ),
        Toolset::new(
            "vibeos-api-server",
            "Preset of the HTTP API server",
            &[],
            &["vibeos-core", "todo", "memory"],
        ),
    ]
}

/// Legacy `*_tools` names and the modern toolsets they mean.
pub const LEGACY_TOOLSET_ALIASES: [(&str, &str); 9] = [
    ("file_tools", "file"),
    ("web_tools", "web"),
    ("terminal_tools", "terminal"),
    ("code_execution_tools", "code_execution"),
    ("code_tools", "code_execution"),
    ("todo_tools", "todo"),
    ("memory_tools", "memory"),
    ("session_search_tools", "session_search"),
    ("delegation_tools", "delegation"),
];

/// Why a tool cannot be registered into toolset `name` (or a toolset defined under it), or
/// `None` when it can. A tool's toolset becomes a name users select, and resolution prefers
/// such a name to an alias, so a tool in `file_tools` would take the legacy name over (selecting
/// `file_tools` would give that tool instead of the `file` toolset). So the aliases (the legacy
/// `*_tools` names and those added at run time) and the `<x>_tools` spelling of a built-in
/// toolset `<x>` are reserved. With `composites`, so are the built-in composites and presets
/// (`coding`, `vibeos-core`, `vibeos-cli`, …): they are defined by the toolsets they include,
/// and a tool registered under one of their names would silently join them (and every preset
/// including them). The built-in bundles (`file`, `web`, …) stay open: registering there is how
/// a host replaces a built-in tool in place.
pub(crate) fn reserved_toolset(
    name: &str,
    declared: &BTreeMap<String, (Toolset, ToolsetKind)>,
    aliases: &BTreeMap<String, String>,
    composites: bool,
) -> Option<String> {
    if let Some(target) = aliases.get(name) {
        return Some(format!(
            "`{name}` is an alias of toolset `{target}` (selecting it selects `{target}`)"
        ));
    }
    if let Some(base) = name.strip_suffix("_tools") {
        if let Some((_, ToolsetKind::Static)) = declared.get(base) {
            return Some(format!(
                "`{name}` is the legacy spelling of the built-in toolset `{base}`"
            ));
        }
    }
    match declared.get(name) {
        Some((set, ToolsetKind::Static)) if composites && !set.includes.is_empty() => {
            Some(format!(
                "`{name}` is a built-in composite toolset (a preset or a combination), made \
                 only of the toolsets it includes ({})",
                set.includes.join(", ")
            ))
        }
        _ => None,
    }
}

/// A toolset or alias name is usable: what MCP server and plugin names need, nothing that
/// would break a comma-separated CLI flag.
pub(crate) fn valid_toolset_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
}

/// A snapshot of everything needed to resolve names, taken once per definitions call.
pub(crate) struct Resolver<'a> {
    pub declared: &'a BTreeMap<String, (Toolset, ToolsetKind)>,
    pub aliases: &'a BTreeMap<String, String>,
    /// Implicit toolsets: `toolset` field → tool names.
    pub implicit: BTreeMap<&'a str, Vec<&'a str>>,
}

impl Resolver<'_> {
    /// The canonical name `name` stands for, following aliases and the legacy `<x>_tools` form.
    pub fn canonical<'n>(&'n self, name: &'n str) -> Option<&'n str> {
        if self.declared.contains_key(name) || self.implicit.contains_key(name) {
            return Some(name);
        }
        if let Some(target) = self.aliases.get(name) {
            return Some(target.as_str());
        }
        // Any `<x>_tools` whose `<x>` is known is the old spelling of `<x>`.
        let base = name.strip_suffix("_tools")?;
        (self.declared.contains_key(base) || self.implicit.contains_key(base)).then_some(base)
    }

    /// Every name accepted, sorted (aliases left out to keep the list readable).
    pub fn valid_names(&self) -> Vec<String> {
        let mut all: BTreeSet<String> = self.declared.keys().cloned().collect();
        all.extend(self.implicit.keys().map(|s| s.to_string()));
        all.into_iter().collect()
    }

    /// Adds the tool names of toolset `name` (recursively) to `out`.
    pub fn resolve_into(&self, name: &str, out: &mut BTreeSet<String>) -> Result<(), ToolsetError> {
        let mut stack = Vec::new();
        self.walk(name, &mut stack, out)
    }

    fn walk(
        &self,
        name: &str,
        stack: &mut Vec<String>,
        out: &mut BTreeSet<String>,
    ) -> Result<(), ToolsetError> {
        let canonical = self.canonical(name).ok_or_else(|| ToolsetError::Unknown {
            name: name.to_string(),
            valid: self.valid_names(),
        })?;
        if let Some(pos) = stack.iter().position(|s| s == canonical) {
            let mut path = stack[pos..].to_vec();
            path.push(canonical.to_string());
            return Err(ToolsetError::Cycle { path });
        }
        stack.push(canonical.to_string());
        if let Some((set, _)) = self.declared.get(canonical) {
            out.extend(set.tools.iter().cloned());
            for inner in &set.includes {
                match self.walk(inner, stack, out) {
                    // A member that is gone (an MCP server that disconnected) or not yet
                    // added leaves the rest of the composite usable; only the top-level
                    // name must exist.
                    Err(ToolsetError::Unknown { name, .. }) if name == *inner => {
                        tracing::debug!(
                            "toolset `{canonical}` includes unknown toolset `{name}`; skipped"
                        );
                    }
                    other => other?,
                }
            }
        }
        if let Some(tools) = self.implicit.get(canonical) {
            out.extend(tools.iter().map(|s| s.to_string()));
        }
        stack.pop();
        Ok(())
    }
}
