//! `vibeos-exec serve`, driven by the official MCP Python SDK (`mcp` from the Python package
//! index) as a real client over stdio and streamable HTTP, plus raw JSON-RPC lines a broken
//! client would send.
//!
//! The scenarios live in `fixtures/mcp/scenario_*.py`; each prints one JSON report of what it
//! observed and the assertions are here. The SDK is installed once into a venv cached under
//! `target/pyvenv` (scripts/test-all creates it), else in `target/mcp-venv`; when it cannot be installed the
//! SDK-driven tests skip with a message naming what is missing.
// Helpers outside `#[test]` fns unwrap too: a failure there is a test failure.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use vibeos_testkit::{exec_bin, python3, workspace_root, Sandbox};

/// A Python interpreter that can `import mcp`, or why there is none.
fn mcp_python() -> Result<PathBuf, String> {
    static PY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PY.get_or_init(find_or_install_mcp).clone()
}

/// What the scenarios import: the MCP SDK's client side.
const MCP_CLIENT_MODULES: &str = "mcp, mcp.client.stdio, mcp.client.streamable_http";

fn imports_mcp(py: &PathBuf) -> bool {
    Command::new(py)
        .args(["-c", &format!("import {MCP_CLIENT_MODULES}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn find_or_install_mcp() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("VIBEOS_MCP_PYTHON") {
        let p = PathBuf::from(p);
        return if imports_mcp(&p) {
            Ok(p)
        } else {
            Err(format!(
                "VIBEOS_MCP_PYTHON={} cannot `import mcp`",
                p.display()
            ))
        };
    }
    // scripts/test-all's venv already holds the SDK; a separate one is made only without it.
    if let Ok(shared) = vibeos_testkit::venv_python(MCP_CLIENT_MODULES) {
        return Ok(shared);
    }
    let venv = vibeos_testkit::target_dir().join("mcp-venv");
    let py = venv.join("bin").join("python");
    if py.exists() && imports_mcp(&py) {
        return Ok(py);
    }
    let made = Command::new(python3())
        .args(["-m", "venv", "--clear"])
        .arg(&venv)
        .output()
        .map_err(|e| format!("cannot run python3 -m venv: {e}"))?;
    if !made.status.success() {
        return Err(format!(
            "python3 -m venv failed (Debian needs the python3-venv package): {}",
            String::from_utf8_lossy(&made.stderr).trim()
        ));
    }
    let pip = Command::new(&py)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "mcp",
        ])
        .output()
        .map_err(|e| format!("cannot run pip: {e}"))?;
    if !pip.status.success() || !imports_mcp(&py) {
        return Err(format!(
            "pip could not install the `mcp` package (the MCP Python SDK): {}",
            String::from_utf8_lossy(&pip.stderr).trim()
        ));
    }
    Ok(py)
}

/// Runs `fixtures/mcp/scenario_<name>.py` in `sb` and returns its JSON report, or `None` (after
/// saying why) when the MCP Python SDK is missing.
fn scenario(sb: &Sandbox, name: &str) -> Option<Value> {
    let py = match mcp_python() {
        Ok(p) => p,
        Err(why) => {
            vibeos_testkit::skip!(None; "mcp scenario {name}: {why}");
        }
    };
    let dir = workspace_root().join("fixtures").join("mcp");
    let out = Command::new(py)
        .arg(dir.join(format!("scenario_{name}.py")))
        .env("PYTHONPATH", &dir)
        .env("VIBEOS_EXEC_BIN", exec_bin())
        .env("VIBEOS_HOME", sb.home())
        .env("TMPDIR", sb.tmp())
        .env_remove("VIRTUAL_ENV")
        .env_remove("TERMINAL_CWD")
        .current_dir(sb.work())
        .output()
        .expect("run the scenario");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "scenario {name} failed ({:?})\nstdout: {stdout}\nstderr: {stderr}\nserver log: {}",
        out.status,
        server_log(sb)
    );
    let last = stdout.lines().last().unwrap_or("");
    Some(serde_json::from_str(last).unwrap_or_else(|e| {
        panic!("scenario {name} printed no JSON report ({e}): {stdout}\nstderr: {stderr}")
    }))
}

/// What the stdio servers of a scenario wrote to stderr (the harness appends it there).
fn server_log(sb: &Sandbox) -> String {
    std::fs::read_to_string(sb.root.path().join("serve-stderr.log")).unwrap_or_default()
}

/// `[is_error, text result, structuredContent]` of an execute_code call.
fn parts(v: &Value) -> (bool, &Value, &Value) {
    (v[0].as_bool().expect("is_error"), &v[1], &v[2])
}

#[test]
fn mcp_initialize_list_tools_and_run_scripts_that_call_tools() {
    let sb = Sandbox::new();
    let Some(r) = scenario(&sb, "basic") else {
        return;
    };
    assert_eq!(r["server_name"], "vibeos-exec");
    let tools = r["tools"].as_array().unwrap();
    assert_eq!(
        tools.len(),
        1,
        "only execute_code without --toolsets: {tools:?}"
    );
    assert_eq!(tools[0]["name"], "execute_code");
    let description = tools[0]["description"].as_str().unwrap();
    assert!(
        description.contains("from vibeos_tools import read_file, write_file"),
        "the description lists the script tools available now: {description}"
    );
    assert!(
        description.contains("killed after 60s") && description.contains("at most 20 tool calls"),
        "the description states serve's --timeout and --max-tool-calls: {description}"
    );
    assert_eq!(tools[0]["schema"]["required"], serde_json::json!(["code"]));
    // The bounds the server enforces are in the schema the client sees.
    let timeout = &tools[0]["schema"]["properties"]["timeout"];
    assert_eq!(timeout["exclusiveMinimum"], 0, "{timeout}");
    assert_eq!(timeout["maximum"], 86_400, "{timeout}");

    let (is_error, text, structured) = parts(&r["ok"]);
    assert!(!is_error);
    assert_eq!(text["status"], "success");
    assert_eq!(text["output"], "read 3 files\n");
    assert_eq!(text["tool_calls_made"], 6);
    assert_eq!(
        text, structured,
        "structuredContent is the same result object"
    );
    assert!(sb.work().join("note2.txt").exists());

    let (is_error, text, _) = parts(&r["failed"]);
    assert!(is_error, "isError when status is not success");
    assert_eq!(text["status"], "error");
    assert_eq!(text["exit_code"], 3);
    assert_eq!(text["output"], "oops\n");

    let (_, text, _) = parts(&r["over_budget"]);
    let out = text["output"].as_str().unwrap();
    assert!(
        out.contains("Tool call limit reached (1)"),
        "the per-call max_tool_calls overrides serve's: {out}"
    );
    assert_eq!(text["tool_calls_made"], 1);

    // Output limits are per call too (SPEC §5).
    let (_, text, _) = parts(&r["capped"]);
    assert_eq!(
        (
            text["stdout_bytes"].as_u64(),
            text["stderr_bytes"].as_u64(),
            text["truncated"].as_bool()
        ),
        (Some(5001), Some(5000), Some(true)),
        "{text}"
    );
    let omitted = text["stdout_bytes_omitted"].as_u64().unwrap_or(0);
    assert!((4001..5001).contains(&omitted), "{text}");
    assert!(
        text["stderr_bytes_omitted"].as_u64().unwrap_or(0) >= 4700,
        "{text}"
    );
    assert!(sb.staging_dirs().is_empty(), "{:?}", sb.staging_dirs());
}

