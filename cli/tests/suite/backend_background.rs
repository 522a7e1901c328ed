//! `terminal(background=true)` and `terminal(pty=true)` in the remote backends, against the
//! real sshd and dockerd the tests start: a background command runs over there (seen in that
//! side's /proc), the `process` tool polls, lists, writes to a PTY command and kills it (its
//! whole group, checked over there), a foreground PTY command has a terminal, and stopping the
//! environment ends what is still running in the background.
//!
//! The backend choice is process-wide, so both backends run in one test, one after the other.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::common::{backend, processes_in, ssh_backend};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use vibeos_testkit::backends::{start_sshd, unavailable, Dockerd};
use vibeos_tools::environments::{self, BackendKind, BackendSettings};
use vibeos_tools::ToolContext;

const TASK: &str = "bg-task";

fn call(name: &str, args: Value) -> Value {
    let mut ctx = ToolContext::agent("/");
    ctx.task_id = Some(TASK.into());
    let text = vibeos_tools::registry().handle_function_call(name, &args, &ctx);
    serde_json::from_str(&text).unwrap()
}

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn host_runs(cmdline: &str) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .any(|c| {
            String::from_utf8_lossy(&c)
                .trim_end_matches('\0')
                .replace('\0', " ")
                == cmdline
        })
}

/// Everything but the stop, for the active backend.
fn background_and_pty(name: &str) {
    let env = environments::active().unwrap().get(Some(TASK)).unwrap();
    assert_eq!(env.backend(), name);

    // Background: starts, runs over there, reports output through poll, is listed — with the
    // dir the shell session's last `cd` left it in (the list showed the session's first dir).
    let cd = call("terminal", json!({"command": "cd /tmp"}));
    assert_eq!(cd["exit_code"], 0, "{name}: {cd}");
    let r = call(
        "terminal",
        json!({"command": "echo started-$((6*7)); sh -c 'sleep 3031' & sleep 3030", "background": true}),
    );
    assert_eq!(r["status"], "running", "{name}: {r}");
    let id = r["process_id"].as_str().unwrap().to_string();
    eventually("the background command's output", || {
        let p = call("process", json!({"action": "poll", "process_id": id}));
        p["output"].as_str().unwrap_or("").contains("started-42")
    });
    // The output shows before `sh -c 'sleep 3031'` is forked and exec'd (under load, CI saw
    // the fork still a copy of its parent shell), so wait for both.
    eventually("both sleeps to run over there", || {
        let procs = processes_in(env.as_ref());
        procs.iter().any(|p| p == "sleep 3030") && procs.iter().any(|p| p == "sleep 3031")
    });
    let list = call("process", json!({"action": "list"}));
    assert!(
        list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["process_id"] == id.as_str()
                && p["status"] == "running"
                && p["cwd"] == "/tmp"),
        "{name}: {list}"
    );
    let _ = call("terminal", json!({"command": "cd /"}));
    // Kill reaches the whole group over there, including what the command started.
    let k = call("process", json!({"action": "kill", "process_id": id}));
    assert_eq!(k["killed"], true, "{name}: {k}");
    eventually("the killed group to be gone", || {
        let procs = processes_in(env.as_ref());
        !procs.iter().any(|p| p == "sleep 3030" || p == "sleep 3031")
    });
    let gone = call("process", json!({"action": "poll", "process_id": id}));
    assert!(
        gone["error"].is_string(),
        "{name}: forgotten after kill: {gone}"
    );

    // `log` counts what scrolled out of the 1 MiB buffer over there as it does locally.
    let r = call(
        "terminal",
        json!({"command": "head -c 1500000 /dev/zero | tr '\\0' a", "background": true}),
    );
    let id = r["process_id"].as_str().unwrap().to_string();
    let log = || call("process", json!({"action": "log", "process_id": id}));
    eventually("the flood to end", || {
        let l = log();
        l["status"] == "exited" && l["total_bytes"] == 1_500_000
    });
    let l = log();
    assert_eq!(
        l["lost_bytes"],
        1_500_000 - 1024 * 1024,
        "{name}: {}",
        l["lost_bytes"]
    );
    call("process", json!({"action": "kill", "process_id": id}));

    // A foreground PTY command has a terminal over there.
    let r = call(
        "terminal",
        json!({"command": "test -t 0 && test -t 1 && echo has-a-tty", "pty": true}),
    );
    assert!(
        r["output"].as_str().unwrap_or("").contains("has-a-tty"),
        "{name}: {r}"
    );
    assert_eq!(r["exit_code"], 0, "{name}: {r}");

    // A background PTY command reads what `process write` sends.
    let r = call(
        "terminal",
        json!({"command": "read -r line; echo got:$line", "background": true, "pty": true}),
    );
    let id = r["process_id"].as_str().unwrap().to_string();
    let w = call(
        "process",
        json!({"action": "write", "process_id": id, "data": "hello-pty\n"}),
    );
    assert_eq!(w["bytes_written"], 10, "{name}: {w}");
    let done = call(
        "process",
        json!({"action": "wait", "process_id": id, "timeout": 20}),
    );
    assert_eq!(done["waited_until_exit"], true, "{name}: {done}");
    assert!(
        done["output"]
            .as_str()
            .unwrap_or("")
            .contains("got:hello-pty"),
        "{name}: {done}"
    );

    // Left running for the environment's stop to end.
    let r = call(
        "terminal",
        json!({"command": "exec sleep 3032", "background": true}),
    );
    assert_eq!(r["status"], "running", "{name}: {r}");
    eventually("the last background command to start", || {
        processes_in(env.as_ref()).iter().any(|p| p == "sleep 3032")
    });
}

#[test]
fn background_and_pty_terminal_in_remote_backends() {
    let _ssh = super::ssh_lock();
    if super::common::in_own_process() {
        return;
    }

    // ssh: the host is this machine, so after the stop its /proc must hold none of them.
    match start_sshd() {
        Err(e) => unavailable(&e),
        Ok(sshd) => {
            environments::activate(ssh_backend(&sshd, sshd.port));
            background_and_pty("ssh");
            assert!(host_runs("sleep 3032"));
            environments::shutdown();
            eventually("the stop to end the background command", || {
                !host_runs("sleep 3032")
            });
        }
    }

    // docker
    let (daemon, cli) = match Dockerd::with_image("vibeos-py:bg") {
        Ok(d) => d,
        Err(e) => return unavailable(&e),
    };
    environments::activate(BackendSettings {
        docker_image: Some("vibeos-py:bg".into()),
        docker_binary: cli,
        ..backend(BackendKind::Docker)
    });
    background_and_pty("docker");
    environments::shutdown();
    assert!(daemon.labelled().is_empty(), "the container was removed");
}
