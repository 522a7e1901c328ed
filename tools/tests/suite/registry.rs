//! The registry's rules (SPEC §7), exercised through its public API with real handlers,
//! real threads and real tokio runtimes.
// Helpers outside `#[test]` fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use vibeos_tools::{
    Availability, CallStatus, CheckFn, ExecuteCodeSettings, HookDecision, OverridePolicy,
    RegistrationError, ToolCall, ToolContext, ToolEntry, ToolError, ToolRegistry, ToolSource,
    Toolset, ToolsetError, ToolsetSelection,
};

fn obj() -> Value {
    json!({"type": "object", "properties": {}})
}

fn tool(name: &str, toolset: &str) -> ToolEntry {
    let n = name.to_string();
    ToolEntry::new(
        name,
        toolset,
        format!("The {name} tool.\nMore."),
        obj(),
        move |_, _| Ok(json!({ "tool": n })),
    )
}

/// The stub generated for `reg`'s script tools, as execute_code makes it.
fn stub_for_scripts(reg: &ToolRegistry) -> vibeos_rpc::GeneratedStub {
    vibeos_rpc::generate_stub(
        &reg.script_tools()
            .iter()
            .map(|e| vibeos_rpc::StubTool {
                name: e.name.clone(),
                description: e.description.clone(),
                parameters: e.script_schema(),
            })
            .collect::<Vec<_>>(),
    )
}

fn ctx() -> ToolContext {
    ToolContext::agent("/")
}

fn call(reg: &ToolRegistry, name: &str, args: Value) -> Value {
    serde_json::from_str(&reg.handle_function_call(name, &args, &ctx())).unwrap()
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn names(defs: &[Value]) -> Vec<String> {
    defs.iter()
        .map(|d| d["function"]["name"].as_str().unwrap().to_string())
        .collect()
}

/// A registry shaped like the product: file, terminal, web and code_execution tools.
fn product() -> ToolRegistry {
    let reg = ToolRegistry::new();
    for (n, t) in [
        ("read_file", "file"),
        ("write_file", "file"),
        ("search_files", "file"),
        ("patch", "file"),
        ("terminal", "terminal"),
        ("web_search", "web"),
        ("web_extract", "web"),
        ("execute_code", "code_execution"),
        ("todo", "todo"),
    ] {
        reg.register(tool(n, t)).unwrap();
    }
    reg
}

#[test]
fn enabled_disabled_and_neither() {
    let reg = product();
    let all = names(&reg.get_tool_definitions(&[], &[]).unwrap());
    assert_eq!(all.len(), 9);
    let only = names(&reg.get_tool_definitions(&s(&["web"]), &[]).unwrap());
    assert_eq!(only, s(&["web_extract", "web_search"]));
    let minus = names(&reg.get_tool_definitions(&[], &s(&["file", "web"])).unwrap());
    assert_eq!(minus, s(&["execute_code", "terminal", "todo"]));
    let both = names(
        &reg.get_tool_definitions(&s(&["coding"]), &s(&["terminal"]))
            .unwrap(),
    );
    assert!(!both.contains(&"terminal".to_string()));
    assert!(both.contains(&"read_file".to_string()));
    // Definitions are OpenAI function-calling schemas.
    let d = &reg.get_tool_definitions(&s(&["terminal"]), &[]).unwrap()[0];
    assert_eq!(d["type"], "function");
    assert_eq!(d["function"]["parameters"], obj());
}

#[test]
fn composites_of_composites_and_presets_resolve_recursively() {
    let reg = product();
    // vibeos-core = coding (file, terminal, code_execution) + research (web, file).
    let core = reg.resolve_toolset("vibeos-core").unwrap();
    for t in [
        "read_file",
        "patch",
        "terminal",
        "web_search",
        "execute_code",
    ] {
        assert!(core.contains(t), "{t} missing from {core:?}");
    }
    assert!(!core.contains("todo"));
    let cli = reg.resolve_toolset("vibeos-cli").unwrap();
    assert!(cli.contains("todo") && cli.contains("delegate_task") && cli.contains("web_extract"));
    for preset in ["vibeos-telegram", "vibeos-acp", "vibeos-api-server"] {
        assert!(reg.resolve_toolset(preset).unwrap().contains("read_file"));
    }
    let defs = names(&reg.get_tool_definitions(&s(&["vibeos-core"]), &[]).unwrap());
    assert_eq!(defs.len(), 8);
}

#[test]
fn legacy_names_map_to_modern_toolsets() {
    let reg = product();
    assert_eq!(
        reg.resolve_toolset("file_tools").unwrap(),
        reg.resolve_toolset("file").unwrap()
    );
    let defs = names(
        &reg.get_tool_definitions(&s(&["web_tools", "terminal_tools"]), &[])
            .unwrap(),
    );
    assert_eq!(defs, s(&["terminal", "web_extract", "web_search"]));
    // An implicit toolset (from a tool's own `toolset` field) also has a legacy spelling.
    reg.register(tool("gizmo", "gadgets")).unwrap();
    assert_eq!(
        names(
            &reg.get_tool_definitions(&s(&["gadgets_tools"]), &[])
                .unwrap()
        ),
        s(&["gizmo"])
    );
}

#[test]
fn unknown_toolsets_are_an_error_naming_the_valid_ones() {
    let reg = product();
    let err = reg.get_tool_definitions(&s(&["nope"]), &[]).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("unknown toolset `nope`"), "{text}");
    assert!(
        text.contains("file") && text.contains("vibeos-cli"),
        "{text}"
    );
    assert!(matches!(
        reg.get_tool_definitions(&[], &s(&["bogus"])),
        Err(ToolsetError::Unknown { .. })
    ));
}

