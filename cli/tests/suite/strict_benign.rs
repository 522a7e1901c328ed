//! Strict mode keeps ordinary scripts working (SPEC §6): stdlib imports, threads, asyncio,
//! subprocesses of the interpreter, tempfile and files in the staging dir, tool calls over the
//! socketpair channel; and it fails closed with errors that name what is missing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use vibeos_testkit::{fixture, processes_mentioning, strict_unavailable, Sandbox};

macro_rules! require_strict {
    () => {
        if let Some(why) = strict_unavailable() {
            vibeos_testkit::skip!("strict mode is unavailable on this machine: {why}");
        }
    };
}

fn benign_report(sb: &Sandbox) -> Value {
    let script = std::fs::read_to_string(fixture("strict/benign.py")).unwrap();
    let result = sb.run_json(&script, &["--mode", "strict"]);
    assert_eq!(result["status"], "success", "{result}");
    assert_eq!(result["mode"], "strict");
    let output = result["output"].as_str().unwrap();
    let line = output
        .lines()
        .find_map(|l| l.strip_prefix("BENIGN "))
        .unwrap_or_else(|| panic!("no report: {output}"));
    assert_eq!(result["tool_calls_made"], 2, "{result}");
    assert!(sb.staging_dirs().is_empty());
    assert!(processes_mentioning(&sb.tmp().display().to_string()).is_empty());
    serde_json::from_str(line).unwrap()
}

fn check_benign(report: &Value, sb: &Sandbox) {
    assert_eq!(report["cwd_is_staging"], true, "{report}");
    assert_eq!(report["stdlib"][1], "3.30");
    assert_eq!(report["sqlite"], 7);
    assert_eq!(report["threads"].as_array().unwrap().len(), 8);
    assert_eq!(report["asyncio"], "async ok");
    assert_eq!(report["subprocess"], "3");
    assert_eq!(report["tempfile_in_staging"], true, "{report}");
    assert_eq!(report["tempfile_data"], "temp data");
    assert_eq!(report["staging_rw"], "nested");
    assert_eq!(report["mp_pipe"], 45, "{report}");
    assert_eq!(report["socketpair_bytes"], 1_000_000, "{report}");
    assert!(report["sndbuf"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["subprocess_pipe_bytes"], 300_000, "{report}");
    // The default memory_mb (1024 MiB) gives the common soft default of descriptors.
    assert_eq!(
        report["nofile"],
        serde_json::json!([1024, 1024]),
        "{report}"
    );
    assert_eq!(report["write_file"]["bytes_written"], 16, "{report}");
    assert!(report["read_file"]
        .as_str()
        .unwrap()
        .contains("written over RPC"));
    // The tool wrote in the session dir, as the agent's own write_file would.
    assert_eq!(
        std::fs::read_to_string(sb.work().join("strict-note.txt")).unwrap(),
        "written over RPC"
    );
    let err = report["subprocess_tool_error"].as_str().unwrap();
    assert!(err.contains("strict mode"), "{err}");
    assert!(err.contains("subprocess"), "{err}");
}

#[test]
fn benign_scripts_work_with_the_default_interpreter() {
    require_strict!();
    let sb = Sandbox::new();
    let report = benign_report(&sb);
    check_benign(&report, &sb);
}

#[test]
fn benign_scripts_work_with_the_system_interpreter_and_no_extra_capability() {
    require_strict!();
    if !std::path::Path::new("/usr/bin/python3").exists() {
        vibeos_testkit::skip!("/usr/bin/python3 is missing");
    }
    let sb = Sandbox::new();
    // World-searchable dirs: the script's uid reaches the staging dir without any capability.
    for dir in [sb.root.path().to_path_buf(), sb.tmp()] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    sb.write_config("code_execution:\n  python: /usr/bin/python3\n");
    let report = benign_report(&sb);
    check_benign(&report, &sb);
}

#[test]
fn strict_mode_works_under_a_restrictive_umask() {
    // The caller's umask (077, 027) left the prestarted script, its FIFO and the mount covers'
    // dirs closed to the script's uid: "cannot start python3: Permission denied".
    require_strict!();
    let sb = Sandbox::new();
    for umask in [0o077, 0o027] {
        let mut cmd = sb.command();
        cmd.args(["run", "--json", "--mode", "strict", "-"]);
        // SAFETY: umask is async-signal-safe and changes only the child's own mask.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                libc::umask(umask);
                Ok(())
            });
        }
        let out = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(b"import os\nprint('umask', oct(os.umask(0)))\n")?;
                child.wait_with_output()
            })
            .unwrap();
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["status"], "success", "umask {umask:o}: {r}");
        assert_eq!(r["output"], format!("umask {umask:#o}\n"), "{r}");
        assert!(sb.staging_dirs().is_empty());
    }
}

