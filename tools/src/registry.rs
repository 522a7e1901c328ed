//! The process-wide tool registry: registration, toolsets, lookup and the one dispatch path.
//!
//! Every way a tool is called — by the agent, from an execute_code script over RPC, in a
//! parallel batch — ends in [`ToolRegistry::handle_function_call`], so argument coercion, hooks,
//! error wrapping and result caps are the same for all of them.

use crate::availability::{availability_of, Availability, DEFAULT_CHECK_TIMEOUT};
use crate::entry::{BuiltinTool, Handler, OverridePolicy, ToolEntry, ToolSource};
use crate::hooks::{HookDecision, PostHook, PostToolCall, PreHook, PreToolCall};
use crate::toolsets::{
    reserved_toolset, static_toolsets, valid_toolset_name, Resolver, Toolset, ToolsetError,
    ToolsetKind, LEGACY_TOOLSET_ALIASES,
};
use crate::RegistrationError;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};
use std::time::Duration;

/// Tools an execute_code script may call (SPEC §2). Everything else is refused on the channel.
pub const SCRIPT_TOOLS: [&str; 7] = [
    "web_search",
    "web_extract",
    "read_file",
    "write_file",
    "search_files",
    "patch",
    "terminal",
];

/// Tools a script can never call, whatever is enabled: recursion and delegation.
pub const SCRIPT_BLOCKED_TOOLS: [&str; 2] = ["execute_code", "delegate_task"];

/// Tools the agent loop handles itself; reaching dispatch is a bug in the caller, refused.
pub const AGENT_LOOP_TOOLS: [&str; 4] = ["todo", "memory", "session_search", "delegate_task"];

/// Most calls of one batch that run at the same time.
pub const MAX_PARALLEL_TOOL_CALLS: usize = 8;

/// The registry: tools keyed by name, toolsets, aliases, hooks and policies.
pub struct ToolRegistry {
    pub(crate) tools: RwLock<BTreeMap<String, Arc<ToolEntry>>>,
    pub(crate) toolsets: RwLock<BTreeMap<String, (Toolset, ToolsetKind)>>,
    pub(crate) aliases: RwLock<BTreeMap<String, String>>,
    pub(crate) pre_hooks: RwLock<Vec<PreHook>>,
    pub(crate) post_hooks: RwLock<Vec<PostHook>>,
    override_policy: RwLock<OverridePolicy>,
    check_timeout: RwLock<Duration>,
    /// Tools an embedding host opened to scripts besides [`SCRIPT_TOOLS`].
    extra_script_tools: RwLock<BTreeSet<String>>,
    /// MCP servers the operator's config opened to scripts: server name → the tool names
    /// opened (`None`: every tool of the server).
    script_mcp_servers: RwLock<BTreeMap<String, Option<BTreeSet<String>>>>,
    /// Run before tool definitions or the script tool list are built (lazy MCP servers).
    prepare_hooks: RwLock<Vec<PrepareHook>>,
    /// Whether the stub can define each registered entry ([`ToolEntry::script_function`]),
    /// by the entry's address, with the entry it was decided for ([`Self::stub_defines`]).
    stub_defines: Mutex<HashMap<usize, (Weak<ToolEntry>, bool)>>,
}

/// What is about to be built when a [`PrepareHook`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepare {
    /// The model's tool definitions (`get_tool_definitions*`).
    Definitions,
    /// The tool list of an execute_code script (`script_tools`).
    Scripts,
}

/// A hook run before definitions or the script tool list are built, so tool sources that start
/// lazily (MCP servers) can register their tools first. It must not call back into the build.
pub type PrepareHook = Arc<dyn Fn(&ToolRegistry, Prepare) + Send + Sync>;

impl Default for ToolRegistry {
    fn default() -> Self {
        Self::new()
    }
}

pub(crate) fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

impl ToolRegistry {
    /// A registry with no tools but the static toolsets and legacy aliases (tests and
    /// embedders; the process-wide one is [`registry`]).
    pub fn new() -> Self {
        let toolsets = static_toolsets()
            .into_iter()
            .map(|t| (t.name.clone(), (t, ToolsetKind::Static)))
            .collect();
        let aliases = LEGACY_TOOLSET_ALIASES
            .iter()
            .map(|(a, t)| (a.to_string(), t.to_string()))
            .collect();
        ToolRegistry {
            tools: RwLock::new(BTreeMap::new()),
            toolsets: RwLock::new(toolsets),
            aliases: RwLock::new(aliases),
            pre_hooks: RwLock::new(Vec::new()),
            post_hooks: RwLock::new(Vec::new()),
            override_policy: RwLock::new(OverridePolicy::default()),
            check_timeout: RwLock::new(DEFAULT_CHECK_TIMEOUT),
            extra_script_tools: RwLock::new(BTreeSet::new()),
            script_mcp_servers: RwLock::new(BTreeMap::new()),
            prepare_hooks: RwLock::new(Vec::new()),
            stub_defines: Mutex::new(HashMap::new()),
        }
    }

