//! End-to-end tests of the built-in tools as scripts see them: `vibeos-exec run` on fixture
//! scripts under fixtures/tools/, with real files, real shells and a real HTTP server.

// A test harness: a panic here is how a failed expectation is reported.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use vibeos_testkit::{pid_alive, Sandbox};

/// Runs a fixture and parses the JSON it printed.
fn run_tool_fixture(sb: &Sandbox, name: &str, args: &[&str]) -> Value {
    let result = sb.run_fixture(&format!("tools/{name}"), args);
    assert_eq!(
        result["status"], "success",
        "fixture {name} failed: {result:#}"
    );
    let output = result["output"].as_str().expect("output string");
    serde_json::from_str(output.trim())
        .unwrap_or_else(|e| panic!("fixture {name} printed no JSON ({e}): {output}"))
}

fn error_of(v: &Value) -> &str {
    v.get("error")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("expected an error dict, got {v}"))
}

#[test]
fn file_tools_chain_through_a_script() {
    let sb = Sandbox::new();
    let r = run_tool_fixture(&sb, "file_chain.py", &[]);
    assert_eq!(r["write"]["bytes_written"], 56);
    assert_eq!(r["write"]["created"], true);
    assert_eq!(
        r["read"]["content"],
        "     2|    if ready:\n     3|        return 1\n"
    );
    assert_eq!(r["read"]["total_lines"], 4);
    assert_eq!(r["read"]["next_offset"], 4);
    let m = &r["search"]["matches"];
    assert_eq!(m.as_array().map(Vec::len), Some(1));
    assert_eq!(m[0]["path"], "pkg/conf.yaml");
    assert_eq!(m[0]["line"], 1);
    assert_eq!(m[0]["content"], "database: pg");
    assert_eq!(r["search_all"]["total"], 2);
    assert_eq!(r["search_all"]["truncated"], true);
    assert_eq!(r["search_all"]["next_offset"], 1);
    assert_eq!(r["files"]["files"], serde_json::json!(["pkg/app.py"]));
    assert_eq!(r["count"]["counts"][0]["count"], 2);
    assert_eq!(r["replace"]["match"], "exact");
    assert!(r["replace"]["diff"]
        .as_str()
        .unwrap_or("")
        .contains("+    return 2"));
    assert_eq!(r["fuzzy"]["match"], "whitespace-tolerant");
    assert_eq!(r["multi"]["files"].as_array().map(Vec::len), Some(2));
    assert!(r["final_app"]
        .as_str()
        .unwrap_or("")
        .contains("        return 10\n"));
    assert!(r["final_app"]
        .as_str()
        .unwrap_or("")
        .contains("    return 2\n"));
    assert!(r["final_conf"]
        .as_str()
        .unwrap_or("")
        .contains("port: 5432"));
    assert_eq!(
        std::fs::read_to_string(sb.work().join("pkg/new.txt")).unwrap_or_default(),
        "created by patch\n"
    );
}

#[test]
fn concurrent_patches_of_one_file_from_script_threads_keep_every_edit() {
    let sb = Sandbox::new();
    let v = run_tool_fixture(&sb, "concurrent_patches.py", &[]);
    assert_eq!(v["ok"], 20, "{v}");
    assert_eq!(v["kept"], 20, "an edit reported as done was lost: {v}");
}

#[test]
fn spec_example_runs_as_written() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.work().join("deploy")).unwrap();
    std::fs::write(sb.work().join("deploy/db.yaml"), "database:\n  host: db\n").unwrap();
    std::fs::write(sb.work().join("app.yaml"), "name: app\ndatabase: sqlite\n").unwrap();
    std::fs::write(sb.work().join("readme.md"), "the database\n").unwrap();
    let result = sb.run_fixture("tools/spec_example.py", &[]);
    assert_eq!(result["status"], "success", "{result:#}");
    let configs: Value = serde_json::from_str(result["output"].as_str().unwrap()).unwrap();
    let files: Vec<&str> = configs
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["file"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["app.yaml", "deploy/db.yaml"]);
    assert!(configs[1]["preview"].as_str().unwrap().contains("host: db"));
}