/// `[""]` (what `--enable-toolsets ''` and the Python package's `[""]` pass) was taken for no
/// selection and returned every tool, terminal included: an empty name is an error in either
/// list, and an empty list still selects everything.
#[test]
fn an_empty_toolset_name_is_an_error_not_every_tool() {
    let reg = product();
    for (enabled, disabled, list) in [
        (s(&[""]), vec![], "enabled"),
        (s(&["", ""]), vec![], "enabled"),
        (s(&["web", " "]), vec![], "enabled"),
        (vec![], s(&[""]), "disabled"),
        (s(&["web"]), s(&["file", ""]), "disabled"),
    ] {
        let err = reg.get_tool_definitions(&enabled, &disabled).unwrap_err();
        assert!(
            matches!(err, ToolsetError::EmptyName { list: l } if l == list),
            "{enabled:?} {disabled:?}: {err}"
        );
        assert!(err.to_string().contains("empty toolset name"), "{err}");
        assert!(reg.tool_report(&enabled, &disabled).is_err());
        assert!(reg.select_tools(&enabled, &disabled).is_err());
    }
    // Names are still trimmed, and no list at all is every tool.
    assert_eq!(
        names(&reg.get_tool_definitions(&s(&[" web "]), &[]).unwrap()),
        s(&["web_extract", "web_search"])
    );
    assert_eq!(reg.get_tool_definitions(&[], &[]).unwrap().len(), 9);
    assert!(!vibeos_tools::ToolsetSelection {
        enabled: Some(s(&[""])),
        disabled: vec![],
    }
    .is_everything());
}

#[test]
fn cycles_are_an_error_not_a_hang() {
    let reg = product();
    reg.add_toolset(Toolset::new("a", "A", &[], &["b"]))
        .unwrap();
    let err = reg
        .add_toolset(Toolset::new("b", "B", &[], &["a"]))
        .unwrap_err();
    assert!(matches!(err, ToolsetError::Cycle { .. }), "{err}");
    assert!(err.to_string().contains("a → b → a") || err.to_string().contains("b → a → b"));
    // Refused definitions leave nothing behind: `a` includes a `b` that does not exist, which
    // resolves to nothing rather than failing.
    assert!(reg.resolve_toolset("a").unwrap().is_empty());
    assert!(matches!(
        reg.resolve_toolset("b"),
        Err(ToolsetError::Unknown { .. })
    ));
    // A self-including toolset is refused too.
    assert!(matches!(
        reg.add_toolset(Toolset::new("selfish", "", &[], &["selfish"])),
        Err(ToolsetError::Cycle { .. })
    ));
    // Static toolsets cannot be redefined at run time.
    assert!(matches!(
        reg.add_toolset(Toolset::new("file", "", &["x"], &[])),
        Err(ToolsetError::Static(_))
    ));
}

/// A tool's toolset name may not be one that already means another toolset: registering
/// `in_filetools` into `file_tools` used to make `file_tools` select only that tool (the legacy
/// name of `file` was lost), and registering into `vibeos-cli` silently added the tool to the
/// preset. Both are refused naming the reserved name; the bundles stay open.
#[test]
fn toolset_names_that_mean_another_toolset_are_reserved() {
    let reg = product();
    let before = names(&reg.get_tool_definitions(&s(&["file_tools"]), &[]).unwrap());
    assert!(before.contains(&"read_file".to_string()), "{before:?}");
    for (toolset, says) in [
        ("file_tools", "alias of toolset `file`"),
        ("code_tools", "alias of toolset `code_execution`"),
        ("web_tools", "alias of toolset `web`"),
        (
            "research_tools",
            "legacy spelling of the built-in toolset `research`",
        ),
        ("vibeos-cli", "built-in composite toolset"),
        ("vibeos-core", "built-in composite toolset"),
        ("coding", "built-in composite toolset"),
    ] {
        let err = reg.register(tool("in_reserved", toolset)).unwrap_err();
        assert!(
            matches!(&err, RegistrationError::ReservedToolset { toolset: t, .. } if t == toolset),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.contains(&format!("toolset `{toolset}`: the name is reserved"))
                && text.contains(says),
            "{text}"
        );
        // Not with override either: the name is the problem, not a tool it shadows.
        assert!(reg
            .register_with_override(tool("in_reserved", toolset), true)
            .is_err());
        assert!(reg.get("in_reserved").is_none());
    }
    assert_eq!(
        names(&reg.get_tool_definitions(&s(&["file_tools"]), &[]).unwrap()),
        before
    );
    assert!(
        !names(&reg.get_tool_definitions(&s(&["vibeos-cli"]), &[]).unwrap())
            .contains(&"in_reserved".to_string())
    );
    // An alias added at run time is reserved too, for tools and for toolsets.
    reg.add_toolset_alias("files", "file").unwrap();
    assert!(matches!(
        reg.register(tool("in_files", "files")),
        Err(RegistrationError::ReservedToolset { .. })
    ));
    let err = reg
        .add_toolset(Toolset::new("file_tools", "", &["x"], &[]))
        .unwrap_err();
    assert!(matches!(err, ToolsetError::Reserved { .. }), "{err}");
    assert!(err.to_string().contains("alias of toolset `file`"), "{err}");
    // Bundles are open (a host replaces a built-in in place), and so is any other name.
    reg.register(tool("read_file", "file")).unwrap();
    reg.register(tool("mine", "my_tools")).unwrap();
    assert_eq!(
        names(&reg.get_tool_definitions(&s(&["my_tools"]), &[]).unwrap()),
        s(&["mine"])
    );
}

