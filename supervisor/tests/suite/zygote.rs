//! The fork server (zygote), driven through the Rust API with real Python children: forked
//! executions behave as cold ones (semantics, limits, timeout, interrupt, strict confinement),
//! two consecutive ones share no state, concurrent ones get their own channels, a script cannot
//! reach the server's control channel, and everything a script starts dies with it.
//!
//! Fork servers are process-wide, so the tests take a lock and run one at a time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::common::*;
use serde_json::Value;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vibeos_supervisor::{execute, zygote, ExecutionRequest, ExecutionResult, Interrupt, Mode};

/// One test at a time (the lock the pool's tests hold: servers and pool are both process-wide),
/// each starting without servers (a failed test may have left some).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    let guard = super::pool::serial();
    zygote::set_enabled(false);
    guard
}

fn runtime() -> tokio::runtime::Runtime {
    // The test harness hands this process inheritable descriptors (the build's jobserver) that a
    // cold child would inherit and a forked one, which starts from the server, would not.
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only changes descriptor flags.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `request` forked from its key's server and checks it was.
fn run_forked(rt: &tokio::runtime::Runtime, request: ExecutionRequest) -> ExecutionResult {
    zygote::set_enabled(true);
    let before = zygote::forks();
    let result = run(rt, request);
    assert_eq!(
        zygote::forks(),
        before + 1,
        "the call was not forked: {}",
        result.to_json()
    );
    result
}

/// Runs `request` cold (servers off), then turns them back on.
fn run_cold(rt: &tokio::runtime::Runtime, request: ExecutionRequest) -> ExecutionResult {
    zygote::set_enabled(false);
    let result = run(rt, request);
    zygote::set_enabled(true);
    result
}

/// Every process on the machine (pids, from /proc).
fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .collect()
}

/// The fork servers of this process (pids).
fn servers() -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    for pid in all_pids() {
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let text = String::from_utf8_lossy(&cmdline);
        if text.contains("The fork server of one launch key") && parent_of(pid) == me {
            found.push(pid);
        }
    }
    found
}

#[test]
fn forked_scripts_behave_exactly_like_cold_ones() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let scripts = parity_scripts();
    for code in scripts {
        let cold = normalized(&run_cold(&rt, session.request(&code)));
        let forked = normalized(&run_forked(&rt, session.request(&code)));
        assert_eq!(forked, cold, "script:\n{code}");
    }
    let report = json_line(&run_forked(
        &rt,
        session.request(&fixture("pool/semantics.py")),
    ));
    assert_eq!(report["name"], "__main__");
    assert_eq!(report["path0_is_script_dir"], true);
    assert_eq!(report["main_is_this_module"], true);
    zygote::set_enabled(false);
}

/// The stub's runtime is loaded by the server before it forks, so a forked script that imports
/// its tools does not compile it; its code then names this execution's copy of the file, as a
/// cold run's does, in `__file__`, tracebacks and `inspect`. It is handed over at the script's
/// first import, not before.
#[test]
fn a_forked_script_finds_the_stub_runtime_loaded_and_naming_its_own_file() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let code = fixture("zygote/runtime_adopted.py");
    let forked = json_line(&run_forked(&rt, session.request(&code)));
    let cold = json_line(&run_cold(&rt, session.request(&code)));
    zygote::set_enabled(false);
    assert_eq!(forked["preloaded"], true, "{forked}");
    assert_eq!(cold["preloaded"], false, "{cold}");
    for report in [&forked, &cold] {
        // Only a script that imports its tools pays for the runtime's adoption.
        assert_eq!(report["imported_early"], false, "{report}");
        let own = format!("{}/_vibeos_runtime.py", report["here"].as_str().unwrap());
        assert_eq!(report["runtime_file"], own.as_str(), "{report}");
        assert_eq!(report["code_files"], serde_json::json!([own]), "{report}");
        assert_eq!(
            report["retry_source"],
            "def retry(fn, max_attempts=3, delay=2):"
        );
        assert!(
            report["tb_files"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f == own.as_str()),
            "{report}"
        );
        assert_eq!(report["error_module"], "vibeos_tools", "{report}");
    }
}

#[test]
fn two_consecutive_forked_executions_share_no_state() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    zygote::set_enabled(true);
    let first = run_forked(&rt, session.request(&fixture("pool/leave_traces.py")));
    assert_eq!(status(&first), "success", "{}", first.to_json());
    let first_staging = PathBuf::from(first.output.trim());
    // Removed after the result is back (staging_retire), so soon rather than at once.
    eventually("the first staging dir is removed", || {
        !first_staging.exists()
    });
    let second = json_line(&run_forked(
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
    let cold = json_line(&run_cold(
        &rt,
        session.request(&fixture("pool/look_for_traces.py")),
    ));
    assert_eq!(second["fds"], cold["fds"], "forked {second} cold {cold}");
    // Random streams, temp names and uuids: a fork must not hand siblings the same sequence.
    let a = json_line(&run_forked(
        &rt,
        session.request(&fixture("zygote/random_streams.py")),
    ));
    let b = json_line(&run_forked(
        &rt,
        session.request(&fixture("zygote/random_streams.py")),
    ));
    for k in ["random", "tempname", "uuid4", "urandom", "pid"] {
        assert_ne!(a[k], b[k], "{k} repeated: {a} {b}");
    }
    zygote::set_enabled(false);
}

#[test]
fn concurrent_forked_executions_get_their_own_channel_and_dir() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    zygote::set_enabled(true);
    let code = "from vibeos_tools import write_file, read_file\nimport os, time\n\
                name = 'c-%d.txt' % os.getpid()\nwrite_file(name, name)\ntime.sleep(0.2)\n\
                print(name in read_file(name)['content'], os.path.dirname(__file__))\n";
    let before = zygote::forks();
    let results: Vec<ExecutionResult> = rt.block_on(async {
        let calls = (0..8).map(|_| {
            execute(
                session.request(code),
                vibeos_tools::registry(),
                Interrupt::new(),
            )
        });
        futures_join_all(calls).await
    });
    assert_eq!(zygote::forks(), before + 8);
    let mut dirs = std::collections::BTreeSet::new();
    for r in &results {
        assert_eq!(status(r), "success", "{}", r.to_json());
        let line = r.output.trim();
        assert!(line.starts_with("True "), "{line}");
        dirs.insert(line[5..].to_string());
    }
    assert_eq!(dirs.len(), 8, "staging dirs were shared: {dirs:?}");
    assert_eq!(servers().len(), 1, "one server per key");
    zygote::set_enabled(false);
    eventually("the server is gone", || servers().is_empty());
}

async fn futures_join_all<F: std::future::Future<Output = ExecutionResult> + Send + 'static>(
    calls: impl Iterator<Item = F>,
) -> Vec<ExecutionResult> {
    let handles: Vec<_> = calls.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[test]
fn limits_timeout_interrupt_and_descendants_as_on_the_cold_path() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
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
        let cold = normalized(&run_cold(&rt, request.clone()));
        let forked = normalized(&run_forked(&rt, request));
        assert_eq!(forked, cold, "{name}");
    }

    // A detached grandchild of a script that ends normally dies with the execution.
    let r = run_forked(&rt, session.request(&fixture("zygote/detach_and_exit.py")));
    assert_eq!(status(&r), "success", "{}", r.to_json());
    let orphan: i32 = r
        .output
        .lines()
        .find_map(|l| l.strip_prefix("ORPHAN "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    eventually("the detached grandchild is gone", || !alive(orphan));

    // Timeout: the notice, and the detached daemon dies with the execution.
    std::fs::write(session.cwd().join("wait-for-timeout"), "").unwrap();
    let mut request = session.request(&fixture("core/daemon_escape.py"));
    request.timeout = Duration::from_millis(1500);
    request.kill_grace = Duration::from_millis(500);
    let cold = run_cold(&rt, request.clone());
    let forked = run_forked(&rt, request);
    assert_eq!(normalized(&forked), normalized(&cold));
    assert_eq!(status(&forked), "timeout");
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
    let forked = run_forked(&rt, request.clone());
    assert_eq!(normalized(&forked), normalized(&run_cold(&rt, request)));

    // SIGTERM handled (the script exits 3): it ends at once with its own code, not held
    // stopped until the SIGKILL (5 s later, -9).
    let mut request = session.request(&fixture("core/exit_on_sigterm.py"));
    request.timeout = Duration::from_millis(800);
    request.kill_grace = Duration::from_secs(5);
    let started = Instant::now();
    let forked = run_forked(&rt, request.clone());
    let took = started.elapsed();
    assert_eq!(forked.exit_code, Some(3), "{}", forked.to_json());
    assert!(
        forked.output.contains("cleanup done"),
        "{}",
        forked.to_json()
    );
    assert!(took < Duration::from_secs(4), "held for {took:?}");
    assert_eq!(normalized(&forked), normalized(&run_cold(&rt, request)));

    // Interrupt from another thread.
    let request = session.request(&fixture("core/sleep_forever.py"));
    let interrupt = Interrupt::new();
    let remote = interrupt.clone();
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        remote.interrupt();
    });
    let started = Instant::now();
    let before = zygote::forks();
    let result = rt.block_on(execute(request, vibeos_tools::registry(), interrupt));
    stopper.join().unwrap();
    assert_eq!(zygote::forks(), before + 1);
    assert_eq!(status(&result), "interrupted", "{}", result.to_json());
    assert!(started.elapsed() < Duration::from_secs(10));
    zygote::set_enabled(false);
}