#[test]
fn the_script_runs_unprivileged_with_no_new_privileges() {
    require_strict!();
    let sb = Sandbox::new();
    let r = sb.run_json(
        "import os\n\
         print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())\n\
         import ctypes\nlibc = ctypes.CDLL(None)\nprint('nnp', libc.prctl(39, 0, 0, 0, 0))\n",
        &["--mode", "strict"],
    );
    assert_eq!(r["status"], "success", "{r}");
    let out = r["output"].as_str().unwrap();
    let first: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_ne!(first[0], "0", "{out}");
        assert_ne!(first[1], "0", "{out}");
        assert!(out.lines().next().unwrap().ends_with("[]"), "{out}");
    }
    assert!(out.contains("nnp 1"), "no_new_privs is not set: {out}");
}

#[test]
fn a_pyenv_style_shim_interpreter_is_refused_by_name() {
    require_strict!();
    let sb = Sandbox::new();
    let shim = sb.root.path().join("shim-python3");
    // A wrapper that cannot say which Python it runs: a resolvable one (a real pyenv shim) is
    // run through its real interpreter instead (cli/tests/suite/parity.rs).
    std::fs::write(&shim, "#!/bin/sh\necho not-a-python\n").unwrap();
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    sb.write_config(&format!("code_execution:\n  python: {}\n", shim.display()));
    let r = sb.run_json("print('hi')", &["--mode", "strict"]);
    assert_eq!(r["status"], "error");
    let e = r["error"].as_str().unwrap();
    assert!(
        e.contains("#! script") && e.contains("code_execution.python"),
        "{e}"
    );
}

#[test]
fn strict_mode_fails_closed_when_the_kernel_lacks_the_policys_landlock_abi() {
    let sb = Sandbox::new();
    let policy = sb.root.path().join("landlock-future.json");
    std::fs::write(
        &policy,
        r#"{"min_abi": 99, "read_execute": ["/usr/lib"], "staging": "read_write",
            "scopes": ["abstract_unix_socket", "signal"]}"#,
    )
    .unwrap();
    sb.write_config(&format!(
        "code_execution:\n  strict:\n    landlock_policy: {}\n",
        policy.display()
    ));
    let r = sb.run_json("print('must not run')", &["--mode", "strict"]);
    assert_eq!(r["status"], "error", "{r}");
    assert_eq!(r["output"], "");
    let e = r["error"].as_str().unwrap();
    assert!(e.contains("landlock") && e.contains("ABI 99"), "{e}");
    assert!(
        e.contains("refuses to run unconfined") || e.contains("landlock is unavailable"),
        "{e}"
    );
}

#[test]
fn a_broken_policy_or_setting_refuses_strict_mode_but_not_project_mode() {
    let sb = Sandbox::new();
    let policy = sb.root.path().join("seccomp.json");
    std::fs::write(&policy, r#"{"main": {"filter": "nonsense"}}"#).unwrap();
    sb.write_config(&format!(
        "code_execution:\n  strict:\n    seccomp_policy: {}\n",
        policy.display()
    ));
    let r = sb.run_json("print('x')", &["--mode", "strict"]);
    assert_eq!(r["status"], "error");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains(&policy.display().to_string()),
        "{r}"
    );
    let r = sb.run_json("print('x')", &["--mode", "project"]);
    assert_eq!(r["status"], "success", "{r}");

    sb.write_config("code_execution:\n  strict:\n    memory_mb: lots\n");
    let r = sb.run_json("print('x')", &["--mode", "strict"]);
    assert_eq!(r["status"], "error");
    assert!(r["error"].as_str().unwrap().contains("memory_mb"), "{r}");
}