#[test]
fn dynamic_toolsets_of_mcp_servers_and_plugins() {
    let reg = product();
    let failures = reg
        .register_dynamic_toolset(
            "mcp-github",
            "GitHub MCP server",
            ToolSource::Mcp("github".into()),
            vec![
                tool("gh_issue", "ignored"),
                tool("gh_pr", "ignored"),
                tool("bad name", "ignored"),
            ],
        )
        .unwrap();
    assert_eq!(failures.len(), 1);
    assert_eq!(reg.get("gh_issue").unwrap().toolset, "mcp-github");
    assert_eq!(
        names(&reg.get_tool_definitions(&s(&["mcp-github"]), &[]).unwrap()),
        s(&["gh_issue", "gh_pr"])
    );
    assert!(reg.is_toolset_available("mcp-github").unwrap());
    assert!(reg.toolset_names().contains(&"mcp-github".to_string()));
    // A composite over a dynamic toolset.
    reg.add_toolset(Toolset::new("dev", "", &[], &["mcp-github", "file_tools"]))
        .unwrap();
    assert!(reg.resolve_toolset("dev").unwrap().contains("gh_pr"));
    let gone = reg.remove_toolset("mcp-github").unwrap();
    assert_eq!(gone, s(&["gh_issue", "gh_pr"]));
    assert!(reg.get("gh_pr").is_none());
    // A composite whose dynamic member went away still resolves to the rest.
    reg.add_toolset_alias("gh", "dev").unwrap();
    let dev = reg.resolve_toolset("gh").unwrap();
    assert!(dev.contains("read_file") && !dev.contains("gh_pr"));
}

#[test]
fn plugins_may_not_replace_builtins_unless_the_policy_allows() {
    let reg = product();
    let plugin = ToolSource::Plugin("fancy".into());
    let err = reg
        .register(tool("read_file", "fancy").with_source(plugin.clone()))
        .unwrap_err();
    assert!(matches!(err, RegistrationError::OverrideRefused { .. }));
    assert!(err.to_string().contains("`read_file`") && err.to_string().contains("plugin `fancy`"));
    assert_eq!(reg.get("read_file").unwrap().toolset, "file");
    reg.set_override_policy(
        OverridePolicy::default()
            .allow_name("read_file")
            .allow_namespace("web_"),
    );
    reg.register(tool("read_file", "fancy").with_source(plugin.clone()))
        .unwrap();
    reg.register(tool("web_search", "fancy").with_source(plugin.clone()))
        .unwrap();
    assert!(reg
        .register(tool("terminal", "fancy").with_source(plugin.clone()))
        .is_err());
    reg.set_override_policy(OverridePolicy::default().allow_source("fancy"));
    reg.register(tool("terminal", "fancy").with_source(plugin.clone()))
        .unwrap();
    // A plugin shadowing another plugin's tool of a different toolset needs override; a
    // built-in taking its name back does too.
    let other = ToolSource::Plugin("other".into());
    assert!(matches!(
        reg.register(tool("terminal", "other").with_source(other.clone())),
        Err(RegistrationError::ShadowRefused { .. })
    ));
    reg.register_with_override(tool("terminal", "other").with_source(other), true)
        .unwrap();
    assert_eq!(reg.get("terminal").unwrap().toolset, "other");
    assert!(reg.register(tool("terminal", "terminal")).is_err());
    reg.register_with_override(tool("terminal", "terminal"), true)
        .unwrap();
    assert_eq!(reg.get("terminal").unwrap().source, ToolSource::Builtin);
}

#[test]
fn same_toolset_replaces_cross_toolset_needs_override() {
    let reg = product();
    let host = ToolSource::Host("python".into());
    // Same toolset: the last registration wins, from a host too.
    reg.register(tool("web_search", "web").with_source(host.clone()))
        .unwrap();
    assert_eq!(reg.get("web_search").unwrap().source, host);
    // Another toolset: refused, the registered tool stays, the message says what to do.
    let err = reg
        .register(tool("web_search", "my_research").with_source(host.clone()))
        .unwrap_err();
    assert!(matches!(err, RegistrationError::ShadowRefused { .. }));
    let msg = err.to_string();
    assert!(msg.contains("`web`") && msg.contains("override"), "{msg}");
    assert_eq!(reg.get("web_search").unwrap().toolset, "web");
    // With override it shadows.
    reg.register_with_override(tool("web_search", "my_research").with_source(host), true)
        .unwrap();
    assert_eq!(reg.get("web_search").unwrap().toolset, "my_research");
    // MCP-to-MCP overwrites are allowed across servers' toolsets.
    reg.register(tool("lookup", "mcp-a").with_source(ToolSource::Mcp("a".into())))
        .unwrap();
    reg.register(tool("lookup", "mcp-b").with_source(ToolSource::Mcp("b".into())))
        .unwrap();
    assert_eq!(reg.get("lookup").unwrap().toolset, "mcp-b");
    // Plugin policy unchanged: a plugin cannot replace a built-in even in its toolset.
    assert!(matches!(
        reg.register(tool("read_file", "file").with_source(ToolSource::Plugin("p".into()))),
        Err(RegistrationError::OverrideRefused { .. })
    ));
}

#[test]
fn agent_loop_tools_have_schemas_but_are_refused_at_dispatch() {
    let reg = ToolRegistry::with_builtins();
    let preset = reg.resolve_toolset("vibeos-cli").unwrap();
    let defs = reg.get_tool_definitions(&s(&["vibeos-cli"]), &[]).unwrap();
    let offered = names(&defs);
    for name in ["todo", "memory", "session_search", "delegate_task"] {
        assert!(preset.contains(name));
        assert!(
            offered.iter().any(|n| n == name),
            "{name} not offered: {offered:?}"
        );
        let entry = reg.get(name).unwrap();
        assert!(
            entry.schema["properties"].is_object(),
            "{name} has no schema"
        );
        let out = call(&reg, name, json!({}));
        assert!(
            out["error"]
                .as_str()
                .unwrap()
                .contains("handled by the agent loop"),
            "{out}"
        );
    }
}

