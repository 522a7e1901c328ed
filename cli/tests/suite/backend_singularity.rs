//! execute_code and the tools inside the singularity backend, end to end: runs where
//! `apptainer` or `singularity` is on PATH and is counted as skipped (with the reason)
//! elsewhere — no such binary is packaged for the project's machines, so CI skips it too. The
//! command construction is unit-tested in tools/src/environments/singularity.rs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;
use vibeos_supervisor::{execute, Config, ExecutionRequest, Interrupt, Status};
use vibeos_tools::environments::{self, singularity, BackendKind, BackendSettings};

#[test]
fn singularity_backend_end_to_end() {
    if super::common::in_own_process() {
        return;
    }
    if let Err(e) = singularity::find_binary() {
        vibeos_testkit::skip_even_in_ci!("{e}");
    }
    let Some(image) = std::env::var_os("VIBEOS_TEST_SIF") else {
        vibeos_testkit::skip_even_in_ci!(
            "set VIBEOS_TEST_SIF to a SIF (or docker:// image) with python3 to run this test"
        );
    };
    environments::activate(BackendSettings {
        backend: BackendKind::Singularity,
        singularity_image: Some(image.to_string_lossy().into_owned()),
        agent_binary: Some(PathBuf::from(env!("CARGO_BIN_EXE_vibeos-exec"))),
        ..BackendSettings::default()
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut req = ExecutionRequest::from_config(
        "from vibeos_tools import write_file, terminal\nimport os\nwrite_file('/tmp/sing.txt', 'x')\nprint(open('/tmp/sing.txt').read(), terminal('cat /tmp/sing.txt')['output'], 'SECRET_T' in os.environ)",
        &Config::default(),
    );
    req.task_id = Some("sing".into());
    req.base_env = Some(vec![(
        OsString::from("SECRET_TOKEN_T"),
        OsString::from("s3"),
    )]);
    req.timeout = Duration::from_secs(120);
    let r = rt.block_on(execute(req, vibeos_tools::registry(), Interrupt::new()));
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.backend.as_deref(), Some("singularity"));
    assert!(r.output.contains("x x False"), "{r:?}");
    assert!(!r.output.contains("s3"));

    let mut req = ExecutionRequest::from_config("import time\ntime.sleep(600)", &Config::default());
    req.task_id = Some("sing".into());
    req.timeout = Duration::from_secs(2);
    req.kill_grace = Duration::from_secs(1);
    let r = rt.block_on(execute(req, vibeos_tools::registry(), Interrupt::new()));
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    environments::shutdown();
}
