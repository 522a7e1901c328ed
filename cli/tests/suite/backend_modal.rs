//! The modal backend against the Modal stand-in (tests/standins/modal_server.py, proven
//! faithful by suite/modal_conformance.rs with the official SDK), whose sandboxes are
//! real containers of a private dockerd: exec with cwd, env, exit code and timeout; file
//! upload and download; the tools running inside the sandbox (not on the host); one sandbox
//! per task; a timeout or an interrupt kills the command and its children in the sandbox and
//! keeps the sandbox; an expired sandbox is recreated once; idle stop; the Modal credentials
//! never reach the sandbox; a wrong token or an unreachable API is a clear, quick error;
//! `backends gc` terminates what a crashed host left and keeps a live host's sandbox.
//!
//! The backend choice and the SDK sidecar are process-wide, so everything runs in one test,
//! phase by phase, in a process of its own (`common::in_own_process`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::common::{
    backend, hanging_script, host_dirs_of, ignore_term_with_setsid_child, python_output,
    request_from, run, run_interrupted_after, run_into_timeout, runtime, spawn_host, HOST_ENV,
};
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant};
use vibeos_supervisor::{ExecutionRequest, Status};
use vibeos_testkit::backends::unavailable;
use vibeos_testkit::modal::{ModalLab, TOKEN_ID, TOKEN_SECRET};
use vibeos_tools::environments::{self, BackendKind, BackendSettings, EnvError, ExecSpec};
use vibeos_tools::ToolContext;

const IMAGE: &str = "vibeos-py:test";

fn settings(python: &std::path::Path) -> BackendSettings {
    BackendSettings {
        modal_image: Some(IMAGE.into()),
        modal_python: python.display().to_string(),
        ..backend(BackendKind::Modal)
    }
}

/// A request whose host environment also holds the Modal credentials: the supervisor's
/// sidecar uses them, no script may.
fn request(code: &str, task: &str) -> ExecutionRequest {
    let mut env = HOST_ENV.to_vec();
    env.extend([
        ("MODAL_TOKEN_ID", TOKEN_ID),
        ("MODAL_TOKEN_SECRET", TOKEN_SECRET),
    ]);
    let mut r = request_from(code, task, &env);
    r.timeout = Duration::from_secs(120);
    r
}

/// Calls a tool as a script of `task` would.
fn tool(task: &str, name: &str, args: Value) -> Value {
    let mut ctx = ToolContext::agent(std::env::temp_dir());
    ctx.task_id = Some(task.into());
    let args: Map<String, Value> = args.as_object().cloned().unwrap_or_default();
    let out = vibeos_tools::registry().dispatch(name, &args, &ctx);
    serde_json::from_str(&out).unwrap_or(Value::String(out))
}

/// Command lines of every process in the sandbox of `task` (no procps in the image).
fn processes(task: &str) -> String {
    let r = tool(
        task,
        "terminal",
        json!({"command": "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done"}),
    );
    r["output"].as_str().unwrap_or_default().to_string()
}

