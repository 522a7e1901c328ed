//! The warm interpreter pool, driven through the Rust API with real Python children: nothing
//! passes from one pooled execution to the next, pooled scripts behave as cold ones (semantics,
//! limits, timeout, interrupt, strict confinement), size 0 means cold starts, the pool never
//! holds more than its size, and it leaves nothing behind on shutdown or host exit.
//!
//! The pool is process-wide, so the tests take a lock and run one at a time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vibeos_supervisor::{
    execute, pool, Config, ExecutionRequest, ExecutionResult, Interrupt, Mode,
};

static SERIAL: Mutex<()> = Mutex::new(());

/// Held by every test of this binary that executes code: the pool is process-wide.
pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // The fork server comes before the pool: a failed zygote test may have left it on.
    vibeos_supervisor::zygote::set_enabled(false);
    guard
}

/// A two-worker runtime, as a host's: it lives on after each execution.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `request` in a pooled interpreter: fills the pool first and checks it was used.
fn run_warm(rt: &tokio::runtime::Runtime, request: ExecutionRequest) -> ExecutionResult {
    pool::prewarm(&request);
    assert!(
        pool::wait_until_idle(Some(&request), 1, Duration::from_secs(30)),
        "the pool did not fill: {:?}",
        pool::stats()
    );
    let before = pool::stats().unwrap().warm_starts;
    let result = run(rt, request);
    assert_eq!(
        pool::stats().unwrap().warm_starts,
        before + 1,
        "the call did not use the pool"
    );
    result
}

/// Runs `request` cold (the pool off), then restores `size`.
fn run_cold(
    rt: &tokio::runtime::Runtime,
    request: ExecutionRequest,
    size: usize,
) -> ExecutionResult {
    pool::disable();
    let result = run(rt, request);
    pool::enable(size);
    result
}

/// Pooled interpreters of this process: (interpreter pid, its reaper's pid, staging dir).
fn pooled_interpreters() -> Vec<(i32, i32, PathBuf)> {
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let bootstrap = args.len() >= 5 && args[2] == "-c" && args[3].contains("pool discarded us");
        if !bootstrap || !vibeos_supervisor::is_descendant(pid as u32, me) {
            continue;
        }
        let Some(staging) = Path::new(&args[4]).parent() else {
            continue;
        };
        found.push((pid, parent_of(pid), staging.to_path_buf()));
    }
    found
}

#[test]
fn nothing_passes_from_one_pooled_script_to_the_next() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    for size in [1, 2] {
        pool::enable(size);
        let first = run_warm(&rt, session.request(&fixture("pool/leave_traces.py")));
        assert_eq!(status(&first), "success", "{}", first.to_json());
        let first_staging = PathBuf::from(first.output.trim());
        // Removed after the result is back (staging_retire), so soon rather than at once.
        eventually("the first script's staging dir is removed", || {
            !first_staging.exists()
        });
        let second = json_line(&run_warm(
            &rt,
            session.request(&fixture("pool/look_for_traces.py")),
        ));
        assert_eq!(second["env"], false, "{second}");
        assert_eq!(second["json_patched"], false, "{second}");
        assert_eq!(second["os_attr"], false, "{second}");
        assert_eq!(second["decimal_loaded"], false, "{second}");
        assert_eq!(second["leak_module"], false, "{second}");
        assert_eq!(second["runtime_patched"], false, "{second}");
        assert_eq!(second["fd77"], false, "{second}");
        // Nothing of the earlier request (its staging dir's name) in reach of the later script.
        assert_eq!(second["foreign_paths"], serde_json::json!([]), "{second}");
        assert_eq!(
            second["files"],
            serde_json::json!([
                "_vibeos_runtime.py",
                "rpc.sock",
                "script.py",
                "vibeos_tools.py"
            ]),
            "{second}"
        );
        assert_eq!(second["cwd"], session.cwd().display().to_string());
        assert_ne!(second["here"], first_staging.display().to_string());
        // Exactly the descriptors a cold interpreter has.
        let cold = json_line(&run_cold(
            &rt,
            session.request(&fixture("pool/look_for_traces.py")),
            size,
        ));
        assert_eq!(second["fds"], cold["fds"], "warm {second} cold {cold}");
    }
    pool::disable();
}

