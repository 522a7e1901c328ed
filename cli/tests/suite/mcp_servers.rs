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
    // The servers are rows too (the probe's finding: only the table had them). Tool rows keep
    // their shape; a server row has `kind` and no `name`, so a lookup of tools by name never
    // finds one.
    let rows = rows.as_array().unwrap();
    assert_eq!(echo["kind"], "tool");
    assert!(rows
        .iter()
        .all(|r| r["kind"] != "tool" || r["name"].is_string()));
    let server = |name: &str| {
        rows.iter()
            .find(|r| r["kind"] == "mcp_server" && r["server"] == name)
            .unwrap_or_else(|| panic!("no row for server {name}: {rows:?}"))
    };
    assert_eq!(server("alpha")["state"], "running");
    assert!(server("alpha")["tools"].as_u64().unwrap() >= 6);
    assert_eq!(
        server("alpha")["toolsets"],
        serde_json::json!(["mcp-alpha"])
    );
    assert_eq!(server("alpha")["startup"], "eager");
    assert_eq!(server("beta")["state"], "lazy");
    assert_eq!(server("beta")["startup"], "lazy");
    assert_eq!(server("ghost")["state"], "failed");
    assert!(server("ghost")["error"]
        .as_str()
        .unwrap()
        .contains("command `/nonexistent/mcp-ghost` was not found"));
    assert!(server("ghost")["transport"]
        .as_str()
        .unwrap()
        .starts_with("stdio: "));
    assert!(rows
        .iter()
        .filter(|r| r["kind"] != "tool")
        .all(|r| r.get("name").is_none()));
}

