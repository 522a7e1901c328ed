//! End-to-end: config.yaml is validated once, by its typed schema, before anything runs — an
//! unknown key, a value of the wrong type, an oversized or absurdly nested file are refused
//! with exit code 2 and a message naming the file and the key path; `--json` gets the same
//! message in a result object.

// Tests report failures by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use vibeos_testkit::{parse_single_json, Sandbox};

fn refused(sb: &Sandbox) -> String {
    let out = sb.run_stdin(b"print('ran')", &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "the script must not run: {out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn an_unknown_key_is_refused_naming_the_file_and_key_path() {
    let sb = Sandbox::new();
    let file = sb.home().join("config.yaml").display().to_string();
    sb.write_config("code_execution:\n  strict:\n    dsk_mb: 64\n");
    let err = refused(&sb);
    assert!(err.contains(&file), "{err}");
    assert!(err.contains("code_execution.strict"), "{err}");
    assert!(err.contains("unknown field `dsk_mb`"), "{err}");

    sb.write_config("termnal:\n  backend: local\n");
    let err = refused(&sb);
    assert!(err.contains("unknown field `termnal`"), "{err}");
}

#[test]
fn a_wrong_type_is_refused_naming_the_key_path_also_with_json() {
    let sb = Sandbox::new();
    let file = sb.home().join("config.yaml").display().to_string();
    sb.write_config("code_execution:\n  strict:\n    disk_mb: x\n");
    let err = refused(&sb);
    assert!(
        err.contains(&format!("{file}: code_execution.strict.disk_mb: ")),
        "{err}"
    );
    let out = sb.run(&["run", "--json", "-"]);
    assert_eq!(out.status.code(), Some(2));
    let r = parse_single_json(&out);
    assert_eq!(r["status"], "error", "{r}");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("code_execution.strict.disk_mb"),
        "{r}"
    );
}