#[test]
fn a_pooled_script_is_started_exactly_like_a_cold_one() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    pool::enable(2);
    let scripts = parity_scripts();
    for code in scripts {
        let cold = normalized(&run_cold(&rt, session.request(&code), 2));
        let warm = normalized(&run_warm(&rt, session.request(&code)));
        assert_eq!(warm, cold, "script:\n{code}");
    }
    let report = json_line(&run_warm(
        &rt,
        session.request(&fixture("pool/semantics.py")),
    ));
    assert_eq!(report["name"], "__main__");
    assert_eq!(report["path0_is_script_dir"], true);
    assert_eq!(report["main_is_this_module"], true);
    assert_eq!(report["stdout_write_through"], true);
    pool::disable();
}

#[test]
fn limits_timeout_and_interrupt_behave_as_on_the_cold_path() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    pool::enable(2);
    // Budget, output caps, tool calls from threads, a forked child and a subprocess.
    for (name, tweak) in [
        (
            "core/budget.py",
            (|r: &mut ExecutionRequest| r.max_tool_calls = 2) as fn(&mut _),
        ),
        ("core/flood_stdout.py", |r| r.stdout_limit = 1000),
        ("core/flood_stderr.py", |r| r.stderr_limit = 500),
        ("core/tool_chain.py", |_| {}),
        ("core/stub_helpers.py", |_| {}),
        ("core/threads_and_subprocess.py", |_| {}),
    ] {
        let mut request = session.request(&fixture(name));
        tweak(&mut request);
        let cold = normalized(&run_cold(&rt, request.clone(), 2));
        let warm = normalized(&run_warm(&rt, request));
        assert_eq!(warm, cold, "{name}");
    }

    // Timeout: the notice, and the detached daemon dies with the execution.
    std::fs::write(session.cwd().join("wait-for-timeout"), "").unwrap();
    let mut request = session.request(&fixture("core/daemon_escape.py"));
    request.timeout = Duration::from_millis(1500);
    request.kill_grace = Duration::from_millis(500);
    let cold = run_cold(&rt, request.clone(), 2);
    let warm = run_warm(&rt, request);
    assert_eq!(normalized(&warm), normalized(&cold));
    assert_eq!(status(&warm), "timeout");
    assert!(warm
        .output
        .ends_with("Script timed out after 1.5s and was killed."));
    let daemon: i32 = std::fs::read_to_string(session.cwd().join("daemon.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    eventually("the daemon is gone", || !alive(daemon));
    std::fs::remove_file(session.cwd().join("wait-for-timeout")).unwrap();

    // SIGTERM ignored: the SIGKILL after the grace period ends it.
    let mut request = session.request(&fixture("core/ignore_sigterm.py"));
    request.timeout = Duration::from_millis(800);
    request.kill_grace = Duration::from_millis(300);
    let warm = run_warm(&rt, request.clone());
    assert_eq!(normalized(&warm), normalized(&run_cold(&rt, request, 2)));

    // Interrupt from another thread.
    let request = session.request(&fixture("core/sleep_forever.py"));
    pool::prewarm(&request);
    assert!(pool::wait_until_idle(
        Some(&request),
        1,
        Duration::from_secs(30)
    ));
    let interrupt = Interrupt::new();
    let remote = interrupt.clone();
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        remote.interrupt();
    });
    let started = Instant::now();
    let result = rt.block_on(execute(request, vibeos_tools::registry(), interrupt));
    stopper.join().unwrap();
    assert_eq!(status(&result), "interrupted", "{}", result.to_json());
    assert!(result
        .output
        .ends_with("[execution interrupted — user sent a new message]"));
    assert!(started.elapsed() < Duration::from_secs(10));
    pool::disable();
}

