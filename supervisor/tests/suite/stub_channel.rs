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
    let out = Command::new(vibeos_testkit::python3())
        .args(["-c", script])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("PYTHONPATH", dir)
        .env("VIBEOS_RPC_SOCKET", dir.join("rpc.sock"))
        .env("VIBEOS_RPC_TOKEN", "tok")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
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
    let out = Command::new(vibeos_testkit::python3())
        .args([
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
"#,
        ])
        .env_clear()
        .env("PYTHONPATH", dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = String::from_utf8_lossy(&out.stdout);
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
