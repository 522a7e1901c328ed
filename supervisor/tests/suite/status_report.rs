//! A cold execution learns the script's status from its reaper's report on a pipe, not from
//! waiting for the reaper's exit; the reaper is still reaped once it is gone, so a long-lived
//! host collects no zombies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::common::{eventually, run, Session};
use super::pool::{runtime, serial};

/// Whether `pid` is still a process, a zombie included.
fn exists(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The reaper's pid, which the script prints first (the reaper is the script's parent).
fn reaper_of(output: &str) -> i32 {
    output.lines().next().unwrap().trim().parse().unwrap()
}

#[test]
fn a_cold_scripts_status_is_reported_and_its_reaper_reaped_in_a_long_lived_host() {
    let python = require_python!();
    let _guard = serial();
    // The runtime lives on after each execution, as a host's does.
    let rt = runtime();
    let session = Session::new(python);
    let cases = [
        ("", "success", Some(0)),
        ("raise SystemExit(7)\n", "error", Some(7)),
        (
            "import signal\nos.kill(os.getpid(), signal.SIGTERM)\n",
            "error",
            Some(-15),
        ),
    ];
    for (tail, status, code) in cases {
        let script = format!("import os\nprint(os.getppid(), flush=True)\n{tail}");
        let r = run(&rt, session.request(&script));
        let json = r.to_json();
        assert_eq!(json["status"], status, "{json}");
        assert_eq!(r.exit_code, code, "{json}");
        let reaper = reaper_of(&r.output);
        assert_ne!(
            reaper,
            std::process::id() as i32,
            "the script ran under a reaper"
        );
        // Reaped, not left a zombie: nothing else in the host waits for it.
        eventually("the reaper is reaped", || !exists(reaper));
    }
}

#[test]
fn a_reaper_killed_before_it_reports_counts_as_the_script_killed() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    // The script SIGKILLs its own reaper: no report is ever written, and the script dies with
    // its parent (its parent-death signal).
    let script = "import os, signal, time\nprint(os.getppid(), flush=True)\n\
                  os.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(30)\n";
    let started = std::time::Instant::now();
    let r = run(&rt, session.request(script));
    let json = r.to_json();
    assert_eq!(r.exit_code, Some(-9), "{json}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "the execution waited for the script's sleep: {json}"
    );
    let reaper = reaper_of(&r.output);
    eventually("the killed reaper is reaped", || !exists(reaper));
}