#[test]
fn doctor_reports_the_machine_and_each_mode() {
    let sb = Sandbox::new();
    let out = sb.run(&["doctor"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "landlock",
        "seccomp",
        "user namespaces",
        "cgroup v2",
        "running as root",
        "mode project enforces",
        "mode strict enforces",
    ] {
        assert!(text.contains(needle), "doctor lacks {needle:?}:\n{text}");
    }
    let out = sb.run(&["doctor", "--json"]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["strict_available"].is_boolean());
    assert!(v["modes"]["strict"].is_array());
    if v["strict_available"] == true {
        assert!(v["landlock_abi"].as_i64().unwrap() >= 6);
    } else {
        assert!(v["strict_blocker"].is_string());
    }
}

#[test]
fn doctor_warns_when_the_configuration_opens_terminal_to_strict_scripts() {
    require_strict!();
    let sb = Sandbox::new();
    let warned = |sb: &Sandbox| {
        let out = sb.run(&["doctor"]);
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).contains("run OUTSIDE the sandbox")
    };
    assert!(!warned(&sb));
    sb.write_config("code_execution:\n  strict:\n    terminal: true\n");
    assert!(warned(&sb));
}

#[test]
fn strict_mode_confines_for_an_unprivileged_supervisor_too() {
    require_strict!();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let setpriv = std::path::Path::new("/usr/bin/setpriv");
    if !root || !setpriv.exists() || !std::path::Path::new("/usr/bin/python3").exists() {
        vibeos_testkit::skip!(
            "running the supervisor unprivileged needs root, setpriv and /usr/bin/python3"
        );
    }
    let sb = Sandbox::new();
    for dir in [sb.root.path().to_path_buf(), sb.home(), sb.work(), sb.tmp()] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    sb.write_config("code_execution:\n  python: /usr/bin/python3\n");
    let secret = sb.root.path().join("readable-secret.txt");
    std::fs::write(&secret, "UNPRIVILEGED-SECRET").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let script = sb.root.path().join("unpriv.py");
    std::fs::write(
        &script,
        format!(
            "import os, socket\nfrom vibeos_tools import write_file\n\
             print('uid', os.getuid())\n\
             try:\n    open({secret:?}).read(); print('LEAK')\nexcept OSError as e:\n    print('read', e.errno)\n\
             try:\n    socket.socket(); print('SOCKET')\nexcept OSError as e:\n    print('socket', e.errno)\n\
             print('tool', write_file('unpriv.txt', 'ok')['bytes_written'])\n",
            secret = secret.display().to_string()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cmd = sb.command();
    let program = cmd.get_program().to_owned();
    let args = ["--reuid=65534", "--regid=65534", "--clear-groups", "--"];
    let mut wrapped = std::process::Command::new(setpriv);
    wrapped.args(args).arg(program);
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => wrapped.env(k, v),
            None => wrapped.env_remove(k),
        };
    }
    wrapped.current_dir(sb.work());
    wrapped.env("HOME", sb.home());
    wrapped
        .args(["run", "--json", "--mode", "strict"])
        .arg(&script);
    let out = wrapped.output().unwrap();
    let r = vibeos_testkit::parse_single_json(&out);
    assert_eq!(r["status"], "success", "{r}");
    let output = r["output"].as_str().unwrap();
    assert!(output.contains("uid 65534"), "{output}");
    assert!(output.contains("read 13"), "{output}");
    assert!(output.contains("socket 1"), "{output}");
    assert!(output.contains("tool 2"), "{output}");
    assert!(
        !output.contains("LEAK") && !output.contains("SOCKET\n"),
        "{output}"
    );
    assert!(sb.staging_dirs().is_empty());
}

