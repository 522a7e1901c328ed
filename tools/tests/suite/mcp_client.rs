//! The MCP client against real MCP servers (official Python SDK, fixtures/mcp_servers/) started
//! by the tests: registration, calls through `handle_function_call` (the agent path), script
//! gating, crash/restart, hang timeout, garbage, missing command, bad schema, list changes.
//!
//! Needs the test venv's Python with the `mcp` package (scripts/test-all creates it under
//! target/pyvenv); each test skips with a message naming what is missing otherwise.

// A test harness: a panic here is how a failed expectation is reported.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vibeos_tools::mcp_client::{
    McpManager, McpServerConfig, ServerKind, ServerSpec, ServerState, Startup,
};
use vibeos_tools::{ToolContext, ToolRegistry, ToolSource};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

macro_rules! need_python {
    () => {
        match vibeos_testkit::venv_python("mcp.server.mcpserver") {
            Ok(p) => p,
            Err(missing) => {
                vibeos_testkit::skip!("missing {missing}");
            }
        }
    };
}

fn fixture(name: &str) -> String {
    root()
        .join("fixtures/mcp_servers")
        .join(name)
        .display()
        .to_string()
}

fn stdio(python: &std::path::Path, script: &str) -> McpServerConfig {
    McpServerConfig {
        command: Some(python.display().to_string()),
        args: vec![fixture(script)],
        startup: Startup::Eager,
        connect_timeout: Some(20.0),
        ..Default::default()
    }
}

fn spec(name: &str, config: McpServerConfig) -> ServerSpec {
    ServerSpec {
        name: name.into(),
        config,
        env: None,
        kind: ServerKind::Mcp,
        start_hint: None,
    }
}

fn leaked() -> &'static ToolRegistry {
    Box::leak(Box::new(ToolRegistry::new()))
}

fn call(reg: &ToolRegistry, name: &str, args: Value) -> Value {
    let out = reg.handle_function_call(name, &args, &ToolContext::agent("/"));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[test]
fn tools_are_registered_and_called_from_the_agent_path() {
    let py = need_python!();
    let reg = leaked();
    let m = McpManager::start(vec![spec("fx", stdio(&py, "stdio_server.py"))], reg);
    assert!(
        matches!(m.servers()[0].state(), ServerState::Running(n) if n >= 6),
        "{:?}",
        m.servers()[0].state()
    );
    let echo = reg.get("echo").expect("echo registered");
    assert_eq!(echo.toolset, "mcp-fx");
    assert_eq!(echo.source, ToolSource::Mcp("fx".into()));
    assert_eq!(echo.schema["properties"]["text"]["type"], "string");
    assert!(reg.resolve_toolset("mcp-fx").unwrap().contains("add"));
    assert_eq!(
        call(reg, "echo", json!({"text": "hi"})),
        json!({"echo": "hi"})
    );
    // Coercion runs before the MCP call, as for any tool.
    assert_eq!(
        call(reg, "add", json!({"a": "2", "b": 3})),
        json!({"result": 5})
    );
    let err = call(reg, "fail", json!({}));
    let msg = err["error"].as_str().unwrap();
    // The SDK hides the exception text; the error names the tool, the server and the failure.
    assert!(
        msg.contains("`fail` of MCP server `fx` reported an error"),
        "{msg}"
    );
    // The definitions the model gets include them.
    let defs = reg.get_tool_definitions(&[], &[]).unwrap();
    assert!(defs.iter().any(|d| d["function"]["name"] == "echo"));
    m.shutdown();
}

#[test]
fn stopping_a_stdio_server_ends_its_whole_process_group() {
    let py = need_python!();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("grandchild.pid");
    let mut s = spec("family", stdio(&py, "stdio_server.py"));
    s.env = Some(vec![
        ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
        (
            "FIXTURE_GRANDCHILD_PID_FILE".into(),
            pid_file.display().to_string(),
        ),
    ]);
    let m = McpManager::start(vec![s], leaked());
    assert!(
        matches!(m.servers()[0].state(), ServerState::Running(_)),
        "{:?}",
        m.servers()[0].state()
    );
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let alive = |pid: i32| {
        // A zombie (exited, not yet reaped by its parent) counts as gone.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|st| {
                !st.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(false)
    };
    assert!(alive(pid), "the server's child runs while the server does");
    m.shutdown();
    let deadline = Instant::now() + Duration::from_secs(15);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(pid), "the server's child outlived the server");
}