#[test]
fn failing_panicking_and_hanging_checks_mean_unavailable() {
    let reg = product();
    reg.set_check_timeout(Duration::from_millis(300));
    reg.register(tool("off", "checks").with_check(|| false))
        .unwrap();
    reg.register(
        tool("raises", "checks")
            .with_check(|| panic!("no credentials configured"))
            .with_requires_env(&["VIBEOS_TEST_SURELY_UNSET_VAR", "PATH"]),
    )
    .unwrap();
    reg.register(tool("hangs", "checks").with_check(|| {
        std::thread::sleep(Duration::from_secs(3));
        true
    }))
    .unwrap();
    reg.register(tool("on", "checks").with_check(|| true))
        .unwrap();
    let report = reg.tool_report(&s(&["checks"]), &[]).unwrap();
    let why = |n: &str| {
        report
            .iter()
            .find(|r| r.name == n)
            .map(|r| r.availability.clone())
            .unwrap()
    };
    assert_eq!(why("on"), Availability::Available);
    assert_eq!(why("off"), Availability::Unavailable("check failed".into()));
    let Availability::Unavailable(r) = why("raises") else {
        panic!()
    };
    assert!(r.contains("no credentials configured"), "{r}");
    assert!(
        r.contains("missing env: VIBEOS_TEST_SURELY_UNSET_VAR"),
        "{r}"
    );
    assert!(!r.contains("PATH"), "{r}");
    let Availability::Unavailable(r) = why("hangs") else {
        panic!()
    };
    assert!(r.contains("did not finish within 0.3s"), "{r}");
    // The stuck check is not started again while it is still running.
    let report = reg.tool_report(&s(&["checks"]), &[]).unwrap();
    let again = report.iter().find(|r| r.name == "hangs").unwrap();
    assert!(
        matches!(&again.availability, Availability::Unavailable(r) if r.contains("still running")),
        "{:?}",
        again.availability
    );
    let defs = names(&reg.get_tool_definitions(&s(&["checks"]), &[]).unwrap());
    assert_eq!(defs, s(&["on"]));
    assert!(reg.is_toolset_available("checks").unwrap());
    reg.add_toolset(Toolset::new("dead", "", &["off", "raises"], &[]))
        .unwrap();
    assert!(!reg.is_toolset_available("dead").unwrap());
}

#[test]
fn an_empty_enabled_list_selects_no_tool() {
    // SPEC §7: enabled → only those; an empty enabled list is "none of them". The Python
    // package's `enabled_toolsets=[]` got every tool, `terminal` included.
    let reg = product();
    let none = ToolsetSelection {
        enabled: Some(vec![]),
        disabled: vec![],
    };
    assert!(!none.is_everything());
    assert!(reg.select_toolsets(&none).unwrap().is_empty());
    let settings = ExecuteCodeSettings::default();
    assert!(reg
        .get_tool_definitions_for(&none, &settings)
        .unwrap()
        .is_empty());
    // No enabled list is every toolset; a list keeps its toolsets, minus the disabled ones.
    let every = ToolsetSelection::default();
    assert!(every.is_everything());
    assert_eq!(
        reg.get_tool_definitions_for(&every, &settings)
            .unwrap()
            .len(),
        9
    );
    let web = ToolsetSelection {
        enabled: Some(s(&["web", "file"])),
        disabled: s(&["file"]),
    };
    assert_eq!(
        names(&reg.get_tool_definitions_for(&web, &settings).unwrap()),
        s(&["web_extract", "web_search"])
    );
    // The flags' form: an absent flag is an empty list, which selects every toolset.
    assert!(ToolsetSelection::from_lists(&[], &[]).is_everything());
    assert_eq!(reg.select_tools(&[], &[]).unwrap().len(), 9);
}

