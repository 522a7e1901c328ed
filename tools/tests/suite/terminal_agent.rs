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

/// A context of task `task` (`None`: the default task) in `dir`.
fn task_ctx(task: Option<&str>, dir: &std::path::Path) -> ToolContext {
    ToolContext {
        task_id: task.map(str::to_string),
        ..ToolContext::agent(dir)
    }
}

/// Whether the listing of `ctx`'s task holds `id`.
fn lists(ctx: &ToolContext, id: &str) -> bool {
    let listed = call("process", json!({"action": "list"}), ctx);
    listed["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("no list: {listed}"))
        .iter()
        .any(|p| p["process_id"] == id)
}

#[test]
fn a_task_sees_and_manages_only_its_own_background_processes() {
    // The probe's finding: one process-wide registry, so task (or MCP connection) bob listed,
    // read, wrote to and killed alice's processes.
    let _process_state = super::process_state_lock();
    let dir = tempfile::tempdir().unwrap();
    let alice = task_ctx(Some("alice"), dir.path());
    let bob = task_ctx(Some("bob"), dir.path());
    let default = task_ctx(None, dir.path());
    let started = call(
        "terminal",
        json!({"command": "echo alice-secret-output; exec sleep 60", "background": true, "pty": true}),
        &alice,
    );
    let id = started["process_id"].as_str().unwrap().to_string();
    // Its output is there to be leaked before anyone else asks.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let log = call(
            "process",
            json!({"action": "log", "process_id": id}),
            &alice,
        );
        if log["output"]
            .as_str()
            .unwrap()
            .contains("alice-secret-output")
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(lists(&alice, &id));
    assert!(!lists(&bob, &id), "bob lists alice's process");
    assert!(
        !lists(&default, &id),
        "the default task lists alice's process"
    );
    for (action, extra) in [
        ("poll", json!({})),
        ("log", json!({})),
        ("wait", json!({"timeout": 0})),
        ("write", json!({"data": "input\n"})),
        ("kill", json!({})),
    ] {
        let mut args = json!({"action": action, "process_id": id});
        args.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        for (who, ctx) in [("bob", &bob), ("default", &default)] {
            let r = call("process", args.clone(), ctx);
            let err = r["error"]
                .as_str()
                .unwrap_or_else(|| panic!("{who} {action}: {r}"));
            // The same error as an id that never existed (and as the remote backends give).
            assert!(
                err.contains("UnknownProcess")
                    && err.contains(&format!("no background process `{id}`")),
                "{who} {action}: {r}"
            );
            assert!(
                !r.to_string().contains("alice-secret-output"),
                "{who} {action}: {r}"
            );
        }
    }
    // Alice's process was not touched, and she still manages it.
    let log = call(
        "process",
        json!({"action": "log", "process_id": id}),
        &alice,
    );
    assert_eq!(log["status"], "running", "{log}");
    assert!(
        log["output"]
            .as_str()
            .unwrap()
            .contains("alice-secret-output"),
        "{log}"
    );
    // The default task's own processes are its own, too.
    let mine = call(
        "terminal",
        json!({"command": "exec sleep 60", "background": true}),
        &default,
    );
    let mine = mine["process_id"].as_str().unwrap().to_string();
    assert!(lists(&default, &mine) && !lists(&alice, &mine));
    for (ctx, id) in [(&alice, &id), (&default, &mine)] {
        let k = call("process", json!({"action": "kill", "process_id": id}), ctx);
        assert_eq!(k["killed"], true, "{k}");
    }
}

