//! Real backends for tests and benchmarks: a private dockerd (the lab's flags, no host
//! networking changes), rootful podman with its own storage, an sshd on 127.0.0.1 with generated
//! keys and a non-root user — each stopped by its own pid or cleaned up on drop — and the python3
//! image built from Debian packages by `scripts/backend-rootfs` (cached under target/).
//! Without the daemon or binary a test reports SKIP with the reason; with `CI=true` it fails.

// A test harness: a panic here is how a failed setup is reported.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn workspace() -> PathBuf {
    crate::e2e::workspace_root()
}

/// Skips (recorded for `scripts/test-all`'s skipped count) or, in CI, fails with `why`. The
/// caller returns right after.
pub fn unavailable(why: &str) {
    crate::skip_or_fail_in_ci(&why);
}

/// An executable on PATH (or in /usr/sbin, /sbin).
pub fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}

/// The python3 root filesystem tarball (built once by scripts/backend-rootfs).
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

/// A daemon the tests started: SIGTERM by its own pid on drop, SIGKILL if it has not exited
/// within 15 s. One implementation for dockerd and sshd.
struct Daemon {
    child: Child,
}

impl Daemon {
    /// Starts `cmd` with stderr into `log`.
    fn spawn(mut cmd: Command, log: &Path) -> Result<Daemon, String> {
        let program = cmd.get_program().to_string_lossy().into_owned();
        let child = cmd
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|e| format!("cannot start {program}: {e}"))?;
        Ok(Daemon { child })
    }

    /// Polls `ready` until it holds; an error with the log's last lines if the daemon exits or
    /// `timeout` passes first.
    fn wait_ready(
        &mut self,
        what: &str,
        timeout: Duration,
        log: &Path,
        mut ready: impl FnMut() -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        while !ready() {
            if Instant::now() > deadline || matches!(self.child.try_wait(), Ok(Some(_))) {
                let log = std::fs::read_to_string(log).unwrap_or_default();
                return Err(format!(
                    "{what} did not come up: {}",
                    log.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl Daemon {
    /// SIGTERM, then SIGKILL after 15 s; returns once it has exited. Idempotent.
    fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // SAFETY: kill with our own child's pid, not yet reaped (try_wait just said so).
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

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Detaches every mount at or below `dir` (deepest first): a dockerd that was stopped leaves
/// its data-root bind mount and network namespaces behind, and the dir could not be removed.
fn unmount_below(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<&str> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .collect();
    points.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in points {
        let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// A private dockerd, killed by its pid on drop (containers first).
pub struct Dockerd {
    /// Its data, exec root and socket.
    pub dir: tempfile::TempDir,
    /// `DOCKER_HOST` for it.
    pub host: String,
    daemon: Daemon,
}

impl Dockerd {
    /// Starts it and waits until it answers.
    pub fn start() -> Result<Dockerd, String> {
        let dockerd = which("dockerd").ok_or("dockerd is not installed")?;
        which("docker").ok_or("the docker CLI is not installed")?;
        let dir = tempfile::Builder::new()
            .prefix("vdk")
            .tempdir_in("/tmp")
            .map_err(|e| e.to_string())?;
        let d = dir.path();
        let host = format!("unix://{}/docker.sock", d.display());
        let mut cmd = Command::new(dockerd);
        cmd.arg("--data-root")
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
            ]);
        // The containerd it starts writes goroutine dumps (`containerd.<pid>.stacks.log`) to
        // its temp dir when signalled: keep them in this dir, which is removed with it.
        cmd.env("TMPDIR", d);
        let log = d.join("dockerd.log");
        let daemon = Daemon::spawn(cmd, &log)?;
        let mut dockerd = Dockerd { dir, host, daemon };
        let ping = |host: &str| {
            Command::new("docker")
                .env("DOCKER_HOST", host)
                .args(["version", "--format", "{{.Server.Version}}"])
                .output()
                .is_ok_and(|o| o.status.success())
        };
        let host = dockerd.host.clone();
        dockerd
            .daemon
            .wait_ready("dockerd", Duration::from_secs(30), &log, || ping(&host))?;
        Ok(dockerd)
    }

    /// Starts it with the python3 image imported as `tag`, and a docker CLI wrapper bound to
    /// it (use as `terminal.docker_binary`).
    pub fn with_image(tag: &str) -> Result<(Dockerd, String), String> {
        let daemon = Dockerd::with_python_image(tag)?;
        let cli = daemon.cli_wrapper("docker-here", &daemon.host);
        Ok((daemon, cli))
    }

    /// Starts it with the python3 image of `scripts/backend-rootfs` imported as `tag` (the
    /// image the stand-ins' sandboxes run).
    pub fn with_python_image(tag: &str) -> Result<Dockerd, String> {
        let image = rootfs()?;
        let daemon = Dockerd::start()?;
        daemon.import(&image, tag)?;
        Ok(daemon)
    }

    /// Writes an executable `name` in its dir that runs the docker CLI against `host`.
    pub fn cli_wrapper(&self, name: &str, host: &str) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(
            &path,
            format!("#!/bin/sh\nDOCKER_HOST={host} exec docker \"$@\"\n"),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path.display().to_string()
    }

    /// Runs the docker CLI against it.
    pub fn docker(&self, args: &[&str]) -> std::process::Output {
        Command::new("docker")
            .env("DOCKER_HOST", &self.host)
            .args(args)
            .output()
            .unwrap()
    }

    /// Imports a root filesystem tarball as image `name`.
    pub fn import(&self, rootfs: &Path, name: &str) -> Result<(), String> {
        let out = self.docker(&["import", &rootfs.display().to_string(), name]);
        out.status
            .success()
            .then_some(())
            .ok_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// Names of the containers labelled vibeos-exec=1 (running or not).
    pub fn labelled(&self) -> Vec<String> {
        self.containers_with_label("vibeos-exec=1")
    }

    /// Names of the running containers carrying `label` (`KEY` or `KEY=VALUE`): the sandboxes
    /// of a stand-in (`modal-standin`, `daytona-standin=1`).
    pub fn running_with_label(&self, label: &str) -> Vec<String> {
        names(&self.docker(&[
            "ps",
            "--filter",
            &format!("label={label}"),
            "--format",
            "{{.Names}}",
        ]))
    }

    /// Names of the containers carrying `label`, running or not.
    pub fn containers_with_label(&self, label: &str) -> Vec<String> {
        names(&self.docker(&[
            "ps",
            "-a",
            "--filter",
            &format!("label={label}"),
            "--format",
            "{{.Names}}",
        ]))
    }
}

/// The lines of a `ps --format {{.Names}}` output.
fn names(out: &std::process::Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        // Containers first, then the daemon, then its leftover mounts, so that `dir` (dropped
        // after this) can be removed.
        let out = self.docker(&["ps", "-aq"]);
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = self.docker(&["rm", "-f", id]);
        }
        self.daemon.stop();
        unmount_below(self.dir.path());
    }
}

/// The non-root user the ssh tests log in as.
pub const SSH_USER: &str = "vibeos-sshtest";

/// A private sshd on 127.0.0.1, stopped by its pid on drop.
pub struct Sshd {
    /// Its config, keys (`userkey`, `known_hosts`) and the user's home (`home/`).
    pub dir: tempfile::TempDir,
    /// Its port.
    pub port: u16,
    _daemon: Daemon,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        // A test that failed before it stopped its ssh environment leaves that backend's
        // master connection (ControlPersist) running, and with it a session of the test user,
        // which makes usermod refuse every later sshd of every run on this machine: end the
        // clients that name this sshd's keys, by pid.
        // A client can be forking into the background when the first signal comes, so look
        // again until none is left, SIGKILL after the first second.
        let dir = self.dir.path().display().to_string();
        let daemon = self._daemon.child.id();
        let started = std::time::Instant::now();
        loop {
            let left: Vec<u32> = processes()
                .into_iter()
                .filter(|(pid, cmdline)| cmdline.contains(&dir) && *pid != daemon)
                .map(|(pid, _)| pid)
                .collect();
            if left.is_empty() || started.elapsed() > std::time::Duration::from_secs(10) {
                break;
            }
            let signal = if started.elapsed() < std::time::Duration::from_secs(1) {
                libc::SIGTERM
            } else {
                libc::SIGKILL
            };
            for pid in left {
                // SAFETY: kill with a pid just read from /proc; at worst it has exited meanwhile.
                unsafe {
                    libc::kill(pid as i32, signal);
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        // The daemon before `dir` (fields drop in order, and `dir` comes first).
        self._daemon.stop();
        // And the environments' private dirs over there, which a failed test's unstopped
        // environment leaves: the next test that checks its own end finds none but its own.
        let _ = Command::new("find")
            .args(["/tmp", "-maxdepth", "1", "-user", SSH_USER, "-name"])
            .args(["vibeos-exec-env-*", "-exec", "rm", "-rf", "{}", "+"])
            .status();
    }
}

/// Every process's pid and command line (NULs as spaces).
fn processes() -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")))
        })
        .collect()
}

fn keygen(path: &Path) {
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", ""])
        .arg("-f")
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "ssh-keygen failed");
}

/// Points [`SSH_USER`]'s home at `home`. usermod refuses while the user has processes — on a
/// machine shared by several test runs, another run's ssh session — so it is retried for a
/// while, then reported (a skip, or a failure on CI) instead of leaving the home elsewhere.
fn point_home_at(home: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new("usermod")
            .args(["-p", "*", "-d"])
            .arg(home)
            .arg(SSH_USER)
            .output()
            .map_err(|e| format!("cannot run usermod: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "cannot point {SSH_USER}'s home at this sshd's dir ({}): another test run on this machine is logged in as {SSH_USER}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Starts an sshd for [`SSH_USER`] (created if missing; needs root).
pub fn start_sshd() -> Result<Sshd, String> {
    start_sshd_with(&[])
}

/// [`start_sshd`] with server options (`Key=value`, as `sshd -o` takes them) over the test
/// configuration: a hardened server, say.
pub fn start_sshd_with(options: &[&str]) -> Result<Sshd, String> {
    let sshd = which("sshd").ok_or("sshd (openssh-server) is not installed")?;
    which("ssh").ok_or("the ssh client is not installed")?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("creating the non-root test user needs root".into());
    }
    let dir = tempfile::Builder::new()
        .prefix("vssh")
        .tempdir_in("/tmp")
        .map_err(|e| e.to_string())?;
    let d = dir.path();
    let home = d.join("home");
    let exists = Command::new("id")
        .arg(SSH_USER)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !exists {
        let ok = Command::new("useradd")
            .args(["-M", "-s", "/bin/sh", SSH_USER])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            return Err("useradd failed".into());
        }
    }
    point_home_at(&home)?;
    std::fs::create_dir(&home).unwrap();
    let _ = Command::new("chown").arg(SSH_USER).arg(&home).status();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all("/run/sshd").map_err(|e| e.to_string())?;
    keygen(&d.join("hostkey"));
    keygen(&d.join("userkey"));
    std::fs::copy(d.join("userkey.pub"), d.join("authorized_keys")).unwrap();
    std::fs::set_permissions(
        d.join("authorized_keys"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    std::fs::write(
        d.join("sshd_config"),
        format!(
            "ListenAddress 127.0.0.1\nPort {port}\nHostKey {d}/hostkey\nAuthorizedKeysFile {d}/authorized_keys\nPidFile {d}/sshd.pid\nUsePAM no\nPasswordAuthentication no\nStrictModes no\nAllowStreamLocalForwarding yes\nStreamLocalBindUnlink yes\n",
            d = d.display()
        ),
    )
    .unwrap();
    let hostkey = std::fs::read_to_string(d.join("hostkey.pub")).unwrap();
    std::fs::write(
        d.join("known_hosts"),
        format!("[127.0.0.1]:{port} {hostkey}"),
    )
    .unwrap();
    let mut cmd = Command::new(sshd);
    cmd.args(["-D", "-e", "-f"]).arg(d.join("sshd_config"));
    for option in options {
        cmd.arg("-o").arg(option);
    }
    let log = d.join("sshd.log");
    let mut daemon = Daemon::spawn(cmd, &log)?;
    daemon.wait_ready("sshd", Duration::from_secs(10), &log, || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    })?;
    Ok(Sshd {
        dir,
        port,
        _daemon: daemon,
    })
}

/// Starts a container the way a crashed host would have left it (labelled, owner pid gone) with
/// `cli` (docker or podman) from `image`, for `backends gc` to find.
pub fn plant_crashed_container(cli: impl Fn(&[&str]) -> std::process::Output, image: &str) {
    let out = cli(&[
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
        image,
        "600",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Rootful podman with its own storage and the lab's flags, behind a wrapper script.
pub struct Podman {
    dir: tempfile::TempDir,
    /// The wrapper: use it as `terminal.docker_binary`.
    pub wrapper: String,
}

impl Podman {
    /// Runs podman with `args`.
    pub fn cmd(&self, args: &[&str]) -> std::process::Output {
        Command::new(&self.wrapper).args(args).output().unwrap()
    }
    /// Names of the containers labelled vibeos-exec=1.
    pub fn labelled(&self) -> Vec<String> {
        names(&self.cmd(&[
            "ps",
            "-a",
            "--filter",
            "label=vibeos-exec=1",
            "--format",
            "{{.Names}}",
        ]))
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.cmd(&["rm", "-af", "-t", "0"]);
        let _ = self.cmd(&["system", "reset", "-f"]);
        let _ = self.dir.path();
    }
}

/// Starts podman storage and imports the test image as `vibeos-py:test`.
pub fn start_podman() -> Result<Podman, String> {
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