#[test]
fn bad_inputs_come_back_as_error_dicts() {
    let sb = Sandbox::new();
    std::fs::write(sb.work().join("blob.bin"), b"\x7fELF\0\0\x01binary").unwrap();
    std::fs::write(sb.work().join("keep.txt"), "original line\n").unwrap();
    let r = run_tool_fixture(&sb, "bad_inputs.py", &[]);
    assert!(error_of(&r["missing"]).contains("FileNotFound"));
    assert!(error_of(&r["directory"]).contains("IsADirectory"));
    assert!(error_of(&r["binary"]).contains("BinaryFile"));
    assert!(error_of(&r["nul_path"]).contains("NUL"));
    assert!(error_of(&r["bad_regex"]).contains("InvalidRegex"));
    assert!(error_of(&r["bad_offset"]).contains("offset"));
    assert!(error_of(&r["patch_nomatch"]).contains("NoMatch"));
    let bad = error_of(&r["patch_bad_diff"]);
    assert!(
        bad.contains("keep.txt") && bad.contains("Nothing was written"),
        "{bad}"
    );
    assert!(error_of(&r["patch_garbage"]).contains("PatchError"));
    assert!(error_of(&r["huge_command"]).contains("limit"));
    assert!(error_of(&r["empty_command"]).contains("empty"));
    assert_eq!(r["dotdot"]["content"], "     1|original line\n");
    assert_eq!(r["keep_after"], "     1|original line\n");
}

#[test]
fn terminal_from_a_script_is_scrubbed_capped_and_killed_on_timeout() {
    let mut sb = Sandbox::new();
    sb.set_env("MY_SERVICE_API_KEY", "sk-must-not-leak");
    sb.set_env("OPENAI_API_KEY", "sk-provider");
    sb.set_env("VIBEOS_E2E_PLAIN", "plain");
    let r = run_tool_fixture(&sb, "terminal_script.py", &[]);
    assert_eq!(r["echo"]["exit_code"], 3);
    assert_eq!(r["echo"]["output"], "hello\noops\n");
    let env = r["env"].as_str().unwrap();
    assert!(
        !env.contains("sk-must-not-leak") && !env.contains("sk-provider"),
        "{env}"
    );
    assert!(
        !env.contains("VIBEOS_RPC_TOKEN"),
        "the RPC token reached a terminal command"
    );
    assert!(env.contains("PATH="));
    assert!(r["workdir"].as_str().unwrap().ends_with("/work/sub"));
    assert_eq!(r["timeout"]["timed_out"], true);
    assert!(r["timeout"]["error"]
        .as_str()
        .unwrap()
        .contains("timed out after 1s"));
    let bg = r["bg_pid"].as_i64().unwrap() as i32;
    assert!(!pid_alive(bg), "a child of the timed-out command survived");
    assert_eq!(r["flood"]["truncated"], true);
    assert_eq!(r["flood"]["output_bytes"], 3_000_000);
    assert!(r["flood"]["output_len"].as_u64().unwrap() < 60_000);
    assert_eq!(r["flood"]["marker"], true);
    assert_eq!(r["nonutf8"], "caf\u{fffd}\n");
}

#[test]
fn dangerous_commands_are_denied_in_scripts_without_a_host() {
    let sb = Sandbox::new();
    std::fs::create_dir_all(sb.work().join("victim")).unwrap();
    std::fs::write(sb.work().join("victim/precious.txt"), "keep me").unwrap();
    let r = run_tool_fixture(&sb, "dangerous.py", &[]);
    for key in ["rm", "obfuscated", "pipe"] {
        let e = error_of(&r[key]);
        assert!(
            e.contains("CommandDenied") && e.contains("non-interactive"),
            "{key}: {e}"
        );
        assert!(e.contains("command_allowlist"), "{key}: {e}");
    }
    assert!(error_of(&r["rm"]).contains("recursive_delete"));
    assert!(error_of(&r["pipe"]).contains("remote_to_shell"));
    assert_eq!(r["safe"]["exit_code"], 0);
    assert!(sb.work().join("victim/precious.txt").exists());
}