    /// A registry holding every built-in tool.
    pub fn with_builtins() -> Self {
        let reg = Self::new();
        for builtin in inventory::iter::<BuiltinTool> {
            if let Err(e) = reg.register(builtin.0()) {
                tracing::error!("{e}");
            }
        }
        reg
    }

    /// Adds a tool without permission to shadow another toolset's tool; see
    /// [`ToolRegistry::register_with_override`].
    pub fn register(&self, entry: ToolEntry) -> Result<(), RegistrationError> {
        self.register_with_override(entry, false)
    }

    /// Adds a tool (SPEC §7). When the name is taken:
    /// - a registration in the same toolset replaces the previous one (last wins, logged);
    /// - MCP-to-MCP overwrites are allowed (a server's tool may replace another server's);
    /// - a plugin or MCP tool replacing a built-in or host tool also needs the operator's
    ///   [`OverridePolicy`] (which, once it allows it, is the override);
    /// - shadowing a tool of a different toolset otherwise needs `override_existing`.
    ///
    /// A toolset name that means something else is refused whoever registers: an alias (the
    /// legacy `file_tools` …), or a built-in composite or preset (`vibeos-cli` …); see
    /// [`RegistrationError::ReservedToolset`].
    pub fn register_with_override(
        &self,
        entry: ToolEntry,
        override_existing: bool,
    ) -> Result<(), RegistrationError> {
        self.register_replacing(entry, override_existing).map(drop)
    }

    /// [`ToolRegistry::register_with_override`], returning the entry the registration replaced
    /// (`None` for a new name), so a caller that must undo it (a tool module that failed to
    /// load after registering) can put that entry back with [`ToolRegistry::reinstate`]. The
    /// entry is taken under the same lock as the replacement: no other registration can come
    /// between them.
    pub fn register_replacing(
        &self,
        mut entry: ToolEntry,
        override_existing: bool,
    ) -> Result<Option<Arc<ToolEntry>>, RegistrationError> {
        entry.is_async = matches!(entry.handler, Handler::Async(_));
        entry.validate()?;
        let reserved = reserved_toolset(
            &entry.toolset,
            &read(&self.toolsets),
            &read(&self.aliases),
            true,
        );
        if let Some(reason) = reserved {
            return Err(RegistrationError::ReservedToolset {
                name: entry.name,
                toolset: entry.toolset,
                reason,
            });
        }
        let mut tools = write(&self.tools);
        if let Some(old) = tools.get(&entry.name) {
            // Between MCP servers, and between one and a plugin, the config order decides
            // (`mcp_client::precedence`, which leaves out a later one's tool before it gets
            // here): refusing here made the first to register win, which varied by start-up
            // timing.
            let mcp_to_mcp = matches!(
                (&old.source, &entry.source),
                (ToolSource::Mcp(_), ToolSource::Mcp(_))
                    | (ToolSource::Mcp(_), ToolSource::Plugin(_))
                    | (ToolSource::Plugin(_), ToolSource::Mcp(_))
            );
            let mut permitted = override_existing || mcp_to_mcp;
            if entry.source.is_external() && !old.source.is_external() && !mcp_to_mcp {
                if !read(&self.override_policy).allows(&entry.name, &entry.source) {
                    return Err(RegistrationError::OverrideRefused {
                        name: entry.name.clone(),
                        by: entry.source.to_string(),
                        toolset: old.toolset.clone(),
                    });
                }
                permitted = true;
            }
            if old.toolset != entry.toolset && !permitted {
                return Err(RegistrationError::ShadowRefused {
                    name: entry.name.clone(),
                    toolset: entry.toolset.clone(),
                    existing_toolset: old.toolset.clone(),
                });
            }
            if old.toolset != entry.toolset || old.source != entry.source {
                tracing::warn!(
                    tool = %entry.name,
                    "tool `{}` of toolset `{}` ({}) replaces the one of toolset `{}` ({})",
                    entry.name,
                    entry.toolset,
                    entry.source,
                    old.toolset,
                    old.source
                );
            } else {
                tracing::info!(
                    tool = %entry.name,
                    "tool `{}` of toolset `{}` re-registered: the last registration wins",
                    entry.name,
                    entry.toolset
                );
            }
        }
        Ok(tools.insert(entry.name.clone(), Arc::new(entry)))
    }

