//! `vibeos-exec tools list` and `tools schema`, end to end through the built binary.
// Helpers outside `#[test]` fns unwrap too: a failure there is a test failure.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::Value;
use std::process::Output;
use vibeos_testkit::Sandbox;

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn row<'a>(table: &'a str, name: &str) -> Option<&'a str> {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
}

fn schema(sb: &Sandbox, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["tools", "schema"];
    all.extend_from_slice(args);
    let out = sb.run(&all);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap_or_else(|e| panic!("tools schema printed no JSON ({e}): {}", stdout(&out)))
        .as_array()
        .expect("a JSON array")
        .clone()
}

fn names(defs: &[Value]) -> Vec<String> {
    defs.iter()
        .map(|d| d["function"]["name"].as_str().expect("name").to_string())
        .collect()
}

fn exec_description(defs: &[Value]) -> String {
    defs.iter()
        .find(|d| d["function"]["name"] == "execute_code")
        .expect("execute_code in the schema")["function"]["description"]
        .as_str()
        .expect("description")
        .to_string()
}

#[test]
fn list_shows_every_tool_with_toolset_status_and_emoji() {
    let sb = Sandbox::new();
    let out = sb.run(&["tools", "list"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let table = stdout(&out);
    let header = table.lines().next().expect("a header line");
    for col in ["NAME", "TOOLSET", "STATUS", "EMOJI"] {
        assert!(header.contains(col), "{header}");
    }
    let read = row(&table, "read_file").expect("read_file listed");
    assert!(
        read.contains(" file ") && read.contains("available") && read.contains("📖"),
        "{read}"
    );
    let exec = row(&table, "execute_code").expect("execute_code registered by the CLI");
    assert!(
        exec.contains("code_execution") && exec.contains("available"),
        "{exec}"
    );
    assert!(table.contains("tools,"), "{table}");
}

#[test]
fn list_follows_enabled_disabled_and_legacy_toolsets() {
    let sb = Sandbox::new();
    let only = stdout(&sb.run(&["tools", "list", "--enable-toolsets", "file_tools"]));
    assert!(row(&only, "read_file").is_some(), "{only}");
    assert!(row(&only, "execute_code").is_none(), "{only}");
    let minus = stdout(&sb.run(&["tools", "list", "--disable-toolsets", "file"]));
    assert!(
        row(&minus, "read_file").is_none() && row(&minus, "write_file").is_none(),
        "{minus}"
    );
    assert!(row(&minus, "execute_code").is_some(), "{minus}");
    let both = stdout(&sb.run(&[
        "tools",
        "list",
        "--enable-toolsets",
        "file,code_execution",
        "--disable-toolsets",
        "code_execution",
    ]));
    assert!(
        row(&both, "read_file").is_some() && row(&both, "execute_code").is_none(),
        "{both}"
    );
    // A preset (composite of composites) selects the product's tools.
    let preset = stdout(&sb.run(&["tools", "list", "--enable-toolsets", "vibeos-cli"]));
    assert!(row(&preset, "read_file").is_some() && row(&preset, "execute_code").is_some());
}

#[test]
fn list_json_names_status_and_requirements() {
    let sb = Sandbox::new();
    let out = sb.run(&["tools", "list", "--json"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let rows: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let read = rows
        .as_array()
        .expect("array")
        .iter()
        .find(|r| r["name"] == "read_file")
        .expect("read_file");
    assert_eq!(read["toolset"], "file");
    assert_eq!(read["available"], true);
    assert!(read["requires_env"].is_array());
}

#[test]
fn schema_is_what_the_model_gets_with_the_configured_limits() {
    let sb = Sandbox::new();
    sb.write_config("code_execution:\n  timeout: 42\n  max_tool_calls: 9\n");
    let defs = schema(&sb, &[]);
    let all = names(&defs);
    assert!(all.contains(&"read_file".into()) && all.contains(&"execute_code".into()));
    for d in &defs {
        assert_eq!(d["type"], "function");
        assert_eq!(d["function"]["parameters"]["type"], "object");
    }
    let desc = exec_description(&defs);
    let import = desc
        .lines()
        .find(|l| l.contains("from vibeos_tools import"))
        .unwrap_or_else(|| panic!("no import line: {desc}"));
    assert!(
        import.contains("read_file") && import.contains("write_file"),
        "{import}"
    );
    assert!(desc.contains("killed after 42s"), "{desc}");
    assert!(desc.contains("at most 9 tool calls"), "{desc}");
    assert!(desc.contains("Mode project"), "{desc}");
    assert!(
        desc.contains(&sb.work().canonicalize().unwrap().display().to_string()),
        "{desc}"
    );
}

#[test]
fn schema_lists_only_script_tools_that_survived_filtering() {
    let sb = Sandbox::new();
    sb.write_config("code_execution:\n  mode: strict\n");
    let defs = schema(&sb, &["--enable-toolsets", "code_execution"]);
    assert_eq!(names(&defs), vec!["execute_code".to_string()]);
    let desc = exec_description(&defs);
    assert!(desc.contains("No tools are available to scripts"), "{desc}");
    assert!(!desc.contains("read_file"), "{desc}");
    assert!(desc.contains("Mode strict"), "{desc}");
    let defs = schema(&sb, &["--enable-toolsets", "code_execution,file"]);
    let desc = exec_description(&defs);
    assert!(desc.contains("- read_file(path"), "{desc}");
    assert!(!desc.contains("terminal("), "{desc}");
}

#[test]
fn unknown_toolsets_exit_2_naming_the_valid_ones() {
    let sb = Sandbox::new();
    for sub in ["list", "schema"] {
        for flag in ["--enable-toolsets", "--disable-toolsets"] {
            let out = sb.run(&["tools", sub, flag, "file,nonsense"]);
            assert_eq!(out.status.code(), Some(2), "{sub} {flag}");
            let err = stderr(&out);
            assert!(err.contains("unknown toolset `nonsense`"), "{err}");
            assert!(err.contains("file") && err.contains("vibeos-cli"), "{err}");
            assert!(stdout(&out).is_empty(), "{}", stdout(&out));
        }
    }
}

/// `--enable-toolsets ''` and `--enable-toolsets ,` listed every tool (terminal included) with
/// exit 0: an empty name in any toolset list flag is a usage error naming the flag.
#[test]
fn an_empty_toolset_name_is_a_usage_error_naming_the_flag() {
    let sb = Sandbox::new();
    for (args, flag) in [
        (
            &["tools", "list", "--enable-toolsets", ""][..],
            "--enable-toolsets",
        ),
        (
            &["tools", "list", "--enable-toolsets", ","][..],
            "--enable-toolsets",
        ),
        (
            &["tools", "list", "--enable-toolsets", "web,"][..],
            "--enable-toolsets",
        ),
        (
            &["tools", "list", "--json", "--enable-toolsets", " "][..],
            "--enable-toolsets",
        ),
        (
            &["tools", "schema", "--enable-toolsets", ""][..],
            "--enable-toolsets",
        ),
        (
            &["tools", "list", "--disable-toolsets", ""][..],
            "--disable-toolsets",
        ),
        (
            &["tools", "schema", "--disable-toolsets", "file,,web"][..],
            "--disable-toolsets",
        ),
        (&["serve", "--toolsets", ""][..], "--toolsets"),
        (&["serve", "--toolsets", "file,"][..], "--toolsets"),
    ] {
        let out = sb.run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", stdout(&out));
        let err = stderr(&out);
        assert!(
            err.contains(&format!("{flag} ")) && err.contains("empty toolset name"),
            "{args:?}: {err}"
        );
    }
    // A name with spaces around it is still that name.
    let out = sb.run(&["tools", "list", "--enable-toolsets", " file "]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert!(row(&stdout(&out), "read_file").is_some());
    assert!(row(&stdout(&out), "terminal").is_none());
}

/// `tools schema --json` was accepted and ignored (the flag was `tools list`'s). Its output is
/// JSON already, so the flag is refused as every subcommand refuses a flag it does not take.
#[test]
fn tools_schema_refuses_json_as_a_flag_it_does_not_take() {
    let sb = Sandbox::new();
    let out = sb.run(&["tools", "schema", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        stderr(&out).contains("unexpected argument '--json'"),
        "{}",
        stderr(&out)
    );
    // `tools list --json` is unchanged, and schema without it prints the array.
    let out = sb.run(&["tools", "list", "--json", "--enable-toolsets", "file"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rows: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(rows.as_array().is_some_and(|r| !r.is_empty()), "{rows}");
    assert!(!schema(&sb, &["--enable-toolsets", "file"]).is_empty());
}
