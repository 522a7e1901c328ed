//! execute_code and the tools inside the docker backend, against a private dockerd started by
//! the test and a python3 image built from Debian packages: tools act in the container (not on
//! the host), remote env scrubbing, shell sessions, one container per task and reuse, timeout
//! and interrupt leave no process (checked with `ps` in the container), call budget and output
//! caps, idle stop, `backends gc`, and clear errors for a missing image and a dead daemon.
//!
//! The backend choice is process-wide, so everything runs in one test, phase by phase, in a
//! process of its own (`common::in_own_process`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::common::{
    backend, hanging_script, request_from, run, run_interrupted_after, run_into_timeout, runtime,
    HOST_ENV,
};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};
use vibeos_supervisor::{ExecutionRequest, Status};
use vibeos_testkit::backends::{plant_crashed_container, unavailable, Dockerd};
use vibeos_tools::environments::{self, BackendKind, BackendSettings};

const IMAGE: &str = "vibeos-py:test";

fn settings(binary: &str) -> BackendSettings {
    BackendSettings {
        docker_image: Some(IMAGE.into()),
        docker_binary: binary.into(),
        ..backend(BackendKind::Docker)
    }
}

fn request(code: &str, task: &str) -> ExecutionRequest {
    request_from(code, task, HOST_ENV)
}

/// How a docker test starts: in a process of its own ([`super::common::in_own_process`]), a
/// private dockerd with the python image and the CLI wrapper that reaches it. `None` when the
/// test has nothing left to do: this is the parent and the test ran in its child, or the
/// daemon cannot start here (recorded as a skip, a failure with `CI=true`).
fn docker_turn() -> Option<(Dockerd, String)> {
    if super::common::in_own_process() {
        return None;
    }
    match Dockerd::with_image(IMAGE) {
        Ok(d) => Some(d),
        Err(e) => {
            unavailable(&e);
            None
        }
    }
}

/// `vibeos-exec run --json --backend docker <extra> <script>` with `home` as VIBEOS_HOME, and
/// its one result object.
fn cli_result(
    home: &std::path::Path,
    extra: &[&std::ffi::OsStr],
    script: &std::path::Path,
) -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_vibeos-exec"))
        .args(["run", "--json", "--backend", "docker"])
        .args(extra)
        .arg(script)
        .env("VIBEOS_HOME", home)
        .env("VIBEOS_AGENT_BINARY", env!("CARGO_BIN_EXE_vibeos-exec"))
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{out:?}"))
}

/// Asserts that no process in task-a's container has any of `left` in its command line
/// (checked with `ps` there, through a script's terminal call).
fn assert_none_left(rt: &tokio::runtime::Runtime, left: &[&str]) {
    let ps = run(
        rt,
        request(
            "from vibeos_tools import terminal\nprint(terminal('ps -eo pid,cmd')['output'])",
            "task-a",
        ),
    );
    assert!(ps.output.contains("ps -eo"), "{ps:?}");
    for l in left {
        assert!(!ps.output.contains(l), "left behind: {l}: {}", ps.output);
    }
}