#[test]
fn a_direct_call_of_an_unavailable_tool_is_refused_with_why() {
    // SPEC §7: check_fn gates availability. Tools left out of the definitions still ran when a
    // host called them by name.
    let reg = product();
    // Room for a panicking check's backtrace to be printed (RUST_BACKTRACE); shortened below.
    reg.set_check_timeout(Duration::from_secs(10));
    let ran = Arc::new(AtomicUsize::new(0));
    let counting = |name: &str, ran: &Arc<AtomicUsize>| {
        let ran = Arc::clone(ran);
        ToolEntry::new(name, "checks", "", obj(), move |_, _| {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok(json!({"ran": true}))
        })
    };
    reg.register(counting("off", &ran).with_check(|| false))
        .unwrap();
    reg.register(
        counting("raises", &ran)
            .with_check(|| panic!("no credentials configured"))
            .with_requires_env(&["VIBEOS_TEST_SURELY_UNSET_VAR"]),
    )
    .unwrap();
    reg.register(counting("instant_off", &ran).with_instant_check(|| false))
        .unwrap();
    reg.register(counting("on", &ran).with_check(|| true))
        .unwrap();
    let report = reg.tool_report(&s(&["checks"]), &[]).unwrap();
    for name in ["off", "raises", "instant_off"] {
        let listed = report.iter().find(|r| r.name == name).unwrap();
        let Availability::Unavailable(why) = &listed.availability else {
            panic!("{name} is available")
        };
        // The words `tools list` shows: `unavailable: <why>`.
        assert_eq!(
            call(&reg, name, json!({})),
            json!({ "error": format!("Error executing {name}: unavailable: {why}") }),
            "{name}"
        );
    }
    let out = call(&reg, "raises", json!({}));
    let text = out["error"].as_str().unwrap();
    assert!(
        text.contains("check raised an error: no credentials configured")
            && text.contains("missing env: VIBEOS_TEST_SURELY_UNSET_VAR"),
        "{text}"
    );
    // A hung check is bounded by the check timeout, then not started again.
    reg.set_check_timeout(Duration::from_millis(300));
    reg.register(counting("hangs", &ran).with_check(|| {
        std::thread::sleep(Duration::from_secs(2));
        true
    }))
    .unwrap();
    let started = std::time::Instant::now();
    let out = call(&reg, "hangs", json!({}));
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert!(
        out["error"]
            .as_str()
            .unwrap()
            .contains("did not finish within 0.3s"),
        "{out}"
    );
    let out = call(&reg, "hangs", json!({}));
    assert!(
        out["error"].as_str().unwrap().contains("still running"),
        "{out}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0, "an unavailable tool ran");
    assert_eq!(call(&reg, "on", json!({})), json!({"ran": true}));
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    // A refused call is a refusal, not a call: the batch path refuses it the same way.
    let batch = reg.handle_function_calls(
        &[
            ToolCall::new("off", json!({})),
            ToolCall::new("on", json!({})),
        ],
        &ctx(),
    );
    assert!(
        batch[0].contains("unavailable: check failed"),
        "{}",
        batch[0]
    );
    assert_eq!(batch[1], r#"{"ran":true}"#);
    // Script calls are not checked again: the execution's tools were checked when it started.
    let mut script = ctx();
    script.origin = vibeos_tools::CallOrigin::Script;
    let out: Value =
        serde_json::from_str(&reg.handle_function_call("off", &json!({}), &script)).unwrap();
    assert_eq!(out, json!({"ran": true}));
    // An MCP tool's check mirrors its server's state; its handler says why itself.
    reg.register(
        counting("remote", &ran)
            .with_check(|| false)
            .with_source(ToolSource::Mcp("srv".into())),
    )
    .unwrap();
    assert_eq!(call(&reg, "remote", json!({})), json!({"ran": true}));
}

#[test]
fn a_shared_check_runs_once_per_build() {
    let reg = product();
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let shared: CheckFn = Arc::new(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        true
    });
    for n in ["s1", "s2", "s3", "s4"] {
        reg.register(tool(n, "shared").with_shared_check(&shared))
            .unwrap();
    }
    let defs = reg.get_tool_definitions(&s(&["shared"]), &[]).unwrap();
    assert_eq!(defs.len(), 4);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Results are cached per build, not forever.
    reg.get_tool_definitions(&[], &[]).unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(reg.is_toolset_available("shared").unwrap());
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[test]
fn execute_code_schema_lists_only_surviving_script_tools() {
    let reg = product();
    reg.register(tool("terminal", "terminal").with_check(|| false))
        .unwrap();
    let mut read_file = tool("read_file", "file");
    read_file.schema = json!({"type": "object", "properties": {
        "path": {"type": "string"}, "offset": {"type": "integer", "default": 1}},
        "required": ["path"]});
    read_file.description = "Read a text file as numbered lines.\nDetails.".into();
    reg.register(read_file).unwrap();
    let settings = ExecuteCodeSettings {
        mode: "strict".into(),
        cwd: None,
        timeout: Duration::from_secs(42),
        max_tool_calls: 7,
        strict_terminal: false,
        strict_plugin_tools: false,
        stdout_limit: 20 * 1024,
    };
    let defs = reg
        .get_tool_definitions_with(
            &s(&["file", "code_execution", "terminal"]),
            &s(&["web"]),
            &settings,
        )
        .unwrap();
    let exec = defs
        .iter()
        .find(|d| d["function"]["name"] == "execute_code")
        .unwrap();
    let desc = exec["function"]["description"].as_str().unwrap();
    assert!(desc.starts_with("The execute_code tool."), "{desc}");
    assert!(
        desc.contains("from vibeos_tools import read_file, write_file, search_files, patch`"),
        "{desc}"
    );
    assert!(
        desc.contains("- read_file(path, offset=1): Read a text file as numbered lines."),
        "{desc}"
    );
    assert!(
        !desc.contains("terminal"),
        "unavailable tool offered: {desc}"
    );
    assert!(
        !desc.contains("web_search"),
        "unselected tool offered: {desc}"
    );
    assert!(desc.contains("Mode strict"), "{desc}");
    assert!(
        desc.contains("killed after 42s") && desc.contains("at most 7 tool calls"),
        "{desc}"
    );
    assert!(desc.contains("stdout is capped at 20 KB"), "{desc}");

    let project = ExecuteCodeSettings {
        cwd: Some("/srv/proj".into()),
        ..ExecuteCodeSettings::default()
    };
    let defs = reg
        .get_tool_definitions_with(&s(&["code_execution"]), &[], &project)
        .unwrap();
    let desc = defs[0]["function"]["description"].as_str().unwrap();
    assert!(desc.contains("No tools are available to scripts"), "{desc}");
    assert!(!desc.contains("import read_file"), "{desc}");
    assert!(
        desc.contains("Mode project") && desc.contains("/srv/proj"),
        "{desc}"
    );
    assert!(desc.contains("killed after 300s") && desc.contains("at most 50 tool calls"));
    assert!(desc.contains("stdout is capped at 50 KB"), "{desc}");
    // The registered entry itself is untouched.
    assert_eq!(
        reg.get("execute_code").unwrap().description,
        "The execute_code tool.\nMore."
    );
}

#[test]
fn arguments_are_coerced_to_the_schema_types() {
    let reg = ToolRegistry::new();
    reg.register(ToolEntry::new(
        "typed",
        "t",
        "Typed.",
        json!({"type": "object", "properties": {
            "n": {"type": "integer"}, "b": {"type": "boolean"}, "s": {"type": "string"}}}),
        |args: &Map<String, Value>, _: &ToolContext| Ok(Value::Object(args.clone())),
    ))
    .unwrap();
    assert_eq!(
        call(&reg, "typed", json!({"n": "5", "b": "true", "s": 12})),
        json!({"n": 5, "b": true, "s": "12"})
    );
    assert_eq!(
        call(&reg, "typed", json!({"n": "five"}))["error"],
        "Tool execution failed: InvalidArguments: argument `n` must be an integer, got \"five\""
    );
}

#[test]
fn both_error_layers_and_agent_loop_refusal() {
    let reg = product();
    reg.register(ToolEntry::new("fails", "t", "F.", obj(), |_, _| {
        Err(ToolError::new("PermissionDenied", "/etc/shadow: denied"))
    }))
    .unwrap();
    assert_eq!(
        call(&reg, "fails", json!({}))["error"],
        "Tool execution failed: PermissionDenied: /etc/shadow: denied"
    );
    assert_eq!(
        call(&reg, "fails", json!("x"))["error"],
        "Error executing fails: arguments must be a JSON object, got a string"
    );
    for t in ["todo", "memory", "session_search", "delegate_task"] {
        let e = call(&reg, t, json!({}));
        assert_eq!(
            e["error"],
            format!("Error executing {t}: `{t}` is handled by the agent loop and cannot be dispatched as a tool")
        );
    }
    // A hook that panics is outside the handler: the outer layer would wrap anything that
    // escaped; a panicking pre-hook fails closed instead.
    reg.add_pre_tool_call_hook(|c| {
        if c.name == "terminal" {
            panic!("policy broke")
        }
        HookDecision::Continue
    });
    let e = call(&reg, "terminal", json!({}));
    assert!(e["error"].as_str().unwrap().contains("policy broke"), "{e}");
}

#[test]
fn pre_hooks_may_block_and_post_hooks_see_every_call() {
    let reg = product();
    type Seen = Vec<(String, CallStatus, Duration, String)>;
    let seen: Arc<Mutex<Seen>> = Default::default();
    let log = Arc::clone(&seen);
    reg.add_pre_tool_call_hook(|c| {
        if c.name == "terminal" && c.ctx.task_id.as_deref() == Some("locked") {
            HookDecision::Block("terminal is disabled for this task".into())
        } else {
            HookDecision::Continue
        }
    });
    reg.add_post_tool_call_hook(move |c| {
        log.lock().unwrap().push((
            c.name.to_string(),
            c.status,
            c.duration,
            c.result.to_string(),
        ))
    });
    let mut locked = ctx();
    locked.task_id = Some("locked".into());
    let out: Value =
        serde_json::from_str(&reg.handle_function_call("terminal", &json!({}), &locked)).unwrap();
    assert_eq!(
        out["error"],
        "Blocked by pre_tool_call hook: terminal is disabled for this task"
    );
    assert_eq!(
        call(&reg, "terminal", json!({})),
        json!({"tool": "terminal"})
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].0, "terminal");
    assert_eq!(seen[0].1, CallStatus::Blocked);
    assert!(seen[0].3.contains("Blocked by pre_tool_call hook"));
    assert_eq!(seen[1].1, CallStatus::Success);
    assert!(seen[1].2 > Duration::ZERO);
}

#[test]
fn text_results_that_are_not_json_are_wrapped() {
    let reg = ToolRegistry::new();
    reg.register(ToolEntry::new_text("plain", "t", "P.", obj(), |_, _| {
        Ok("just words".into())
    }))
    .unwrap();
    reg.register(ToolEntry::new_text("jsonish", "t", "J.", obj(), |_, _| {
        Ok("{\"ok\": 1}".into())
    }))
    .unwrap();
    let out = call(&reg, "plain", json!({}));
    assert_eq!(out["result"], "just words");
    assert!(out["note"].as_str().unwrap().contains("not JSON"));
    assert_eq!(
        reg.handle_function_call("jsonish", &json!({}), &ctx()),
        "{\"ok\": 1}"
    );
}

fn async_registry() -> ToolRegistry {
    let reg = ToolRegistry::new();
    reg.register(ToolEntry::new_async(
        "slow_echo",
        "async",
        "Async echo.",
        json!({"type": "object", "properties": {"x": {"type": "integer"}}}),
        |args, ctx| async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if args.get("x") == Some(&json!(-1)) {
                return Err(ToolError::new("Negative", "x is -1"));
            }
            if args.get("x") == Some(&json!(-2)) {
                panic!("async handler exploded");
            }
            Ok(json!({"x": args.get("x"), "task": ctx.task_id}))
        },
    ))
    .unwrap();
    reg
}