#[test]
fn log_reports_what_scrolled_out_of_the_buffer() {
    // `log` returns the buffered output from its start: what the 1 MiB ring dropped before it
    // is lost, and `log` said 0 (only `poll` counted it).
    let _process_state = super::process_state_lock();
    let dir = tempfile::tempdir().unwrap();
    let ctx = ToolContext::agent(dir.path());
    let total: u64 = 1_500_000;
    let started = call(
        "terminal",
        json!({"command": format!("head -c {total} /dev/zero | tr '\\0' a"), "background": true}),
        &ctx,
    );
    let id = started["process_id"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let log = loop {
        let log = call("process", json!({"action": "log", "process_id": id}), &ctx);
        if log["status"] == "exited" && log["total_bytes"] == total {
            break log;
        }
        assert!(std::time::Instant::now() < deadline, "{}", log["status"]);
        std::thread::sleep(Duration::from_millis(50));
    };
    // The ring keeps 1 MiB; one result hands the model 50 KB of it (its first 40% and last
    // 60%), as a foreground command's output is cut (it handed the whole MiB over).
    let kept: u64 = 1024 * 1024;
    let output = log["output"].as_str().unwrap();
    assert_eq!(log["truncated"], true, "{}", output.len());
    assert!(output.len() < 52 * 1024, "{}", output.len());
    assert!(
        output.contains(&format!(
            "[output truncated: {} of {kept} bytes omitted]",
            kept - 50 * 1024
        )),
        "{}",
        &output[20_000..21_000]
    );
    assert_eq!(
        log["lost_bytes"],
        total - kept,
        "lost {}",
        log["lost_bytes"]
    );
    // The same after a poll moved the read position to the end.
    let polled = call("process", json!({"action": "poll", "process_id": id}), &ctx);
    assert_eq!(polled["output"], "");
    assert_eq!(polled["truncated"], false);
    let again = call("process", json!({"action": "log", "process_id": id}), &ctx);
    assert_eq!(again["lost_bytes"], total - kept);
    call("process", json!({"action": "kill", "process_id": id}), &ctx);
}

#[test]
fn writing_to_a_pty_process_that_has_exited_is_an_error() {
    // It answered {"bytes_written": 5}: the terminal took the bytes, and nobody would read them.
    let _process_state = super::process_state_lock();
    let dir = tempfile::tempdir().unwrap();
    let ctx = ToolContext::agent(dir.path());
    let started = call(
        "terminal",
        json!({"command": "echo bye; exit 3", "background": true, "pty": true}),
        &ctx,
    );
    let id = started["process_id"].as_str().unwrap().to_string();
    let done = call(
        "process",
        json!({"action": "wait", "process_id": id, "timeout": 20}),
        &ctx,
    );
    assert_eq!(done["exit_code"], 3, "{done}");
    let w = call(
        "process",
        json!({"action": "write", "process_id": id, "data": "hello"}),
        &ctx,
    );
    let err = w["error"].as_str().unwrap_or_else(|| panic!("{w}"));
    assert!(
        err.contains("WriteError") && err.contains(&format!("{id} has exited (exit code 3)")),
        "{w}"
    );
    call("process", json!({"action": "kill", "process_id": id}), &ctx);
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

/// Set in the child processes of the test below: how the child ends (`exit` or `killed`) and
/// the tag of its commands.
const BACKGROUND_EXIT_CHILD: &str = "VIBEOS_TEST_BACKGROUND_EXIT_CHILD";

/// Live processes whose argv, joined by spaces, is `argv`.
fn running(argv: &str) -> Vec<i32> {
    vibeos_testkit::processes_where(|dir| {
        std::fs::read(dir.join("cmdline")).is_ok_and(|c| {
            String::from_utf8_lossy(&c)
                .trim_end_matches('\0')
                .replace('\0', " ")
                == argv
        })
    })
}

/// Commands tagged `tag`: in the shell's group, in a session of their own, and under nohup.
fn tagged_background(tag: &str) -> String {
    format!(
        "sleep {tag}1 & setsid sleep {tag}2 & nohup sleep {tag}3 >/dev/null 2>&1 & exec sleep {tag}4"
    )
}

#[test]
fn background_processes_end_with_the_host() {
    // The probe's finding: terminal(background=true) processes outlived the host (the Python
    // interpreter's exit, `serve` stopped), re-parented to init and running for ever. A host
    // that exits normally ends them (its exit hook), and so does one killed with SIGKILL (the
    // keeper), with what they started outside their group.
    let test = vibeos_testkit::current_test();
    if let Some(how) = std::env::var_os(BACKGROUND_EXIT_CHILD) {
        // The child: a host (here the test binary) with background commands running.
        let how = how.to_string_lossy().into_owned();
        let (how, tag) = how.split_once(':').unwrap();
        let dir = tempfile::tempdir().unwrap();
        let r = call(
            "terminal",
            json!({"command": tagged_background(tag), "background": true}),
            &ToolContext::agent(dir.path()),
        );
        assert_eq!(r["status"], "running", "{r}");
        report_children_running(how, tag);
        return;
    }
    assert_leftovers_end_with_their_host(&test, BACKGROUND_EXIT_CHILD, 7);
}

/// Set in the child processes of the test below: how the child ends (`exit` or `killed`) and
/// the tag of its commands.
const DIRECT_EXIT_CHILD: &str = "VIBEOS_TEST_DIRECT_EXIT_CHILD";

#[test]
fn what_direct_foreground_calls_leave_running_ends_with_the_host() {
    // The probe's finding: a direct (agent or host) call's `sleep 1047 >/dev/null 2>&1 &`
    // (also `setsid …&`, and `nohup`/`setsid` under pty=true) outlived the host, while
    // background=true processes and scripts' commands ended with it.
    let test = vibeos_testkit::current_test();
    if let Some(how) = std::env::var_os(DIRECT_EXIT_CHILD) {
        let how = how.to_string_lossy().into_owned();
        let (how, tag) = how.split_once(':').unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ctx = ToolContext::agent(dir.path());
        let r = call(
            "terminal",
            json!({"command": format!(
                "sleep {tag}1 >/dev/null 2>&1 & setsid sleep {tag}2 >/dev/null 2>&1 & echo ok"
            )}),
            &ctx,
        );
        assert_eq!(r["output"], "ok\n", "{r}");
        assert_eq!(r["timed_out"], false, "{r}");
        // The pause: a child that has not yet left the session when its shell (the session's
        // leader) exits is sent SIGHUP by the PTY's hang-up.
        let r = call(
            "terminal",
            json!({"command": format!(
                "nohup sleep {tag}3 >/dev/null 2>&1 & setsid sleep {tag}4 >/dev/null 2>&1 & sleep 1; echo ok"
            ), "pty": true}),
            &ctx,
        );
        // (A `setsid` child may keep the PTY as its stdin: the call then returns with a note.)
        assert!(r["output"].as_str().unwrap().starts_with("ok\n"), "{r}");
        report_children_running(how, tag);
        return;
    }
    assert_leftovers_end_with_their_host(&test, DIRECT_EXIT_CHILD, 5);
}

#[test]
fn error_line_numbers_count_the_commands_own_lines() {
    // The probe's finding: `terminal("5")` said `/bin/bash: line 8: 5: command not found`:
    // the shell-session wrapper put 7 lines before the command.
    let dir = tempfile::tempdir().unwrap();
    let ctx = ToolContext::agent(dir.path());
    let out = |command: &str, ctx: &ToolContext| -> String {
        let r = call("terminal", json!({ "command": command }), ctx);
        r["output"].as_str().unwrap_or_default().to_string()
    };
    assert!(
        out("5", &ctx).contains("line 1: 5: command not found"),
        "{}",
        out("5", &ctx)
    );
    let two = out("true\n6", &ctx);
    assert!(two.contains("line 2: 6: command not found"), "{two}");
    assert_eq!(out("echo $LINENO\necho $LINENO", &ctx), "1\n2\n");
    // With a one-off workdir (no saved dir to restore) too, and the session still works.
    let r = call(
        "terminal",
        json!({"command": "7", "workdir": dir.path().display().to_string()}),
        &ctx,
    );
    assert!(r["output"].as_str().unwrap().contains("line 1: 7"), "{r}");
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    assert_eq!(out("cd sub; export KEPT=yes", &ctx), "");
    assert_eq!(out("echo $KEPT ${PWD##*/}", &ctx), "yes sub\n");
}

#[test]
fn a_session_whose_directory_is_gone_says_where_the_command_runs() {
    // The probe's finding: the next command ran in the base dir without a word, so a relative
    // `rm` or `mv` acted somewhere the agent did not expect.
    let dir = tempfile::tempdir().unwrap();
    let ctx = task_ctx(Some("gone-dir"), dir.path());
    let out = |command: &str| -> String {
        let r = call("terminal", json!({ "command": command }), &ctx);
        r["output"].as_str().unwrap_or_default().to_string()
    };
    let sub = dir.path().join("dd");
    std::fs::create_dir(&sub).unwrap();
    assert_eq!(out("cd dd && pwd"), format!("{}\n", sub.display()));
    std::fs::remove_dir(&sub).unwrap();
    let said = out("echo ran in ${PWD}");
    assert!(
        said.contains(&format!(
            "[terminal: the session directory {} is gone; this command runs in {}]",
            sub.display(),
            dir.path().display()
        )) && said.contains(&format!("ran in {}", dir.path().display())),
        "{said}"
    );
    // The session moved on: the next command says nothing more.
    assert_eq!(out("pwd"), format!("{}\n", dir.path().display()));
}

#[test]
fn a_scripts_note_about_a_background_process_does_not_offer_what_scripts_cannot_use() {
    // The probe's finding: `terminal("sleep 5 &")` from a script returned "use background=true
    // for long-running processes", which scripts cannot pass.
    let dir = tempfile::tempdir().unwrap();
    let mut script = ToolContext::agent(dir.path());
    script.origin = CallOrigin::Script;
    script.env = Some(std::sync::Arc::new(
        std::env::vars().filter(|(k, _)| k == "PATH").collect(),
    ));
    let r = call(
        "terminal",
        json!({"command": "sleep 30 & echo started"}),
        &script,
    );
    // What the command left ends with its execution, as the supervisor ends it.
    vibeos_tools::environments::local::kill_scope(&script);
    let out = r["output"].as_str().unwrap();
    assert!(out.starts_with("started\n"), "{r}");
    assert!(out.contains("runs on until this execution ends"), "{r}");
    assert!(!out.contains("background=true"), "{r}");
    // The agent can use the option, and is told so.
    let agent = ToolContext::agent(dir.path());
    let r = call(
        "terminal",
        json!({"command": "sleep 30 & echo $! >pid; echo started"}),
        &agent,
    );
    let pid: i32 = std::fs::read_to_string(dir.path().join("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: kill has no memory preconditions; the pid is the sleep this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(
        r["output"]
            .as_str()
            .unwrap()
            .contains("use background=true"),
        "{r}"
    );
}

#[test]
fn a_command_of_200000_bytes_runs() {
    // The probe's finding: commands over ~128 KiB failed with `SpawnError: could not start the
    // shell: Argument list too long (os error 7)`: the command travelled in argv.
    let dir = tempfile::tempdir().unwrap();
    let ctx = ToolContext::agent(dir.path());
    let command = format!(": {}; echo done", "x".repeat(200_000 - 13));
    assert_eq!(command.len(), 200_000);
    let r = call("terminal", json!({ "command": command }), &ctx);
    assert_eq!(r["output"], "done\n", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    // And in a script's session (the wrapper around it differs) the session still works.
    let mut script = ToolContext::agent(dir.path());
    script.origin = CallOrigin::Script;
    script.env = Some(std::sync::Arc::new(
        std::env::vars().filter(|(k, _)| k == "PATH").collect(),
    ));
    let command = format!(": {}; export LONG_ONE=kept", "x".repeat(200_000));
    let r = call("terminal", json!({ "command": command }), &script);
    assert_eq!(r["exit_code"], 0, "{r}");
    let r = call("terminal", json!({"command": "echo $LONG_ONE"}), &script);
    vibeos_tools::environments::local::kill_scope(&script);
    assert_eq!(r["output"], "kept\n", "{r}");
}

#[test]
fn killing_a_process_that_already_exited_says_so() {
    // The probe's finding: process(action="kill") on a process that had exited answered
    // `"killed": true, "exit_code": 0`.
    let _process_state = super::process_state_lock();
    let dir = tempfile::tempdir().unwrap();
    let ctx = task_ctx(Some("kill-exited"), dir.path());
    let started = call(
        "terminal",
        json!({"command": "echo bye; exit 4", "background": true}),
        &ctx,
    );
    let id = started["process_id"].as_str().unwrap().to_string();
    let waited = call(
        "process",
        json!({"action": "wait", "process_id": id, "timeout": 60}),
        &ctx,
    );
    assert_eq!(waited["exit_code"], 4, "{waited}");
    let r = call("process", json!({"action": "kill", "process_id": id}), &ctx);
    assert_eq!(r["killed"], false, "{r}");
    assert_eq!(r["already_exited"], true, "{r}");
    assert_eq!(r["exit_code"], 4, "{r}");
    assert!(
        r["note"].as_str().unwrap().contains("had already exited"),
        "{r}"
    );
    // A running one is killed, and says so.
    let started = call(
        "terminal",
        json!({"command": "sleep 60", "background": true}),
        &ctx,
    );
    let id = started["process_id"].as_str().unwrap().to_string();
    let r = call("process", json!({"action": "kill", "process_id": id}), &ctx);
    assert_eq!(r["killed"], true, "{r}");
    assert!(r.get("already_exited").is_none(), "{r}");
    assert!(
        r["exit_code"].as_i64().unwrap() < 0,
        "ended by a signal: {r}"
    );
}

#[test]
fn a_command_or_workdir_that_is_no_string_is_refused() {
    // The probe's finding: `command=5` ran `5`, `workdir=123` became `<cwd>/123`. Numbers
    // for numeric arguments are still read (`timeout="2"`), as for every tool.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("123")).unwrap();
    let ctx = ToolContext::agent(dir.path());
    for (args, name) in [
        (json!({"command": 5}), "command"),
        (json!({"command": true}), "command"),
        (json!({"command": "pwd", "workdir": 123}), "workdir"),
    ] {
        let r = call("terminal", args.clone(), &ctx);
        let err = r["error"].as_str().unwrap_or_else(|| panic!("{args}: {r}"));
        assert!(
            err.contains("InvalidArguments") && err.contains(&format!("`{name}` must be a string")),
            "{args}: {err}"
        );
    }
    let r = call(
        "terminal",
        json!({"command": "echo ok", "timeout": "2"}),
        &ctx,
    );
    assert_eq!(r["output"], "ok\n", "{r}");
}

/// In a child host of [`assert_leftovers_end_with_their_host`]: waits until its commands
/// `sleep {tag}1` … `sleep {tag}4` run, says so on stdout, and when it is to be `killed`
/// waits for that.
fn report_children_running(how: &str, tag: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    for n in 1..=4 {
        while running(&format!("sleep {tag}{n}")).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "sleep {tag}{n} never ran (or ended with its call)"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    println!("children-running");
    if how == "killed" {
        std::thread::sleep(Duration::from_secs(600));
    }
}

/// Runs `test` again as a child host (with `env` set to `how:tag`), which leaves `sleep
/// {tag}1` … `sleep {tag}4` running, twice: once it exits, once it is killed. Asserts that
/// none of them outlives it. `digit` starts the tags, apart from other tests' tags.
fn assert_leftovers_end_with_their_host(test: &str, env: &str, digit: u32) {
    for how in ["exit", "killed"] {
        // Unique per run: another checkout's test run may share the machine.
        let tag = format!(
            "{}{}",
            digit + (how == "killed") as u32,
            std::process::id() % 100_000 + 100_000
        );
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(env, format!("{how}:{tag}"))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            let n = std::io::BufRead::read_line(&mut out, &mut line).unwrap();
            seen.push_str(&line);
            if n == 0 || line.contains("children-running") {
                break;
            }
        }
        assert!(
            seen.contains("children-running"),
            "{how}: the child failed: {seen}"
        );
        if how == "killed" {
            child.kill().unwrap();
        }
        let status = child.wait().unwrap();
        assert_eq!(status.success(), how == "exit", "{how}: {status}");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let left = loop {
            let left: Vec<i32> = (1..=4)
                .flat_map(|n| running(&format!("sleep {tag}{n}")))
                .collect();
            if left.is_empty() || std::time::Instant::now() > deadline {
                break left;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        for pid in &left {
            // SAFETY: kill has no memory preconditions; this only cleans up after a failure.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        assert!(left.is_empty(), "{how}: outlived their host: {left:?}");
    }
}
