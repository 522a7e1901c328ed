//! Warm execution through the library: the fork server against the single-use pool and cold
//! starts, all against the bare interpreter, measured in one run.
//!
//! (a) `execute_code("pass")` wall time through `vibeos_supervisor::execute`, calls 100 ms apart
//!     ("paced") and back to back: cold (no pool, no fork server), single-use pool (refilled
//!     between calls, as in `--bin pool`, and not refilled: back to back), fork server. Ratios
//!     to the median of bare `python -c 'import json, socket'` (target ≤ 0.15).
//! (b) bursts: 16 concurrent callers, no-op executions per second, fork server vs pool.
//! (c) strict mode: the fork server's paced and back-to-back medians over project mode's
//!     (target ≤ 1.2); skipped with the reason when strict mode is unavailable.
//!
//! Run: `cargo run --release -p vibeos-benches --bin warm` (options: `--runs N`, default 40;
//! `--strict-only` runs (c) alone).
//! Prints the load average with each section: the machine is shared.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vibeos_supervisor::{execute, pool, zygote, Config, ExecutionRequest, Interrupt, Mode};

fn percentile(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

struct Bench {
    runtime: tokio::runtime::Runtime,
    python: std::path::PathBuf,
    _dir: tempfile::TempDir,
    request: ExecutionRequest,
}

impl Bench {
    fn call(&self, request: &ExecutionRequest) -> f64 {
        let t = Instant::now();
        let r = self.runtime.block_on(execute(
            request.clone(),
            vibeos_tools::registry(),
            Interrupt::new(),
        ));
        let wall = t.elapsed().as_secs_f64();
        assert_eq!(r.to_json()["status"], "success", "{}", r.to_json());
        wall
    }

    fn bare(&self, code: &str) -> f64 {
        let t = Instant::now();
        let ok = Command::new(&self.python)
            .args(["-c", code])
            .stdin(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok);
        t.elapsed().as_secs_f64()
    }

    /// `runs` forked calls of `request`, `gap` apart; wall times.
    fn forked(&self, request: &ExecutionRequest, runs: usize, gap: Duration) -> Vec<f64> {
        zygote::set_enabled(true);
        self.call(request);
        let before = zygote::forks();
        let mut v = Vec::new();
        for _ in 0..runs {
            std::thread::sleep(gap);
            v.push(self.call(request));
        }
        assert_eq!(zygote::forks(), before + runs as u64, "not forked");
        v
    }

    /// `total` executions by `callers` concurrent callers; executions per second.
    fn burst(&self, callers: usize, total: usize) -> f64 {
        let t = Instant::now();
        self.runtime.block_on(async {
            let mut tasks = Vec::new();
            for c in 0..callers {
                let request = self.request.clone();
                let n = total / callers + usize::from(c < total % callers);
                tasks.push(tokio::spawn(async move {
                    for _ in 0..n {
                        let r =
                            execute(request.clone(), vibeos_tools::registry(), Interrupt::new())
                                .await;
                        assert_eq!(r.to_json()["status"], "success", "{}", r.to_json());
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        });
        total as f64 / t.elapsed().as_secs_f64()
    }
}

fn row(name: &str, v: &[f64], bare: f64) {
    println!(
        "  {name:<48} median {:7.2} ms  p90 {:7.2} ms  / bare {:.3}",
        percentile(v, 0.5) * 1e3,
        percentile(v, 0.9) * 1e3,
        percentile(v, 0.5) / bare
    );
}

fn strict_unavailable() -> Option<String> {
    vibeos_supervisor::doctor::probe().strict_blocker()
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
    let b = Bench {
        runtime,
        python: python.clone(),
        _dir: dir,
        request,
    };
    if std::env::args().any(|a| a == "--strict-only") {
        // Only (c), against a bare-interpreter median of its own: for tracing the strict path.
        let bare: Vec<f64> = (0..5).map(|_| b.bare("import json, socket")).collect();
        strict_section(&b, runs, percentile(&bare, 0.5));
        return;
    }
    let paced = Duration::from_millis(100);
    println!("interpreter: {}; {runs} runs each", python.display());

    // (a) Interleaved rounds so drifting load hits every kind alike.
    println!("(a) execute_code(\"pass\"), load {}", load());
    let (mut bare, mut pass, mut cold, mut pooled) = (Vec::new(), Vec::new(), Vec::new(), vec![]);
    let (mut f_paced, mut f_b2b) = (Vec::new(), Vec::new());
    for i in 0..runs + 2 {
        let x = b.bare("import json, socket");
        let p = b.bare("pass");
        zygote::set_enabled(false);
        pool::disable();
        let c = b.call(&b.request);
        pool::enable(2);
        pool::prewarm(&b.request);
        assert!(pool::wait_until_idle(
            Some(&b.request),
            2,
            Duration::from_secs(30)
        ));
        let before = pool::stats().unwrap().warm_starts;
        let w = b.call(&b.request);
        assert_eq!(pool::stats().unwrap().warm_starts, before + 1, "not warm");
        pool::disable();
        let fp = b.forked(&b.request, 1, paced);
        let fb = b.forked(&b.request, 1, Duration::ZERO);
        zygote::set_enabled(false);
        if i >= 2 {
            bare.push(x);
            pass.push(p);
            cold.push(c);
            pooled.push(w);
            f_paced.extend(fp);
            f_b2b.extend(fb);
        }
    }
    // Back to back for real: many calls in a row, each right after the previous one returned.
    let f_run = b.forked(&b.request, runs, Duration::ZERO);
    zygote::set_enabled(false);
    pool::enable(2);
    pool::prewarm(&b.request);
    assert!(pool::wait_until_idle(
        Some(&b.request),
        2,
        Duration::from_secs(30)
    ));
    let pool_run: Vec<f64> = (0..runs).map(|_| b.call(&b.request)).collect();
    pool::disable();
    let bare_m = percentile(&bare, 0.5);
    row("bare `python -c 'import json, socket'`", &bare, bare_m);
    row("bare `python -c pass`", &pass, bare_m);
    row("cold execute", &cold, bare_m);
    row("single-use pool, refilled between calls", &pooled, bare_m);
    row("single-use pool, back to back", &pool_run, bare_m);
    row("fork server, 100 ms apart", &f_paced, bare_m);
    row("fork server, back to back (interleaved)", &f_b2b, bare_m);
    row("fork server, back to back", &f_run, bare_m);
    for (name, v) in [("paced", &f_paced), ("back to back", &f_run)] {
        let r = percentile(v, 0.5) / bare_m;
        println!(
            "  fork server {name} / bare = {r:.3} (target <= 0.15) {}",
            if r <= 0.15 { "OK" } else { "MISSED" }
        );
    }

    // (b) Bursts.
    println!(
        "(b) 16 concurrent callers, no-op executions/s, load {}",
        load()
    );
    let total = (runs * 8).max(160);
    zygote::set_enabled(true);
    b.call(&b.request);
    let zr = b.burst(16, total);
    zygote::set_enabled(false);
    pool::enable(16);
    pool::prewarm(&b.request);
    assert!(pool::wait_until_idle(
        Some(&b.request),
        16,
        Duration::from_secs(60)
    ));
    let pr = b.burst(16, total);
    pool::disable();
    println!(
        "  fork server {zr:.0}/s (target >= 200) {}; single-use pool of 16 {pr:.0}/s",
        if zr >= 200.0 { "OK" } else { "MISSED" }
    );

    // (d) As hosts run it: the fork server with a pool of 2 enabled beside it (execute.rs asks
    // the fork server first; the pool serves only keys the server cannot, so the pool's
    // interpreters here wait unused and their starts show as load, not as calls).
    println!(
        "(d) as hosts run it (fork server first, pool of 2 enabled), load {}",
        load()
    );
    zygote::set_enabled(true);
    pool::enable(2);
    pool::prewarm(&b.request);
    assert!(pool::wait_until_idle(
        Some(&b.request),
        2,
        Duration::from_secs(60)
    ));
    let mut h_paced = Vec::new();
    for _ in 0..runs {
        std::thread::sleep(Duration::from_millis(100));
        h_paced.push(b.call(&b.request));
    }
    let h_run: Vec<f64> = (0..runs).map(|_| b.call(&b.request)).collect();
    let hr = b.burst(16, total);
    pool::disable();
    zygote::set_enabled(false);
    row("fork server + pool, 100 ms apart", &h_paced, bare_m);
    row("fork server + pool, back to back", &h_run, bare_m);
    for (name, v) in [("paced", &h_paced), ("back to back", &h_run)] {
        let r = percentile(v, 0.5) / bare_m;
        println!(
            "  fork server + pool {name} / bare = {r:.3} (target <= 0.15) {}",
            if r <= 0.15 { "OK" } else { "MISSED" }
        );
    }
    println!(
        "  fork server + pool, 16 callers: {hr:.0}/s (target >= 200) {}",
        if hr >= 200.0 { "OK" } else { "MISSED" }
    );

    strict_section(&b, runs, bare_m);
}

/// (c) Strict mode against project mode, both through the fork server.
fn strict_section(b: &Bench, runs: usize, bare_m: f64) {
    let paced = Duration::from_millis(100);
    match strict_unavailable() {
        Some(why) => println!("(c) strict mode skipped: {why}"),
        None => {
            println!(
                "(c) strict vs project through the fork server, load {}",
                load()
            );
            let mut strict = b.request.clone();
            strict.mode = Mode::Strict;
            let (mut sp, mut pp, mut sb, mut pb) = (vec![], vec![], vec![], vec![]);
            // Paced calls alternate one by one (each mode has its own server, so neither
            // serves the other's call): the machine's speed drifts, and a ratio of blocks
            // measured seconds apart moved by a quarter between runs of the same code.
            b.forked(&strict, 1, paced);
            b.forked(&b.request, 1, paced);
            let before = zygote::forks();
            for _ in 0..runs {
                std::thread::sleep(paced);
                sp.push(b.call(&strict));
                std::thread::sleep(paced);
                pp.push(b.call(&b.request));
            }
            assert_eq!(zygote::forks(), before + 2 * runs as u64, "not forked");
            for _ in 0..runs.div_ceil(10) {
                sb.extend(b.forked(&strict, 10, Duration::ZERO));
                pb.extend(b.forked(&b.request, 10, Duration::ZERO));
            }
            zygote::set_enabled(false);
            row("strict, 100 ms apart", &sp, bare_m);
            row("project, 100 ms apart", &pp, bare_m);
            row("strict, back to back", &sb, bare_m);
            row("project, back to back", &pb, bare_m);
            for (name, s, p) in [("paced", &sp, &pp), ("back to back", &sb, &pb)] {
                let r = percentile(s, 0.5) / percentile(p, 0.5);
                println!(
                    "  strict / project {name} = {r:.3} (target <= 1.2) {}",
                    if r <= 1.2 { "OK" } else { "MISSED" }
                );
            }
        }
    }
}