#[test]
fn scripts_cannot_call_mcp_tools_unless_the_operator_opens_them() {
    let py = need_python!();
    let reg = leaked();
    let closed = McpManager::start(vec![spec("closed", stdio(&py, "stdio_server.py"))], reg);
    assert!(reg.get("echo").is_some());
    assert!(!reg.script_tool_names().contains(&"echo".to_string()));
    assert!(reg.script_tools().iter().all(|t| t.name != "echo"));
    // The host API cannot open them.
    assert!(reg.allow_in_scripts("echo").is_err());
    closed.shutdown();

    let reg = leaked();
    let mut cfg = stdio(&py, "stdio_server.py");
    cfg.script_callable =
        vibeos_tools::mcp_client::ScriptCallable::Only(["echo".to_string()].into());
    let open = McpManager::start(vec![spec("open", cfg)], reg);
    let names: Vec<String> = reg.script_tools().iter().map(|t| t.name.clone()).collect();
    assert!(names.contains(&"echo".to_string()), "{names:?}");
    assert!(
        !names.contains(&"add".to_string()),
        "only the listed tool: {names:?}"
    );
    open.shutdown();
}

#[test]
fn a_crashed_server_is_restarted_once_then_reported_down() {
    let py = need_python!();
    let state = tempfile::tempdir().unwrap();
    let reg = leaked();
    let mut s = spec("crashy", stdio(&py, "stdio_server.py"));
    s.env = Some(vec![
        ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
        (
            "FIXTURE_STATE_DIR".into(),
            state.path().display().to_string(),
        ),
        ("FIXTURE_MAX_STARTS".into(), "2".into()),
    ]);
    let m = McpManager::start(vec![s], reg);
    assert_eq!(
        call(reg, "echo", json!({"text": "a"})),
        json!({"echo": "a"})
    );
    let err = call(reg, "crash", json!({}));
    let msg = err["error"].as_str().unwrap();
    assert!(
        msg.contains("exited during the call to `crash`") && msg.contains("restarted"),
        "{msg}"
    );
    // The restarted server answers.
    assert_eq!(
        call(reg, "echo", json!({"text": "b"})),
        json!({"echo": "b"})
    );
    // Second crash: the restart is refused by the fixture (start limit), so it stays down.
    let err = call(reg, "crash", json!({}));
    let msg = err["error"].as_str().unwrap();
    assert!(msg.contains("could not be restarted"), "{msg}");
    let err = call(reg, "echo", json!({"text": "c"}));
    let msg = err["error"].as_str().unwrap();
    assert!(msg.contains("MCP server `crashy` is down"), "{msg}");
    assert!(matches!(m.servers()[0].state(), ServerState::Failed(_)));
    // Its tools leave the model's list (the check fails) but stay callable for the clear error.
    let defs = reg.get_tool_definitions(&[], &[]).unwrap();
    assert!(!defs.iter().any(|d| d["function"]["name"] == "echo"));
    m.shutdown();
}

#[test]
fn a_hung_call_times_out_without_blocking_other_calls() {
    let py = need_python!();
    let reg = leaked();
    let mut cfg = stdio(&py, "stdio_server.py");
    cfg.timeout = Some(1.0);
    let m = McpManager::start(vec![spec("slowpoke", cfg)], reg);
    let t0 = Instant::now();
    std::thread::scope(|scope| {
        let hung = scope.spawn(|| call(reg, "slow", json!({"seconds": 30})));
        std::thread::sleep(Duration::from_millis(200));
        // Another call of the same server answers while the first one hangs.
        let t1 = Instant::now();
        assert_eq!(
            call(reg, "echo", json!({"text": "x"})),
            json!({"echo": "x"})
        );
        assert!(
            t1.elapsed() < Duration::from_secs(1),
            "blocked behind the hung call"
        );
        let err = hung.join().unwrap();
        let msg = err["error"].as_str().unwrap();
        assert!(msg.contains("did not answer `slow` within 1 s"), "{msg}");
    });
    assert!(t0.elapsed() < Duration::from_secs(10));
    m.shutdown();
}

