//! The Modal stand-in is faithful: the official, unmodified `modal` SDK (pinned, from the test
//! venv) drives it through the sandbox flow V1 — create, exec with exit code, stdout, stderr,
//! stdin, workdir and env, a server-side exec timeout that kills the command and keeps the
//! sandbox, file upload and download (`sandbox.filesystem`, including the SDK's typed error for
//! a missing file), tags and listing by tags, terminate — and every sandbox is a real container
//! of a private dockerd.
//! A wrong token is refused the way Modal refuses it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::process::Command;
use vibeos_testkit::backends::unavailable;
use vibeos_testkit::modal::ModalLab;

const IMAGE: &str = "vibeos-py:test";

fn drive(python: &std::path::Path, env: &[(&str, String)]) -> std::process::Output {
    let driver = vibeos_testkit::workspace_root().join("tests/standins/modal_conformance.py");
    let mut cmd = Command::new(python);
    cmd.arg(driver).arg(IMAGE).env_remove("MODAL_PROFILE");
    // No ~/.modal.toml of the machine may decide where the SDK connects.
    cmd.env("MODAL_CONFIG_PATH", "/nonexistent/modal.toml");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run the SDK driver")
}

#[test]
fn official_sdk_drives_the_stand_in() {
    let lab = match ModalLab::start(IMAGE) {
        Ok(l) => l,
        Err(e) => return unavailable(&e),
    };
    let (standin, python, daemon) = (&lab.standin, &lab.python, &lab.dockerd);

    let out = drive(python, &standin.env());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "SDK driver failed: {stderr}\nstand-in: {}",
        standin.log_text()
    );
    let seen: Value = serde_json::from_slice(out.stdout.trim_ascii()).expect("driver JSON");
    assert_eq!(seen["exit"], 3, "{seen}");
    assert_eq!(seen["stdout"], "out\n", "{seen}");
    assert_eq!(seen["stderr"], "err\n", "{seen}");
    assert_eq!(
        seen["cwd_env"],
        serde_json::json!(["/tmp", "hello"]),
        "{seen}"
    );
    assert_eq!(seen["stdin"], "through stdin", "{seen}");
    // The SDK reports a timed-out exec as -1; the stand-in killed the command in the sandbox.
    assert_eq!(seen["timeout_exit"], -1, "{seen}");
    assert!(seen["timeout_s"].as_f64().unwrap() < 10.0, "{seen}");
    assert_eq!(
        seen["sleep_left"], "0",
        "the timed-out command still runs: {seen}"
    );
    assert_eq!(seen["uploaded_size"], "16384", "{seen}");
    assert_eq!(seen["downloaded"], "made inside", "{seen}");
    assert_eq!(seen["roundtrip_equal"], true, "{seen}");
    assert_eq!(seen["missing"], "SandboxFilesystemNotFoundError", "{seen}");
    assert_eq!(seen["terminated_poll"], true, "{seen}");
    // Tags set at create come back, and list finds the sandbox by them (and only by them)
    // while it runs: what `backends gc` relies on.
    assert_eq!(
        seen["tags"],
        serde_json::json!({"conformance": "1"}),
        "{seen}"
    );
    assert_eq!(
        seen["listed"],
        serde_json::json!([seen["sandbox_id"]]),
        "{seen}"
    );
    assert_eq!(seen["listed_other_tag"], serde_json::json!([]), "{seen}");
    assert_eq!(
        seen["listed_after_terminate"],
        serde_json::json!([]),
        "{seen}"
    );
    println!(
        "modal stand-in: create {}s, SDK exec round trip {} ms",
        seen["create_s"], seen["exec_roundtrip_ms"]
    );

    // The sandbox was a real container, and terminate removed it.
    let id = seen["sandbox_id"].as_str().unwrap();
    let all = daemon.docker(&["ps", "-a", "--format", "{{.Names}}"]);
    let names = String::from_utf8_lossy(&all.stdout);
    assert!(
        !names.contains(id),
        "terminated sandbox still exists: {names}"
    );
    assert!(
        standin.log_text().contains(&format!("created {id}")),
        "{}",
        standin.log_text()
    );

    // A wrong secret is refused: the SDK raises its authentication error, no sandbox starts.
    let mut env = standin.env();
    env.retain(|(k, _)| *k != "MODAL_TOKEN_SECRET");
    env.push(("MODAL_TOKEN_SECRET", "wrong".into()));
    let out = drive(python, &env);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("AuthError") || stderr.contains("Token"),
        "{stderr}"
    );
}
