//! The generated stub (`vibeos_tools.py`) against a real socket whose server misbehaves on
//! purpose: a good reply is returned as the tool's result, and a reply that is not UTF-8 or not
//! JSON is reported as a malformed reply (a `ToolChannelError`, never a crash or a hang), after
//! which the channel stays broken with the same message. Real Python child, real Unix socket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::process::Command;
use vibeos_rpc::{generate_stub, GeneratedStub, StubTool};

/// Writes the stub into `dir` as a staging dir holds it: with the runtime it imports.
fn write_stub(dir: &std::path::Path, stub: &GeneratedStub) {
    std::fs::write(
        dir.join(vibeos_rpc::RUNTIME_FILE),
        vibeos_rpc::RUNTIME_SOURCE,
    )
    .unwrap();
    std::fs::write(dir.join("vibeos_tools.py"), &stub.source).unwrap();
}

/// Runs `python3 <args>` with nothing in its environment but `PYTHONPATH=dir` (a dir holding
/// a stub) and `env`, and returns its stdout; fails the test with its stderr if it fails.
fn python_beside_stub(
    dir: &std::path::Path,
    args: &[&str],
    env: &[(&str, std::ffi::OsString)],
) -> String {
    let out = Command::new(vibeos_testkit::python3())
        .args(args)
        .env_clear()
        .env("PYTHONPATH", dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A dir holding the stub of one tool `ping(n)`, and the listener of its socket `rpc.sock`.
fn ping_stub() -> (tempfile::TempDir, UnixListener) {
    let dir = tempfile::tempdir().unwrap();
    let stub = generate_stub(&[StubTool {
        name: "ping".into(),
        description: "Ping.".into(),
        parameters: serde_json::json!({"type": "object", "properties": {
            "n": {"type": "integer"}}, "required": ["n"]}),
    }]);
    write_stub(dir.path(), &stub);
    let listener = UnixListener::bind(dir.path().join("rpc.sock")).unwrap();
    (dir, listener)
}

/// Runs `script` against the stub in `dir` and its socket; returns its stdout, checking that it
/// succeeded.
fn run_script(dir: &std::path::Path, script: &str) -> String {
    python_beside_stub(
        dir,
        &["-c", script],
        &[
            ("PATH", std::env::var_os("PATH").unwrap_or_default()),
            ("VIBEOS_RPC_SOCKET", dir.join("rpc.sock").into_os_string()),
            ("VIBEOS_RPC_TOKEN", "tok".into()),
        ],
    )
}

/// Runs `script` with the stub of one tool `ping`, served by a server that answers the n-th
/// request with `replies[n]` (the request's id spliced in for each `@`); returns the script's
/// stdout and the requests the server saw.
fn run_against(replies: &[&[u8]], script: &str) -> (String, Vec<serde_json::Value>) {
    let (dir, listener) = ping_stub();
    let replies: Vec<Vec<u8>> = replies.iter().map(|r| r.to_vec()).collect();
    let server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        let mut seen = Vec::new();
        let mut line = String::new();
        for reply in replies {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            let request: serde_json::Value = serde_json::from_str(&line).unwrap();
            let id = request["id"].to_string();
            seen.push(request);
            let mut frame = Vec::new();
            for (i, part) in reply.split(|b| *b == b'@').enumerate() {
                if i > 0 {
                    frame.extend_from_slice(id.as_bytes());
                }
                frame.extend_from_slice(part);
            }
            writer.write_all(&frame).unwrap();
        }
        seen
    });
    (run_script(dir.path(), script), server.join().unwrap())
}

const SCRIPT: &str = r#"
from vibeos_tools import ping, ToolChannelError
print(ping(1))
for n in (2, 3):
    try:
        print('result', ping(n))
    except ToolChannelError as e:
        print('error', e)
"#;

/// SCRIPT's second call got a malformed reply: it is refused, and the channel is broken from
/// then on, so the third call fails without reaching the server.
fn assert_the_second_reply_broke_the_channel(out: &str) {
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[1], "error the call to ping was refused: the supervisor sent a malformed reply",
        "{out}"
    );
    assert_eq!(
        lines[2], "error the supervisor sent a malformed reply",
        "{out}"
    );
}

#[test]
fn a_reply_that_is_not_utf8_is_reported_as_malformed() {
    let (out, seen) = run_against(
        &[
            b"{\"id\":@,\"result\":{\"ok\":true}}\n",
            b"{\"id\":@,\"result\":\"\xff\xfe\"}\n",
        ],
        SCRIPT,
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "{'ok': True}", "{out}");
    assert_the_second_reply_broke_the_channel(&out);
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0]["tool"], "ping");
    assert_eq!(seen[0]["args"], serde_json::json!({"n": 1}));
    assert_eq!(seen[0]["token"], "tok");
}

