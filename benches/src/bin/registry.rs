//! Registry benchmarks: `get_tool_definitions` over 1,000 registered tools, and the overhead
//! of the dispatch path (`handle_function_call`) per call relative to calling the handler
//! directly, both measured in this run.
//!
//! Run with `cargo run --release -p vibeos-benches --bin registry`.

use serde_json::{json, Map, Value};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vibeos_tools::{CheckFn, ToolContext, ToolEntry, ToolError, ToolRegistry};

const TOOLS: usize = 1_000;

fn schema() -> Value {
    json!({"type": "object", "properties": {
        "path": {"type": "string", "description": "A path"},
        "limit": {"type": "integer", "default": 10}
    }, "required": ["path"]})
}

fn handler(args: &Map<String, Value>, _: &ToolContext) -> Result<Value, ToolError> {
    Ok(json!({"path": args.get("path"), "ok": true}))
}

/// Median of `runs` timings of `f`, each over `inner` iterations, per iteration.
fn median_per_iter(runs: usize, inner: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..inner {
                f();
            }
            t.elapsed() / inner as u32
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let reg = ToolRegistry::new();
    // 1,000 tools in 50 toolsets; a quarter gated by one of 10 shared checks.
    let checks: Vec<CheckFn> = (0..10).map(|_| Arc::new(|| true) as CheckFn).collect();
    for i in 0..TOOLS {
        let mut e = ToolEntry::new(
            format!("tool_{i:04}"),
            format!("set_{:02}", i % 50),
            format!("Tool number {i}.\nLonger text."),
            schema(),
            handler,
        );
        if i % 4 == 0 {
            e = e.with_shared_check(&checks[i % 10]);
        }
        if let Err(e) = reg.register(e) {
            eprintln!("registration failed: {e}");
            std::process::exit(1);
        }
    }
    let none: Vec<String> = Vec::new();
    let some: Vec<String> = (0..10).map(|i| format!("set_{i:02}")).collect();

    let all = median_per_iter(15, 5, || {
        black_box(reg.get_tool_definitions(&none, &none).map(|d| d.len()).ok());
    });
    let enabled = median_per_iter(15, 5, || {
        black_box(reg.get_tool_definitions(&some, &none).map(|d| d.len()).ok());
    });
    // Baseline: only cloning every entry's definition, no selection or checks.
    let entries = reg.entries();
    let baseline = median_per_iter(15, 5, || {
        black_box(entries.iter().map(|e| e.definition()).collect::<Vec<_>>());
    });
    println!("get_tool_definitions, {TOOLS} tools (250 gated by 10 shared checks):");
    println!(
        "  all toolsets:          {:>9.3} ms per build ({:.2}x the bare definition clone, {:.3} ms)",
        all.as_secs_f64() * 1e3,
        all.as_secs_f64() / baseline.as_secs_f64(),
        baseline.as_secs_f64() * 1e3
    );
    println!(
        "  10 enabled toolsets:   {:>9.3} ms per build",
        enabled.as_secs_f64() * 1e3
    );

    // Dispatch overhead: the full path vs the handler alone (both produce the JSON string).
    let ctx = ToolContext::agent("/");
    let args = json!({"path": "a.txt", "limit": 3});
    let map = args.as_object().cloned().unwrap_or_default();
    let n = 20_000;
    let direct = median_per_iter(11, n, || {
        black_box(handler(black_box(&map), &ctx).map(|v| v.to_string()).ok());
    });
    let dispatched = median_per_iter(11, n, || {
        black_box(reg.handle_function_call("tool_0001", black_box(&args), &ctx));
    });
    let coerced_args = json!({"path": "a.txt", "limit": "3"});
    let coerced = median_per_iter(11, n, || {
        black_box(reg.handle_function_call("tool_0001", black_box(&coerced_args), &ctx));
    });
    reg.add_pre_tool_call_hook(|_| vibeos_tools::HookDecision::Continue);
    reg.add_post_tool_call_hook(|c| {
        black_box(c.duration);
    });
    let hooked = median_per_iter(11, n, || {
        black_box(reg.handle_function_call("tool_0001", black_box(&args), &ctx));
    });
    println!("dispatch, per call (sync handler):");
    println!(
        "  handler called directly:          {:>8.0} ns",
        direct.as_secs_f64() * 1e9
    );
    for (label, t) in [
        ("handle_function_call:", dispatched),
        ("  with one string→int coercion:", coerced),
        ("  with a pre and a post hook:", hooked),
    ] {
        println!(
            "  {label:<32} {:>8.0} ns  ({:.2}x direct, +{:.0} ns)",
            t.as_secs_f64() * 1e9,
            t.as_secs_f64() / direct.as_secs_f64(),
            (t.as_secs_f64() - direct.as_secs_f64()) * 1e9
        );
    }

    // Async handlers through the bridge, vs the same future on a runtime directly.
    let areg = ToolRegistry::new();
    let _ = areg.register(ToolEntry::new_async(
        "async_echo",
        "a",
        "Async echo.",
        schema(),
        |args, _| async move { Ok(json!({"path": args.get("path")})) },
    ));
    let rt = match tokio::runtime::Builder::new_current_thread().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot build a runtime: {e}");
            std::process::exit(1);
        }
    };
    let m = 5_000;
    let direct_async = median_per_iter(11, m, || {
        let map = map.clone();
        black_box(rt.block_on(async move { json!({"path": map.get("path")}).to_string() }));
    });
    let bridged = median_per_iter(11, m, || {
        black_box(areg.handle_function_call("async_echo", black_box(&args), &ctx));
    });
    println!("dispatch, per call (async handler through the bridge, no runtime on this thread):");
    println!(
        "  block_on directly: {:>8.0} ns; handle_function_call: {:>8.0} ns ({:.2}x)",
        direct_async.as_secs_f64() * 1e9,
        bridged.as_secs_f64() * 1e9,
        bridged.as_secs_f64() / direct_async.as_secs_f64()
    );
}
