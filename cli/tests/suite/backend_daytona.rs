//! execute_code and the tools inside the daytona backend, against the Daytona stand-in
//! (tests/standins/, proven faithful by the official SDK in daytona_standin.rs) whose sandboxes
//! are real containers of a private dockerd: tool calls through the relay, tools acting in the
//! sandbox, env scrubbing, the API key invisible to the script and absent from the sandbox,
//! timeout and interrupt killing the command but keeping the sandbox (checked with `ps` in the
//! container), an expired sandbox recreated once, idle stop, and persistent resume by name.
//!
//! The backend choice is process-wide, so everything runs in one test, phase by phase.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vibeos_supervisor::{execute, Config, ExecutionRequest, ExecutionResult, Interrupt, Status};
use vibeos_testkit::backends::{rootfs, unavailable, Dockerd};
use vibeos_testkit::daytona::{sdk_python, Standin};
use vibeos_tools::environments::{self, BackendKind, BackendSettings};

const IMAGE: &str = "vibeos-py:test";

fn settings() -> BackendSettings {
    BackendSettings {
        backend: BackendKind::Daytona,
        daytona_image: Some(IMAGE.into()),
        agent_binary: Some(PathBuf::from(env!("CARGO_BIN_EXE_vibeos-exec"))),
        ..BackendSettings::default()
    }
}

fn request(code: &str, task: &str) -> ExecutionRequest {
    let mut r = ExecutionRequest::from_config(code, &Config::default());
    r.task_id = Some(task.into());
    r.timeout = Duration::from_secs(60);
    r.base_env = Some(vec![
        (OsString::from("PATH"), OsString::from("/host/only/bin")),
        (OsString::from("LANG"), OsString::from("C.UTF-8")),
        (
            OsString::from("MY_SECRET_TOKEN"),
            OsString::from("hunter2-host-secret"),
        ),
        // The host's own credentials for the service: the supervisor uses them, no script may.
        (
            OsString::from("DAYTONA_API_KEY"),
            std::env::var_os("DAYTONA_API_KEY").unwrap(),
        ),
        (
            OsString::from("DAYTONA_API_URL"),
            std::env::var_os("DAYTONA_API_URL").unwrap(),
        ),
    ]);
    r
}

fn run(rt: &tokio::runtime::Runtime, req: ExecutionRequest) -> ExecutionResult {
    rt.block_on(execute(req, vibeos_tools::registry(), Interrupt::new()))
}

fn sandboxes(d: &Dockerd) -> Vec<String> {
    let out = d.docker(&["ps", "-q", "--filter", "label=daytona-standin=1"]);
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn ps(d: &Dockerd) -> String {
    sandboxes(d)
        .iter()
        .map(|c| {
            String::from_utf8_lossy(&d.docker(&["exec", c, "ps", "-eo", "pid,args"]).stdout)
                .into_owned()
        })
        .collect()
}

#[test]
fn daytona_backend_end_to_end() {
    let _lock = super::backend_lock();
    if let Err(why) = sdk_python() {
        return unavailable(&why);
    }
    let daemon = match Dockerd::start() {
        Ok(d) => d,
        Err(e) => return unavailable(&e),
    };
    let tar = match rootfs() {
        Ok(t) => t,
        Err(e) => return unavailable(&e),
    };
    daemon.import(&tar, IMAGE).unwrap();
    let standin = Standin::start(&daemon, IMAGE).unwrap();
    // Read by the supervisor only (this process).
    std::env::set_var("DAYTONA_API_URL", &standin.api_url);
    std::env::set_var("DAYTONA_API_KEY", &standin.api_key);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
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
    assert_eq!(sandboxes(&daemon).len(), 1);

    // Timeout: the command dies, the sandbox stays.
    let mut req = request(
        "import subprocess, time\nsubprocess.Popen(['sleep', '4242'])\nprint('started', flush=True)\ntime.sleep(600)",
        "task-a",
    );
    req.timeout = Duration::from_secs(3);
    req.kill_grace = Duration::from_secs(1);
    let started = Instant::now();
    let r = run(&rt, req);
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    assert!(r.output.contains("started"), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    let procs = ps(&daemon);
    assert!(
        !procs.contains("sleep 4242") && !procs.contains("time.sleep(600)"),
        "left behind: {procs}"
    );
    assert_eq!(
        sandboxes(&daemon).len(),
        1,
        "the sandbox survives a timeout"
    );

    // Interrupt: the same.
    let interrupt = Interrupt::new();
    let stopper = interrupt.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(3));
        stopper.interrupt();
    });
    let mut req = request(
        "import subprocess, time\nsubprocess.Popen(['sleep', '4343'])\ntime.sleep(600)",
        "task-a",
    );
    req.kill_grace = Duration::from_secs(1);
    let r = rt.block_on(execute(req, vibeos_tools::registry(), interrupt));
    assert_eq!(r.status, Status::Interrupted, "{r:?}");
    std::thread::sleep(Duration::from_millis(500));
    let procs = ps(&daemon);
    assert!(!procs.contains("sleep 4343"), "left behind: {procs}");
    assert_eq!(
        sandboxes(&daemon).len(),
        1,
        "the sandbox survives an interrupt"
    );

    // An expired sandbox (the service deleted it behind our back) is recreated once.
    let gone = sandboxes(&daemon);
    let names = daemon.docker(&[
        "ps",
        "--format",
        "{{.Names}}",
        "--filter",
        "label=daytona-standin=1",
    ]);
    let id = String::from_utf8_lossy(&names.stdout)
        .trim()
        .trim_start_matches("daytona-")
        .to_string();
    let deleted = std::process::Command::new(sdk_python().unwrap())
        .args([
            "-c",
            "import sys, urllib.request as u
r = u.Request(sys.argv[1], method='DELETE', headers={'Authorization': 'Bearer ' + sys.argv[2]})
print(u.urlopen(r).status)",
        ])
        .arg(format!("{}/sandbox/{id}", standin.api_url))
        .arg(&standin.api_key)
        .output()
        .unwrap();
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    let r = run(&rt, request("print('back')", "task-a"));
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.output.contains("back"));
    assert_eq!(sandboxes(&daemon).len(), 1);
    assert_ne!(sandboxes(&daemon), gone);

    // Idle stop after lifetime_seconds: the (non-persistent) sandbox is deleted.
    environments::shutdown();
    let mut idle = settings();
    idle.lifetime = Duration::from_secs(1);
    environments::activate(idle);
    let r = run(&rt, request("print('hi')", "task-idle"));
    assert_eq!(r.status, Status::Success, "{r:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sandboxes(&daemon).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(sandboxes(&daemon).is_empty(), "idle sandbox not deleted");

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
        sandboxes(&daemon).is_empty(),
        "a persistent sandbox is stopped at exit"
    );
    environments::activate(keep);
    let r = run(
        &rt,
        request("print(open('/root/kept.txt').read())", "task-p"),
    );
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.output.contains("kept"), "{r:?}");
    environments::shutdown();
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

    sb.set_env("DAYTONA_API_KEY", "k");
    sb.set_env("DAYTONA_API_URL", "http://127.0.0.1:9/api");
    let started = Instant::now();
    let out = sb
        .command()
        .args(["run", "--json", "--backend", "daytona"])
        .arg(&script)
        .output()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(30));
    let r = vibeos_testkit::parse_single_json(&out);
    assert_eq!(r["status"], "error", "{r}");
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("daytona backend unreachable") && e.contains("DAYTONA_API_URL"),
        "{e}"
    );

    let out = sb.run(&["doctor"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("daytona configured, not reachable"), "{text}");
}
