//! MCP servers and plugins through the `vibeos-exec` CLI (SPEC §7): config.yaml `mcp_servers:`
//! and `plugins:`, `tools list` status, `tools schema`, scripts refused by default and allowed
//! when the operator says so, env scrubbing for server children, servers stopped on exit, and
//! plugins from `$VIBEOS_HOME/plugins` and `<cwd>/.vibeos/plugins` (one of which raises).
//!
//! The servers are real (official MCP Python SDK, fixtures/mcp_servers/), run by the test venv
//! that scripts/test-all creates (target/pyvenv with `mcp` and the vibeos_exec package).

// A test harness: a panic here is how a failed expectation is reported.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use vibeos_testkit::{fixture, pid_alive, Sandbox};

macro_rules! need {
    ($modules:expr) => {
        match vibeos_testkit::venv_python($modules) {
            Ok(p) => p,
            Err(missing) => {
                vibeos_testkit::skip!("missing {missing}");
            }
        }
    };
}

fn server_entry(py: &std::path::Path, name: &str, extra: &str) -> String {
    format!(
        "  {name}:\n    command: {}\n    args: [{}]\n    connect_timeout: 30\n{extra}",
        py.display(),
        fixture("mcp_servers/stdio_server.py").display()
    )
}

/// A config that runs scripts with the real interpreter and has the one MCP server
/// [`server_entry`] describes.
fn config_with_server(py: &std::path::Path, name: &str, extra: &str) -> String {
    format!(
        "code_execution:\n  python: {}\nmcp_servers:\n{}",
        vibeos_testkit::python3().display(),
        server_entry(py, name, extra)
    )
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn tools_list_shows_each_server_with_its_status() {
    let py = need!("mcp.server.mcpserver");
    let sb = Sandbox::new();
    let config = format!(
        "mcp_servers:\n{}{}  ghost:\n    command: /nonexistent/mcp-ghost\n    startup: eager\n  broken:\n    url: http://127.0.0.1:1/mcp\n    args: [x]\n",
        server_entry(&py, "alpha", "    startup: eager\n"),
        server_entry(&py, "beta", ""),
    );
    sb.write_config(&format!(
        "code_execution:\n  python: {}\n{config}",
        vibeos_testkit::python3().display()
    ));
    let out = sb.run(&["tools", "list"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(text.contains("MCP SERVERS AND PLUGINS"), "{text}");
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row for {name}:\n{text}"))
            .to_string()
    };
    assert!(
        line("alpha").contains("running (") && line("alpha").contains("[mcp-alpha]"),
        "{text}"
    );
    assert!(line("beta").contains("lazy (not started)"), "{text}");
    assert!(
        line("ghost").contains("failed: command `/nonexistent/mcp-ghost` was not found"),
        "{text}"
    );
    // The eager server's tools are listed in its toolset.
    assert!(
        text.lines()
            .any(|l| l.starts_with("echo ") && l.contains("mcp-alpha")),
        "{text}"
    );
    // A bad entry is logged by name and skipped; the rest still loads.
    let err = stderr(&out);
    assert!(err.contains("MCP server `broken` skipped"), "{err}");
    assert!(err.contains("MCP server `ghost`"), "{err}");

    let out = sb.run(&["tools", "list", "--json"]);
    let rows: Value = serde_json::from_slice(&out.stdout).expect("json");
    let echo = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "echo")
        .expect("echo row");
    assert_eq!(echo["source"], "MCP server `alpha`");
    assert!(echo["server_status"]
        .as_str()
        .unwrap()
        .starts_with("running"));
}

#[test]
fn tools_schema_starts_lazy_servers_and_includes_their_tools() {
    let py = need!("mcp.server.mcpserver");
    let sb = Sandbox::new();
    sb.write_config(&config_with_server(&py, "lazyone", ""));
    let out = sb.run(&["tools", "schema"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let defs: Value = serde_json::from_slice(&out.stdout).expect("json");
    let names: Vec<&str> = defs
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["function"]["name"].as_str())
        .collect();
    assert!(
        names.contains(&"echo") && names.contains(&"add"),
        "{names:?}"
    );
    // MCP tools are not script tools: the execute_code description does not offer them.
    let exec = defs
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["function"]["name"] == "execute_code")
        .expect("execute_code");
    let desc = exec["function"]["description"].as_str().unwrap();
    assert!(!desc.contains("echo("), "{desc}");
}

#[test]
fn scripts_cannot_call_mcp_tools_unless_configured() {
    let py = need!("mcp.server.mcpserver");
    let script = "from vibeos_tools import echo\nprint(echo(text='from a script'))\n";
    let sb = Sandbox::new();
    sb.write_config(&config_with_server(&py, "closed", "    startup: eager\n"));
    let r = sb.run_json(script, &[]);
    assert_eq!(r["status"], "error", "{r}");
    assert!(
        r["error"].as_str().unwrap_or("").contains("echo")
            || r["output"].as_str().unwrap_or("").contains("echo"),
        "{r}"
    );

    let sb = Sandbox::new();
    sb.write_config(&config_with_server(
        &py,
        "open",
        "    script_callable: [echo]\n",
    ));
    let r = sb.run_json(script, &[]);
    assert_eq!(r["status"], "success", "{r}");
    assert!(
        r["output"].as_str().unwrap().contains("from a script"),
        "{r}"
    );
    assert_eq!(r["tool_calls_made"], 1);
    // Only the listed tool is opened.
    let r = sb.run_json("from vibeos_tools import add\n", &[]);
    assert_eq!(r["status"], "error", "{r}");
}

#[test]
fn server_env_is_scrubbed_and_explicit_entries_pass() {
    let py = need!("mcp.server.mcpserver");
    let mut sb = Sandbox::new();
    sb.set_env("OPENAI_API_KEY", "sk-inherited-secret");
    sb.set_env("VIBEOS_TEST_INHERITED", "plain");
    sb.write_config(&config_with_server(
            &py,
            "envsrv",
            "    script_callable: true\n    env:\n      ANTHROPIC_API_KEY: from-config\n      FIXTURE_FLAG: on\n"
        ));
    let script = "from vibeos_tools import getenv\nfor n in ['OPENAI_API_KEY', 'ANTHROPIC_API_KEY', 'FIXTURE_FLAG']:\n    print(n, getenv(name=n)['value'])\n";
    let r = sb.run_json(script, &[]);
    assert_eq!(r["status"], "success", "{r}");
    let out = r["output"].as_str().unwrap();
    assert!(
        out.contains("OPENAI_API_KEY None"),
        "inherited credential leaked: {out}"
    );
    assert!(out.contains("ANTHROPIC_API_KEY from-config"), "{out}");
    assert!(out.contains("FIXTURE_FLAG on"), "{out}");
}

#[test]
fn servers_are_stopped_when_the_cli_exits() {
    let py = need!("mcp.server.mcpserver");
    let sb = Sandbox::new();
    let state = sb.root.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    sb.write_config(&config_with_server(
        &py,
        "tracked",
        &format!(
            "    startup: eager\n    env:\n      FIXTURE_STATE_DIR: {}\n",
            state.display()
        ),
    ));
    let out = sb.run(&["tools", "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let pids: Vec<i32> = std::fs::read_to_string(state.join("starts"))
        .expect("server recorded its start")
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 1);
    assert!(
        !pid_alive(pids[0]),
        "MCP server {} outlived the CLI",
        pids[0]
    );
}

fn plugin_config(sb: &Sandbox, py: &std::path::Path, startup: &str) {
    sb.write_config(&format!(
        "code_execution:\n  python: {}\nplugins:\n  python: {}\n  startup: {startup}\n  entry_points: false\n",
        vibeos_testkit::python3().display(),
        py.display()
    ));
}

fn copy_plugins(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    for f in ["greeter.py", "exploding.py", "clobber.py"] {
        std::fs::copy(fixture("plugins").join(f), dir.join(f)).unwrap();
    }
}

#[test]
fn plugins_load_from_vibeos_home_and_a_raising_plugin_is_skipped() {
    let py = need!("mcp.server.mcpserver, vibeos_exec.plugin_host");
    let sb = Sandbox::new();
    copy_plugins(&sb.home().join("plugins"));
    plugin_config(&sb, &py, "eager");
    let out = sb.run(&["tools", "list"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(
        text.lines()
            .any(|l| l.starts_with("greet ") && l.contains("plugin-greeter")),
        "{text}"
    );
    assert!(text.lines().any(|l| l.starts_with("shout ")), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("plugin exploding")
            && l.contains("failed: RuntimeError: exploding plugin refuses to load")),
        "{text}"
    );
    assert!(
        stderr(&out).contains("plugin `exploding` skipped"),
        "{}",
        stderr(&out)
    );
    // A plugin replacing a built-in is refused by the CLI's override policy: read_file stays.
    assert!(
        text.lines()
            .any(|l| l.starts_with("read_file ") && l.contains(" file ")),
        "{text}"
    );
    assert!(
        stderr(&out).contains("read_file") && stderr(&out).contains("plugin `clobber`"),
        "{}",
        stderr(&out)
    );

    // A plugin tool its plugin opened to scripts is callable from a script; the other is not.
    let r = sb.run_json(
        "from vibeos_tools import greet\nprint(greet(name='plugins')['greeting'])\n",
        &[],
    );
    assert_eq!(r["status"], "success", "{r}");
    assert_eq!(r["output"].as_str().unwrap().trim(), "hello, plugins");
    let r = sb.run_json("from vibeos_tools import shout\n", &[]);
    assert_eq!(r["status"], "error", "{r}");
}

#[test]
fn plugins_load_from_the_project_dir_lazily() {
    let py = need!("mcp.server.mcpserver, vibeos_exec.plugin_host");
    let sb = Sandbox::new();
    copy_plugins(&sb.work().join(".vibeos/plugins"));
    plugin_config(&sb, &py, "lazy");
    let out = sb.run(&["tools", "list"]);
    assert!(
        stdout(&out).contains("lazy (not started)"),
        "{}",
        stdout(&out)
    );
    let out = sb.run(&["tools", "schema", "--enable-toolsets", "plugin-greeter"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let defs: Value = serde_json::from_slice(&out.stdout).expect("json");
    let names: Vec<&str> = defs
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["function"]["name"].as_str())
        .collect();
    assert_eq!(names, vec!["greet", "shout"]);
}

#[test]
fn plugins_without_the_python_package_are_skipped_with_a_clear_message() {
    let sb = Sandbox::new();
    // The system interpreter: vibeos_exec is not installed there (skip if it happens to be).
    let system = vibeos_testkit::python3();
    let has = std::process::Command::new(&system)
        .args(["-c", "import vibeos_exec"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(true);
    if has {
        vibeos_testkit::skip!("{} has vibeos_exec installed", system.display());
    }
    copy_plugins(&sb.home().join("plugins"));
    plugin_config(&sb, &system, "eager");
    let out = sb.run(&["tools", "list"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("plugins need the vibeos_exec Python package installed for"),
        "{text}"
    );
    // Built-ins still work.
    assert!(text.lines().any(|l| l.starts_with("read_file ")), "{text}");
}
