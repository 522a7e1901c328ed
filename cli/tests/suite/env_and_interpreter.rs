//! End-to-end tests of what reaches the child: the scrubbed environment (SPEC §4), the audit
//! that explains it, and interpreter resolution in project mode (SPEC §3).

// Tests report failures by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use vibeos_testkit::{fixture, parse_single_json, python3, Sandbox};

fn child_env(sb: &Sandbox, args: &[&str]) -> (Value, Value) {
    let p = fixture("core/print_env.py");
    let mut all = vec!["run", "--json"];
    all.extend_from_slice(args);
    all.push(p.to_str().unwrap());
    let out = sb.run(&all);
    let r = parse_single_json(&out);
    assert_eq!(r["status"], "success", "{r}");
    let env: Value = serde_json::from_str(r["output"].as_str().unwrap().trim()).unwrap();
    (r, env)
}

const SECRET_VALUE: &str = "sup3r-s3cret-value-do-not-leak";

fn secretive_sandbox() -> Sandbox {
    let mut sb = Sandbox::new();
    for name in [
        "GITHUB_TOKEN",
        "MY_API_KEY",
        "DB_PASSWORD",
        "SENTRY_DSN",
        "SLACK_WEBHOOK_URL",
        "aws_secret_access_key",
        "OPENAI_API_KEY",
        "MY_PASSTHROUGH_KEY",
        "VIBEOS_KANBAN_DB",
        "VIBEOS_BASE_URL",
        "PATHOLOGICAL_VAR",
        "RANDOM_SETTING",
    ] {
        sb.set_env(name, SECRET_VALUE);
    }
    sb.set_env("LC_ALL", "C.UTF-8");
    sb.set_env("XDG_CONFIG_HOME", "/tmp/xdg");
    sb.set_env("VIBEOS_PROFILE", "work");
    sb.set_env("TZ", "Europe/Berlin");
    sb.write_config(
        "terminal:\n  env_passthrough:\n    - MY_PASSTHROUGH_KEY\n    - OPENAI_API_KEY\n    - VIBEOS_KANBAN_DB\n",
    );
    sb
}

#[test]
fn the_child_sees_only_what_the_policy_allows() {
    let sb = secretive_sandbox();
    let (_, env) = child_env(&sb, &["--log-level", "debug"]);
    let has = |k: &str| env.get(k).is_some();
    for dropped in [
        "GITHUB_TOKEN",
        "MY_API_KEY",
        "DB_PASSWORD",
        "SENTRY_DSN",
        "SLACK_WEBHOOK_URL",
        "aws_secret_access_key",
        "OPENAI_API_KEY", // provider credential: passthrough cannot bring it back
        "VIBEOS_BASE_URL",
        "PATHOLOGICAL_VAR",
        "RANDOM_SETTING",
    ] {
        assert!(!has(dropped), "{dropped} leaked into the child");
    }
    for kept in [
        "PATH",
        "HOME",
        "LC_ALL",
        "XDG_CONFIG_HOME",
        "VIBEOS_PROFILE",
        "VIBEOS_HOME",
        "MY_PASSTHROUGH_KEY",
        "VIBEOS_KANBAN_DB",
    ] {
        assert!(has(kept), "{kept} should reach the child");
    }
    assert_eq!(env["TZ"], "Europe/Berlin");
    assert_eq!(env["PYTHONDONTWRITEBYTECODE"], "1");
    assert_eq!(env["PYTHONIOENCODING"], "utf-8");
    assert_eq!(env["PYTHONUTF8"], "1");
    let pythonpath = env["PYTHONPATH"].as_str().unwrap();
    let socket = env["VIBEOS_RPC_SOCKET"].as_str().unwrap();
    let staging = Path::new(socket).parent().unwrap();
    assert!(pythonpath.starts_with(&staging.display().to_string()));
    assert_eq!(
        env["VIBEOS_RPC_DIR"].as_str().unwrap(),
        Path::new(socket).parent().unwrap().display().to_string()
    );
    assert_eq!(env["VIBEOS_RPC_TOKEN"].as_str().unwrap().len(), 64);
}

#[test]
fn dropped_vibeos_names_are_logged_once_at_debug_without_values() {
    let sb = secretive_sandbox();
    let out = sb.run(&[
        "run",
        "--log-level",
        "debug",
        fixture("core/print_env.py").to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("non-allowlisted VIBEOS_* var(s)"))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains(
        "execute_code: dropped 1 non-allowlisted VIBEOS_* var(s): VIBEOS_BASE_URL — add them to terminal.env_passthrough to allow them"
    ), "{}", lines[0]);
    assert!(!stderr.contains(SECRET_VALUE));
    // The same line lands in the log file, still without values.
    let log = std::fs::read_to_string(sb.home().join("logs/agent.log")).unwrap();
    assert!(log.contains("dropped 1 non-allowlisted VIBEOS_* var(s): VIBEOS_BASE_URL"));
    assert!(!log.contains(SECRET_VALUE));
    // At the default level the line is not printed.
    let quiet = sb.run(&["run", fixture("core/print_env.py").to_str().unwrap()]);
    assert!(!String::from_utf8_lossy(&quiet.stderr).contains("non-allowlisted"));
}