#[test]
fn async_handlers_work_from_sync_code() {
    let reg = async_registry();
    assert!(reg.get("slow_echo").unwrap().is_async);
    assert_eq!(
        call(&reg, "slow_echo", json!({"x": "3"})),
        json!({"x": 3, "task": null})
    );
    assert_eq!(
        call(&reg, "slow_echo", json!({"x": -1}))["error"],
        "Tool execution failed: Negative: x is -1"
    );
    assert_eq!(
        call(&reg, "slow_echo", json!({"x": -2}))["error"],
        "Tool execution failed: Panic: async handler exploded"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn async_handlers_work_inside_a_current_thread_runtime() {
    let reg = async_registry();
    assert_eq!(call(&reg, "slow_echo", json!({"x": 1}))["x"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_handlers_work_inside_a_multi_thread_runtime() {
    let reg = async_registry();
    assert_eq!(call(&reg, "slow_echo", json!({"x": 2}))["x"], 2);
}

#[test]
fn async_handlers_work_from_many_threads() {
    let reg = async_registry();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let reg = &reg;
                s.spawn(move || call(reg, "slow_echo", json!({"x": i}))["x"].clone())
            })
            .collect();
        for (i, h) in handles.into_iter().enumerate() {
            assert_eq!(h.join().unwrap(), json!(i));
        }
    });
}

fn concurrency_registry(second_safe: bool) -> (ToolRegistry, Arc<AtomicUsize>) {
    let reg = ToolRegistry::new();
    let active = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    for (name, safe) in [("p1", true), ("p2", second_safe)] {
        let (active, peak) = (Arc::clone(&active), Arc::clone(&peak));
        reg.register(
            ToolEntry::new(
                name,
                "par",
                "P.",
                json!({"type": "object", "properties": {"i": {"type": "integer"}}}),
                move |args, _| {
                    let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(60));
                    active.fetch_sub(1, Ordering::SeqCst);
                    Ok(json!({"i": args.get("i")}))
                },
            )
            .with_parallel_safe(safe),
        )
        .unwrap();
    }
    (reg, peak)
}