#[test]
fn a_reply_that_is_not_json_is_reported_as_malformed() {
    let (out, _) = run_against(
        &[
            b"{\"id\":@,\"result\":[1, 2]}\n",
            b"{\"id\":@,\"result\": nope}\n",
        ],
        SCRIPT,
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "[1, 2]", "{out}");
    assert_the_second_reply_broke_the_channel(&out);
}

#[test]
fn non_ascii_results_arrive_intact() {
    let (out, _) = run_against(
        &[
            "{\"id\":@,\"result\":{\"text\":\"h\u{e9}llo \u{2603}\"}}\n".as_bytes(),
            b"{\"id\":@,\"result\":{\"error\":\"no such file\"}}\n",
            b"{\"id\":@,\"error\":{\"code\":\"x\",\"message\":\"limit reached\"}}\n",
        ],
        r#"
from vibeos_tools import ping, ToolChannelError
print(ascii(ping(1)))
print(ping(2))
try:
    ping(3)
except ToolChannelError as e:
    print('error', e)
"#,
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "{'text': 'h\\xe9llo \\u2603'}", "{out}");
    assert_eq!(lines[1], "{'error': 'no such file'}", "{out}");
    assert_eq!(
        lines[2], "error the call to ping was refused: limit reached",
        "{out}"
    );
}

#[test]
fn the_stub_imports_json_and_socket_only_when_a_tool_is_called() {
    let dir = tempfile::tempdir().unwrap();
    let stub = generate_stub(&[StubTool {
        name: "ping".into(),
        description: "Ping.".into(),
        parameters: serde_json::json!({"type": "object", "properties": {
            "tags": {"type": "array", "default": ["a"]}}}),
    }]);
    write_stub(dir.path(), &stub);
    // -S: without site, nothing but the stub could import json or socket.
    let out = python_beside_stub(
        dir.path(),
        &[
            "-S",
            "-c",
            r#"
import sys
from vibeos_tools import ping, json_parse, ToolChannelError
print("after import:", "json" in sys.modules, "socket" in sys.modules)
try:
    ping()
except ToolChannelError as e:
    print("error", e)
print("after a call:", "json" in sys.modules, "socket" in sys.modules)
print(json_parse('```json\n{"a": [1, 2]}\n```'))
print(json_parse('\ufeff{"a": [1, 2,], "s": "x,}",\n}'))
try:
    json_parse('{"a": 1,,}')
except ValueError as e:
    print("ValueError", e)
"#,
        ],
        &[],
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "after import: False False", "{out}");
    assert_eq!(
        lines[1],
        "error VIBEOS_RPC_SOCKET is not set: vibeos_tools only works inside an execute_code run",
        "{out}"
    );
    // The call filled the array default and encoded its arguments (json) before it found no
    // channel to dial; socket is imported only to dial one.
    assert_eq!(lines[2], "after a call: True False", "{out}");
    assert_eq!(lines[3], "{'a': [1, 2]}", "{out}");
    // A byte-order mark and trailing commas (outside strings) are taken too; what is still
    // not JSON raises with the position in the text as given.
    assert_eq!(lines[4], "{'a': [1, 2], 's': 'x,}'}", "{out}");
    assert_eq!(
        lines[5],
        "ValueError Expecting property name enclosed in double quotes: line 1 column 9 (char 8)",
        "{out}"
    );
}

#[test]
fn calls_from_threads_work_with_the_lazy_imports() {
    let replies: Vec<&[u8]> = vec![b"{\"id\":@,\"result\":{\"ok\":1}}\n"; 9];
    let (out, seen) = run_against(
        &replies,
        r#"
import threading
from vibeos_tools import ping
results = []
def worker(n):
    results.append(ping(n))
threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(len(results), all(r == {'ok': 1} for r in results))
"#,
    );
    assert_eq!(out.trim(), "8 True", "{out}");
    assert_eq!(seen.len(), 8);
    let mut ns: Vec<i64> = seen
        .iter()
        .map(|r| r["args"]["n"].as_i64().unwrap())
        .collect();
    ns.sort();
    assert_eq!(ns, (0..8).collect::<Vec<_>>());
}