/// With MCP servers configured, each server's environment was scrubbed with the logging call
/// too, so the execution's line came twice; an `env audit` and a strict server's direct
/// terminal call (no execution at all) logged it as well.
#[test]
fn dropped_vibeos_names_are_logged_once_per_execution_only() {
    let dropped = |out: &std::process::Output| {
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.contains("dropped 1 non-allowlisted VIBEOS_* var(s): VIBEOS_ZZZ"))
            .count()
    };
    let mut sb = Sandbox::new();
    sb.set_env("VIBEOS_ZZZ", "1");
    sb.write_config("mcp_servers:\n  dummy:\n    command: /bin/true\n");
    let script = fixture("core/print_env.py");
    let out = sb.run(&["run", "--log-level", "debug", script.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(dropped(&out), 1, "{out:?}");

    let out = sb.run(&["--log-level", "debug", "env", "audit"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(dropped(&out), 0, "env audit runs nothing: {out:?}");

    // A strict server's direct terminal call runs no execution either; the execute_code call
    // after it logs the line once.
    if let Some(why) = vibeos_testkit::strict_unavailable() {
        vibeos_testkit::skip!("direct terminal call in strict mode: {why}");
    }
    sb.write_config("code_execution:\n  strict:\n    terminal: true\n");
    let mut child = sb
        .command()
        .args(["--log-level", "debug", "serve", "--mode", "strict"])
        .args(["--toolsets", "terminal"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::{BufRead, Write};
        let mut to = child.stdin.take().unwrap();
        let mut from = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut ask = |line: &str, id: Option<u64>| -> Option<Value> {
            to.write_all(format!("{line}\n").as_bytes()).unwrap();
            id?;
            let mut reply = String::new();
            from.read_line(&mut reply).unwrap();
            Some(serde_json::from_str(&reply).unwrap())
        };
        ask(
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#,
            Some(1),
        );
        ask(
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            None,
        );
        let direct = ask(
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"terminal","arguments":{"command":"echo direct-ran"}}}"#,
            Some(2),
        )
        .unwrap();
        assert!(direct.to_string().contains("direct-ran"), "{direct}");
        let script = ask(
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"execute_code","arguments":{"code":"print('script-ran')"}}}"#,
            Some(3),
        )
        .unwrap();
        assert!(script.to_string().contains("script-ran"), "{script}");
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(dropped(&out), 1, "{}", String::from_utf8_lossy(&out.stderr));
}

/// Any name can be set, and a newline in one used to start a line of its own in agent.log (a
/// forged entry) and in the `env audit` table.
#[test]
fn variable_names_cannot_forge_log_lines_or_audit_rows() {
    let forged = "2026-01-01T00:00:00.000000Z ERROR forged line";
    let mut sb = Sandbox::new();
    sb.set_env(&format!("VIBEOS_A\n{forged}"), "x");
    let script = fixture("core/print_env.py");
    let out = sb.run(&["run", "--log-level", "debug", script.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let log = std::fs::read_to_string(sb.home().join("logs/agent.log")).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    for text in [log.as_str(), &stderr] {
        assert!(
            !text.lines().any(|l| l.starts_with(forged)),
            "a name forged a line:\n{text}"
        );
        assert!(
            text.contains(&format!("var(s): VIBEOS_A\\n{forged} — add them")),
            "{text}"
        );
    }
    let table = sb.run(&["env", "audit"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        !text.lines().any(|l| l.starts_with(forged)),
        "a name broke the table:\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("VIBEOS_A\\n{forged}")) && l.contains("dropped")),
        "{text}"
    );
    // JSON keeps the name as it is (JSON escapes it).
    let json = sb.run(&["env", "audit", "--json"]);
    let v: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(v["variables"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == format!("VIBEOS_A\n{forged}")));
}

#[test]
fn a_run_that_logs_nothing_for_the_file_starts_no_log_writer() {
    // The file's writer (a thread, and the file itself) starts with the first line for it: a
    // quiet run at the default level has none, so nothing is created.
    let sb = Sandbox::new();
    let out = sb.run(&["run", fixture("core/print_env.py").to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        !sb.home().join("logs/agent.log").exists(),
        "a quiet run created the log file"
    );
    // A run that does log creates it, and the line is there once the run has exited.
    let out = sb.run(&[
        "run",
        "--log-level",
        "debug",
        fixture("core/print_env.py").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let log = std::fs::read_to_string(sb.home().join("logs/agent.log")).unwrap();
    assert!(!log.is_empty(), "a debug run left the log file empty");
}

#[test]
fn the_log_file_is_rotated_past_its_size_limit() {
    let sb = Sandbox::new();
    let logs = sb.home().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let old = "old line\n".repeat((10 << 20) / 9 + 1);
    std::fs::write(logs.join("agent.log"), &old).unwrap();
    let out = sb.run(&[
        "run",
        "--log-level",
        "debug",
        fixture("core/print_env.py").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{out:?}");
    // The full file moved aside whole; agent.log starts again with this run's lines.
    let rotated = std::fs::read_to_string(logs.join("agent.log.1")).unwrap();
    assert!(rotated.starts_with(&old), "the old log was not kept whole");
    let current = std::fs::read_to_string(logs.join("agent.log")).unwrap_or_default();
    assert!(current.len() < 1 << 20, "agent.log was not restarted");
}

#[test]
fn env_audit_names_every_variable_and_its_rule_but_no_value() {
    let sb = secretive_sandbox();
    let out = sb.run(&["env", "audit", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains(SECRET_VALUE));
    let v: Value = serde_json::from_str(stdout.trim()).unwrap();
    let find = |name: &str| -> Value {
        v["variables"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} missing from audit"))
    };
    // Whether `name` is kept, and by a rule that names `rule`.
    let decided = |name: &str, kept: bool, rule: &str| {
        let e = find(name);
        assert_eq!(e["kept"], kept, "{e}");
        assert!(e["rule"].as_str().unwrap().contains(rule), "{e}");
    };
    // GitHub tokens are managed credentials (issue 17): the provider blocklist decides them.
    decided("GITHUB_TOKEN", false, "provider");
    decided("OPENAI_API_KEY", false, "provider");
    decided("MY_PASSTHROUGH_KEY", true, "passthrough");
    assert_eq!(find("PATH")["kept"], true);
    assert_eq!(find("PATHOLOGICAL_VAR")["kept"], false);
    assert_eq!(find("VIBEOS_BASE_URL")["kept"], false);
    assert_eq!(find("VIBEOS_PROFILE")["kept"], true);
    assert!(v["injected"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n == "VIBEOS_RPC_SOCKET"));
    let table = sb.run(&["env", "audit"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("GITHUB_TOKEN") && text.contains("dropped"));
    assert!(!text.contains(SECRET_VALUE));
}

fn make_venv(python: &Path, dir: &Path) -> bool {
    Command::new(python)
        .args(["-m", "venv", "--without-pip"])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success())
}

fn prefix_of(r: &Value) -> String {
    r["output"].as_str().unwrap().trim().to_string()
}

#[test]
fn project_mode_uses_the_active_virtualenv() {
    let mut sb = Sandbox::new();
    let venv = sb.root.path().join("venv");
    assert!(make_venv(&python3(), &venv), "python3 -m venv failed");
    sb.set_env("VIRTUAL_ENV", venv.to_str().unwrap());
    let r = sb.run_json("import sys; print(sys.prefix)", &[]);
    assert_eq!(r["status"], "success", "{r}");
    assert_eq!(prefix_of(&r), venv.display().to_string());
    assert!(r["interpreter"]
        .as_str()
        .unwrap()
        .starts_with(venv.to_str().unwrap()));
    // CONDA_PREFIX works the same way when no venv is active.
    let mut sb = Sandbox::new();
    sb.set_env("CONDA_PREFIX", venv.to_str().unwrap());
    let r = sb.run_json("import sys; print(sys.prefix)", &[]);
    assert_eq!(prefix_of(&r), venv.display().to_string());
}

#[test]
fn a_broken_or_old_virtualenv_falls_back_with_a_reason() {
    // Broken: no interpreter inside.
    let mut sb = Sandbox::new();
    let broken = sb.root.path().join("broken-venv");
    std::fs::create_dir_all(broken.join("bin")).unwrap();
    sb.set_env("VIRTUAL_ENV", broken.to_str().unwrap());
    let out = sb.run_stdin(b"import sys; print(sys.prefix)", &["--json"]);
    let r = parse_single_json(&out);
    assert_eq!(r["status"], "success", "{r}");
    assert!(!prefix_of(&r).starts_with(broken.to_str().unwrap()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not using the VIRTUAL_ENV interpreter"),
        "{stderr}"
    );
    assert!(stderr.contains("no executable bin/python3"), "{stderr}");

    // Old: a venv that declares Python 3.7 (a real one when pyenv has it, else a copy of the
    // layout with the declared version).
    let mut sb = Sandbox::new();
    let old = sb.root.path().join("old-venv");
    let real37 = pyenv_python("3.7");
    match &real37 {
        Some(py) => assert!(make_venv(py, &old), "venv with {} failed", py.display()),
        None => {
            eprintln!(
                "note: no Python 3.7 under /root/.pyenv/versions; using a venv declaring 3.7"
            );
            assert!(make_venv(&python3(), &old));
            let cfg = std::fs::read_to_string(old.join("pyvenv.cfg")).unwrap();
            let cfg: String = cfg
                .lines()
                .map(|l| {
                    if l.starts_with("version") {
                        "version = 3.7.16".to_string()
                    } else {
                        l.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
            std::fs::write(old.join("pyvenv.cfg"), cfg).unwrap();
        }
    }
    sb.set_env("VIRTUAL_ENV", old.to_str().unwrap());
    let out = sb.run_stdin(
        b"import sys; print(sys.version_info[:2] >= (3, 8), sys.prefix)",
        &["--json"],
    );
    let r = parse_single_json(&out);
    assert_eq!(r["status"], "success", "{r}");
    assert!(prefix_of(&r).starts_with("True "), "{r}");
    assert!(!prefix_of(&r).contains(old.to_str().unwrap()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("older than the required 3.8"), "{stderr}");

    // Broken venv, working conda env: the log names where it falls back to, and that is used.
    let mut sb = Sandbox::new();
    let conda = sb.root.path().join("conda");
    assert!(make_venv(&python3(), &conda));
    sb.set_env("VIRTUAL_ENV", broken.to_str().unwrap());
    sb.set_env("CONDA_PREFIX", conda.to_str().unwrap());
    let out = sb.run_stdin(b"import sys; print(sys.prefix)", &["--json"]);
    let r = parse_single_json(&out);
    assert_eq!(prefix_of(&r), conda.display().to_string(), "{r}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("falling back to the CONDA_PREFIX interpreter"),
        "{stderr}"
    );

    // A bare prefix around Python 2 (nothing declares its version, so it is asked, and
    // Python 2 stops at the probe's `-I`): the reason says so rather than "no version".
    let Some(py2) = pyenv_python2() else {
        return eprintln!("note: no Python 2.7 under /root/.pyenv/versions; skipped that case");
    };
    let mut sb = Sandbox::new();
    let v27 = sb.root.path().join("v27");
    std::fs::create_dir_all(v27.join("bin")).unwrap();
    std::os::unix::fs::symlink(&py2, v27.join("bin/python")).unwrap();
    sb.set_env("VIRTUAL_ENV", v27.to_str().unwrap());
    let out = sb.run_stdin(b"import sys; print(sys.version_info[0])", &["--json"]);
    let r = parse_single_json(&out);
    assert_eq!(prefix_of(&r), "3", "{r}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("as Python 2, which has no `-I`, and programs that are not Python do); Python 3.8 or newer is needed"),
        "{stderr}"
    );
}

fn pyenv_python(minor: &str) -> Option<PathBuf> {
    let root = Path::new("/root/.pyenv/versions");
    let mut found: Vec<PathBuf> = std::fs::read_dir(root)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{minor}.")))
        })
        .map(|p| p.join("bin/python3"))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found.pop()
}

fn write_exe(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A `#!/bin/sh` interpreter at `path` that appends its arguments and environment to `log`,
/// then runs the real Python.
fn logging_python(path: &Path, log: &Path) {
    write_exe(
        path,
        &format!(
            "#!/bin/sh\n{{ echo \"ARGS $*\"; env; echo ----; }} >> {}\nexec {} \"$@\"\n",
            log.display(),
            python3().display()
        ),
    );
}

/// The probes that ask an interpreter its version (a venv whose layout does not say it) or
/// its real executable (a wrapper in strict mode) used to run with the caller's whole
/// environment, provider credentials included, and twice per run.
#[test]
fn interpreter_probes_get_the_scrubbed_environment_and_run_once_per_run() {
    let mut sb = Sandbox::new();
    for name in ["OPENAI_API_KEY", "GITHUB_TOKEN", "MY_API_KEY"] {
        sb.set_env(name, SECRET_VALUE);
    }
    // A venv without pyvenv.cfg or lib/pythonX.Y: only asking tells its version.
    let venv = sb.root.path().join("fake-venv");
    let log = sb.root.path().join("probe.log");
    logging_python(&venv.join("bin/python3"), &log);
    sb.set_env("VIRTUAL_ENV", venv.to_str().unwrap());
    let r = sb.run_json("print('ran')", &[]);
    assert_eq!(r["status"], "success", "{r}");
    assert_eq!(
        r["interpreter"],
        venv.join("bin/python3").display().to_string()
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains(SECRET_VALUE),
        "a probe saw a secret:\n{text}"
    );
    let probes = text.lines().filter(|l| l.starts_with("ARGS -I -c")).count();
    assert_eq!(probes, 1, "prestart and execute share one answer:\n{text}");
    assert!(text.contains("PATH="), "{text}");

    // Strict mode asks a configured wrapper which Python it runs.
    if let Some(why) = vibeos_testkit::strict_unavailable() {
        vibeos_testkit::skip!("strict wrapper probe: {why}");
    }
    let wrapper = sb.root.path().join("wrapper/python3");
    let log = sb.root.path().join("wrapper.log");
    logging_python(&wrapper, &log);
    sb.write_config(&format!(
        "code_execution:\n  python: {}\n",
        wrapper.display()
    ));
    let r = sb.run_json("print('ran')", &["--mode", "strict"]);
    assert_eq!(r["status"], "success", "{r}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("ARGS -E -s -c"),
        "the wrapper was not asked:\n{text}"
    );
    assert!(
        !text.contains(SECRET_VALUE),
        "a probe saw a secret:\n{text}"
    );
}

/// A probe that hangs cost its timeout twice per run (prestart, then execute), and a
/// wrapper's background children outlived it.
#[test]
fn a_hanging_probe_is_waited_for_once_and_killed_with_what_it_started() {
    let mut sb = Sandbox::new();
    let venv = sb.root.path().join("hanging-venv");
    let pids = sb.root.path().join("pids");
    write_exe(
        &venv.join("bin/python3"),
        &format!(
            "#!/bin/sh\nif [ \"$1\" = -I ]; then sleep 300 & echo $! >> {}; wait; fi\nexec {} \"$@\"\n",
            pids.display(),
            python3().display()
        ),
    );
    sb.set_env("VIRTUAL_ENV", venv.to_str().unwrap());
    let started = std::time::Instant::now();
    let out = sb.run_stdin(b"print('ran')", &["--json"]);
    let elapsed = started.elapsed();
    let r = parse_single_json(&out);
    assert_eq!(r["status"], "success", "{r}");
    assert_eq!(prefix_of(&r), "ran");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("did not report its version within 10 s"),
        "{stderr}"
    );
    assert!(
        elapsed < std::time::Duration::from_secs(18),
        "the hanging probe was waited for more than once: {elapsed:?}"
    );
    let started: Vec<i32> = std::fs::read_to_string(&pids)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(started.len(), 1, "{started:?}");
    for pid in started {
        assert!(
            !vibeos_testkit::pid_alive(pid),
            "the probe's background child {pid} outlived it"
        );
    }
}

/// The version a venv's `pyvenv.cfg` declares was believed whatever its `bin/python3` was.
#[test]
fn a_venv_is_believed_only_when_its_interpreter_is_what_it_declares() {
    // `bin/python3 -> /bin/cat` behind a cfg declaring 3.12: the run "succeeded", echoing the
    // script's source.
    let mut sb = Sandbox::new();
    let cat = sb.root.path().join("cat-venv");
    std::fs::create_dir_all(cat.join("bin")).unwrap();
    std::os::unix::fs::symlink("/bin/cat", cat.join("bin/python3")).unwrap();
    std::fs::write(
        cat.join("pyvenv.cfg"),
        "home = /usr/bin\nversion = 3.12.1\n",
    )
    .unwrap();
    sb.set_env("VIRTUAL_ENV", cat.to_str().unwrap());
    let out = sb.run_stdin(
        b"import sys\nprint(sys.version_info >= (3, 8))",
        &["--json"],
    );
    let r = parse_single_json(&out);
    assert_eq!(r["status"], "success", "{r}");
    assert_eq!(prefix_of(&r), "True", "{r}");
    assert!(!r["interpreter"]
        .as_str()
        .unwrap()
        .starts_with(cat.to_str().unwrap()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not using the VIRTUAL_ENV interpreter")
            && stderr.contains("did not report a Python version"),
        "{stderr}"
    );

    // A cfg claiming 3.12 in front of a real 3.6 ran the 3.6.
    match pyenv_python("3.6") {
        Some(py36) => {
            let mut sb = Sandbox::new();
            let old = sb.root.path().join("old-venv");
            assert!(
                make_venv(&py36, &old),
                "venv with {} failed",
                py36.display()
            );
            let cfg = std::fs::read_to_string(old.join("pyvenv.cfg")).unwrap();
            let cfg: String = cfg
                .lines()
                .map(|l| {
                    if l.starts_with("version") {
                        "version = 3.12.1\n".to_string()
                    } else {
                        format!("{l}\n")
                    }
                })
                .collect();
            std::fs::write(old.join("pyvenv.cfg"), cfg).unwrap();
            sb.set_env("VIRTUAL_ENV", old.to_str().unwrap());
            let out = sb.run_stdin(b"import sys; print(sys.version_info[:2])", &["--json"]);
            let r = parse_single_json(&out);
            assert_eq!(r["status"], "success", "{r}");
            assert!(!prefix_of(&r).contains("(3, 6)"), "{r}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains("older than the required 3.8"), "{stderr}");
        }
        None => {
            eprintln!("note: no Python 3.6 under /root/.pyenv/versions; cfg-vs-3.6 case skipped")
        }
    }

    // A venv that is what it declares is still not asked (cold start): its interpreter
    // resolves into the cfg's home under a name that fits. Here that "base interpreter" logs
    // how it is started.
    let mut sb = Sandbox::new();
    let version = vibeos_testkit::python_output(
        &python3(),
        "import sys; print('%d.%d' % sys.version_info[:2])",
        &[],
        &[],
    );
    let home = sb.root.path().join("base-bin");
    let log = sb.root.path().join("base.log");
    logging_python(&home.join(format!("python{version}")), &log);
    let venv = sb.root.path().join("good-venv");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    std::os::unix::fs::symlink(
        home.join(format!("python{version}")),
        venv.join("bin/python3"),
    )
    .unwrap();
    std::fs::write(
        venv.join("pyvenv.cfg"),
        format!("home = {}\nversion = {version}.0\n", home.display()),
    )
    .unwrap();
    sb.set_env("VIRTUAL_ENV", venv.to_str().unwrap());
    let r = sb.run_json("print('ran')", &[]);
    assert_eq!(r["status"], "success", "{r}");
    assert_eq!(
        r["interpreter"],
        venv.join("bin/python3").display().to_string()
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("ARGS -I -c"),
        "a trusted venv was probed:\n{text}"
    );
    assert!(
        text.contains("ARGS "),
        "the script did not run through it:\n{text}"
    );
}

/// `VIRTUAL_ENV=venv312 vibeos-exec run --cwd /elsewhere` checked `venv312` in the process
/// cwd but started `venv312/bin/python3` relative to the session cwd: "cannot start".
#[test]
fn a_relative_virtual_env_is_taken_from_the_callers_cwd() {
    let mut sb = Sandbox::new();
    let venv = sb.work().join("venv-rel");
    assert!(make_venv(&python3(), &venv), "python3 -m venv failed");
    let elsewhere = sb.root.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    sb.set_env("VIRTUAL_ENV", "venv-rel");
    let r = sb.run_json(
        "import os, sys; print(sys.prefix, os.getcwd())",
        &["--cwd", elsewhere.to_str().unwrap()],
    );
    assert_eq!(r["status"], "success", "{r}");
    let real = |p: &Path| std::fs::canonicalize(p).unwrap().display().to_string();
    assert_eq!(
        prefix_of(&r),
        format!("{} {}", venv.display(), real(&elsewhere)),
        "{r}"
    );
    assert_eq!(
        r["interpreter"],
        venv.join("bin/python3").display().to_string()
    );
}

/// A configured Python 2 used to fail only inside the script, with a `SyntaxError` about the
/// stub's encoding that named no setting.
#[test]
fn a_configured_python_too_old_for_the_stub_is_refused_naming_the_setting() {
    let sb = Sandbox::new();
    // A link to a wrapper named python2.7 (the check reads the name the links lead to, not the
    // interpreter), and a real Python 2.7 when pyenv has one.
    let named = sb.root.path().join("python2.7");
    let wrapper = format!("#!/bin/sh\nexec {} \"$@\"\n", python3().display());
    std::fs::write(&named, wrapper).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&named, std::fs::Permissions::from_mode(0o755)).unwrap();
    let link = sb.root.path().join("python");
    std::os::unix::fs::symlink(&named, &link).unwrap();
    let mut olds = vec![link];
    match pyenv_python2() {
        Some(py) => olds.push(py),
        None => eprintln!("note: no Python 2.7 under /root/.pyenv/versions; only the wrapper"),
    }
    for old in olds {
        sb.write_config(&format!("code_execution:\n  python: {}\n", old.display()));
        for mode in ["project", "strict"] {
            let out = sb.run_stdin(b"print('ran')", &["--json", "--mode", mode]);
            // A configuration error: exit 2, as for any bad setting (SPEC §10).
            assert_eq!(out.status.code(), Some(2), "{out:?}");
            let r = parse_single_json(&out);
            assert_eq!(r["status"], "error", "{r}");
            assert!(!r["output"].as_str().unwrap().contains("ran"), "{r}");
            let error = r["error"].as_str().unwrap();
            assert!(
                error.contains(&format!("code_execution.python is {}", old.display()))
                    && error.contains("which is Python 2.7; scripts need Python 3.8 or newer"),
                "{error}"
            );
        }
    }
}

fn pyenv_python2() -> Option<PathBuf> {
    let dir = std::fs::read_dir("/root/.pyenv/versions")
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("2.7."))
        })?;
    Some(dir.join("bin/python")).filter(|p| p.exists())
}

/// The variables a script sees in `mode` when the caller's environment holds only PATH and
/// VIBEOS_HOME (as under `env -i PATH=$PATH VIBEOS_HOME=…`).
fn minimal_env_of_script(sb: &Sandbox, mode: &str) -> serde_json::Map<String, Value> {
    let script = sb.root.path().join("env.py");
    std::fs::write(
        &script,
        "import json, os\nprint(json.dumps(dict(os.environ)))\n",
    )
    .unwrap();
    let mut cmd = sb.command();
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("VIBEOS_HOME", sb.home())
        .args(["run", "--json", "--mode", mode])
        .arg(&script);
    let r = parse_single_json(&cmd.output().unwrap());
    assert_eq!(r["status"], "success", "{r}");
    serde_json::from_str(r["output"].as_str().unwrap().trim()).unwrap()
}

#[test]
fn tz_is_injected_in_every_mode_and_the_audit_lists_what_each_mode_sets() {
    let sb = Sandbox::new();
    let mut modes = vec!["project"];
    match vibeos_testkit::strict_unavailable() {
        None => modes.push("strict"),
        Some(why) => eprintln!("strict mode skipped: {why}"),
    }
    let mut cmd = sb.command();
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("VIBEOS_HOME", sb.home())
        .args(["env", "audit", "--json"]);
    let audit = parse_single_json(&cmd.output().unwrap());
    let listed = audit["set_for_child"].as_array().unwrap().clone();
    for mode in modes {
        let env = minimal_env_of_script(&sb, mode);
        // SPEC §4: TZ is injected even when the caller has none (the host's zone, else UTC).
        let tz = env.get("TZ").and_then(Value::as_str);
        assert!(
            tz.is_some_and(|t| !t.is_empty()),
            "{mode}: no TZ in {env:?}"
        );
        for v in &listed {
            let name = v["name"].as_str().unwrap();
            let in_mode = v["modes"].as_array().unwrap().iter().any(|m| m == mode);
            if v["set_by"] == "vibeos-exec" {
                assert_eq!(
                    env.contains_key(name),
                    in_mode,
                    "{mode}: env audit says {name} is {}set, the script says otherwise",
                    if in_mode { "" } else { "not " }
                );
            }
        }
        // Everything the script finds beyond the caller's PATH and VIBEOS_HOME is listed.
        for name in env.keys() {
            if ["PATH", "VIBEOS_HOME", "PWD", "SHLVL", "_"].contains(&name.as_str())
                || name.starts_with("PYENV")
                || name.starts_with("_PYENV")
            {
                continue; // the caller's, or set by a shell or pyenv shim on the way
            }
            assert!(
                listed.iter().any(|v| v["name"] == name.as_str()),
                "{mode}: the script sees {name}, which env audit does not list"
            );
        }
        // The caller's TZ wins over the host's.
        let mut cmd = sb.command();
        let script = sb.root.path().join("tz.py");
        std::fs::write(&script, "import os\nprint(os.environ.get('TZ'))\n").unwrap();
        cmd.env("TZ", "Asia/Tokyo")
            .args(["run", "--mode", mode])
            .arg(&script);
        let out = cmd.output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "Asia/Tokyo\n",
            "{out:?}"
        );
    }
}

/// A `#!` wrapper on PATH (a pyenv shim) that selects its Python by the `.python-version` of
/// the cwd it runs in: `other` and `old` select as named, anything else the default. The
/// wrapper marks the environment it passes on, as pyenv's shims set `PYENV_*`.
struct SelectingWrapper {
    shims: PathBuf,
    default: PathBuf,
    other: PathBuf,
}

fn selecting_wrapper(sb: &mut Sandbox) -> SelectingWrapper {
    let root = sb.root.path().to_path_buf();
    let real = python3();
    // Two names for the one Python of this machine, each reported as its sys.executable.
    let named = |dir: &str| {
        let path = root.join(dir).join("python3");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&real, &path).unwrap();
        path
    };
    let (default, other) = (named("py-default"), named("py-other"));
    let py2 = match pyenv_python2() {
        Some(py) => format!("py2) exec {} \"$@\";;\n", py.display()),
        None => String::new(),
    };
    let shims = root.join("shims");
    write_exe(
        &shims.join("python3"),
        &format!(
            "#!/bin/sh\nexport WRAPPER_WAS_HERE=1\ncase \"$(cat .python-version 2>/dev/null)\" in\n\
             other) exec {other} \"$@\";;\n\
             old) printf '3.6\\n%s\\n' {other}; exit 0;;\n\
             {py2}\
             esac\nexec {default} \"$@\"\n",
            other = other.display(),
            default = default.display(),
        ),
    );
    // No code_execution.python: the default interpreter is python3 on PATH, the wrapper.
    std::fs::write(sb.home().join("config.yaml"), "").unwrap();
    let path = std::env::var("PATH").unwrap_or_default();
    sb.set_env("PATH", &format!("{}:{path}", shims.display()));
    SelectingWrapper {
        shims,
        default,
        other,
    }
}

fn project_dir(sb: &Sandbox, name: &str, version: &str) -> PathBuf {
    let dir = sb.root.path().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(".python-version"), format!("{version}\n")).unwrap();
    dir
}

const SHOW_INTERPRETER: &str = "import json, os, sys\nprint(json.dumps([sys.executable, \
     os.environ.get('WRAPPER_WAS_HERE'), os.environ['PATH'].split(':')[0]]))\n";

/// Project mode ran a wrapper on PATH as the interpreter: the wrapper's own variables reached
/// the script behind the scrubbing (and `env audit`), the result named the wrapper instead of
/// the Python that ran, and nothing checked the version the wrapper selected.
#[test]
fn a_wrapper_on_path_runs_what_it_selects_for_the_session_dir() {
    let mut sb = Sandbox::new();
    let w = selecting_wrapper(&mut sb);
    let pv = project_dir(&sb, "pv", "other");
    let shown = |r: &Value| -> Value {
        assert_eq!(r["status"], "success", "{r}");
        serde_json::from_str(r["output"].as_str().unwrap().trim()).unwrap()
    };
    let dir_of = |p: &Path| Value::from(p.parent().unwrap().display().to_string());
    for (args, selected) in [
        (vec!["--cwd", pv.to_str().unwrap()], &w.other),
        (vec![], &w.default),
    ] {
        let r = sb.run_json(SHOW_INTERPRETER, &args);
        let seen = shown(&r);
        let want = Value::from(selected.display().to_string());
        assert_eq!(r["interpreter"], want, "{args:?}: {r}");
        assert_eq!(seen[0], want, "{args:?}: {r}");
        assert_eq!(
            seen[1],
            Value::Null,
            "the wrapper's variables reached the script: {r}"
        );
        // As `pyenv exec` does: the selected Python's directory first on PATH.
        assert_eq!(seen[2], dir_of(selected), "{args:?}: {r}");
    }
    // The audit says where that PATH entry comes from.
    let audit = parse_single_json(&sb.run(&["env", "audit", "--json"]));
    assert!(
        audit["set_for_child"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "PATH"),
        "{audit}"
    );

    // A selection too old for the stub is refused, naming the wrapper, what it selected and
    // how to change it; the script does not run.
    let old = project_dir(&sb, "old", "old");
    let mut olds = vec![(old, w.other.clone(), "3.6")];
    match pyenv_python2() {
        Some(py) => olds.push((project_dir(&sb, "py2", "py2"), py, "2.7")),
        None => eprintln!("note: no Python 2.7 under /root/.pyenv/versions; only the fake"),
    }
    for (dir, selected, version) in olds {
        let out = sb.run_stdin(b"print('ran')", &["--json", "--cwd", dir.to_str().unwrap()]);
        let r = parse_single_json(&out);
        assert_eq!(r["status"], "error", "{r}");
        assert!(!r["output"].as_str().unwrap_or("").contains("ran"), "{r}");
        let error = r["error"].as_str().unwrap();
        let wrapper = w.shims.join("python3");
        for part in [
            format!("is {}, a #! wrapper", wrapper.display()),
            format!("selects {} in {}", selected.display(), dir.display()),
            format!("which is Python {version}; scripts need Python 3.8 or newer"),
            "pyenv local".to_string(),
        ] {
            assert!(error.contains(&part), "{part:?} not in: {error}");
        }
    }
}

/// Strict mode asked the wrapper in the supervisor's cwd, so a `--cwd` whose `.python-version`
/// selects another Python ran the one selected where `vibeos-exec` was started.
#[test]
fn strict_mode_asks_a_wrapper_in_the_session_dir() {
    if let Some(why) = vibeos_testkit::strict_unavailable() {
        vibeos_testkit::skip!("strict wrapper selection: {why}");
    }
    let mut sb = Sandbox::new();
    let w = selecting_wrapper(&mut sb);
    let pv = project_dir(&sb, "pv", "other");
    for (args, selected) in [
        (
            vec!["--mode", "strict", "--cwd", pv.to_str().unwrap()],
            &w.other,
        ),
        (vec!["--mode", "strict"], &w.default),
    ] {
        let r = sb.run_json("import sys; print(sys.executable)", &args);
        assert_eq!(r["status"], "success", "{r}");
        let want = selected.display().to_string();
        assert_eq!(r["interpreter"], want.as_str(), "{args:?}: {r}");
        assert_eq!(r["output"].as_str().unwrap().trim(), want, "{args:?}: {r}");
    }
}

#[test]
fn a_colon_in_a_path_never_splits_into_other_import_dirs() {
    // PYTHONPATH has no escape for `:`. A session dir `<root>/a:b` used to reach the script as
    // the entries `<root>/a` and a relative `b`: places someone else may own, imported from.
    let mut sb = Sandbox::new();
    let session = sb.root.path().join("a:b");
    std::fs::create_dir_all(session.join("b")).unwrap();
    std::fs::create_dir_all(sb.root.path().join("a")).unwrap();
    std::fs::write(
        sb.root.path().join("a/hijack_a.py"),
        "print('hijacked a')\n",
    )
    .unwrap();
    std::fs::write(session.join("b/hijack_b.py"), "print('hijacked b')\n").unwrap();
    let script = "import os\n\
                  print(os.environ['PYTHONPATH'].split(':'))\n\
                  for name in ('hijack_a', 'hijack_b'):\n    \
                      try:\n        __import__(name)\n    \
                      except ImportError:\n        print('no', name)\n";
    let r = sb.run_json(script, &["--cwd", session.to_str().unwrap()]);
    assert_eq!(r["status"], "success", "{r}");
    let out = r["output"].as_str().unwrap();
    assert!(!out.contains("hijacked"), "{out}");
    assert!(
        out.contains("no hijack_a") && out.contains("no hijack_b"),
        "{out}"
    );
    let log = std::fs::read_to_string(sb.home().join("logs/agent.log")).unwrap_or_default();
    assert!(
        log.contains("holds a ':'"),
        "the log does not say why: {log}"
    );
    // A staging dir cannot leave PYTHONPATH out: a TMPDIR holding `:` is refused, saying so.
    let tmp = sb.root.path().join("t:mp");
    std::fs::create_dir_all(&tmp).unwrap();
    sb.set_env("TMPDIR", tmp.to_str().unwrap());
    let r = sb.run_json("print('ran')\n", &[]);
    assert_eq!(r["status"], "error", "{r}");
    assert!(
        r["error"]
            .as_str()
            .unwrap_or_default()
            .contains("set TMPDIR to a directory without one"),
        "{r}"
    );
}