#[test]
fn docker_backend_end_to_end() {
    let Some((daemon, docker)) = docker_turn() else {
        return;
    };
    let rt = runtime();
    environments::activate(settings(&docker));

    // Tools act in the container: what write_file writes, open() sees; the host does not.
    let marker = format!("/srv/vibeos-test-{}.txt", std::process::id());
    let code = format!(
        r#"
from vibeos_tools import write_file, read_file, search_files, patch, terminal
import os, json
w = write_file("{marker}", "alpha\nbeta\n")
assert "error" not in w, w
print("open:", open("{marker}").read().split())
p = patch(path="{marker}", old_string="beta", new_string="gamma")
assert "error" not in p, p
print("read:", "gamma" in read_file("{marker}")["content"])
s = search_files("gamma", path="/srv")
print("search:", json.dumps(s)[:300])
t = terminal("cat {marker} && hostname")
print("terminal:", t["output"].split())
print("env:", json.dumps(dict(os.environ)))
print("tenv:", terminal("env")["output"].replace("\n", " "))
"#
    );
    let r = run(&rt, request(&code, "task-a"));
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.backend.as_deref(), Some("docker"));
    assert!(r.output.contains("open: ['alpha', 'beta']"), "{}", r.output);
    assert!(r.output.contains("read: True"), "{}", r.output);
    assert!(
        r.output.contains("vibeos-test-"),
        "search found the file: {}",
        r.output
    );
    assert!(
        r.output.contains("terminal: ['alpha', 'gamma'"),
        "{}",
        r.output
    );
    assert!(
        !std::path::Path::new(&marker).exists(),
        "the file leaked to the host"
    );
    // Remote env scrubbing: nothing secret from the host, no host PATH.
    for leak in [
        "hunter2-host-secret",
        "sk-host-provider-secret",
        "/host/only/bin",
    ] {
        assert!(
            !r.output.contains(leak),
            "{leak} reached the container: {}",
            r.output
        );
    }
    assert!(
        r.output.contains("C.UTF-8"),
        "safe variables pass: {}",
        r.output
    );
    assert_eq!(r.tool_calls_made, 6);

    // Shell sessions: cd/export persist between calls, and across executions of one task.
    let r = run(&rt, request(
        "from vibeos_tools import terminal\nterminal('cd /tmp && export VIBEOS_SESSION_T=kept')\nprint(terminal('pwd; echo $VIBEOS_SESSION_T')['output'])",
        "task-a",
    ));
    assert!(r.output.contains("/tmp\nkept"), "{r:?}");
    let r = run(
        &rt,
        request(
            "from vibeos_tools import terminal\nprint(terminal('pwd')['output'])",
            "task-a",
        ),
    );
    assert!(r.output.contains("/tmp"), "{r:?}");

    // One task reuses its container; two tasks get two.
    let host_a1 = run(
        &rt,
        request("import socket; print(socket.gethostname())", "task-a"),
    )
    .output;
    let host_a2 = run(
        &rt,
        request("import socket; print(socket.gethostname())", "task-a"),
    )
    .output;
    let host_b = run(
        &rt,
        request("import socket; print(socket.gethostname())", "task-b"),
    )
    .output;
    assert_eq!(host_a1, host_a2);
    assert_ne!(host_a1, host_b);
    assert_eq!(daemon.labelled().len(), 2, "{:?}", daemon.labelled());

    // Timeout kills the remote process group: nothing is left in the container.
    run_into_timeout(
        &rt,
        request(&hanging_script("4242"), "task-a"),
        Duration::from_secs(2),
        Duration::from_secs(20),
    );
    assert_none_left(&rt, &["sleep 4242", "time.sleep(600)"]);

    // A terminal command the script is waiting on runs under the agent, not in the script's
    // group: it is killed when the execution ends too.
    let mut req = request(
        "from vibeos_tools import terminal\nprint(terminal('sleep 4747', timeout=600))",
        "task-a",
    );
    req.timeout = Duration::from_secs(2);
    req.kill_grace = Duration::from_secs(1);
    let r = run(&rt, req);
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    std::thread::sleep(Duration::from_millis(300));
    assert_none_left(&rt, &["sleep 4747"]);

    // Interrupt does the same.
    let r = run_interrupted_after(
        &rt,
        request(
            "import subprocess, time\nsubprocess.Popen(['sleep', '4343'])\ntime.sleep(600)",
            "task-a",
        ),
        Duration::from_secs(2),
    );
    assert_eq!(r.status, Status::Interrupted, "{r:?}");
    assert_none_left(&rt, &["sleep 4343"]);

    // Call budget and output caps hold inside.
    let mut req = request(
        "from vibeos_tools import terminal\nfor i in range(3):\n    print(terminal('true').get('error', 'ok'))\nprint('x' * 200000)",
        "task-a",
    );
    req.max_tool_calls = 2;
    req.stdout_limit = 2000;
    let r = run(&rt, req);
    assert_eq!(r.tool_calls_made, 2, "{r:?}");
    assert!(
        r.output.contains("Tool call limit reached (2)"),
        "{}",
        r.output
    );
    assert!(
        r.truncated && r.stdout_bytes > 200000 && r.output.len() < 4000,
        "{r:?}"
    );

    // Dangerous-command approval: skipped in an isolated container, checked (and, with no one
    // to ask, denied) once a host volume is mounted.
    let dangerous = "from vibeos_tools import terminal\nr = terminal('mkdir -p /tmp/victim && rm -rf /tmp/victim && echo removed')\nprint(r.get('output'), r.get('error'))";
    let r = run(&rt, request(dangerous, "task-a"));
    assert!(
        r.output.contains("removed"),
        "isolated: no approval needed: {r:?}"
    );
    environments::shutdown();
    assert!(
        daemon.labelled().is_empty(),
        "host exit stops every container: {:?}",
        daemon.labelled()
    );
    let shared = tempfile::tempdir().unwrap();
    let mut mounted = settings(&docker);
    mounted.docker_volumes = vec![environments::settings::Volume {
        host: shared.path().to_path_buf(),
        container: "/mnt/host".into(),
        read_only: false,
    }];
    environments::activate(mounted);
    let r = run(&rt, request(dangerous, "task-v"));
    assert!(
        !r.output.contains("removed") && r.output.contains("CommandDenied"),
        "host mount: checked: {r:?}"
    );
    // The volume is the one way a tool's file reaches the host.
    let r = run(&rt, request("from vibeos_tools import write_file\nprint(write_file('/mnt/host/out.txt', 'via volume'))", "task-v"));
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(
        std::fs::read_to_string(shared.path().join("out.txt")).unwrap(),
        "via volume"
    );
    environments::shutdown();

    // The CLI: --backend docker, then nothing left behind when it exits.
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("config.yaml"),
        format!("terminal:\n  docker_image: {IMAGE}\n  docker_binary: {docker}\n"),
    )
    .unwrap();
    let script = home.path().join("s.py");
    std::fs::write(
        &script,
        "from vibeos_tools import terminal\nprint(terminal('cat /etc/debian_version')['output'])",
    )
    .unwrap();
    let v = cli_result(home.path(), &[], &script);
    assert_eq!(v["status"], "success", "{v}");
    assert_eq!(v["backend"], "docker", "{v}");
    assert!(
        v["output"].as_str().unwrap_or("").starts_with("12."),
        "bookworm inside: {v}"
    );
    assert!(
        daemon.labelled().is_empty(),
        "the CLI stops its container at exit: {:?}",
        daemon.labelled()
    );

    // Idle stop after lifetime_seconds.
    let mut idle = settings(&docker);
    idle.lifetime = Duration::from_secs(1);
    environments::activate(idle);
    let r = run(&rt, request("print('hi')", "task-idle"));
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(daemon.labelled().len(), 1);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !daemon.labelled().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        daemon.labelled().is_empty(),
        "idle container not stopped: {:?}",
        daemon.labelled()
    );

    // backends gc removes what a crashed host left (its owner pid is gone), keeps live ones.
    plant_crashed_container(|args| daemon.docker(args), IMAGE);
    let r = run(&rt, request("print('live')", "task-live"));
    assert_eq!(r.status, Status::Success);
    let report = gc_report(&daemon);
    assert_eq!(
        report["removed"],
        serde_json::json!(["vibeos-exec-crashed"]),
        "{report}"
    );
    assert_eq!(report["kept"].as_array().map(Vec::len), Some(1), "{report}");
    environments::shutdown();

    // A missing image and a dead daemon: clear errors, quickly.
    let mut missing = settings(&docker);
    // Named under a registry on loopback (nothing listens on port 9): the engine's pull
    // attempt stays on this machine.
    missing.docker_image = Some("127.0.0.1:9/no-such-image:none".into());
    environments::activate(missing);
    let started = Instant::now();
    let r = run(&rt, request("print(1)", "task-x"));
    assert_eq!(r.status, Status::Error);
    let err = r.error.unwrap_or_default();
    assert!(
        err.contains("no-such-image:none") && err.contains("terminal.docker_image"),
        "{err}"
    );
    let mut no_python = settings(&docker);
    no_python.python = "python-does-not-exist".into();
    environments::activate(no_python);
    let r = run(&rt, request("print(1)", "task-z"));
    assert_eq!(r.status, Status::Error);
    let err = r.error.unwrap_or_default();
    assert!(
        err.contains("python-does-not-exist") && err.contains("terminal.python"),
        "{err}"
    );
    let dead = daemon.cli_wrapper("docker-dead", "unix:///nonexistent/docker.sock");
    environments::activate(settings(&dead));
    let r = run(&rt, request("print(1)", "task-y"));
    assert_eq!(r.status, Status::Error);
    let err = r.error.unwrap_or_default();
    assert!(
        err.contains("unreachable") && err.contains("DOCKER_HOST"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    environments::activate(BackendSettings::default());
    drop(daemon);
}

/// A docker execution ends like a local one: the real wait status (-9, -15, not the client's
/// 137/143), nothing it started survives (not even a process in a session of its own), and
/// `terminal` sees the container's HOME. A persistent container is not stopped under another
/// process's running execution. Failed starts leave no container in Created state and no RPC
/// dir on the host, and `backends gc` removes a container's RPC dir with it.
#[test]
fn docker_executions_end_like_local_ones() {
    let Some((daemon, docker)) = docker_turn() else {
        return;
    };
    let rt = runtime();
    environments::activate(settings(&docker));

    let r = run(
        &rt,
        request(
            "import os\nprint('bye', flush=True)\nos.kill(os.getpid(), 9)",
            "task-s",
        ),
    );
    assert_eq!(r.status, Status::Error, "{r:?}");
    assert_eq!(r.exit_code, Some(-9), "{r:?}");
    assert!(
        r.error
            .as_deref()
            .unwrap_or("")
            .contains("killed by signal 9"),
        "{r:?}"
    );
    assert!(r.output.starts_with("bye\n"), "{r:?}");
    // A traceback reads as a local one: the script's frames, none of the bootstrap's.
    let r = run(
        &rt,
        request("def f():\n    raise ValueError('boom')\nf()", "task-s"),
    );
    assert_eq!(r.exit_code, Some(1), "{r:?}");
    assert!(
        r.output
            .contains("Traceback (most recent call last):\n  File \"")
            && r.output.contains("script.py\", line 3, in <module>")
            && r.output.contains("ValueError: boom")
            && !r.output.contains("<string>"),
        "{r:?}"
    );

    let escape = "import os, subprocess, time\nsubprocess.Popen(['setsid', 'sleep', '9191'])\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        os.execvp('sleep', ['sleep', '9192'])\n    os._exit(0)\nos.wait()\nprint('started', flush=True)\n";
    let r = run(&rt, request(escape, "task-s"));
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_none_left_in(&rt, "task-s", &["sleep 9191", "sleep 9192"]);
    let r = run_into_timeout(
        &rt,
        request(
            &format!("{}time.sleep(600)", escape.replace("919", "929")),
            "task-s",
        ),
        Duration::from_secs(2),
        Duration::from_secs(20),
    );
    assert_eq!(r.exit_code, Some(-15), "{r:?}");
    assert_none_left_in(&rt, "task-s", &["sleep 9291", "sleep 9292"]);

    let r = run(
        &rt,
        request(
            "from vibeos_tools import terminal\nprint(terminal('cd && pwd; echo HOME=[$HOME]')['output'])",
            "task-s",
        ),
    );
    assert!(r.output.contains("/root\nHOME=[/root]"), "{r:?}");
    // A container stopped or removed behind the host's back (its PID 1 killed, `docker stop`,
    // `docker rm`, a daemon restart) is brought back for the task's next execution; it used
    // to fail every execution of the task until the environment went idle.
    let container = || {
        let out = daemon.docker(&["ps", "-aq", "--filter", "label=vibeos-exec.task=task-s"]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let before = container();
    assert!(!before.is_empty());
    for (what, args) in [
        ("stopped", ["stop", "-t", "0"]),
        ("removed", ["rm", "-f", "-v"]),
    ] {
        let out = daemon.docker(&[args[0], args[1], args[2], &container()]);
        assert!(out.status.success(), "{what}: {out:?}");
        let r = run(&rt, request("print('back')", "task-s"));
        assert_eq!(
            r.status,
            Status::Success,
            "after the container was {what}: {r:?}"
        );
        assert_eq!(r.output, "back\n", "{what}: {r:?}");
        let r = run(
            &rt,
            request(
                "from vibeos_tools import read_file, write_file\nwrite_file('/tmp/x', 'y')\nprint(read_file('/tmp/x')['content'])",
                "task-s",
            ),
        );
        assert!(
            r.output.contains('y'),
            "tools after the container was {what}: {r:?}"
        );
    }
    environments::shutdown();

    // Two processes share a persistent container: the first to finish leaves it running for
    // the other, the last one stops it.
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("config.yaml"),
        format!("terminal:\n  docker_image: {IMAGE}\n  docker_binary: {docker}\n  container_persistent: true\n"),
    )
    .unwrap();
    let cli = |code: &str| {
        let script = home.path().join(format!("s{}.py", code.len()));
        std::fs::write(&script, code).unwrap();
        std::process::Command::new(env!("CARGO_BIN_EXE_vibeos-exec"))
            .args(["run", "--json", "--backend", "docker"])
            .arg(&script)
            .env("VIBEOS_HOME", home.path())
            .env("VIBEOS_AGENT_BINARY", env!("CARGO_BIN_EXE_vibeos-exec"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let long = cli("import time\ntime.sleep(10)\nprint('survived')");
    std::thread::sleep(Duration::from_secs(2));
    let short = cli("print('short')").wait_with_output().unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&short.stdout).unwrap_or_else(|_| panic!("{short:?}"));
    assert_eq!(v["status"], "success", "{v}");
    // `backends gc --all` takes persistent containers, but not one a live process uses (stop
    // 56's probe: it removed the container under this running execution).
    let gc = environments::docker::gc(&docker, true).unwrap();
    assert!(gc.removed.is_empty() && gc.kept.len() == 1, "{gc:?}");
    let long = long.wait_with_output().unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&long.stdout).unwrap_or_else(|_| panic!("{long:?}"));
    assert_eq!(
        v["status"], "success",
        "stopped under the other process: {v}"
    );
    assert_eq!(v["output"], "survived\n", "{v}");
    let persistent = daemon.labelled();
    assert_eq!(persistent.len(), 1, "{persistent:?}");
    assert!(
        daemon.running_with_label("vibeos-exec=1").is_empty(),
        "the last user stops it"
    );
    // Made again from other settings, it would lose what is in it; reused as it is, it would
    // keep a volume the settings dropped (and count as isolated for approvals) or lack one
    // they add. So a persistent container made from other settings is refused, naming them.
    let shared = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("config.yaml"),
        format!(
            "terminal:\n  docker_image: {IMAGE}\n  docker_binary: {docker}\n  container_persistent: true\n  docker_volumes: [\"{}:/data\"]\n",
            shared.path().display()
        ),
    )
    .unwrap();
    let changed = cli("print('ran')").wait_with_output().unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&changed.stdout).unwrap_or_else(|_| panic!("{changed:?}"));
    assert_eq!(v["status"], "error", "{v}");
    let error = v["error"].as_str().unwrap_or("");
    assert!(
        error.contains("terminal.docker_volumes") && error.contains("backends gc --all"),
        "{v}"
    );
    assert_eq!(daemon.labelled(), persistent, "the container was replaced");
    // A volume whose host directory is missing is refused, not made on the host.
    let missing = shared.path().join("not-there");
    std::fs::write(
        home.path().join("config.yaml"),
        format!(
            "terminal:\n  docker_image: {IMAGE}\n  docker_binary: {docker}\n  docker_volumes: [\"{}:/data\"]\n",
            missing.display()
        ),
    )
    .unwrap();
    let out = cli("print('ran')").wait_with_output().unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{out:?}"));
    assert_eq!(v["status"], "error", "{v}");
    assert!(
        !missing.exists(),
        "docker made the volume's host directory: {v}"
    );
    // A session dir with `:` and `,` in its name mounts as /workspace.
    let odd = shared.path().join("we:ird,dir");
    std::fs::create_dir(&odd).unwrap();
    std::fs::write(odd.join("marker.txt"), "here").unwrap();
    std::fs::write(
        home.path().join("config.yaml"),
        format!(
            "terminal:\n  docker_image: {IMAGE}\n  docker_binary: {docker}\n  docker_mount_cwd_to_workspace: true\n"
        ),
    )
    .unwrap();
    let script = home.path().join("ws.py");
    std::fs::write(&script, "print(open('/workspace/marker.txt').read())").unwrap();
    let v = cli_result(
        home.path(),
        &[std::ffi::OsStr::new("--cwd"), odd.as_os_str()],
        &script,
    );
    assert_eq!(v["output"], "here\n", "{v}");
    // A persistent container's RPC dir (and users file) outlive its stops by design: remove
    // them with it, so the test leaves nothing in the temp dir.
    let mount = daemon.docker(&[
        "inspect",
        "-f",
        "{{range .Mounts}}{{if eq .Destination \"/run/vibeos-rpc\"}}{{.Source}}{{end}}{{end}}",
        &persistent[0],
    ]);
    let source = String::from_utf8_lossy(&mount.stdout).trim().to_string();
    let _ = daemon.docker(&["rm", "-f", &persistent[0]]);
    // The mount is the RPC dir's private subdir.
    let rpc_dir = source.strip_suffix("/m").unwrap_or(&source).to_string();
    assert!(
        rpc_dir.contains("vibeos-rpc-") && source != rpc_dir,
        "{mount:?}"
    );
    let _ = std::fs::remove_dir_all(&rpc_dir);
    let _ = std::fs::remove_file(format!("{rpc_dir}.users"));

    // The container's root is the host's: a script that opened its RPC mount up and left a
    // setuid-root copy of the interpreter in it made any local user root (stop 58's probe).
    // The mount is a subdir of a dir only the host's user enters, so what a script leaves
    // there is out of other users' reach. Run with a temp dir open to all, as /tmp is.
    let open_tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(open_tmp.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::write(
        home.path().join("config.yaml"),
        format!("terminal:\n  docker_image: {IMAGE}\n  docker_binary: {docker}\n"),
    )
    .unwrap();
    let script = home.path().join("setuid.py");
    std::fs::write(
        &script,
        "import os, shutil, time\nos.chmod('/run/vibeos-rpc', 0o755)\n\
         shutil.copy('/usr/bin/python3', '/run/vibeos-rpc/.py')\n\
         os.chmod('/run/vibeos-rpc/.py', 0o4755)\nos.rename('/run/vibeos-rpc/.py', '/run/vibeos-rpc/py')\n\
         time.sleep(60)",
    )
    .unwrap();
    let mut planting = std::process::Command::new(env!("CARGO_BIN_EXE_vibeos-exec"))
        .args(["run", "--json", "--backend", "docker"])
        .arg(&script)
        .env("VIBEOS_HOME", home.path())
        .env("VIBEOS_AGENT_BINARY", env!("CARGO_BIN_EXE_vibeos-exec"))
        .env("TMPDIR", open_tmp.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let planted = |d: &std::path::Path| -> Option<std::path::PathBuf> {
        let rpc = std::fs::read_dir(d)
            .ok()?
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with("vibeos-rpc-"))?
            .path();
        [rpc.join("py"), rpc.join("m").join("py")]
            .into_iter()
            .find(|p| p.exists())
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let py = loop {
        if let Some(py) = planted(open_tmp.path()) {
            break py;
        }
        assert!(
            Instant::now() < deadline && matches!(planting.try_wait(), Ok(None)),
            "the script never planted its binary"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    use std::os::unix::process::CommandExt;
    let as_nobody = std::process::Command::new(&py)
        .args(["-c", "import os; print('euid', os.geteuid())"])
        .uid(65534)
        .gid(65534)
        .output();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(planting.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let _ = planting.wait();
    match as_nobody {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}"),
        Ok(out) => panic!(
            "another user ran the script's setuid binary {}: {out:?}",
            py.display()
        ),
    }

    // Failed starts leave nothing: no Created container for an image without terminal.python,
    // no RPC dir for an engine binary that does not exist.
    let rpc_dirs = || -> Vec<String> {
        std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("vibeos-rpc-"))
            .collect()
    };
    let mut no_python = settings(&docker);
    no_python.python = "python9".into();
    environments::activate(no_python);
    let before = rpc_dirs();
    let r = run(&rt, request("print(1)", "task-p9"));
    assert_eq!(r.status, Status::Error, "{r:?}");
    assert!(daemon.labelled().is_empty(), "{:?}", daemon.labelled());
    environments::activate(settings("/nonexistent/docker"));
    let r = run(&rt, request("print(1)", "task-nb"));
    assert_eq!(r.status, Status::Error, "{r:?}");
    // The other docker tests run beside this one, each in a process of its own, and their
    // containers' RPC dirs come and go in the same temp dir: a dir these failed starts left
    // would stay, one of theirs goes with its container.
    let deadline = Instant::now() + Duration::from_secs(60);
    let left = loop {
        let new: Vec<String> = rpc_dirs()
            .into_iter()
            .filter(|d| !before.contains(d))
            .collect();
        if new.is_empty() || Instant::now() > deadline {
            break new;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(left, Vec::<String>::new(), "RPC dirs left on the host");

    // gc removes a crashed host's container and its RPC dir (the mount's source).
    let crashed_dir = std::env::temp_dir().join(format!("vibeos-rpc-test-{}", std::process::id()));
    std::fs::create_dir_all(&crashed_dir).unwrap();
    let out = daemon.docker(&[
        "run",
        "-d",
        "--name",
        "vibeos-exec-crashed-rpc",
        "--label",
        "vibeos-exec=1",
        "--label",
        "vibeos-exec.owner=999999999:1",
        "--network",
        "none",
        "-v",
        &format!("{}:/run/vibeos-rpc", crashed_dir.display()),
        "--entrypoint",
        "sleep",
        IMAGE,
        "600",
    ]);
    assert!(out.status.success(), "{out:?}");
    let report = gc_report(&daemon);
    assert_eq!(
        report["removed"],
        serde_json::json!(["vibeos-exec-crashed-rpc"]),
        "{report}"
    );
    assert!(!crashed_dir.exists(), "gc left the container's RPC dir");
    environments::activate(BackendSettings::default());
    drop(daemon);
}

/// Asserts that no process in `task`'s container has any of `left` in its command line.
fn assert_none_left_in(rt: &tokio::runtime::Runtime, task: &str, left: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ps = run(
            rt,
            request(
                "from vibeos_tools import terminal\nprint(terminal('ps -eo pid,cmd')['output'])",
                task,
            ),
        );
        assert!(ps.output.contains("ps -eo"), "{ps:?}");
        let found: Vec<&&str> = left.iter().filter(|l| ps.output.contains(**l)).collect();
        if found.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: {found:?}: {}",
            ps.output
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `vibeos-exec backends gc --json` against the test's engine, and its report.
fn gc_report(daemon: &Dockerd) -> serde_json::Value {
    let gc = std::process::Command::new(env!("CARGO_BIN_EXE_vibeos-exec"))
        .args(["backends", "gc", "--json"])
        .env("VIBEOS_HOME", daemon.dir.path())
        .env("DOCKER_HOST", &daemon.host)
        .output()
        .unwrap();
    serde_json::from_slice(&gc.stdout).unwrap_or_else(|_| panic!("{gc:?}"))
}

/// Start-up checks and a kill the script cannot dodge (probe findings F1, F2, F4, F5): a
/// missing `terminal.cwd` is an error naming the key (not silently created); a missing
/// `terminal.agent_binary` is an error naming the key before anything starts, and nothing is
/// created on the host at that path; a script that removes or replaces its pgid file, or stops
/// its bootstrap and ignores SIGTERM, is still killed at its timeout plus the grace, keeps the
/// output it printed, never reports exit 0, and leaves nothing running.
#[test]
fn docker_start_checks_and_a_kill_the_script_cannot_dodge() {
    let Some((daemon, docker)) = docker_turn() else {
        return;
    };
    let rt = runtime();

    // F4: the configured working dir is entered, never created.
    environments::activate(BackendSettings {
        cwd: Some("/nonexistent-vibeos-cwd".into()),
        ..settings(&docker)
    });
    let r = run(&rt, request("import os\nprint(os.getcwd())", "task-cwd"));
    assert_eq!(r.status, Status::Error, "{r:?}");
    let error = r.error.clone().unwrap_or_default();
    assert!(error.contains("terminal.cwd"), "{r:?}");
    assert!(error.contains("/nonexistent-vibeos-cwd"), "{r:?}");
    assert!(!r.output.contains("/nonexistent-vibeos-cwd\n"), "{r:?}");
    environments::shutdown();

    // F5: a missing agent binary is named before any container exists, and docker does not
    // create it on the host (`-v` made it an empty root-owned directory).
    let host = tempfile::tempdir().unwrap();
    let missing = host.path().join("missing-agent").join("vibeos-exec");
    environments::activate(BackendSettings {
        agent_binary: Some(missing.clone()),
        ..settings(&docker)
    });
    let r = run(
        &rt,
        request(
            "from vibeos_tools import read_file\nprint(read_file('/etc/hostname'))",
            "task-agent",
        ),
    );
    let text = format!("{:?} {}", r.error, r.output);
    assert!(text.contains("terminal.agent_binary"), "{r:?}");
    assert!(text.contains("missing-agent"), "{r:?}");
    assert!(
        !host.path().join("missing-agent").exists(),
        "docker created the missing agent path on the host"
    );
    environments::shutdown();

    environments::activate(settings(&docker));
    // F2: removing the pgid file, or replacing it with a FIFO or a symlink to /dev/zero, does
    // not delay the kill, lose the output, or turn it into exit 0.
    for (tag, tamper) in [
        ("unlink", "os.unlink(f)"),
        ("fifo", "os.unlink(f); os.mkfifo(f)"),
        ("zero", "os.unlink(f); os.symlink('/dev/zero', f)"),
    ] {
        let code = format!(
            "import os, glob, time\nfor f in glob.glob('/run/vibeos-rpc/pg-*'):\n    {tamper}\nprint('started {tag}', flush=True)\ntime.sleep(1000)\n"
        );
        let r = run_into_timeout(
            &rt,
            request(&code, "task-k"),
            Duration::from_secs(2),
            Duration::from_secs(12),
        );
        assert!(r.output.contains(&format!("started {tag}")), "{r:?}");
        assert_ne!(r.exit_code, Some(0), "{r:?}");
    }
    // F1: a script that ignores SIGTERM and stops its bootstrap is still killed after the
    // grace, and nothing of it is left.
    let stopboot = "import os, glob, time, signal, subprocess\nfor f in glob.glob('/run/vibeos-rpc/pg-*'):\n    os.unlink(f)\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nsubprocess.Popen(['sleep', '9393'])\nprint('started', flush=True)\ntime.sleep(0.3)\nos.kill(os.getppid(), signal.SIGSTOP)\nwhile True:\n    time.sleep(1)\n";
    let r = run_into_timeout(
        &rt,
        request(stopboot, "task-k"),
        Duration::from_secs(2),
        Duration::from_secs(15),
    );
    assert_ne!(r.exit_code, Some(0), "{r:?}");
    assert_none_left_in(&rt, "task-k", &["sleep 9393"]);

    // F6: a link the script puts at the agent's socket (the RPC dir is the container's to
    // write) never leads the supervisor to a host socket: the calls that need a new
    // connection fail, and the bait hears nothing (it used to receive the agent's token).
    let bait_dir = tempfile::tempdir().unwrap();
    let bait = bait_dir.path().join("bait.sock");
    let listener = std::os::unix::net::UnixListener::bind(&bait).unwrap();
    listener.set_nonblocking(true).unwrap();
    let code = format!(
        "import os\nfrom vibeos_tools import read_file, terminal\nread_file('/etc/hostname')\nos.unlink('/run/vibeos-rpc/agent.sock')\nos.symlink({bait:?}, '/run/vibeos-rpc/agent.sock')\npids = []\nfor i in range(3):\n    pid = os.fork()\n    if pid == 0:\n        try:\n            print('child', i, terminal('echo hi'), flush=True)\n        finally:\n            os._exit(0)\n    pids.append(pid)\nfor p in pids:\n    os.waitpid(p, 0)\nprint('done')\n"
    );
    let r = run(&rt, request(&code, "task-link"));
    assert!(r.output.contains("done"), "{r:?}");
    assert!(r.output.contains("replaced it"), "{r:?}");
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the supervisor connected to the host socket the script linked: {other:?}"),
    }

    // F7: another script of the same task that turns each new execution's leader record into
    // a FIFO (or a link to /dev/zero) neither hangs that execution nor delays its timeout.
    let swapper = "import os, time\nD = '/run/vibeos-rpc'\nmine = set(os.listdir(D))\nprint('started', flush=True)\nend = time.time() + 12\nn = 0\nwhile time.time() < end:\n    for f in os.listdir(D):\n        if f.startswith('pg-') and not f.endswith('.t') and f not in mine:\n            mine.add(f)\n            tmp = D + '/.f%d' % n\n            n += 1\n            if n % 2:\n                os.mkfifo(tmp)\n            else:\n                os.symlink('/dev/zero', tmp)\n            try:\n                os.rename(tmp, D + '/' + f)\n            except OSError:\n                pass\n    time.sleep(0.0005)\n";
    // A hung execution cannot be joined: a watchdog ends this test's process instead (it runs
    // in a process of its own), which the parent reports as this test's failure.
    let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watched = std::sync::Arc::clone(&finished);
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(90));
        if !watched.load(std::sync::atomic::Ordering::SeqCst) {
            eprintln!("F7: an execution hung on a record another script replaced");
            std::process::exit(101);
        }
    });
    std::thread::scope(|scope| {
        let attacker = scope.spawn(|| run(&rt, request(swapper, "task-swap")));
        std::thread::sleep(Duration::from_secs(3));
        for _ in 0..3 {
            let v = run_into_timeout(
                &rt,
                request(&hanging_script("7171"), "task-swap"),
                Duration::from_secs(2),
                Duration::from_secs(15),
            );
            assert_ne!(v.exit_code, Some(0), "{v:?}");
        }
        let a = attacker.join().unwrap();
        assert_eq!(a.status, Status::Success, "{a:?}");
    });
    finished.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_none_left_in(&rt, "task-swap", &["sleep 7171"]);

    // F8: what the agent's own terminal and process calls print comes back redacted by this
    // host (the agent over there knows neither this host's secrets nor its settings).
    let secret = "s3cr3t-value-of-the-host-9911";
    let token = format!("ghp_{}", "a1B2c3D4e5".repeat(4));
    let mut ctx = vibeos_tools::ToolContext::agent("/");
    ctx.task_id = Some("task-redact".into());
    ctx.env = Some(std::sync::Arc::new(vec![(
        "MY_SERVICE_TOKEN".into(),
        secret.to_string(),
    )]));
    let call = |name: &str, args: serde_json::Value| -> serde_json::Value {
        let text = vibeos_tools::registry().handle_function_call(name, &args, &ctx);
        serde_json::from_str(&text).unwrap()
    };
    let shown = format!("echo {secret} {token}");
    let r = call("terminal", serde_json::json!({"command": shown}));
    let output = r["output"].as_str().unwrap_or_default();
    assert!(!output.contains(secret) && !output.contains(&token), "{r}");
    assert!(r["redactions"].as_u64().unwrap_or(0) >= 2, "{r}");
    let r = call(
        "terminal",
        serde_json::json!({"command": format!("{shown}; sleep 30"), "background": true}),
    );
    let id = r["process_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = call(
            "process",
            serde_json::json!({"action": "log", "process_id": id}),
        );
        let output = r["output"].as_str().unwrap_or_default().to_string();
        assert!(!output.contains(secret) && !output.contains(&token), "{r}");
        if output.contains("REDACTED") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no output from the background command: {r}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    call(
        "process",
        serde_json::json!({"action": "kill", "process_id": id}),
    );
    environments::activate(BackendSettings::default());
    drop(daemon);
}

/// A script that SIGKILLs its bootstrap (finding 1 of stop 54): the execution's result says the
/// status was lost (not "exited with code 137", the bootstrap's death), and neither the script
/// nor what it started after `setsid` runs on in the kept container; a marker forged with what
/// the script can find of the bootstrap's nonce is not taken as the script's end.
#[test]
fn docker_a_script_that_kills_its_bootstrap_neither_outlives_nor_forges_its_end() {
    let Some((_daemon, docker)) = docker_turn() else {
        return;
    };
    let rt = runtime();
    environments::activate(settings(&docker));
    let escape = "import os, time, signal\nopen('/tmp/k1.pids', 'w').write('%d\\n' % os.getpid())\nif os.fork() == 0:\n    os.setsid(); open('/tmp/k1.pids', 'a').write('%d\\n' % os.getpid()); time.sleep(0.3); os.execvp('sleep', ['sleep', '4902'])\nprint('started', flush=True)\ntime.sleep(0.1); os.kill(os.getppid(), signal.SIGKILL); time.sleep(100)\n";
    let mut req = request(escape, "task-boot");
    req.timeout = Duration::from_secs(20);
    let started = Instant::now();
    let r = run(&rt, req);
    assert_ne!(r.status, Status::Success, "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(15), "{r:?}");
    let error = r.error.clone().unwrap_or_default();
    assert!(!error.contains("code 137"), "{r:?}");
    assert!(error.contains("status was lost"), "{r:?}");
    let check = "import os\nalive = []\nfor p in open('/tmp/k1.pids').read().split():\n    try:\n        st = open('/proc/%s/stat' % p).read().rsplit(')', 1)[1].split()[0]\n    except OSError:\n        continue\n    if st != 'Z':\n        alive.append(p)\nprint('alive', alive)\n";
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let c = run(&rt, request(check, "task-boot"));
        if c.output.contains("alive []") {
            break;
        }
        assert!(Instant::now() < deadline, "left running: {c:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_none_left_in(&rt, "task-boot", &["sleep 4902"]);

    // The forgery: every nonce-like thing the bootstrap's globals hold, as an end marker of
    // success, then the bootstrap killed.
    let forge = "import os, sys, signal\ng = sys._getframe(1).f_globals\nfound = []\nv = g.get('nonce')\nif isinstance(v, list) and v and isinstance(v[0], bytes):\n    found.append(v[0])\nc = g.get('chunks')\nif isinstance(c, list) and c:\n    found.append(b''.join(c).split(b'\\0')[1])\nd = g.get('data')\nif isinstance(d, bytes):\n    found.append(d.split(b'\\0')[0])\nfor n in found:\n    os.write(2, b'\\0VIBEOS-END ' + n + b' exit 0\\0')\nos.kill(os.getppid(), signal.SIGKILL)\n";
    let r = run(&rt, request(forge, "task-boot"));
    assert_ne!(r.status, Status::Success, "a forged end was taken: {r:?}");
    assert_ne!(r.exit_code, Some(0), "{r:?}");
    environments::shutdown();

    // The engine's connection lost mid-execution (finding 5): a client that exits 255 as the
    // docker CLI does when its daemon goes away is not "the script exited with code 255".
    let lost = _daemon.dir.path().join("docker-lost");
    std::fs::write(
        &lost,
        format!(
            "#!/bin/sh
if [ \"$1\" = exec ] && [ \"$2\" = -i ]; then
  exec 3<&0
  {docker} \"$@\" <&3 3<&- &
  c=$!
  exec 3<&-
  sleep 2
  kill -9 $c
  exit 255
fi
exec {docker} \"$@\"
"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&lost, std::fs::Permissions::from_mode(0o755)).unwrap();
    environments::activate(settings(&lost.display().to_string()));
    let r = run(
        &rt,
        request(
            "import time\nprint('started', flush=True)\ntime.sleep(30)\n",
            "task-lost",
        ),
    );
    let error = r.error.clone().unwrap_or_default();
    assert_eq!(r.status, Status::Error, "{r:?}");
    assert!(!error.contains("code 255"), "{r:?}");
    assert!(
        error.contains("connection to the docker engine ended"),
        "{r:?}"
    );
    environments::shutdown();
    environments::activate(BackendSettings::default());
}

/// A container on the host's network namespace (`terminal.docker_network: host`) reaches the
/// host's loopback services, so it is not isolated: a dangerous command is checked there as on
/// the host (stop 55, finding 1: it ran unasked, e.g. `psql -h 127.0.0.1 -c 'DROP TABLE …'`).
#[test]
fn docker_a_container_on_the_host_network_is_not_isolated() {
    let Some((_daemon, docker)) = docker_turn() else {
        return;
    };
    let rt = runtime();
    environments::activate(BackendSettings {
        docker_network: "host".into(),
        ..settings(&docker)
    });
    let dangerous = "from vibeos_tools import terminal\nr = terminal(\"echo 'DROP TABLE users' && echo ran-it\")\nprint(r.get('output'), r.get('error'))";
    let r = run(&rt, request(dangerous, "task-hostnet"));
    assert!(
        !r.output.contains("ran-it") && r.output.contains("CommandDenied"),
        "host network: checked: {r:?}"
    );
    environments::shutdown();
    environments::activate(BackendSettings::default());
}

/// A direct tool call (as `serve --toolsets terminal,file` makes) after the container was
/// killed from outside starts it again instead of failing for good with "it exited before
/// listening" (stop 55, finding 3); an execution whose container is killed under it says the
/// container stopped, not that the script may have killed its parent, and the end's sweep
/// does not warn about the container being gone (finding 6).
#[test]
fn docker_a_container_killed_from_outside_is_noticed_and_started_again() {
    let Some((daemon, docker)) = docker_turn() else {
        return;
    };
    let rt = runtime();
    environments::activate(settings(&docker));
    let call = |name: &str, args: serde_json::Value| -> serde_json::Value {
        let mut ctx = vibeos_tools::ToolContext::agent("/");
        ctx.task_id = Some("task-killed".into());
        let text = vibeos_tools::registry().handle_function_call(name, &args, &ctx);
        serde_json::from_str(&text).unwrap()
    };
    let r = call("terminal", serde_json::json!({"command": "echo first"}));
    assert!(r.to_string().contains("first"), "{r}");
    let killed = daemon.running_with_label("vibeos-exec=1");
    assert_eq!(killed.len(), 1, "{killed:?}");
    let out = daemon.docker(&["kill", &killed[0]]);
    assert!(out.status.success(), "{out:?}");
    // The call that finds it lost may fail, saying so; the next one works again.
    let lost = call("terminal", serde_json::json!({"command": "echo second"}));
    if !lost.to_string().contains("second") {
        assert!(
            !lost.to_string().contains("exited before listening"),
            "{lost}"
        );
    }
    let r = call("read_file", serde_json::json!({"path": "/etc/hostname"}));
    assert!(r.get("content").is_some(), "not recovered: {r}");
    let r = call("terminal", serde_json::json!({"command": "echo third"}));
    assert!(r.to_string().contains("third"), "not recovered: {r}");

    // Killed under a running execution: said as the container's stop.
    let names = daemon.running_with_label("vibeos-exec=1");
    let kill_later = {
        let (daemon_docker, name) = (docker.clone(), names[0].clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(2));
            std::process::Command::new(daemon_docker)
                .args(["kill", &name])
                .output()
                .unwrap()
        })
    };
    let r = run(
        &rt,
        request(
            "import time\nprint('started', flush=True)\ntime.sleep(30)\n",
            "task-killed",
        ),
    );
    kill_later.join().unwrap();
    assert_ne!(r.status, Status::Success, "{r:?}");
    assert!(r.output.contains("started"), "{r:?}");
    let error = r.error.clone().unwrap_or_default();
    assert!(!error.contains("may have killed its parent"), "{r:?}");
    assert!(error.contains("container"), "{r:?}");
    assert!(error.contains("stopped"), "{r:?}");
    environments::shutdown();
    environments::activate(BackendSettings::default());
}
