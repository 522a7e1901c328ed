//! Cloud sandbox backends against their own exec round trip, measured in the same run against
//! the stand-ins (tests/standins/, whose sandboxes are real containers of a private dockerd):
//! - daytona: one exec round trip (`POST /process/execute` of `true`, the service's cheapest) vs
//!   a tool call from a script in the sandbox (target ≤ 1.5×) and vs `execute_code("pass")`
//!   (target ≤ 2×).
//!
//! Run: `cargo build --release --bins && cargo run --release -p vibeos-benches --bin cloud`
//! (options: `--runs N`, default 20; `VIBEOS_EXEC_BIN` picks the tool agent binary).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};
use vibeos_benches::sandbox::{read_file_per_call, request, timed};
use vibeos_benches::{median, ms, release_bin, runs_arg, verdict};
use vibeos_testkit::daytona::DaytonaLab;
use vibeos_tools::environments::daytona::DaytonaEnv;
use vibeos_tools::environments::{self, BackendKind, BackendSettings, Environment};

const CALLS: usize = 100;

fn exec(rt: &tokio::runtime::Runtime, code: &str) -> (f64, String) {
    timed(rt, request(code))
}

fn main() {
    let runs = runs_arg(20);
    let agent = release_bin();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let lab = DaytonaLab::start("vibeos-py:bench").expect("the daytona stand-in");
    let _endpoint = lab.standin.export();
    let settings = BackendSettings {
        backend: BackendKind::Daytona,
        daytona_image: Some("vibeos-py:bench".into()),
        agent_binary: Some(agent),
        ..BackendSettings::default()
    };
    // The baseline: the service's cheapest round trip, `POST /process/execute`, in a sandbox of
    // its own (same service, same image).
    let baseline = DaytonaEnv::start(&settings, "baseline").expect("baseline sandbox");
    environments::activate(settings);
    // Warm: the sandbox exists and the tool agent runs.
    exec(
        &rt,
        "from vibeos_tools import write_file\nwrite_file('/root/bench.txt', 'x\\n')",
    );
    let (mut base, mut noop) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        let out = baseline.execute("true", Duration::from_secs(30)).unwrap();
        assert!(out.success());
        base.push(t.elapsed().as_secs_f64());
        noop.push(exec(&rt, "pass").0);
    }
    let call = read_file_per_call(&rt, "/root/bench.txt", 5, CALLS, 5);
    environments::shutdown();
    baseline.stop();
    let (b, n) = (median(base), median(noop));
    println!("daytona stand-in ({runs} runs, medians; {CALLS} calls per tool-call sample):");
    println!("  exec round trip (POST /process/execute true)  {}", ms(b));
    println!(
        "  read_file from a script in the sandbox        {}",
        ms(call)
    );
    println!(
        "  ratio {:.2} (target ≤ 1.5) {}",
        call / b,
        verdict(call / b, 1.5)
    );
    println!(
        "  execute_code(\"pass\"), warm sandbox            {}",
        ms(n)
    );
    println!("  ratio {:.2} (target ≤ 2) {}", n / b, verdict(n / b, 2.0));
}