#[test]
fn a_pinned_uid_serves_one_execution_at_a_time() {
    if let Some(why) = strict_unavailable() {
        vibeos_testkit::skip!("strict mode is unavailable on this machine: {why}");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        vibeos_testkit::skip_even_in_ci!("strict uids are only chosen by a root supervisor");
    }
    let sb = Sandbox::new();
    // A uid of its own so parallel tests pinning another one do not interfere.
    let uid = 0x7e00_0000u32 + 0xffff - (std::process::id() % 4096);
    sb.write_config(&format!("code_execution:\n  strict:\n    uid: {uid}\n"));
    let mut first = sb.command();
    first.args(["run", "--mode", "strict", "--json", "-"]);
    first
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut first = first.spawn().unwrap();
    {
        use std::io::Write;
        let mut stdin = first.stdin.take().unwrap();
        stdin
            .write_all(b"import os, time\nprint(os.getuid())\ntime.sleep(4)\n")
            .unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let second = sb.run_json("print('second ran')", &["--mode", "strict"]);
    assert_eq!(second["status"], "error", "{second}");
    assert!(
        second["error"]
            .as_str()
            .unwrap_or_default()
            .contains("in use by another live strict execution"),
        "{second}"
    );
    let out = first.wait_with_output().unwrap();
    let first: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(first["status"], "success", "{first}");
    assert_eq!(first["output"].as_str().unwrap().trim(), uid.to_string());
    // Once the first is over, the uid is free again.
    let third = sb.run_json("print('third ran')", &["--mode", "strict"]);
    assert_eq!(third["status"], "success", "{third}");
}

#[test]
fn configured_read_and_write_roots_open_exactly_what_they_name() {
    if let Some(why) = strict_unavailable() {
        vibeos_testkit::skip!("strict mode is unavailable on this machine: {why}");
    }
    let sb = Sandbox::new();
    let data = sb.root.path().join("data");
    let out = sb.root.path().join("out");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(data.join("input.txt"), "input line\n").unwrap();
    sb.write_config(&format!(
        "code_execution:\n  strict:\n    read_roots: [{}]\n    write_roots: [{}]\n",
        data.display(),
        out.display()
    ));
    let script = format!(
        "import json\nfrom vibeos_tools import read_file, write_file, search_files\n\
         r = {{}}\n\
         r['read_data'] = read_file({data:?})\n\
         r['write_data'] = write_file({data_new:?}, 'x')\n\
         r['write_out'] = write_file({out_new:?}, 'result')\n\
         r['search_data'] = search_files('input', path={data_dir:?})\n\
         print('ROOTS ' + json.dumps(r))\n",
        data = data.join("input.txt").display().to_string(),
        data_new = data.join("new.txt").display().to_string(),
        out_new = out.join("deep/result.txt").display().to_string(),
        data_dir = data.display().to_string(),
    );
    let result = sb.run_json(&script, &["--mode", "strict"]);
    assert_eq!(result["status"], "success", "{result}");
    let line = result["output"]
        .as_str()
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("ROOTS "))
        .unwrap()
        .to_string();
    let r: Value = serde_json::from_str(&line).unwrap();
    assert!(
        r["read_data"]["content"]
            .as_str()
            .unwrap_or_default()
            .contains("input line"),
        "{r}"
    );
    let refused = r["write_data"]["error"].as_str().unwrap_or_default();
    assert!(
        refused.contains("write_roots"),
        "a read root was written: {r}"
    );
    assert!(!data.join("new.txt").exists());
    assert_eq!(r["write_out"]["created"], true, "{r}");
    assert_eq!(
        std::fs::read_to_string(out.join("deep/result.txt")).unwrap(),
        "result"
    );
    assert_eq!(r["search_data"]["total"], 1, "{r}");

    // A root that does not exist refuses the run with the setting named.
    sb.write_config("code_execution:\n  strict:\n    read_roots: [/no/such/dir]\n");
    let bad = sb.run_json("print('ran')", &["--mode", "strict"]);
    assert_eq!(bad["status"], "error", "{bad}");
    assert!(
        bad["error"]
            .as_str()
            .unwrap_or_default()
            .contains("read_roots"),
        "{bad}"
    );
}

#[test]
fn terminal_reaches_strict_scripts_only_when_config_opens_it() {
    if let Some(why) = strict_unavailable() {
        vibeos_testkit::skip!("strict mode is unavailable on this machine: {why}");
    }
    let sb = Sandbox::new();
    let script = "import vibeos_tools\nprint('HAS', 'terminal' in vibeos_tools._TOOLS)\n\
                  if 'terminal' in vibeos_tools._TOOLS:\n    \
                  print('RAN', vibeos_tools.terminal(command='echo opened')['output'].strip())\n";
    let closed = sb.run_json(script, &["--mode", "strict"]);
    assert_eq!(closed["status"], "success", "{closed}");
    assert!(
        closed["output"].as_str().unwrap().contains("HAS False"),
        "{closed}"
    );
    sb.write_config("code_execution:\n  strict:\n    terminal: true\n");
    let open = sb.run_json(script, &["--mode", "strict"]);
    assert_eq!(open["status"], "success", "{open}");
    let out = open["output"].as_str().unwrap();
    assert!(
        out.contains("HAS True") && out.contains("RAN opened"),
        "{open}"
    );
}

#[test]
fn doctor_reports_a_broken_config_file_with_the_rest_of_its_findings() {
    let sb = Sandbox::new();
    sb.write_config("terminal: [unclosed\n");
    let out = sb.run(&["doctor"]);
    assert_eq!(out.status.code(), Some(2), "a config error stays exit 2");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("mode project enforces"), "{text}");
    assert!(text.contains("config: ERROR:"), "{text}");
    let out = sb.run(&["doctor", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["config_error"].is_string(), "{v}");
    assert!(v["modes"]["project"].is_array(), "{v}");
}
