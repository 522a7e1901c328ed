//! execute_code and the tools inside the daytona backend, against the Daytona stand-in
//! (tests/standins/, proven faithful by the official SDK in daytona_standin.rs) whose sandboxes
//! are real containers of a private dockerd: tool calls through the relay, tools acting in the
//! sandbox, env scrubbing, the API key invisible to the script and absent from the sandbox,
//! timeout and interrupt killing the command but keeping the sandbox (checked with `ps` in the
//! container), an expired sandbox recreated once, idle stop, persistent resume by name, and
//! `backends gc` deleting what a crashed host left while keeping a live host's sandbox.
//!
//! The backend choice is process-wide, so everything runs in one test, phase by phase, in a
//! process of its own (`common::in_own_process`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::common::{
    backend, hanging_script, host_dirs_of, ignore_term_with_setsid_child, python_output,
    request_from, run, run_interrupted_after, run_into_timeout, runtime, spawn_host, HOST_ENV,
};
use std::time::{Duration, Instant};
use vibeos_supervisor::{ExecutionRequest, Status};
use vibeos_testkit::backends::unavailable;
use vibeos_testkit::daytona::{sdk_python, DaytonaLab};
use vibeos_tools::environments::{self, BackendKind, BackendSettings};

const IMAGE: &str = "vibeos-py:test";

fn settings() -> BackendSettings {
    BackendSettings {
        daytona_image: Some(IMAGE.into()),
        ..backend(BackendKind::Daytona)
    }
}

/// A request whose host environment also holds the host's own credentials for the service:
/// the supervisor uses them, no script may.
fn request(code: &str, task: &str) -> ExecutionRequest {
    let url = std::env::var("DAYTONA_API_URL").unwrap();
    let key = std::env::var("DAYTONA_API_KEY").unwrap();
    let mut env = HOST_ENV.to_vec();
    env.extend([
        ("DAYTONA_API_KEY", key.as_str()),
        ("DAYTONA_API_URL", url.as_str()),
    ]);
    request_from(code, task, &env)
}

/// Processes in every sandbox, as `ps` there lists them.
fn ps(lab: &DaytonaLab) -> String {
    lab.sandboxes()
        .iter()
        .map(|c| {
            String::from_utf8_lossy(
                &lab.dockerd
                    .docker(&["exec", c, "ps", "-eo", "pid,args"])
                    .stdout,
            )
            .into_owned()
        })
        .collect()
}