#[test]
fn a_response_over_the_message_limit_fails_the_call_at_once_saying_so() {
    // The probe's finding: an answer over 16 MiB was dropped by the transport, and the call
    // waited for its whole timeout, then blamed the server for being slow.
    let py = need_python!();
    let reg = leaked();
    let mut cfg = stdio(&py, "big_server.py");
    cfg.timeout = Some(30.0);
    let m = McpManager::start(vec![spec("bulky", cfg)], reg);
    let t0 = Instant::now();
    let err = call(reg, "big", json!({"mib": 16}));
    let msg = err["error"].as_str().unwrap_or_else(|| panic!("{err}"));
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "took {:?}: {msg}",
        t0.elapsed()
    );
    assert!(
        msg.contains("McpResponseTooLarge")
            && msg.contains("`big`")
            && msg.contains("larger than 16 MiB"),
        "{msg}"
    );
    // The connection is intact: the next call (of the same server) answers.
    assert_eq!(
        call(reg, "echo", json!({"text": "after"})),
        json!({"echo": "after"})
    );
    // A large answer within the limit passes (the SDK sends the text twice, as content and
    // as structured content: 7 MiB makes a message of about 14).
    let ok = reg.handle_function_call("big", &json!({"mib": 7}), &ToolContext::agent("/"));
    assert!(ok.len() > 7 << 20, "{}", &ok[..ok.len().min(200)]);
    m.shutdown();
}

