//! The docker backend with podman as its engine (`terminal.docker_binary`): rootful podman with
//! its own storage and the lab's flags (runc, cgroupfs, explicit ulimits), the python3 image
//! from Debian packages. Tools act in the container, a timeout leaves no process there, two
//! tasks get two containers, and `backends gc` finds leftovers by label.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backends_common;

use backends_common::{rootfs, unavailable, which};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use vibeos_supervisor::{execute, Config, ExecutionRequest, ExecutionResult, Interrupt, Status};
use vibeos_tools::environments::{self, BackendKind, BackendSettings};

struct Podman {
    dir: tempfile::TempDir,
    wrapper: String,
}

impl Podman {
    fn cmd(&self, args: &[&str]) -> std::process::Output {
        Command::new(&self.wrapper).args(args).output().unwrap()
    }
    fn labelled(&self) -> Vec<String> {
        let out = self.cmd(&[
            "ps",
            "-a",
            "--filter",
            "label=vibeos-exec=1",
            "--format",
            "{{.Names}}",
        ]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.cmd(&["rm", "-af", "-t", "0"]);
        let _ = self.cmd(&["system", "reset", "-f"]);
        let _ = self.dir.path();
    }
}

fn start() -> Result<Podman, String> {
    which("podman").ok_or("podman is not installed")?;
    which("runc").ok_or("runc is not installed")?;
    let image = rootfs()?;
    let dir = tempfile::Builder::new()
        .prefix("vpm")
        .tempdir_in("/tmp")
        .map_err(|e| e.to_string())?;
    let p = dir.path().display().to_string();
    let wrapper = dir.path().join("podman-here");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nif [ \"$1\" = run ]; then shift; set -- run --ulimit nofile=20000:20000 --ulimit nproc=32768:32768 \"$@\"; fi\n\
             exec podman --root {p}/root --runroot {p}/runroot --tmpdir {p}/tmp --cgroup-manager cgroupfs --events-backend file --runtime runc \"$@\"\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let podman = Podman {
        dir,
        wrapper: wrapper.display().to_string(),
    };
    let out = podman.cmd(&["import", &image.display().to_string(), "vibeos-py:test"]);
    if !out.status.success() {
        return Err(format!(
            "podman import failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(podman)
}

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
    let podman = match start() {
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

    let out = podman.cmd(&[
        "run",
        "-d",
        "--name",
        "vibeos-exec-crashed",
        "--label",
        "vibeos-exec=1",
        "--label",
        "vibeos-exec.owner=999999999:1",
        "--network",
        "none",
        "--entrypoint",
        "sleep",
        "localhost/vibeos-py:test",
        "600",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = environments::docker::gc(&podman.wrapper, false).unwrap();
    assert_eq!(report.removed, vec!["vibeos-exec-crashed".to_string()]);
    assert!(podman.labelled().is_empty());
    environments::activate(BackendSettings::default());
}
