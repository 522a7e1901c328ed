//! Warm interpreter pool: wall time of `execute_code("pass")` through `vibeos_supervisor::execute`
//! with the pool (warm) and without it (cold), against the bare interpreter running
//! `import json, socket`, all measured in this run. Target: warm median ≤ 0.15 × bare median.
//!
//! Warm calls are timed with the pool refilled before each one (the refill is not measured:
//! it happens in the background between an agent's calls).
//!
//! Run: `cargo run --release -p vibeos-benches --bin pool` (options: `--runs N`, default 40).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vibeos_benches::ms;
use vibeos_supervisor::{execute, pool, Config, ExecutionRequest, Interrupt};

fn percentile(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn main() {
    let runs = vibeos_benches::runs_arg(40);
    let python = vibeos_testkit::python3();
    let dir = tempfile::tempdir().unwrap();
    let mut request = ExecutionRequest::from_config("pass", &Config::default());
    request.python = Some(python.clone());
    request.cwd = Some(dir.path().to_path_buf());
    request.timeout = Duration::from_secs(60);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let call = |request: &ExecutionRequest| {
        let t = Instant::now();
        let r = runtime.block_on(execute(
            request.clone(),
            vibeos_tools::registry(),
            Interrupt::new(),
        ));
        let wall = t.elapsed().as_secs_f64();
        assert_eq!(r.to_json()["status"], "success", "{}", r.to_json());
        wall
    };

    // Interleave the three kinds so drifting machine load hits them alike.
    let (mut bare, mut cold, mut warm) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs + 2 {
        let t = Instant::now();
        let ok = Command::new(&python)
            .args(["-c", "import json, socket"])
            .stdin(Stdio::null())
            .status()
            .unwrap()
            .success();
        let b = t.elapsed().as_secs_f64();
        assert!(ok);

        pool::disable();
        let c = call(&request);

        pool::enable(2);
        pool::prewarm(&request);
        assert!(
            pool::wait_until_idle(Some(&request), 2, Duration::from_secs(30)),
            "the pool did not fill"
        );
        let before = pool::stats().unwrap().warm_starts;
        let w = call(&request);
        assert_eq!(pool::stats().unwrap().warm_starts, before + 1, "not warm");
        if i >= 2 {
            // The first rounds warm up caches and the page cache.
            bare.push(b);
            cold.push(c);
            warm.push(w);
        }
    }
    pool::disable();

    let bare_median = percentile(&bare, 0.5);
    println!(
        "execute_code(\"pass\") wall time, {runs} runs each ({}):",
        python.display()
    );
    println!("{:<44} {:>11} {:>11}", "", "median", "p90");
    for (name, v) in [
        ("bare `python -c 'import json, socket'`", &bare),
        ("cold execute (no pool)", &cold),
        ("warm execute (pool, refilled between calls)", &warm),
    ] {
        println!(
            "{name:<44} {} {}",
            ms(percentile(v, 0.5)),
            ms(percentile(v, 0.9))
        );
    }
    let ratio = percentile(&warm, 0.5) / bare_median;
    println!(
        "warm median / bare interpreter median = {ratio:.3} (target ≤ 0.15) {}",
        if ratio <= 0.15 { "OK" } else { "MISSED" }
    );
    println!(
        "cold median / bare interpreter median = {:.3}",
        percentile(&cold, 0.5) / bare_median
    );
}