#[test]
fn mcp_concurrent_calls_are_bounded_queued_and_report_progress() {
    let sb = Sandbox::new();
    let Some(r) = scenario(&sb, "concurrent_calls") else {
        return;
    };
    let mut spans = Vec::new();
    for res in r["results"].as_array().unwrap() {
        let (is_error, text, _) = parts(res);
        assert!(!is_error, "{text}");
        let t: Value = serde_json::from_str(text["output"].as_str().unwrap().trim()).unwrap();
        spans.push((t["start"].as_f64().unwrap(), t["end"].as_f64().unwrap()));
    }
    assert_eq!(spans.len(), 5);
    // Most scripts alive at any one moment: sample at each start.
    let max_overlap = spans
        .iter()
        .map(|(s, _)| spans.iter().filter(|(a, b)| a <= s && s < b).count())
        .max()
        .unwrap();
    assert_eq!(
        max_overlap, 2,
        "--max-concurrent 2: two run together, never more: {spans:?}"
    );
    let progress = r["progress"].as_array().unwrap();
    let messages: Vec<&str> = progress
        .iter()
        .flat_map(|p| p.as_array().unwrap())
        .map(|m| m["message"].as_str().unwrap_or(""))
        .collect();
    assert!(
        messages.iter().any(|m| m.starts_with("queued")),
        "queued calls hear why they wait: {messages:?}"
    );
    // The two calls that started first took free slots: neither hears it was queued.
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by(|a, b| spans[*a].0.total_cmp(&spans[*b].0));
    for &first in &order[..2] {
        let heard: Vec<&str> = progress[first]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["message"].as_str())
            .filter(|m| m.starts_with("queued"))
            .collect();
        assert!(
            heard.is_empty(),
            "a call that got a free slot was told it was queued: {heard:?}"
        );
    }
    for p in progress {
        let p = p.as_array().unwrap();
        assert!(
            p.iter()
                .any(|m| m["message"].as_str().unwrap_or("").starts_with("running")),
            "every call reports progress while it runs: {p:?}"
        );
        let values: Vec<f64> = p.iter().map(|m| m["progress"].as_f64().unwrap()).collect();
        assert!(
            values.windows(2).all(|w| w[0] < w[1]),
            "progress increases: {values:?}"
        );
    }
}

#[test]
fn mcp_cancellation_interrupts_the_execution_and_the_session_goes_on() {
    let sb = Sandbox::new();
    let Some(r) = scenario(&sb, "cancel") else {
        return;
    };
    assert_eq!(r["timed_out_waiting"], false);
    assert_eq!(
        r["pid_alive_after_cancel"], false,
        "the script is stopped when the client cancels"
    );
    assert!(r["seconds_to_stop"].as_f64().unwrap() < 8.0, "{r}");
    let (is_error, text, _) = parts(&r["after"]);
    assert!(!is_error);
    assert_eq!(text["output"], "still serving\n");
    let log = server_log(&sb);
    assert!(
        log.contains("status interrupted (cancelled by the client)"),
        "the cancelled execution ended as interrupted: {log}"
    );
    assert!(sb.staging_dirs().is_empty());
    assert_eq!(r["terminal_alive_after_cancel"], false, "{r}");
    assert_eq!(r["terminal_finished_anyway"], false, "{r}");
    let (is_error, text, _) = parts(&r["terminal_after"]);
    assert!(!is_error, "{r}");
    assert_eq!(text["output"], "still serving\n");
}

#[test]
fn mcp_bad_json_rpc_over_stdio_gets_error_codes_and_a_disconnect_cleans_up() {
    let sb = Sandbox::new();
    let Some(r) = scenario(&sb, "raw_stdio") else {
        return;
    };
    let replies = &r["replies"];
    let code = |name: &str| replies[name]["error"]["code"].as_i64();
    assert_eq!(code("not_json"), Some(-32700), "{}", replies["not_json"]);
    assert_eq!(code("binary"), Some(-32700));
    assert_eq!(code("not_jsonrpc"), Some(-32600));
    assert_eq!(code("batch"), Some(-32600));
    assert_eq!(code("oversized"), Some(-32600));
    assert_eq!(
        replies["oversized"]["id"], 91,
        "the id of the discarded request"
    );
    assert!(replies["oversized"]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("larger than 4096 bytes"));
    assert_eq!(code("unknown_method"), Some(-32601));
    assert_eq!(replies["unknown_method"]["id"], 10);
    assert_eq!(code("unknown_tool"), Some(-32602));
    assert_eq!(replies["unknown_tool"]["id"], 11);
    for (name, id) in [
        ("args_not_object", 12),
        ("code_wrong_type", 13),
        ("timeout_wrong_type", 14),
        ("mode_per_call", 15),
        ("missing_code", 16),
    ] {
        assert_eq!(code(name), Some(-32602), "{name}: {}", replies[name]);
        assert_eq!(replies[name]["id"], id, "{name}");
    }
    assert_eq!(replies["after"]["result"]["isError"], false);
    assert_eq!(
        replies["after"]["result"]["structuredContent"]["output"], "alive\n",
        "still serving after every bad line"
    );

    assert_eq!(
        r["exit_code"], 0,
        "closing stdin ends the server cleanly: {}",
        r["stderr"]
    );
    assert_eq!(
        r["pids_alive"],
        serde_json::json!([false, false]),
        "the script and its child are gone after the client left"
    );
    assert_eq!(r["staging_left"], serde_json::json!([]));
    assert!(r["stderr"].as_str().unwrap().contains("status interrupted"));
}

/// An oversized request from the official client gets its error under its own id (a reply
/// with a null id left the client's call waiting forever), and the session goes on.
#[test]
fn mcp_an_oversized_call_is_answered_and_the_session_goes_on() {
    let sb = Sandbox::new();
    let Some(r) = scenario(&sb, "oversized") else {
        return;
    };
    assert_eq!(r["refused"]["code"], -32600, "{r}");
    assert!(
        r["refused"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("larger than 65536 bytes")),
        "{r}"
    );
    assert_eq!(r["unparsable"]["code"], -32700, "{r}");
    let (is_error, _, structured) = parts(&r["after"]);
    assert!(!is_error, "{r}");
    assert_eq!(structured["output"], "alive\n");
}