#[test]
fn environment_changes_are_applied_or_fall_back_to_a_cold_start() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let mut session = Session::new(python);
    pool::enable(2);
    // The secret is printed reversed: printed as it is, it would be redacted from the output.
    let show = "import json, os\nv = {k: os.environ.get(k) for k in \
                ['VIBEOS_POOL_TEST_SECRET_TOKEN', 'LANG', 'ADDED_LATER']}\n\
                t = v['VIBEOS_POOL_TEST_SECRET_TOKEN']\n\
                v['VIBEOS_POOL_TEST_SECRET_TOKEN'] = t[::-1] if t else t\n\
                print(json.dumps(v))\n";
    let plain = json_line(&run_warm(&rt, session.request(show)));
    assert_eq!(plain["VIBEOS_POOL_TEST_SECRET_TOKEN"], Value::Null);
    // A skill loaded later passes a secret through: applied to the waiting interpreter.
    pool::prewarm(&session.request(show));
    assert!(pool::wait_until_idle(None, 2, Duration::from_secs(30)));
    let mut request = session.request(show);
    request.env_passthrough = vec!["VIBEOS_POOL_TEST_SECRET_TOKEN".into()];
    let before = pool::stats().unwrap();
    let seen = json_line(&run(&rt, request));
    assert_eq!(seen["VIBEOS_POOL_TEST_SECRET_TOKEN"], "terc3s");
    assert_eq!(pool::stats().unwrap().warm_starts, before.warm_starts + 1);
    // The host's value of a passed-through variable changes: applied too.
    session
        .env
        .retain(|(k, _)| k != "VIBEOS_POOL_TEST_SECRET_TOKEN");
    session
        .env
        .push(("VIBEOS_POOL_TEST_SECRET_TOKEN".into(), "rotated".into()));
    session
        .env
        .push(("ADDED_LATER".into(), "dropped by the policy".into()));
    let mut request = session.request(show);
    request.env_passthrough = vec!["VIBEOS_POOL_TEST_SECRET_TOKEN".into()];
    pool::prewarm(&request);
    assert!(pool::wait_until_idle(None, 1, Duration::from_secs(30)));
    let before = pool::stats().unwrap();
    let seen = json_line(&run(&rt, request));
    assert_eq!(seen["VIBEOS_POOL_TEST_SECRET_TOKEN"], "detator");
    assert_eq!(seen["ADDED_LATER"], Value::Null);
    assert_eq!(pool::stats().unwrap().warm_starts, before.warm_starts + 1);
    // LANG is read at interpreter startup: a cold start, with the new value.
    session.env.retain(|(k, _)| k != "LANG");
    session.env.push(("LANG".into(), "C".into()));
    assert!(pool::wait_until_idle(None, 1, Duration::from_secs(30)));
    let before = pool::stats().unwrap();
    let seen = json_line(&run(&rt, session.request(show)));
    assert_eq!(seen["LANG"], "C");
    let after = pool::stats().unwrap();
    assert_eq!(after.warm_starts, before.warm_starts);
    assert_eq!(after.cold_starts, before.cold_starts + 1);
    // The pool then refills with the new environment and is used again.
    let seen = json_line(&run_warm(&rt, session.request(show)));
    assert_eq!(seen["LANG"], "C");
    // Another session dir is another key: cold, never a pooled interpreter from elsewhere.
    let other = Session::new(session.python.clone());
    let before = pool::stats().unwrap();
    let r = run(&rt, other.request("import os\nprint(os.getcwd())\n"));
    assert_eq!(r.output.trim(), other.cwd().display().to_string());
    assert_eq!(pool::stats().unwrap().warm_starts, before.warm_starts);
    pool::disable();
}