#[test]
fn modal_backend_against_the_stand_in() {
    if super::common::in_own_process() {
        return;
    }
    let lab = match ModalLab::start(IMAGE) {
        Ok(l) => l,
        Err(e) => return unavailable(&e),
    };
    let (standin, python) = (&lab.standin, &lab.python);
    // The supervisor's environment: where the credentials are read (by the sidecar alone).
    let _endpoint = lab.export();
    let rt = runtime();
    environments::activate(settings(python));
    let envs = environments::active().unwrap();

    // Exec: cwd, env, stdin, exit code, stdout and stderr apart.
    let env = envs.get(Some("task-a")).expect("sandbox");
    assert_eq!(env.backend(), "modal");
    let spec = ExecSpec::new([
        "sh",
        "-c",
        "pwd; echo $GREETING; cat; echo oops >&2; exit 3",
    ])
    .cwd("/tmp")
    .env("GREETING", "hello there");
    let out = env
        .exec(&spec, b"from stdin", Duration::from_secs(60))
        .unwrap();
    assert_eq!(out.code, Some(3), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "/tmp\nhello there\nfrom stdin"
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "oops\n");
    let missing = env
        .exec(
            &ExecSpec::new(["true"]).cwd("/no/such/dir"),
            b"",
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(missing.code, Some(125), "{missing:?}");
    assert_eq!(lab.sandboxes().len(), 1);

    // Files: upload and download, binary-safe, with the mode asked for.
    let payload: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
    env.upload(&payload, "/srv/blob.bin", 0o640).unwrap();
    assert_eq!(env.download("/srv/blob.bin").unwrap(), payload);
    let mode = env
        .exec(
            &ExecSpec::new(["stat", "-c", "%a", "/srv/blob.bin"]),
            b"",
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&mode.stdout).trim(), "640");
    match env.download("/srv/none.bin") {
        Err(e) => assert!(e.to_string().contains("/srv/none.bin"), "{e}"),
        Ok(d) => panic!("downloaded a missing file: {d:?}"),
    }

    // Tools run in the sandbox: what write_file writes, the terminal sees; the host does not.
    let marker = format!("/srv/vibeos-modal-{}.txt", std::process::id());
    let w = tool(
        "task-a",
        "write_file",
        json!({"path": marker, "content": "alpha\nbeta\n"}),
    );
    assert!(w.get("error").is_none(), "{w}");
    let r = tool("task-a", "read_file", json!({"path": marker}));
    assert!(r["content"].as_str().unwrap().contains("beta"), "{r}");
    let t = tool(
        "task-a",
        "terminal",
        json!({"command": format!("cat {marker}")}),
    );
    assert_eq!(t["output"].as_str().unwrap().trim(), "alpha\nbeta", "{t}");
    assert!(
        !std::path::Path::new(&marker).exists(),
        "leaked to the host"
    );

    // The credentials never reach the sandbox: not in a command's environment, not in any
    // process's environment there, not in a file under / the agent can read.
    let t = tool(
        "task-a",
        "terminal",
        json!({"command": "env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'"}),
    );
    let seen = t["output"].as_str().unwrap().to_string();
    assert!(seen.contains("PATH="), "{t}");
    for secret in [TOKEN_ID, TOKEN_SECRET, standin.url.as_str(), "MODAL_TOKEN"] {
        assert!(
            !seen.contains(secret),
            "{secret} reached the sandbox: {seen}"
        );
    }
    let t = tool(
        "task-a",
        "terminal",
        json!({"command": format!("grep -rl {TOKEN_SECRET} /tmp /root /srv /etc 2>/dev/null; echo done")}),
    );
    assert_eq!(t["output"].as_str().unwrap().trim(), "done", "{t}");

    // One sandbox per task, reused.
    let env_again = envs.get(Some("task-a")).unwrap();
    assert!(std::sync::Arc::ptr_eq(&env, &env_again));
    let b = tool("task-b", "terminal", json!({"command": "hostname"}));
    let a = tool("task-a", "terminal", json!({"command": "hostname"}));
    assert_ne!(a["output"], b["output"]);
    assert_eq!(lab.sandboxes().len(), 2);

    // execute_code in the sandbox, through the relay: a script with tool calls; its
    // environment is scrubbed (no host secrets, no host PATH, no Modal credentials).
    let code = format!(
        r#"
from vibeos_tools import write_file, read_file, terminal
import os, json, socket
print("w:", "error" not in write_file("/srv/from-script.txt", "gamma\n"))
print("r:", read_file("/srv/from-script.txt")["content"].strip().endswith("gamma"))
print("t:", terminal("cat {marker}")["output"].split())
print("host:", socket.gethostname() == terminal("hostname")["output"].strip())
print("env:", json.dumps(dict(os.environ)))
"#
    );
    let r = run(&rt, request(&code, "task-a"));
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.backend.as_deref(), Some("modal"));
    assert!(r.output.contains("w: True"), "{}", r.output);
    assert!(r.output.contains("r: True"), "{}", r.output);
    assert!(r.output.contains("t: ['alpha', 'beta']"), "{}", r.output);
    assert!(r.output.contains("host: True"), "{}", r.output);
    assert_eq!(r.tool_calls_made, 4, "{r:?}");
    for leak in [
        "hunter2-host-secret",
        "sk-host-provider-secret",
        "/host/only/bin",
        TOKEN_ID,
        TOKEN_SECRET,
        standin.url.as_str(),
    ] {
        assert!(
            !r.output.contains(leak),
            "{leak} reached the script: {}",
            r.output
        );
    }
    assert!(
        r.output.contains("C.UTF-8"),
        "safe variables pass: {}",
        r.output
    );

    // execute_code timeout and interrupt: the script and what it started die in the sandbox,
    // the sandbox stays.
    let before_scripts = lab.sandboxes();
    run_into_timeout(
        &rt,
        request(&hanging_script("5151"), "task-a"),
        Duration::from_secs(3),
        Duration::from_secs(30),
    );
    let ps = processes("task-a");
    assert!(
        !ps.contains("sleep 5151") && !ps.contains("time.sleep(600)"),
        "left behind: {ps}"
    );
    let r = run_interrupted_after(
        &rt,
        request(
            "import subprocess, time\nsubprocess.Popen(['sleep', '5252'])\ntime.sleep(600)",
            "task-a",
        ),
        Duration::from_secs(3),
    );
    assert_eq!(r.status, Status::Interrupted, "{r:?}");
    let ps = processes("task-a");
    assert!(!ps.contains("sleep 5252"), "left behind: {ps}");
    // A script that ignores SIGTERM, with a setsid'd child, cancelled: the relay's KILL used
    // to take the bootstrap with the script, so the child ran on under init and the end
    // waited for the backstop ("the relay's stream ended before the script exited").
    let started = Instant::now();
    let r = run_interrupted_after(
        &rt,
        request(&ignore_term_with_setsid_child("5353"), "task-a"),
        Duration::from_secs(3),
    );
    assert_eq!(r.status, Status::Interrupted, "{r:?}");
    // 3 s, the 1 s grace, and the stand-in's latency.
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert!(!r.output.contains("stream ended"), "{r:?}");
    let ps = processes("task-a");
    assert!(!ps.contains("sleep 5353"), "left behind: {ps}");
    assert_eq!(lab.sandboxes(), before_scripts, "the sandbox must survive");

    // A timeout kills the command and what it started, in the sandbox; the sandbox stays.
    let before = lab.sandboxes();
    let started = Instant::now();
    let r = env.exec(
        &ExecSpec::new(["sh", "-c", "sleep 4242 & sleep 4343; echo never"]),
        b"",
        Duration::from_secs(2),
    );
    assert!(matches!(r, Err(EnvError::Timeout { .. })), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(20));
    let ps = processes("task-a");
    assert!(
        !ps.contains("sleep 4242") && !ps.contains("sleep 4343"),
        "left behind: {ps}"
    );
    assert_eq!(lab.sandboxes(), before, "the sandbox must survive");
    let t = tool(
        "task-a",
        "terminal",
        json!({"command": "sleep 4747; echo never", "timeout": 2}),
    );
    assert!(!t["output"].as_str().unwrap_or("").contains("never"), "{t}");
    assert!(!processes("task-a").contains("sleep 4747"));
    assert_eq!(lab.sandboxes(), before);

    // An interrupt (TERM to the running command's group, then KILL, as execute_code's
    // interrupt does) ends the command and what it started; the sandbox stays.
    let spawned = env
        .spawn(&ExecSpec::new(["sh", "-c", "sleep 4848 & sleep 4949"]))
        .unwrap();
    let process = std::sync::Arc::clone(&spawned.process);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(process.try_wait().unwrap(), None);
    process.kill(environments::GroupSignal::Term).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    process.kill(environments::GroupSignal::Kill).unwrap();
    let code = process.wait().unwrap();
    assert!(code < 0, "killed by a signal: {code}");
    let ps = processes("task-a");
    assert!(
        !ps.contains("sleep 4848") && !ps.contains("sleep 4949"),
        "left behind: {ps}"
    );
    assert_eq!(lab.sandboxes(), before);

    // Modal ends a sandbox (its lifetime ran out): the next call recreates it, once.
    let old = lab.sandboxes();
    standin.control("expire-all");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !lab.sandboxes().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(lab.sandboxes().is_empty());
    let t = tool("task-a", "terminal", json!({"command": "echo back"}));
    assert_eq!(t["output"].as_str().unwrap_or("").trim(), "back", "{t}");
    let now = lab.sandboxes();
    assert_eq!(now.len(), 1, "{now:?}");
    assert!(!old.contains(&now[0]), "a new sandbox: {old:?} {now:?}");
    // The second loss is an error that says so, not a loop.
    standin.control("expire-all");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !lab.sandboxes().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = env.exec(&ExecSpec::new(["true"]), b"", Duration::from_secs(60));
    let e = r.expect_err("a second expiry is an error");
    assert!(e.to_string().contains("recreated once"), "{e}");

    // Host exit terminates every sandbox.
    environments::shutdown();
    assert!(lab.sandboxes().is_empty(), "{:?}", lab.sandboxes());

    // Idle stop after lifetime_seconds.
    let mut idle = settings(python);
    idle.lifetime = Duration::from_secs(1);
    environments::activate(idle);
    let t = tool("task-idle", "terminal", json!({"command": "echo hi"}));
    assert_eq!(t["output"].as_str().unwrap_or("").trim(), "hi", "{t}");
    assert_eq!(lab.sandboxes().len(), 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !lab.sandboxes().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(lab.sandboxes().is_empty(), "idle sandbox not stopped");
    environments::shutdown();

    // The CLI: a wrong secret and an unreachable API are clear errors, quickly, naming what
    // to fix; a missing token is exit 2 before anything runs.
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("config.yaml"),
        format!(
            "terminal:\n  modal_image: {IMAGE}\n  modal_python: {}\n",
            python.display()
        ),
    )
    .unwrap();
    let script = home.path().join("s.py");
    std::fs::write(&script, "print('hi')\n").unwrap();
    let cli = |vars: &[(&str, &str)], unset: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vibeos-exec"));
        cmd.args(["run", "--json", "--backend", "modal"])
            .arg(&script)
            .env("VIBEOS_HOME", home.path())
            .env("VIBEOS_AGENT_BINARY", env!("CARGO_BIN_EXE_vibeos-exec"));
        for (k, v) in vars {
            cmd.env(k, v);
        }
        for k in unset {
            cmd.env_remove(k);
        }
        let t = Instant::now();
        let out = cmd.output().unwrap();
        (out, t.elapsed())
    };
    // The SDK sidecar holds the token: it imports nothing from the caller's working dir (a
    // `grpclib.py` there ran inside it, as the SDK imports grpclib) and gets no other
    // service's secret.
    let project = tempfile::tempdir().unwrap();
    let stolen = project.path().join("stolen");
    std::fs::write(
        project.path().join("grpclib.py"),
        format!(
            "import os\nopen({:?}, 'w').write(os.environ.get('MODAL_TOKEN_SECRET', ''))\nraise ImportError('planted')\n",
            stolen.display().to_string()
        ),
    )
    .unwrap();
    let slow = project.path().join("slow.py");
    std::fs::write(&slow, "import time\ntime.sleep(3)\nprint('slept')\n").unwrap();
    let host = std::process::Command::new(env!("CARGO_BIN_EXE_vibeos-exec"))
        .args(["run", "--json", "--backend", "modal"])
        .arg(&slow)
        .current_dir(project.path())
        .env("VIBEOS_HOME", home.path())
        .env("VIBEOS_AGENT_BINARY", env!("CARGO_BIN_EXE_vibeos-exec"))
        .env("DAYTONA_API_KEY", "dtn-not-for-the-modal-sdk")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let sidecar_env = loop {
        let found = std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).to_string();
            if !cmdline.contains("vibeos-modal-") || !cmdline.contains("sidecar.sock") {
                return None;
            }
            // This CLI's sidecar, not one of this test process's own.
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let ppid: u32 = stat.rsplit(") ").next()?.split(' ').nth(1)?.parse().ok()?;
            if ppid != host.id() {
                return None;
            }
            let environ = std::fs::read(e.path().join("environ")).ok()?;
            Some(String::from_utf8_lossy(&environ).to_string())
        });
        if let Some(env) = found {
            break env;
        }
        assert!(Instant::now() < deadline, "no sidecar process seen");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(sidecar_env.contains("MODAL_TOKEN_ID="), "{sidecar_env}");
    assert!(
        !sidecar_env.contains("dtn-not-for-the-modal-sdk"),
        "{sidecar_env}"
    );
    let out = host.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("slept"),
        "{out:?}"
    );
    assert!(
        !stolen.exists(),
        "the sidecar imported the caller's grpclib.py"
    );

    // doctor asks the API whether it takes the token.
    let doctor = std::process::Command::new(env!("CARGO_BIN_EXE_vibeos-exec"))
        .args(["doctor", "--json"])
        .env("VIBEOS_HOME", home.path())
        .output()
        .unwrap();
    let report: Value =
        serde_json::from_slice(&doctor.stdout).unwrap_or_else(|_| panic!("{doctor:?}"));
    let modal = report["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|e| e["name"] == "modal"))
        .cloned()
        .unwrap_or_else(|| panic!("no modal line: {report}"));
    assert_eq!(modal["configured"], true, "{modal}");
    assert_eq!(modal["reachable"], true, "{modal}");
    assert!(
        modal["detail"].as_str().unwrap().contains(&standin.url),
        "{modal}"
    );
    let (out, _) = cli(&[], &["MODAL_TOKEN_SECRET"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("needs the environment variable MODAL_TOKEN_SECRET"),
        "{out:?}"
    );
    let (out, took) = cli(&[("MODAL_TOKEN_SECRET", "wrong")], &[]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("MODAL_TOKEN_ID and MODAL_TOKEN_SECRET"),
        "{text}"
    );
    // Reached but refused: not "unreachable".
    assert!(text.contains("refused the credentials"), "{text}");
    assert!(!text.contains("unreachable"), "{text}");
    assert!(took < Duration::from_secs(30), "{took:?}");
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (out, took) = cli(
        &[("MODAL_SERVER_URL", &format!("http://127.0.0.1:{dead}"))],
        &[],
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("MODAL_SERVER_URL"), "{text}");
    assert!(took < Duration::from_secs(40), "{took:?}");
    assert!(lab.sandboxes().is_empty());

    // backends gc: a sandbox that a crashed host of this machine left (its owner process is
    // gone) is terminated, a live host's is kept and goes on working.
    environments::activate(settings(python));
    let t = tool("task-gc-live", "terminal", json!({"command": "echo live"}));
    assert_eq!(t["output"].as_str().unwrap_or("").trim(), "live", "{t}");
    let crashed = plant_crashed_sandbox(python);
    assert_eq!(lab.sandboxes().len(), 2);
    let gc = |json: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_vibeos-exec"));
        cmd.args(["backends", "gc"]).env("VIBEOS_HOME", home.path());
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        out.stdout
    };
    let report: Value = serde_json::from_slice(&gc(true)).unwrap();
    assert_eq!(report["removed"], json!([crashed]), "{report}");
    let kept = &report["backends"]["modal"]["kept"];
    assert_eq!(kept.as_array().map(Vec::len), Some(1), "{report}");
    assert_ne!(kept[0], json!(crashed), "{report}");
    assert_eq!(
        lab.sandboxes().len(),
        1,
        "the leftover is gone, the live one runs"
    );
    let text = String::from_utf8(gc(false)).unwrap();
    assert!(text.contains("kept    modal sandbox sb-"), "{text}");
    assert!(!text.contains("removed"), "{text}");
    let t = tool("task-gc-live", "terminal", json!({"command": "echo still"}));
    assert_eq!(t["output"].as_str().unwrap_or("").trim(), "still", "{t}");
    environments::shutdown();
    assert!(lab.sandboxes().is_empty());

    // A host killed with SIGKILL mid-run leaves the relay's socket dir and its SDK sidecar's on
    // this host; gc removes both (and the sandbox).
    std::fs::write(
        &script,
        "import subprocess\nsubprocess.run(['sleep', '7474'])\n",
    )
    .unwrap();
    let mut host = spawn_host(home.path(), &["run", "--backend", "modal"], &script);
    let deadline = Instant::now() + Duration::from_secs(120);
    while host_dirs_of(host.id(), "vibeos-relay-modal-").is_empty() {
        assert!(Instant::now() < deadline, "the script did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut left = host_dirs_of(host.id(), "vibeos-relay-modal-");
    left.extend(host_dirs_of(host.id(), "vibeos-modal-"));
    assert_eq!(left.len(), 2, "{left:?}");
    host.kill().unwrap();
    host.wait().unwrap();
    let report: Value = serde_json::from_slice(&gc(true)).unwrap();
    let removed = report["backends"]["modal"]["removed"].to_string();
    for dir in &left {
        assert!(removed.contains(dir.as_str()), "{report}");
        assert!(!std::path::Path::new(dir).exists(), "{report}");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !lab.sandboxes().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the killed host's sandbox is left"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // A script that ignores SIGTERM, removes the pgid files and stops its relay and its
    // bootstrap is still killed after the grace (the backstop: a fresh sandbox exec kills by
    // the pids the relay reported before the script ran), and nothing of it is left.
    environments::activate(settings(python));
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
        let left = processes("task-stop");
        if !left.contains("sleep 9494") && !left.contains("relay") {
            break;
        }
        assert!(Instant::now() < deadline, "left behind: {left}");
        std::thread::sleep(Duration::from_millis(300));
    }
    environments::shutdown();

    // A terminal.cwd that does not exist in the sandbox is an error naming the key (the
    // sandbox's workdir used to create it), and the failed execution's sandbox is stopped
    // with the host like any other.
    environments::activate(BackendSettings {
        cwd: Some("/nonexistent-vibeos-cwd".into()),
        ..settings(python)
    });
    let r = run(&rt, request("import os\nprint(os.getcwd())", "task-cwd"));
    assert_eq!(r.status, Status::Error, "{r:?}");
    let error = r.error.clone().unwrap_or_default();
    assert!(error.contains("terminal.cwd"), "{r:?}");
    assert!(error.contains("/nonexistent-vibeos-cwd"), "{r:?}");
    environments::shutdown();
    assert!(lab.sandboxes().is_empty());

    // terminal.modal_python errors name that key, and an interpreter without the SDK is
    // said to lack the `modal` package (not "exit Some(1)" under "tool agent:").
    let bad_python = |modal_python: &str| {
        environments::activate(BackendSettings {
            modal_python: modal_python.into(),
            ..settings(python)
        });
        let r = run(&rt, request("print(1)", "task-py"));
        environments::shutdown();
        assert_eq!(r.status, Status::Error, "{r:?}");
        r.error.unwrap_or_default()
    };
    let error = bad_python("/nonexistent/python");
    assert!(error.contains("terminal.modal_python"), "{error}");
    assert!(!error.contains("docker_binary"), "{error}");
    let bare = tempfile::tempdir().unwrap();
    // `-S`: no site-packages, so no `modal`, whatever this machine's python3 has installed.
    let no_sdk = bare.path().join("python-without-modal");
    std::fs::write(&no_sdk, "#!/bin/sh\nexec /usr/bin/python3 -I -S \"$@\"\n").unwrap();
    std::fs::set_permissions(&no_sdk, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let error = bad_python(&no_sdk.display().to_string());
    assert!(error.contains("no `modal` package"), "{error}");
    assert!(error.contains("terminal.modal_python"), "{error}");
    assert!(!error.contains("Some("), "{error}");
    assert!(!error.contains("tool agent"), "{error}");
    assert!(lab.sandboxes().is_empty());
}

/// With the official SDK, a sandbox as a host of this machine that crashed would have left it:
/// tagged as the backend tags the live sandbox of `task-gc-live`, but for a task of its own and
/// an owner process that does not exist. Returns its id.
fn plant_crashed_sandbox(python: &std::path::Path) -> String {
    let plant = r#"
import sys, modal
app = modal.App.lookup("vibeos-exec", create_if_missing=True)
live = list(modal.Sandbox.list(app_id=app.app_id, tags={"vibeos-exec.task": "task-gc-live"}))
tags = live[0].get_tags()
tags.update({"vibeos-exec.task": "task-gc-crashed", "vibeos-exec.owner": "999999999:1"})
sb = modal.Sandbox.create(app=app, image=modal.Image.from_registry(sys.argv[1]), tags=tags, timeout=600)
print(sb.object_id)
"#;
    python_output(python, plant, &[IMAGE], &[])
}