#[test]
fn mcp_streamable_http_serves_several_clients_and_rejects_bad_bodies() {
    let sb = Sandbox::new();
    let Some(r) = scenario(&sb, "http") else {
        return;
    };
    assert!(r["url"].as_str().unwrap().starts_with("http://127.0.0.1:"));
    for n in ["0", "1", "2"] {
        assert_eq!(r["tools"][n], serde_json::json!(["execute_code"]));
        let (is_error, text, _) = parts(&r["results"][n]);
        assert!(!is_error, "{text}");
        assert_eq!(text["output"], format!("1|client {n}\n"));
    }
    let raw = &r["raw"];
    let body = |name: &str| -> Value {
        serde_json::from_str(raw[name]["body"].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{name}: not a JSON-RPC error body ({e}): {raw}"))
    };
    assert_eq!(raw["not_json"]["status"], 400);
    assert_eq!(body("not_json")["error"]["code"], -32700);
    assert_eq!(raw["not_jsonrpc"]["status"], 400);
    assert_eq!(body("not_jsonrpc")["error"]["code"], -32600);
    assert_eq!(body("args_not_object")["error"]["code"], -32602);
    assert_eq!(body("args_not_object")["id"], 5);
    assert_eq!(raw["oversized"]["status"], 413);
    assert_eq!(body("oversized")["error"]["code"], -32600);
    // What the SDK refuses in plain text (no session, an unknown one) comes as a JSON-RPC
    // error with the SDK's words and the request's id.
    for (name, id) in [("no_session", 8), ("unknown_session", 9)] {
        assert!(
            raw[name]["status"]
                .as_u64()
                .is_some_and(|s| (400..500).contains(&s)),
            "{raw}"
        );
        assert_eq!(raw[name]["content_type"], "application/json", "{raw}");
        assert_eq!(body(name)["error"]["code"], -32600, "{raw}");
        assert_eq!(body(name)["id"], id, "{raw}");
        assert!(
            body(name)["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("ession")),
            "{raw}"
        );
    }

    assert_eq!(
        r["vanished_client_pid_alive"], false,
        "a client that leaves mid-run gets its execution stopped"
    );
    assert_eq!(
        r["dropped_connection_pid_alive"], false,
        "a client whose connection drops mid-run gets its execution stopped"
    );
    let (is_error, text, _) = parts(&r["after"]);
    assert!(!is_error);
    assert_eq!(text["output"], "ok\n");
    assert_eq!(r["exit_code"], 0, "SIGTERM stops the HTTP server cleanly");
    assert_eq!(r["staging_left"], serde_json::json!([]));
}

/// A closed HTTP session's background processes end with it (they ran on, out of reach of
/// every other session's `process`, until the server exited; stop 60's probe).
#[test]
fn a_closed_http_session_ends_its_background_processes() {
    let sb = Sandbox::new();
    let Some(r) = scenario(&sb, "http_background") else {
        return;
    };
    assert_eq!(r["started"], true, "{r}");
    assert_eq!(r["running_while_open"], true, "{r}");
    assert_eq!(r["running_after_close"], false, "{r}");
    assert_eq!(r["server_alive"], true, "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
}

#[test]
fn mcp_http_sessions_are_capped_and_delete_succeeds() {
    let sb = Sandbox::new();
    let Some(r) = scenario(&sb, "http_sessions") else {
        return;
    };
    assert_eq!(r["opened"], serde_json::json!([true, true]), "{r}");
    assert_eq!(r["third"]["status"], 503, "{r}");
    let body: Value = serde_json::from_str(r["third"]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["error"]["code"], -32000);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--max-sessions"));
    // Probe of stop 55: at the cap, only a request that would open a session is refused; the
    // others keep their usual answers.
    let body = |name: &str| -> Value {
        serde_json::from_str(r[name]["body"].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{name}: no JSON-RPC body ({e}): {r}"))
    };
    assert_eq!(r["cap_ping"]["status"], 400, "{r}");
    assert!(body("cap_ping")["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Session ID is required"));
    assert_eq!(r["cap_garbage"]["status"], 400, "{r}");
    assert_eq!(body("cap_garbage")["error"]["code"], -32700, "{r}");
    assert_eq!(r["cap_text_plain"]["status"], 415, "{r}");
    assert_eq!(body("third")["id"], 1, "the busy refusal names its request");
    // Only the MCP path is served.
    assert_eq!(r["other_path"]["status"], 404, "{r}");
    assert_eq!(body("other_path")["id"], 2, "{r}");
    // The same id twice within a session: the second is refused, the first answers.
    assert_eq!(r["http_duplicate_first"]["status"], 200, "{r}");
    let first = r["http_duplicate_first"]["body"].as_str().unwrap();
    assert!(
        first.contains(r#""id":5,"result""#) && first.contains(r#"\"output\":\"first\\n\""#),
        "{r}"
    );
    assert_eq!(r["http_duplicate_second"]["status"], 400, "{r}");
    assert_eq!(body("http_duplicate_second")["error"]["code"], -32600);
    assert_eq!(body("http_duplicate_second")["id"], 5);
    assert_eq!(r["http_reused_after_answer"]["status"], 200, "{r}");
    assert_eq!(r["delete_status"], 200, "{r}");
    let (is_error, text, _) = parts(&r["after"]);
    assert!(!is_error, "{text}");
    assert_eq!(text["output"], "ok\n");
    assert_eq!(r["sdk_warnings"], serde_json::json!([]), "{r}");
    assert_eq!(r["exit_code"], 0);
    // Probe of stop 54: 40 initializes at once against a cap of 4 (one taken by the loopback
    // Origin's session) open exactly 3 more.
    assert_eq!(r["loopback_origin"], 200, "{r}");
    assert_eq!(r["burst_opened"], 3, "{r}");
    assert_eq!(r["burst_busy"], 37, "{r}");
    assert_eq!(r["foreign_origin"]["status"], 403, "{r}");
    let body: Value = serde_json::from_str(r["foreign_origin"]["body"].as_str().unwrap()).unwrap();
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Origin"));
    assert_eq!(
        body["id"], 1,
        "the request's id, as in the 403 for a foreign Host"
    );
    assert_eq!(r["null_origin"], 403, "{r}");
    assert_eq!(r["delete_unknown"]["status"], 404, "{r}");
    let body: Value = serde_json::from_str(r["delete_unknown"]["body"].as_str().unwrap()).unwrap();
    assert_eq!(body["error"]["code"], -32600);
    let refused = &r["get_without_session"];
    assert!(
        refused["status"]
            .as_u64()
            .is_some_and(|s| (400..500).contains(&s)),
        "{r}"
    );
    let body: Value = serde_json::from_str(refused["body"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("a GET refusal is no JSON-RPC error ({e}): {r}"));
    assert_eq!(body["error"]["code"], -32600);
    assert_eq!(r["burst_exit_code"], 0);
    assert_eq!(r["other_loopback"], 200, "{r}");
}

/// Probe of stop 55, over stdio: a request reusing the id of one still running is refused
/// (-32600) while the first gets its own response; no progress arrives for a cancelled call,
/// queued or being stopped; params that are not an object are -32602; an agent-loop tool is
/// named as such; a toolset that adds no tool is logged with the reason.
#[test]
fn mcp_reused_ids_are_refused_and_cancelled_calls_report_no_progress() {
    let sb = Sandbox::new();
    let Some(r) = scenario(&sb, "ids_and_progress") else {
        return;
    };
    let dup = r["duplicate"].as_array().expect("replies to id 5");
    assert_eq!(dup.len(), 2, "one reply per request: {r}");
    let refused = dup.iter().find(|m| m.get("error").is_some()).expect("{r}");
    assert_eq!(refused["error"]["code"], -32600, "{r}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("in use by a request still running")),
        "{r}"
    );
    let answered = dup.iter().find(|m| m.get("result").is_some()).expect("{r}");
    assert_eq!(
        answered["result"]["structuredContent"]["output"], "first\n",
        "the first request gets its own response: {r}"
    );
    assert_eq!(r["reused_after_answer"], true);

    assert_eq!(r["params_array"]["error"]["code"], -32602, "{r}");
    assert_eq!(r["params_array"]["id"], 6);
    assert_eq!(r["todo"]["error"]["code"], -32602, "{r}");
    assert!(
        r["todo"]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`todo` is an agent-loop tool")),
        "{r}"
    );

    assert_eq!(
        r["queued_progress_after_cancel"],
        serde_json::json!([]),
        "{r}"
    );
    assert_eq!(r["queued_replies"], serde_json::json!([]), "{r}");
    assert!(
        r["running_progress_before_cancel"].as_u64() >= Some(2),
        "{r}"
    );
    assert_eq!(
        r["running_progress_after_cancel"],
        serde_json::json!([]),
        "no progress while a cancelled script is being stopped: {r}"
    );
    assert_eq!(r["running_replies"], serde_json::json!([]), "{r}");
    assert_eq!(
        r["eleven_while_stopping"]["error"]["code"], -32600,
        "the id of a cancelled call is taken until its handler returns: {r}"
    );
    assert_eq!(
        r["eleven_again"]["result"]["structuredContent"]["output"], "eleven again\n",
        "{r}"
    );
    assert_eq!(
        r["after"]["result"]["structuredContent"]["output"], "after\n",
        "{r}"
    );

    let log = r["stderr"].as_str().unwrap();
    for toolset in ["delegation", "memory", "todo", "web"] {
        assert!(
            log.contains(&format!("--toolsets {toolset}: no tool of it is offered")),
            "{toolset}: {log}"
        );
    }
    assert!(
        log.contains("an agent-loop tool, which serve never offers"),
        "{log}"
    );
    assert!(log.contains("web_search: unavailable ("), "{log}");
}

#[test]
fn mcp_toolsets_offer_the_registry_tools_of_those_toolsets() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.work().join("victim")).unwrap();
    std::fs::write(sb.work().join("victim/precious.txt"), "keep me").unwrap();
    let Some(r) = scenario(&sb, "toolsets") else {
        return;
    };
    assert_eq!(
        r["names"],
        serde_json::json!([
            "execute_code",
            "patch",
            "read_file",
            "search_files",
            "write_file"
        ])
    );
    assert_eq!(r["wrote"]["is_error"], false);
    assert_eq!(r["read"]["is_error"], false);
    assert_eq!(r["read"]["structured"]["content"], "     1|direct call\n");
    assert_eq!(r["missing"]["is_error"], true);
    assert!(r["missing"]["text"]
        .as_str()
        .unwrap()
        .contains("FileNotFound"));
    let preset: Vec<&str> = r["preset"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(preset.contains(&"terminal"), "{preset:?}");
    for agent_loop in ["todo", "memory", "session_search", "delegate_task"] {
        assert!(
            !preset.contains(&agent_loop),
            "{agent_loop} offered: {preset:?}"
        );
    }
    assert_eq!(r["ran"]["is_error"], false, "{}", r["ran"]);
    assert_eq!(r["ran"]["structured"]["exit_code"], 0);
    assert_eq!(r["failed"]["is_error"], false, "{}", r["failed"]);
    assert_eq!(r["failed"]["structured"]["exit_code"], 3);
    assert_eq!(r["refused"]["is_error"], true, "{}", r["refused"]);
    assert!(r["refused"]["text"].as_str().unwrap().contains("hardline"));
    // process(write) into a background shell goes through the approval terminal does.
    assert_eq!(r["written_rm"]["is_error"], true, "{}", r["written_rm"]);
    assert!(
        r["written_rm"]["text"]
            .as_str()
            .unwrap()
            .contains("CommandDenied"),
        "{}",
        r["written_rm"]
    );
    let typed = &r["typed"];
    for (case, refused) in [
        ("split_first", false),
        ("split_rest", true),
        ("backspace", true),
        ("assign", false),
        ("variable", true),
    ] {
        assert_eq!(typed[case]["is_error"], refused, "{case}: {}", typed[case]);
        if refused {
            assert!(
                typed[case]["text"]
                    .as_str()
                    .unwrap()
                    .contains("CommandDenied"),
                "{case}: {}",
                typed[case]
            );
        }
    }
    assert_eq!(r["written_echo"]["is_error"], false, "{r}");
    assert!(r["shell_saw"].as_str().unwrap().contains("fine-42"), "{r}");
    assert!(sb.work().join("victim/precious.txt").exists());
}

#[test]
fn serve_offers_configured_mcp_servers_tools_to_clients_and_scripts() {
    // The probe's finding: `serve` ignored `mcp_servers:` (`--toolsets mcp-probe` was an unknown
    // toolset, and scripts through serve did not get a script-callable server's tool that `run`
    // gets with the same config).
    let server_py = match vibeos_testkit::venv_python("mcp.server.mcpserver") {
        Ok(p) => p,
        Err(missing) => vibeos_testkit::skip!("missing {missing}"),
    };
    let sb = Sandbox::new();
    let state = sb.root.path().join("server-state");
    std::fs::create_dir_all(&state).unwrap();
    sb.write_config(&format!(
        "mcp_servers:\n  probe:\n    command: {}\n    args: [{}]\n    connect_timeout: 30\n    script_callable: [echo]\n    env:\n      FIXTURE_STATE_DIR: {}\n  ghost:\n    command: /nonexistent/mcp-ghost\n",
        server_py.display(),
        workspace_root()
            .join("fixtures/mcp_servers/stdio_server.py")
            .display(),
        state.display()
    ));
    let Some(r) = scenario(&sb, "mcp_extensions") else {
        return;
    };
    let names: Vec<&str> = r["names"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for tool in ["execute_code", "echo", "add", "getenv"] {
        assert!(names.contains(&tool), "{tool} not offered: {names:?}");
    }
    assert_eq!(r["echo"]["is_error"], false, "{r}");
    assert_eq!(r["echo"]["structured"]["echo"], "direct", "{r}");
    assert_eq!(r["add"]["structured"]["result"], 5, "{r}");
    for key in ["script", "plain_script"] {
        assert_eq!(r[key]["result"]["status"], "success", "{key}: {r}");
        assert_eq!(
            r[key]["result"]["output"], "from a served script\n",
            "{key}: {r}"
        );
    }
    assert_eq!(r["plain_names"], serde_json::json!(["execute_code"]), "{r}");
    // The server that cannot start is skipped; the rest of --toolsets is served.
    let ghost: Vec<&str> = r["ghost_names"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        ghost.contains(&"execute_code") && ghost.contains(&"read_file"),
        "{ghost:?}"
    );
    assert!(
        server_log(&sb).contains("`mcp-ghost` skipped: MCP server `ghost` failed"),
        "{}",
        server_log(&sb)
    );
    // Every server a serve started was stopped when it exited.
    let pids: Vec<i32> = std::fs::read_to_string(state.join("starts"))
        .expect("the server recorded its starts")
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert!(!pids.is_empty());
    for pid in pids {
        assert!(
            !vibeos_testkit::pid_alive(pid),
            "MCP server {pid} outlived its serve"
        );
    }
    // Strict mode keeps its rules: an MCP tool is not one it can confine.
    assert_eq!(
        r["strict_names"],
        serde_json::json!(["execute_code"]),
        "{r}"
    );
    assert_eq!(r["strict_echo"]["refused"], true, "{r}");
    assert!(
        r["strict_echo"]["message"]
            .as_str()
            .unwrap()
            .contains("strict mode cannot confine `echo`"),
        "{r}"
    );
}

#[test]
fn strict_serve_confines_the_tools_it_offers_directly() {
    // The probe's finding: `serve --mode strict --toolsets file,terminal` read /etc/shadow,
    // wrote outside every root and ran commands as root through direct MCP calls. Over stdio
    // and HTTP alike, the direct tools must follow a strict script's rules.
    let sb = Sandbox::new();
    let root = sb.root.path().to_path_buf();
    let secret = format!("TOP-SECRET-{}", std::process::id());
    std::fs::create_dir_all(root.join("outside")).unwrap();
    std::fs::write(root.join("outside/secret.txt"), format!("{secret}\n")).unwrap();
    std::fs::create_dir_all(root.join("shared")).unwrap();
    std::fs::write(root.join("shared/readable.txt"), "shared data\n").unwrap();
    sb.write_config(&format!(
        "code_execution:\n  strict:\n    read_roots: [{}]\n",
        root.join("shared").display()
    ));
    std::fs::write(
        root.join("terminal-config.yaml"),
        "code_execution:\n  strict:\n    terminal: true\n",
    )
    .unwrap();
    let shadow = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
    let Some(r) = scenario(&sb, "strict_toolsets") else {
        return;
    };
    for transport in ["stdio", "http"] {
        let t = &r[transport];
        assert_eq!(
            t["names"],
            serde_json::json!([
                "execute_code",
                "patch",
                "read_file",
                "search_files",
                "write_file"
            ]),
            "{transport}: terminal and process must not be listed in strict mode"
        );
        // Refused as a tool error naming the policy, and nothing of the file in the reply.
        for key in [
            "read_outside",
            "read_dotdot",
            "read_shadow",
            "search_outside",
            "patch_outside",
        ] {
            let c = &t[key];
            assert_eq!(c["refused"], false, "{transport} {key}: {c}");
            assert_eq!(c["is_error"], true, "{transport} {key}: {c}");
            let text = c["text"].as_str().unwrap();
            assert!(
                text.contains("OutsideSandbox") || text.contains("strict mode"),
                "{transport} {key}: {text}"
            );
            assert!(!text.contains(&secret), "{transport} {key} leaked: {text}");
            if let Some(line) = shadow.lines().next() {
                assert!(!text.contains(line), "{transport} {key} leaked /etc/shadow");
            }
        }
        for key in ["write_outside", "write_read_root"] {
            let c = &t[key];
            assert_eq!(c["is_error"], true, "{transport} {key}: {c}");
            assert!(
                c["text"].as_str().unwrap().contains("OutsideSandbox"),
                "{transport} {key}: {c}"
            );
        }
        // Inside the cwd and the read root the tools still work.
        assert_eq!(t["write_inside"]["is_error"], false, "{transport}: {t}");
        assert!(
            t["read_inside"]["text"]
                .as_str()
                .unwrap()
                .contains("in the cwd"),
            "{transport}: {t}"
        );
        assert!(
            t["read_read_root"]["text"]
                .as_str()
                .unwrap()
                .contains("shared data"),
            "{transport}: {t}"
        );
        for tool in ["terminal", "process"] {
            let c = &t[tool];
            assert_eq!(c["refused"], true, "{transport} {tool}: {c}");
            assert_eq!(c["code"], -32602, "{transport} {tool}: {c}");
            let message = c["message"].as_str().unwrap();
            assert!(
                message.contains("strict mode")
                    && message.contains("code_execution.strict.terminal: true"),
                "{transport} {tool}: {message}"
            );
        }
    }
    assert_eq!(r["http_exit"], 0, "{r}");
    assert!(!root.join("outside/planted.txt").exists());
    assert!(!root.join("shared/planted.txt").exists());
    assert!(
        !sb.work().join("terminal-ran.txt").exists(),
        "a refused terminal call ran its command"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("outside/secret.txt")).unwrap(),
        format!("{secret}\n"),
        "patch changed a file outside the roots"
    );
    assert_eq!(
        std::fs::read_to_string(sb.work().join("inside.txt")).unwrap(),
        "in the cwd\n"
    );
    // code_execution.strict.terminal: true is the operator's explicit opening, as for scripts;
    // the file tools stay confined.
    let opened = &r["opened"];
    let names: Vec<&str> = opened["names"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        names.contains(&"terminal") && names.contains(&"process"),
        "{names:?}"
    );
    assert_eq!(opened["terminal"]["is_error"], false, "{opened}");
    assert!(opened["terminal"]["text"]
        .as_str()
        .unwrap()
        .contains("opened"));
    assert_eq!(opened["read_outside"]["is_error"], true, "{opened}");
    assert!(!opened["read_outside"]["text"]
        .as_str()
        .unwrap()
        .contains(&secret));
}

#[test]
fn serve_refuses_non_loopback_addresses_and_bad_settings() {
    let sb = Sandbox::new();
    for (args, expect) in [
        (
            vec!["serve", "--http", "0.0.0.0:8080"],
            "not a loopback address",
        ),
        (
            vec!["serve", "--http", "192.168.1.10:80"],
            "not a loopback address",
        ),
        (vec!["serve", "--http", "[::]:80"], "not a loopback address"),
        (
            vec!["serve", "--http", "example.com:80"],
            "only IP addresses and localhost are accepted",
        ),
        (vec!["serve", "--http", "127.0.0.1"], "is not an address"),
        (vec!["serve", "--toolsets", "no_such_toolset"], "--toolsets"),
        (
            vec!["serve", "--max-concurrent", "0"],
            "--max-concurrent must be at least 1",
        ),
        (vec!["serve", "--mode", "loose"], "is not a mode"),
        (
            vec!["serve", "--timeout=-1"],
            "not a usable number of seconds",
        ),
    ] {
        let out = sb.run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
    }
}

#[test]
fn serve_help_documents_the_options() {
    let sb = Sandbox::new();
    let out = sb.run(&["serve", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for word in [
        "--http",
        "--toolsets",
        "--max-concurrent",
        "--mode",
        "--timeout",
        "--max-tool-calls",
        "--cwd",
        "--config",
        "notifications/cancelled",
        "progressToken",
    ] {
        assert!(help.contains(word), "serve --help mentions {word}: {help}");
    }
}

/// The JSON after `prefix` on a line of an execution's output.
fn tagged(text: &Value, prefix: &str) -> Value {
    let out = text["output"].as_str().unwrap_or_default();
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix} line in {text}"));
    serde_json::from_str(line).unwrap()
}

#[test]
fn strict_executions_served_together_can_neither_slow_nor_watch_nor_open_each_other() {
    if let Some(why) = vibeos_testkit::strict_unavailable() {
        vibeos_testkit::skip!("strict mode is unavailable on this machine: {why}");
    }
    let sb = Sandbox::new();
    sb.write_config("code_execution:\n  pool_size: 2\n  strict:\n    max_processes: 64\n");
    let Some(r) = scenario(&sb, "strict_cross") else {
        return;
    };
    let (victim_err, victim, _) = parts(&r["victim"]);
    let (_, attacker, _) = parts(&r["attacker"]);
    assert!(!victim_err, "{victim}");
    let v = tagged(victim, "VICTIM ");
    let a = tagged(attacker, "ATTACKER ");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_ne!(v["uid"], a["uid"], "two live executions shared a uid");
        assert_ne!(v["uid"], 0);
    }
    assert_eq!(
        v["nice_before"], v["nice_after"],
        "the victim was reniced: {v}"
    );
    assert_eq!(
        v["affinity_before"], v["affinity_after"],
        "the victim was pinned: {v}"
    );
    assert_eq!(v["mode_before"], "0o700");
    assert_eq!(
        v["mode_after"], "0o700",
        "the victim's staging dir was opened"
    );
    assert_eq!(v["data_after"], "victim data");
    assert_eq!(
        v["forks_ok"], true,
        "the victim was starved of processes: {v}"
    );
    assert_ne!(
        a["prio_user"], 0,
        "setpriority(PRIO_USER) went through: {a}"
    );
    assert_eq!(a["hits"]["renice"], 0, "{a}");
    assert_eq!(a["hits"]["affinity"], 0, "{a}");
    assert_ne!(a["inotify"], 0, "inotify was available: {a}");
    assert!(
        a["siblings"].is_string(),
        "the staging parent was listed: {a}"
    );
    assert!(
        a["kids"].as_u64().unwrap() < 64,
        "the process limit did not hold: {a}"
    );
    let (after_err, after, _) = parts(&r["after"]);
    assert!(!after_err && after["output"] == "after\n", "{after}");
    assert!(sb.staging_dirs().is_empty(), "{:?}", sb.staging_dirs());
    assert!(vibeos_testkit::processes_mentioning(&sb.tmp().display().to_string()).is_empty());
}

#[test]
fn a_pinned_strict_uid_is_refused_on_a_server_with_a_warm_pool() {
    if let Some(why) = vibeos_testkit::strict_unavailable() {
        vibeos_testkit::skip!("strict mode is unavailable on this machine: {why}");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        vibeos_testkit::skip_even_in_ci!("strict uids are only chosen by a root supervisor");
    }
    let sb = Sandbox::new();
    sb.write_config("code_execution:\n  pool_size: 2\n  strict:\n    uid: 2113929300\n");
    let Some(r) = scenario(&sb, "strict_pinned") else {
        return;
    };
    let (_, text, _) = parts(&r["result"]);
    assert_eq!(text["status"], "error", "{text}");
    let error = text["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("code_execution.strict.uid") && error.contains("pool_size"),
        "{text}"
    );
    assert!(!text["output"].as_str().unwrap_or_default().contains("ran"));
}

#[test]
fn mcp_clients_answer_approvals_through_elicitation() {
    let sb = Sandbox::new();
    let Some(r) = scenario(&sb, "elicitation") else {
        return;
    };
    // Supporting client: asked once (the whole script), "session" covered the command too.
    let (is_error, text, _) = parts(&r["approved"]);
    assert!(!is_error, "{text}");
    assert_eq!(text["output"], "0 None\n", "{text}");
    let asked = r["approved_asked"].as_array().unwrap();
    assert_eq!(asked.len(), 1, "{asked:?}");
    let question = asked[0].as_str().unwrap();
    assert!(
        question.contains("recursive delete") && question.contains("rm -rf doomed1"),
        "{question}"
    );
    // Its "deny" stops the script before it runs.
    let (is_error, text, _) = parts(&r["denied"]);
    assert!(is_error);
    assert!(
        text["error"].as_str().unwrap().contains("was not run"),
        "{text}"
    );
    assert_eq!(r["denied_asked"].as_array().unwrap().len(), 1);
    // A client without elicitation: the script runs (headless policy), the command is denied
    // with the reason.
    let (_, text, _) = parts(&r["unsupported"]);
    let out = text["output"].as_str().unwrap();
    assert!(
        out.contains("does not support elicitation"),
        "no clear message: {out}"
    );
    assert_eq!(r["exists"]["doomed1"], false);
    assert_eq!(r["exists"]["doomed2"], true);
    assert_eq!(r["exists"]["doomed3"], true);
    // A cancelled form and a client error are named as such, not as the user's denial.
    for (key, expect) in [
        ("cancelled", "cancelled without a decision"),
        ("errored", "answered the approval request with an error"),
        (
            "shortcut",
            "was \"a\", not one of once, session, always, deny",
        ),
        ("number", "was 1, not one of once, session, always, deny"),
    ] {
        let (_, text, _) = parts(&r[key]);
        let out = text["output"].as_str().unwrap();
        assert!(out.contains(expect), "{key}: {text}");
        assert!(!out.contains("denied by the user"), "{key}: {out}");
        assert!(!out.contains("RAN"), "{key}: {out}");
    }
    let config = std::fs::read_to_string(sb.home().join("config.yaml")).unwrap_or_default();
    assert!(!config.contains("command_allowlist"), "{config}");
    // A question still open when its call is cancelled is withdrawn at once, not after
    // approvals.timeout (60 s), and the session goes on.
    let withdrawn = r["withdrawn_after"].as_f64();
    assert!(
        withdrawn.is_some_and(|s| s < 10.0),
        "the question stayed open: {}",
        r["withdrawn_after"]
    );
    let (_, text, _) = parts(&r["after_withdrawal"]);
    assert_eq!(text["output"], "still serving\n", "{text}");
}

/// Whether `O_NONBLOCK` is set on the open pipe `fd` refers to.
fn nonblocking(fd: &std::os::fd::OwnedFd) -> bool {
    let flags = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL).expect("F_GETFL");
    nix::fcntl::OFlag::from_bits_truncate(flags).contains(nix::fcntl::OFlag::O_NONBLOCK)
}

#[test]
fn serve_over_pipes_answers_and_leaves_the_pipes_it_shares_blocking() {
    use std::io::{BufRead, Write};
    let sb = Sandbox::new();
    // The server drives pipes on its runtime's poller, which needs them non-blocking; the flag
    // belongs to the open pipe, so a process sharing it (here, the test) would see it too.
    let (stdin_r, stdin_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
    let (stdout_r, stdout_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
    let (shared_in, shared_out) = (
        stdin_r.try_clone().expect("dup"),
        stdout_w.try_clone().expect("dup"),
    );
    let mut child = sb
        .command()
        .arg("serve")
        .stdin(std::process::Stdio::from(stdin_r))
        .stdout(std::process::Stdio::from(stdout_w))
        .spawn()
        .expect("serve starts");
    let mut to_server = std::fs::File::from(stdin_w);
    let mut from_server = std::io::BufReader::new(std::fs::File::from(stdout_r));
    let send = |to: &mut std::fs::File, line: &str| {
        to.write_all(line.as_bytes()).expect("write");
        to.write_all(b"\n").expect("write");
    };
    let mut reply = || -> Value {
        let mut line = String::new();
        from_server.read_line(&mut line).expect("reply");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    let init = handshake(&mut to_server, &mut reply);
    assert_eq!(
        init["result"]["serverInfo"]["name"], "vibeos-exec",
        "{init}"
    );
    let big = "x".repeat(200_000);
    send(
        &mut to_server,
        &format!(
            r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"execute_code","arguments":{{"code":"print('{big}')"}}}}}}"#
        ),
    );
    let call = reply();
    let output = call["result"]["structuredContent"]["output"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        output.starts_with("xxxx") && output.len() > 40_000,
        "a reply larger than a pipe's buffer arrives whole: {} bytes",
        output.len()
    );
    assert!(
        nonblocking(&shared_in),
        "the server reads stdin on its poller"
    );
    drop(to_server);
    let status = child.wait().expect("wait");
    assert!(status.success(), "closing stdin ends the server: {status}");
    assert!(
        !nonblocking(&shared_in) && !nonblocking(&shared_out),
        "the server put the pipes it shared back in blocking mode"
    );
    assert_eq!(sb.staging_dirs(), Vec::<PathBuf>::new());
}

/// A stdio `serve` the test talks to line by line, killed after a minute if the test is still
/// waiting on it then (or at once if the test failed): a server that does not answer as the
/// test expects would otherwise leave its reads waiting for ever.
struct WatchedServer {
    child: std::process::Child,
    to_server: Option<std::process::ChildStdin>,
    from_server: std::io::BufReader<std::process::ChildStdout>,
    finished: std::sync::mpsc::Sender<()>,
    watchdog: std::thread::JoinHandle<()>,
}

impl WatchedServer {
    /// Starts `serve ARGS` in `sb` and initializes the session.
    fn start(sb: &Sandbox, args: &[&str]) -> WatchedServer {
        let mut child = sb
            .command()
            .arg("serve")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("serve starts");
        let to_server = child.stdin.take();
        let from_server = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let (finished, watch) = std::sync::mpsc::channel::<()>();
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        // Disconnected (the test panicked) ends it at once; otherwise after a minute.
        let watchdog = std::thread::spawn(move || {
            if watch
                .recv_timeout(std::time::Duration::from_secs(60))
                .is_err()
            {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            }
        });
        let mut server = WatchedServer {
            child,
            to_server,
            from_server,
            finished,
            watchdog,
        };
        let mut to = server.to_server.take().expect("stdin");
        handshake(&mut to, &mut || {
            server.reply().expect("initialize answered")
        });
        server.to_server = Some(to);
        server
    }

    fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }

    /// Sends `execute_code(code)` under request id `id`.
    fn call(&mut self, id: u64, code: &str) {
        use std::io::Write;
        let line = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"execute_code\",\"arguments\":{{\"code\":{}}}}}}}\n",
            serde_json::to_string(code).unwrap()
        );
        let to = self.to_server.as_mut().expect("stdin open");
        to.write_all(line.as_bytes()).expect("write");
        to.flush().expect("flush");
    }

    /// The next message, `None` at the end of the server's output.
    fn reply(&mut self) -> Option<Value> {
        use std::io::BufRead;
        let mut line = String::new();
        match self.from_server.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))),
        }
    }

    /// Reads what is left and waits for the server's exit; `close_stdin` first closes its
    /// stdin (the client leaving), else stdin stays open until the server's output ends (a
    /// server stopped by a signal must end on its own, not by the end of its input).
    fn finish(mut self, close_stdin: bool) -> (std::process::ExitStatus, Vec<Value>) {
        let stdin = self.to_server.take();
        if close_stdin {
            drop(stdin);
        }
        let mut rest = Vec::new();
        while let Some(r) = self.reply() {
            rest.push(r);
        }
        let status = self.child.wait().expect("wait");
        let _ = self.finished.send(());
        let _ = self.watchdog.join();
        (status, rest)
    }
}