#[test]
fn permanent_allowlist_lets_a_pattern_through() {
    let sb = Sandbox::new();
    sb.write_config("command_allowlist:\n  - recursive_delete\n");
    std::fs::create_dir_all(sb.work().join("victim")).unwrap();
    std::fs::write(sb.work().join("victim/f.txt"), "x").unwrap();
    let r = run_tool_fixture(&sb, "dangerous.py", &[]);
    assert_eq!(r["rm"]["exit_code"], 0, "{}", r["rm"]);
    assert!(!sb.work().join("victim").exists());
    assert!(error_of(&r["pipe"]).contains("remote_to_shell"));
}

/// SPEC §8's example of a low-risk match under `approvals.mode: smart`: `rm -rf node_modules/`
/// runs without a prompt, and again once the directory is gone (a no-op the built-in rule
/// denied); a source dir, or a regenerable name that is a link, is still refused.
#[test]
fn smart_approval_runs_the_specs_cleanup_example_and_refuses_the_rest() {
    let sb = Sandbox::new();
    sb.write_config("approvals:\n  mode: smart\n");
    std::fs::create_dir_all(sb.work().join("node_modules/pkg")).unwrap();
    std::fs::create_dir_all(sb.work().join("src")).unwrap();
    let elsewhere = sb.root.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("keep.txt"), "x").unwrap();
    std::os::unix::fs::symlink(&elsewhere, sb.work().join("dist")).unwrap();
    let script = r#"
import json
from vibeos_tools import terminal
out = {}
for c in ["rm -rf node_modules/", "rm -rf node_modules/", "rm -rf ./__pycache__", "rm -rf src", "rm -rf dist/"]:
    r = terminal(c)
    out.setdefault(c, []).append(r.get("error") or r.get("exit_code"))
print(json.dumps(out))
"#;
    let r = sb.run_json(script, &[]);
    let out: Value = serde_json::from_str(r["output"].as_str().unwrap_or_default().trim())
        .unwrap_or_else(|e| panic!("{e}: {r}"));
    assert_eq!(
        out["rm -rf node_modules/"],
        serde_json::json!([0, 0]),
        "{out}"
    );
    assert_eq!(out["rm -rf ./__pycache__"], serde_json::json!([0]), "{out}");
    for denied in ["rm -rf src", "rm -rf dist/"] {
        assert!(
            out[denied][0]
                .as_str()
                .unwrap_or_default()
                .contains("CommandDenied"),
            "{denied}: {out}"
        );
    }
    assert!(!sb.work().join("node_modules").exists());
    assert!(sb.work().join("src").exists() && elsewhere.join("keep.txt").exists());
}

/// A tiny HTTP/1.1 server on 127.0.0.1 serving a SearXNG-like JSON endpoint and some pages.
fn start_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(&stream);
                let mut request_line = String::new();
                if reader.read_line(&mut request_line).is_err() {
                    return;
                }
                let mut referer = String::from("none");
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    if h.to_ascii_lowercase().starts_with("referer:") {
                        referer = h.trim_end().to_string();
                    }
                }
                let target = request_line
                    .split_whitespace()
                    .nth(1)
                    .unwrap_or("/")
                    .to_string();
                let (status, ctype, body) = if target.starts_with("/search?") {
                    assert!(target.contains("format=json") && target.contains("q=rust"));
                    (
                        "200 OK",
                        "application/json",
                        r#"{"query":"rust sandbox","results":[
                            {"title":"First","url":"https://one.example/","content":"about one"},
                            {"title":"Second","url":"https://two.example/","content":"about two"},
                            {"title":"Third","url":"https://three.example/","content":"about three"}]}"#
                            .to_string(),
                    )
                } else if target == "/page.html" {
                    (
                        "200 OK",
                        "text/html; charset=utf-8",
                        "<html><head><title>Test &amp; Page</title><script>var hidden=1;</script></head>\
                         <body><h1>Heading</h1><p>Some <b>bold</b> paragraph text that goes on and on.</p></body></html>"
                            .to_string(),
                    )
                } else if target == "/latin1.html" {
                    // Built from bytes below: an ISO-8859-1 body is not a Rust string.
                    ("200 OK", "text/html; charset=iso-8859-1", String::new())
                } else if target == "/deep.html" {
                    let n = 100_000;
                    (
                        "200 OK",
                        "text/html",
                        format!("<html><body><table>stray<tr><td>cell</table>{}deep text{}</body></html>", "<div>".repeat(n), "</div>".repeat(n)),
                    )
                } else if target == "/big.txt" {
                    ("200 OK", "text/plain", "y".repeat(1_500_000))
                } else if target == "/to-file" {
                    (
                        "302 Found\r\nLocation: file:///etc/passwd",
                        "text/plain",
                        String::new(),
                    )
                } else if target.starts_with("/hop?") {
                    (
                        "302 Found\r\nLocation: /referer",
                        "text/plain",
                        String::new(),
                    )
                } else if target == "/referer" {
                    ("200 OK", "text/plain", format!("referer: {referer}"))
                } else if target == "/plain.txt" {
                    ("200 OK", "text/plain", "just plain text".to_string())
                } else {
                    ("404 Not Found", "text/plain", "nope".to_string())
                };
                let body = if target == "/latin1.html" {
                    b"<html><body><table>stray<tr><td>caf\xe9</table></body></html>".to_vec()
                } else {
                    body.into_bytes()
                };
                let mut s = &stream;
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(&body);
            });
        }
    });
    format!("http://{addr}")
}