/// The next staging dir is prepared with the stub the last execution used; an execution whose
/// tool set differs gets its own stub instead, and the one after it its own again.
#[test]
fn a_forked_script_gets_the_stub_of_its_own_tool_set_when_the_set_changes() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let code = "import vibeos_tools\n\
                print(sorted(n for n in ('read_file', 'write_file', 'search_files') \
                if hasattr(vibeos_tools, n)))\n";
    for (round, tools) in [
        vec!["read_file"],
        vec!["read_file"],
        vec!["read_file", "write_file"],
        vec!["search_files"],
        vec!["search_files"],
    ]
    .into_iter()
    .enumerate()
    {
        let mut request = session.request(code);
        request.script_tools = Some(tools.iter().map(|t| t.to_string()).collect());
        let r = run_forked(&rt, request);
        let mut expected: Vec<&str> = tools.clone();
        expected.sort_unstable();
        let expected = format!(
            "[{}]\n",
            expected
                .iter()
                .map(|t| format!("'{t}'"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        assert_eq!(r.output, expected, "round {round}: {}", r.to_json());
    }
    zygote::set_enabled(false);
}

/// The exit claim (a finished script stops and its reaper kills it and reports its status, so
/// the result does not wait for the kernel's teardown) cannot be forged into an early result:
/// a claim with another process of the execution left is declined and the script goes on; a
/// taken claim kills the script outright, so nothing of it runs after the result. A script
/// that stops itself without a claim stays stopped, as a cold one does.
#[test]
fn an_exit_claim_ends_the_script_and_cannot_be_forged_into_an_early_result() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let code = fixture("zygote/forged_exit_claim.py");
    // The fixture's attempt, picked by its MODE variable.
    let attempt = |mode: &str| {
        let mut request = session.request(&code);
        request.env_passthrough.push("MODE".into());
        let mut env = request.base_env.take().unwrap_or_default();
        env.retain(|(k, _)| k != "MODE");
        env.push(("MODE".into(), mode.into()));
        request.base_env = Some(env);
        run_forked(&rt, request)
    };

    let r = attempt("child");
    assert_eq!(r.exit_code, Some(4), "{}", r.to_json());
    assert_eq!(
        r.output,
        "forging\nwent on after the declined claim\n",
        "{}",
        r.to_json()
    );

    let marker = session.cwd().join("late-marker");
    let r = attempt("thread");
    assert_eq!(status(&r), "success", "{}", r.to_json());
    assert_eq!(r.output, "forging\n", "{}", r.to_json());
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !marker.exists(),
        "a thread of the script ran after its result"
    );

    let mut request = session.request(
        "import os, signal\nprint('stopping', flush=True)\nos.kill(os.getpid(), signal.SIGSTOP)\n",
    );
    request.timeout = Duration::from_millis(1000);
    request.kill_grace = Duration::from_millis(300);
    let forked = run_forked(&rt, request.clone());
    assert_eq!(status(&forked), "timeout", "{}", forked.to_json());
    assert_eq!(normalized(&forked), normalized(&run_cold(&rt, request)));
    zygote::set_enabled(false);
}

#[test]
fn the_server_dies_with_its_host_and_leaves_no_staging_dirs() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    zygote::set_enabled(true);
    let r = run_forked(&rt, session.request("print('up')\n"));
    assert_eq!(r.output, "up\n");
    let pids = servers();
    assert_eq!(pids.len(), 1);
    zygote::set_enabled(false);
    eventually("the server exited", || !alive(pids[0]));
}

/// The processes a server has forked (waiting spares and the reapers of running executions).
fn children_of(server: i32) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|pid| parent_of(*pid) == server && alive(*pid))
        .collect()
}

#[test]
fn a_spare_that_died_while_waiting_is_replaced_and_leaves_nothing() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    zygote::set_enabled(true);
    let r = run_forked(&rt, session.request("print('first')\n"));
    assert_eq!(r.output, "first\n");
    let server = servers()[0];
    // The next execution's processes are forked ahead; kill them where they wait.
    eventually("a spare is waiting", || !children_of(server).is_empty());
    let spares = children_of(server);
    for pid in &spares {
        // SAFETY: kill(2) with a pid read from /proc and a valid signal number.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    // Dead before the next request (a spare killed while the request is on its way is that
    // execution killed, as a script killed by anyone else would be).
    for pid in &spares {
        eventually("the spare died", || !alive(*pid));
    }
    let r = run_forked(&rt, session.request("print('second')\n"));
    assert_eq!(r.output, "second\n", "{}", r.to_json());
    assert_eq!(status(&r), "success", "{}", r.to_json());
    // Only the replacements wait now: two asked for ahead, and at most two reapers that handed
    // themselves back after an execution (`_KEEP_RETURNED` in zygote_boot.py). The killed
    // spares' script processes are gone.
    eventually("two to four spares are left", || {
        (2..=4).contains(&children_of(server).len())
    });
    // Nor is any copy of the server outside it and its spares (the killed reaper's script
    // process ends at EOF on its channel, which the supervisor closed). A copy is told by the
    // server's whole argv, which holds a directory made for this server only: other fork
    // servers on the machine (another suite's, a probe's) are none of this test's business.
    let server_argv = std::fs::read(format!("/proc/{server}/cmdline")).unwrap();
    assert!(String::from_utf8_lossy(&server_argv).contains("The fork server of one"));
    let orphans = || -> Vec<i32> {
        let ours = children_of(server);
        all_pids()
            .into_iter()
            .filter(|pid| {
                alive(*pid)
                    && *pid != server
                    && !ours.contains(pid)
                    && !ours.contains(&parent_of(*pid))
                    && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == server_argv)
            })
            .collect()
    };
    eventually("no copy of the server is left over", || {
        orphans().is_empty()
    });
    zygote::set_enabled(false);
}

/// Runs as a separate host process (see the test below): runs one short forked script (whose end
/// prepares the next areas), then starts a forked script that sleeps, prints its staging dir
/// and pid once the script has written them, and waits to be killed.
#[test]
fn zygote_host_child() {
    if std::env::var_os("VIBEOS_ZYGOTE_HOST_CHILD").is_none() {
        return;
    }
    let python = require_python!();
    let rt = runtime();
    let session = Session::new(python);
    zygote::set_enabled(true);
    let report = session.cwd().join("where.txt");
    let code = format!(
        "import os, time\nhere = os.path.dirname(os.path.abspath(__file__))\n\
         open({report:?} + '.tmp', 'w').write('%s %d' % (here, os.getpid()))\n\
         os.rename({report:?} + '.tmp', {report:?})\ntime.sleep(300)\n",
        report = report.display().to_string()
    );
    // A call that ends first: its end prepares (and arms) the next areas, so the host is killed
    // with prepared staging dirs as well as a running one.
    let first = run(&rt, session.request("pass\n"));
    assert_eq!(status(&first), "success", "{}", first.to_json());
    std::thread::sleep(Duration::from_millis(500));
    let request = session.request(&code);
    let _running = rt.spawn(execute(request, vibeos_tools::registry(), Interrupt::new()));
    eventually("the forked script reported", || report.exists());
    println!("FORKED {}", std::fs::read_to_string(&report).unwrap());
    std::thread::sleep(Duration::from_secs(300));
}

#[test]
fn a_host_killed_mid_execution_leaves_no_staging_dir_or_process() {
    let _python = require_python!();
    let _guard = serial();
    for round in 0..3 {
        // Everything the killed host cannot clean up itself (its session dir, its server's
        // empty dir) stays in here; the staging dir is the reaper's to sweep.
        let tmp = tempfile::tempdir().unwrap();
        let mut host = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "suite::zygote::zygote_host_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("VIBEOS_ZYGOTE_HOST_CHILD", "1")
            .env("TMPDIR", tmp.path())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = host.stdout.take().unwrap();
        let line = std::io::BufRead::lines(std::io::BufReader::new(stdout))
            .map_while(Result::ok)
            .find_map(|l| l.split_once("FORKED ").map(|(_, rest)| rest.to_string()))
            .unwrap_or_else(|| panic!("round {round}: the host reported nothing"));
        let (staging, pid) = line.rsplit_once(' ').unwrap();
        let (staging, pid) = (PathBuf::from(staging), pid.trim().parse::<i32>().unwrap());
        assert!(staging.exists(), "round {round}: {}", staging.display());
        host.kill().unwrap();
        host.wait().unwrap();
        eventually("the forked script died with its host", || !alive(pid));
        eventually("its staging dir was swept", || !staging.exists());
        // The areas prepared for later calls too: each one's armed reaper sweeps it.
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        let parent = tmp.path().join(format!("vibeos-staging-{euid}"));
        eventually("no prepared staging dir is left", || {
            std::fs::read_dir(&parent).map_or(true, |d| d.count() == 0)
        });
    }
}

