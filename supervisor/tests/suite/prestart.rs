//! The prestarted interpreter of a one-shot host (`prestart`): the next matching execution
//! takes it and behaves exactly as a cold one; a request it does not match discards it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::common::{fixture, normalized, run, Session};
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
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if std::fs::read_link(entry.path().join("cwd")).is_ok_and(|c| c == dir) {
            out.push(pid);
        }
    }
    out
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
    let scripts = [
        fixture("pool/semantics.py"),
        "import sys\nprint('before')\nsys.exit(3)\n".to_string(),
        "def f():\n    raise ValueError('boom')\nprint('partial')\nf()\n".to_string(),
        "def broken(:\n    pass\n".to_string(),
        "import inspect, sys\nprint(inspect.getsource(sys.modules['__main__']).count('inspect'))\n"
            .to_string(),
        "import os\nprint(os.getcwd())\n".to_string(),
        "raise KeyboardInterrupt\n".to_string(),
    ];
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
