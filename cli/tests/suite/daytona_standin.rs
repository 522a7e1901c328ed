//! The Daytona stand-in is faithful: the official, unmodified `daytona` SDK (pinned in the test
//! venv) drives it through create, exec with exit code, output, cwd, env and timeout, file
//! upload and download (binary-safe, a missing file an error), a session command with input and
//! streamed logs, and delete — against real containers of a private dockerd.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use vibeos_testkit::backends::{rootfs, unavailable, Dockerd};
use vibeos_testkit::daytona::{sdk_python, Standin};

const IMAGE: &str = "vibeos-py:test";

#[test]
fn the_official_sdk_drives_the_standin() {
    let python = match sdk_python() {
        Ok(p) => p,
        Err(why) => return unavailable(&why),
    };
    let dockerd = match Dockerd::start() {
        Ok(d) => d,
        Err(why) => return unavailable(&why),
    };
    let tar = match rootfs() {
        Ok(t) => t,
        Err(why) => return unavailable(&why),
    };
    dockerd.import(&tar, IMAGE).unwrap();
    let standin = Standin::start(&dockerd, IMAGE).unwrap();
    let out = std::process::Command::new(python)
        .arg(vibeos_testkit::workspace_root().join("tests/standins/daytona_conformance.py"))
        .arg(IMAGE)
        .env("DAYTONA_API_URL", &standin.api_url)
        .env("DAYTONA_API_KEY", &standin.api_key)
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
    let left = dockerd.docker(&["ps", "-aq", "--filter", "label=daytona-standin=1"]);
    assert!(String::from_utf8_lossy(&left.stdout).trim().is_empty());
}