/// Waits (at most 30 s) until every one of `paths` exists.
fn wait_for_files(paths: &[PathBuf], what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !paths.iter().all(|p| p.exists()) {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A script that creates `started`, then waits until `release` exists (at most `seconds`).
fn held_script(started: &std::path::Path, release: &std::path::Path, seconds: u32) -> String {
    format!(
        "import os, time\nopen({:?}, 'w').close()\nend = time.time() + {seconds}\nwhile not os.path.exists({:?}) and time.time() < end: time.sleep(0.05)\nprint('held')",
        started.display().to_string(),
        release.display().to_string()
    )
}

/// The queue of calls waiting for a slot is bounded: past it a call is refused at once with a
/// "busy" error instead of held (200 queued calls of 900 KB took a server to 376 MB), the
/// calls already queued still run, and the session goes on.
#[test]
fn serve_refuses_calls_past_its_queue_and_runs_the_queued_ones() {
    let sb = Sandbox::new();
    let mut server = WatchedServer::start(&sb, &["--max-concurrent", "1"]);
    let (started, release) = (sb.work().join("started"), sb.work().join("release"));
    // One call holds the only slot until the test releases it.
    server.call(100, &held_script(&started, &release, 120));
    wait_for_files(&[started], "the holding call did not start");
    let queue = 64u64;
    for i in 0..=queue {
        server.call(101 + i, "print('queued')");
    }
    // One call past the queue (whichever the server took last: requests are handled side by
    // side) is answered first, at once, while the slot is still held.
    let refused = server.reply().expect("a reply");
    let refused_id = refused["id"].as_u64().unwrap_or(0);
    assert!((101..=101 + queue).contains(&refused_id), "{refused}");
    assert_eq!(refused["error"]["code"], -32000, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("the server is busy") && m.contains("64 calls")),
        "{refused}"
    );
    std::fs::write(&release, "").unwrap();
    let mut done = std::collections::BTreeMap::new();
    while done.len() < 1 + queue as usize {
        let r = server.reply().expect("a reply");
        let out = r["result"]["structuredContent"]["output"].clone();
        done.insert(r["id"].as_u64().unwrap_or(0), out);
    }
    assert_eq!(done[&100], "held\n");
    assert!(
        (101..=101 + queue)
            .filter(|id| *id != refused_id)
            .all(|id| done.get(&id).is_some_and(|o| o == "queued\n")),
        "{done:?}"
    );
    let (status, _) = server.finish(true);
    assert!(status.success(), "{status}");
}

/// SIGTERM answers every call before the server exits: the running ones with their
/// `interrupted` results, a queued one with "the server is shutting down" (running calls got
/// no response at all, and a queued one was told it had been cancelled by the client).
#[test]
fn serve_answers_its_calls_when_stopped_by_a_signal() {
    let sb = Sandbox::new();
    let mut server = WatchedServer::start(&sb, &["--max-concurrent", "2"]);
    let never = sb.work().join("never");
    let mut started = Vec::new();
    for id in [1u64, 2] {
        let path = sb.work().join(format!("started-{id}"));
        server.call(id, &held_script(&path, &never, 120));
        started.push(path);
    }
    wait_for_files(&started, "the calls did not start");
    server.call(3, "print('never')");
    std::thread::sleep(std::time::Duration::from_millis(300));
    nix::sys::signal::kill(server.pid(), nix::sys::signal::Signal::SIGTERM).expect("signal");
    let (status, rest) = server.finish(false);
    assert!(status.success(), "{status}");
    let answers: std::collections::BTreeMap<u64, Value> = rest
        .into_iter()
        .filter_map(|r| Some((r["id"].as_u64()?, r)))
        .collect();
    for id in [1u64, 2] {
        assert_eq!(
            answers
                .get(&id)
                .map(|r| r["result"]["structuredContent"]["status"].clone()),
            Some(Value::from("interrupted")),
            "{answers:?}"
        );
    }
    assert_eq!(
        answers.get(&3).map(|r| r["error"]["message"].clone()),
        Some(Value::from("the server is shutting down")),
        "{answers:?}"
    );
    assert_eq!(sb.staging_dirs(), Vec::<PathBuf>::new());
}

/// The same over HTTP: SIGTERM with one call running and one queued behind it answers both
/// before the server exits (the SDK's sessions ended with the signal, and both calls' response
/// streams closed unanswered: "SSE stream ended").
#[test]
fn serve_http_answers_its_calls_when_stopped_by_a_signal() {
    let sb = Sandbox::new();
    let Some(r) = scenario(&sb, "http_stop") else {
        return;
    };
    assert_eq!(
        r["running"]["result"][1]["status"], "interrupted",
        "the running call is answered with its interrupted result: {r}"
    );
    assert_eq!(
        r["queued"]["error"], "the server is shutting down",
        "the queued call is refused with the reason: {r}"
    );
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(sb.staging_dirs(), Vec::<PathBuf>::new());
}

/// `vibeos-exec serve --http 127.0.0.1:0` in `sb`, its stderr (past the line that announced
/// the address) and that address.
fn start_http_server(
    sb: &Sandbox,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStderr>,
    String,
) {
    use std::io::BufRead;
    let mut child = sb
        .command()
        .args(["serve", "--http", "127.0.0.1:0"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve starts");
    let mut stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut addr = None;
    let mut line = String::new();
    while addr.is_none() && stderr.read_line(&mut line).unwrap_or(0) > 0 {
        addr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .map(str::to_string);
        line.clear();
    }
    match addr {
        Some(addr) => (child, stderr, addr),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the server did not announce its address");
        }
    }
}

/// A connection that sends nothing, half a request line, or nothing more after a request, is
/// closed by the server once it has waited 30 s for headers: they stayed open for ever, and
/// about 1,000 of them used up a default descriptor limit and locked every client out.
#[test]
fn serve_http_closes_connections_that_send_no_headers() {
    use std::io::{Read, Write};
    let sb = Sandbox::new();
    let (mut child, mut stderr, addr) = start_http_server(&sb);
    // A failing assertion below must not leave the server running (nothing else ends it).
    struct EndOnPanic(nix::unistd::Pid);
    impl Drop for EndOnPanic {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
    let _end = EndOnPanic(nix::unistd::Pid::from_raw(child.id() as i32));
    // The server's log is drained so that it never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let connect = || {
        let c = std::net::TcpStream::connect(&addr).expect("connect");
        c.set_read_timeout(Some(std::time::Duration::from_secs(90)))
            .expect("timeout");
        c
    };
    let silent = connect();
    let mut half = connect();
    half.write_all(b"POST /mcp HTTP/1.1\r\nHo").expect("write");
    let mut kept_alive = connect();
    kept_alive
        .write_all(b"GET /other HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .expect("write");
    let started = std::time::Instant::now();
    // Each ends with the server closing it (end of file, or a reset), not with the read's own
    // 90 s timeout.
    let ended = |mut c: &std::net::TcpStream, what: &str| {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match c.read(&mut buf) {
                Ok(0) => return seen,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return seen,
                Err(e) => panic!("{what}: still open after {:?} ({e})", started.elapsed()),
            }
        }
    };
    ended(&silent, "a connection that sent nothing");
    ended(&half, "a connection that sent half a request line");
    let answered = ended(&kept_alive, "a kept-alive connection after its request");
    assert!(
        String::from_utf8_lossy(&answered).starts_with("HTTP/1.1 404"),
        "{}",
        String::from_utf8_lossy(&answered)
    );
    // The server still serves.
    let mut fresh = connect();
    fresh
        .write_all(b"GET /other HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .expect("write");
    let mut reply = String::new();
    let _ = fresh.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 404"), "{reply}");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status}");
}

#[test]
fn serve_stopped_before_a_client_initializes_ends_cleanly() {
    // A signal before the client's `initialize` ends the server as one after it does (exit 0);
    // a client that leaves without initializing is a failed session (exit 1), not a usage
    // error (both used to exit 2).
    let sb = Sandbox::new();
    let mut child = sb
        .command()
        .arg("serve")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let writer = child.stdin.take().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: plain signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    drop(writer);
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    let out = sb
        .command()
        .arg("serve")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("initialize"), "{stderr}");
}

#[test]
fn what_a_direct_terminal_call_leaves_running_ends_with_serve() {
    // The probe's finding: with `serve --toolsets terminal`, a client's direct `terminal` call
    // that started `sleep … &` or `setsid sleep … &` left both running after the client closed
    // stdin and the server exited.
    use std::io::{BufRead, Write};
    let sb = Sandbox::new();
    let mut child = sb
        .command()
        .args(["serve", "--toolsets", "terminal"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("serve starts");
    let mut to_server = child.stdin.take().unwrap();
    let mut from_server = std::io::BufReader::new(child.stdout.take().unwrap());
    let send = |to: &mut std::process::ChildStdin, line: &str| {
        to.write_all(line.as_bytes()).expect("write");
        to.write_all(b"\n").expect("write");
        to.flush().expect("flush");
    };
    let mut reply = || -> Value {
        let mut line = String::new();
        from_server.read_line(&mut line).expect("reply");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    let init = handshake(&mut to_server, &mut reply);
    assert_eq!(
        init["result"]["serverInfo"]["name"], "vibeos-exec",
        "{init}"
    );
    // Unique per run: another checkout's tests may share the machine.
    let tag = std::process::id() % 100_000 + 300_000;
    let command = format!(
        "sleep {tag}1 >/dev/null 2>&1 & setsid sleep {tag}2 >/dev/null 2>&1 & echo started"
    );
    send(
        &mut to_server,
        &serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "terminal", "arguments": {"command": command}}})
        .to_string(),
    );
    let call = reply();
    assert_eq!(
        call["result"]["structuredContent"]["output"], "started\n",
        "{call}"
    );
    // Found by their argv: `setsid` forks when it leads a group.
    let sleeps = || {
        vibeos_testkit::processes_where(|dir| {
            std::fs::read(dir.join("cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c).replace('\0', " ");
                c.trim_end() == format!("sleep {tag}1") || c.trim_end() == format!("sleep {tag}2")
            })
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while sleeps().len() < 2 {
        assert!(std::time::Instant::now() < deadline, "the sleeps never ran");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(to_server);
    let status = child.wait().expect("wait");
    assert!(status.success(), "closing stdin ends the server: {status}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let left = loop {
        let left = sleeps();
        if left.is_empty() || std::time::Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    for pid in &left {
        // SAFETY: kill has no memory preconditions; this only cleans up after a failure.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    assert!(left.is_empty(), "outlived serve: {left:?}");
}

/// The MCP handshake over raw pipes: `initialize` (its answer returned) and `initialized`.
fn handshake(to: &mut impl std::io::Write, reply: &mut impl FnMut() -> Value) -> Value {
    let mut send = |line: &str| {
        to.write_all(line.as_bytes()).expect("write");
        to.write_all(b"\n").expect("write");
        to.flush().expect("flush");
    };
    send(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"pipes","version":"1"}}}"#,
    );
    let init = reply();
    send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    init
}

/// Loopback keeps other machines out, not other users of this one: any local account could
/// open a session on `serve --http` and run code as the server's user (as root, for a root
/// server; stop 60's probe). Connections from another uid get a 403 that says why.
#[test]
fn serve_http_answers_only_its_own_user() {
    use std::io::{Read, Write};
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        vibeos_testkit::skip!("needs root to connect as another user (uid 65534)");
    }
    let sb = Sandbox::new();
    let (child, mut stderr, addr) = start_http_server(&sb);
    struct End(std::process::Child);
    impl Drop for End {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _end = End(child);
    let (log_tx, log_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = stderr.read_to_string(&mut rest);
        let _ = log_tx.send(rest);
    });
    let request = "GET /elsewhere HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    // The server's own user is answered (here: the path is not MCP's).
    let mut own = std::net::TcpStream::connect(&addr).expect("connect");
    own.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    own.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = own.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    // Another user is refused, whatever it asks.
    let (host, port) = addr.rsplit_once(':').unwrap();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "exec 3<>/dev/tcp/{host}/{port} && printf '{}' >&3 && timeout 30 cat <&3",
            request.replace('\r', "\\r").replace('\n', "\\n")
        ))
        .uid(65534)
        .gid(65534)
        .output()
        .expect("bash runs");
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer} {out:?}");
    assert!(
        answer.contains("answers its own user (uid 0) only")
            && answer.contains("client runs as uid 65534"),
        "{answer}"
    );
    drop(_end);
    let log = log_rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .unwrap_or_default();
    assert!(log.contains("refused a connection from uid 65534"), "{log}");
}
