//! The `execute_code` registry entry: a real Python child run through the registry's dispatch
//! path, from plain sync code and from inside running tokio runtimes.
// Helpers outside `#[test]` fns unwrap too: a failure there is a test failure.
#![allow(clippy::unwrap_used)]

use serde_json::{json, Value};
use vibeos_supervisor::execute_code_tool::register_execute_code;
use vibeos_supervisor::Config;
use vibeos_tools::{registry, ToolContext};

fn python_available() -> bool {
    which::which("python3").is_ok()
}

fn run_script(dir: &std::path::Path) -> Value {
    // The pool tests of this binary switch the process-wide pool on and count its claims.
    let _pool = super::pool::serial();
    register_execute_code(registry(), &Config::default()).unwrap();
    std::fs::write(dir.join("note.txt"), "alpha\nbeta\n").unwrap();
    let code = "from vibeos_tools import read_file\nr = read_file('note.txt')\nprint(r['total_lines'], 'lines')\n";
    let out = registry().handle_function_call(
        "execute_code",
        &json!({"code": code, "timeout": "30"}),
        &ToolContext::agent(dir),
    );
    serde_json::from_str(&out).unwrap()
}

#[test]
fn execute_code_runs_from_sync_code() {
    if !python_available() {
        vibeos_testkit::skip!("python3 is not on PATH");
    }
    let dir = tempfile::tempdir().unwrap();
    let result = run_script(dir.path());
    assert_eq!(result["status"], "success", "{result}");
    assert_eq!(result["output"], "2 lines\n", "{result}");
    assert_eq!(result["tool_calls_made"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execute_code_runs_from_inside_a_runtime() {
    if !python_available() {
        vibeos_testkit::skip!("python3 is not on PATH");
    }
    let dir = tempfile::tempdir().unwrap();
    let result = run_script(dir.path());
    assert_eq!(result["status"], "success", "{result}");
    assert_eq!(result["output"], "2 lines\n", "{result}");
}

#[tokio::test(flavor = "current_thread")]
async fn execute_code_runs_from_inside_a_current_thread_runtime() {
    if !python_available() {
        vibeos_testkit::skip!("python3 is not on PATH");
    }
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(run_script(dir.path())["status"], "success");
}

#[test]
fn bad_execute_code_arguments_get_clear_errors() {
    register_execute_code(registry(), &Config::default()).unwrap();
    let ctx = ToolContext::agent("/");
    let call = |args: Value| -> Value {
        serde_json::from_str(&registry().handle_function_call("execute_code", &args, &ctx)).unwrap()
    };
    assert_eq!(
        call(json!({}))["error"],
        "Tool execution failed: InvalidArguments: missing required argument `code` (the Python source to run)"
    );
    assert!(call(json!({"code": "print(1)", "timeout": -3}))["error"]
        .as_str()
        .unwrap()
        .contains("argument `timeout` must be a positive number"));
    assert!(
        call(json!({"code": "print(1)", "max_tool_calls": "many"}))["error"]
            .as_str()
            .unwrap()
            .contains("argument `max_tool_calls` must be an integer")
    );
}

#[test]
fn scripts_get_only_the_script_tools_the_session_selected() {
    if !python_available() {
        vibeos_testkit::skip!("python3 is not on PATH");
    }
    // Executions are process-wide state too: a pool another test turned on would take these
    // scripts' keys into its slots while that test waits for its own.
    let _serial = super::pool::serial();
    use vibeos_supervisor::execute_code_tool::execute_code_entry_for;
    let reg: &'static vibeos_tools::ToolRegistry =
        Box::leak(Box::new(vibeos_tools::ToolRegistry::with_builtins()));
    let code = "import vibeos_tools\nprint(hasattr(vibeos_tools, 'read_file'), hasattr(vibeos_tools, 'write_file'))\n";
    let dir = tempfile::tempdir().unwrap();
    let ctx = ToolContext::agent(dir.path());
    let run = |enabled: &[&str], disabled: &[&str]| -> Value {
        let e: Vec<String> = enabled.iter().map(|s| s.to_string()).collect();
        let d: Vec<String> = disabled.iter().map(|s| s.to_string()).collect();
        reg.register(execute_code_entry_for(reg, &Config::default(), &e, &d))
            .unwrap();
        serde_json::from_str(&reg.handle_function_call(
            "execute_code",
            &json!({"code": code}),
            &ctx,
        ))
        .unwrap()
    };
    assert_eq!(run(&[], &[])["output"], "True True\n");
    assert_eq!(run(&["code_execution"], &[])["output"], "False False\n");
    assert_eq!(run(&["vibeos-core"], &[])["output"], "True True\n");
    assert_eq!(run(&[], &["file"])["output"], "False False\n");
    let gone = run(&["no-such-toolset"], &[]);
    assert!(
        gone["error"].as_str().unwrap().contains("unknown toolset"),
        "{gone}"
    );
    // A call's own toolsets narrow the session's, and cannot widen them.
    let with_call = |entry: &[&str], call: &[&str]| -> Value {
        let e: Vec<String> = entry.iter().map(|s| s.to_string()).collect();
        reg.register(execute_code_entry_for(reg, &Config::default(), &e, &[]))
            .unwrap();
        let mut ctx = ToolContext::agent(dir.path());
        ctx.toolsets = Some(std::sync::Arc::new(vibeos_tools::ToolsetSelection {
            enabled: Some(call.iter().map(|s| s.to_string()).collect()),
            disabled: Vec::new(),
        }));
        serde_json::from_str(&reg.handle_function_call(
            "execute_code",
            &json!({"code": code}),
            &ctx,
        ))
        .unwrap()
    };
    assert_eq!(
        with_call(&["vibeos-core"], &["code_execution"])["output"],
        "False False\n"
    );
    assert_eq!(
        with_call(&["code_execution"], &["file", "code_execution"])["output"],
        "False False\n"
    );
    assert_eq!(
        with_call(&["vibeos-core"], &["file", "code_execution"])["output"],
        "True True\n"
    );
    // A call selecting no toolset (an empty enabled list) gives its script no tool: it used
    // to mean "no selection", every tool.
    assert_eq!(with_call(&[], &[])["output"], "False False\n");
}
