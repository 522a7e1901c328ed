//! The docker backend with podman as its engine (`terminal.docker_binary`): rootful podman with
//! its own storage and the lab's flags (runc, cgroupfs, explicit ulimits), the python3 image
//! from Debian packages. Tools act in the container, a timeout leaves no process there, two
//! tasks get two containers, and `backends gc` finds leftovers by label.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;
use vibeos_supervisor::{execute, Config, ExecutionRequest, ExecutionResult, Interrupt, Status};
use vibeos_testkit::backends::{plant_crashed_container, start_podman, unavailable};
use vibeos_tools::environments::{self, BackendKind, BackendSettings};

fn request(code: &str, task: &str) -> ExecutionRequest {
    let mut r = ExecutionRequest::from_config(code, &Config::default());
    r.task_id = Some(task.into());
    r.timeout = Duration::from_secs(60);
    r.kill_grace = Duration::from_secs(1);
    r
}

fn run(rt: &tokio::runtime::Runtime, req: ExecutionRequest) -> ExecutionResult {
    rt.block_on(execute(req, vibeos_tools::registry(), Interrupt::new()))
}

#[test]
fn podman_as_docker_engine() {
    if super::common::in_own_process() {
        return;
    }
    let podman = match start_podman() {
        Ok(p) => p,
        Err(e) => return unavailable(&e),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    environments::activate(BackendSettings {
        backend: BackendKind::Docker,
        docker_image: Some("localhost/vibeos-py:test".into()),
        docker_binary: podman.wrapper.clone(),
        agent_binary: Some(PathBuf::from(env!("CARGO_BIN_EXE_vibeos-exec"))),
        ..BackendSettings::default()
    });
    let marker = format!("/srv/vibeos-podman-{}.txt", std::process::id());
    let r = run(&rt, request(&format!(
        "from vibeos_tools import write_file, terminal\nwrite_file('{marker}', 'podman')\nprint(open('{marker}').read(), terminal('cat {marker}')['output'])"
    ), "p1"));
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert!(r.output.contains("podman podman"), "{}", r.output);
    assert!(!std::path::Path::new(&marker).exists());

    let mut req = request(
        "import subprocess, time\nsubprocess.Popen(['sleep', '4646'])\ntime.sleep(600)",
        "p1",
    );
    req.timeout = Duration::from_secs(2);
    assert_eq!(run(&rt, req).status, Status::Timeout);
    let ps = run(
        &rt,
        request(
            "from vibeos_tools import terminal\nprint(terminal('ps -eo args')['output'])",
            "p1",
        ),
    );
    assert!(
        ps.output.contains("ps -eo") && !ps.output.contains("sleep 4646"),
        "{}",
        ps.output
    );

    assert_eq!(run(&rt, request("print(2)", "p2")).status, Status::Success);
    assert_eq!(podman.labelled().len(), 2, "{:?}", podman.labelled());
    environments::shutdown();
    assert!(podman.labelled().is_empty(), "{:?}", podman.labelled());

    plant_crashed_container(|args| podman.cmd(args), "localhost/vibeos-py:test");
    let report = environments::docker::gc(&podman.wrapper, false).unwrap();
    assert_eq!(report.removed, vec!["vibeos-exec-crashed".to_string()]);
    assert!(podman.labelled().is_empty());
    environments::activate(BackendSettings::default());
}
