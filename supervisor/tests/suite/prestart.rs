//! The prestarted interpreter of a one-shot host (`prestart`): the next matching execution
//! takes it and behaves exactly as a cold one; a request it does not match discards it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::common::{normalized, parity_scripts, run, Session};
use super::pool::serial;
use std::time::{Duration, Instant};
use vibeos_supervisor::prestart;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Processes whose working dir is `dir` (a prestart's reaper and interpreter run in their
/// session dir, which no other test uses).
fn processes_in(dir: &std::path::Path) -> Vec<i32> {
    vibeos_testkit::processes_where(|proc_dir| {
        std::fs::read_link(proc_dir.join("cwd")).is_ok_and(|cwd| cwd == dir)
    })
}

fn gone_within(pid: i32, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Gone, or a zombie waiting for the reap thread.
        if stat.is_empty()
            || stat
                .rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn prestarted_scripts_behave_exactly_like_cold_ones() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let mut scripts = parity_scripts();
    // What only a FIFO-fed start could get wrong: the source read back by the script itself.
    scripts.push(
        "import inspect, sys\nprint(inspect.getsource(sys.modules['__main__']).count('inspect'))\n"
            .to_string(),
    );
    for code in scripts {
        let cold = normalized(&run(&rt, session.request(&code)));
        assert!(
            prestart::prestart(&session.request(&code)),
            "not prestarted"
        );
        let prestarted = normalized(&run(&rt, session.request(&code)));
        assert_eq!(prestarted, cold, "script:\n{code}");
    }
}

#[test]
fn a_prestart_for_other_settings_is_discarded_and_the_call_starts_cold() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let first = Session::new(python.clone());
    let second = Session::new(python);
    assert!(prestart::prestart(&first.request("print('first')\n")));
    let waiting = processes_in(&first.cwd());
    assert_eq!(
        waiting.len(),
        2,
        "a reaper and its interpreter wait: {waiting:?}"
    );
    // Another session dir is another launch key: the waiting interpreter cannot serve it.
    let r = run(&rt, second.request("import os\nprint(os.getcwd())\n"));
    assert_eq!(
        r.output.trim(),
        second.cwd().display().to_string(),
        "{}",
        r.to_json()
    );
    for pid in waiting {
        assert!(
            gone_within(pid, Duration::from_secs(10)),
            "the unused prestart was left running"
        );
    }
}

#[test]
fn an_unused_prestart_is_discarded_on_request() {
    let python = require_python!();
    let _guard = serial();
    let session = Session::new(python);
    assert!(prestart::prestart(&session.request("print('never')\n")));
    let waiting = processes_in(&session.cwd());
    assert_eq!(waiting.len(), 2, "{waiting:?}");
    prestart::discard();
    for pid in waiting {
        assert!(gone_within(pid, Duration::from_secs(10)));
    }
    // Long-lived hosts fork their executions instead: no prestart while the server is on.
    vibeos_supervisor::zygote::set_enabled(true);
    assert!(!prestart::prestart(&session.request("print('never')\n")));
    vibeos_supervisor::zygote::set_enabled(false);
}