#[test]
fn tools_list_of_a_lazy_servers_toolset_starts_that_server() {
    // The probe's finding: `tools list --enable-toolsets mcp-probe` said `unknown toolset` for
    // a lazy server while `tools schema` (which starts lazy servers) worked.
    let py = need!("mcp.server.mcpserver");
    let sb = Sandbox::new();
    sb.write_config(&format!(
        "mcp_servers:\n{}{}",
        server_entry(&py, "probe", ""),
        server_entry(&py, "other", "")
    ));
    let out = sb.run(&["tools", "list", "--enable-toolsets", "mcp-probe"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    assert!(
        text.lines()
            .any(|l| l.starts_with("echo ") && l.contains("mcp-probe")),
        "{text}"
    );
    assert!(!text.lines().any(|l| l.starts_with("read_file ")), "{text}");
    // Only the named server was started.
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no row for {name}:\n{text}"))
            .to_string()
    };
    assert!(row("probe").contains("running ("), "{text}");
    assert!(row("other").contains("lazy (not started)"), "{text}");
    let out = sb.run(&["tools", "list", "--disable-toolsets", "mcp-other"]);
    assert!(out.status.success(), "{}", stderr(&out));
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

/// An MCP server the operator opened to scripts is an attacker here
/// (fixtures/mcp_servers/hostile_server.py): descriptions ending in a quote or a backslash,
/// `"""` followed by code, NUL and other control characters, property names and defaults made
/// of the same, names vibeos_tools cannot define. Scripts still import vibeos_tools, every
/// definable tool works and sends exactly what the script passed, nothing injected runs, and the
/// execute_code description shows each tool with the doc line its stub function has. A second
/// server whose tool list is not Unicode (a lone surrogate) is skipped; the first keeps working.
#[test]
fn a_hostile_mcp_server_cannot_break_or_inject_into_the_script_stub() {
    let sb = Sandbox::new();
    let marker = sb.root.path().join("injected");
    let server = |name: &str, extra: &str, timeout: u32| {
        format!(
            "  {name}:\n    command: {}\n    args: [{}, --marker, {}{extra}]\n    startup: eager\n    connect_timeout: {timeout}\n    script_callable: true\n",
            vibeos_testkit::python3().display(),
            fixture("mcp_servers/hostile_server.py").display(),
            marker.display()
        )
    };
    sb.write_config(&format!(
        "code_execution:\n  python: {}\nmcp_servers:\n{}{}",
        vibeos_testkit::python3().display(),
        server("hostile", "", 20),
        // The client drops a message that is not Unicode and waits out the start-up timeout.
        server("unicode", ", --surrogate", 3),
    ));
    let script = r#"
import json
import vibeos_tools as t
print(json.dumps(sorted(t._TOOLS)))
print(json.dumps([t.pong.__doc__.splitlines()[0], t.blank_first.__doc__.splitlines()[0]]))
print(json.dumps(t.echo(text='hi "there" \\')))
for name in ["pong", "backslash", "breakout", "controls", "escaped_quote", "blank_first"]:
    assert getattr(t, name)()["tool"] == name
print(json.dumps(t.hostile_schema("positional")["args"], sort_keys=True))
"#;
    let r = sb.run_json(script, &[]);
    assert_eq!(r["status"], "success", "{r}");
    let output = r["output"].as_str().unwrap();
    assert!(!output.contains("INJECTED"), "{output}");
    assert!(!marker.exists(), "injected code ran: {output}");
    let lines: Vec<Value> = output
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let tools: Vec<&str> = lines[0]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for name in [
        "echo",
        "pong",
        "backslash",
        "breakout",
        "controls",
        "escaped_quote",
        "blank_first",
        "hostile_schema",
        "read_file",
    ] {
        assert!(tools.contains(&name), "{name} missing: {tools:?}");
    }
    let too_long = "l".repeat(65);
    for name in ["with-dash", "retry", "fine_too", "surrogate", &too_long] {
        assert!(!tools.contains(&name), "{name} offered: {tools:?}");
    }
    assert_eq!(
        lines[1],
        serde_json::json!([
            "Check the service; returns \"pong\"",
            "\"Real\" first line\\"
        ])
    );
    assert_eq!(
        lines[2],
        serde_json::json!({"tool": "echo", "args": {"text": "hi \"there\" \\"}})
    );
    let inject = format!(
        "open(r'{}', 'w').write('x'); print('INJ' 'ECTED')",
        marker.display()
    );
    assert_eq!(
        lines[3],
        serde_json::json!({
            format!("x\"); {inject} #"): "positional",
            "\\": "\\",
            "\"\"\"": format!("\"\"\"; {inject} #"),
            "\0": "\0\r\u{2028}\\",
            "_call": "shadow",
            "_json": ["x\"", {"k\"\"\"": "\\"}],
            "__debug__": true,
        })
    );

    // The model is told the same doc lines the stub functions have.
    let out = sb.run(&["tools", "schema"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let defs: Value = serde_json::from_slice(&out.stdout).expect("json");
    let desc = defs
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["function"]["name"] == "execute_code")
        .expect("execute_code")["function"]["description"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        desc.contains("- pong(): Check the service; returns \"pong\"\n"),
        "{desc}"
    );
    assert!(
        desc.contains("- blank_first(): \"Real\" first line\\\n"),
        "{desc}"
    );
    // The server that sent text that is not Unicode is reported, by name.
    let out = sb.run(&["tools", "list"]);
    let text = stdout(&out);
    let row = text
        .lines()
        .find(|l| l.starts_with("unicode "))
        .unwrap_or_else(|| panic!("no row for the server:\n{text}"));
    assert!(row.contains("failed"), "{text}");
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

#[test]
fn run_exits_promptly_when_its_script_ends_during_an_mcp_call() {
    // The probe's finding: the result was printed at 3.6 s, the process exited at 63.6 s: a
    // blocking thread still waited for the MCP call (60 s timeout) and the runtime waited for
    // it at exit. A `terminal("sleep 100")` in the same spot exited at once.
    let py = need!("mcp.server.mcpserver");
    let sb = Sandbox::new();
    sb.write_config(&config_with_server(
        &py,
        "sleepy",
        "    startup: eager\n    script_callable: [slow]\n",
    ));
    let script = "from vibeos_tools import slow\nprint('calling', flush=True)\nslow(seconds=100)\n";
    let t0 = std::time::Instant::now();
    let r = sb.run_json(script, &["--timeout", "4"]);
    let took = t0.elapsed();
    assert_eq!(r["status"], "timeout", "{r}");
    assert!(
        took < std::time::Duration::from_secs(20),
        "exited after {took:?}"
    );

    // Interrupted (SIGTERM) during the call: the same.
    let path = sb.root.path().join("interrupted.py");
    std::fs::write(&path, script).unwrap();
    let child = sb
        .command()
        .args(["run", "--json", path.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The server starts eagerly (a second or two), then the script makes its call.
    std::thread::sleep(std::time::Duration::from_secs(6));
    let t0 = std::time::Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let took = t0.elapsed();
    let r = vibeos_testkit::parse_single_json(&out);
    assert_eq!(r["status"], "interrupted", "{r}");
    assert!(
        r["output"].as_str().unwrap().contains("calling"),
        "the script had not reached the call: {r}"
    );
    assert!(
        took < std::time::Duration::from_secs(10),
        "exited {took:?} after SIGTERM"
    );
}

#[test]
fn credentials_in_a_server_url_are_masked_wherever_it_is_shown() {
    // The probe's finding: `url: http://user:pass@host/mcp?api_key=…` appeared verbatim in
    // `tools list`, in the warnings and in agent.log.
    let sb = Sandbox::new();
    sb.write_config(
        "mcp_servers:\n  remote:\n    url: http://alice:Pa55w0rdZz@127.0.0.1:1/mcp?api_key=K3yV4lueQq&x=1\n    startup: eager\n    connect_timeout: 5\n",
    );
    let out = sb.run(&["tools", "list"]);
    let text = stdout(&out);
    let err = stderr(&out);
    assert!(out.status.success(), "{text}\n{err}");
    let row = text
        .lines()
        .find(|l| l.starts_with("remote "))
        .unwrap_or_else(|| panic!("no row for the server:\n{text}"));
    assert!(
        row.contains("http: http://alice:***@127.0.0.1:1/mcp?api_key=***&x=1"),
        "{row}"
    );
    assert!(row.contains("failed"), "{row}");
    assert!(err.contains("MCP server `remote`"), "{err}");
    let json = stdout(&sb.run(&["tools", "list", "--json"]));
    let log = std::fs::read_to_string(sb.home().join("logs/agent.log")).unwrap_or_default();
    assert!(log.contains("MCP server `remote`"), "{log}");
    for (what, shown) in [
        ("table", &text),
        ("stderr", &err),
        ("json", &json),
        ("agent.log", &log),
    ] {
        for secret in ["Pa55w0rdZz", "K3yV4lueQq"] {
            assert!(!shown.contains(secret), "{secret} in the {what}:\n{shown}");
        }
    }
}

#[test]
fn a_banner_line_before_mcp_is_tolerated_and_logged() {
    // A server that prints a line that is not JSON-RPC on stdout before it speaks MCP (common
    // in the wild) works, as rmcp and the other SDKs skip such lines; the line is logged so a
    // server that never speaks MCP can be told from a slow one.
    let py = need!("mcp.server.mcpserver");
    let sb = Sandbox::new();
    sb.write_config(&format!(
        "mcp_servers:\n  chatty:\n    command: {}\n    args: [{}]\n    startup: eager\n    connect_timeout: 30\n",
        py.display(),
        fixture("mcp_servers/banner_server.py").display()
    ));
    let out = sb.run(&["tools", "list", "--log-level", "info"]);
    let text = stdout(&out);
    let err = stderr(&out);
    assert!(out.status.success(), "{text}\n{err}");
    let row = text
        .lines()
        .find(|l| l.starts_with("chatty "))
        .unwrap_or_else(|| panic!("no row for the server:\n{text}"));
    assert!(row.contains("running ("), "{row}");
    assert!(
        err.contains("MCP server `chatty`: ignored a line on stdout that is not JSON-RPC")
            && err.contains("Fixture MCP server v1.0 starting (banner)"),
        "{err}"
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

    // `tools list --json` lists the plugin host and the plugin that failed.
    let out = sb.run(&["tools", "list", "--json"]);
    let rows: Value = serde_json::from_slice(&out.stdout).expect("json");
    let rows = rows.as_array().unwrap();
    let host = rows
        .iter()
        .find(|r| r["kind"] == "plugin_host")
        .unwrap_or_else(|| panic!("no plugin host row: {rows:?}"));
    assert_eq!(host["server"], "plugins");
    assert_eq!(host["state"], "running");
    let failed = rows
        .iter()
        .find(|r| r["kind"] == "plugin" && r["plugin"] == "exploding")
        .unwrap_or_else(|| panic!("no row for the failed plugin: {rows:?}"));
    assert_eq!(failed["state"], "failed");
    assert!(failed["error"]
        .as_str()
        .unwrap()
        .contains("RuntimeError: exploding plugin refuses to load"));

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
    // A script's first execution starts the lazy plugin host too: its plugin opened `greet`
    // to scripts (stop 53: the stub left it out until a definitions build had started it).
    let r = sb.run_json(
        "from vibeos_tools import greet\nprint(greet(name='lazy')['greeting'])\n",
        &[],
    );
    assert_eq!(r["status"], "success", "{r}");
    assert_eq!(r["output"].as_str().unwrap().trim(), "hello, lazy");
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
        text.contains("No module named vibeos_exec")
            && text.contains("install the package for that interpreter"),
        "{text}"
    );
    // Built-ins still work.
    assert!(text.lines().any(|l| l.starts_with("read_file ")), "{text}");
}

/// Strict mode (stop 53): a project's `.vibeos/plugins` are not the operator's and are not
/// loaded (they ran with the operator's rights before any script did), and a plugin tool its
/// plugin opened to scripts reaches a strict script only when the operator opens plugin tools
/// (`code_execution.strict.plugin_tools`): it runs unconfined in the plugin host.
#[test]
fn strict_mode_loads_no_project_plugin_and_offers_plugin_tools_only_when_opened() {
    let py = need!("mcp.server.mcpserver, vibeos_exec.plugin_host");
    let sb = Sandbox::new();
    copy_plugins(&sb.home().join("plugins"));
    let marker = sb.root.path().join("planted-plugin-ran");
    let planted = sb.work().join(".vibeos/plugins");
    std::fs::create_dir_all(&planted).unwrap();
    std::fs::write(
        planted.join("planted.py"),
        format!(
            "import pathlib\npathlib.Path({:?}).write_text('ran')\n\
             from vibeos_exec import registry\n\
             registry.register(name='planted', toolset='planted', \
             schema={{'type': 'object', 'properties': {{}}}}, handler=lambda a: {{}}, \
             script_callable=True)\n",
            marker.display().to_string()
        ),
    )
    .unwrap();
    let config = |strict_extra: &str| {
        sb.write_config(&format!(
            "code_execution:\n  python: {}\n  strict:\n    disk_mb: 64\n{strict_extra}plugins:\n  \
             python: {}\n  startup: eager\n  entry_points: false\n",
            vibeos_testkit::python3().display(),
            py.display()
        ))
    };
    config("");
    let greet = "from vibeos_tools import greet\nprint(greet(name='s')['greeting'])\n";
    let r = sb.run_json(greet, &["--mode", "strict"]);
    assert_eq!(r["status"], "error", "{r}");
    assert!(
        r["output"]
            .as_str()
            .unwrap()
            .contains("cannot import name 'greet'"),
        "{r}"
    );
    let r = sb.run_json(
        "import vibeos_tools\nprint(hasattr(vibeos_tools, 'planted'))\n",
        &["--mode", "strict"],
    );
    assert_eq!(r["output"].as_str().unwrap().trim(), "False", "{r}");
    assert!(
        !marker.exists(),
        "a strict run imported the project's plugin"
    );

    // Opened by the operator: the plugin tool is callable from a strict script.
    config("    plugin_tools: true\n");
    let r = sb.run_json(greet, &["--mode", "strict"]);
    assert_eq!(r["status"], "success", "{r}");
    assert_eq!(r["output"].as_str().unwrap().trim(), "hello, s");
    assert!(
        !marker.exists(),
        "a strict run imported the project's plugin"
    );

    // Project mode trusts the project: its plugin loads (and its tool is offered).
    let r = sb.run_json("from vibeos_tools import planted\nprint(planted())\n", &[]);
    assert_eq!(r["status"], "success", "{r}");
    assert!(marker.exists());
}

/// `serve --toolsets` naming a plugin that failed to load skips it with a warning and serves
/// the rest, as for a server that failed (stop 56's probe: serve exited with "unknown toolset
/// plugin-…", and its client's connection was closed).
#[test]
fn serve_skips_a_named_plugin_that_failed_to_load_and_serves_the_rest() {
    use std::io::{BufRead, Write};
    let py = need!("mcp.server.mcpserver, vibeos_exec.plugin_host");
    let sb = Sandbox::new();
    copy_plugins(&sb.home().join("plugins"));
    plugin_config(&sb, &py, "eager");
    let mut child = sb
        .command()
        .args(["serve", "--toolsets", "plugin-greeter,plugin-exploding"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve starts");
    let mut to_server = child.stdin.take().unwrap();
    let mut from_server = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut exchange = |line: &str, answered: bool| -> Value {
        to_server.write_all(line.as_bytes()).unwrap();
        to_server.write_all(b"\n").unwrap();
        to_server.flush().unwrap();
        if !answered {
            return Value::Null;
        }
        let mut reply = String::new();
        from_server.read_line(&mut reply).unwrap();
        serde_json::from_str(&reply).unwrap_or_else(|e| panic!("{e}: {reply:?}"))
    };
    let init = exchange(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"pipes","version":"1"}}}"#,
        true,
    );
    assert_eq!(
        init["result"]["serverInfo"]["name"], "vibeos-exec",
        "{init}"
    );
    exchange(
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        false,
    );
    let list = exchange(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#, true);
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"greet"), "{names:?}");
    drop(to_server);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("`plugin-exploding` skipped: plugin exploding failed to load"),
        "{err}"
    );
}
