//! Differences between the product and the text of issues 13 and 16 (and SPEC §9–10) found by
//! the audit of docs/audit-issues-13-16.md, each pinned by an end-to-end test through the
//! built binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use vibeos_testkit::backends::{unavailable, Dockerd, SSH_USER};
use vibeos_testkit::Sandbox;

/// The script's printed JSON.
fn printed(r: &Value) -> Value {
    let out = r["output"].as_str().unwrap_or("");
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("output not JSON ({e}): {r}"))
}

/// Runs `core/churn_then_call.py` and checks that both of its single-shot calls were served.
fn churn_then_call(sb: &Sandbox, args: &[&str]) {
    let r = sb.run_fixture("core/churn_then_call.py", args);
    assert_eq!(r["status"], "success", "{r}");
    let out = printed(&r);
    // Served means a result (read_file of a missing file: a tool error inside it), not the
    // channel's too_many_connections refusal.
    assert!(
        out["raw"]["result"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("FileNotFound")),
        "the call after the churn was refused: {out}"
    );
    assert!(
        out["stub"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("FileNotFound")),
        "{out}"
    );
    assert_eq!(r["tool_calls_made"], 2, "{r}");
}

#[test]
fn closed_connections_never_block_the_next_call_locally() {
    churn_then_call(&Sandbox::new(), &[]);
}

#[test]
fn closed_connections_never_block_the_next_call_in_docker() {
    // Through the container's bind-mounted socket dir the server fell behind the churn every
    // time: the fresh connection met "64 open RPC connections" although all were closed.
    const IMAGE: &str = "vibeos-py:audit";
    let (daemon, cli) = match Dockerd::with_image(IMAGE) {
        Ok(d) => d,
        Err(why) => return unavailable(&why),
    };
    let mut sb = Sandbox::new();
    sb.write_config(&format!(
        "terminal:\n  docker_image: {IMAGE}\n  docker_binary: {cli}\n"
    ));
    sb.set_env("VIBEOS_AGENT_BINARY", env!("CARGO_BIN_EXE_vibeos-exec"));
    churn_then_call(&sb, &["--backend", "docker"]);
    assert!(daemon.labelled().is_empty(), "{:?}", daemon.labelled());
}

#[test]
fn ssh_backend_works_below_a_long_tmpdir() {
    // The ControlMaster's socket lived in $TMPDIR: below a long one, every ssh run failed with
    // "unix_listener: path ... too long for Unix domain socket".
    let Some((_ssh, sshd)) = super::ssh_turn(false) else {
        return;
    };
    let mut sb = Sandbox::new();
    let long = sb
        .root
        .path()
        .join("a-temporary-directory-with-a-name-as-long-as-some-ci-runners-use");
    std::fs::create_dir(&long).unwrap();
    let d = sshd.dir.path().display();
    sb.write_config(&format!(
        "terminal:\n  ssh_host: 127.0.0.1\n  ssh_port: {}\n  ssh_user: {SSH_USER}\n  \
         ssh_key: {d}/userkey\n  ssh_known_hosts: {d}/known_hosts\n",
        sshd.port
    ));
    sb.set_env("TMPDIR", long.to_str().unwrap());
    sb.set_env("VIBEOS_AGENT_BINARY", env!("CARGO_BIN_EXE_vibeos-exec"));
    churn_then_call(&sb, &["--backend", "ssh"]);
}

