//! What the backend benchmarks (`backends`, `cloud`, `modal`) share: a request of task `bench`
//! in the active backend, timed from the host, and the script that times tool calls from
//! inside. The daemons and stand-ins they run against come from `vibeos_testkit`.

// A benchmark harness: a panic is how a broken setup is reported.
#![allow(clippy::unwrap_used)]

use std::ffi::OsString;
use std::time::{Duration, Instant};
use vibeos_supervisor::{execute, Config, ExecutionRequest, Interrupt};

/// A request to run `code` as task `bench` with only `LANG` from the host; in the local backend
/// with the real interpreter (not a pyenv shim).
pub fn request(code: &str) -> ExecutionRequest {
    let mut r = ExecutionRequest::from_config(code, &Config::default());
    r.task_id = Some("bench".into());
    r.python = Some(vibeos_testkit::python3());
    r.timeout = Duration::from_secs(300);
    r.base_env = Some(vec![(OsString::from("LANG"), OsString::from("C.UTF-8"))]);
    r
}

/// Runs `req` in the active backend: its wall time in seconds, as the host sees it, and its
/// output. Anything but success stops the benchmark.
pub fn timed(rt: &tokio::runtime::Runtime, req: ExecutionRequest) -> (f64, String) {
    let t = Instant::now();
    let r = rt.block_on(execute(req, vibeos_tools::registry(), Interrupt::new()));
    let wall = t.elapsed().as_secs_f64();
    assert_eq!(r.to_json()["status"], "success", "{}", r.to_json());
    (wall, r.output)
}

/// A script that reads `path` with `read_file` `warmup` times, then `calls` times timed, and
/// prints the seconds per timed call.
pub fn read_file_timing_script(path: &str, warmup: usize, calls: usize) -> String {
    format!(
        "import time\nfrom vibeos_tools import read_file\nfor _ in range({warmup}): read_file('{path}')\n\
         t = time.perf_counter()\nfor _ in range({calls}): read_file('{path}')\n\
         print((time.perf_counter() - t) / {calls})"
    )
}

/// The median over `samples` runs of [`read_file_timing_script`]: seconds per tool call.
pub fn read_file_per_call(
    rt: &tokio::runtime::Runtime,
    path: &str,
    warmup: usize,
    calls: usize,
    samples: usize,
) -> f64 {
    let script = read_file_timing_script(path, warmup, calls);
    crate::median(
        (0..samples)
            .map(|_| timed(rt, request(&script)).1.trim().parse::<f64>().unwrap())
            .collect(),
    )
}
