//! Benchmark of `vibeos-exec serve` (MCP over stdio), against baselines measured in this run.
//!
//! (a) executions per second with 1, 4 and 16 concurrent callers on one MCP session
//!     (`--max-concurrent 16`, so the queue is not the limit; each caller sends its next
//!     `tools/call` when its previous one returns). The script reads a small file through
//!     `read_file` and prints a line — the shape of a typical execute_code call.
//! (b) the overhead of one call through MCP over the same script through `vibeos-exec run`:
//!     median latency of a sequential MCP `tools/call` vs median wall time of `run` (which also
//!     pays for starting the CLI process), and the part of the MCP latency spent outside the
//!     execution itself (latency minus the result's `duration_seconds`).
//!
//! The client is a minimal JSON-RPC writer/reader over the server's stdin/stdout, so what is
//! measured is the server, not an SDK.
//!
//! Run: `cargo build --release --bins && cargo run --release -p vibeos-benches --bin mcp_serve`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use vibeos_benches::{median, release_bin};

const SCRIPT: &str =
    "from vibeos_tools import read_file\nr = read_file('data.txt')\nprint(len(r['content']))\n";

struct Env {
    dir: tempfile::TempDir,
    bin: PathBuf,
}

impl Env {
    fn new() -> Env {
        let (dir, _python) = vibeos_benches::bench_home();
        std::fs::write(dir.path().join("data.txt"), "some data\n".repeat(20)).unwrap();
        Env {
            dir,
            bin: release_bin(),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.args(args)
            .env("VIBEOS_HOME", self.dir.path().join("home"))
            .env("TMPDIR", self.dir.path().join("tmp"))
            .env_remove("VIRTUAL_ENV")
            .env_remove("CONDA_PREFIX")
            .current_dir(self.dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        c
    }
}

/// One stdio MCP session (the server process).
struct Session {
    child: Child,
    conn: Conn,
}

/// A caller's handle on a session: requests share the pipe, responses are routed back to the
/// waiting caller by request id.
#[derive(Clone)]
struct Conn {
    stdin: Arc<Mutex<ChildStdin>>,
    waiting: Arc<Mutex<HashMap<u64, mpsc::Sender<Value>>>>,
    next: Arc<Mutex<u64>>,
}

impl Session {
    fn start(env: &Env, max_concurrent: usize) -> Session {
        let mut child = env
            .command(&["serve", "--max-concurrent", &max_concurrent.to_string()])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = Arc::new(Mutex::new(child.stdin.take().unwrap()));
        let stdout = child.stdout.take().unwrap();
        let waiting: Arc<Mutex<HashMap<u64, mpsc::Sender<Value>>>> = Arc::default();
        {
            let waiting = waiting.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let Ok(v) = serde_json::from_str::<Value>(&line) else {
                        continue;
                    };
                    if let Some(id) = v.get("id").and_then(Value::as_u64) {
                        if let Some(tx) = waiting.lock().unwrap().remove(&id) {
                            let _ = tx.send(v);
                        }
                    }
                }
            });
        }
        let conn = Conn {
            stdin,
            waiting,
            next: Arc::new(Mutex::new(1)),
        };
        conn.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "bench", "version": "1"}}),
        );
        conn.notify("notifications/initialized");
        Session { child, conn }
    }
}

impl Conn {
    fn write(&self, v: &Value) {
        let mut line = v.to_string();
        line.push('\n');
        let mut w = self.stdin.lock().unwrap();
        w.write_all(line.as_bytes()).unwrap();
        w.flush().unwrap();
    }

    fn notify(&self, method: &str) {
        self.write(&json!({"jsonrpc": "2.0", "method": method}));
    }

    fn request(&self, method: &str, params: Value) -> Value {
        let id = {
            let mut n = self.next.lock().unwrap();
            *n += 1;
            *n
        };
        let (tx, rx) = mpsc::channel();
        self.waiting.lock().unwrap().insert(id, tx);
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let reply = rx.recv().expect("the server answered");
        assert!(reply.get("error").is_none(), "error reply: {reply}");
        reply["result"].clone()
    }

    /// One execute_code call; returns (latency, the execution's own duration).
    fn execute(&self) -> (f64, f64) {
        let t = Instant::now();
        let r = self.request(
            "tools/call",
            json!({"name": "execute_code", "arguments": {"code": SCRIPT}}),
        );
        let latency = t.elapsed().as_secs_f64();
        let res = &r["structuredContent"];
        assert_eq!(res["status"], "success", "{r}");
        (latency, res["duration_seconds"].as_f64().unwrap())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn throughput(env: &Env, callers: usize, per_caller: usize) -> f64 {
    let session = Session::start(env, 16);
    session.conn.execute(); // warm-up: interpreter and page cache
    let t = Instant::now();
    let handles: Vec<_> = (0..callers)
        .map(|_| {
            let s = session.conn.clone();
            std::thread::spawn(move || {
                for _ in 0..per_caller {
                    s.execute();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    (callers * per_caller) as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let env = Env::new();
    println!("vibeos-exec serve (MCP over stdio) — {}", env.bin.display());

    println!("\n(a) executions per second, one session, --max-concurrent 16");
    let base = throughput(&env, 1, 30);
    println!("    1 caller : {base:7.1} exec/s");
    for (callers, per) in [(4usize, 15usize), (16, 6)] {
        let eps = throughput(&env, callers, per);
        println!(
            "   {callers:2} callers: {eps:7.1} exec/s  ({:.2}x of 1 caller)",
            eps / base
        );
    }

    println!("\n(b) one call through MCP vs the same script through `vibeos-exec run`");
    let script = env.dir.path().join("script.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let mut run_times = Vec::new();
    for i in 0..21 {
        let t = Instant::now();
        let out = env
            .command(&["run", script.to_str().unwrap()])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let dt = t.elapsed().as_secs_f64();
        assert!(out.status.success());
        if i > 0 {
            run_times.push(dt);
        }
    }
    let session = Session::start(&env, 1);
    session.conn.execute();
    let mut mcp_times = Vec::new();
    let mut outside = Vec::new();
    for _ in 0..20 {
        let (latency, duration) = session.conn.execute();
        mcp_times.push(latency);
        outside.push(latency - duration);
    }
    let run_ms = median(run_times) * 1000.0;
    let mcp_ms = median(mcp_times) * 1000.0;
    let outside_ms = median(outside) * 1000.0;
    println!("    run (process start + execution) median: {run_ms:7.1} ms");
    println!("    MCP tools/call latency median         : {mcp_ms:7.1} ms");
    println!(
        "    ratio MCP / run                        : {:7.2}",
        mcp_ms / run_ms
    );
    println!(
        "    MCP time outside the execution median : {outside_ms:7.2} ms (JSON-RPC, queue, result)"
    );
}