#[test]
fn backend_help_names_every_backend() {
    // SPEC §9 lists six backends; `--backend` on run and serve must offer all of them.
    let sb = Sandbox::new();
    for cmd in ["run", "serve"] {
        let out = sb.run(&[cmd, "--help"]);
        assert!(out.status.success(), "{out:?}");
        let help = String::from_utf8_lossy(&out.stdout).replace(char::is_whitespace, " ");
        let line = help
            .split("--backend <NAME>")
            .nth(1)
            .unwrap_or_else(|| panic!("{cmd} --help has no --backend: {help}"));
        for name in ["local", "docker", "ssh", "singularity", "modal", "daytona"] {
            assert!(
                line[..line.len().min(400)].contains(name),
                "{cmd} --help: --backend does not name {name}: {line}"
            );
        }
    }
    // Every name the help offers is accepted (exit 2 only for a missing key, not an unknown
    // backend).
    for name in ["podman", "apptainer", "modal", "daytona"] {
        let out = sb.run(&["run", "--backend", name, "-"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("unknown backend"), "{name}: {stderr}");
    }
    let out = sb.run(&["doctor", "--help"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("each backend"),
        "{out:?}"
    );
}

#[test]
fn a_timeout_under_a_nanosecond_is_refused_not_reported_as_0s() {
    // `--timeout 1e-320` is positive but a zero duration: the script was killed at once and
    // the run said "timed out after 0s". Refused as a usage error, as `--timeout 0` is.
    let sb = Sandbox::new();
    let script = sb.root.path().join("one.py");
    std::fs::write(&script, "print(1)\n").unwrap();
    let out = sb.run(&["run", "--timeout", "1e-320", script.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--timeout 1e-320 is shorter than a nanosecond")
            && stderr.contains("give at least 1e-9 seconds")
            && !stderr.contains("timed out"),
        "{stderr}"
    );
    let v = sb.run_json("print(1)", &["--timeout", "1e-320"]);
    assert_eq!(v["status"], "error", "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap_or("")
            .contains("shorter than a nanosecond"),
        "{v}"
    );
}

#[test]
fn negative_limits_name_the_flag() {
    // clap took `-1` for an unknown option ("unexpected argument '-1' found"); the message must
    // name the flag and the accepted range, with and without --json.
    let sb = Sandbox::new();
    let v = sb.run_json("print(1)", &["--timeout", "-1"]);
    assert_eq!(v["status"], "error", "{v}");
    let err = v["error"].as_str().unwrap_or("");
    assert!(
        err.contains("--timeout -1 is not a usable number of seconds"),
        "{v}"
    );
    let script = sb.root.path().join("one.py");
    std::fs::write(&script, "print(1)\n").unwrap();
    let out = sb.run(&["run", "--max-tool-calls", "-1", script.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--max-tool-calls") && !stderr.contains("unexpected argument"),
        "{stderr}"
    );
}

#[test]
fn readme_configs_load() {
    // "README: a section per backend with a copy-paste config": every ```yaml block of the
    // README must load as it stands and with its commented-out keys switched on. A backend that
    // needs a service credential may refuse to start, but never because of the config text.
    let readme =
        std::fs::read_to_string(vibeos_testkit::workspace_root().join("README.md")).unwrap();
    let blocks: Vec<&str> = readme
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .collect();
    assert!(blocks.len() >= 6, "README lost its config blocks");
    let sb = Sandbox::new();
    let config = sb.root.path().join("readme.yaml");
    let credentials = ["DAYTONA_API_KEY", "MODAL_TOKEN_ID"];
    for block in &blocks {
        let uncommented: String = block
            .lines()
            .map(|l| {
                let t = l.trim_start();
                match t.strip_prefix("# ") {
                    Some(rest)
                        if rest.split_once(':').is_some_and(|(k, _)| {
                            !k.is_empty()
                                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                        }) =>
                    {
                        format!("{}{rest}", &l[..l.len() - t.len()])
                    }
                    _ => l.to_string(),
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        for text in [block.to_string(), uncommented] {
            std::fs::write(&config, &text).unwrap();
            let out = sb.run(&["tools", "list", "--config", config.to_str().unwrap()]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() || credentials.iter().any(|c| stderr.contains(c)),
                "README config does not load:\n{text}\n{stderr}"
            );
        }
    }
}

#[test]
fn terminal_reports_the_directory_the_session_is_in() {
    // With shell sessions a `cd` moves the next call; the result's `cwd` kept naming the base
    // dir, contradicting `pwd` in the same result.
    let sb = Sandbox::new();
    let script = "import json\nfrom vibeos_tools import terminal\n\
                  a = terminal('mkdir -p sub && cd sub')\n\
                  b = terminal('pwd')\n\
                  c = terminal('pwd', workdir='/')\n\
                  print(json.dumps([a['cwd'], b['cwd'], b['output'].strip(), c['cwd']]))\n";
    let v = sb.run_json(script, &[]);
    assert_eq!(v["status"], "success", "{v}");
    let got = printed(&v);
    let sub = sb.work().join("sub").display().to_string();
    assert_eq!(got, serde_json::json!([sub, sub, sub, "/"]), "{v}");

    sb.write_config("terminal:\n  shell_session: false\n");
    let v = sb.run_json(script, &[]);
    let got = printed(&v);
    let work = sb.work().display().to_string();
    assert_eq!(got, serde_json::json!([work, work, work, "/"]), "{v}");
}

#[test]
fn backends_gc_with_a_dead_engine_is_a_runtime_error() {
    // SPEC §10: exit 2 is for usage and config errors. An engine that cannot be reached is
    // neither (`run` exits 1 for it); `backends gc` exited 2.
    let mut sb = Sandbox::new();
    sb.set_env("DOCKER_HOST", "unix:///nonexistent/docker.sock");
    let out = sb.run(&["backends", "gc"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    // Names the engine and what to do (start the daemon / set DOCKER_HOST, or install the CLI).
    assert!(
        stderr.contains("docker") && (stderr.contains("DOCKER_HOST") || stderr.contains("install")),
        "{stderr}"
    );
}

#[test]
fn doctor_lists_each_backend_on_one_aligned_line() {
    // "singularity" overflowed the name column, and a client's multi-line message split a
    // backend's entry over several lines.
    let sb = Sandbox::new();
    let out = sb.run(&["doctor"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let section: Vec<&str> = text
        .split("\nbackends:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no backends section: {text}"))
        .lines()
        .take_while(|l| l.starts_with("  "))
        .collect();
    let names: Vec<&str> = section
        .iter()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        names,
        ["local", "docker", "ssh", "daytona", "singularity", "modal"],
        "{text}"
    );
    // Where each line's status starts (after the name and its padding).
    let column: Vec<usize> = section
        .iter()
        .map(|l| {
            let after_name = l
                .trim_start()
                .trim_start_matches(|c: char| !c.is_whitespace());
            l.len() - after_name.trim_start().len()
        })
        .collect();
    assert!(column.windows(2).all(|w| w[0] == w[1]), "{text}");
}
