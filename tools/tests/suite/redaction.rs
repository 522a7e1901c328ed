//! Redaction of command output (security.redact_output): foreground `terminal` output and the
//! output of background processes read with the `process` tool, and turning it off. One test
//! function: the config path is process-wide.

// A test harness: a panic here is how a failed expectation is reported.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{json, Value};
use vibeos_tools::{registry, ToolContext};

const KEY: &str = "AKIAIOSFODNN7EXAMPLE";

fn call(name: &str, args: Value, ctx: &ToolContext) -> Value {
    serde_json::from_str(&registry().handle_function_call(name, &args, ctx)).unwrap()
}

#[test]
fn terminal_and_background_output_are_redacted_unless_turned_off() {
    // The pinned config path is process-wide: tests that pin one take turns.
    let _process_state = super::process_state_lock();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, "").unwrap();
    vibeos_tools::settings::set_config_path(Some(cfg.clone()));
    let ctx = ToolContext::agent(dir.path());

    let fg = call(
        "terminal",
        json!({"command": format!("echo key={KEY}")}),
        &ctx,
    );
    assert_eq!(fg["output"], "key=[REDACTED:aws_access_key_id]\n", "{fg}");
    assert_eq!(fg["redactions"], 1);

    let bg = call(
        "terminal",
        json!({"command": format!("echo bg={KEY}"), "background": true}),
        &ctx,
    );
    let id = bg["process_id"].as_str().unwrap().to_string();
    let waited = call(
        "process",
        json!({"action": "wait", "process_id": id, "timeout": 10}),
        &ctx,
    );
    assert_eq!(
        waited["output"], "bg=[REDACTED:aws_access_key_id]\n",
        "{waited}"
    );
    assert_eq!(waited["redactions"], 1);

    std::fs::write(&cfg, "security:\n  redact_output: false\n").unwrap();
    let plain = call(
        "terminal",
        json!({"command": format!("echo key={KEY}")}),
        &ctx,
    );
    assert_eq!(plain["output"], format!("key={KEY}\n"));
    assert_eq!(plain["redactions"], 0);
    vibeos_tools::settings::set_config_path(None);
}
