//! Cloud sandbox backends against their own exec round trip, measured in the same run against
//! the stand-ins (tests/standins/, whose sandboxes are real containers of a private dockerd):
//! - daytona: one exec round trip (`POST /process/execute` of `true`, the service's cheapest) vs
//!   a tool call from a script in the sandbox (target ≤ 1.5×) and vs `execute_code("pass")`
//!   (target ≤ 2×).
//!
//! Run: `cargo build --release --bins && cargo run --release -p vibeos-benches --bin cloud`
//! (options: `--runs N`, default 20; `VIBEOS_EXEC_BIN` picks the tool agent binary).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::time::{Duration, Instant};
use vibeos_benches::{median, release_bin};
use vibeos_supervisor::{execute, Config, ExecutionRequest, Interrupt};
use vibeos_testkit::backends::{rootfs, Dockerd};
use vibeos_testkit::daytona::Standin;
use vibeos_tools::environments::daytona::DaytonaEnv;
use vibeos_tools::environments::{self, BackendKind, BackendSettings, Environment};

const CALLS: usize = 100;

fn request(code: &str) -> ExecutionRequest {
    let mut r = ExecutionRequest::from_config(code, &Config::default());
    r.task_id = Some("bench".into());
    r.timeout = Duration::from_secs(300);
    r.base_env = Some(vec![(OsString::from("LANG"), OsString::from("C.UTF-8"))]);
    r
}

fn exec(rt: &tokio::runtime::Runtime, code: &str) -> (f64, String) {
    let t = Instant::now();
    let r = rt.block_on(execute(
        request(code),
        vibeos_tools::registry(),
        Interrupt::new(),
    ));
    let wall = t.elapsed().as_secs_f64();
    assert_eq!(r.to_json()["status"], "success", "{}", r.to_json());
    (wall, r.output)
}

fn ms(s: f64) -> String {
    format!("{:8.3} ms", s * 1000.0)
}

fn verdict(ratio: f64, target: f64) -> &'static str {
    if ratio <= target {
        "OK"
    } else {
        "MISSED"
    }
}

fn main() {
    let runs: usize = std::env::args()
        .skip_while(|a| a != "--runs")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(20);
    let agent = release_bin();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let image = rootfs().expect("scripts/backend-rootfs");
    let daemon = Dockerd::start().expect("dockerd");
    daemon.import(&image, "vibeos-py:bench").unwrap();
    let standin = Standin::start(&daemon, "vibeos-py:bench").expect("daytona stand-in");
    std::env::set_var("DAYTONA_API_URL", &standin.api_url);
    std::env::set_var("DAYTONA_API_KEY", &standin.api_key);
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
    let script = format!(
        "import time\nfrom vibeos_tools import read_file\nfor _ in range(5): read_file('/root/bench.txt')\n\
         t = time.perf_counter()\nfor _ in range({CALLS}): read_file('/root/bench.txt')\n\
         print((time.perf_counter() - t) / {CALLS})"
    );
    let call = median(
        (0..5)
            .map(|_| exec(&rt, &script).1.trim().parse::<f64>().unwrap())
            .collect(),
    );
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
