//! Benchmark of MCP tool calls through the registry, as a ratio against a baseline measured in
//! this run on the same server.
//!
//! (a) per-call latency of `echo` on the fixture stdio server (official MCP Python SDK) through
//!     `handle_function_call` (coercion, hooks, the async bridge, the rmcp client) over the
//!     latency of a hand-written `tools/call` JSON-RPC round trip on the pipes of a second
//!     instance of the same server: the cost the client and registry add;
//! (b) eager start-up (spawn, handshake, tools/list, registration) over the bare
//!     `import mcp.server.mcpserver` of the same interpreter.
//!
//! Needs target/pyvenv with `mcp` (scripts/test-all creates it).
//! Run: `cargo run --release -p vibeos-benches --bin mcp_client`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Instant;
use vibeos_benches::median;
use vibeos_tools::mcp_client::{McpManager, McpServerConfig, ServerKind, ServerSpec, Startup};
use vibeos_tools::{ToolContext, ToolRegistry};

const CALLS: usize = 300;

fn main() {
    let root = vibeos_testkit::workspace_root();
    let python = root.join("target/pyvenv/bin/python");
    let server = root.join("fixtures/mcp_servers/stdio_server.py");
    assert!(
        python.exists(),
        "{} missing: run scripts/test-all first",
        python.display()
    );

    // Baseline (a): raw JSON-RPC over the server's pipes.
    let mut child = Command::new(&python)
        .arg(&server)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut rpc = |msg: Value, answer: bool| -> Value {
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
        if !answer {
            return Value::Null;
        }
        line.clear();
        stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    };
    rpc(
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"}}}),
        true,
    );
    rpc(
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        false,
    );
    let mut raw = Vec::with_capacity(CALLS);
    for i in 0..CALLS {
        let t = Instant::now();
        let r = rpc(
            json!({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                   "params": {"name": "echo", "arguments": {"text": "x"}}}),
            true,
        );
        raw.push(t.elapsed().as_secs_f64());
        assert!(r.get("result").is_some(), "{r}");
    }
    drop(stdin);
    let _ = child.wait();

    // Baseline (b): importing the SDK.
    let mut imports = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let ok = Command::new(&python)
            .args(["-c", "import mcp.server.mcpserver"])
            .status()
            .unwrap()
            .success();
        assert!(ok);
        imports.push(t.elapsed().as_secs_f64());
    }

    // Measured: through the registry.
    let mut starts = Vec::new();
    let mut via = Vec::with_capacity(CALLS);
    for round in 0..3 {
        let reg: &'static ToolRegistry = Box::leak(Box::new(ToolRegistry::new()));
        let spec = ServerSpec {
            name: "bench".into(),
            config: McpServerConfig {
                command: Some(python.display().to_string()),
                args: vec![server.display().to_string()],
                startup: Startup::Eager,
                ..Default::default()
            },
            env: None,
            kind: ServerKind::Mcp,
            start_hint: None,
        };
        let t = Instant::now();
        let m = McpManager::start(vec![spec], reg);
        starts.push(t.elapsed().as_secs_f64());
        if round == 0 {
            let ctx = ToolContext::agent("/");
            let args = json!({"text": "x"});
            for _ in 0..CALLS {
                let t = Instant::now();
                let out = reg.handle_function_call("echo", &args, &ctx);
                via.push(t.elapsed().as_secs_f64());
                assert!(out.contains("\"echo\""), "{out}");
            }
        }
        m.shutdown();
    }

    let (raw_m, via_m) = (median(raw), median(via));
    println!("(a) MCP tool call, median of {CALLS}:");
    println!(
        "    raw JSON-RPC round trip (baseline): {:.3} ms",
        raw_m * 1e3
    );
    println!(
        "    handle_function_call via rmcp:      {:.3} ms",
        via_m * 1e3
    );
    println!("    ratio: {:.2}", via_m / raw_m);
    let (imp, st) = (median(imports), median(starts));
    println!("(b) eager start-up, median of 3:");
    println!(
        "    python -c 'import mcp.server.mcpserver' (baseline): {:.1} ms",
        imp * 1e3
    );
    println!(
        "    spawn + handshake + tools/list + register:       {:.1} ms",
        st * 1e3
    );
    println!("    ratio: {:.2}", st / imp);
}
