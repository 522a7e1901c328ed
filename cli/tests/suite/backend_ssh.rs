//! execute_code and the tools over the ssh backend, against an sshd the test starts on
//! 127.0.0.1 with generated keys and a non-root user: tools act on the remote side as that
//! user, remote env scrubbing, shell sessions, a timeout leaves no remote process (checked with
//! `ps` there), the private work dir is removed, and an unreachable host is a clear error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::common::{request_from, run, runtime, ssh_backend};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use vibeos_supervisor::{ExecutionRequest, Status};
use vibeos_testkit::backends::{start_sshd, unavailable, SSH_USER};
use vibeos_tools::environments::{self, BackendSettings};

fn request(code: &str) -> ExecutionRequest {
    request_from(
        code,
        "ssh-task",
        &[
            ("LANG", "C.UTF-8"),
            ("MY_SECRET_TOKEN", "hunter2-host-secret"),
        ],
    )
}

fn remote_processes() -> String {
    let out = Command::new("ps")
        .args(["-u", SSH_USER, "-o", "pid,args"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn ssh_backend_end_to_end() {
    let _ssh = super::ssh_lock();
    if super::common::in_own_process() {
        return;
    }
    let sshd = match start_sshd() {
        Ok(s) => s,
        Err(e) => return unavailable(&e),
    };
    let rt = runtime();
    environments::activate(ssh_backend(&sshd, sshd.port));
    let home = sshd.dir.path().join("home");
    let code = r#"
from vibeos_tools import write_file, read_file, terminal
import os, json
w = write_file("notes.txt", "written remotely")
assert "error" not in w, w
print("open:", open(os.path.expanduser("~/notes.txt")).read())
print("whoami:", terminal("whoami")["output"].strip())
terminal("cd /tmp && export SSH_SESSION_T=kept")
print("session:", terminal("pwd; echo $SSH_SESSION_T")["output"].split())
print("env:", json.dumps(dict(os.environ)), terminal("env")["output"].replace("\n", " "))
print("workdir:", os.path.dirname(os.path.abspath(__file__)), oct(os.stat(os.path.dirname(os.path.abspath(__file__))).st_mode & 0o777))
"#;
    let r = run(&rt, request(code));
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.backend.as_deref(), Some("ssh"));
    assert!(r.output.contains("open: written remotely"), "{}", r.output);
    assert!(
        r.output.contains(&format!("whoami: {SSH_USER}")),
        "{}",
        r.output
    );
    assert!(
        r.output.contains("session: ['/tmp', 'kept']"),
        "{}",
        r.output
    );
    assert!(r.output.contains("0o700"), "private work dir: {}", r.output);
    assert!(!r.output.contains("hunter2-host-secret"), "{}", r.output);
    assert!(
        home.join("notes.txt").exists(),
        "written on the remote side (the user's home)"
    );
    let workdir = r
        .output
        .lines()
        .find_map(|l| l.strip_prefix("workdir: "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();
    assert!(
        !Path::new(&workdir).exists(),
        "the remote work dir was removed: {workdir}"
    );

    // Attack: the environment's shared RPC socket refuses every connection that does not
    // start with the token of a running execution, with an error reply.
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/core/routed_wrong_token.py"
    );
    let r = run(&rt, request(&std::fs::read_to_string(fixture).unwrap()));
    assert_eq!(r.status, Status::Success, "{r:?}");
    let v: serde_json::Value = serde_json::from_str(r.output.trim()).unwrap();
    assert_eq!(v["shared"], true, "{v}");
    for case in ["wrong_token", "no_token_line", "right_line_wrong_request"] {
        assert_eq!(v[case]["error"]["code"], "unauthorized", "{case}: {v}");
    }
    // A flood may be cut before its reply crosses the forward: refused either way.
    assert!(
        v["overlong"]["error"]["code"] == "unauthorized" || v["overlong"]["closed"].is_string(),
        "{v}"
    );
    assert_eq!(v["own_call_ok"], true, "{v}");

    // A timeout kills the remote process group, not just the local client, and removes the
    // work dir, which the bootstrap's own exit handler never gets to (SIGTERM ends Python
    // without running it).
    let mut req = request("import os, subprocess, time\nsubprocess.Popen(['sleep', '4545'])\nprint('up', os.path.dirname(os.path.abspath(__file__)), flush=True)\ntime.sleep(600)");
    req.timeout = Duration::from_secs(2);
    req.kill_grace = Duration::from_secs(1);
    let r = run(&rt, req);
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    std::thread::sleep(Duration::from_millis(500));
    let ps = remote_processes();
    assert!(
        !ps.contains("sleep 4545") && !ps.contains("script.py"),
        "left behind: {ps}"
    );
    let workdir = r
        .output
        .lines()
        .find_map(|l| l.strip_prefix("up "))
        .unwrap_or_else(|| panic!("no work dir in {:?}", r.output))
        .to_string();
    assert!(
        workdir.starts_with("/tmp/vibeos-exec-"),
        "unexpected work dir {workdir}"
    );
    assert!(
        !Path::new(&workdir).exists(),
        "the timed-out execution's work dir was left: {workdir}"
    );

    environments::shutdown();
    let ps = remote_processes();
    assert!(!ps.contains("backend-agent"), "agent left behind: {ps}");

    // An unreachable host: a clear error, quickly.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    environments::activate(ssh_backend(&sshd, closed));
    let started = Instant::now();
    let r = run(&rt, request("print(1)"));
    assert_eq!(r.status, Status::Error);
    let err = r.error.unwrap_or_default();
    assert!(err.contains("cannot connect to 127.0.0.1"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30));
    environments::activate(BackendSettings::default());
}