#[test]
fn an_absurdly_nested_file_is_refused_with_a_clear_error() {
    // The file of issue 16: ~200 KB nested 100k deep (it took 20 s to reject before).
    let sb = Sandbox::new();
    let depth = 100_000;
    sb.write_config(&format!(
        "command_allowlist: {}{}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    ));
    let err = refused(&sb);
    assert!(err.contains("command_allowlist"), "{err}");
    let lower = err.to_lowercase();
    assert!(
        lower.contains("depth") || lower.contains("nest") || lower.contains("recursion"),
        "{err}"
    );
}

#[test]
fn an_oversized_file_is_refused_before_parsing() {
    let sb = Sandbox::new();
    let comment = format!("# {}\n", "x".repeat(1000));
    sb.write_config(&comment.repeat(1100));
    let err = refused(&sb);
    assert!(err.contains("larger than"), "{err}");
}

#[test]
fn every_documented_section_loads() {
    let sb = Sandbox::new();
    sb.write_config(
        "code_execution:\n  timeout: 30\n  max_tool_calls: 5\nterminal:\n  backend: local\n  \
         env_passthrough: [MY_VAR]\nlogging:\n  level: warn\napprovals:\n  mode: manual\n\
         command_allowlist: []\nweb:\n  timeout: 5\nsecurity:\n  redact_output: true\n\
         plugins:\n  enabled: false\nmcp_servers: {}\n",
    );
    let out = sb.run_stdin(b"print('ran')", &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
}

/// `--config <(...)`: the config comes from a pipe, which can be read once. It used to be read
/// twice at start (and again by the tools), the later reads found the pipe drained and the
/// defaults applied, so a broken config passed and a valid one was silently ignored.
#[test]
fn a_config_given_as_a_pipe_is_checked_and_applied() {
    let sb = Sandbox::new();
    // bash's process substitution, as a user types it; the script comes the same way.
    let run = |config: &str, script: &str| {
        sb.command_for("bash")
            .args([
                "-c",
                r#"exec "$0" --config <(printf '%s' "$1") run --json <(printf '%s' "$2")"#,
            ])
            .arg(vibeos_testkit::exec_bin())
            .args([config, script])
            .output()
            .unwrap()
    };
    let out = run("code_execution:\n  bogus_key: 1\n", "print('ran')");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let refused = parse_single_json(&out);
    assert!(
        refused["error"]
            .as_str()
            .is_some_and(|e| e.contains("unknown field `bogus_key`")),
        "{refused}"
    );
    let started = std::time::Instant::now();
    let out = run(
        "code_execution:\n  timeout: 1\n",
        "import time\ntime.sleep(30)\nprint('slept')\n",
    );
    let result = parse_single_json(&out);
    assert_eq!(result["status"], "timeout", "{result}");
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

#[test]
fn a_config_path_that_never_ends_is_refused_by_the_size_cap() {
    let sb = Sandbox::new();
    let out = sb.run(&["--config", "/dev/zero", "run", "-"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/dev/zero is larger than"), "{err}");
}

/// A script file or stdin that never ends (`run /dev/zero`, `yes | vibeos-exec run -`) is
/// refused once it passes 16 MiB, instead of being read until memory runs out.
#[test]
fn a_script_past_the_size_cap_is_refused_from_a_file_and_from_stdin() {
    let sb = Sandbox::new();
    let out = sb.run(&["run", "/dev/zero"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("script /dev/zero is larger than 16 MiB"),
        "{err}"
    );

    let big = "# padding\n".repeat((16 << 20) / 10 + 1);
    let out = sb.run_stdin(big.as_bytes(), &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("script from stdin is larger than 16 MiB"),
        "{err}"
    );
    // Just under the cap still runs.
    let fits = format!("{}print('ran')\n", "#\n".repeat(((16 << 20) - 20) / 2));
    let out = sb.run_stdin(fits.as_bytes(), &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
}

#[test]
fn a_value_of_a_lenient_wrong_type_is_refused_naming_the_key() {
    // Each was accepted before: a quoted string read as a boolean (redaction turned off by
    // "no"), numbers read as variable names, a word read as a one-entry list.
    let sb = Sandbox::new();
    let file = sb.home().join("config.yaml").display().to_string();
    for (text, key) in [
        (
            "security:\n  redact_output: \"no\"\n",
            "security.redact_output",
        ),
        (
            "terminal:\n  env_passthrough: [1, 2]\n",
            "terminal.env_passthrough[0]",
        ),
        ("command_allowlist: notalist\n", "command_allowlist"),
        (
            "code_execution:\n  timeout: '30'\n",
            "code_execution.timeout",
        ),
    ] {
        sb.write_config(text);
        let err = refused(&sb);
        assert!(err.contains(&format!("{file}: {key}: ")), "{text:?}: {err}");
    }
    // The documented YAML 1.1 spellings still work: `approvals.mode: off` is a boolean to YAML.
    sb.write_config("approvals:\n  mode: off\nsecurity:\n  redact_output: yes\n");
    let out = sb.run_stdin(b"print('ran')", &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ran\n");
}

#[test]
fn a_timeout_out_of_range_says_the_range() {
    let sb = Sandbox::new();
    sb.write_config("code_execution:\n  timeout: 100000\n");
    let err = refused(&sb);
    assert!(
        err.contains("`code_execution.timeout`")
            && err.contains("(positive, at most 86400), found 100000"),
        "{err}"
    );
}

/// `logging.level: bogus` was refused by the logger, naming neither the file nor the key.
#[test]
fn a_bad_logging_level_is_refused_naming_the_file_and_key() {
    let sb = Sandbox::new();
    let file = sb.home().join("config.yaml").display().to_string();
    sb.write_config("logging:\n  level: bogus\n");
    let err = refused(&sb);
    assert!(
        err.contains(&format!("config file {file}: `logging.level` "))
            && err.contains("found \"bogus\""),
        "{err}"
    );
    // The flag does not make the file's mistake go away, as for every other key.
    let out = sb.run(&["--log-level", "info", "run", "--json", "-"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let r = parse_single_json(&out);
    assert!(
        r["error"].as_str().unwrap().contains("`logging.level`"),
        "{r}"
    );
    sb.write_config("logging:\n  level: off\n");
    let out = sb.run_stdin(b"print('ran')", &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// An unusable `code_execution.python` (missing, not executable, named for a Python older
/// than 3.8, not a Python at all) is a configuration error: exit 2 as for every other bad setting (it was 1, the
/// code of a script that failed), naming the file and the key; `--json` gets one result
/// object.
#[test]
fn an_unusable_configured_python_is_a_config_error() {
    use std::os::unix::fs::PermissionsExt;
    let sb = Sandbox::new();
    let file = sb.home().join("config.yaml").display().to_string();
    let not_exec = sb.root.path().join("python3");
    std::fs::write(&not_exec, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&not_exec, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bad = vec![
        (
            sb.root.path().join("no-such-python"),
            "not an executable file",
        ),
        (not_exec, "not an executable file"),
        // Programs that are not Python: they ran every script as a success with no output
        // (`/bin/true`), also behind a link named like Python.
        (PathBuf::from("/bin/sh"), "not a Python interpreter"),
    ];
    let disguised = sb.root.path().join("disguised");
    std::fs::create_dir(&disguised).unwrap();
    std::os::unix::fs::symlink("/bin/true", disguised.join("python3")).unwrap();
    bad.push((disguised.join("python3"), "not a Python interpreter"));
    for (version, minor) in [("2.7", "2.7."), ("3.6", "3.6.")] {
        let found = std::fs::read_dir("/root/.pyenv/versions")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(minor))
            })
            .map(|dir| dir.join("bin/python"))
            .filter(|p| p.exists());
        match found {
            Some(py) => bad.push((
                py,
                if version == "2.7" {
                    "is Python 2.7"
                } else {
                    "is Python 3.6"
                },
            )),
            None => eprintln!("note: no Python {version} under /root/.pyenv/versions"),
        }
    }
    for (python, why) in bad {
        sb.write_config(&format!(
            "code_execution:\n  python: {}\n",
            python.display()
        ));
        for mode in ["project", "strict"] {
            let out = sb.run_stdin(b"print('ran')", &["--mode", mode]);
            assert_eq!(out.status.code(), Some(2), "{mode} {python:?}: {out:?}");
            assert!(out.stdout.is_empty(), "the script must not run: {out:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains(&format!(
                    "config file {file}: code_execution.python is {}",
                    python.display()
                )) && err.contains(why),
                "{err}"
            );
            let out = sb.run_stdin(b"print('ran')", &["--json", "--mode", mode]);
            assert_eq!(out.status.code(), Some(2), "{out:?}");
            let r = parse_single_json(&out);
            assert_eq!(r["status"], "error", "{r}");
            assert!(r["error"].as_str().unwrap().contains(why), "{r}");
        }
    }
}

/// `code_execution.stdout_limit: 10000000000` was accepted (the flags refuse it), and a script's
/// 600 MiB of output grew the supervisor to 1.85 GB: the config keys take the flags' range.
#[test]
fn an_output_limit_beyond_the_flags_range_is_a_config_error() {
    let sb = Sandbox::new();
    let file = sb.home().join("config.yaml").display().to_string();
    for key in ["stdout_limit", "stderr_limit"] {
        sb.write_config(&format!("code_execution:\n  {key}: 10000000000\n"));
        let err = refused(&sb);
        assert!(
            err.contains(&format!("config file {file}: `code_execution.{key}` "))
                && err.contains("from 64 to 67108864")
                && err.contains("found 10000000000"),
            "{err}"
        );
    }
    sb.write_config("code_execution:\n  stdout_limit: 67108864\n");
    let out = sb.run_stdin(b"print('ran')", &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// `plugins: {timeout: -1}` was accepted, then logged as `mcp_servers.plugins.timeout` when the
/// plugin host's spec was built, and the host silently left out (exit 0).
#[test]
fn a_bad_plugin_host_timeout_is_a_config_error_under_its_own_name() {
    let sb = Sandbox::new();
    let file = sb.home().join("config.yaml").display().to_string();
    for (text, key) in [
        ("plugins: {timeout: -1}\n", "plugins.timeout"),
        ("plugins: {timeout: 1e9}\n", "plugins.timeout"),
        ("plugins: {connect_timeout: 0}\n", "plugins.connect_timeout"),
    ] {
        sb.write_config(text);
        let err = refused(&sb);
        assert!(
            err.contains(&format!("config file {file}: `{key}` ")) && !err.contains("mcp_servers"),
            "{text}: {err}"
        );
    }
}

/// An `mcp_servers` entry named `plugins` took the plugin host's name: two `plugins` rows in
/// `tools list`, and its log lines said "the plugin host".
#[test]
fn an_mcp_server_named_like_the_plugin_host_is_refused() {
    let sb = Sandbox::new();
    let file = sb.home().join("config.yaml").display().to_string();
    sb.write_config("mcp_servers:\n  plugins:\n    command: some-server\n");
    let err = refused(&sb);
    assert!(
        err.contains(&format!("config file {file}: `mcp_servers.plugins` "))
            && err.contains("reserved for the plugin host"),
        "{err}"
    );
    let out = sb.run(&["tools", "list"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// `$VIBEOS_HOME/config.yaml` as a link to a missing file was taken for "no config": the run
/// went on with the defaults, without the file's `approvals.deny` rules. It is a config error
/// naming the link and its target; no entry at all is still the defaults.
#[test]
fn a_dangling_config_link_is_a_config_error_naming_its_target() {
    let sb = Sandbox::new();
    let link = sb.home().join("config.yaml");
    std::fs::remove_file(&link).unwrap();
    let out = sb.run_stdin(b"print('ran')", &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "no config file: defaults: {out:?}"
    );
    std::os::unix::fs::symlink("/nonexistent", &link).unwrap();
    let err = refused(&sb);
    assert!(
        err.contains(&format!(
            "config file {} is a symbolic link to /nonexistent, which does not exist",
            link.display()
        )),
        "{err}"
    );
    let out = sb.run(&["tools", "list"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// Errors that spoke of the YAML library (an untagged enum, `DuplicateKeyPolicy in Options`, a
/// float no one wrote, `the configured policy`) say what is wrong in the config's terms,
/// naming the file and the key.
#[test]
fn parser_errors_are_said_in_the_config_s_terms() {
    let sb = Sandbox::new();
    let file = sb.home().join("config.yaml").display().to_string();
    for (text, key, says) in [
        (
            "mcp_servers:\n  s:\n    command: x\n    script_callable: \"yes\"\n",
            "mcp_servers.s.script_callable",
            "expected true, false or a list of tool names",
        ),
        (
            "code_execution:\n  timeout: 3\n  timeout: 4\n",
            "code_execution.timeout",
            "`timeout` is given twice in the same mapping; remove one of them",
        ),
        (
            "code_execution:\n  max_tool_calls: 18446744073709551616\n",
            "code_execution.max_tool_calls",
            "the number is too large: a whole number from 0 to 18446744073709551615",
        ),
        (
            "code_execution:\n  timeout: .nan\n",
            "code_execution.timeout",
            "(NaN, not a number) is not allowed here",
        ),
    ] {
        sb.write_config(text);
        let err = refused(&sb);
        assert!(
            err.contains(&format!("{file}: {key}: ")) && err.contains(says),
            "{text:?}: {err}"
        );
        for internal in ["untagged", "Options", "policy", "floating point", ".?"] {
            assert!(!err.contains(internal), "{text:?}: {err}");
        }
    }
}

/// `--log-level x=bogus` said `… or a number 0-5` (tracing's words) while `--log-level 5` is
/// refused: the messages offer only the level names, which are accepted.
#[test]
fn log_level_errors_offer_only_accepted_values() {
    let sb = Sandbox::new();
    for bad in ["5", "vibeos_tools=bogus"] {
        let out = sb.run(&["--log-level", bad, "tools", "list"]);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("use error, warn, info, debug, trace or off") && !err.contains("number"),
            "{bad}: {err}"
        );
    }
    let out = sb.run(&["--log-level", "off", "tools", "list"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// `terminal.backend: bogus` and `terminal.lifetime_seconds: -1` were refused without naming
/// the config file, unlike every other config error.
#[test]
fn bad_terminal_settings_name_the_file() {
    let sb = Sandbox::new();
    let file = sb.home().join("config.yaml").display().to_string();
    for (text, says) in [
        ("terminal:\n  backend: bogus\n", "unknown backend `bogus`"),
        (
            "terminal:\n  lifetime_seconds: -1\n",
            "`terminal.lifetime_seconds` must be a positive number",
        ),
    ] {
        sb.write_config(text);
        let err = refused(&sb);
        assert!(
            err.contains(&format!("config file {file}: {says}")),
            "{text:?}: {err}"
        );
    }
    // `env audit` reads only the backend's name, and names the file too.
    sb.write_config("terminal:\n  backend: bogus\n");
    let out = sb.run(&["env", "audit"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("config file {file}: ")),
        "{out:?}"
    );
}

/// `mcp_servers.X.url: ftp://…` or `"not a url"` passed the check and failed only when the
/// server was reached, in the HTTP client's words: the entry is skipped at load (as every
/// entry whose keys do not combine), saying an http(s) URL with a host is needed, naming the
/// file and the key.
#[test]
fn an_mcp_server_url_that_is_not_http_is_skipped_saying_so() {
    let sb = Sandbox::new();
    let file = sb.home().join("config.yaml").display().to_string();
    for url in ["ftp://example.com/mcp", "not a url"] {
        sb.write_config(&format!(
            "mcp_servers:\n  remote:\n    url: \"{url}\"\n    startup: eager\n"
        ));
        let out = sb.run(&["tools", "list"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!(
                "MCP server `remote` skipped: config file {file}: mcp_servers.remote.url: "
            )) && err.contains("give an http:// or https:// URL with a host"),
            "{url}: {err}"
        );
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("remote"),
            "{url}: skipped, so not listed"
        );
    }
}

/// Backend values docker or ssh would refuse only at run time (or act on wrongly) are refused
/// at validation, naming the key (stop 55, finding 4): a volume over the tool agent's dir
/// (docker made an empty root-owned `vibeos-exec` file in the host dir) or the RPC dir
/// ("Duplicate mount point" at run time), and a memory limit below docker's minimum (6 MB).
/// (Whether an `ssh_key` file exists is the machine's state, not the config's: the README's
/// configs must load as they stand, `readme_configs_load`; the ssh start names the key.)
#[test]
fn backend_values_refused_at_run_time_are_refused_at_validation() {
    let sb = Sandbox::new();
    let host = sb.home().display().to_string();
    for target in [
        "/usr/local/libexec",
        "/usr/local/libexec/vibeos-exec",
        "/usr",
        "/run/vibeos-rpc",
        "/run/vibeos-rpc/x",
        "/run/",
        "/",
    ] {
        sb.write_config(&format!(
            "terminal:\n  backend: docker\n  docker_image: img\n  docker_volumes: ['{host}:{target}']\n"
        ));
        let err = refused(&sb);
        assert!(
            err.contains("terminal.docker_volumes[0]"),
            "{target}: {err}"
        );
        assert!(
            err.contains("/usr/local/libexec/vibeos-exec") || err.contains("/run/vibeos-rpc"),
            "{target}: {err}"
        );
    }
    sb.write_config("terminal:\n  backend: docker\n  docker_image: img\n  container_memory: 1\n");
    let err = refused(&sb);
    assert!(err.contains("terminal.container_memory"), "{err}");
    assert!(err.contains("6"), "{err}");
}
