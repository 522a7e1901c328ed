//! The script process is started by its reaper as a clone that shares the reaper's memory until
//! its exec (`script_exec`): it must start exactly as a forked one did, with its own arguments
//! and environment even when executions start side by side, and an interpreter that cannot be
//! exec'd must be reported, never handed to a shell.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::common::{run, Session};
use super::pool::{runtime, serial};
use vibeos_supervisor::{execute, ExecutionRequest, ExecutionResult, Interrupt};

/// Adds `key=value` to the request's environment and lets it through the policy.
fn pass_env(request: &mut ExecutionRequest, key: &str, value: &str) {
    let mut env = request.base_env.take().unwrap_or_default();
    env.push((key.into(), value.into()));
    request.base_env = Some(env);
    request.env_passthrough.push(key.into());
}

/// The error of a result that must have failed, with the whole result for failure messages.
fn error_of(r: &ExecutionResult) -> (String, serde_json::Value) {
    let json = r.to_json();
    assert_eq!(json["status"], "error", "{json}");
    (r.error.clone().unwrap_or_default(), json)
}

#[test]
fn the_script_process_starts_under_its_reaper_with_no_signal_blocked_and_its_own_argv() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let script = r#"
import os, sys, json
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
print(json.dumps({
    "ppid": os.getppid(),
    "blocked": int(status["SigBlk"].strip(), 16),
    "argv0": sys.argv[0],
    "cwd": os.getcwd() == os.environ["EXPECTED_CWD"],
}))
"#;
    let mut request = session.request(script);
    request.env_passthrough.push("EXPECTED_CWD".into());
    let r = run(&rt, request);
    assert_eq!(r.to_json()["status"], "success", "{}", r.to_json());
    let got: serde_json::Value = serde_json::from_str(r.output.trim()).unwrap();
    assert_ne!(
        got["ppid"],
        std::process::id(),
        "the script's parent is its reaper"
    );
    assert_eq!(
        got["blocked"], 0,
        "the reaper's blocked signals leaked: {got}"
    );
    assert!(
        got["argv0"].as_str().unwrap().ends_with("script.py"),
        "{got}"
    );
    assert_eq!(got["cwd"], true, "{got}");
}

#[test]
fn executions_started_side_by_side_each_get_their_own_environment() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    // Each reaper's script process runs on a stack in the reaper's own copy of memory: started
    // together, no execution may see another's arguments or environment.
    let requests: Vec<_> = (0..8)
        .map(|i| {
            let mut r = session.request("import os\nprint(os.environ['RUN_ID'])\n");
            pass_env(&mut r, "RUN_ID", &format!("run-{i}"));
            r
        })
        .collect();
    let results = rt.block_on(async {
        let handles: Vec<_> = requests
            .into_iter()
            .map(|r| tokio::spawn(execute(r, vibeos_tools::registry(), Interrupt::new())))
            .collect();
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.unwrap());
        }
        out
    });
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.to_json()["status"], "success", "{}", r.to_json());
        assert_eq!(r.output.trim(), format!("run-{i}"));
    }
}

#[test]
fn an_interpreter_that_cannot_be_executed_is_reported_and_never_run_by_a_shell() {
    let _guard = serial();
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran-by-a-shell");
    // No ELF header and no `#!`: the kernel refuses it (ENOEXEC). `execvp` would then hand it
    // to /bin/sh, which would run this line.
    let fake = dir.path().join("python3");
    std::fs::write(&fake, format!("touch {}\n", marker.display())).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let session = Session::new(fake.clone());
    let r = run(&rt, session.request("print('never')\n"));
    let (error, json) = error_of(&r);
    assert!(
        error.contains("cannot start") && error.contains("Exec format error"),
        "{json}"
    );
    assert!(!marker.exists(), "the interpreter file was run by a shell");
}

#[test]
fn an_environment_value_with_a_nul_byte_is_refused_without_showing_the_value() {
    let python = require_python!();
    let _guard = serial();
    let rt = runtime();
    let session = Session::new(python);
    let mut request = session.request("print('never')\n");
    pass_env(&mut request, "NUL_VAR", "tok3n-value\0tail");
    let r = run(&rt, request);
    let (error, json) = error_of(&r);
    assert!(
        error.contains("NUL_VAR") && error.contains("NUL byte"),
        "{json}"
    );
    assert!(
        !json.to_string().contains("tok3n"),
        "the value leaked: {json}"
    );
}
