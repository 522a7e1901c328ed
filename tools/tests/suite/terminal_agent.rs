//! The agent's side of `terminal`: background processes managed with the `process` tool, PTY
//! mode, and the refusals scripts get — all through the registry, as the agent calls them.

// A test harness: a panic here is how a failed expectation is reported.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{json, Value};
use std::time::Duration;
use vibeos_tools::{registry, CallOrigin, ToolContext};

fn call(name: &str, args: Value, ctx: &ToolContext) -> Value {
    serde_json::from_str(&registry().handle_function_call(name, &args, ctx)).unwrap()
}

#[test]
fn background_process_lifecycle_and_pty() {
    let _process_state = super::process_state_lock();
    let dir = tempfile::tempdir().unwrap();
    let ctx = ToolContext::agent(dir.path());
    let started = call(
        "terminal",
        json!({"command": "echo ready; read x; echo got:$x; sleep 60", "background": true, "pty": true}),
        &ctx,
    );
    assert_eq!(started["status"], "running", "{started}");
    let id = started["process_id"].as_str().unwrap().to_string();
    std::thread::sleep(Duration::from_millis(300));
    let listed = call("process", json!({"action": "list"}), &ctx);
    let entry = listed["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["process_id"] == id.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("not listed: {listed}"));
    // The command as given, not the shell-session wrapper it runs in.
    assert_eq!(
        entry["command"], "echo ready; read x; echo got:$x; sleep 60",
        "{entry}"
    );
    let polled = call("process", json!({"action": "poll", "process_id": id}), &ctx);
    assert!(
        polled["output"].as_str().unwrap().contains("ready"),
        "{polled}"
    );
    call(
        "process",
        json!({"action": "write", "process_id": id, "data": "hi\n"}),
        &ctx,
    );
    std::thread::sleep(Duration::from_millis(300));
    let polled = call("process", json!({"action": "poll", "process_id": id}), &ctx);
    assert!(
        polled["output"].as_str().unwrap().contains("got:hi"),
        "{polled}"
    );
    assert_eq!(polled["status"], "running");
    let killed = call("process", json!({"action": "kill", "process_id": id}), &ctx);
    assert_eq!(killed["killed"], true);
    let gone = call("process", json!({"action": "poll", "process_id": id}), &ctx);
    assert!(gone["error"]
        .as_str()
        .unwrap()
        .contains("no background process"));

    // A background command that finishes on its own reports its exit code.
    let quick = call(
        "terminal",
        json!({"command": "echo done; exit 4", "background": true}),
        &ctx,
    );
    let id = quick["process_id"].as_str().unwrap();
    let waited = call(
        "process",
        json!({"action": "wait", "process_id": id, "timeout": 10}),
        &ctx,
    );
    assert_eq!(waited["exit_code"], 4, "{waited}");
    assert_eq!(waited["output"], "done\n");

    // Foreground PTY.
    let tty = call(
        "terminal",
        json!({"command": "test -t 0 && echo interactive", "pty": true}),
        &ctx,
    );
    assert_eq!(tty["output"], "interactive\n");

    // Scripts may not use either.
    let mut script = ctx.clone();
    script.origin = CallOrigin::Script;
    script.env = Some(std::sync::Arc::new(vec![(
        "PATH".into(),
        "/usr/bin:/bin".into(),
    )]));
    let refused = call(
        "terminal",
        json!({"command": "sleep 1", "background": true}),
        &script,
    );
    assert!(refused["error"]
        .as_str()
        .unwrap()
        .contains("not available to execute_code scripts"));
    let env = call("terminal", json!({"command": "env"}), &script);
    // Only the given env plus what bash itself sets, and the execution's scope marker (by
    // which the execution's end finds what the command left running).
    let mut marked = false;
    for line in env["output"].as_str().unwrap().lines() {
        let name = line.split('=').next().unwrap();
        marked |= name == vibeos_tools::environments::local::SCOPE_VAR;
        assert!(
            [
                "PATH",
                "PWD",
                "SHLVL",
                "_",
                "OLDPWD",
                "VIBEOS_EXECUTION_SCOPE"
            ]
            .contains(&name),
            "leaked {line}"
        );
    }
    assert!(marked, "a script's command carries no scope marker");
}

#[test]
fn a_command_started_meanwhile_does_not_hold_another_commands_output() {
    let _process_state = super::process_state_lock();
    // Long commands start on other threads while short ones run: none may inherit a short
    // command's output pipe (it would then look like the short command left a process behind
    // and cost it the drain wait).
    let dir = tempfile::tempdir().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let starters: Vec<_> = (0..2)
        .map(|n| {
            let (dir, stop) = (dir.path().to_path_buf(), stop.clone());
            std::thread::spawn(move || {
                let ctx = ToolContext {
                    task_id: Some(format!("long-{n}")),
                    ..ToolContext::agent(&dir)
                };
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    call(
                        "terminal",
                        json!({"command": "sleep 0.3", "timeout": 10}),
                        &ctx,
                    );
                }
            })
        })
        .collect();
    let ctx = ToolContext {
        task_id: Some("short".into()),
        ..ToolContext::agent(dir.path())
    };
    let mut held = Vec::new();
    for _ in 0..40 {
        let r = call("terminal", json!({"command": "echo quick"}), &ctx);
        if r["output"]
            .as_str()
            .unwrap_or_default()
            .contains("still holds")
        {
            held.push(r);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for s in starters {
        s.join().unwrap();
    }
    assert!(
        held.is_empty(),
        "{} of 40 calls waited on a leaked pipe: {:?}",
        held.len(),
        held.first()
    );
}

/// Set in the child process of the test below: the dir to use as its TMPDIR.
const SESSION_EXIT_CHILD: &str = "VIBEOS_TEST_SESSION_EXIT_CHILD";

#[test]
fn shell_session_dirs_go_with_a_host_that_never_clears_them() {
    let test = vibeos_testkit::current_test();
    if std::env::var_os(SESSION_EXIT_CHILD).is_some() {
        // The child: an embedder that runs terminal commands and simply exits.
        let dir = tempfile::tempdir_in(std::env::var_os(SESSION_EXIT_CHILD).unwrap()).unwrap();
        let ctx = ToolContext::agent(dir.path());
        let r = call(
            "terminal",
            json!({"command": "export SESSION_SECRET=for-the-next-call; echo ran"}),
            &ctx,
        );
        assert!(r["output"].as_str().unwrap().contains("ran"), "{r}");
        let kept = std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("vibeos-shell-"))
            .count();
        assert_eq!(kept, 1, "the session keeps its state while the host runs");
        return;
    }
    let host_tmp = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test.as_str(), "--exact", "--test-threads=1"])
        .env(SESSION_EXIT_CHILD, host_tmp.path())
        .env("TMPDIR", host_tmp.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("test {test} ... ok")),
        "the child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left: Vec<_> = std::fs::read_dir(host_tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("vibeos-shell-"))
        .collect();
    assert!(left.is_empty(), "left in TMPDIR at exit: {left:?}");
}