#[test]
fn a_turn_runs_in_parallel_only_when_every_tool_allows_it() {
    let calls: Vec<ToolCall> = (0..6)
        .map(|i| ToolCall::new(if i % 2 == 0 { "p1" } else { "p2" }, json!({"i": i})))
        .collect();
    let (reg, peak) = concurrency_registry(true);
    let out = reg.handle_function_calls(&calls, &ctx());
    assert!(
        peak.load(Ordering::SeqCst) > 1,
        "parallel-safe batch ran serially"
    );
    for (i, r) in out.iter().enumerate() {
        assert_eq!(serde_json::from_str::<Value>(r).unwrap(), json!({"i": i}));
    }
    let (reg, peak) = concurrency_registry(false);
    let out = reg.handle_function_calls(&calls, &ctx());
    assert_eq!(
        peak.load(Ordering::SeqCst),
        1,
        "unsafe tool ran in parallel"
    );
    for (i, r) in out.iter().enumerate() {
        assert_eq!(serde_json::from_str::<Value>(r).unwrap(), json!({"i": i}));
    }
}

#[test]
fn malformed_schemas_are_rejected_with_the_tool_name() {
    let reg = ToolRegistry::new();
    let mut bad = tool("oddly_typed", "t");
    bad.schema = json!({"type": "object", "properties": {"n": {"type": "int"}}});
    let err = reg.register(bad).unwrap_err().to_string();
    assert!(
        err.contains("`oddly_typed`") && err.contains("\"int\""),
        "{err}"
    );
    let mut bad = tool("prop_not_object", "t");
    bad.schema = json!({"type": "object", "properties": {"n": 3}});
    assert!(reg
        .register(bad)
        .unwrap_err()
        .to_string()
        .contains("`prop_not_object`"));
    assert!(reg.register(tool("ok", "bad toolset name")).is_err());
}

#[test]
fn only_tools_the_stub_can_define_are_script_tools_and_described_with_its_names() {
    let reg = product();
    // Names the stub cannot define are refused when a host opens them, naming why.
    for bad in [
        "with-dash",
        "1abc",
        "class",
        "json_parse",
        "retry",
        "_hidden",
    ] {
        reg.register(tool(bad, "host")).unwrap();
        let err = reg.allow_in_scripts(bad).unwrap_err();
        assert!(
            matches!(&err, RegistrationError::NotScriptCallable { name, .. } if name == bad),
            "{err}"
        );
        assert!(
            err.to_string().contains("vibeos_tools cannot define it"),
            "{err}"
        );
    }
    // An operator-opened MCP server's tool under such a name is left out everywhere too.
    reg.register(tool("srv-lookup", "mcp-srv").with_source(ToolSource::Mcp("srv".into())))
        .unwrap();
    reg.register(tool("srv_find", "mcp-srv").with_source(ToolSource::Mcp("srv".into())))
        .unwrap();
    reg.allow_mcp_server_in_scripts("srv", None);
    // Schema names that are not identifiers: the stub calls them `class_` and `a_b`.
    let mut k = tool("k", "host");
    k.schema = json!({"type": "object", "properties": {
        "class": {"type": "string"}, "a-b": {"type": "integer"}}, "required": ["a-b"]});
    reg.register(k).unwrap();
    reg.allow_in_scripts("k").unwrap();

    let listed = reg.script_tool_names();
    assert!(listed.contains(&"srv_find".to_string()), "{listed:?}");
    assert!(!listed.contains(&"srv-lookup".to_string()), "{listed:?}");
    let scripts: Vec<String> = reg.script_tools().iter().map(|e| e.name.clone()).collect();
    assert!(
        scripts.contains(&"k".to_string()) && scripts.contains(&"srv_find".to_string()),
        "{scripts:?}"
    );
    let defs = reg.get_tool_definitions(&[], &[]).unwrap();
    let desc = defs
        .iter()
        .find(|d| d["function"]["name"] == "execute_code")
        .unwrap()["function"]["description"]
        .as_str()
        .unwrap()
        .to_string();
    let import_line = desc
        .lines()
        .find(|l| l.contains("from vibeos_tools import"))
        .unwrap();
    for name in ["k", "srv_find", "read_file"] {
        assert!(import_line.contains(name), "{import_line}");
    }
    for bad in [
        "with-dash",
        "1abc",
        "class",
        "json_parse",
        "retry",
        "_hidden",
        "srv-lookup",
    ] {
        assert!(
            !import_line.split(['`', ',', ' ']).any(|w| w == bad),
            "{bad} offered: {import_line}"
        );
    }
    assert!(
        desc.contains("- k(a_b, class_=None): The k tool."),
        "{desc}"
    );
    // The stub generated for the same tools defines exactly them, with those names.
    let stub = stub_for_scripts(&reg);
    assert!(stub.skipped.is_empty(), "{:?}", stub.skipped);
    assert_eq!(stub.tools, scripts);
    assert!(
        stub.source.contains("def k(a_b, class_=None):"),
        "{}",
        stub.source
    );
}