#[test]
fn strict_confinement_is_the_same_for_forked_executions() {
    let python = require_python!();
    if let Some(why) = strict_unavailable() {
        vibeos_testkit::skip!("strict mode is unavailable on this machine: {why}");
    }
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
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
        "ptrace_supervisor.py",
    ] {
        let code = escapes_at.code(name);
        let cold = run_cold(&rt, strict(&code));
        let forked = run_forked(&rt, strict(&code));
        assert_eq!(forked.mode, "strict");
        let attempts = escapes(&forked);
        assert_eq!(attempts, escapes(&cold), "{name}");
        assert!(
            attempts.iter().all(|a| a["escaped"] == false),
            "{name}: {attempts:?}"
        );
    }
    escapes_at.assert_untouched();
    let probe = "import ctypes, os, json\nfrom vibeos_tools import write_file\n\
                 libc = ctypes.CDLL(None)\n\
                 print(json.dumps({'root': os.getuid() == 0, 'nnp': libc.prctl(39, 0, 0, 0, 0), \
                 'seccomp': libc.prctl(21, 0, 0, 0, 0), 'cwd_is_staging': os.getcwd() == os.path.dirname(__file__), \
                 'tmp': os.environ['TMPDIR'] == os.path.dirname(__file__), \
                 'home': os.environ['HOME'] == os.path.dirname(__file__), \
                 'write': write_file('zygote-strict.txt', 'via rpc').get('bytes_written')}))\n";
    let cold = json_line(&run_cold(&rt, strict(probe)));
    let forked = json_line(&run_forked(&rt, strict(probe)));
    assert_eq!(forked, cold);
    assert_eq!(forked["root"], false);
    assert_eq!(forked["nnp"], 1);
    assert_eq!(forked["seccomp"], 2);
    assert_eq!(forked["cwd_is_staging"], true);
    assert_eq!(forked["home"], true);
    assert_eq!(forked["write"], 7);
    // Two live strict executions never share a uid (root only: otherwise there is one uid).
    let uid_probe = "import os, time\nprint(os.getuid())\ntime.sleep(0.3)\n";
    let uids: Vec<String> = rt.block_on(async {
        let a = tokio::spawn(execute(
            strict(uid_probe),
            vibeos_tools::registry(),
            Interrupt::new(),
        ));
        let b = tokio::spawn(execute(
            strict(uid_probe),
            vibeos_tools::registry(),
            Interrupt::new(),
        ));
        vec![a.await.unwrap().output, b.await.unwrap().output]
    });
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_ne!(uids[0], uids[1], "two live executions shared a uid");
    }
    // Timeout in strict mode.
    let mut request = strict(&fixture("core/sleep_forever.py"));
    request.timeout = Duration::from_millis(700);
    let forked = run_forked(&rt, request.clone());
    assert_eq!(normalized(&forked), normalized(&run_cold(&rt, request)));
    assert_eq!(status(&forked), "timeout");
    drop(escapes_at);
    zygote::set_enabled(false);
}

/// Turns fork servers on, runs one strict script forked and returns the one server that forked
/// it.
fn the_server_of_a_strict_call(
    rt: &tokio::runtime::Runtime,
    strict: &dyn Fn(&str) -> ExecutionRequest,
) -> i32 {
    zygote::set_enabled(true);
    let warm = run_forked(rt, strict("print('warm')\n"));
    assert_eq!(warm.output, "warm\n", "{}", warm.to_json());
    let pids = servers();
    assert_eq!(pids.len(), 1, "{pids:?}");
    pids[0]
}

/// Runs `fixtures/zygote/control_channel.py` forked, as `strict` builds its request, against
/// the process `target` (a fork server, a waiting spare) and asserts that every way in was
/// refused: descriptors of its own besides the RPC channel, the target's descriptors through
/// /proc and `pidfd_getfd`, a signal, ptrace, its memory.
fn attack_is_refused(
    rt: &tokio::runtime::Runtime,
    strict: &dyn Fn(&str) -> ExecutionRequest,
    target: i32,
) {
    attack_with(rt, strict, serde_json::json!({ "server_pid": target }));
}

/// [`attack_is_refused`] with the fixture's `PARAMS`; returns the pid it attacked.
fn attack_with(
    rt: &tokio::runtime::Runtime,
    strict: &dyn Fn(&str) -> ExecutionRequest,
    params: Value,
) -> i32 {
    let code = format!(
        "PARAMS = {params}\n{}",
        fixture("zygote/control_channel.py")
    );
    let r = run_forked(rt, strict(&code));
    let line = r
        .output
        .lines()
        .find_map(|l| l.strip_prefix("ATTACK "))
        .unwrap_or_else(|| panic!("no report: {}", r.to_json()));
    let got: Value = serde_json::from_str(line).unwrap();
    assert_eq!(got["own_sockets"], serde_json::json!([]), "{got}");
    assert!(
        got["proc_fds"].is_null(),
        "the target's descriptors were listed: {got}"
    );
    assert_eq!(got["proc_fd_opened"], serde_json::json!([]), "{got}");
    assert_eq!(got["getfd"], serde_json::json!([]), "{got}");
    assert_eq!(got["signal"], false, "{got}");
    assert_eq!(got["ptrace"], false, "{got}");
    assert_eq!(got["mem"], false, "{got}");
    got["target"]
        .as_i64()
        .expect("the fixture names its target") as i32
}

/// Reapers serve again: once the supervisor lets go of an execution, its reaper forks a fresh
/// script process and hands itself back to the server. Scripts run under a reaper that served
/// earlier ones find none of their traces (files, modules, environment, descriptors, staging
/// names, not even in their own memory), and every one reports its own status.
#[test]
fn a_reaper_that_served_before_hands_later_scripts_nothing_of_earlier_ones() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    zygote::set_enabled(true);
    let recycled_before = zygote::recycled_reapers();
    let mut reapers = Vec::new();
    let mut stagings: Vec<String> = Vec::new();
    // Each script first prints its reaper's pid and its staging dir.
    let run_noting = |code: &str, reapers: &mut Vec<String>, stagings: &mut Vec<String>| {
        let code = format!(
            "import os\nprint(os.getppid())\nprint(os.path.dirname(os.path.abspath(__file__)))\n{code}"
        );
        let r = run_forked(&rt, session.request(&code));
        let mut lines = r.output.lines();
        reapers.push(lines.next().unwrap_or_default().to_owned());
        stagings.push(lines.next().unwrap_or_default().to_owned());
        r
    };
    for round in 0..5 {
        let left = run_noting(
            &fixture("pool/leave_traces.py"),
            &mut reapers,
            &mut stagings,
        );
        assert_eq!(status(&left), "success", "{}", left.to_json());
        let look = run_noting(
            &fixture("pool/look_for_traces.py"),
            &mut reapers,
            &mut stagings,
        );
        let seen: Value = serde_json::from_str(look.output.lines().nth(2).unwrap()).unwrap();
        for k in [
            "env",
            "json_patched",
            "os_attr",
            "decimal_loaded",
            "leak_module",
            "runtime_patched",
            "fd77",
        ] {
            assert_eq!(seen[k], false, "round {round}, {k}: {seen}");
        }
        assert_eq!(seen["foreign_paths"], serde_json::json!([]), "{seen}");
        assert_eq!(seen["cwd"], session.cwd().display().to_string());
        // Nor in the memory a reaper that served them hands on (its part of each request came
        // with the path).
        let halves: Vec<[&str; 2]> = stagings
            .iter()
            .map(|p| {
                let (a, b) = p.split_at(p.len() / 2);
                [a, b]
            })
            .collect();
        let code = format!(
            "PARAMS = {}\n{}",
            serde_json::json!({ "halves": halves }),
            fixture("zygote/scan_own_memory.py")
        );
        let scan = run_noting(&code, &mut reapers, &mut stagings);
        assert_eq!(
            scan.output.lines().nth(2),
            Some("COPIES 0"),
            "round {round}: {}",
            scan.to_json()
        );
        let failing = run_noting("import sys\nsys.exit(7)\n", &mut reapers, &mut stagings);
        assert_eq!(failing.exit_code, Some(7), "{}", failing.to_json());
    }
    let recycled = zygote::recycled_reapers() - recycled_before;
    assert!(recycled >= 5, "only {recycled} of 20 reapers served again");
    let mut distinct = reapers.clone();
    distinct.sort();
    distinct.dedup();
    assert!(
        distinct.len() < reapers.len(),
        "no reaper served twice: {reapers:?}"
    );
    zygote::set_enabled(false);
}

