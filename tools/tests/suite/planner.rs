//! The planner, observed: a batch of real `write_file` calls where two writes to different
//! paths run at the same time and two to the same path do not, and real `search_files` calls
//! that leave out their path (so search the cwd) beside writes there. Concurrency is observed,
//! not timed: a `pre_tool_call` hook counts the calls inside their execution window (hook →
//! handler → `post_tool_call`) and waits, up to a bound, for a partner to enter; the highest
//! count seen says whether two windows overlapped.

// A test harness: a panic here is how a failed expectation is reported.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{json, Value};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use vibeos_tools::{HookDecision, ToolCall, ToolContext, ToolRegistry};

#[derive(Default)]
struct Windows {
    inside: usize,
    peak: usize,
}

/// A registry with the built-ins and a hook pair recording overlapping windows of the tools
/// `watched`.
fn observed(watched: &'static [&'static str]) -> (ToolRegistry, Arc<(Mutex<Windows>, Condvar)>) {
    let reg = ToolRegistry::with_builtins();
    let state = Arc::new((Mutex::new(Windows::default()), Condvar::new()));
    let s = Arc::clone(&state);
    reg.add_pre_tool_call_hook(move |call| {
        if watched.contains(&call.name) {
            let (lock, cv) = &*s;
            let mut w = lock.lock().unwrap();
            w.inside += 1;
            w.peak = w.peak.max(w.inside);
            cv.notify_all();
            // Wait for a partner to enter its window; serial calls never get one.
            let (mut w, _) = cv
                .wait_timeout_while(w, Duration::from_millis(800), |w| w.inside < 2)
                .unwrap();
            w.peak = w.peak.max(w.inside);
        }
        HookDecision::Continue
    });
    let s = Arc::clone(&state);
    reg.add_post_tool_call_hook(move |call| {
        if watched.contains(&call.name) {
            let (lock, cv) = &*s;
            lock.lock().unwrap().inside -= 1;
            cv.notify_all();
        }
    });
    (reg, state)
}

fn write(path: &str, content: &str) -> ToolCall {
    ToolCall::new("write_file", json!({"path": path, "content": content}))
}

#[test]
fn writes_to_different_paths_overlap_and_to_the_same_path_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = ToolContext::agent(dir.path());

    let (reg, state) = observed(&["write_file"]);
    let out = reg.handle_function_calls(&[write("a.txt", "A"), write("b.txt", "B")], &ctx);
    assert_eq!(
        state.0.lock().unwrap().peak,
        2,
        "different paths did not run in parallel"
    );
    for r in &out {
        let v: Value = serde_json::from_str(r).unwrap();
        assert!(v.get("error").is_none_or(Value::is_null), "{v}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "A"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("b.txt")).unwrap(),
        "B"
    );

    let (reg, state) = observed(&["write_file"]);
    let calls = [write("same.txt", "first"), write("./same.txt", "second")];
    let out = reg.handle_function_calls(&calls, &ctx);
    assert_eq!(
        state.0.lock().unwrap().peak,
        1,
        "writes to one path overlapped"
    );
    assert_eq!(out.len(), 2);
    // In call order: the second write wins.
    assert_eq!(
        std::fs::read_to_string(dir.path().join("same.txt")).unwrap(),
        "second"
    );

    // Results come back in call order whatever runs in parallel.
    let (reg, _) = observed(&["write_file"]);
    let out = reg.handle_function_calls(
        &[
            write("x.txt", "x"),
            ToolCall::new("read_file", json!({"path": "a.txt"})),
            ToolCall::new("no_such_tool", json!({})),
            write("y.txt", "y"),
        ],
        &ctx,
    );
    assert!(out[1].contains("A"), "{}", out[1]);
    assert!(out[2].contains("unknown tool"), "{}", out[2]);
    assert!(std::fs::read_to_string(dir.path().join("y.txt")).is_ok());
}

fn search(pattern: &str) -> ToolCall {
    ToolCall::new("search_files", json!({"pattern": pattern}))
}

/// `search_files` without `path` searches the cwd, and must be ordered against writes there
/// like a search that names it: it used to run beside them, so a search listed before a write
/// could see that write, and one listed after could miss it.
#[test]
fn a_search_without_a_path_is_ordered_against_writes_in_the_cwd() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = ToolContext::agent(dir.path());
    let total = |text: &str| -> u64 {
        let v: Value = serde_json::from_str(text).unwrap();
        v["total"]
            .as_u64()
            .unwrap_or_else(|| panic!("no total: {v}"))
    };

    let (reg, state) = observed(&["search_files", "write_file"]);
    let out = reg.handle_function_calls(
        &[search("NEEDLE_ONE"), write("later.txt", "NEEDLE_ONE")],
        &ctx,
    );
    assert_eq!(
        state.0.lock().unwrap().peak,
        1,
        "the search ran beside the write"
    );
    assert_eq!(
        total(&out[0]),
        0,
        "the search saw the later write: {}",
        out[0]
    );

    let (reg, state) = observed(&["search_files", "write_file"]);
    let out = reg.handle_function_calls(
        &[write("earlier.txt", "NEEDLE_TWO"), search("NEEDLE_TWO")],
        &ctx,
    );
    assert_eq!(
        state.0.lock().unwrap().peak,
        1,
        "the search ran beside the write"
    );
    assert_eq!(
        total(&out[1]),
        1,
        "the search missed the earlier write: {}",
        out[1]
    );

    // A write outside the cwd still runs beside it.
    let other = tempfile::tempdir().unwrap();
    let (reg, state) = observed(&["search_files", "write_file"]);
    let elsewhere = other.path().join("x.txt");
    reg.handle_function_calls(
        &[
            search("NEEDLE_ONE"),
            write(elsewhere.to_str().unwrap(), "x"),
        ],
        &ctx,
    );
    assert_eq!(
        state.0.lock().unwrap().peak,
        2,
        "unrelated calls were serialised"
    );
}