    /// Removes a tool; returns it if it was registered.
    pub fn unregister(&self, name: &str) -> Option<Arc<ToolEntry>> {
        write(&self.tools).remove(name)
    }

    /// Puts back an entry this registry held before, as it was (same handler, check and
    /// flags), under its name, and returns the entry it displaces. For undoing a registration
    /// with what [`ToolRegistry::register_replacing`] returned; no override or toolset rules
    /// are applied, since the entry passed them when it was first registered.
    pub fn reinstate(&self, entry: Arc<ToolEntry>) -> Option<Arc<ToolEntry>> {
        tracing::info!(
            tool = %entry.name,
            "tool `{}` of toolset `{}` ({}) is registered again as it was",
            entry.name,
            entry.toolset,
            entry.source
        );
        write(&self.tools).insert(entry.name.clone(), entry)
    }

    /// Replaces the policy deciding which built-ins plugins and MCP servers may replace.
    pub fn set_override_policy(&self, policy: OverridePolicy) {
        *write(&self.override_policy) = policy;
    }

    /// The policy deciding which built-ins plugins and MCP servers may replace.
    pub fn override_policy(&self) -> OverridePolicy {
        read(&self.override_policy).clone()
    }

    /// Whether a tool called `name` could ever be opened to scripts, whoever registers it:
    /// not `execute_code`, `delegate_task` or an agent-loop tool, and a name the stub can
    /// define as a Python function (not `with-dash`, `class` or a helper such as `retry`).
    /// [`ToolRegistry::allow_in_scripts`] checks it; a host can check first, before it
    /// registers anything.
    pub fn check_script_name(name: &str) -> Result<(), RegistrationError> {
        let refused = |reason: String| RegistrationError::NotScriptCallable {
            name: name.to_string(),
            reason,
        };
        if SCRIPT_BLOCKED_TOOLS.contains(&name) {
            return Err(refused(
                "scripts can never call it (no recursion, no delegation)".into(),
            ));
        }
        if AGENT_LOOP_TOOLS.contains(&name) {
            return Err(refused(
                "it is handled by the agent loop, not dispatched".into(),
            ));
        }
        match vibeos_rpc::check_tool_name(name) {
            Ok(()) => Ok(()),
            Err(vibeos_rpc::StubError::ShadowsHelper(_)) => Err(refused(
                "vibeos_tools cannot define it: the name is taken by a stub helper \
                 (json_parse, shell_quote, retry, ToolChannelError) or starts with `_`; \
                 register the tool under another name to open it"
                    .into(),
            )),
            Err(vibeos_rpc::StubError::ShadowsBuiltin(_)) => Err(refused(
                "vibeos_tools cannot define it: the name is a Python builtin (`print`, `open`, \
                 `len`, …), which the tool would replace in a script that imports it; register \
                 the tool under another name to open it"
                    .into(),
            )),
            Err(_) => Err(refused(
                "vibeos_tools cannot define it: the name is not a Python identifier (letters, \
                 digits and `_`, not starting with a digit, not a keyword); register the tool \
                 under such a name (e.g. with `_` for `-`) to open it"
                    .into(),
            )),
        }
    }

    /// Opens the tool `name` to execute_code scripts besides [`SCRIPT_TOOLS`] (an embedding
    /// host's own tools). `execute_code`, `delegate_task`, the agent-loop tools, names the stub
    /// cannot define (see [`ToolRegistry::check_script_name`]) and tools of MCP servers can
    /// never be opened; an MCP tool registered under the name later stays closed.
    pub fn allow_in_scripts(&self, name: &str) -> Result<(), RegistrationError> {
        Self::check_script_name(name)?;
        let refused = |reason: &str| RegistrationError::NotScriptCallable {
            name: name.to_string(),
            reason: reason.to_string(),
        };
        if self
            .get(name)
            .is_some_and(|e| matches!(e.source, ToolSource::Mcp(_)))
        {
            return Err(refused(
                "it comes from an MCP server, and scripts never call MCP tools",
            ));
        }
        if !SCRIPT_TOOLS.contains(&name) {
            write(&self.extra_script_tools).insert(name.to_string());
        }
        Ok(())
    }