/// An execution running while its server goes away (servers turned off, as on eviction or a
/// restart for a changed startup variable) still reports its own result: its reaper, whose
/// parent is gone, kills what the script left running, sweeps and reports rather than serving
/// again.
#[test]
fn an_execution_outlives_its_server_and_reports_its_result() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    zygote::set_enabled(true);
    let warm = run_forked(&rt, session.request("print('warm')\n"));
    assert_eq!(warm.output, "warm\n", "{}", warm.to_json());
    let server = servers()[0];
    let started = session.cwd().join("started");
    let code = format!(
        "import subprocess, time\nopen({:?}, 'w').close()\ntime.sleep(1.0)\n\
         subprocess.Popen(['sleep', '30'])\nprint('done')\n",
        started.display().to_string()
    );
    let running = rt.spawn(execute(
        session.request(&code),
        vibeos_tools::registry(),
        Interrupt::new(),
    ));
    eventually("the script started", || started.exists());
    zygote::set_enabled(false);
    eventually("the server exited", || !alive(server));
    let r = rt.block_on(running).unwrap();
    assert_eq!(status(&r), "success", "{}", r.to_json());
    assert_eq!(r.output, "done\n", "{}", r.to_json());
    assert_eq!(r.exit_code, Some(0), "{}", r.to_json());
}

/// A strict script cannot reach its own reaper, the process that serves later executions once
/// this one is over: no descriptor of it, no signal, no ptrace, no write to its memory. That
/// reaper then serves the next executions as if nothing had been tried.
#[test]
fn a_strict_script_cannot_reach_the_reaper_that_serves_later_executions() {
    let python = require_python!();
    if let Some(why) = strict_unavailable() {
        vibeos_testkit::skip!("strict mode is unavailable on this machine: {why}");
    }
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let strict = |code: &str| {
        let mut r = session.request(code);
        r.mode = Mode::Strict;
        r
    };
    zygote::set_enabled(false);
    the_server_of_a_strict_call(&rt, &strict);
    let recycled_before = zygote::recycled_reapers();
    for _ in 0..3 {
        attack_is_refused(&rt, &strict, 0);
    }
    for n in 0..4 {
        let r = run_forked(&rt, strict(&format!("print({n})\n")));
        assert_eq!(r.output, format!("{n}\n"), "{}", r.to_json());
    }
    assert!(
        zygote::recycled_reapers() > recycled_before,
        "no strict execution ran under a reaper that served before"
    );
    zygote::set_enabled(false);
}

#[test]
fn a_strict_script_cannot_reach_the_fork_server() {
    let python = require_python!();
    if let Some(why) = strict_unavailable() {
        vibeos_testkit::skip!("strict mode is unavailable on this machine: {why}");
    }
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let strict = |code: &str| {
        let mut r = session.request(code);
        r.mode = Mode::Strict;
        r
    };
    zygote::set_enabled(false);
    let server = the_server_of_a_strict_call(&rt, &strict);
    attack_is_refused(&rt, &strict, server);
    // The server was neither stopped nor confused: it still forks, and is the same process.
    assert!(alive(server));
    let after = run_forked(&rt, strict("print('after')\n"));
    assert_eq!(after.output, "after\n", "{}", after.to_json());
    assert_eq!(servers(), vec![server]);
    zygote::set_enabled(false);
}

/// A fork server that is slow to start (here one that waits for the test, then fails) does not
/// hold up the executions of other keys, and the calls of its own key wait for it only briefly,
/// then start cold; once its start fails, the call that started it runs cold as well.
#[test]
fn a_slow_or_failed_server_start_blocks_no_other_execution() {
    let python = require_python!();
    let _guard = serial();
    let rt = std::sync::Arc::new(runtime());
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("release");
    let wrapper = dir.path().join("python3");
    // Only the fork server's start (its program names itself) waits, then fails (after 60 s at
    // most, so a failed test leaves nothing behind); every other use of this interpreter
    // (cold scripts) runs the real one. It does not say which Python it runs (the `-E -s`
    // question of `interpreter_shim`), so it is run itself, under a launch key of its own,
    // instead of being resolved to the real one and sharing that one's key.
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncase \"$*\" in *'The fork server of one launch key'*)\n  i=0\n  \
             while [ ! -e '{}' ] && [ $i -lt 3000 ]; do sleep 0.02; i=$((i+1)); done\n  \
             exit 1;;\n'-E -s -c '*) exit 1;;\nesac\nexec '{}' \"$@\"\n",
            release.display(),
            python.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let slow = Session::new(wrapper);
    let other = Session::new(python);
    zygote::set_enabled(true);

    let first = slow.request("print('first call of the slow key')\n");
    let first_rt = std::sync::Arc::clone(&rt);
    let stuck = std::thread::spawn(move || run(&first_rt, first));
    eventually("the slow server's start began", || !servers().is_empty());

    // Another key: served by its own server while the slow one is still starting. Under the
    // registry lock the start used to hold, this waited for the start's 30 s timeout.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let other_rt = std::sync::Arc::clone(&rt);
    let other_request = other.request("print('other key')\n");
    let before = zygote::forks();
    std::thread::spawn(move || {
        let _ = done_tx.send(run(&other_rt, other_request));
    });
    let served = done_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("another key's execution waited for a fork server's start");
    assert_eq!(served.output, "other key\n", "{}", served.to_json());
    assert_eq!(zygote::forks(), before + 1, "the other key was not forked");

    // The slow key itself: started cold after a short wait instead of waiting for its server.
    let before = zygote::forks();
    let cold = run(&rt, slow.request("print('same key, cold')\n"));
    assert_eq!(cold.output, "same key, cold\n", "{}", cold.to_json());
    assert_eq!(
        zygote::forks(),
        before,
        "a call was forked by a server still starting"
    );
    assert!(
        !stuck.is_finished(),
        "the slow start ended before the test released it"
    );

    // The start fails: its call runs cold, and nothing of the failed server is left.
    std::fs::write(&release, "").unwrap();
    let first = stuck.join().unwrap();
    assert_eq!(status(&first), "success", "{}", first.to_json());
    assert_eq!(first.output, "first call of the slow key\n");
    assert_eq!(zygote::forks(), before, "the failed server forked a call");
    zygote::set_enabled(false);
    eventually("no server is left", || servers().is_empty());
}

/// A field of `/proc/PID/status` ("Seccomp", "NoNewPrivs", "Uid": its first value).
fn status_field(pid: i32, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next().map(str::to_owned))
}

/// Strict spares are confined while they wait: the processes that will run the next strict
/// scripts already run with their own uid, no_new_privs and the seccomp filter before any
/// request reaches them, and a running strict script cannot reach such a waiting sibling (its
/// channel, its descriptors, a signal, ptrace, its memory) to hand it a script of its own.
#[test]
fn a_strict_spare_is_confined_before_its_request_and_out_of_its_siblings_reach() {
    let python = require_python!();
    if let Some(why) = strict_unavailable() {
        vibeos_testkit::skip!("strict mode is unavailable on this machine: {why}");
    }
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let strict = |code: &str| {
        let mut r = session.request(code);
        r.mode = Mode::Strict;
        r
    };
    zygote::set_enabled(true);
    let warm = run_forked(&rt, strict("import os\nprint(os.getpid())\n"));
    let warm_pid: i32 = warm
        .output
        .trim()
        .parse()
        .expect("the warm-up prints its pid");
    let pids = servers();
    assert_eq!(pids.len(), 1, "{pids:?}");
    let server = pids[0];
    // Script processes of waiting spares (below their reapers) that are already sealed. The
    // warm-up's own script process is one too until its teardown ends (killed after its exit
    // claim, it is not a zombie yet), and is no sibling to attack.
    let confined = || -> Vec<i32> {
        children_of(server)
            .into_iter()
            .flat_map(children_of)
            .filter(|p| *p != warm_pid && status_field(*p, "Seccomp").as_deref() == Some("2"))
            .collect()
    };
    // The list the wait saw: a second look could come while the set of spares changes (a
    // reaper serving again forks a fresh one) and find only the one the call will run in.
    let mut spares = Vec::new();
    eventually("two spares confined ahead", || {
        spares = confined();
        spares.len() >= 2
    });
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let mut uids = Vec::new();
    for pid in &spares {
        assert_eq!(status_field(*pid, "NoNewPrivs").as_deref(), Some("1"));
        let uid = status_field(*pid, "Uid").unwrap();
        if root {
            assert_ne!(uid, "0", "a confined spare still runs as root");
        }
        uids.push(uid);
    }
    if root {
        uids.dedup();
        assert_eq!(uids.len(), spares.len(), "two spares share a uid: {uids:?}");
    }
    // The call runs in one of the confined spares; the attack aims at the other one. Which
    // one it takes is not told by start times (two spares confined within one clock tick).
    let before = zygote::confined_ahead();
    let target = attack_with(&rt, &strict, serde_json::json!({ "siblings": spares }));
    assert!(
        spares.contains(&target),
        "attacked {target}, not one of {spares:?}"
    );
    assert_eq!(zygote::confined_ahead(), before + 1);
    // The sibling is untouched and runs the next script, its own.
    assert!(alive(target));
    // Waiting (S), or copying its pages ahead of a request (R, `_populate_while_idle`); never
    // stopped or traced (T, t) by the attack.
    let state = status_field(target, "State");
    assert!(
        matches!(state.as_deref(), Some("S" | "R")),
        "the sibling spare is in state {state:?}"
    );
    let next = run_forked(&rt, strict("print('next')\n"));
    assert_eq!(next.output, "next\n", "{}", next.to_json());
    assert_eq!(zygote::confined_ahead(), before + 2);
    zygote::set_enabled(false);
}

