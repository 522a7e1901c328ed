//! Real container engines for the backend tests: a private dockerd (the lab's flags, no host
//! networking changes) or rootful podman with its own storage, both stopped by their own pid,
//! and the python3 image built from Debian packages by `scripts/backend-rootfs` (cached under
//! target/). Without the engine and `CI` not `true` a test prints SKIP and returns; with
//! `CI=true` it fails.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Skips (or, in CI, fails) with `why`.
pub fn unavailable(why: &str) {
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("backend test cannot run in CI: {why}");
    }
    eprintln!("SKIP: {why}");
}

pub fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}

pub fn rootfs() -> Result<PathBuf, String> {
    let out = Command::new(workspace().join("scripts/backend-rootfs"))
        .output()
        .map_err(|e| format!("cannot run scripts/backend-rootfs: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/backend-rootfs failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// A private dockerd, killed by its pid on drop (containers first).
pub struct Dockerd {
    pub dir: tempfile::TempDir,
    pub host: String,
    child: Child,
}

impl Dockerd {
    pub fn start() -> Result<Dockerd, String> {
        let dockerd = which("dockerd").ok_or("dockerd is not installed")?;
        which("docker").ok_or("the docker CLI is not installed")?;
        let dir = tempfile::Builder::new()
            .prefix("vdk")
            .tempdir_in("/tmp")
            .map_err(|e| e.to_string())?;
        let d = dir.path();
        let host = format!("unix://{}/docker.sock", d.display());
        let child = Command::new(dockerd)
            .arg("--data-root")
            .arg(d.join("data"))
            .arg("--exec-root")
            .arg(d.join("x"))
            .arg("--pidfile")
            .arg(d.join("dockerd.pid"))
            .args(["-H", &host])
            .args([
                "--iptables=false",
                "--ip6tables=false",
                "--ip-masq=false",
                "--bridge=none",
                "--ip-forward=false",
                "--userland-proxy=false",
                "--storage-driver",
                "overlay2",
                "--exec-opt",
                "native.cgroupdriver=cgroupfs",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("dockerd.log")).map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|e| format!("cannot start dockerd: {e}"))?;
        let mut daemon = Dockerd { dir, host, child };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = daemon
                .docker(&["version", "--format", "{{.Server.Version}}"])
                .status
                .success();
            if ok {
                break;
            }
            if Instant::now() > deadline || matches!(daemon.child.try_wait(), Ok(Some(_))) {
                let log = std::fs::read_to_string(daemon.dir.path().join("dockerd.log"))
                    .unwrap_or_default();
                return Err(format!(
                    "dockerd did not come up: {}",
                    log.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(daemon)
    }

    pub fn docker(&self, args: &[&str]) -> std::process::Output {
        Command::new("docker")
            .env("DOCKER_HOST", &self.host)
            .args(args)
            .output()
            .unwrap()
    }

    pub fn import(&self, rootfs: &Path, name: &str) -> Result<(), String> {
        let out = self.docker(&["import", &rootfs.display().to_string(), name]);
        out.status
            .success()
            .then_some(())
            .ok_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// Names of the containers labelled vibeos-exec=1 (running or not).
    pub fn labelled(&self) -> Vec<String> {
        let out = self.docker(&[
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

impl Drop for Dockerd {
    fn drop(&mut self) {
        let out = self.docker(&["ps", "-aq"]);
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = self.docker(&["rm", "-f", id]);
        }
        // SAFETY: kill with our own child's pid, not yet reaped.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