#[test]
fn a_missing_cwd_is_reported_as_the_cwd_not_as_a_missing_command() {
    let py = need_python!();
    let reg = leaked();
    let mut cfg = stdio(&py, "stdio_server.py");
    cfg.cwd = Some("/nonexistent/vibeos-mcp-cwd".into());
    let m = McpManager::start(vec![spec("nowhere", cfg)], reg);
    match m.servers()[0].state() {
        ServerState::Failed(why) => {
            assert!(
                why.contains("cwd /nonexistent/vibeos-mcp-cwd does not exist"),
                "{why}"
            );
            assert!(!why.contains("was not found"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    m.shutdown();
}

#[test]
fn a_server_that_ignores_sigterm_and_eof_is_killed_after_the_grace() {
    // rmcp's own shutdown waited 3 s after closing stdin, sent SIGTERM and waited 3 s more:
    // every `tools list` or `run` with such a server took 6+ s to exit.
    let py = need_python!();
    let reg = leaked();
    let m = McpManager::start(
        vec![spec("stubborn", stdio(&py, "stubborn_server.py"))],
        reg,
    );
    assert!(
        matches!(m.servers()[0].state(), ServerState::Running(_)),
        "{:?}",
        m.servers()[0].state()
    );
    let t0 = Instant::now();
    m.shutdown();
    let took = t0.elapsed();
    assert!(
        took >= vibeos_tools::mcp_client::STOP_GRACE - Duration::from_millis(100),
        "it was not given its grace: {took:?}"
    );
    assert!(took < Duration::from_secs(4), "shutdown took {took:?}");
    assert_eq!(m.servers()[0].state(), ServerState::Stopped);
}

#[test]
fn broken_servers_are_logged_and_skipped_and_the_rest_works() {
    let py = need_python!();
    let reg = leaked();
    let quick = |script: &str, extra: &[&str]| {
        let mut c = stdio(&py, script);
        c.args.extend(extra.iter().map(|s| s.to_string()));
        c.connect_timeout = Some(2.0);
        c
    };
    let missing = McpServerConfig {
        command: Some("/nonexistent/vibeos-mcp-server".into()),
        startup: Startup::Eager,
        ..Default::default()
    };
    let t0 = Instant::now();
    let m = McpManager::start(
        vec![
            spec("missing", missing),
            spec("garbage", quick("garbage_server.py", &[])),
            spec("garbage-hang", quick("garbage_server.py", &["--hang"])),
            spec("silent", quick("silent_server.py", &[])),
            spec("badschema", stdio(&py, "bad_schema_server.py")),
            spec("good", stdio(&py, "stdio_server.py")),
        ],
        reg,
    );
    // Started in parallel: the hung ones cost one start-up timeout, not three.
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    let state = |name: &str| {
        m.servers()
            .iter()
            .find(|s| s.name() == name)
            .unwrap()
            .state()
    };
    match state("missing") {
        ServerState::Failed(why) => assert!(why.contains("was not found"), "{why}"),
        other => panic!("{other:?}"),
    }
    for name in ["garbage", "garbage-hang", "silent"] {
        assert!(
            matches!(state(name), ServerState::Failed(_)),
            "{name}: {:?}",
            state(name)
        );
    }
    match state("silent") {
        ServerState::Failed(why) => assert!(why.contains("did not start within 2 s"), "{why}"),
        other => panic!("{other:?}"),
    }
    // The bad schema's tool is skipped, its good sibling kept.
    assert!(
        matches!(state("badschema"), ServerState::Running(1)),
        "{:?}",
        state("badschema")
    );
    assert!(reg.get("good").is_some() && reg.get("broken").is_none());
    assert_eq!(
        call(reg, "echo", json!({"text": "ok"})),
        json!({"echo": "ok"})
    );
    m.shutdown();
}

#[test]
fn lazy_servers_start_on_the_first_definitions_build() {
    let py = need_python!();
    let reg = leaked();
    let mut cfg = stdio(&py, "stdio_server.py");
    cfg.startup = Startup::Lazy;
    let m = McpManager::start(vec![spec("lazy", cfg)], reg);
    assert_eq!(m.servers()[0].state(), ServerState::NotStarted);
    assert!(reg.get("echo").is_none());
    // Building the script tool list does not start a server scripts cannot call.
    let _ = reg.script_tools();
    assert_eq!(m.servers()[0].state(), ServerState::NotStarted);
    let defs = reg.get_tool_definitions(&[], &[]).unwrap();
    assert!(defs.iter().any(|d| d["function"]["name"] == "echo"));
    assert!(matches!(m.servers()[0].state(), ServerState::Running(_)));
    m.shutdown();
    assert_eq!(m.servers()[0].state(), ServerState::Stopped);
}

#[test]
fn a_tool_list_change_never_leaves_a_listed_tool_missing_and_unchanged_lists_cost_nothing() {
    // Refreshes used to take the server's tools out and put them back: a call made in between
    // found no such tool (2 of about 6,500 calls during 10 unchanged notifications), and every
    // notification of a storm re-registered everything.
    let py = need_python!();
    let reg = leaked();
    let m = McpManager::start(vec![spec("churn", stdio(&py, "stdio_server.py"))], reg);
    let echo_before = reg.get("echo").unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let (mut looks, mut missing) = (0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                looks += 1;
                if reg.get("echo").is_none() {
                    missing += 1;
                }
            }
            (looks, missing)
        })
    };
    assert_eq!(
        call(reg, "storm", json!({"count": 200})),
        json!({"result": "stormed"})
    );
    // The list is fetched again while the storm lasts, and the notifications that came
    // meanwhile fold into one more fetch: wait for the refreshes to settle, then change it.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        Arc::ptr_eq(&echo_before, &reg.get("echo").unwrap()),
        "an unchanged list registered its tools again"
    );
    assert_eq!(call(reg, "grow", json!({})), json!({"result": "grown"}));
    let deadline = Instant::now() + Duration::from_secs(10);
    while reg.get("late_tool").is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(reg.get("late_tool").is_some(), "list_changed not applied");
    assert_eq!(call(reg, "shrink", json!({})), json!({"result": "shrunk"}));
    while reg.get("late_tool").is_some() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (looks, missing) = watcher.join().unwrap();
    assert!(
        reg.get("late_tool").is_none(),
        "a tool no longer listed stayed"
    );
    assert!(!reg
        .resolve_toolset("mcp-churn")
        .unwrap()
        .contains("late_tool"));
    assert!(looks > 1000, "the watcher hardly looked ({looks})");
    assert_eq!(missing, 0, "echo was missing in {missing} of {looks} looks");
    assert_eq!(
        call(reg, "echo", json!({"text": "still"})),
        json!({"echo": "still"})
    );
    m.shutdown();
}