/// `Private_Dirty` and `Shared_Dirty` of a process, in kB (`/proc/PID/smaps_rollup`).
fn dirty_kb(pid: i32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
    };
    Some((field("Private_Dirty")?, field("Shared_Dirty")?))
}

/// A spare that waits copies the pages it shares with its reaper and the server
/// (`_populate_while_idle`), so the script it later runs writes pages of its own instead of
/// taking a copy-on-write fault at each. A forked spare starts with most of its written pages
/// shared; once it has copied them, most are its own. `confined` picks spares already sealed
/// by seccomp (strict mode), which cannot open /proc any more and copy what their reaper
/// listed before forking them.
fn waiting_spares_own_their_pages(mode: Mode, confined: bool) {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let request = |code: &str| {
        let mut r = session.request(code);
        r.mode = mode;
        r
    };
    zygote::set_enabled(true);
    let warm = run_forked(&rt, request("print('warm')\n"));
    assert_eq!(warm.output, "warm\n", "{}", warm.to_json());
    let pids = servers();
    assert_eq!(pids.len(), 1, "{pids:?}");
    let spares = || -> Vec<i32> {
        children_of(pids[0])
            .into_iter()
            .flat_map(children_of)
            .filter(|p| !confined || status_field(*p, "Seccomp").as_deref() == Some("2"))
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        // (pid, (private, shared)) of every waiting spare.
        let seen: Vec<(i32, (u64, u64))> = spares()
            .into_iter()
            .filter_map(|p| Some((p, dirty_kb(p)?)))
            .collect();
        let owned =
            |(_, (private, shared)): &(i32, (u64, u64))| *private > 4096 && private > shared;
        if seen.iter().any(owned) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no waiting spare copied its pages (pid, (Private_Dirty, Shared_Dirty) kB): {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    zygote::set_enabled(false);
}

#[test]
fn a_waiting_spare_copies_its_pages_ahead_of_its_request() {
    waiting_spares_own_their_pages(Mode::Project, false);
}

#[test]
fn a_confined_strict_spare_copies_its_pages_ahead_of_its_request() {
    if let Some(why) = strict_unavailable() {
        vibeos_testkit::skip!("strict mode is unavailable on this machine: {why}");
    }
    waiting_spares_own_their_pages(Mode::Strict, true);
}

/// The first ancestor of `path` that other users cannot search (mode without `o+x`), if any:
/// a strict script reaches an interpreter there only through the reveal plan's covers.
fn closed_ancestor(path: &std::path::Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    path.ancestors().skip(1).find_map(|dir| {
        let mode = std::fs::metadata(dir).ok()?.permissions().mode();
        (mode & 0o001 == 0).then(|| dir.to_path_buf())
    })
}

/// Strict spares whose interpreter lies under a closed directory start from one mount
/// namespace per reveal plan, its covers built once, and unshare a copy of their own: each
/// script still runs its interpreter through the covers, sees its own staging dir as its disk
/// budget (a tmpfs of the configured size, writable), and no two scripts share a namespace.
#[test]
fn strict_spares_start_from_one_mount_namespace_per_plan_and_keep_their_own() {
    let python = require_python!();
    if let Some(why) = strict_unavailable() {
        vibeos_testkit::skip!("strict mode is unavailable on this machine: {why}");
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        vibeos_testkit::skip!("the mount namespace (and its covers) is made only as root");
    }
    let real = std::fs::canonicalize(&python).unwrap();
    let Some(closed) = closed_ancestor(&real) else {
        vibeos_testkit::skip!(
            "{} lies under no closed directory, so no plan covers anything",
            real.display()
        );
    };
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    const BUDGET: u64 = 48 << 20;
    let strict = |code: &str| {
        let mut r = session.request(code);
        r.mode = Mode::Strict;
        r.strict.disk_bytes = BUDGET;
        r
    };
    let code = "import json, os, sys\n\
                st = os.statvfs('.')\n\
                with open('own.txt', 'w') as f:\n    f.write('mine')\n\
                def is_open(fd):\n    try:\n        os.fstat(fd)\n        return True\n    \
                except OSError:\n        return False\n\
                rpc = os.environ.get('VIBEOS_RPC_FD')\n\
                print(json.dumps({'size': st.f_blocks * st.f_frsize, \
                'ns': os.stat('/proc/self/ns/mnt').st_ino, \
                'fds': [fd for fd in range(3, 1024) if is_open(fd) and str(fd) != rpc], \
                'own': open('own.txt').read(), 'python': sys.version_info[0]}))\n";
    zygote::set_enabled(true);
    let made_before = zygote::mount_templates_made();
    // The first call of a key is confined at its request; the template comes with the areas
    // prepared after it. Namespace inode numbers are reused once freed, so the checked calls
    // start once the template exists.
    let warm = run_forked(&rt, strict("print('warm')\n"));
    assert_eq!(warm.output, "warm\n", "{}", warm.to_json());
    eventually("the plan's template is made", || {
        zygote::mount_templates_made() > made_before
    });
    let mut namespaces = Vec::new();
    for _ in 0..6 {
        let result = run_forked(&rt, strict(code));
        assert_eq!(status(&result), "success", "{}", result.to_json());
        let seen = json_line(&result);
        assert_eq!(seen["size"], BUDGET, "not its disk budget: {seen}");
        assert_eq!(seen["own"], "mine");
        // Nothing of the confinement is left open: not the template, not the staging copy.
        assert_eq!(
            seen["fds"],
            serde_json::json!([]),
            "descriptors left: {seen}"
        );
        assert_eq!(seen["python"], 3);
        namespaces.push(seen["ns"].as_u64().unwrap());
    }
    // `serial()` turned servers off, which drops every template: this plan's is made once.
    let made = zygote::mount_templates_made() - made_before;
    assert_eq!(
        made,
        1,
        "templates made for the one plan that covers {}",
        closed.display()
    );
    // The template is a namespace descriptor this process holds; every script ran in a copy of
    // its own, neither the template nor the host's namespace.
    let inode_of =
        |link: &str| -> Option<u64> { link.strip_prefix("mnt:[")?.strip_suffix(']')?.parse().ok() };
    let templates: Vec<u64> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| inode_of(&l.to_string_lossy()))
        .collect();
    assert_eq!(
        templates.len(),
        1,
        "template descriptors held: {templates:?}"
    );
    let host = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    let host = inode_of(&host.to_string_lossy()).unwrap();
    for ns in &namespaces {
        assert!(
            *ns != host && !templates.contains(ns),
            "a script ran in the host's namespace or the template ({ns}; host {host}, template \
             {templates:?})"
        );
    }
    zygote::set_enabled(false);
}

/// A venv of `python` at `dir` (no pip: quick), and its site-packages dir.
fn venv_at(python: &std::path::Path, dir: &std::path::Path) -> (PathBuf, PathBuf) {
    let out = std::process::Command::new(python)
        .args(["-m", "venv", "--without-pip"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let bin = dir.join("bin/python");
    let site = std::process::Command::new(&bin)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .unwrap();
    let site = PathBuf::from(String::from_utf8(site.stdout).unwrap().trim());
    (bin, site)
}

/// A strict fork server runs as root. What its interpreter runs at startup must not be
/// something a strict script could have written: a `.pth` file in a venv beneath the session
/// cwd (where strict tools write), a `sitecustomize` on a PYTHONPATH entry there. The venv
/// case starts cold (confined); the PYTHONPATH case is forked, and its sitecustomize runs in
/// the confined child, as the script's uid, as at a cold start.
#[test]
fn a_strict_fork_server_runs_nothing_a_strict_script_could_plant() {
    let python = require_python!();
    if let Some(why) = strict_unavailable() {
        vibeos_testkit::skip!("strict mode is unavailable on this machine: {why}");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        vibeos_testkit::skip!("a strict fork server keeps root only when the host is root");
    }
    let _guard = serial();
    let rt = runtime();
    let witness = tempfile::tempdir().unwrap();
    let planted = |marker: &str| {
        format!(
            "import os\nopen({:?}, 'a').write('%d %d\\n' % (os.getuid(), os.getpid()))\n",
            witness.path().join(marker).display().to_string()
        )
    };
    let ran_as = |marker: &str| -> Vec<String> {
        std::fs::read_to_string(witness.path().join(marker))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    };

    // A venv in the project: its .pth ran as root in the server.
    let project = Session::new(python.clone());
    let (venv_python, site) = venv_at(&python, &project.cwd().join(".venv"));
    std::fs::write(
        site.join("zz_planted.pth"),
        planted("pth")
            .replace('\n', "; ")
            .trim_end_matches("; ")
            .to_owned()
            + "\n",
    )
    .unwrap();
    let in_tree = Session::new(venv_python);
    let mut request = project.request("print('ok')\n");
    request.python = in_tree.python.clone().into();
    request.mode = Mode::Strict;
    zygote::set_enabled(true);
    let before = zygote::forks();
    let r = run(&rt, request);
    assert_eq!(r.output, "ok\n", "{}", r.to_json());
    assert_eq!(
        zygote::forks(),
        before,
        "a venv beneath the cwd got a root fork server"
    );
    assert!(
        !ran_as("pth").iter().any(|l| l.starts_with("0 ")),
        "the planted .pth ran as root: {:?}",
        ran_as("pth")
    );

    // PYTHONPATH names the project: its sitecustomize ran as root in the server. A cold
    // strict start cannot even read it (the project is not readable to a strict script).
    let mut session = Session::new(python);
    let cwd = session.cwd();
    session
        .env
        .push(("PYTHONPATH".into(), cwd.clone().into_os_string()));
    std::fs::write(
        cwd.join("sitecustomize.py"),
        planted("sitecustomize") + "import builtins\nbuiltins.CUSTOMIZED = True\n",
    )
    .unwrap();
    let mut request = session.request("import builtins\nprint(hasattr(builtins, 'CUSTOMIZED'))\n");
    request.mode = Mode::Strict;
    let cold = run_cold(&rt, request.clone());
    assert_eq!(cold.output, "False\n", "{}", cold.to_json());
    for _ in 0..2 {
        let forked = run_forked(&rt, request.clone());
        assert_eq!(forked.output, cold.output, "{}", forked.to_json());
    }
    assert!(
        !ran_as("sitecustomize").iter().any(|l| l.starts_with("0 ")),
        "the planted sitecustomize ran as root: {:?}",
        ran_as("sitecustomize")
    );

    // The server's own dir (its cwd, HOME and TMPDIR, `''` on its sys.path) is named in the
    // bootstrap's globals, which a script reaches by walking its frames. It lay in TMPDIR, so a
    // session dir holding TMPDIR let write_file plant modules where the root server imports
    // from. Now it is in the staging area, which tools never reach, even from a session dir
    // above it.
    let server = servers().first().copied().expect("a strict server runs");
    let dir = std::fs::read_link(format!("/proc/{server}/cwd")).unwrap();
    let in_staging_area = |p: &std::path::Path| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("vibeos-staging-"))
    };
    let mut above = dir.parent().unwrap().to_path_buf();
    while in_staging_area(&above) {
        above = above.parent().unwrap().to_path_buf();
    }
    let mut request = Session::new(session.python.clone()).request(
        "import os, sys, json\nfrom vibeos_tools import write_file\n\
         f = sys._getframe()\nwhile f.f_back: f = f.f_back\n\
         d = f.f_globals.get('_empty')\n\
         print(json.dumps({'dir': d, 'write': write_file(os.path.join(d, 'planted.py'), 'x = 1')}))\n",
    );
    request.mode = Mode::Strict;
    request.cwd = Some(above.clone());
    let got = json_line(&run_forked(&rt, request));
    // Its own server (the session differs), made where the first one was.
    let dir = PathBuf::from(got["dir"].as_str().unwrap_or_else(|| panic!("{got}")));
    assert!(dir.starts_with(&above), "{got}");
    assert!(
        got["write"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("staging area")),
        "session dir {}: {got}",
        above.display()
    );
    assert!(
        !dir.join("planted.py").exists(),
        "a strict script planted a module in the fork server's dir: {got}"
    );
    zygote::set_enabled(false);
}

/// A project's `sitecustomize` runs in every warm execution, as at a cold start, not once in
/// the server; and a server stops serving once its interpreter's site dirs change (a new
/// `.pth` file, as `pip install -e` writes).
#[test]
fn warm_executions_see_site_changes_and_run_sitecustomize_each_time() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let outside = tempfile::tempdir().unwrap();
    let (venv_python, site) = venv_at(&python, &outside.path().join("venv"));
    let session = Session::new(venv_python);
    std::fs::write(
        session.cwd().join("sitecustomize.py"),
        "import builtins, os\nbuiltins.CUSTOMIZED_IN = os.getpid()\n",
    )
    .unwrap();
    let probe = "import os\nprint(CUSTOMIZED_IN == os.getpid())\n\
                 try:\n    import extramod\n    print(extramod.VALUE)\n\
                 except ImportError:\n    print('no extramod')\n";
    let first = run_forked(&rt, session.request(probe));
    assert_eq!(first.output, "True\nno extramod\n", "{}", first.to_json());
    let again = run_forked(&rt, session.request(probe));
    assert_eq!(again.output, "True\nno extramod\n", "{}", again.to_json());

    let lib = outside.path().join("lib-dir");
    std::fs::create_dir(&lib).unwrap();
    std::fs::write(lib.join("extramod.py"), "VALUE = 'extramod found'\n").unwrap();
    std::fs::write(site.join("extra.pth"), format!("{}\n", lib.display())).unwrap();
    let after = run_forked(&rt, session.request(probe));
    assert_eq!(
        after.output,
        "True\nextramod found\n",
        "{}",
        after.to_json()
    );
    zygote::set_enabled(false);
}

