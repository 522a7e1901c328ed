//! execute_code and the tools over the ssh backend, against an sshd the test starts on
//! 127.0.0.1 with generated keys and a non-root user: tools act on the remote side as that
//! user, remote env scrubbing, shell sessions, a timeout leaves no remote process (checked with
//! `ps` there), the private work dir is removed, and an unreachable host is a clear error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backends_common;

use backends_common::{unavailable, which};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vibeos_supervisor::{execute, Config, ExecutionRequest, ExecutionResult, Interrupt, Status};
use vibeos_tools::environments::{self, settings::KnownHosts, BackendKind, BackendSettings};

const USER: &str = "vibeos-sshtest";

struct Sshd {
    dir: tempfile::TempDir,
    port: u16,
    child: Child,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        // SAFETY: kill with our own child's pid, not yet reaped.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
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

fn start_sshd() -> Result<Sshd, String> {
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
        .arg(USER)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !exists {
        let ok = Command::new("useradd")
            .args(["-M", "-s", "/bin/sh", USER])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            return Err("useradd failed".into());
        }
    }
    let _ = Command::new("usermod")
        .args(["-p", "*", "-d"])
        .arg(&home)
        .arg(USER)
        .status();
    std::fs::create_dir(&home).unwrap();
    let _ = Command::new("chown").arg(USER).arg(&home).status();
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
    let child = Command::new(sshd)
        .args(["-D", "-e", "-f"])
        .arg(d.join("sshd_config"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(d.join("sshd.log")).unwrap())
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("sshd did not listen".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Sshd { dir, port, child })
}

fn settings(sshd: &Sshd, port: u16) -> BackendSettings {
    let d = sshd.dir.path();
    BackendSettings {
        backend: BackendKind::Ssh,
        ssh_host: Some("127.0.0.1".into()),
        ssh_port: Some(port),
        ssh_user: Some(USER.into()),
        ssh_key: Some(d.join("userkey")),
        ssh_known_hosts: KnownHosts::File(d.join("known_hosts")),
        agent_binary: Some(PathBuf::from(env!("CARGO_BIN_EXE_vibeos-exec"))),
        ..BackendSettings::default()
    }
}

fn request(code: &str) -> ExecutionRequest {
    let mut r = ExecutionRequest::from_config(code, &Config::default());
    r.task_id = Some("ssh-task".into());
    r.timeout = Duration::from_secs(60);
    r.base_env = Some(vec![
        (OsString::from("LANG"), OsString::from("C.UTF-8")),
        (
            OsString::from("MY_SECRET_TOKEN"),
            OsString::from("hunter2-host-secret"),
        ),
    ]);
    r
}

fn run(rt: &tokio::runtime::Runtime, req: ExecutionRequest) -> ExecutionResult {
    rt.block_on(execute(req, vibeos_tools::registry(), Interrupt::new()))
}

fn remote_processes() -> String {
    let out = Command::new("ps")
        .args(["-u", USER, "-o", "pid,args"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn ssh_backend_end_to_end() {
    let sshd = match start_sshd() {
        Ok(s) => s,
        Err(e) => return unavailable(&e),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    environments::activate(settings(&sshd, sshd.port));
    let home = sshd.dir.path().join("home");
    let code = r#"
from vibeos_tools import write_file, read_file, terminal
import os, json
w = write_file("notes.txt", "written remotely")
assert "error" not in w, w
print("open:", open(os.path.expanduser("~/notes.txt")).read())
print("whoami:", terminal("whoami")["output"].strip())
terminal("cd /tmp && export SSH_SESSION_T=kept")
print("session:", terminal("pwd; echo $SSH_SESSION_T")["output"].split())
print("env:", json.dumps(dict(os.environ)), terminal("env")["output"].replace("\n", " "))
print("workdir:", os.path.dirname(os.path.abspath(__file__)), oct(os.stat(os.path.dirname(os.path.abspath(__file__))).st_mode & 0o777))
"#;
    let r = run(&rt, request(code));
    assert_eq!(r.status, Status::Success, "{r:?}");
    assert_eq!(r.backend.as_deref(), Some("ssh"));
    assert!(r.output.contains("open: written remotely"), "{}", r.output);
    assert!(
        r.output.contains(&format!("whoami: {USER}")),
        "{}",
        r.output
    );
    assert!(
        r.output.contains("session: ['/tmp', 'kept']"),
        "{}",
        r.output
    );
    assert!(r.output.contains("0o700"), "private work dir: {}", r.output);
    assert!(!r.output.contains("hunter2-host-secret"), "{}", r.output);
    assert!(
        home.join("notes.txt").exists(),
        "written on the remote side (the user's home)"
    );
    let workdir = r
        .output
        .lines()
        .find_map(|l| l.strip_prefix("workdir: "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();
    assert!(
        !Path::new(&workdir).exists(),
        "the remote work dir was removed: {workdir}"
    );

    // A timeout kills the remote process group, not just the local client.
    let mut req = request("import subprocess, time\nsubprocess.Popen(['sleep', '4545'])\nprint('up', flush=True)\ntime.sleep(600)");
    req.timeout = Duration::from_secs(2);
    req.kill_grace = Duration::from_secs(1);
    let r = run(&rt, req);
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    std::thread::sleep(Duration::from_millis(500));
    let ps = remote_processes();
    assert!(
        !ps.contains("sleep 4545") && !ps.contains("script.py"),
        "left behind: {ps}"
    );

    environments::shutdown();
    let ps = remote_processes();
    assert!(!ps.contains("backend-agent"), "agent left behind: {ps}");

    // An unreachable host: a clear error, quickly.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    environments::activate(settings(&sshd, closed));
    let started = Instant::now();
    let r = run(&rt, request("print(1)"));
    assert_eq!(r.status, Status::Error);
    let err = r.error.unwrap_or_default();
    assert!(err.contains("cannot connect to 127.0.0.1"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30));
    environments::activate(BackendSettings::default());
}
