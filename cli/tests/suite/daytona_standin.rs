//! The Daytona stand-in is faithful: the official, unmodified `daytona` SDK (pinned in the test
//! venv) drives it through create, exec with exit code, output, cwd, env and timeout, file
//! upload and download (binary-safe, a missing file an error), a session command with input and
//! streamed logs, listing by labels page by page, and delete — against real containers of a
//! private dockerd.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use vibeos_testkit::backends::unavailable;
use vibeos_testkit::daytona::{sdk_python, DaytonaLab};

const IMAGE: &str = "vibeos-py:test";

#[test]
fn the_official_sdk_drives_the_standin() {
    let lab = match DaytonaLab::start(IMAGE) {
        Ok(l) => l,
        Err(why) => return unavailable(&why),
    };
    let out = std::process::Command::new(sdk_python().unwrap())
        .arg(vibeos_testkit::workspace_root().join("tests/standins/daytona_conformance.py"))
        .arg(IMAGE)
        .envs(lab.standin.env())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "SDK run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: serde_json::Value =
        serde_json::from_slice(out.stdout.rsplit(|b| *b == b'\n').nth(1).unwrap()).unwrap();
    assert_eq!(seen["state"], "started");
    assert_eq!(seen["labels"]["conformance"], "1");
    // The SDK lists by labels and follows the pages.
    assert_eq!(seen["listed_is_sb"], true, "{seen}");
    assert_eq!(seen["listed_paged"], seen["listed_expected"], "{seen}");
    // Exit code, and stdout and stderr combined in `result`, as the service documents.
    assert_eq!(seen["exec"][0], 7);
    let combined = seen["exec"][1].as_str().unwrap();
    assert!(
        combined.contains("out\n") && combined.contains("err\n"),
        "{combined}"
    );
    assert_eq!(
        seen["exec_cwd_env"],
        serde_json::json!([0, "/tmp\nhi there\n"])
    );
    assert!(
        seen["exec_timeout"]
            .as_str()
            .unwrap()
            .starts_with("DaytonaTimeoutError"),
        "{}",
        seen["exec_timeout"]
    );
    let expected: Vec<u8> = b"\x00binary\xffpayload\n".to_vec();
    assert_eq!(seen["download"], serde_json::json!(expected));
    assert!(seen["uploaded_in_sandbox"]
        .as_str()
        .unwrap()
        .contains("b i n a r y 377"));
    assert_eq!(seen["download_missing"], "DaytonaNotFoundError");
    assert_eq!(
        seen["session"],
        serde_json::json!(["got:hello\n", "e\n", 3])
    );
    assert_eq!(seen["get_same"], true);
    assert_eq!(seen["after_delete"], "DaytonaNotFoundError");
    // The sandbox was a real container, and delete removed it.
    assert!(lab
        .dockerd
        .containers_with_label("daytona-standin=1")
        .is_empty());
}