/// A server keeps what it learned of `sitecustomize` at its start only while the dirs it looked
/// in are unchanged: one that appears in the project dir after the server started runs in the
/// next warm execution, and one that is removed stops running, as at a cold start, with the
/// same server serving all three.
#[test]
fn a_sitecustomize_that_appears_or_goes_after_the_server_started_is_seen() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let outside = tempfile::tempdir().unwrap();
    let (venv_python, _site) = venv_at(&python, &outside.path().join("venv"));
    let session = Session::new(venv_python);
    let probe = "import builtins, sys\nprint(getattr(builtins, 'LATE', None), \
                 'sitecustomize' in sys.modules)\n";
    let before = run_forked(&rt, session.request(probe));
    assert_eq!(before.output, "None False\n", "{}", before.to_json());
    let server = servers();
    assert_eq!(server.len(), 1, "{server:?}");

    let planted = session.cwd().join("sitecustomize.py");
    std::fs::write(&planted, "import builtins\nbuiltins.LATE = 'ran'\n").unwrap();
    let with = run_forked(&rt, session.request(probe));
    assert_eq!(with.output, "ran True\n", "{}", with.to_json());

    std::fs::remove_file(&planted).unwrap();
    let gone = run_forked(&rt, session.request(probe));
    assert_eq!(gone.output, "None False\n", "{}", gone.to_json());
    // Turning servers off (for the cold run) stops them: compared before that.
    assert_eq!(servers(), server, "the same server serves every call");
    std::fs::write(&planted, "import builtins\nbuiltins.LATE = 'ran'\n").unwrap();
    let cold = run_cold(&rt, session.request(probe));
    assert_eq!(cold.output, with.output, "{}", cold.to_json());
    zygote::set_enabled(false);
}

/// A preset spare works out ahead which dirs it must find unchanged to skip the import of
/// `sitecustomize`, and its call only looks at them: one planted in the project dir while the
/// spare waits runs in that call, and one removed while the next spare waits no longer runs.
#[test]
fn a_sitecustomize_planted_or_removed_while_a_preset_spare_waits_is_seen() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let outside = tempfile::tempdir().unwrap();
    let (venv_python, _site) = venv_at(&python, &outside.path().join("venv"));
    let session = Session::new(venv_python);
    let probe = "import builtins, sys\nprint(getattr(builtins, 'LATE', None), \
                 'sitecustomize' in sys.modules)\n";
    let plain = || {
        let r = run_forked(&rt, session.request(probe));
        assert_eq!(r.output, "None False\n", "{}", r.to_json());
    };
    plain();
    assert!(until_a_preset_is_taken(plain), "no call took a preset");
    let planted = session.cwd().join("sitecustomize.py");
    let mut over_a_preset = [false, false];
    for _ in 0..10 {
        // Time for the preparer to arm and preset the next spare, which then settles.
        std::thread::sleep(Duration::from_millis(200));
        std::fs::write(&planted, "import builtins\nbuiltins.LATE = 'ran'\n").unwrap();
        let taken = zygote::presets_taken();
        let with = run_forked(&rt, session.request(probe));
        assert_eq!(with.output, "ran True\n", "{}", with.to_json());
        over_a_preset[0] |= zygote::presets_taken() > taken;

        std::thread::sleep(Duration::from_millis(200));
        std::fs::remove_file(&planted).unwrap();
        let taken = zygote::presets_taken();
        plain();
        over_a_preset[1] |= zygote::presets_taken() > taken;
        if over_a_preset == [true, true] {
            break;
        }
    }
    assert_eq!(
        over_a_preset,
        [true, true],
        "no call took a spare preset before the file was planted and before it was removed"
    );
    zygote::set_enabled(false);
}

/// A call that comes after a quiet spell wakes the spare it is about to take ahead of its
/// request, and that spare runs it like any other; a spare woken for a call that never
/// reaches it goes back to waiting and serves a later call.
#[test]
fn a_spare_woken_ahead_runs_its_call_and_one_woken_in_vain_serves_a_later_one() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let probe = |n: u32| {
        let code = format!(
            "import os, sys\nprint({n} * 2, os.getcwd() == {cwd:?}, \
             sys.path[0] == os.path.dirname(__file__))\n",
            cwd = session.cwd().display().to_string()
        );
        let r = run_forked(&rt, session.request(&code));
        assert_eq!(
            r.output,
            format!("{} True True\n", n * 2),
            "{}",
            r.to_json()
        );
        assert_eq!(r.exit_code, Some(0), "{}", r.to_json());
    };
    probe(1);
    let mut n = 1;
    let woke = paced_until_it_grows(zygote::woken_ahead, || {
        n += 1;
        probe(n);
    });
    assert!(woke, "no call woke its spare ahead");

    // Woken with no call behind it: the spare watches its channel for a moment, then waits.
    let woken_in_vain = paced_until_it_grows(zygote::woken_ahead, zygote::wake_ahead);
    assert!(woken_in_vain, "the idle server's spare was not woken");
    std::thread::sleep(Duration::from_millis(50));
    let before = zygote::woken_ahead();
    probe(100);
    assert_eq!(
        zygote::woken_ahead(),
        before,
        "a spare is woken once, and the call took the one woken in vain"
    );
    probe(101);
    zygote::set_enabled(false);
}

