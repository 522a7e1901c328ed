//! Strict-mode overhead: wall time of a no-op `vibeos-exec run` in strict mode over the same
//! run in project mode, measured interleaved in the same process so machine load affects both
//! alike (target: ratio ≤ 1.10); and the cost of one tool call (`read_file` of a small file in
//! the session dir, timed inside the script) in strict mode — where it goes through the path
//! policy's `openat2` beneath a root — over project mode (target: ratio ≤ 1.2).
//!
//! `cargo run --release -p vibeos-benches --bin strict [-- ROUNDS]` (uses the debug
//! `vibeos-exec` unless `VIBEOS_EXEC_BIN` names another build).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;
use vibeos_testkit::{strict_unavailable, Sandbox};

fn main() {
    // The testkit's sandbox runs the binary this names; nothing else reads the environment yet.
    std::env::set_var(vibeos_testkit::EXEC_BIN_ENV, vibeos_benches::debug_bin());
    if let Some(why) = strict_unavailable() {
        println!("strict mode is unavailable here ({why}); nothing to measure");
        return;
    }
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(30);
    let sb = Sandbox::new();
    let script = sb.root.path().join("noop.py");
    std::fs::write(&script, "pass\n").unwrap();
    let script = script.to_string_lossy().into_owned();
    let run = |mode: &str| {
        let t = Instant::now();
        let out = sb.run(&["run", "--mode", mode, &script]);
        let d = t.elapsed();
        assert!(out.status.success(), "{mode} run failed: {out:?}");
        d
    };
    // Warm the page cache for both paths.
    for _ in 0..3 {
        run("project");
        run("strict");
    }
    let (mut project, mut strict) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        // Alternate which goes first so neither always runs on a warmer machine.
        if i % 2 == 0 {
            project.push(run("project"));
            strict.push(run("strict"));
        } else {
            strict.push(run("strict"));
            project.push(run("project"));
        }
    }
    let p = vibeos_benches::median(project);
    let s = vibeos_benches::median(strict);
    println!("no-op run, median of {rounds} interleaved rounds");
    println!("  project mode: {:8.2} ms", p.as_secs_f64() * 1e3);
    println!("  strict mode:  {:8.2} ms", s.as_secs_f64() * 1e3);
    println!(
        "  strict / project = {:.3} (target <= 1.10)",
        s.as_secs_f64() / p.as_secs_f64()
    );

    // Tool calls: the script times CALLS read_file calls itself (start-up excluded).
    const CALLS: usize = 200;
    std::fs::write(sb.work().join("small.txt"), "one line\n".repeat(20)).unwrap();
    let tool_script = sb.root.path().join("tools.py");
    std::fs::write(
        &tool_script,
        format!(
            "import time\nfrom vibeos_tools import read_file\nread_file('small.txt')\n\
             t = time.perf_counter()\nfor _ in range({CALLS}):\n    r = read_file('small.txt')\n\
             assert 'content' in r, r\nprint((time.perf_counter() - t) / {CALLS})\n"
        ),
    )
    .unwrap();
    let tool_script = tool_script.to_string_lossy().into_owned();
    let per_call = |mode: &str| -> f64 {
        let out = sb.run(&[
            "run",
            "--mode",
            mode,
            "--max-tool-calls",
            "1000",
            &tool_script,
        ]);
        assert!(out.status.success(), "{mode} tool run failed: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    };
    let tool_rounds = rounds.clamp(3, 15);
    let (mut tp, mut ts) = (Vec::new(), Vec::new());
    for i in 0..tool_rounds {
        if i % 2 == 0 {
            tp.push(per_call("project"));
            ts.push(per_call("strict"));
        } else {
            ts.push(per_call("strict"));
            tp.push(per_call("project"));
        }
    }
    let med = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (tp, ts) = (med(tp), med(ts));
    println!("read_file tool call, median of {tool_rounds} rounds of {CALLS} calls");
    println!("  project mode: {:8.1} us", tp * 1e6);
    println!("  strict mode:  {:8.1} us", ts * 1e6);
    println!("  strict / project = {:.3} (target <= 1.2)", ts / tp);
}