#[test]
fn web_tools_use_the_configured_backends() {
    let base = start_server();
    let sb = Sandbox::new();
    sb.write_config(&format!(
        "web:\n  search_backend: searxng\n  searxng_url: {base}\n  extract_backend: http\n"
    ));
    std::fs::write(sb.work().join("server_url.txt"), &base).unwrap();
    let r = run_tool_fixture(&sb, "web.py", &[]);
    let web = r["search"]["data"]["web"].as_array().unwrap();
    assert_eq!(web.len(), 2);
    assert_eq!(web[0]["title"], "First");
    assert_eq!(web[0]["url"], "https://one.example/");
    assert_eq!(web[0]["description"], "about one");
    let results = r["extract"]["results"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    assert_eq!(results[0]["title"], "Test & Page");
    let page = results[0]["content"].as_str().unwrap();
    assert!(
        page.contains("Heading") && !page.contains("<p>") && !page.contains("hidden=1"),
        "{page}"
    );
    assert!(page.contains("content cut at 40"));
    assert_eq!(results[0]["error"], Value::Null);
    assert_eq!(results[1]["content"], "just plain text");
    assert!(results[2]["error"].as_str().unwrap().contains("404"));
    assert!(results[3]["error"].as_str().unwrap().contains("http"));
}

/// The operator's SearXNG URL may carry a login or a key; every backend error quoted it whole
/// to the script, strict mode included (redaction caught the password only as printed, so a
/// script that printed it transformed read it). `/search` also went after the base's query.
#[test]
fn the_search_backend_s_credentials_never_reach_a_script() {
    let base = start_server();
    let sb = Sandbox::new();
    let script = "import base64, json\nimport vibeos_tools as t\n\
                  r = t.web_search('rust sandbox', limit=1)\n\
                  print(base64.b64encode(json.dumps(r).encode()).decode())\n";
    let answer = |url: &str, mode: &str| -> String {
        sb.write_config(&format!(
            "web:\n  search_backend: searxng\n  searxng_url: {url}\n  timeout: 5\n"
        ));
        let r = sb.run_json(script, &["--mode", mode]);
        assert_eq!(r["status"], "success", "{r}");
        let line = r["output"].as_str().unwrap().trim().to_string();
        let decoded = std::process::Command::new("base64")
            .arg("-d")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write as _;
                c.stdin.take().unwrap().write_all(line.as_bytes())?;
                c.wait_with_output()
            })
            .unwrap();
        String::from_utf8(decoded.stdout).unwrap()
    };
    for mode in ["project", "strict"] {
        // Nothing listens on port 1: the error names the backend, not its login or key.
        let refused = answer(
            "http://searxadmin:SearxPassw0rd42@127.0.0.1:1/?apikey=OperatorSearxKey99",
            mode,
        );
        assert!(refused.contains("SearchBackendError"), "{refused}");
        assert!(refused.contains("http://127.0.0.1:1/search"), "{refused}");
        for secret in ["SearxPassw0rd42", "OperatorSearxKey99", "searxadmin"] {
            assert!(
                !refused.contains(secret),
                "{mode}: {secret} reached the script: {refused}"
            );
        }
    }
    // A base with a query keeps it, after `/search`.
    let found = answer(&format!("{base}/?apikey=K"), "project");
    assert!(found.contains("https://one.example/"), "{found}");
    // Nor does a page a redirect leads to learn the URL the fetch came from.
    sb.write_config("web:\n  extract_backend: http\n");
    let r = sb.run_json(
        &format!(
            "import vibeos_tools as t\nprint(t.web_extract({:?})['results'][0]['content'])\n",
            format!("{base}/hop?token=abc")
        ),
        &[],
    );
    let page = r["output"].as_str().unwrap();
    assert!(page.contains("referer: none"), "{r}");
}