/// Calls from several threads share one connection: the server holds every reply until it has
/// all the calls and then answers them newest first, so each reply reaches whichever thread is
/// reading at the time, and the reader role changes hands as calls complete. Every thread must
/// get its own result, and a later lone call must still find a reader (its own thread).
#[test]
fn replies_out_of_order_reach_their_own_threads() {
    const THREADS: usize = 6;
    let (dir, listener) = ping_stub();
    let server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        let mut read_request = || {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            serde_json::from_str::<serde_json::Value>(&line).unwrap()
        };
        let held: Vec<serde_json::Value> = (0..THREADS).map(|_| read_request()).collect();
        for request in held.iter().rev() {
            let reply =
                serde_json::json!({"id": request["id"], "result": {"n": request["args"]["n"]}});
            writer.write_all(format!("{reply}\n").as_bytes()).unwrap();
        }
        let last = read_request();
        let reply = serde_json::json!({"id": last["id"], "result": {"n": last["args"]["n"]}});
        writer.write_all(format!("{reply}\n").as_bytes()).unwrap();
        held.len() + 1
    });
    let script = format!(
        r#"
import threading
from vibeos_tools import ping
got = {{}}
def worker(n):
    got[n] = ping(n)["n"]
threads = [threading.Thread(target=worker, args=(n,)) for n in range({THREADS})]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(sorted(got.items()) == [(n, n) for n in range({THREADS})], ping(99)["n"])
"#
    );
    assert_eq!(run_script(dir.path(), &script).trim(), "True 99");
    assert_eq!(server.join().unwrap(), THREADS + 1);
}

/// Serves the stub in `dir` until the script closes its connection: each call is answered with
/// `{"tool", "args"}` of the request. Returns the requests seen, in order.
fn echo_server(listener: UnixListener) -> std::thread::JoinHandle<Vec<serde_json::Value>> {
    std::thread::spawn(move || {
        let Ok((stream, _)) = listener.accept() else {
            return Vec::new();
        };
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        let mut seen = Vec::new();
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 0 {
            let request: serde_json::Value = serde_json::from_str(&line).unwrap();
            let reply = serde_json::json!({"id": request["id"],
                "result": {"tool": request["tool"], "args": request["args"]}});
            writer.write_all(format!("{reply}\n").as_bytes()).unwrap();
            seen.push(request);
            line.clear();
        }
        seen
    })
}

/// A schema property named like something the wrapper's body uses (`_call`, `_json`,
/// `_drop_unset`, `_wire_names`) is a parameter like any other: it used to shadow the stub's
/// internals (`lookup('x')` raised `TypeError: 'str' object is not callable`).
#[test]
fn parameters_named_like_the_stubs_internals_are_plain_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let stub = generate_stub(&[StubTool {
        name: "lookup".into(),
        description: "Look a key up.".into(),
        parameters: serde_json::json!({"type": "object", "properties": {
            "_call": {"type": "string"},
            "_json": {"type": "array", "default": [1]},
            "_drop_unset": {"type": "string"},
            "_wire_names": {"type": "integer", "default": 7}
        }, "required": ["_call"]}),
    }]);
    assert!(stub.skipped.is_empty(), "{:?}", stub.skipped);
    write_stub(dir.path(), &stub);
    let listener = UnixListener::bind(dir.path().join("rpc.sock")).unwrap();
    let server = echo_server(listener);
    let out = run_script(
        dir.path(),
        r#"
import inspect
from vibeos_tools import lookup
print(list(inspect.signature(lookup).parameters))
print(lookup('x')['args'])
print(lookup('y', _drop_unset='d', _json=None, _wire_names=8)['args'])
"#,
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "['_call', '_json', '_drop_unset', '_wire_names']",
            "{'_call': 'x', '_json': [1], '_wire_names': 7}",
            "{'_call': 'y', '_json': [1], '_drop_unset': 'd', '_wire_names': 8}",
        ],
        "{out}"
    );
    assert_eq!(server.join().unwrap().len(), 2);
}

