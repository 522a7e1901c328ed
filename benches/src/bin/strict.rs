//! Strict-mode overhead: wall time of a no-op `vibeos-exec run` in strict mode over the same
//! run in project mode, measured interleaved in the same process so machine load affects both
//! alike. Target: ratio ≤ 1.10.
//!
//! `cargo run --release -p vibeos-benches --bin strict [-- ROUNDS]` (uses the debug
//! `vibeos-exec` unless `VIBEOS_EXEC_BIN` names another build).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;
use vibeos_e2e::{strict_unavailable, Sandbox};

fn main() {
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
}