    /// Closes a tool opened with [`ToolRegistry::allow_in_scripts`]; returns whether it was
    /// open. The built-in script tools stay open.
    pub fn disallow_in_scripts(&self, name: &str) -> bool {
        write(&self.extra_script_tools).remove(name)
    }

    /// Opens tools of the MCP server `server` to execute_code scripts: all of them (`tools` is
    /// `None`) or the listed names. Scripts never call MCP tools (SPEC §2) unless the operator
    /// says so in config.yaml (`mcp_servers.<name>.script_callable`); this is that path, and
    /// nothing else (not the Python package, not a plugin) should call it. The blocked and
    /// agent-loop tools stay closed whatever the server calls its tools.
    pub fn allow_mcp_server_in_scripts(&self, server: &str, tools: Option<BTreeSet<String>>) {
        write(&self.script_mcp_servers).insert(server.to_string(), tools);
    }

    /// Closes the MCP server `server` to scripts again; returns whether it was open.
    pub fn disallow_mcp_server_in_scripts(&self, server: &str) -> bool {
        write(&self.script_mcp_servers).remove(server).is_some()
    }

    fn mcp_open_to_scripts(&self, server: &str, tool: &str) -> bool {
        match read(&self.script_mcp_servers).get(server) {
            Some(None) => true,
            Some(Some(names)) => names.contains(tool),
            None => false,
        }
    }

    /// Names of the tools scripts may call: [`SCRIPT_TOOLS`] in their order, then the ones a
    /// host opened, sorted, then the registered tools of MCP servers the operator opened whose
    /// names the stub can define, sorted. Registered or not, available or not (MCP ones:
    /// registered only).
    pub fn script_tool_names(&self) -> Vec<String> {
        let mut names: Vec<String> = SCRIPT_TOOLS.iter().map(|s| s.to_string()).collect();
        names.extend(read(&self.extra_script_tools).iter().cloned());
        if !read(&self.script_mcp_servers).is_empty() {
            let mcp: Vec<String> = read(&self.tools)
                .values()
                .filter(|e| match &e.source {
                    ToolSource::Mcp(server) => self.mcp_open_to_scripts(server, &e.name),
                    _ => false,
                })
                .map(|e| e.name.clone())
                .filter(|n| !names.contains(n) && vibeos_rpc::check_tool_name(n).is_ok())
                .collect();
            names.extend(mcp);
        }
        names
    }

    /// Whether `entry` (as [`Self::get`] found it) is closed to scripts now (not
    /// [`Self::is_script_callable`]). A script's tools are fixed when it starts, but a host can
    /// close one while it runs (re-registered without `script_callable`,
    /// `disallow_in_scripts`): its calls are then refused, not handed to whatever handler has
    /// the name now. The caller dispatches the entry it checked
    /// ([`Self::handle_function_call_to`]), so a re-registration between the two cannot slip
    /// in.
    pub fn closed_to_scripts(&self, entry: &Arc<ToolEntry>) -> bool {
        !self.is_script_callable(entry)
    }

    /// Whether `entry` may be handed to a script: its name is a script tool, the stub can
    /// define it ([`ToolEntry::script_function`]; the stub, the channel's allowlist and the
    /// execute_code description all follow this, so they agree), and it is not an MCP server's
    /// (scripts never call MCP tools, even under a script tool's name) unless the operator
    /// opened that server's tool in config.
    pub(crate) fn is_script_callable(&self, entry: &Arc<ToolEntry>) -> bool {
        let name = entry.name.as_str();
        if SCRIPT_BLOCKED_TOOLS.contains(&name) || AGENT_LOOP_TOOLS.contains(&name) {
            return false;
        }
        let opened = match &entry.source {
            ToolSource::Mcp(server) => self.mcp_open_to_scripts(server, name),
            _ => SCRIPT_TOOLS.contains(&name) || read(&self.extra_script_tools).contains(name),
        };
        if !opened {
            return false;
        }
        // Reachable for an operator-opened MCP tool or a schema the stub cannot render; hosts'
        // unusable names are refused when they are opened.
        self.stub_defines(entry)
    }

