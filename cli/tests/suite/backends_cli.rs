//! The backend choice through the CLI: unknown backends and missing keys exit 2 naming them,
//! doctor reports every backend, `terminal` keeps `cd`/`export` between calls of a task in the
//! local backend (and stops when `terminal.shell_session: false`), and a script's result gains
//! `"backend"` only in a remote backend. The docker and ssh paths themselves are covered in
//! cli/tests/suite/backend_*.rs against real daemons.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use vibeos_testkit::Sandbox;

fn exit_2_naming(sb: &Sandbox, args: &[&str], needle: &str) {
    let script = sb.root.path().join("noop.py");
    std::fs::write(&script, "print(1)\n").expect("script");
    let mut all: Vec<&str> = args.to_vec();
    let p = script.to_string_lossy().into_owned();
    all.push(&p);
    let out = sb.run(&all);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(stderr.contains(needle), "{args:?}: {stderr}");
}

#[test]
fn unknown_backend_or_missing_key_exits_2_naming_it() {
    let sb = Sandbox::new();
    sb.write_config("");
    exit_2_naming(&sb, &["run", "--backend", "kubernetes"], "kubernetes");
    exit_2_naming(&sb, &["run", "--backend", "modal"], "modal");
    exit_2_naming(
        &sb,
        &["run", "--backend", "docker"],
        "terminal.docker_image",
    );
    exit_2_naming(&sb, &["run", "--backend", "ssh"], "terminal.ssh_host");
    sb.write_config("terminal:\n  backend: docker\n");
    exit_2_naming(&sb, &["run"], "terminal.docker_image");
    // Named in the file it is missing from, like every other config error.
    let other = sb.root.path().join("other.yaml");
    std::fs::write(&other, "terminal:\n  backend: docker\n").unwrap();
    let config_flag = other.display().to_string();
    exit_2_naming(
        &sb,
        &["run", "--config", &config_flag],
        &format!("{config_flag}: backend `docker` needs `terminal.docker_image`"),
    );
    sb.write_config("terminal:\n  backend: ssh\n  ssh_host: h\n  ssh_port: nope\n");
    exit_2_naming(&sb, &["run"], "terminal.ssh_port");
    // A host that ssh would read as an option is refused as a name, not passed to ssh (whose
    // usage text was the only error).
    sb.write_config("terminal:\n  backend: ssh\n  ssh_host: \"-oProxyCommand=touch /tmp/x\"\n");
    exit_2_naming(&sb, &["run"], "terminal.ssh_host");
    // An image docker would read as an option of `docker run` (stop 54): refused as a
    // reference, never passed to the engine (none exists here: had it run, it would be named).
    for image in ["--privileged", "--volume=/:/host"] {
        sb.write_config(&format!(
            "terminal:\n  backend: docker\n  docker_binary: /nonexistent/engine\n  docker_image: \"{image}\"\n"
        ));
        exit_2_naming(&sb, &["run"], "terminal.docker_image");
    }
    sb.write_config("terminal:\n  backend: nonsense\n");
    exit_2_naming(&sb, &["run"], "nonsense");
    // Strict mode in a remote backend is known not to work from the configuration alone: a
    // usage error, said before the backend is started (the engine here does not exist: had it
    // been run, the error would name it).
    sb.write_config(
        "terminal:\n  docker_image: img\n  docker_binary: /nonexistent/engine\n  ssh_host: 127.0.0.1\n",
    );
    for backend in ["docker", "ssh"] {
        exit_2_naming(
            &sb,
            &["run", "--mode", "strict", "--backend", backend],
            &format!("cannot be applied inside the {backend} backend"),
        );
    }
    // serve takes the same flag and fails the same way before serving anything.
    let out = sb.run(&["serve", "--backend", "kubernetes"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("kubernetes"));
    // --json still prints one result object.
    let out = sb.run(&["run", "--json", "--backend", "kubernetes", "-"]);
    let v = vibeos_testkit::parse_single_json(&out);
    assert_eq!(v["status"], "error");
    assert!(
        v["error"].as_str().unwrap_or("").contains("kubernetes"),
        "{v}"
    );
}

#[test]
fn doctor_reports_every_backend() {
    let sb = Sandbox::new();
    sb.write_config(
        "terminal:\n  ssh_host: 127.0.0.1\n  ssh_port: 1\n  ssh_known_hosts: accept-new\n",
    );
    let out = sb.run(&["doctor", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor json");
    let backends = v["backends"].as_array().expect("backends array");
    let by_name = |n: &str| {
        backends
            .iter()
            .find(|b| b["name"] == n)
            .unwrap_or_else(|| panic!("{n} missing: {v}"))
            .clone()
    };
    let local = by_name("local");
    assert_eq!(local["selected"], true);
    assert_eq!(local["reachable"], true);
    let docker = by_name("docker");
    assert_eq!(docker["configured"], false, "no docker_image set: {docker}");
    let ssh = by_name("ssh");
    assert_eq!(ssh["configured"], true);
    assert_eq!(ssh["reachable"], false, "nothing listens on port 1: {ssh}");
    assert!(
        ssh["detail"].as_str().unwrap_or("").contains("127.0.0.1"),
        "{ssh}"
    );
    let text = sb.run(&["doctor"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("backends:") && text.contains("ssh") && text.contains("not reachable"),
        "{text}"
    );

    // A selected backend that lacks a key is a finding of the report (exit 2), not a reason
    // to report nothing.
    sb.write_config("terminal:\n  backend: docker\n");
    let out = sb.run(&["doctor"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("backends:"), "{text}");
    assert!(
        text.contains("backend: ERROR") && text.contains("terminal.docker_image"),
        "{text}"
    );
    let out = sb.run(&["doctor", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor json");
    assert!(
        v["backend_error"]
            .as_str()
            .unwrap_or("")
            .contains("terminal.docker_image"),
        "{v}"
    );
    assert!(
        v["backends"].as_array().is_some_and(|b| b.len() == 6),
        "{v}"
    );
    // `env audit` needs only the backend's name: what the script there would get, with this
    // host's PATH and HOME left here.
    let out = sb.run(&["env", "audit", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let audit: serde_json::Value = serde_json::from_slice(&out.stdout).expect("audit json");
    assert_eq!(audit["backend"], "docker", "{audit}");
    let path = audit["variables"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == "PATH").cloned());
    assert!(
        path.as_ref()
            .is_some_and(|p| p["kept"] == false
                && p["rule"].as_str().unwrap_or("").contains("host-specific")),
        "{audit}"
    );
    let out = sb.run(&["env", "audit", "--backend", "local", "--json"]);
    let audit: serde_json::Value = serde_json::from_slice(&out.stdout).expect("audit json");
    assert_eq!(audit["backend"], "local", "{audit}");

    // With a remote backend selected, doctor says what project mode is there and that strict
    // mode refuses, as `run --mode strict` does.
    sb.write_config(
        "terminal:\n  backend: ssh\n  ssh_host: 127.0.0.1\n  ssh_port: 1\n  ssh_known_hosts: accept-new\n",
    );
    let out = sb.run(&["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor json");
    assert_eq!(v["strict_available"], false, "{v}");
    let project = v["modes"]["project"].to_string();
    assert!(
        project.contains("inside the ssh backend") && !project.contains("supervisor's rights"),
        "{v}"
    );
    assert!(
        v["strict_blocker"]
            .as_str()
            .is_some_and(|b| b.contains("ssh backend")),
        "{v}"
    );
}

#[test]
fn local_terminal_keeps_cd_and_export_between_calls() {
    let sb = Sandbox::new();
    sb.write_config("");
    let script = "from vibeos_tools import terminal\n\
                  terminal('mkdir -p deeper && cd deeper && export KEPT_VAR=yes')\n\
                  r = terminal('pwd; echo \"[$KEPT_VAR]\"')\n\
                  print(r['output'])\n";
    let v = sb.run_json(script, &[]);
    assert_eq!(v["status"], "success", "{v}");
    let out = v["output"].as_str().unwrap_or("");
    assert!(out.contains("/deeper\n[yes]"), "{v}");
    assert!(
        v.get("backend").is_none(),
        "local results have no backend key: {v}"
    );

    sb.write_config("terminal:\n  shell_session: false\n");
    let v = sb.run_json(script, &[]);
    assert_eq!(v["status"], "success", "{v}");
    let out = v["output"].as_str().unwrap_or("");
    assert!(out.contains("[]") && !out.contains("/deeper"), "{v}");
}

/// A command that exports a PATH where nothing is found, or sets an EXIT trap of its own, still
/// has its `cd` and `export` kept, and the wrapper's own work leaves nothing in its output: the
/// save used `mv` from that PATH (`mv: command not found` in the output, the export lost) and
/// lived only in the EXIT trap the command replaced.
#[test]
fn the_session_is_saved_whatever_path_or_trap_a_command_sets() {
    let sb = Sandbox::new();
    sb.write_config("");
    let script = "from vibeos_tools import terminal\n\
                  a = terminal('mkdir -p d1 && cd d1 && export PATH=/nowhere KEPT=1')\n\
                  b = terminal('echo \"$PATH [$KEPT]\"; pwd')\n\
                  c = terminal('cd /; trap \"echo mytrap\" EXIT; export T=2')\n\
                  d = terminal('echo \"[$T]\"; pwd')\n\
                  print(repr(a['output']), repr(b['output']), repr(c['output']), repr(d['output']))\n";
    let v = sb.run_json(script, &[]);
    assert_eq!(v["status"], "success", "{v}");
    let out = v["output"].as_str().unwrap_or("");
    assert!(
        !out.contains("not found"),
        "the wrapper's work leaked: {out}"
    );
    assert!(out.contains("/nowhere [1]") && out.contains("/d1"), "{out}");
    assert!(
        out.contains("mytrap") && out.contains("'[2]\\n/\\n'"),
        "{out}"
    );
    // A dir whose name ends in a space is restored whole; a command whose last line ends in a
    // backslash does not take the wrapper's save call as an argument.
    let script = r#"from vibeos_tools import terminal
terminal('mkdir -p "sp " && cd "sp "')
print(repr(terminal('pwd')['output']))
print(repr(terminal('echo hi \\')['output']))
"#;
    let v = sb.run_json(script, &[]);
    let out = v["output"].as_str().unwrap_or("");
    assert!(out.contains("/sp \\n'"), "{v}");
    assert!(
        out.contains("'hi\\n'") && !out.contains("__vibeos_save"),
        "{v}"
    );
}

/// Commands of one session that run at once each save the session's state under their own
/// name: they once shared one temp file, and the loser's `mv` wrote "cannot stat" into the
/// output of a command that had printed only its own line.
#[test]
fn concurrent_commands_of_one_session_print_only_their_own_output() {
    let sb = Sandbox::new();
    sb.write_config("");
    let script = "from vibeos_tools import terminal\n\
                  import threading\n\
                  outs = {}\n\
                  def go(i): outs[i] = terminal(f'export A{i}={i}; echo hi{i}')['output']\n\
                  ts = [threading.Thread(target=go, args=(i,)) for i in range(8)]\n\
                  [t.start() for t in ts]; [t.join() for t in ts]\n\
                  print([outs[i] for i in range(8) if outs[i] != f'hi{i}\\n'])\n\
                  print(terminal('export')['output'].count('__vibeos'))\n";
    for _ in 0..3 {
        let v = sb.run_json(script, &[]);
        assert_eq!(v["status"], "success", "{v}");
        // No output but each command's own, and no session bookkeeping left in the env.
        assert_eq!(v["output"], "[]\n0\n", "{v}");
    }
}

/// `backends gc --json` whose every sweep failed still prints its report (each backend with its
/// error) for the caller that parses stdout; it printed nothing. The exit code stays 1: an
/// engine that cannot be reached may hold containers (`--backend docker` leaves no config).
#[test]
fn gc_json_reports_an_unreachable_engine_on_stdout() {
    let mut sb = Sandbox::new();
    sb.write_config("");
    let socket = sb.root.path().join("no-engine.sock");
    sb.set_env("DOCKER_HOST", &format!("unix://{}", socket.display()));
    let out = sb.run(&["backends", "gc", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v = vibeos_testkit::parse_single_json(&out);
    assert!(v["backends"]["docker"]["error"].is_string(), "{v}");
    assert!(v["engine"].is_string(), "docker was swept: {v}");
    assert_eq!(v["removed"], serde_json::json!([]));
    assert!(String::from_utf8_lossy(&out.stderr).contains("docker"));
}