/// A pooled interpreter started while the host passed a secret through runs a later call the
/// host no longer passes it for without it anywhere in reach: not in `os.environ`, and not in
/// the environment block it was exec'd with (which it was started with, and which stays in
/// its memory).
#[test]
fn a_variable_the_host_drops_is_gone_from_a_pooled_interpreter() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    pool::enable(1);
    let code = fixture("zygote/initial_env_block.py");
    let request = |passed: bool| {
        let mut r = session.request(&code);
        let mut env = r.base_env.take().unwrap_or_default();
        env.push(("PROBE_DROPPED_TOKEN".into(), "s3cr3t-value".into()));
        r.base_env = Some(env);
        if passed {
            r.env_passthrough.push("PROBE_DROPPED_TOKEN".into());
        }
        r
    };
    let first = json_line(&run_warm(&rt, request(true)));
    assert_eq!(first["environ"], true, "passed through: {first}");
    pool::prewarm(&request(true));
    assert!(pool::wait_until_idle(None, 1, Duration::from_secs(30)));
    let before = pool::stats().unwrap().warm_starts;
    let later = json_line(&run(&rt, request(false)));
    assert_eq!(
        pool::stats().unwrap().warm_starts,
        before + 1,
        "the call did not use the pool"
    );
    assert_eq!(later["environ"], false, "{later}");
    assert_eq!(
        later["initial"], false,
        "the dropped variable is in the pooled script's memory: {later}"
    );
    pool::disable();
}

#[test]
fn pool_size_zero_means_cold_starts() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let config = Config::parse(
        "code_execution:\n  pool_size: 0\n",
        Path::new("/test/config.yaml"),
    )
    .unwrap();
    assert_eq!(Config::default().pool_size, pool::DEFAULT_POOL_SIZE);
    pool::enable(2);
    pool::enable(config.pool_size);
    assert_eq!(pool::stats(), None);
    pool::prewarm(&session.request("pass"));
    for _ in 0..3 {
        let r = run(&rt, session.request("print('cold')"));
        assert_eq!(r.output, "cold\n");
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        pooled_interpreters().is_empty(),
        "{:?}",
        pooled_interpreters()
    );
}

#[test]
fn the_pool_never_holds_more_than_its_size_and_shuts_down_cleanly() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let a = Session::new(python.clone());
    let b = Session::new(python);
    pool::enable(2);
    pool::prewarm(&a.request("pass"));
    assert!(pool::wait_until_idle(None, 2, Duration::from_secs(30)));
    for i in 0..6 {
        let session = if i % 2 == 0 { &a } else { &b };
        let r = run(&rt, session.request("print('ok')"));
        assert_eq!(r.output, "ok\n");
        let n = pooled_interpreters().len();
        assert!(n <= 2, "{n} pooled interpreters for a pool of 2");
        let stats = pool::stats().unwrap();
        assert!(stats.idle + stats.starting <= 2, "{stats:?}");
    }
    assert!(pool::wait_until_idle(None, 2, Duration::from_secs(30)));
    let pooled = pooled_interpreters();
    assert_eq!(pooled.len(), 2, "{pooled:?}");
    pool::disable();
    for (pid, reaper, staging) in &pooled {
        assert!(!staging.exists(), "{} left", staging.display());
        eventually("the pooled interpreter died", || !alive(*pid));
        eventually("its reaper was collected", || {
            !Path::new(&format!("/proc/{reaper}")).exists()
        });
    }
    assert_eq!(pool::stats(), None);
}