/// A forked script process starts from its server's environment and is sent only the
/// differences: a variable the server started with that this execution's caller no longer
/// has is gone, a changed one has its new value, a new one is there, and the names are the
/// ones a cold start of the same request sees.
#[test]
fn a_forked_script_has_its_own_callers_environment_not_its_servers() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let probe = "import os, json\nprint(json.dumps({'probe': {k: v for k, v in os.environ.items() \
                 if k.startswith('PROBE_')}, 'names': sorted(os.environ)}))\n";
    let with_env = |vars: &[(&str, &str)]| {
        let mut request = session.request(probe);
        let env = request.base_env.get_or_insert_with(Vec::new);
        env.extend(vars.iter().map(|(k, v)| (k.into(), v.into())));
        request.env_passthrough = vec!["PROBE_A".into(), "PROBE_B".into(), "PROBE_C".into()];
        request
    };
    let first = json_line(&run_forked(
        &rt,
        with_env(&[("PROBE_A", "1"), ("PROBE_B", "b1")]),
    ));
    assert_eq!(
        first["probe"],
        serde_json::json!({"PROBE_A": "1", "PROBE_B": "b1"})
    );
    let server = servers();
    let second = json_line(&run_forked(
        &rt,
        with_env(&[("PROBE_B", "b2"), ("PROBE_C", "c")]),
    ));
    assert_eq!(
        second["probe"],
        serde_json::json!({"PROBE_B": "b2", "PROBE_C": "c"}),
        "{second}"
    );
    assert_eq!(servers(), server, "the same server serves both calls");
    let cold = json_line(&run_cold(
        &rt,
        with_env(&[("PROBE_B", "b2"), ("PROBE_C", "c")]),
    ));
    assert_eq!(
        second["names"], cold["names"],
        "forked {second} cold {cold}"
    );
    zygote::set_enabled(false);
}

/// A request larger than a script process's inbox (68 KiB; a caller's environment of 120 KiB
/// here) reaches the script whole, paced (its spare armed and woken ahead) and back to back,
/// and the calls around it are served as usual. One larger than a message the channel takes
/// (the socket's send buffer, 208 KiB by default) starts cold, with the same result.
#[test]
fn a_request_larger_than_the_inbox_reaches_the_script_whole() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let names = ["PROBE_A", "PROBE_B", "PROBE_C"];
    let probe = "import os, json\nprint(json.dumps({k: [len(v), v[-8:]] for k, v in \
                 os.environ.items() if k.startswith('PROBE_')}))\n";
    let with_vars = |size: usize| {
        let mut request = session.request(probe);
        let env = request.base_env.get_or_insert_with(Vec::new);
        for (i, name) in names.iter().enumerate() {
            if size > 0 {
                let tail = format!("{i}{size:07}");
                env.push((name.into(), format!("{}{tail}", "v".repeat(size)).into()));
            }
        }
        request.env_passthrough = names.iter().map(|n| n.to_string()).collect();
        request
    };
    for (gap_ms, size) in [
        (0, 0),
        (250, 40 << 10),
        (0, 40 << 10),
        (250, 0),
        (250, 30 << 10),
        (0, 100 << 10),
        (250, 20),
    ] {
        std::thread::sleep(Duration::from_millis(gap_ms));
        let request = with_vars(size);
        let r = json_line(&if size < 60 << 10 {
            run_forked(&rt, request)
        } else {
            run(&rt, request)
        });
        let expected: serde_json::Map<String, Value> = if size == 0 {
            serde_json::Map::new()
        } else {
            names
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    (
                        n.to_string(),
                        serde_json::json!([size + 8, format!("{i}{size:07}")]),
                    )
                })
                .collect()
        };
        assert_eq!(r, Value::Object(expected), "{size} bytes a variable");
    }
    zygote::set_enabled(false);
}

/// A call that comes once the previous one has been over for a while finds its spare armed:
/// the reaper already holds its part (lifeline, status pipe, kill grace, staging dir), and the
/// call sends the script process its request only, and the result is the same as a call that
/// arms its spare itself.
#[test]
fn a_paced_call_finds_its_reaper_armed_ahead() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let first = run_forked(&rt, session.request("print('first')\n"));
    assert_eq!(first.output, "first\n", "{}", first.to_json());
    // Arming waits for the spares the first call's end asked for: try a few paced calls.
    let armed_before = zygote::armed_ahead();
    let mut armed = false;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(200));
        let r = run_forked(
            &rt,
            session.request("import sys\nprint('paced'); sys.exit(3)\n"),
        );
        assert_eq!(r.output, "paced\n", "{}", r.to_json());
        assert_eq!(r.exit_code, Some(3), "{}", r.to_json());
        if zygote::armed_ahead() > armed_before {
            armed = true;
            break;
        }
    }
    assert!(armed, "no paced call found its reaper armed");
    // An armed reaper ends a script that runs past its timeout, and what it started, as any
    // reaper does.
    let mut timed_out = false;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(200));
        let before = zygote::armed_ahead();
        let mut request = session.request(
            "import subprocess, sys, time\n\
             child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n\
             print(child.pid, flush=True)\ntime.sleep(60)\n",
        );
        request.timeout = Duration::from_millis(1000);
        request.kill_grace = Duration::from_millis(200);
        let r = run_forked(&rt, request);
        assert_eq!(status(&r), "timeout", "{}", r.to_json());
        let child: i32 = r
            .output
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .parse()
            .unwrap();
        eventually("the timed-out script's child is gone", || !alive(child));
        if zygote::armed_ahead() > before {
            timed_out = true;
            break;
        }
    }
    assert!(timed_out, "no timed-out call found its reaper armed");
    zygote::set_enabled(false);
}

/// A variable that a `.pth` line of the interpreter's site dir sets at startup is in a forked
/// script's environment, as it is in a cold one's: the script process is sent only what its
/// execution changes, not a whole environment that would drop it.
#[test]
fn what_a_pth_line_sets_at_startup_is_in_a_forked_scripts_environment() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let outside = tempfile::tempdir().unwrap();
    let (venv_python, site) = venv_at(&python, &outside.path().join("venv"));
    std::fs::write(
        site.join("sets_env.pth"),
        "import os; os.environ['PTH_SET_AT_START'] = 'yes'\n",
    )
    .unwrap();
    let session = Session::new(venv_python);
    let probe = "import os\nprint(os.environ.get('PTH_SET_AT_START'))\n";
    let cold = run_cold(&rt, session.request(probe));
    assert_eq!(cold.output, "yes\n", "{}", cold.to_json());
    let forked = run_forked(&rt, session.request(probe));
    assert_eq!(forked.output, cold.output, "{}", forked.to_json());
    zygote::set_enabled(false);
}

/// The fork server and its waiting spares work for calls yet to come, below the calls under
/// way (`SCHED_BATCH`, docs/warm-pool.md, "Background work off the call's path"); a script
/// runs at its host's policy and nice value, as a cold one inherits them, in project and in
/// strict mode (where it has dropped to another uid by then).
#[test]
fn a_forked_script_runs_at_its_hosts_priority_while_its_server_stays_below() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    // SAFETY: pid 0 is the calling thread; the calls only read its scheduling.
    let host = unsafe {
        (
            libc::sched_getscheduler(0),
            libc::getpriority(libc::PRIO_PROCESS, 0),
        )
    };
    assert_eq!(
        host.0,
        libc::SCHED_OTHER,
        "the test runs at the default policy"
    );
    let probe = "import os\nprint(os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))\n";
    let expected = format!("{} {}\n", host.0, host.1);
    let mut modes = vec![Mode::Project];
    if strict_unavailable().is_none() {
        modes.push(Mode::Strict);
    }
    for mode in modes {
        let mut request = session.request(probe);
        request.mode = mode;
        // Twice: the second script process is forked by a reaper handed back after the first.
        for _ in 0..2 {
            let forked = run_forked(&rt, request.clone());
            assert_eq!(forked.output, expected, "{mode:?}: {}", forked.to_json());
        }
    }
    let pids = servers();
    assert!(!pids.is_empty(), "no fork server");
    for pid in pids {
        // SAFETY: sched_getscheduler only reads the scheduling policy of `pid`.
        let policy = unsafe { libc::sched_getscheduler(pid) };
        assert_eq!(policy, libc::SCHED_BATCH, "fork server {pid}");
    }
    zygote::set_enabled(false);
}