#[test]
fn a_tool_list_change_updates_the_toolset() {
    let py = need_python!();
    let reg = leaked();
    let m = McpManager::start(vec![spec("grower", stdio(&py, "stdio_server.py"))], reg);
    assert!(reg.get("late_tool").is_none());
    assert_eq!(call(reg, "grow", json!({})), json!({"result": "grown"}));
    let deadline = Instant::now() + Duration::from_secs(10);
    while reg.get("late_tool").is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(reg.get("late_tool").is_some(), "list_changed not applied");
    assert!(reg
        .resolve_toolset("mcp-grower")
        .unwrap()
        .contains("late_tool"));
    assert_eq!(
        call(reg, "late_tool", json!({"x": 21})),
        json!({"result": 42})
    );
    m.shutdown();
}

#[test]
fn http_servers_are_reached_over_streamable_http() {
    let py = need_python!();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut child = std::process::Command::new(&py)
        .args([
            fixture("stdio_server.py"),
            "--http".into(),
            port.to_string(),
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "HTTP fixture did not listen");
        std::thread::sleep(Duration::from_millis(100));
    }
    let reg = leaked();
    let cfg = McpServerConfig {
        url: Some(format!("http://127.0.0.1:{port}/mcp")),
        headers: [("X-Test".to_string(), "yes".to_string())].into(),
        startup: Startup::Eager,
        ..Default::default()
    };
    let m = McpManager::start(vec![spec("web", cfg)], reg);
    assert!(
        matches!(m.servers()[0].state(), ServerState::Running(_)),
        "{:?}",
        m.servers()[0].state()
    );
    assert_eq!(
        call(reg, "echo", json!({"text": "over http"})),
        json!({"echo": "over http"})
    );
    assert_eq!(reg.get("add").unwrap().toolset, "mcp-web");
    m.shutdown();
    let _ = child.kill();
    let _ = child.wait();
}

/// The fixture server as `name` (its `getenv WHO` says so), of `kind`, ready `delay` seconds
/// after it starts.
fn delayed_server(py: &std::path::Path, name: &str, delay: &str, kind: ServerKind) -> ServerSpec {
    let mut env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k == "PATH" || k == "HOME")
        .collect();
    env.push(("WHO".into(), name.into()));
    env.push(("FIXTURE_START_DELAY".into(), delay.into()));
    let mut s = spec(name, stdio(py, "stdio_server.py"));
    s.env = Some(env);
    s.kind = kind;
    s
}

/// Two servers offering the same tool names: the one listed first wins every shared name,
/// whichever starts first. The first server here is ready at once and the second a second
/// later, so "the last to register wins" (what decided before) gave the names to the second.
#[test]
fn the_server_listed_first_wins_a_shared_tool_name_whatever_starts_first() {
    let py = need_python!();
    let server = |name: &str, delay: &str| delayed_server(&py, name, delay, ServerKind::Mcp);
    for (first_delay, second_delay) in [("0", "1"), ("1", "0")] {
        let reg = leaked();
        let m = McpManager::start(
            vec![server("first", first_delay), server("second", second_delay)],
            reg,
        );
        for s in m.servers() {
            assert!(
                matches!(s.state(), ServerState::Running(_)),
                "{}: {:?}",
                s.name(),
                s.state()
            );
        }
        for tool in ["echo", "add", "getenv"] {
            assert_eq!(
                reg.get(tool).unwrap().source,
                ToolSource::Mcp("first".into()),
                "{tool} (delays {first_delay}/{second_delay})"
            );
        }
        assert_eq!(
            call(reg, "getenv", json!({"name": "WHO"}))["value"],
            "first",
            "delays {first_delay}/{second_delay}"
        );
        m.shutdown();
    }
}

