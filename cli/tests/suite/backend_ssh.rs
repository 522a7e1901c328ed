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
use vibeos_testkit::backends::{unavailable, Sshd, SSH_USER};
use vibeos_tools::environments::{self, BackendSettings};

fn request(code: &str) -> ExecutionRequest {
    request_from(
        code,
        "ssh-task",
        &[
            ("LANG", "C.UTF-8"),
            ("MY_SECRET_TOKEN", "hunter2-host-secret"),
            ("VIBEOS_HOME", "/host-only/vibeos-home"),
        ],
    )
}

/// A `VIBEOS_HOME` whose config.yaml selects the ssh backend on `sshd`, for a host process
/// (CLI) the test starts.
fn vibeos_home_for(sshd: &Sshd) -> tempfile::TempDir {
    let vhome = tempfile::tempdir().unwrap();
    let d = sshd.dir.path();
    std::fs::write(
        vhome.path().join("config.yaml"),
        format!(
            "terminal:\n  backend: ssh\n  ssh_host: 127.0.0.1\n  ssh_port: {}\n  ssh_user: {SSH_USER}\n  ssh_key: {}\n  ssh_known_hosts: {}\n",
            sshd.port,
            d.join("userkey").display(),
            d.join("known_hosts").display()
        ),
    )
    .unwrap();
    vhome
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
    let Some((_ssh, sshd)) = super::ssh_turn(true) else {
        return;
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
    // This host's files are not over there: its VIBEOS_HOME is not sent.
    assert!(!r.output.contains("/host-only/vibeos-home"), "{}", r.output);
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

/// Sets the test user's login shell to bash (which reads `~/.bashrc` even for `ssh host cmd`)
/// and back to sh when dropped.
struct BashLogin;

impl BashLogin {
    fn set() -> Result<BashLogin, String> {
        let out = Command::new("usermod")
            .args(["-s", "/bin/bash", SSH_USER])
            .output()
            .map_err(|e| format!("cannot run usermod: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(BashLogin)
    }
}

impl Drop for BashLogin {
    fn drop(&mut self) {
        for _ in 0..20 {
            let ok = Command::new("usermod")
                .args(["-s", "/bin/sh", SSH_USER])
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// The remote work dirs (`/tmp/vibeos-exec-<id>`, not the environment dirs) the test user owns.
fn remote_work_dirs() -> Vec<String> {
    let out = Command::new("find")
        .args([
            "/tmp",
            "-maxdepth",
            "1",
            "-user",
            SSH_USER,
            "-name",
            "vibeos-exec-*",
            "!",
            "-name",
            "vibeos-exec-env-*",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Every process's command line on this machine (NULs as spaces).
/// The pids of this machine's vibeos-exec ssh masters for the sshd on `port`.
fn master_pids(port: u16) -> Vec<i32> {
    let port = format!(" -p {port} ");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            (cmd.contains("-fN")
                && cmd.contains("ControlPath=")
                && cmd.contains("vibeos-ssh-")
                && cmd.contains(&port))
            .then_some(pid)
        })
        .collect()
}

fn host_processes() -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .collect()
}

/// Everything the script started is gone on the host (a moment for the kernel to reap).
fn assert_none_left(tags: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ps = remote_processes();
        let left: Vec<&&str> = tags.iter().filter(|t| ps.contains(**t)).collect();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "left behind: {left:?}: {ps}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An ssh execution ends like a local one: the script's exit (not EOF on its output) decides
/// the end, its real wait status is reported (-N for signal N, not ssh's 255), nothing it
/// started outlives it (not even what left its process group), its work dir is removed however
/// it ended, `terminal` sees the remote HOME, a bad `terminal.cwd` is a clear error, and a
/// `~/.bashrc` that prints does not break anything.
#[test]
fn ssh_executions_end_like_local_ones() {
    let Some((_ssh, sshd)) = super::ssh_turn(true) else {
        return;
    };
    let _bash = match BashLogin::set() {
        Ok(b) => b,
        Err(e) => return unavailable(&format!("cannot give {SSH_USER} a bash login: {e}")),
    };
    let home = sshd.dir.path().join("home");
    std::fs::write(
        home.join(".bashrc"),
        "echo hello-from-bashrc\necho bashrc-on-stderr >&2\n",
    )
    .unwrap();
    let rt = runtime();
    environments::activate(ssh_backend(&sshd, sshd.port));
    let before = remote_work_dirs();

    // Start-up noise of the login shell reaches neither the protocol nor the output.
    let r = run(&rt, request("import os\nprint('cwd', os.getcwd())"));
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.output.trim(), format!("cwd {}", home.display()), "{r:?}");
    // Nor the tool agent's own commands: Debian's bash read the .bashrc for their `bash -c`
    // (the agent runs in the login's environment, SSH_CLIENT set, shell level 0).
    let t = agent_call(
        "task-bashrc",
        "terminal",
        serde_json::json!({"command": "echo clean"}),
    );
    assert_eq!(t["output"], "clean\n", "{t}");

    // A signal death while a child still holds the output: reported as local reports it, at
    // once, and the child is gone.
    let started = Instant::now();
    let mut req = request("import subprocess, os\nsubprocess.Popen(['sleep', '8383'])\nprint('x', flush=True)\nos.kill(os.getpid(), 9)");
    req.timeout = Duration::from_secs(10);
    let r = run(&rt, req);
    assert_eq!(r.status, Status::Error, "{r:?}");
    assert_eq!(r.exit_code, Some(-9), "{r:?}");
    assert!(
        r.error
            .as_deref()
            .unwrap_or("")
            .contains("killed by signal 9"),
        "{r:?}"
    );
    assert!(r.output.starts_with("x\n"), "{r:?}");
    assert!(!r.output.contains("bashrc"), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(8), "{r:?}");
    assert_none_left(&["sleep 8383"]);

    // os._exit(0) with a child holding the output: success, and the work dir removed.
    let started = Instant::now();
    let r = run(&rt, request("import subprocess, os\nsubprocess.Popen(['sleep', '8384'])\nprint('done', flush=True)\nos._exit(0)"));
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(8), "{r:?}");
    assert_none_left(&["sleep 8384"]);

    // A process in a session of its own (setsid) and one that double-forked away from the
    // script's group: the script's normal end ends them, output intact.
    let escape = "import os, subprocess, time\nsubprocess.Popen(['setsid', 'sleep', '8385'])\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execvp('sleep', ['sleep', '8386'])\n    os._exit(0)\nos.wait()\ntime.sleep(0.5)\n";
    let mut req = request(&format!("{escape}print('end')"));
    req.timeout = Duration::from_secs(5);
    let started = Instant::now();
    let r = run(&rt, req);
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.output.trim(), "end", "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(4), "{r:?}");
    assert_none_left(&["sleep 8385", "sleep 8386"]);

    // The same on a timeout, which reports SIGTERM's -15 as local does.
    let mut req = request(&format!(
        "{}print('up', flush=True)\ntime.sleep(600)",
        escape.replace("838", "848")
    ));
    req.timeout = Duration::from_secs(2);
    req.kill_grace = Duration::from_secs(1);
    let r = run(&rt, req);
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    assert_eq!(r.exit_code, Some(-15), "{r:?}");
    assert!(r.output.starts_with("up\n"), "{r:?}");
    assert_none_left(&["sleep 8485", "sleep 8486"]);

    // terminal commands get the backend's HOME, as the script does.
    let r = run(
        &rt,
        request("from vibeos_tools import terminal\nprint(terminal('cd && pwd; echo HOME=[$HOME]')['output'])"),
    );
    assert_eq!(r.status, Status::Success, "{r:?}");
    let h = home.display().to_string();
    assert!(r.output.contains(&format!("{h}\nHOME=[{h}]")), "{r:?}");

    // A request's own session dir is the working dir over there, for the script and for its
    // terminal calls; a relative one is refused by name.
    let proj = home.join("proj dir");
    std::fs::create_dir(&proj).unwrap();
    let _ = Command::new("chown").arg(SSH_USER).arg(&proj).status();
    let mut req = request(
        "import os\nfrom vibeos_tools import terminal\nprint(os.getcwd())\nprint(terminal('pwd')['output'].strip())",
    );
    req.backend_cwd = Some(proj.display().to_string());
    let r = run(&rt, req);
    assert_eq!(r.status, Status::Success, "{r:?}");
    let p = proj.display().to_string();
    assert_eq!(r.output, format!("{p}\n{p}\n"), "{r:?}");
    let mut req = request("print(1)");
    req.backend_cwd = Some("proj dir".into());
    let r = run(&rt, req);
    assert_eq!(r.status, Status::Error, "{r:?}");
    assert!(
        r.error.as_deref().unwrap_or("").contains("absolute"),
        "{r:?}"
    );

    // The master lost mid-run: the script is stopped with its session, and the result says
    // the connection ended rather than "the script exited with code 255".
    std::thread::scope(|scope| {
        let running = scope.spawn(|| {
            run(
                &rt,
                request(
                    "import subprocess\nprint('up', flush=True)\nsubprocess.run(['sleep', '8484'])",
                ),
            )
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while !remote_processes().contains("sleep 8484") && !running.is_finished() {
            assert!(Instant::now() < deadline, "the script did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(300));
        for pid in master_pids(sshd.port) {
            // SAFETY: kill(2) of an ssh master process this test's environment started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let r = running.join().unwrap();
        assert_eq!(r.status, Status::Error, "{r:?}");
        let error = r.error.clone().unwrap_or_default();
        assert!(error.contains("connection to the ssh host ended"), "{r:?}");
        assert_eq!(r.exit_code, None, "{r:?}");
        assert!(r.output.contains("up"), "{r:?}");
    });
    assert_none_left(&["sleep 8484"]);
    environments::shutdown();

    // A terminal.cwd that does not exist there: a clear error naming it, nothing left.
    let mut bad = ssh_backend(&sshd, sshd.port);
    bad.cwd = Some("/nonexistent/dir".into());
    environments::activate(bad);
    let r = run(&rt, request("print(1)"));
    assert_eq!(r.status, Status::Error, "{r:?}");
    let err = r.error.clone().unwrap_or_default();
    assert!(
        err.contains("terminal.cwd") && err.contains("/nonexistent/dir"),
        "{r:?}"
    );
    assert!(
        !err.contains("Traceback") && !r.output.contains("Traceback"),
        "{r:?}"
    );
    assert_eq!(remote_work_dirs(), before, "work dirs left on the host");
    environments::shutdown();

    // A terminal.python that is not there is named, not blamed on the script ("exited with
    // code 127").
    let mut no_python = ssh_backend(&sshd, sshd.port);
    no_python.python = "/nonexistent/python3".into();
    environments::activate(no_python);
    let r = run(&rt, request("print(1)"));
    assert_eq!(r.status, Status::Error, "{r:?}");
    let err = r.error.clone().unwrap_or_default();
    assert!(
        err.contains("terminal.python") && err.contains("/nonexistent/python3"),
        "{r:?}"
    );
    assert_eq!(r.exit_code, None, "{r:?}");
    environments::shutdown();

    // A passed variable whose value is not UTF-8 arrives unchanged, as in a local child.
    environments::activate(ssh_backend(&sshd, sshd.port));
    let mut req = request("import os\nprint(os.environb.get(b'MY_BYTES'))");
    if let Some(env) = req.base_env.as_mut() {
        use std::os::unix::ffi::OsStringExt;
        env.push((
            "MY_BYTES".into(),
            std::ffi::OsString::from_vec(b"a\xffb".to_vec()),
        ));
    }
    req.env_passthrough = vec!["MY_BYTES".into()];
    let r = run(&rt, req);
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.output.trim(), "b'a\\xffb'", "{r:?}");
    environments::shutdown();
    environments::activate(BackendSettings::default());

    // A host killed mid-run: its script ends with the ssh session (the bootstrap's lifeline),
    // and `backends gc` ends the ControlMaster it left and removes its dirs.
    let vhome = vibeos_home_for(&sshd);
    let script = vhome.path().join("s.py");
    std::fs::write(
        &script,
        "import subprocess, time\nsubprocess.Popen(['sleep', '8787'])\ntime.sleep(600)",
    )
    .unwrap();
    let vibeos = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vibeos-exec"));
        cmd.args(args)
            .env("VIBEOS_HOME", vhome.path())
            .env("VIBEOS_AGENT_BINARY", env!("CARGO_BIN_EXE_vibeos-exec"));
        cmd
    };
    let mut host = vibeos(&["run", "--json"])
        .arg(&script)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !remote_processes().contains("sleep 8787") {
        assert!(Instant::now() < deadline, "the script did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    host.kill().unwrap();
    host.wait().unwrap();
    assert_none_left(&["sleep 8787", "script.py"]);
    let masters = || -> Vec<String> {
        host_processes()
            .into_iter()
            .filter(|c| {
                c.contains("-fN") && c.contains("ControlPath=") && c.contains("vibeos-ssh-")
            })
            .collect()
    };
    assert!(!masters().is_empty(), "the crashed host left no master?");
    let gc = vibeos(&["backends", "gc", "--json"]).output().unwrap();
    let report: serde_json::Value =
        serde_json::from_slice(&gc.stdout).unwrap_or_else(|_| panic!("{gc:?}"));
    let removed = report["backends"]["ssh"]["removed"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(!removed.is_empty(), "{report}");
    // An ssh-only sweep asked no docker engine and names none.
    assert!(
        report["backends"].get("docker").is_none() && report.get("engine").is_none(),
        "{report}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    for dir in removed.iter().filter_map(|d| d.as_str()) {
        assert!(!Path::new(dir).exists(), "{report}");
        while masters().iter().any(|m| m.contains(dir)) {
            assert!(Instant::now() < deadline, "master left: {:?}", masters());
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let env_dirs = Command::new("find")
        .args([
            "/tmp",
            "-maxdepth",
            "1",
            "-user",
            SSH_USER,
            "-name",
            "vibeos-exec-env-*",
        ])
        .output()
        .unwrap();
    assert!(env_dirs.stdout.is_empty(), "{env_dirs:?}");
    assert_eq!(remote_work_dirs(), before, "work dirs left on the host");

    // `run --cwd` names the working dir over there (it overrides terminal.cwd), for the script
    // and its terminal calls; a relative one is a usage error, said before the host is reached.
    std::fs::write(
        &script,
        "import os\nfrom vibeos_tools import terminal\nprint(os.getcwd())\nprint(terminal('pwd')['output'].strip())",
    )
    .unwrap();
    let out = vibeos(&["run", "--cwd"])
        .arg(&proj)
        .arg(&script)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{p}\n{p}\n"),
        "{out:?}"
    );
    let out = vibeos(&["run", "--cwd", "proj dir"])
        .arg(&script)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--cwd proj dir") && err.contains("absolute"),
        "{err}"
    );
    assert_eq!(remote_work_dirs(), before, "work dirs left on the host");

    // `env audit` with the ssh backend selected tells what the script over there gets: this
    // host's PATH, HOME and XDG_* stay here, and nothing the script finds set is unlisted.
    let caller_env = |cmd: &mut Command| {
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", "/root")
            .env("XDG_RUNTIME_DIR", "/run/user/0")
            .env("LANG", "C.UTF-8")
            .env("VIBEOS_HOME", vhome.path())
            .env("VIBEOS_AGENT_BINARY", env!("CARGO_BIN_EXE_vibeos-exec"));
    };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vibeos-exec"));
    caller_env(&mut cmd);
    let out = cmd.args(["env", "audit", "--json"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let audit: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(audit["backend"], "ssh", "{audit}");
    let variables = audit["variables"].as_array().unwrap();
    let kept = |name: &str| {
        variables
            .iter()
            .find(|v| v["name"] == name)
            .map(|v| v["kept"] == true)
    };
    assert_eq!(kept("PATH"), Some(false), "{audit}");
    assert_eq!(kept("HOME"), Some(false), "{audit}");
    assert_eq!(kept("XDG_RUNTIME_DIR"), Some(false), "{audit}");
    assert_eq!(kept("LANG"), Some(true), "{audit}");
    let listed: Vec<String> = audit["set_for_child"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["name"].as_str().map(str::to_string))
        .collect();
    std::fs::write(
        &script,
        "import json, os\nprint(json.dumps(dict(os.environ)))\n",
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vibeos-exec"));
    caller_env(&mut cmd);
    let out = cmd.arg("run").arg(&script).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let seen: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{out:?}"));
    for name in seen.keys() {
        assert!(
            kept(name) == Some(true) || listed.contains(name),
            "the script over there sees {name}, which env audit does not list: {audit}"
        );
    }
    assert_eq!(seen["HOME"], home.display().to_string(), "{seen:?}");
    assert!(!seen.contains_key("XDG_RUNTIME_DIR"), "{seen:?}");
}

/// A direct (agent) tool call of task `task`, as a host makes it.
fn agent_call(task: &str, name: &str, args: serde_json::Value) -> serde_json::Value {
    let mut ctx = vibeos_tools::ToolContext::agent("/");
    ctx.task_id = Some(task.into());
    let text = vibeos_tools::registry().handle_function_call(name, &args, &ctx);
    serde_json::from_str(&text).unwrap()
}

/// A command that leaves `sleep TAG1` (its group), `sleep TAG2` (nohup) and `sleep TAG3` (a
/// session of its own) running, and returns at once.
fn leaving_behind(tag: &str) -> String {
    format!(
        "sleep {tag}1 >/dev/null 2>&1 & nohup sleep {tag}2 >/dev/null 2>&1 & setsid sleep {tag}3 >/dev/null 2>&1 & echo left"
    )
}

/// Waits until every `tags` process runs on the host.
fn assert_all_running(tags: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ps = remote_processes();
        if tags.iter().all(|t| ps.contains(t.as_str())) {
            return;
        }
        assert!(Instant::now() < deadline, "not all of {tags:?} run: {ps}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn tags(tag: &str) -> Vec<String> {
    (1..=3).map(|n| format!("sleep {tag}{n}")).collect()
}

/// What a direct `terminal` command leaves running over ssh (`cmd &`, `nohup cmd &`, `setsid`)
/// ends with the environment, however it ends: stopped at host exit, stopped after
/// `lifetime_seconds` idle, and with a crashed host (the agent's lifeline closes; `backends
/// gc` ends the master). Docker gets this from the container's end; ssh has no such end, and
/// the agent only ended its background registry.
#[test]
fn ssh_what_direct_commands_leave_running_ends_with_the_environment() {
    let Some((_ssh, sshd)) = super::ssh_turn(true) else {
        return;
    };

    // Stopped at host exit.
    environments::activate(ssh_backend(&sshd, sshd.port));
    let r = agent_call(
        "leftovers",
        "terminal",
        serde_json::json!({"command": leaving_behind("7171")}),
    );
    assert!(r["output"].as_str().unwrap_or("").contains("left"), "{r}");
    let left = tags("7171");
    assert_all_running(&left);
    environments::shutdown();
    assert_none_left(&left.iter().map(String::as_str).collect::<Vec<_>>());

    // Stopped after lifetime_seconds idle.
    environments::activate(BackendSettings {
        lifetime: Duration::from_secs(1),
        ..ssh_backend(&sshd, sshd.port)
    });
    let r = agent_call(
        "leftovers",
        "terminal",
        serde_json::json!({"command": leaving_behind("7272")}),
    );
    assert!(r["output"].as_str().unwrap_or("").contains("left"), "{r}");
    let left = tags("7272");
    assert_all_running(&left);
    let deadline = Instant::now() + Duration::from_secs(20);
    while environments::active().is_some_and(|a| !a.live_tasks().is_empty()) {
        assert!(
            Instant::now() < deadline,
            "the idle environment was not stopped"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_none_left(&left.iter().map(String::as_str).collect::<Vec<_>>());
    environments::activate(BackendSettings::default());

    // A crashed host: `serve` killed with SIGKILL after a direct terminal call.
    let vhome = vibeos_home_for(&sshd);
    let vibeos = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vibeos-exec"));
        cmd.args(args)
            .env("VIBEOS_HOME", vhome.path())
            .env("VIBEOS_AGENT_BINARY", env!("CARGO_BIN_EXE_vibeos-exec"));
        cmd
    };
    let mut host = vibeos(&["serve", "--toolsets", "terminal"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut to_host = host.stdin.take().unwrap();
    let mut from_host = std::io::BufReader::new(host.stdout.take().unwrap());
    let mut send = |line: &str| {
        use std::io::Write;
        to_host.write_all(line.as_bytes()).unwrap();
        to_host.write_all(b"\n").unwrap();
    };
    let mut reply = || -> serde_json::Value {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut from_host, &mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    send(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"crash","version":"1"}}}"#,
    );
    reply();
    send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    // execute_code through the server runs in the backend's working dir, never in the host's
    // session dir (a host path means nothing over there).
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "execute_code", "arguments": {"code": "import os\nprint(os.getcwd())"}}});
    send(&call.to_string());
    let r = reply();
    let home = sshd.dir.path().join("home").display().to_string();
    assert_eq!(
        r["result"]["structuredContent"]["output"],
        format!("{home}\n"),
        "{r}"
    );
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "terminal", "arguments": {"command": leaving_behind("7373")}}});
    send(&call.to_string());
    let r = reply();
    assert!(r.to_string().contains("left"), "{r}");
    let left = tags("7373");
    assert_all_running(&left);
    host.kill().unwrap();
    host.wait().unwrap();
    let gc = vibeos(&["backends", "gc", "--json"]).output().unwrap();
    assert!(gc.status.success(), "{gc:?}");
    assert_none_left(&left.iter().map(String::as_str).collect::<Vec<_>>());
}

/// The agent cached on an ssh host is used only when it is whole: a copy cut short broke every
/// tool of every later environment for good ("it exited before listening"), since the cache
/// was trusted by its name alone. It is uploaded again, to a temp name renamed into place.
#[test]
fn ssh_a_damaged_cached_agent_is_uploaded_again() {
    let Some((_ssh, sshd)) = super::ssh_turn(true) else {
        return;
    };
    let cache = sshd.dir.path().join("home/.cache/vibeos-exec");
    let size = std::fs::metadata(env!("CARGO_BIN_EXE_vibeos-exec"))
        .unwrap()
        .len();
    let cached = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&cache)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let works = |what: &str| {
        environments::activate(ssh_backend(&sshd, sshd.port));
        let r = agent_call(
            "cache",
            "terminal",
            serde_json::json!({"command": "echo agent-ok"}),
        );
        assert_eq!(r["output"], "agent-ok\n", "{what}: {r}");
        environments::shutdown();
        let files = cached();
        assert_eq!(
            files.len(),
            1,
            "{what}: one copy, no temp file left: {files:?}"
        );
        assert_eq!(std::fs::metadata(&files[0]).unwrap().len(), size, "{what}");
        files[0].clone()
    };
    let agent = works("first upload");
    // Cut short, as a full disk or a killed copy would leave it (still executable), into its
    // code: it cannot run.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&agent)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    works("after the cached copy was cut short");
    environments::activate(BackendSettings::default());
}

/// SIGINT while the ssh master still waits for a host that never answers ends `run` at once
/// with 130 (it waited out the 30 s connect timeout and exited 1), and leaves no ssh client
/// behind: the start is abandoned, not left to finish unowned.
#[test]
fn ssh_an_interrupt_while_the_host_does_not_answer_ends_the_run_at_once() {
    if vibeos_testkit::backends::which("ssh").is_none() {
        return unavailable("no ssh client on PATH");
    }
    // Listening but never accepting: the kernel completes the connection and ssh waits for
    // a banner that never comes.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let vhome = tempfile::tempdir().unwrap();
    let key = vhome.path().join("key");
    std::fs::write(&key, "not a key\n").unwrap();
    std::fs::write(
        vhome.path().join("config.yaml"),
        format!(
            "terminal:\n  backend: ssh\n  ssh_host: 127.0.0.1\n  ssh_port: {port}\n  ssh_user: nobody\n  ssh_key: {}\n  ssh_known_hosts: {}\n",
            key.display(),
            vhome.path().join("known_hosts").display()
        ),
    )
    .unwrap();
    let script = vhome.path().join("s.py");
    std::fs::write(&script, "print('never')\n").unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_vibeos-exec"))
        .args(["run", "--json"])
        .arg(&script)
        .env("VIBEOS_HOME", vhome.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let sent = Instant::now();
    // SAFETY: kill(2) on the pid of a child we spawned and have not waited for yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let took = sent.elapsed();
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "interrupted", "{result}");
    assert_eq!(result["backend"], "ssh", "{result}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let left: Vec<String> = host_processes()
        .into_iter()
        .filter(|c| c.starts_with("ssh ") && c.contains(&format!(" -p {port} ")))
        .collect();
    assert!(left.is_empty(), "ssh clients left behind: {left:?}");
    drop(silent);
}

/// A script that SIGKILLs or SIGSTOPs its bootstrap and leaves a `setsid` child holding its
/// output (finding 2 of stop 54): the timeout still ends it after the grace (it took 24.5 s for
/// a 10 s timeout), the output printed before is kept, and nothing of it — neither the
/// escaped `sleep` (it ran on with ppid 1) nor a stopped bootstrap — is left on the host.
#[test]
fn ssh_a_script_that_kills_or_stops_its_bootstrap_ends_at_its_timeout() {
    let Some((_ssh, sshd)) = super::ssh_turn(true) else {
        return;
    };
    let rt = runtime();
    environments::activate(ssh_backend(&sshd, sshd.port));
    for (tag, to_parent) in [
        ("4903", "os.kill(os.getppid(), signal.SIGKILL)"),
        ("4904", "os.kill(os.getppid(), signal.SIGSTOP)"),
    ] {
        let code = format!(
            "import os, time, signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nif os.fork() == 0:\n    os.setsid(); time.sleep(0.3); os.execvp('sleep', ['sleep', '{tag}'])\nprint('started', flush=True)\ntime.sleep(0.1); {to_parent}; time.sleep(100)\n"
        );
        let mut req = request(&code);
        req.timeout = Duration::from_secs(4);
        req.kill_grace = Duration::from_secs(2);
        let started = Instant::now();
        let r = run(&rt, req);
        let took = started.elapsed();
        assert_eq!(r.status, Status::Timeout, "{tag}: {r:?}");
        assert!(r.output.contains("started"), "{tag}: output lost: {r:?}");
        assert!(took < Duration::from_secs(12), "{tag}: took {took:?}");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let ps = remote_processes();
            let stopped = Command::new("ps")
                .args(["-u", SSH_USER, "-o", "stat=,args="])
                .output()
                .unwrap();
            let stopped = String::from_utf8_lossy(&stopped.stdout)
                .lines()
                .filter(|l| l.starts_with('T'))
                .map(str::to_string)
                .collect::<Vec<_>>();
            if !ps.contains(&format!("sleep {tag}")) && stopped.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{tag}: left running: {ps} stopped: {stopped:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    environments::shutdown();
    environments::activate(BackendSettings::default());
}

/// Starting an environment whose cached agent copy is valid does not read the host's agent
/// binary (finding 3 of stop 54: every start read all ~144 MB of it, twice in memory). Seen
/// through its access time: set in the past, with its ctime now, any read moves it (relatime).
#[test]
fn ssh_a_valid_cached_agent_is_not_read_again() {
    let Some((_ssh, sshd)) = super::ssh_turn(true) else {
        return;
    };
    let host = tempfile::tempdir().unwrap();
    let agent = host.path().join("vibeos-exec");
    std::fs::copy(env!("CARGO_BIN_EXE_vibeos-exec"), &agent).unwrap();
    let start = || {
        environments::activate(BackendSettings {
            agent_binary: Some(agent.clone()),
            ..ssh_backend(&sshd, sshd.port)
        });
        let r = agent_call(
            "atime",
            "terminal",
            serde_json::json!({"command": "echo agent-ok"}),
        );
        assert_eq!(r["output"], "agent-ok\n", "{r}");
        environments::shutdown();
    };
    // Peak memory of this process (a fresh one, see `in_own_process`): the upload streams.
    let peak_kb = || -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    };
    let peak_before = peak_kb();
    start();
    let touched = Command::new("touch")
        .args(["-a", "-d", "2 days ago"])
        .arg(&agent)
        .status()
        .unwrap();
    assert!(touched.success());
    use std::os::unix::fs::MetadataExt;
    let before = std::fs::metadata(&agent).unwrap().atime();
    start();
    let after = std::fs::metadata(&agent).unwrap().atime();
    assert_eq!(
        before, after,
        "the agent binary was read although its copy was cached"
    );
    let size_kb = std::fs::metadata(&agent).unwrap().len() / 1024;
    let grown = peak_kb().saturating_sub(peak_before);
    assert!(
        grown < size_kb / 2,
        "peak memory grew by {grown} kB for a {size_kb} kB agent binary: it was held in memory"
    );
    environments::activate(BackendSettings::default());
}

/// Pids of the test user's sshd session processes (`sshd: USER@notty`): stopping them stalls
/// every connection of that user while the TCP connections stay open.
fn user_sshd_sessions() -> Vec<i32> {
    let out = Command::new("ps")
        .args(["-u", SSH_USER, "-o", "pid=,args="])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (pid, args) = l.trim().split_once(' ')?;
            args.trim().starts_with("sshd:").then(|| pid.parse().ok())?
        })
        .collect()
}

/// Sends `signal` to every pid of `pids`.
fn signal_all(pids: &[i32], signal: i32) {
    for pid in pids {
        // SAFETY: kill(2) of an sshd session process of this test's sshd.
        unsafe { libc::kill(*pid, signal) };
    }
}

/// A host that stops answering (its sshd session stopped; the TCP connection stays open) ends
/// a direct tool call and an execution within seconds, with a clear error and the output
/// printed before the stall (stop 55, finding 2: `read_file` hung over 90 s, an execution with
/// an 8 s timeout returned after 61–73 s). The next call connects again.
#[test]
fn ssh_a_stalled_host_ends_calls_within_seconds() {
    let Some((_ssh, sshd)) = super::ssh_turn(true) else {
        return;
    };
    let rt = runtime();
    environments::activate(ssh_backend(&sshd, sshd.port));
    let r = agent_call(
        "stall",
        "terminal",
        serde_json::json!({"command": "echo warm"}),
    );
    assert_eq!(r["output"], "warm\n", "{r}");
    let stopped = user_sshd_sessions();
    assert!(!stopped.is_empty());
    signal_all(&stopped, libc::SIGSTOP);
    let started = Instant::now();
    let r = agent_call(
        "stall",
        "read_file",
        serde_json::json!({"path": "/etc/hostname"}),
    );
    let took = started.elapsed();
    signal_all(&stopped, libc::SIGCONT);
    assert!(r.get("error").is_some(), "{r}");
    assert!(
        took < Duration::from_secs(30),
        "read_file took {took:?}: {r}"
    );

    // An execution that printed, then the host stalls.
    std::thread::scope(|scope| {
        let running = scope.spawn(|| {
            let mut req = request("import time\nprint('before', flush=True)\ntime.sleep(60)\n");
            req.timeout = Duration::from_secs(8);
            let started = Instant::now();
            (run(&rt, req), started.elapsed())
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while !remote_processes().contains("vibeos-remote-scope") && !running.is_finished() {
            assert!(Instant::now() < deadline, "the script did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_millis(1500));
        let stopped = user_sshd_sessions();
        signal_all(&stopped, libc::SIGSTOP);
        let (r, took) = running.join().unwrap();
        signal_all(&stopped, libc::SIGCONT);
        assert_ne!(r.status, Status::Success, "{r:?}");
        assert!(took < Duration::from_secs(35), "took {took:?}: {r:?}");
        assert!(r.output.contains("before"), "output lost: {r:?}");
    });
    // And the environment works again.
    let r = agent_call(
        "stall",
        "terminal",
        serde_json::json!({"command": "echo again"}),
    );
    let again = agent_call(
        "stall",
        "terminal",
        serde_json::json!({"command": "echo again"}),
    );
    assert!(
        r["output"] == "again\n" || again["output"] == "again\n",
        "{r} {again}"
    );
    environments::shutdown();
    environments::activate(BackendSettings::default());
}

/// A lost master connection and a killed tool agent are noticed and started again on the next
/// call, for direct tool calls and executions alike (stop 55, finding 3: every later call
/// failed with "Control socket connect(...): No such file" or for good after the agent died).
/// A script that kills its bootstrap while the master is alive is not reported as a lost
/// connection (finding 6).
#[test]
fn ssh_a_lost_master_or_agent_is_started_again() {
    let Some((_ssh, sshd)) = super::ssh_turn(true) else {
        return;
    };
    let rt = runtime();
    environments::activate(ssh_backend(&sshd, sshd.port));
    let echo = |word: &str| {
        agent_call(
            "lost",
            "terminal",
            serde_json::json!({"command": format!("echo {word}")}),
        )
    };
    assert_eq!(echo("one")["output"], "one\n");
    let r = run(
        &rt,
        request("from vibeos_tools import terminal\nprint(terminal('echo via-script')['output'])"),
    );
    assert!(r.output.contains("via-script"), "{r:?}");
    for pid in master_pids(sshd.port) {
        // SAFETY: kill(2) of an ssh master process this test's environment started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let lost = echo("two");
    if lost["output"] != "two\n" {
        let text = lost.to_string();
        assert!(!text.contains("Control socket connect"), "{text}");
    }
    let three = echo("three");
    assert_eq!(
        three["output"], "three\n",
        "master not reconnected: the call after the loss got {lost}, the next {three}"
    );
    let r = run(
        &rt,
        request(
            "from vibeos_tools import terminal\nprint(terminal('echo via-script-2')['output'])",
        ),
    );
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.output.contains("via-script-2"), "{r:?}");

    // A script kills the tool agent.
    let kill_agent = "import os, signal\nfor p in os.listdir('/proc'):\n    try:\n        c = open('/proc/%s/cmdline' % p, 'rb').read()\n        if b'backend-agent' in c and os.stat('/proc/' + p).st_uid == os.getuid():\n            os.kill(int(p), signal.SIGKILL)\n    except (OSError, ValueError):\n        pass\nprint('killed')\n";
    let r = run(&rt, request(kill_agent));
    assert!(r.output.contains("killed"), "{r:?}");
    let lost = echo("four");
    if lost["output"] != "four\n" {
        assert!(lost.get("error").is_some(), "{lost}");
    }
    let five = echo("five");
    assert_eq!(
        five["output"], "five\n",
        "agent not restarted: {lost} {five}"
    );

    // A script that kills its bootstrap, the master alive: not a lost connection.
    let r = run(&rt, request("import os, signal\nprint('started', flush=True)\nos.kill(os.getppid(), signal.SIGKILL)\n"));
    assert_ne!(r.status, Status::Success, "{r:?}");
    let error = r.error.clone().unwrap_or_default();
    assert!(!error.contains("connection to the ssh host ended"), "{r:?}");
    assert!(error.contains("bootstrap"), "{r:?}");
    environments::shutdown();
    environments::activate(BackendSettings::default());
}

/// Uploading a new agent copy removes the older copies of that naming scheme unused for over
/// a day, and nothing else (stop 55, finding 5: every host build left another ~144 MB copy on
/// each host): a recent copy (another host may run it), a `.part` being written and a file of
/// another name stay.
#[test]
fn ssh_an_upload_prunes_old_agent_copies_only() {
    let Some((_ssh, sshd)) = super::ssh_turn(true) else {
        return;
    };
    let cache = sshd.dir.path().join("home/.cache/vibeos-exec");
    std::fs::create_dir_all(&cache).unwrap();
    for (name, age) in [
        ("agent-11-11", Some("2 days ago")),
        ("agent-22-22", None),
        ("agent-33-33.part.7", Some("2 days ago")),
        ("notes", Some("2 days ago")),
    ] {
        let path = cache.join(name);
        std::fs::write(&path, "old").unwrap();
        if let Some(age) = age {
            assert!(Command::new("touch")
                .args(["-d", age])
                .arg(&path)
                .status()
                .unwrap()
                .success());
        }
    }
    assert!(Command::new("chown")
        .args(["-R", SSH_USER])
        .arg(sshd.dir.path().join("home/.cache"))
        .status()
        .unwrap()
        .success());
    // A binary of its own, with an mtime no copy has: it is uploaded.
    let host = tempfile::tempdir().unwrap();
    let agent = host.path().join("vibeos-exec");
    std::fs::copy(env!("CARGO_BIN_EXE_vibeos-exec"), &agent).unwrap();
    environments::activate(BackendSettings {
        agent_binary: Some(agent.clone()),
        ..ssh_backend(&sshd, sshd.port)
    });
    let r = agent_call(
        "prune",
        "terminal",
        serde_json::json!({"command": "echo agent-ok"}),
    );
    assert_eq!(r["output"], "agent-ok\n", "{r}");
    environments::shutdown();
    environments::activate(BackendSettings::default());
    let mut left: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    let size = std::fs::metadata(&agent).unwrap().len();
    assert!(!left.contains(&"agent-11-11".to_string()), "{left:?}");
    for kept in ["agent-22-22", "agent-33-33.part.7", "notes"] {
        assert!(left.contains(&kept.to_string()), "{kept}: {left:?}");
    }
    assert!(
        left.iter()
            .any(|n| n.starts_with(&format!("agent-{size}-"))),
        "{left:?}"
    );
}

/// A direct `terminal` call whose client cancels it (an MCP `notifications/cancelled`, which
/// `serve` turns into `local::cancel_call`) kills the command over there, as it does locally
/// (stop 56's probe: on docker the `sleep 335` ran on to its 180 s timeout). A call cancelled
/// before it is forwarded runs nothing.
#[test]

fn ssh_a_cancelled_direct_terminal_call_kills_its_remote_command() {
    let Some((_ssh, sshd)) = super::ssh_turn(true) else {
        return;
    };
    environments::activate(ssh_backend(&sshd, sshd.port));
    assert_eq!(
        agent_call(
            "cancel",
            "terminal",
            serde_json::json!({"command": "echo up"})
        )["output"],
        "up\n"
    );
    let call = 7_700_001;
    let started = Instant::now();
    let running = std::thread::spawn(move || {
        environments::local::in_call(call, || {
            agent_call(
                "cancel",
                "terminal",
                serde_json::json!({"command": "sleep 3351; echo done"}),
            )
        })
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while !remote_processes().contains("sleep 3351") {
        assert!(Instant::now() < deadline, "the command did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    environments::local::cancel_call(call);
    let r = running.join().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the cancelled call ran {:?}: {r}",
        started.elapsed()
    );
    assert_ne!(r["output"], "done\n", "{r}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while remote_processes().contains("sleep 3351") {
        assert!(
            Instant::now() < deadline,
            "still running over there: {}",
            remote_processes()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Cancelled before it was forwarded: refused, nothing started.
    let call = 7_700_002;
    environments::local::cancel_call(call);
    let r = environments::local::in_call(call, || {
        agent_call(
            "cancel",
            "terminal",
            serde_json::json!({"command": "sleep 3352"}),
        )
    });
    assert!(r.to_string().contains("cancelled"), "{r}");
    assert!(!remote_processes().contains("sleep 3352"));
    assert_eq!(
        agent_call(
            "cancel",
            "terminal",
            serde_json::json!({"command": "echo still"})
        )["output"],
        "still\n"
    );
    environments::shutdown();
    environments::activate(BackendSettings::default());
}

/// A hardened server that forwards no UNIX socket fails every execution (each one's tool channel
/// is such a forward), even one that calls no tool: the error names the server setting, and
/// nothing runs or is left over there.
#[test]
fn ssh_a_server_refusing_socket_forwards_is_named_in_the_error() {
    let _turn = super::ssh_lock();
    let sshd = match vibeos_testkit::backends::start_sshd_with(&["AllowStreamLocalForwarding=no"]) {
        Ok(sshd) => sshd,
        Err(why) => return unavailable(&why),
    };
    let vhome = vibeos_home_for(&sshd);
    let script = vhome.path().join("s.py");
    std::fs::write(&script, "print('ran')\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vibeos-exec"))
        .args(["run", "--json"])
        .arg(&script)
        .env("VIBEOS_HOME", vhome.path())
        .env("VIBEOS_AGENT_BINARY", env!("CARGO_BIN_EXE_vibeos-exec"))
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(r["status"], "error", "{r}");
    let error = r["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("AllowStreamLocalForwarding yes"),
        "the error does not name the setting: {r}"
    );
    assert!(
        !r["output"].as_str().unwrap_or_default().contains("ran"),
        "{r}"
    );
    let left = remote_processes();
    assert!(!left.contains("python"), "{left}");
}