/// Makes paced calls (`call` runs one and checks its result) until one took a preset spare;
/// false if none of twenty did (arming ahead waits for the spares a call's end asked for).
fn until_a_preset_is_taken(call: impl FnMut()) -> bool {
    paced_until_it_grows(zygote::presets_taken, call)
}

/// Runs `step` 200 ms apart (quieter than the servers must be for a call to wake a spare
/// ahead) until `count` grows; false if it did not in twenty steps.
fn paced_until_it_grows(count: fn() -> u64, mut step: impl FnMut()) -> bool {
    let before = count();
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(200));
        step();
        if count() > before {
            return true;
        }
    }
    false
}

/// A spare armed ahead is also preset with the request a call like the last one makes, and
/// settles into it while it waits; a call whose request is that one sends only "go". One
/// whose environment or working dir changed since gets its own, with nothing of the preset
/// left: every variable, `sys.path` entry and the working dir are the call's.
#[test]
fn a_preset_spare_runs_its_calls_own_request_whatever_changed_since() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let probe = "import os, sys, json\n\
                 print(json.dumps({'cwd': os.getcwd(), 'mark': os.environ.get('XDG_PRESET_MARK'), \
                 'path0': sys.path[0] == os.path.dirname(__file__), \
                 'stale': [p for p in sys.path if 'vibeos-exec-' in p and p != sys.path[0]], \
                 'tmp': os.environ.get('TMPDIR') == os.path.dirname(__file__) or None}))\n";
    let with_env = |mark: Option<&str>, cwd: &std::path::Path| {
        let mut r = session.request(probe);
        r.cwd = Some(cwd.to_path_buf());
        if let Some(base) = r.base_env.as_mut() {
            base.retain(|(k, _)| k != "XDG_PRESET_MARK");
            if let Some(m) = mark {
                base.push(("XDG_PRESET_MARK".into(), m.into()));
            }
        }
        r
    };
    let here = session.cwd();
    let other = tempfile::tempdir().unwrap();
    let other_dir = std::fs::canonicalize(other.path()).unwrap();
    let first = json_line(&run_forked(&rt, with_env(Some("one"), &here)));
    assert_eq!(first["mark"], "one", "{first}");
    // Paced calls like the first: one of them finds its spare preset.
    let taken = until_a_preset_is_taken(|| {
        let r = json_line(&run_forked(&rt, with_env(Some("one"), &here)));
        assert_eq!(r["mark"], "one", "{r}");
        assert_eq!(r["path0"], true, "{r}");
        assert_eq!(r["stale"], serde_json::json!([]), "{r}");
    });
    assert!(taken, "no paced call took a preset spare");
    // Each next spare is preset like the call before it when that call's environment is the
    // server's own ("one"): the calls after such a call, whose variable differs (removed,
    // changed), get exactly their own, through the undo.
    let armed_before = zygote::armed_ahead();
    for mark in [
        None,
        Some("one"),
        Some("two"),
        Some("one"),
        None,
        Some("one"),
        Some("three"),
    ] {
        std::thread::sleep(Duration::from_millis(250));
        let r = json_line(&run_forked(&rt, with_env(mark, &here)));
        assert_eq!(r["mark"], mark.map_or(Value::Null, Value::from), "{r}");
        assert_eq!(r["cwd"], here.to_string_lossy().as_ref(), "{r}");
        assert_eq!(r["path0"], true, "{r}");
        assert_eq!(r["stale"], serde_json::json!([]), "{r}");
    }
    assert!(
        zygote::armed_ahead() > armed_before,
        "no changed call found its spare armed (and preset) ahead"
    );
    // A caller's environment other than the server's own is never preset: the next call's
    // process, which the preset would have been undone in, holds nothing of it, not even in
    // freed memory (the script reads all of its own).
    let secret = format!("leak{:08x}", std::process::id() ^ 0x5eed_f00d);
    let scan = "import re, json\n\
                found = 0\n\
                pattern = re.compile(rb'leak[0-9a-f]{8}')\n\
                with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:\n\
                \x20   for line in maps:\n\
                \x20       f = line.split()\n\
                \x20       if 'r' not in f[1] or (len(f) > 5 and f[5] in ('[vvar]', '[vsyscall]', '[vvar_vclock]')):\n\
                \x20           continue\n\
                \x20       start, end = (int(x, 16) for x in f[0].split('-'))\n\
                \x20       try:\n\
                \x20           mem.seek(start)\n\
                \x20           found += len(pattern.findall(mem.read(end - start)))\n\
                \x20       except (OSError, ValueError, OverflowError):\n\
                \x20           pass\n\
                print(json.dumps({'found': found}))\n";
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(250));
        let a = run_forked(&rt, with_env(Some(&secret), &here));
        assert_eq!(a.exit_code, Some(0), "{}", a.to_json());
        // The areas prepared after it are taken by the calls that follow, oldest first.
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(250));
            let mut b = with_env(Some("one"), &here);
            b.code = scan.to_string();
            let b = json_line(&run_forked(&rt, b));
            assert_eq!(
                b["found"], 0,
                "another caller's value reached this process: {b}"
            );
        }
    }
    // Another session dir is another server's: nothing of this one's presets.
    let moved = json_line(&run_forked(&rt, with_env(Some("two"), &other_dir)));
    assert_eq!(moved["mark"], "two", "{moved}");
    assert_eq!(
        moved["cwd"],
        other_dir.to_string_lossy().as_ref(),
        "{moved}"
    );
    // A script that comes along with "go" still has its file: a traceback quotes its line. One
    // too large to come along is read from the file.
    for padding in [0usize, 100 << 10] {
        let code = format!(
            "# {}\nimport sys\nprint(len(open(__file__).read()) > {padding})\nraise ValueError('from the preset')\n",
            "x".repeat(padding)
        );
        let taken = until_a_preset_is_taken(|| {
            let mut request = with_env(Some("one"), &here);
            request.code = code.clone();
            let r = run_forked(&rt, request);
            assert_eq!(r.output.lines().next(), Some("True"), "{}", r.to_json());
            let text = r.to_json().to_string();
            assert!(
                text.contains("raise ValueError('from the preset')")
                    && text.contains("ValueError: from the preset"),
                "{text}"
            );
        });
        assert!(
            taken,
            "no paced call of {padding} bytes of padding took a preset spare"
        );
    }
    // Strict mode: the preset comes after the confinement, with the RPC end's variable.
    if strict_unavailable().is_none() {
        let tool_call = "from vibeos_tools import write_file\nimport os\n\
                         print(write_file('preset.txt', 'x').get('bytes_written'), \
                         os.getcwd() == os.path.dirname(__file__))\n";
        let strict = || {
            let mut r = session.request(tool_call);
            r.mode = Mode::Strict;
            r
        };
        let taken = until_a_preset_is_taken(|| {
            let r = run_forked(&rt, strict());
            assert_eq!(r.output, "1 True\n", "{}", r.to_json());
        });
        assert!(taken, "no paced strict call took a preset spare");
    }
    zygote::set_enabled(false);
}

/// A variable the host stops passing (a passthrough secret, dropped) is gone from the later
/// forked executions of the same server, as from a cold one: the server started with it, and
/// the environment a process is exec'd with stays in its memory, which every fork copied (stop
/// 58's probe read it back, in strict mode too, after `clear_skill_env`).
#[test]
fn a_variable_the_host_drops_is_gone_from_later_forked_executions() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let code = fixture("zygote/initial_env_block.py");
    let request = |passed: bool, mode: Mode| {
        let mut r = session.request(&code);
        r.mode = mode;
        let mut env = r.base_env.take().unwrap_or_default();
        env.push(("PROBE_DROPPED_TOKEN".into(), "s3cr3t-value".into()));
        r.base_env = Some(env);
        if passed {
            r.env_passthrough.push("PROBE_DROPPED_TOKEN".into());
        }
        r
    };
    let mut modes = vec![Mode::Project];
    match strict_unavailable() {
        None => modes.push(Mode::Strict),
        Some(why) => eprintln!("strict half not run: strict mode is unavailable here: {why}"),
    }
    for mode in modes {
        zygote::set_enabled(false);
        let first = json_line(&run_forked(&rt, request(true, mode)));
        assert_eq!(first["environ"], true, "{mode:?}: passed through: {first}");
        for _ in 0..3 {
            let later = json_line(&run_forked(&rt, request(false, mode)));
            assert_eq!(later["environ"], false, "{mode:?}: {later}");
            assert_eq!(
                later["initial"], false,
                "{mode:?}: the dropped variable is in a later script's memory: {later}"
            );
        }
        if mode == Mode::Project {
            // Nor anywhere else in a later script's memory: the spare armed after a call that
            // passed it is preset with it (settled into that call's environment ahead of the
            // next call), and undoing that left the value in freed memory.
            let _ = run_forked(&rt, request(true, mode));
            let mut scan = request(false, mode);
            scan.code = format!(
                "PARAMS = {}\n{}",
                serde_json::json!({ "halves": [["s3cr3t", "-value"]] }),
                fixture("zygote/scan_own_memory.py")
            );
            let scan = run_forked(&rt, scan);
            assert_eq!(scan.output.trim(), "COPIES 0", "{}", scan.to_json());
        }
    }
    zygote::set_enabled(false);
}