/// Stop 54's probe findings, through the stub as a script calls them: a single URL string,
/// the charset of the header, 100,000 nested elements (minutes of CPU before, past any
/// timeout), a result capped in total, a refused redirect that says why, and `tools list`
/// not claiming an env var is needed when config.yaml configured the tools.
#[test]
fn web_extract_is_bounded_decodes_charsets_and_takes_one_url() {
    let base = start_server();
    let sb = Sandbox::new();
    sb.write_config(&format!(
        "web:\n  search_backend: searxng\n  searxng_url: {base}\n  extract_backend: http\n  timeout: 20\n"
    ));
    // Each call is caught on its own and the deep page comes last on a line of its own, so one
    // run reports every check (the deep page alone used to run into the script's timeout).
    let script = sb.work().join("probe.py");
    std::fs::write(
        &script,
        format!(
            "import json, time\nimport vibeos_tools as t\nb = {base:?}\nr = {{}}\n\
             def call(k, f):\n    try:\n        r[k] = f()\n    except Exception as e:\n        r[k] = repr(e)\n\
             call('one', lambda: t.web_extract(b + '/latin1.html')['results'][0]['content'])\n\
             call('latin', lambda: t.web_extract([b + '/latin1.html'])['results'][0]['content'])\n\
             def big():\n    pages = t.web_extract([b + '/big.txt'] * 3, char_limit=10000000)['results']\n\
             \x20   return [sum(len(p['content']) for p in pages), pages[1]['content'][-200:]]\n\
             call('big', big)\n\
             call('redirect', lambda: t.web_extract([b + '/to-file'])['results'][0]['error'])\n\
             print(json.dumps(r), flush=True)\n\
             s = time.time(); d = t.web_extract([b + '/deep.html'])['results'][0]\n\
             print(json.dumps([d['content'], d['error'], time.time() - s]))\n"
        ),
    )
    .unwrap();
    let out = sb.run(&[
        "run",
        "--json",
        "--timeout",
        "60",
        &script.to_string_lossy(),
    ]);
    let result: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    let output = result["output"].as_str().unwrap_or("");
    let mut lines = output.lines();
    let r: Value = lines
        .next()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no first line: {result:#}"));
    let mut failed = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            failed.push(what);
        }
    };
    let one = r["one"].as_str().unwrap_or("");
    check(one.contains("caf"), format!("a single URL string: {one}"));
    let latin = r["latin"].as_str().unwrap_or("");
    check(
        latin.contains("café"),
        format!("ISO-8859-1 page: {latin:?}"),
    );
    let total = r["big"][0].as_u64().unwrap_or(0);
    check(
        (2_000_000..2_001_000).contains(&total),
        format!("total cap: {total} characters ({})", r["big"]),
    );
    let note = r["big"][1].as_str().unwrap_or("");
    check(
        note.contains("at most 2000000 characters per call"),
        format!("total cap note: {note}"),
    );
    let redirect = r["redirect"].as_str().unwrap_or("");
    check(
        redirect.contains("redirect to file:///etc/passwd refused") && redirect.contains("http://"),
        format!("redirect message: {redirect}"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    check(
        !stderr.contains("foster parenting"),
        format!("stderr: {stderr}"),
    );
    let deep: Value = lines
        .next()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or(Value::Null);
    check(
        result["status"] == "success"
            && deep[0].as_str().unwrap_or("").contains("deep text")
            && deep[2].as_f64().is_some_and(|secs| secs < 15.0),
        format!(
            "100,000 nested divs: {deep} (run status {})",
            result["status"]
        ),
    );
    let listed = sb.run(&["tools", "list"]);
    let table = String::from_utf8_lossy(&listed.stdout);
    let row = table
        .lines()
        .find(|l| l.starts_with("web_extract"))
        .unwrap_or("")
        .to_string();
    check(
        row.contains("available") && !row.contains("requires env"),
        format!("tools list row: {row}"),
    );
    assert!(failed.is_empty(), "failed checks:\n{}", failed.join("\n"));
}

#[test]
fn unconfigured_web_tools_are_left_out_of_the_stub() {
    let sb = Sandbox::new();
    let r = run_tool_fixture(&sb, "web_unconfigured.py", &[]);
    assert_eq!(r["web_search"], false);
    assert_eq!(r["web_extract"], false);
    assert_eq!(r["read_file"], true);
}

#[test]
fn terminal_commands_end_with_the_execution() {
    let sb = Sandbox::new();
    let started = std::time::Instant::now();
    let result = sb.run_fixture("tools/terminal_outlive.py", &["--timeout", "2"]);
    assert_eq!(result["status"], "timeout", "{result:#}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "vibeos-exec waited for the terminal command: {:?}",
        started.elapsed()
    );
    let pid: i32 = std::fs::read_to_string(sb.work().join("cmd.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        !pid_alive(pid),
        "the terminal command outlived its execution"
    );
}

/// What a script's `terminal` commands leave running in the background lives while the
/// execution does (a later call can use it) and ends with it: `&`, `nohup`, a subshell and
/// `setsid` (out of the command's process group), on a normal end and on a timeout. These are
/// children of the supervisor, not of the script's reaper.
#[test]
fn background_processes_of_a_scripts_commands_end_with_the_execution() {
    let sb = Sandbox::new();
    let tag = 70_000 + std::process::id() % 10_000;
    for (ending, args) in [("success", vec![]), ("timeout", vec!["--timeout", "3"])] {
        let forms = [
            format!("sleep {tag}1 >/dev/null 2>&1 &"),
            format!("nohup sleep {tag}2 >/dev/null 2>&1 &"),
            format!("(sleep {tag}3 >/dev/null 2>&1 &)"),
            format!("setsid sleep {tag}4 >/dev/null 2>&1 </dev/null &"),
            format!("setsid sh -c 'setsid sleep {tag}5 & wait' >/dev/null 2>&1 </dev/null &"),
        ];
        let mut script = String::from("import time\nfrom vibeos_tools import terminal\n");
        for f in &forms {
            script.push_str(&format!("terminal({f:?})\n"));
        }
        // Still there for a later call of the same execution.
        script.push_str(&format!(
            "time.sleep(0.5)\nprint(terminal('pgrep -c -f \"sleep {tag}\"')['output'].strip())\n"
        ));
        if ending == "timeout" {
            script.push_str("time.sleep(30)\n");
        }
        let r = sb.run_json(&script, &args);
        assert_eq!(r["status"], ending, "{r}");
        // pgrep counts its own shell too (its command line names the pattern).
        let seen: usize = r["output"]
            .as_str()
            .unwrap()
            .lines()
            .next()
            .unwrap_or("0")
            .trim()
            .parse()
            .unwrap_or(0);
        assert!(
            seen >= 5,
            "the background processes were gone before the execution ended: {r}"
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
        let left = vibeos_testkit::processes_mentioning(&format!("sleep {tag}"));
        for pid in &left {
            // SAFETY: kill has no memory preconditions; this only cleans up after a failure.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        assert!(
            left.is_empty(),
            "{ending}: outlived the execution: {left:?}"
        );
    }
}

#[test]
fn edits_keep_the_owner_of_the_file_they_replace() {
    // write_file and patch replace a file by renaming a new one over it; run as root (CI) on a
    // user's checkout, the new copy was root's and the user could no longer write their file.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        vibeos_testkit::skip!("only root can keep another user's ownership");
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    for mode in ["project", "strict"] {
        if mode == "strict" {
            if let Some(why) = vibeos_testkit::strict_unavailable() {
                vibeos_testkit::skip!("strict mode is unavailable on this machine: {why}");
            }
        }
        let sb = Sandbox::new();
        for name in ["w.txt", "p.txt"] {
            let f = sb.work().join(name);
            std::fs::write(&f, "old line\n").unwrap();
            std::os::unix::fs::chown(&f, Some(1234), Some(1235)).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o604)).unwrap();
        }
        let r = sb.run_json(
            "from vibeos_tools import write_file, patch\n\
             print(write_file('w.txt', 'new line\\n'))\n\
             print(patch(path='p.txt', old_string='old line', new_string='new line'))\n",
            &["--mode", mode],
        );
        assert_eq!(r["status"], "success", "{mode}: {r}");
        for name in ["w.txt", "p.txt"] {
            let f = sb.work().join(name);
            let meta = std::fs::metadata(&f).unwrap();
            assert_eq!(
                std::fs::read_to_string(&f).unwrap(),
                "new line\n",
                "{mode} {name}: {r}"
            );
            assert_eq!((meta.uid(), meta.gid()), (1234, 1235), "{mode} {name}");
            assert_eq!(meta.mode() & 0o7777, 0o604, "{mode} {name}");
        }
    }
}

#[test]
fn write_file_where_no_file_can_be_created_says_so() {
    // /proc/version is a file in a directory that exists but takes no new files: the error was
    // `FileNotFound: /proc: No such file or directory ... at path "/proc/.vibeos-write-…"`,
    // naming a temp file the caller never gave and a "missing" directory that is there.
    let sb = Sandbox::new();
    let r = sb.run_json(
        "import json\nfrom vibeos_tools import write_file\nprint(json.dumps(write_file('/proc/version', 'x')))\n",
        &[],
    );
    assert_eq!(r["status"], "success", "{r}");
    let v: Value = serde_json::from_str(r["output"].as_str().unwrap().trim()).unwrap();
    let err = error_of(&v);
    assert!(err.contains("WriteError"), "{err}");
    assert!(
        err.contains("cannot write /proc/version: no new file can be created in /proc"),
        "{err}"
    );
    assert!(!err.contains(".vibeos-write-"), "{err}");
    assert!(!err.contains("FileNotFound"), "{err}");
}

#[test]
fn a_recursive_delete_started_in_the_root_is_hardline_however_the_shell_got_there() {
    // Stop 50's probe: `rm -rf *` was refused as hardline only when written after `cd /` in
    // the same command; with `workdir="/"`, after a `cd /` in an earlier call, or with
    // `--cwd /`, it was only dangerous, so `approvals.mode: off` ran it. Every command starts
    // with `exit 0`, so nothing would be deleted even if one got through.
    let sb = Sandbox::new();
    sb.write_config("approvals:\n  mode: off\n");
    let script = r#"
import json
from vibeos_tools import terminal
out = {}
out["workdir"] = terminal("exit 0; rm -rf *", workdir="/")
terminal("cd /")
out["after_cd"] = terminal("exit 0; rm -rf *")
out["find_after_cd"] = terminal("exit 0; find . -delete")
terminal("cd /tmp")
out["elsewhere"] = terminal("exit 0; rm -rf *")
print(json.dumps(out))
"#;
    let r = sb.run_json(script, &[]);
    assert_eq!(r["status"], "success", "{r}");
    let out: Value = serde_json::from_str(r["output"].as_str().unwrap().trim()).unwrap();
    for case in ["workdir", "after_cd", "find_after_cd"] {
        let error = out[case]["error"].as_str().unwrap_or_default();
        assert!(error.contains("hardline"), "{case}: {}", out[case]);
    }
    // Anywhere else, mode off runs it (and `exit 0` makes it a no-op).
    assert_eq!(out["elsewhere"]["exit_code"], 0, "{}", out["elsewhere"]);
    let r = sb.run_json(
        "from vibeos_tools import terminal\nprint(terminal('exit 0; rm -rf *')['error'])",
        &["--cwd", "/"],
    );
    assert!(
        r["output"].as_str().unwrap().contains("hardline"),
        "--cwd /: {r}"
    );
}