    /// Whether the stub can define `entry`, decided once per entry: rendering every script
    /// tool's function on each execution cost a warm call about 50 µs. An entry never changes
    /// once it is shared (re-registering makes a new one), and the weak reference kept with
    /// the answer holds the entry's allocation, so no later entry can come to its address.
    fn stub_defines(&self, entry: &Arc<ToolEntry>) -> bool {
        let key = Arc::as_ptr(entry) as usize;
        let mut known = self.stub_defines.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, defines)) = known.get(&key) {
            return *defines;
        }
        let defines = entry
            .script_function()
            .map_err(|e| tracing::debug!("{e}"))
            .is_ok();
        // Entries replaced since are dropped from the map when it has grown.
        if known.len() >= 64 {
            known.retain(|_, (seen, _)| seen.strong_count() > 0);
        }
        known.insert(key, (Arc::downgrade(entry), defines));
        defines
    }

    /// Adds a hook run before tool definitions or the script tool list are built.
    pub fn add_prepare_hook<F>(&self, hook: F)
    where
        F: Fn(&ToolRegistry, Prepare) + Send + Sync + 'static,
    {
        write(&self.prepare_hooks).push(Arc::new(hook));
    }

    /// Runs the prepare hooks (outside every lock; a panicking hook is logged).
    pub(crate) fn prepare(&self, what: Prepare) {
        let hooks: Vec<PrepareHook> = read(&self.prepare_hooks).clone();
        for hook in hooks {
            if catch_unwind(AssertUnwindSafe(|| hook(self, what))).is_err() {
                tracing::error!("a prepare hook panicked while preparing {what:?}; continuing");
            }
        }
    }

    /// How long a `check_fn` may run before its tools count as unavailable.
    pub fn set_check_timeout(&self, timeout: Duration) {
        *write(&self.check_timeout) = timeout;
    }

    pub(crate) fn check_timeout(&self) -> Duration {
        *read(&self.check_timeout)
    }

    /// Adds a `pre_tool_call` hook; it may block calls.
    pub fn add_pre_tool_call_hook<F>(&self, hook: F)
    where
        F: Fn(&PreToolCall<'_>) -> HookDecision + Send + Sync + 'static,
    {
        write(&self.pre_hooks).push(Arc::new(hook));
    }

    /// Adds a `post_tool_call` hook; it sees every result, blocked calls included.
    pub fn add_post_tool_call_hook<F>(&self, hook: F)
    where
        F: Fn(&PostToolCall<'_>) + Send + Sync + 'static,
    {
        write(&self.post_hooks).push(Arc::new(hook));
    }

    /// Looks a tool up by name.
    pub fn get(&self, name: &str) -> Option<Arc<ToolEntry>> {
        read(&self.tools).get(name).cloned()
    }

    /// All tools, by name.
    pub fn entries(&self) -> Vec<Arc<ToolEntry>> {
        read(&self.tools).values().cloned().collect()
    }

    // ---- toolsets -------------------------------------------------------------------------

    /// Runs `f` with a resolver over a consistent snapshot of tools, toolsets and aliases.
    pub(crate) fn with_resolver<R>(
        &self,
        tools: &BTreeMap<String, Arc<ToolEntry>>,
        f: impl FnOnce(&Resolver<'_>) -> R,
    ) -> R {
        let declared = read(&self.toolsets);
        let aliases = read(&self.aliases);
        let mut implicit: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for e in tools.values() {
            implicit
                .entry(e.toolset.as_str())
                .or_default()
                .push(e.name.as_str());
        }
        let resolver = Resolver {
            declared: &declared,
            aliases: &aliases,
            implicit,
        };
        f(&resolver)
    }

    /// Adds (or replaces) a toolset at run time — an MCP server's or a plugin's bundle, or a
    /// composite of existing ones. Static toolsets cannot be redefined, nor aliases taken over
    /// (a toolset named `file_tools` would hide the legacy name of `file`); a definition that
    /// would make composites include each other in a loop is refused.
    pub fn add_toolset(&self, toolset: Toolset) -> Result<(), ToolsetError> {
        if !valid_toolset_name(&toolset.name) {
            return Err(ToolsetError::BadName(toolset.name));
        }
        let reserved = reserved_toolset(
            &toolset.name,
            &read(&self.toolsets),
            &read(&self.aliases),
            false,
        );
        if let Some(reason) = reserved {
            return Err(ToolsetError::Reserved {
                name: toolset.name,
                reason,
            });
        }
        let name = toolset.name.clone();
        let previous = {
            let mut sets = write(&self.toolsets);
            if let Some((_, ToolsetKind::Static)) = sets.get(&name) {
                return Err(ToolsetError::Static(name));
            }
            sets.insert(name.clone(), (toolset, ToolsetKind::Dynamic))
        };
        let tools = read(&self.tools);
        let check = self.with_resolver(&tools, |r| {
            // Unknown includes are allowed (they may be added later); loops are not.
            let mut sink = BTreeSet::new();
            match r.resolve_into(&name, &mut sink) {
                Err(e @ ToolsetError::Cycle { .. }) => Err(e),
                _ => Ok(()),
            }
        });
        drop(tools);
        if let Err(e) = check {
            let mut sets = write(&self.toolsets);
            match previous {
                Some(p) => sets.insert(name, p),
                None => sets.remove(&name),
            };
            return Err(e);
        }
        Ok(())
    }

    /// Maps `alias` to the toolset `target` (like the legacy `*_tools` names).
    pub fn add_toolset_alias(&self, alias: &str, target: &str) -> Result<(), ToolsetError> {
        if !valid_toolset_name(alias) {
            return Err(ToolsetError::BadName(alias.into()));
        }
        if read(&self.toolsets).contains_key(alias) {
            return Err(ToolsetError::Static(alias.into()));
        }
        write(&self.aliases).insert(alias.into(), target.into());
        Ok(())
    }

    /// Registers the tools of an MCP server or plugin as the dynamic toolset `toolset`. Each
    /// entry gets that toolset and `source`; entries that cannot be registered are skipped and
    /// returned for the caller to log (once, with the server's name), the rest stay usable.
    pub fn register_dynamic_toolset(
        &self,
        toolset: &str,
        description: &str,
        source: ToolSource,
        entries: Vec<ToolEntry>,
    ) -> Result<Vec<RegistrationError>, ToolsetError> {
        let mut failures = Vec::new();
        let mut names = Vec::new();
        for mut entry in entries {
            entry.toolset = toolset.to_string();
            entry.source = source.clone();
            let name = entry.name.clone();
            match self.register(entry) {
                Ok(()) => names.push(name),
                Err(e) => failures.push(e),
            }
        }
        let set = Toolset {
            name: toolset.into(),
            description: description.into(),
            tools: names,
            includes: Vec::new(),
        };
        if let Err(e) = self.add_toolset(set) {
            // Keep the registry consistent: tools of a toolset that could not be added go too.
            let mut tools = write(&self.tools);
            tools.retain(|_, t| !(t.toolset == toolset && t.source == source));
            return Err(e);
        }
        Ok(failures)
    }

    /// Removes a dynamic toolset and every tool registered in it by a plugin or MCP server (an
    /// MCP server went away). Returns the names of the removed tools.
    pub fn remove_toolset(&self, name: &str) -> Result<Vec<String>, ToolsetError> {
        {
            let mut sets = write(&self.toolsets);
            if let Some((_, ToolsetKind::Static)) = sets.get(name) {
                return Err(ToolsetError::Static(name.into()));
            }
            sets.remove(name);
        }
        let mut tools = write(&self.tools);
        let gone: Vec<String> = tools
            .values()
            .filter(|t| t.toolset == name && t.source.is_external())
            .map(|t| t.name.clone())
            .collect();
        for g in &gone {
            tools.remove(g);
        }
        Ok(gone)
    }

    /// The declared toolsets (static and dynamic), by name.
    pub fn toolsets(&self) -> Vec<Toolset> {
        read(&self.toolsets)
            .values()
            .map(|(t, _)| t.clone())
            .collect()
    }

    /// Every toolset name a user may select (declared and implicit), sorted.
    pub fn toolset_names(&self) -> Vec<String> {
        let tools = read(&self.tools);
        self.with_resolver(&tools, |r| r.valid_names())
    }

    /// The tool names toolset `name` stands for (recursively; legacy names accepted). Names of
    /// tools that are not registered are included: the toolset declares them.
    pub fn resolve_toolset(&self, name: &str) -> Result<BTreeSet<String>, ToolsetError> {
        let tools = read(&self.tools);
        let mut out = BTreeSet::new();
        self.with_resolver(&tools, |r| r.resolve_into(name, &mut out))?;
        Ok(out)
    }

    /// Whether at least one registered tool of toolset `name` is available now.
    pub fn is_toolset_available(&self, name: &str) -> Result<bool, ToolsetError> {
        let names = self.resolve_toolset(name)?;
        let entries: Vec<Arc<ToolEntry>> = names.iter().filter_map(|n| self.get(n)).collect();
        Ok(availability_of(&entries, self.check_timeout())
            .iter()
            .any(Availability::is_available))
    }

    /// The script tools (SPEC §2, plus those a host opened with
    /// [`ToolRegistry::allow_in_scripts`]) that are registered, not from an MCP server, and
    /// available now, in [`ToolRegistry::script_tool_names`] order. Empty when none is: scripts
    /// then get no tools, never all of them.
    pub fn script_tools(&self) -> Vec<Arc<ToolEntry>> {
        self.prepare(Prepare::Scripts);
        let entries: Vec<Arc<ToolEntry>> = self
            .script_tool_names()
            .iter()
            .filter_map(|name| self.get(name))
            .filter(|e| self.is_script_callable(e))
            .collect();
        let avail = availability_of(&entries, self.check_timeout());
        entries
            .into_iter()
            .zip(avail)
            .filter(|(_, a)| a.is_available())
            .map(|(e, _)| e)
            .collect()
    }
}

/// The process-wide registry, holding the built-ins from first use.
pub fn registry() -> &'static ToolRegistry {
    static REGISTRY: OnceLock<ToolRegistry> = OnceLock::new();
    REGISTRY.get_or_init(ToolRegistry::with_builtins)
}

/// How a JSON value's type reads in an error message ("a string", "an array", …).
pub fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The tools map, read-locked (for sibling modules that need a consistent snapshot).
pub(crate) fn read_tools(
    reg: &ToolRegistry,
) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Arc<ToolEntry>>> {
    read(&reg.tools)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ToolContext, ToolError};
    use serde_json::json;

    fn echo(name: &str, toolset: &str) -> ToolEntry {
        ToolEntry::new(
            name,
            toolset,
            "Echo.",
            json!({"type": "object", "properties": {"x": {"type": "string"}}}),
            |args, _| Ok(json!({ "echo": args.get("x") })),
        )
    }

    #[test]
    fn whether_the_stub_defines_an_entry_is_decided_per_entry() {
        let reg = ToolRegistry::new();
        let good = Arc::new(echo("lookup", "t"));
        let bad = Arc::new(echo("look-up", "t"));
        for _ in 0..2 {
            assert!(reg.stub_defines(&good));
            assert!(!reg.stub_defines(&bad));
        }
        // Entries made and dropped one after another (the allocator would hand a freed
        // entry's block to the next) each get their own answer.
        for i in 0..200 {
            let name = if i % 2 == 0 { "fine" } else { "not fine" };
            let e = Arc::new(echo(name, "t"));
            assert_eq!(reg.stub_defines(&e), i % 2 == 0, "entry {i}");
        }
        // The answers of dropped entries do not pile up.
        let kept = reg.stub_defines.lock().unwrap().len();
        assert!(kept <= 64, "{kept} answers kept");
        assert!(reg.stub_defines(&good) && !reg.stub_defines(&bad));
    }

    fn ctx() -> ToolContext {
        ToolContext::agent("/")
    }

    #[test]
    fn dispatches_and_wraps_both_error_layers() {
        let reg = ToolRegistry::new();
        reg.register(echo("echo", "t")).unwrap();
        reg.register(ToolEntry::new(
            "fails",
            "t",
            "Fails.",
            json!({"type": "object"}),
            |_, _| Err(ToolError::new("Boom", "it broke")),
        ))
        .unwrap();
        reg.register(ToolEntry::new(
            "panics",
            "t",
            "Panics.",
            json!({"type": "object"}),
            |_, _| panic!("handler exploded"),
        ))
        .unwrap();
        let ok: Value =
            serde_json::from_str(&reg.handle_function_call("echo", &json!({"x": "hi"}), &ctx()))
                .unwrap();
        assert_eq!(ok, json!({"echo": "hi"}));
        let e: Value =
            serde_json::from_str(&reg.handle_function_call("fails", &json!({}), &ctx())).unwrap();
        assert_eq!(e["error"], "Tool execution failed: Boom: it broke");
        let e: Value =
            serde_json::from_str(&reg.handle_function_call("panics", &json!({}), &ctx())).unwrap();
        assert_eq!(e["error"], "Tool execution failed: Panic: handler exploded");
        let e: Value =
            serde_json::from_str(&reg.handle_function_call("nope", &json!({}), &ctx())).unwrap();
        assert!(e["error"]
            .as_str()
            .unwrap()
            .starts_with("Error executing nope: unknown tool; registered tools: "));
        // A script is not shown the registry (it holds host tools the script was never offered).
        let mut script = ctx();
        script.origin = crate::CallOrigin::Script;
        let e: Value =
            serde_json::from_str(&reg.handle_function_call("nope", &json!({}), &script)).unwrap();
        assert_eq!(
            e["error"],
            "Error executing nope: unknown tool `nope`: no tool of that name is registered (any more)"
        );
        let e: Value =
            serde_json::from_str(&reg.handle_function_call("echo", &json!([1]), &ctx())).unwrap();
        assert_eq!(
            e["error"],
            "Error executing echo: arguments must be a JSON object, got an array"
        );
        let e: Value =
            serde_json::from_str(&reg.handle_function_call("todo", &json!({}), &ctx())).unwrap();
        assert!(e["error"]
            .as_str()
            .unwrap()
            .starts_with("Error executing todo:"));
    }

    #[test]
    fn last_registration_in_a_toolset_wins_and_shadowing_needs_override() {
        let reg = ToolRegistry::new();
        reg.register(echo("same", "a")).unwrap();
        reg.register(echo("same", "a").with_emoji("2")).unwrap();
        assert_eq!(reg.get("same").unwrap().emoji, "2");
        assert!(reg.register(echo("same", "b")).is_err());
        reg.register_with_override(echo("same", "b"), true).unwrap();
        assert_eq!(reg.get("same").unwrap().toolset, "b");
    }

    #[test]
    fn malformed_schemas_are_rejected_with_the_name() {
        let reg = ToolRegistry::new();
        let mut bad = echo("bad", "t");
        bad.schema = json!({"type": "object", "required": ["missing"]});
        let err = reg.register(bad).unwrap_err();
        assert!(err.to_string().contains("`bad`"), "{err}");
        assert!(reg.register(echo("", "t")).is_err());
        let mut bad = echo("bad2", "t");
        bad.schema = json!("string");
        assert!(reg.register(bad).is_err());
    }

    #[test]
    fn results_over_the_cap_are_truncated_with_a_note() {
        let reg = ToolRegistry::new();
        let mut e = ToolEntry::new("big", "t", "Big.", json!({"type": "object"}), |_, _| {
            Ok(Value::String("é".repeat(100)))
        });
        e.max_result_size_chars = Some(10);
        reg.register(e).unwrap();
        let out: Value =
            serde_json::from_str(&reg.handle_function_call("big", &json!({}), &ctx())).unwrap();
        assert_eq!(out["truncated"], true);
        assert_eq!(out["content"].as_str().unwrap().chars().count(), 10);
        assert!(out["note"]
            .as_str()
            .unwrap()
            .contains("showing 10 of 102 characters"));
    }

    #[test]
    fn hosts_open_their_tools_to_scripts_but_never_blocked_or_mcp_ones() {
        let reg = ToolRegistry::new();
        reg.register(echo("read_file", "file")).unwrap();
        reg.register(echo("my_tool", "host")).unwrap();
        reg.register(echo("mcp_thing", "srv").with_source(ToolSource::Mcp("srv".into())))
            .unwrap();
        let names = |r: &ToolRegistry| -> Vec<String> {
            r.script_tools().iter().map(|e| e.name.clone()).collect()
        };
        assert_eq!(names(&reg), vec!["read_file"]);
        reg.allow_in_scripts("my_tool").unwrap();
        assert_eq!(names(&reg), vec!["read_file", "my_tool"]);
        for blocked in ["execute_code", "delegate_task", "todo", "mcp_thing"] {
            let err = reg.allow_in_scripts(blocked).unwrap_err();
            assert!(err.to_string().contains(blocked), "{err}");
        }
        // An MCP tool that later takes an opened name stays closed to scripts.
        reg.allow_in_scripts("later").unwrap();
        reg.register(echo("later", "srv2").with_source(ToolSource::Mcp("srv2".into())))
            .unwrap();
        assert!(!names(&reg).contains(&"later".to_string()));
        assert!(reg.disallow_in_scripts("my_tool"));
        assert_eq!(names(&reg), vec!["read_file"]);
    }

    #[test]
    fn builtins_register_themselves() {
        let reg = ToolRegistry::with_builtins();
        assert!(reg.get("read_file").is_some());
        assert!(reg.get("write_file").is_some());
        let names: Vec<String> = reg.script_tools().iter().map(|e| e.name.clone()).collect();
        assert!(names.contains(&"read_file".to_string()));
    }
}