/// Runs as a separate host process (see the test below): fills the pool, prints what it holds,
/// and exits normally without shutting the pool down.
#[test]
fn pool_host_child() {
    if std::env::var_os("VIBEOS_POOL_HOST_CHILD").is_none() {
        return;
    }
    let python = require_python!();
    let session = Session::new(python);
    pool::enable(2);
    pool::prewarm(&session.request("pass"));
    assert!(pool::wait_until_idle(None, 2, Duration::from_secs(30)));
    let held: Vec<Value> = pooled_interpreters()
        .into_iter()
        .map(|(pid, reaper, staging)| serde_json::json!([pid, reaper, staging]))
        .collect();
    println!("POOLED {}", Value::Array(held));
    std::mem::forget(session);
}

#[test]
fn idle_interpreters_die_and_leave_no_staging_dirs_when_the_host_exits() {
    let _python = require_python!();
    let _guard = serial();
    // The host forgets its session on purpose (it exits without cleaning up), so its session
    // dir is made in here, which this test removes.
    let tmp = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "suite::pool::pool_host_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("VIBEOS_POOL_HOST_CHILD", "1")
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("POOLED ").map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("no report: {stdout}"));
    let held: Vec<(i32, i32, PathBuf)> = serde_json::from_str(line).unwrap();
    assert_eq!(held.len(), 2, "{line}");
    for (pid, reaper, staging) in held {
        assert!(
            !staging.exists(),
            "{} left after the host exited",
            staging.display()
        );
        eventually("the pooled interpreter died", || !alive(pid));
        eventually("its reaper died", || !alive(reaper));
    }
}

#[test]
fn strict_confinement_is_the_same_for_pooled_interpreters() {
    let python = require_python!();
    if let Some(why) = strict_unavailable() {
        vibeos_testkit::skip!("strict mode is unavailable on this machine: {why}");
    }
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    pool::enable(2);
    let strict = |code: &str| {
        let mut r = session.request(code);
        r.mode = Mode::Strict;
        r
    };
    let escapes_at = Escapes::new(&session);
    for name in [
        "read_shadow.py",
        "read_project.py",
        "tcp_connect.py",
        "write_outside.py",
        "signal_supervisor.py",
    ] {
        let code = escapes_at.code(name);
        let cold = run_cold(&rt, strict(&code), 2);
        let warm = run_warm(&rt, strict(&code));
        assert_eq!(warm.mode, "strict");
        let warm_attempts = escapes(&warm);
        assert_eq!(warm_attempts, escapes(&cold), "{name}");
        assert!(
            warm_attempts.iter().all(|a| a["escaped"] == false),
            "{name}: {warm_attempts:?}"
        );
    }
    escapes_at.assert_untouched();
    // The process itself: same uid class, no_new_privs, seccomp, staging cwd and channel.
    let probe = "import ctypes, os, json\nfrom vibeos_tools import write_file\n\
                 libc = ctypes.CDLL(None)\n\
                 print(json.dumps({'root': os.getuid() == 0, 'nnp': libc.prctl(39, 0, 0, 0, 0), \
                 'seccomp': libc.prctl(21, 0, 0, 0, 0), 'cwd_is_staging': os.getcwd() == os.path.dirname(__file__), \
                 'tmp': os.environ['TMPDIR'] == os.path.dirname(__file__), \
                 'write': write_file('pool-strict.txt', 'via rpc').get('bytes_written')}))\n";
    let cold = json_line(&run_cold(&rt, strict(probe), 2));
    let warm = json_line(&run_warm(&rt, strict(probe)));
    assert_eq!(warm, cold);
    assert_eq!(warm["root"], false);
    assert_eq!(warm["nnp"], 1);
    assert_eq!(warm["seccomp"], 2);
    assert_eq!(warm["cwd_is_staging"], true);
    assert_eq!(warm["write"], 7);
    // Timeout in strict mode.
    let mut request = strict(&fixture("core/sleep_forever.py"));
    request.timeout = Duration::from_millis(700);
    let warm = run_warm(&rt, request.clone());
    assert_eq!(normalized(&warm), normalized(&run_cold(&rt, request, 2)));
    assert_eq!(status(&warm), "timeout");
    drop(escapes_at);
    pool::disable();
}