/// What an MCP server the operator opened to scripts controls — tool descriptions, property
/// names, defaults, property descriptions and types — cannot break `vibeos_tools` or put code
/// into it. Every hostile text below, if it escaped its string literal, would make the module
/// fail to import or would run `INJECT` (create a marker file, print INJECTED) at import.
/// Checked with a real interpreter against a real socket: the module imports, every tool keeps
/// its doc line and defaults exactly, calls send the schema's own names and values, the tools
/// that cannot be defined are left out with a reason, and nothing injected ran. (Lone
/// surrogates cannot reach the generator: a Rust string cannot hold one; an MCP server that
/// sends one is covered by the CLI's hostile-server test.)
#[test]
fn hostile_tool_texts_cannot_break_the_stub_or_inject_code() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("injected");
    let inject = format!(
        // Printed, it says INJECTED; written, it does not (the two halves are apart).
        "open(r'{}', 'w').write('x'); print('INJ' 'ECTED')",
        marker.display()
    );
    let descriptions = [
        ("pong", "Check the service; returns \"pong\"".to_string()),
        ("backslash", "Ends in a backslash \\".to_string()),
        ("breakout", format!("\"\"\"\n{inject}\n\"\"\"")),
        (
            "controls",
            "nul \0 byte\r\nnext\rlone cr\u{2028}ls\u{85}nel \u{202e}bidi\u{feff} \x0bvt \x1b[31m"
                .to_string(),
        ),
        ("escaped_quote", format!("\\\"\"\"; {inject} #")),
        ("single_quotes", format!("'''{inject}'''\n\"")),
        (
            "blank_first",
            "\n\n  \"Real\" first line\\\nsecond".to_string(),
        ),
    ];
    let wire = format!("x\"); {inject} #");
    let schema = serde_json::json!({"type": "object", "properties": {
        wire.clone(): {"type": "string", "description": format!("\"\"\"{inject}\"\"\" \\")},
        "\\": {"type": "string", "default": "\\"},
        "\"\"\"": {"type": "string", "default": format!("\"\"\"; {inject} #")},
        "\0": {"type": "string", "default": "\0\r\u{2028}\\"},
        "_call": {"type": "string", "default": "shadow"},
        "_json": {"type": "array", "default": ["x\"", {"k\"\"\"": "\\"}]},
        "_drop_unset": {"type": "string"},
        "_wire_names": {"default": null},
        "__debug__": {"type": "boolean", "default": true},
        "big": {"type": "number", "default": 1e300},
        "neg": {"type": "number", "default": -0.5},
        "é": {"type": "string", "default": "ü\u{1f600}"},
        "typed": {"type": ["string", format!("\"\"\")\n{inject}\n#")], "enum": [inject.clone()]},
    }, "required": [wire.clone()]});
    let mut tools: Vec<StubTool> = descriptions
        .iter()
        .map(|(name, description)| StubTool {
            name: (*name).into(),
            description: description.clone(),
            parameters: serde_json::json!({"type": "object", "properties": {}}),
        })
        .collect();
    tools.push(StubTool {
        name: "hostile_schema".into(),
        description: format!("{inject}\"\"\""),
        parameters: schema,
    });
    for (name, parameters) in [
        (
            format!("x():\n    pass\n{inject}\ndef y"),
            serde_json::json!({}),
        ),
        ("odd".to_string(), serde_json::json!({"properties": 3})),
    ] {
        tools.push(StubTool {
            name,
            description: "Left out.".into(),
            parameters,
        });
    }
    tools.push(StubTool {
        name: "ping".into(),
        description: "Ping.".into(),
        parameters: serde_json::json!({"type": "object", "properties": {
            "n": {"type": "integer"}}, "required": ["n"]}),
    });
    let stub = generate_stub(&tools);
    assert_eq!(stub.skipped.len(), 2, "{:?}", stub.skipped);
    assert!(!stub.source.contains('\0'), "a NUL byte reached the source");
    write_stub(dir.path(), &stub);

    let docs: serde_json::Map<String, serde_json::Value> = descriptions
        .iter()
        .map(|(name, d)| (name.to_string(), vibeos_rpc::doc_line(d).into()))
        .collect();
    assert_eq!(docs["pong"], "Check the service; returns \"pong\"");
    assert_eq!(docs["blank_first"], "\"Real\" first line\\");
    let expect = serde_json::json!({"docs": docs, "wire": wire});
    std::fs::write(dir.path().join("expect.json"), expect.to_string()).unwrap();

    let listener = UnixListener::bind(dir.path().join("rpc.sock")).unwrap();
    let server = echo_server(listener);
    let out = run_script(
        dir.path(),
        r#"
import inspect, json, os
import vibeos_tools as t
exp = json.load(open(os.path.join(os.path.dirname(t.__file__), "expect.json"), encoding="utf-8"))
docs = {n: getattr(t, n).__doc__.splitlines()[0] for n in exp["docs"]}
print("docs", docs == exp["docs"] or docs)
print("tools", sorted(t._TOOLS))
print("ping", t.ping(1)["args"])
for n in sorted(exp["docs"]):
    getattr(t, n)()
params = inspect.signature(t.hostile_schema).parameters.items()
defaults = {k: p.default for k, p in params if p.default is not p.empty}
print("defaults", json.dumps(defaults, sort_keys=True))
t.hostile_schema("positional")
t.hostile_schema(**{exp["wire"]: "by wire name", "_drop_unset": "set"})
print("done")
"#,
    );
    assert!(!out.contains("INJECTED"), "{out}");
    assert!(!marker.exists(), "injected code ran:\n{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "docs True", "{out}");
    assert_eq!(
        lines[1],
        "tools ['backslash', 'blank_first', 'breakout', 'controls', 'escaped_quote', \
         'hostile_schema', 'ping', 'pong', 'single_quotes']",
        "{out}"
    );
    assert_eq!(lines[2], "ping {'n': 1}", "{out}");
    let defaults: serde_json::Value =
        serde_json::from_str(lines[3].strip_prefix("defaults ").unwrap()).unwrap();
    assert_eq!(defaults["_call"], "shadow", "{out}");
    assert_eq!(
        defaults["___"],
        "\"\"\"; ".to_string() + &inject + " #",
        "{out}"
    );
    assert_eq!(defaults["_"], "\\", "{out}");
    assert_eq!(defaults["__"], "\0\r\u{2028}\\", "{out}");
    assert_eq!(defaults["_drop_unset"], serde_json::Value::Null, "{out}");
    assert_eq!(defaults["__debug___"], true, "{out}");
    assert_eq!(defaults["big"], 1e300, "{out}");
    assert_eq!(defaults["_"], "\\", "{out}");
    assert_eq!(lines[4], "done", "{out}");

    let seen = server.join().unwrap();
    assert_eq!(seen.len(), 1 + descriptions.len() + 2);
    let expected_args = |first: &str| {
        let mut args = serde_json::json!({
            wire.clone(): first,
            "\\": "\\",
            "\"\"\"": format!("\"\"\"; {inject} #"),
            "\0": "\0\r\u{2028}\\",
            "_call": "shadow",
            "_json": ["x\"", {"k\"\"\"": "\\"}],
            "_wire_names": null,
            "__debug__": true,
            "big": 1e300,
            "neg": -0.5,
            "é": "ü\u{1f600}",
        });
        if first == "by wire name" {
            args["_drop_unset"] = "set".into();
        }
        args
    };
    let n = seen.len();
    assert_eq!(seen[n - 2]["tool"], "hostile_schema");
    assert_eq!(seen[n - 2]["args"], expected_args("positional"));
    assert_eq!(seen[n - 1]["args"], expected_args("by wire name"));
}