#[test]
fn daytona_backend_end_to_end() {
    if super::common::in_own_process() {
        return;
    }
    let lab = match DaytonaLab::start(IMAGE) {
        Ok(l) => l,
        Err(e) => return unavailable(&e),
    };
    let standin = &lab.standin;
    // Read by the supervisor only (this process).
    let _endpoint = standin.export();
    let rt = runtime();
    environments::activate(settings());

    // Tool calls through the relay; the tools act in the sandbox, not on this host.
    let marker = format!("/srv/vibeos-daytona-{}.txt", std::process::id());
    let code = format!(
        r#"
from vibeos_tools import write_file, read_file, terminal
import os, json
w = write_file("{marker}", "alpha\n")
assert "error" not in w, w
print("open:", open("{marker}").read().split())
print("read:", "alpha" in read_file("{marker}")["content"])
print("terminal:", terminal("cat {marker}")["output"].split())
print("rpcdir:", os.environ["VIBEOS_RPC_DIR"], os.path.exists(os.environ["VIBEOS_RPC_SOCKET"]))
print("env:", json.dumps(dict(os.environ)))
print("tenv:", terminal("env")["output"].replace("\n", " "))
secret = os.environ.get("SECRET_PROBE", "")
hits = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            if b"{key}" in open("/proc/%s/environ" % pid, "rb").read():
                hits.append(pid)
        except OSError:
            pass
print("keyhits:", hits)
"#,
        key = standin.api_key
    );
    let r = run(&rt, request(&code, "task-a"));
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.backend.as_deref(), Some("daytona"));
    assert!(r.output.contains("open: ['alpha']"), "{}", r.output);
    assert!(r.output.contains("read: True"), "{}", r.output);
    assert!(r.output.contains("terminal: ['alpha']"), "{}", r.output);
    assert!(
        r.output.contains("rpcdir: /tmp/vibeos-exec-"),
        "{}",
        r.output
    );
    assert_eq!(r.tool_calls_made, 4);
    assert!(
        !std::path::Path::new(&marker).exists(),
        "leaked to the host"
    );
    for leak in [
        "hunter2-host-secret",
        "/host/only/bin",
        standin.api_key.as_str(),
        standin.api_url.as_str(),
        "DAYTONA_",
    ] {
        assert!(
            !r.output.contains(leak),
            "{leak} reached the script: {}",
            r.output
        );
    }
    assert!(r.output.contains("keyhits: []"), "{}", r.output);
    assert!(r.output.contains("C.UTF-8"), "{}", r.output);
    assert_eq!(lab.sandboxes().len(), 1);

    // Timeout: the command dies, the sandbox stays.
    run_into_timeout(
        &rt,
        request(&hanging_script("4242"), "task-a"),
        Duration::from_secs(3),
        Duration::from_secs(30),
    );
    std::thread::sleep(Duration::from_millis(500));
    let procs = ps(&lab);
    assert!(
        !procs.contains("sleep 4242") && !procs.contains("time.sleep(600)"),
        "left behind: {procs}"
    );
    assert_eq!(lab.sandboxes().len(), 1, "the sandbox survives a timeout");

    // A script that ignores SIGTERM and started a setsid'd child: the timeout's SIGKILL used
    // to kill the bootstrap with the script (they share the relay's group), so nothing reaped
    // or swept, the child ran on under init, and the end took ~3 s more than timeout + grace.
    let started = Instant::now();
    let r = run_into_timeout(
        &rt,
        request(&ignore_term_with_setsid_child("4001"), "task-a"),
        Duration::from_secs(3),
        Duration::from_secs(30),
    );
    // timeout 3 s + grace 1 s, plus the stand-in's latency.
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "{:?}",
        started.elapsed()
    );
    assert!(!r.output.contains("stream ended"), "{r:?}");
    std::thread::sleep(Duration::from_millis(500));
    let procs = ps(&lab);
    assert!(!procs.contains("sleep 4001"), "left behind: {procs}");

    // Interrupt: the same.
    let r = run_interrupted_after(
        &rt,
        request(
            "import subprocess, time\nsubprocess.Popen(['sleep', '4343'])\ntime.sleep(600)",
            "task-a",
        ),
        Duration::from_secs(3),
    );
    assert_eq!(r.status, Status::Interrupted, "{r:?}");
    std::thread::sleep(Duration::from_millis(500));
    let procs = ps(&lab);
    assert!(!procs.contains("sleep 4343"), "left behind: {procs}");
    assert_eq!(
        lab.sandboxes().len(),
        1,
        "the sandbox survives an interrupt"
    );

    // An expired sandbox (the service deleted it behind our back) is recreated once.
    let gone = lab.sandboxes();
    let id = gone.concat().trim_start_matches("daytona-").to_string();
    python_output(
        &sdk_python().unwrap(),
        "import sys, urllib.request as u
r = u.Request(sys.argv[1], method='DELETE', headers={'Authorization': 'Bearer ' + sys.argv[2]})
print(u.urlopen(r).status)",
        &[
            &format!("{}/sandbox/{id}", standin.api_url),
            &standin.api_key,
        ],
        &[],
    );
    let r = run(&rt, request("print('back')", "task-a"));
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.output.contains("back"));
    assert_eq!(lab.sandboxes().len(), 1);
    assert_ne!(lab.sandboxes(), gone);

    // Idle stop after lifetime_seconds: the (non-persistent) sandbox is deleted.
    environments::shutdown();
    let mut idle = settings();
    idle.lifetime = Duration::from_secs(1);
    environments::activate(idle);
    let r = run(&rt, request("print('hi')", "task-idle"));
    assert_eq!(r.status, Status::Success, "{r:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !lab.sandboxes().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(lab.sandboxes().is_empty(), "idle sandbox not deleted");

    // Persistent: stopped at the end, resumed by name (same sandbox, files kept).
    environments::shutdown();
    let mut keep = settings();
    keep.container_persistent = true;
    environments::activate(keep.clone());
    let r = run(
        &rt,
        request("open('/root/kept.txt', 'w').write('kept')", "task-p"),
    );
    assert_eq!(r.status, Status::Success, "{r:?}");
    environments::shutdown();
    assert!(
        lab.sandboxes().is_empty(),
        "a persistent sandbox is stopped at exit"
    );
    environments::activate(keep.clone());
    let r = run(
        &rt,
        request("print(open('/root/kept.txt').read())", "task-p"),
    );
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.output.contains("kept"), "{r:?}");
    environments::shutdown();
    // Under settings that changed it is refused, naming them, and left as it was: resumed, it
    // ran the old image with the old resources and said nothing.
    environments::activate(BackendSettings {
        container_memory: Some(3 * 1024),
        ..keep
    });
    let r = run(&rt, request("print('ran')", "task-p"));
    assert_eq!(r.status, Status::Error, "{r:?}");
    let e = r.error.clone().unwrap_or_default();
    assert!(
        e.contains("terminal.container_memory") && e.contains("backends gc --all"),
        "{r:?}"
    );
    environments::shutdown();

    // backends gc: a sandbox that a crashed host of this machine left (its owner process is
    // gone) is deleted; a live host's and the persistent one are kept, and `--all` takes the
    // persistent one too.
    environments::activate(settings());
    let r = run(&rt, request("print('live')", "task-gc-live"));
    assert_eq!(r.status, Status::Success, "{r:?}");
    let crashed = plant_crashed_sandbox(standin);
    assert_eq!(lab.sandboxes().len(), 2);
    let home = tempfile::tempdir().unwrap();
    let gc = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vibeos-exec"))
            .args(["backends", "gc"])
            .args(args)
            .env("VIBEOS_HOME", home.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        out.stdout
    };
    let report: serde_json::Value = serde_json::from_slice(&gc(&["--json"])).unwrap();
    assert_eq!(report["removed"], serde_json::json!([crashed]), "{report}");
    let kept = &report["backends"]["daytona"]["kept"];
    assert_eq!(kept.as_array().map(Vec::len), Some(2), "{report}");
    assert_eq!(
        lab.sandboxes().len(),
        1,
        "the leftover is gone, the live one runs"
    );
    let text = String::from_utf8(gc(&["--all"])).unwrap();
    assert!(text.contains("removed daytona sandbox "), "{text}");
    assert!(text.contains("kept    daytona sandbox "), "{text}");
    let r = run(&rt, request("print('still')", "task-gc-live"));
    assert!(r.output.contains("still"), "{r:?}");
    environments::shutdown();

    // A host killed with SIGKILL mid-run leaves its relay socket dir on this host; gc removes
    // it (and the sandbox), a live host's dir stays.
    let cfg = home.path().join("config.yaml");
    std::fs::write(
        &cfg,
        format!("terminal:\n  backend: daytona\n  daytona_image: {IMAGE}\n"),
    )
    .unwrap();
    let script = home.path().join("sleep.py");
    std::fs::write(
        &script,
        "import subprocess\nsubprocess.run(['sleep', '7373'])",
    )
    .unwrap();
    let mut host = spawn_host(home.path(), &["run"], &script);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ps(&lab).contains("sleep 7373") {
        assert!(Instant::now() < deadline, "the script did not start");
        std::thread::sleep(Duration::from_millis(200));
    }
    let relay_dirs_of = |pid: u32| host_dirs_of(pid, "vibeos-relay-daytona-");
    let left = relay_dirs_of(host.id());
    assert!(!left.is_empty(), "the running host has no relay dir?");
    host.kill().unwrap();
    host.wait().unwrap();
    assert_eq!(
        relay_dirs_of(host.id()),
        left,
        "the killed host removed its dirs itself?"
    );
    // This process is a live host beside it, in the middle of an execution that gc must not
    // disturb.
    environments::activate(settings());
    let beside = std::thread::spawn(|| {
        run(
            &runtime(),
            request(
                "import time\ntime.sleep(8)\nprint('beside')",
                "task-gc-live",
            ),
        )
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while relay_dirs_of(std::process::id()).is_empty() {
        assert!(Instant::now() < deadline, "no relay dir of this host");
        std::thread::sleep(Duration::from_millis(100));
    }
    let live = relay_dirs_of(std::process::id());
    let report: serde_json::Value = serde_json::from_slice(&gc(&["--json"])).unwrap();
    let removed = report["backends"]["daytona"]["removed"].to_string();
    for dir in &left {
        assert!(removed.contains(dir.as_str()), "{report}");
        assert!(!std::path::Path::new(dir).exists(), "{report}");
    }
    for dir in &live {
        assert!(std::path::Path::new(dir).exists(), "{report}");
    }
    let r = beside.join().unwrap();
    assert_eq!(r.output, "beside\n", "{r:?}");
    environments::shutdown();

    // A service URL without its API path: the error names DAYTONA_API_URL, not the image.
    let url = std::env::var("DAYTONA_API_URL").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vibeos-exec"))
        .args(["run", "--json"])
        .arg(&script)
        .env("VIBEOS_HOME", home.path())
        .env("DAYTONA_API_URL", url.trim_end_matches("/api"))
        .output()
        .unwrap();
    let r = vibeos_testkit::parse_single_json(&out);
    let e = r["error"].as_str().unwrap_or_default();
    assert!(
        e.contains("HTTP 404")
            && e.contains("check DAYTONA_API_URL")
            && !e.contains("daytona_image"),
        "{r}"
    );
    std::fs::remove_file(&cfg).unwrap();
    let report: serde_json::Value = serde_json::from_slice(&gc(&["--json", "--all"])).unwrap();
    assert_eq!(
        report["removed"],
        serde_json::json!([]),
        "nothing left: {report}"
    );
    assert_eq!(
        report["kept"],
        serde_json::json!([]),
        "nothing left: {report}"
    );

    // A script that ignores SIGTERM, removes the pgid files and stops its relay and its
    // bootstrap is still killed after the grace (the backstop: a fresh `/process/execute`
    // kills by the pids the relay reported before the script ran), and nothing of it is left.
    environments::activate(settings());
    let stopboot = std::fs::read_to_string(vibeos_testkit::fixture(
        "backends/stop_relay_and_bootstrap.py",
    ))
    .unwrap();
    let r = run_into_timeout(
        &rt,
        request(&stopboot, "task-stop"),
        Duration::from_secs(2),
        Duration::from_secs(30),
    );
    assert_ne!(r.exit_code, Some(0), "{r:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = ps(&lab);
        if !left.contains("sleep 9494") {
            break;
        }
        assert!(Instant::now() < deadline, "left behind: {left}");
        std::thread::sleep(Duration::from_millis(300));
    }
    // A script that kills its relay, or forges the relay's exit frame, ends its execution
    // early, and the host's sweep after the end kills what it left running (it ran on past
    // any timeout).
    for (fixture, tag) in [
        ("backends/outlive_by_killing_the_relay.py", "6161"),
        ("backends/forge_the_exit_frame.py", "6262"),
    ] {
        let code = std::fs::read_to_string(vibeos_testkit::fixture(fixture)).unwrap();
        let mut req = request(&code, "task-outlive");
        req.timeout = Duration::from_secs(60);
        let r = run(&rt, req);
        assert!(r.output.contains("started"), "{r:?}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = ps(&lab);
            if !left.contains(&format!("sleep {tag}")) && !left.contains(&format!("outlive-{tag}"))
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{fixture}: left behind after the end: {left}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    environments::shutdown();

    // A script that stops the tool agent's parent shell keeps the killed agent a zombie, so
    // its session command never ends: the host's shutdown waited for it for ever after the
    // result (and never deleted the sandbox). The wait is bounded now.
    environments::activate(settings());
    let stop_agent_parent = r#"
import os, signal
from vibeos_tools import terminal
print(terminal("echo agent-up")["output"].strip())
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            c = open("/proc/%s/cmdline" % p).read()
        except OSError:
            continue
        if "backend-agent" in c and c.startswith("sh"):
            os.kill(int(p), signal.SIGSTOP)
            print("stopped", p)
"#;
    let r = run(&rt, request(stop_agent_parent, "task-zombie"));
    assert!(r.output.contains("agent-up\nstopped"), "{r:?}");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        environments::shutdown();
        let _ = tx.send(());
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(60)).is_ok(),
        "the host's shutdown hung on the stopped agent"
    );
    assert!(lab.sandboxes().is_empty(), "the sandbox was left");

    // An interpreter the sandbox does not have: the relay never starts, and the error names
    // terminal.python (it said only that the relay's stream ended).
    environments::activate(BackendSettings {
        python: "python9-not-there".into(),
        ..settings()
    });
    let r = run(&rt, request("print(1)", "task-nopython"));
    assert_eq!(r.status, Status::Error, "{r:?}");
    let e = format!("{:?} {}", r.error, r.output);
    assert!(
        e.contains("terminal.python") && e.contains("python9-not-there"),
        "{r:?}"
    );
    environments::shutdown();

    // A key the service refuses (HTTP 401) is said to be refused, not "unreachable": the
    // service was reached.
    let key = std::env::var("DAYTONA_API_KEY").unwrap();
    std::env::set_var("DAYTONA_API_KEY", "wrong-key-for-the-stand-in");
    environments::activate(settings());
    let r = run(&rt, request("print(1)", "task-badkey"));
    std::env::set_var("DAYTONA_API_KEY", &key);
    let e = r.error.clone().unwrap_or_default();
    assert!(e.contains("refused the credentials"), "{r:?}");
    assert!(e.contains("DAYTONA_API_KEY"), "{r:?}");
    assert!(!e.contains("unreachable"), "{r:?}");
    environments::shutdown();

    // A start that cannot work (no tool agent binary at the configured path) fails before it
    // creates a sandbox, naming the setting: every failed start used to leave one running.
    let host = tempfile::tempdir().unwrap();
    environments::activate(BackendSettings {
        agent_binary: Some(host.path().join("missing").join("vibeos-exec")),
        ..settings()
    });
    for _ in 0..2 {
        let r = run(&rt, request("print(1)", "task-noagent"));
        assert_eq!(r.status, Status::Error, "{r:?}");
        let e = r.error.clone().unwrap_or_default();
        assert!(e.contains("terminal.agent_binary"), "{e}");
        assert!(lab.sandboxes().is_empty(), "a failed start left a sandbox");
    }
    environments::shutdown();
}

/// With the official SDK, a sandbox as a host of this machine that crashed would have left it:
/// labelled as the backend labels the live sandbox of `task-gc-live`, but for a task of its own
/// and an owner process that does not exist. Returns its name.
fn plant_crashed_sandbox(standin: &vibeos_testkit::daytona::Standin) -> String {
    let plant = r#"
import sys
from daytona import CreateSandboxFromSnapshotParams, Daytona, ListSandboxesQuery
client = Daytona()
live = list(client.list(ListSandboxesQuery(labels={"vibeos-exec.task": "task-gc-live"})))
labels = dict(live[0].labels)
labels.update({"vibeos-exec.task": "task-gc-crashed", "vibeos-exec.owner": "999999999:1"})
sb = client.create(CreateSandboxFromSnapshotParams(name="vibeos-exec-crashed", snapshot=sys.argv[1], labels=labels), timeout=120)
print(sb.name)
"#;
    python_output(&sdk_python().unwrap(), plant, &[IMAGE], &standin.env())
}

/// `--backend daytona` without `DAYTONA_API_KEY` is a usage error (exit 2) naming the variable;
/// an unreachable service is a clear error naming `DAYTONA_API_URL`, promptly, never a hang;
/// doctor lists the backend with the reason.
#[test]
fn daytona_cli_errors_name_what_is_missing() {
    let mut sb = vibeos_testkit::Sandbox::new();
    let script = sb.root.path().join("s.py");
    std::fs::write(&script, "print(1)").unwrap();
    let out = sb
        .command()
        .env_remove("DAYTONA_API_KEY")
        .args(["run", "--backend", "daytona"])
        .arg(&script)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("DAYTONA_API_KEY"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let run_json = |sb: &vibeos_testkit::Sandbox| {
        sb.command()
            .args(["run", "--json", "--backend", "daytona"])
            .arg(&script)
            .output()
            .unwrap()
    };
    sb.set_env("DAYTONA_API_KEY", "k");
    sb.set_env("DAYTONA_API_URL", "http://127.0.0.1:9/api");
    let started = Instant::now();
    let out = run_json(&sb);
    assert!(started.elapsed() < Duration::from_secs(30));
    let r = vibeos_testkit::parse_single_json(&out);
    assert_eq!(r["status"], "error", "{r}");
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("daytona backend unreachable") && e.contains("DAYTONA_API_URL"),
        "{e}"
    );
    // The endpoint to check is shown, not redacted: a service address is no secret.
    assert!(e.contains("http://127.0.0.1:9/api"), "{e}");
    assert!(!e.contains("REDACTED"), "{e}");

    // A DAYTONA_API_URL that is no http(s) URL is a configuration error, said before anything.
    for bad in [
        "127.0.0.1:9/api",
        "ftp://127.0.0.1/api",
        "http://",
        "http:/é",
    ] {
        sb.set_env("DAYTONA_API_URL", bad);
        let out = run_json(&sb);
        assert_eq!(out.status.code(), Some(2), "{bad}: {out:?}");
        let r = vibeos_testkit::parse_single_json(&out);
        let e = r["error"].as_str().unwrap();
        assert!(
            e.contains("DAYTONA_API_URL") && e.contains("http(s) URL"),
            "{e}"
        );
    }
    sb.set_env("DAYTONA_API_URL", "http://127.0.0.1:9/api");

    let out = sb.run(&["doctor"]);
    // Names are padded to one column: compare with the padding collapsed.
    let text = String::from_utf8_lossy(&out.stdout)
        .split(' ')
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    assert!(text.contains("daytona configured, not reachable"), "{text}");
}