/// The execute_code description and the stub agree on a tool's doc line whatever its
/// description starts with: blank lines and indentation before the first line of text used to
/// leave the description's line empty (`- open_host(): `) while the stub's docstring started
/// with the text.
#[test]
fn the_description_shows_the_doc_line_the_stub_function_has() {
    let reg = product();
    let mut e = tool("open_host", "host");
    e.description = "\n\n  Real first line\nsecond".into();
    reg.register(e).unwrap();
    let mut e = tool("crlf_host", "host");
    e.description = " \r\n\u{2028}\tAfter a separator\r\nnext".into();
    reg.register(e).unwrap();
    reg.allow_in_scripts("open_host").unwrap();
    reg.allow_in_scripts("crlf_host").unwrap();
    let defs = reg.get_tool_definitions(&[], &[]).unwrap();
    let desc = defs
        .iter()
        .find(|d| d["function"]["name"] == "execute_code")
        .unwrap()["function"]["description"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(desc.contains("- open_host(): Real first line\n"), "{desc}");
    assert!(
        desc.contains("- crlf_host(): After a separator\n"),
        "{desc}"
    );
    let stub = stub_for_scripts(&reg);
    assert!(
        stub.source
            .contains("def open_host():\n    \"\"\"Real first line\n    second\"\"\""),
        "{}",
        stub.source
    );
    assert!(
        stub.source
            .contains("def crlf_host():\n    \"\"\"After a separator\n    next\"\"\""),
        "{}",
        stub.source
    );
}

#[test]
fn the_strict_description_says_where_tool_paths_resolve_and_what_an_opened_terminal_is() {
    let reg = product();
    reg.register(tool("terminal", "terminal")).unwrap();
    let describe = |strict_terminal: bool| {
        let settings = ExecuteCodeSettings {
            mode: "strict".into(),
            cwd: Some("/srv/proj".into()),
            strict_terminal,
            ..ExecuteCodeSettings::default()
        };
        let defs = reg
            .get_tool_definitions_with(&s(&["code_execution", "terminal"]), &[], &settings)
            .unwrap();
        let exec = defs
            .iter()
            .find(|d| d["function"]["name"] == "execute_code")
            .unwrap();
        exec["function"]["description"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let closed = describe(false);
    assert!(
        closed.contains("resolve in the session working directory (/srv/proj)"),
        "{closed}"
    );
    assert!(closed.contains("No shell commands"), "{closed}");
    let opened = describe(true);
    assert!(
        opened.contains("its commands run outside the sandbox"),
        "{opened}"
    );
    assert!(!opened.contains("No shell commands"), "{opened}");
}

#[test]
fn a_replaced_entry_can_be_reinstated_as_it_was() {
    let reg = product();
    let builtin = reg.get("read_file").unwrap();
    let mine = ToolEntry::new("read_file", "file", "Mine.", obj(), |_, _| {
        Ok(json!({"mine": 1}))
    })
    .with_source(ToolSource::Host("python".into()));
    let replaced = reg.register_replacing(mine, false).unwrap();
    assert!(Arc::ptr_eq(replaced.as_ref().unwrap(), &builtin));
    assert_eq!(call(&reg, "read_file", json!({}))["mine"], 1);
    let displaced = reg.reinstate(builtin.clone()).unwrap();
    assert_eq!(displaced.description, "Mine.");
    assert!(Arc::ptr_eq(&reg.get("read_file").unwrap(), &builtin));
    // A new name replaces nothing.
    assert!(reg
        .register_replacing(tool("brand_new", "t"), false)
        .unwrap()
        .is_none());
}

#[test]
fn entries_checking_required_refuse_a_call_missing_one_before_the_handler() {
    let reg = ToolRegistry::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let schema = json!({"type": "object", "required": ["city"],
                        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}});
    for (name, check) in [("checked", true), ("unchecked", false)] {
        let seen = calls.clone();
        let mut entry = ToolEntry::new(name, "t", "T.", schema.clone(), move |args, _| {
            seen.fetch_add(1, Ordering::SeqCst);
            Ok(json!({ "args": args }))
        });
        if check {
            entry = entry.checking_required();
        }
        reg.register(entry).unwrap();
    }
    assert_eq!(
        call(&reg, "checked", json!({"days": "3"}))["error"],
        "Tool execution failed: InvalidArguments: missing required argument `city`"
    );
    assert_eq!(
        call(&reg, "checked", json!({"city": null}))["error"],
        "Tool execution failed: InvalidArguments: missing required argument `city`"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // Coerced first: a present argument of the wrong type is the type error.
    assert_eq!(
        call(&reg, "checked", json!({"days": "x"}))["error"],
        "Tool execution failed: InvalidArguments: argument `days` must be an integer, got \"x\""
    );
    assert_eq!(
        call(&reg, "checked", json!({"city": 5}))["args"],
        json!({"city": "5"})
    );
    assert_eq!(call(&reg, "unchecked", json!({}))["args"], json!({}));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