/// An MCP server and the plugin host offering the same tool name: the server wins, whichever
/// starts first (the plugin host comes after every `mcp_servers:` entry). Before stop 53 the
/// first to register kept the name, so the winner changed from run to run.
#[test]
fn an_mcp_server_wins_a_tool_name_it_shares_with_a_plugin_whatever_starts_first() {
    let py = need_python!();
    let server = |name: &str, delay: &str, kind: ServerKind| delayed_server(&py, name, delay, kind);
    for (server_delay, plugins_delay) in [("0", "1"), ("1", "0")] {
        let reg = leaked();
        let m = McpManager::start(
            vec![
                server("srv", server_delay, ServerKind::Mcp),
                server("plugins", plugins_delay, ServerKind::Plugins),
            ],
            reg,
        );
        for tool in ["echo", "add", "getenv"] {
            assert_eq!(
                reg.get(tool).unwrap().source,
                ToolSource::Mcp("srv".into()),
                "{tool} (delays {server_delay}/{plugins_delay})"
            );
        }
        assert_eq!(
            call(reg, "getenv", json!({"name": "WHO"}))["value"],
            "srv",
            "delays {server_delay}/{plugins_delay}"
        );
        m.shutdown();
    }
}

/// A stdio MCP server in plain Python (no SDK, so the test needs only `python3`): it answers
/// the handshake and `tools/list` with one tool, `stall`, and never answers a call.
const STALLING_SERVER: &str = r#"
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    method, mid = msg.get("method"), msg.get("id")
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "stall", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "stall", "description": "never answers",
                             "inputSchema": {"type": "object", "properties": {}},
                             "_meta": {"vibeos/plugin": "stalling"}}]}
    else:
        continue
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}) + "\n")
    sys.stdout.flush()
"#;

/// The timeout hints name the key that sets the timeout: for the plugin host `plugins.timeout`
/// and `plugins.connect_timeout` (they said `mcp_servers.plugins.timeout`, a key that does not
/// exist), for an MCP server its own entry's.
#[test]
fn timeout_hints_name_the_plugin_host_s_own_keys() {
    let Some(py) = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
    else {
        vibeos_testkit::skip!("no python3");
    };
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("stall.py");
    std::fs::write(&script, STALLING_SERVER).unwrap();
    for (kind, name, call_key, start_key) in [
        (
            ServerKind::Plugins,
            "plugins",
            "plugins.timeout",
            "plugins.connect_timeout",
        ),
        (
            ServerKind::Mcp,
            "stally",
            "mcp_servers.stally.timeout",
            "mcp_servers.stally.connect_timeout",
        ),
    ] {
        let reg = leaked();
        let config = McpServerConfig {
            command: Some(py.display().to_string()),
            args: vec![script.display().to_string()],
            startup: Startup::Eager,
            timeout: Some(1.0),
            connect_timeout: Some(20.0),
            ..Default::default()
        };
        let m = McpManager::start(
            vec![ServerSpec {
                kind,
                ..spec(name, config)
            }],
            reg,
        );
        assert!(
            matches!(m.servers()[0].state(), ServerState::Running(1)),
            "{:?}",
            m.servers()[0].state()
        );
        let err = call(reg, "stall", json!({}));
        let msg = err["error"].as_str().unwrap();
        assert!(
            msg.contains(&format!("(raise {call_key} if the tool is slow)")),
            "{msg}"
        );
        m.shutdown();

        // A server that never completes the handshake: the start-up hint.
        let reg = leaked();
        let silent = McpServerConfig {
            command: Some("sleep".into()),
            args: vec!["30".into()],
            startup: Startup::Eager,
            connect_timeout: Some(1.0),
            ..Default::default()
        };
        let m = McpManager::start(
            vec![ServerSpec {
                kind,
                ..spec(name, silent)
            }],
            reg,
        );
        match m.servers()[0].state() {
            ServerState::Failed(why) => assert!(
                why.contains(&format!("(raise {start_key} if it is slow to start)")),
                "{why}"
            ),
            other => panic!("{other:?}"),
        }
        m.shutdown();
    }
}