#[test]
fn the_stub_helpers_take_what_models_write_and_refuse_what_they_cannot_use() {
    // Stop 50's probe: `json_parse` refused single quotes, comments and a fence inside prose,
    // and raised AttributeError for None; `shell_quote(b"x")` quoted the repr; `retry` with a
    // negative delay failed after the first try, hiding the function's own error.
    let dir = tempfile::tempdir().unwrap();
    write_stub(dir.path(), &generate_stub(&[]));
    let out = python_beside_stub(
        dir.path(),
        &[
            "-c",
            r#"
import pathlib
from vibeos_tools import json_parse, shell_quote, retry
for text in ["{'a': 1, 'b': (2, None, True)}", '{"a": 1 // why\n, /* c */ "b": [2,],}',
             'Here it is:\n```json\n{"a": 1}\n```\nthanks', '```js\n[1]\n```',
             '{"u": "http://x//y"}']:
    print(json_parse(text))
for bad in ['{"a": 1,,}', "{'a': {1, 2}}", "print(1)"]:
    try:
        json_parse(bad)
    except ValueError as e:
        print("ValueError")
try:
    json_parse(None)
except TypeError as e:
    print(e)
print(shell_quote(b"my file"), shell_quote(pathlib.Path("/a b")), shell_quote(5))
for bad in (None, ["x"]):
    try:
        shell_quote(bad)
    except TypeError as e:
        print(e)
for delay in (-1, "2"):
    try:
        retry(lambda: 1, delay=delay)
    except ValueError as e:
        print(e)
"#,
        ],
        &[],
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "{'a': 1, 'b': [2, None, True]}",
            "{'a': 1, 'b': [2]}",
            "{'a': 1}",
            "[1]",
            "{'u': 'http://x//y'}",
            "ValueError",
            "ValueError",
            "ValueError",
            "json_parse() takes str, bytes, a dict or a list, not NoneType",
            "'my file' '/a b' 5",
            "shell_quote() takes str, a number, a path or bytes, not NoneType",
            "shell_quote() takes str, a number, a path or bytes, not list",
            "delay must be a number of seconds, 0 or more, got -1",
            "delay must be a number of seconds, 0 or more, got '2'",
        ],
        "{out}"
    );
}
