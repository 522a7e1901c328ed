//! Strict mode against attack (SPEC §6): one fixture per escape attempt under
//! `fixtures/escapes/`, each run confined, and each checked from outside — nothing read (no
//! marker in the output), nothing written (victims unchanged, nothing created), nothing reached
//! (listeners saw no connection or datagram), nothing left running (no process of the sandbox
//! alive, no staging dir left).
//!
//! The targets are deliberately open to everyone (0777 dirs, 0666 files, a 0777 socket), so it
//! is the confinement that stops each attempt, not file permissions. Values the scripts need
//! (paths, ports, the supervisor's pid) are written into the script text: strict scripts cannot
//! read the session dir, and the environment is scrubbed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{json, Value};
use std::io::ErrorKind;
use std::net::{TcpListener, UdpSocket};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::PathBuf;
use vibeos_e2e::{fixture, pid_alive, processes_mentioning, strict_unavailable, Sandbox};

macro_rules! require_strict {
    () => {
        if let Some(why) = strict_unavailable() {
            vibeos_testkit::skip!("strict mode is unavailable on this machine: {why}");
        }
    };
}

const EPERM: i64 = 1;
const EACCES: i64 = 13;

/// A sandbox with targets to attack.
struct Range {
    sb: Sandbox,
    ssh_marker: String,
    project_marker: String,
    env_marker: String,
    outside: PathBuf,
    victim: PathBuf,
}

fn open_to_all(p: &std::path::Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn range() -> Range {
    let mut sb = Sandbox::new();
    let tag = format!("{}-{:?}", std::process::id(), std::time::Instant::now());
    let tag: String = tag.chars().filter(char::is_ascii_alphanumeric).collect();
    open_to_all(sb.root.path(), 0o755);
    let fake_home = sb.root.path().join("fakehome");
    std::fs::create_dir_all(fake_home.join(".ssh")).unwrap();
    let ssh_marker = format!("SSH-KEY-MARKER-{tag}");
    std::fs::write(fake_home.join(".ssh/id_rsa"), &ssh_marker).unwrap();
    open_to_all(&fake_home, 0o755);
    open_to_all(&fake_home.join(".ssh"), 0o755);
    open_to_all(&fake_home.join(".ssh/id_rsa"), 0o644);
    sb.set_env("HOME", fake_home.to_str().unwrap());
    let project_marker = format!("PROJECT-MARKER-{tag}");
    std::fs::write(sb.work().join("secret.txt"), &project_marker).unwrap();
    open_to_all(&sb.work(), 0o755);
    open_to_all(&sb.work().join("secret.txt"), 0o644);
    let env_marker = format!("SUPERVISOR-ENV-MARKER-{tag}");
    sb.set_env("VIBEOS_E2E_ENV_MARKER", &env_marker);
    let outside = sb.root.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    open_to_all(&outside, 0o777);
    let victim = outside.join("victim.txt");
    std::fs::write(&victim, "ORIGINAL").unwrap();
    open_to_all(&victim, 0o666);
    sb.write_config("code_execution:\n  strict:\n    max_processes: 64\n    memory_mb: 256\n");
    Range {
        sb,
        ssh_marker,
        project_marker,
        env_marker,
        outside,
        victim,
    }
}

impl Range {
    fn params(&self) -> Value {
        json!({
            "ssh_key": self.sb.root.path().join("fakehome/.ssh/id_rsa"),
            "project_file": self.sb.work().join("secret.txt"),
            "project_dir": self.sb.work(),
            "outside_dir": self.outside,
            "victim": self.victim,
            "test_pid": std::process::id(),
        })
    }

    /// Runs one escape fixture in strict mode with `extra` params.
    fn attack(&self, name: &str, extra: Value, args: &[&str]) -> Value {
        let prelude = std::fs::read_to_string(fixture("escapes/_prelude.py")).unwrap();
        let body = std::fs::read_to_string(fixture(&format!("escapes/{name}.py"))).unwrap();
        let mut params = self.params();
        for (k, v) in extra.as_object().unwrap() {
            params[k] = v.clone();
        }
        let mut all = vec!["--mode", "strict"];
        all.extend_from_slice(args);
        let result = self.sb.run_json_with_pid(&all, |pid| {
            params["supervisor_pid"] = json!(pid);
            format!(
                "{prelude}\nPARAMS = json.loads({:?})\n{body}",
                params.to_string()
            )
        });
        assert_eq!(
            result["mode"], "strict",
            "the run did not happen in strict mode: {result}"
        );
        self.assert_nothing_left();
        result
    }

    fn assert_nothing_left(&self) {
        let tmp = self.sb.tmp().display().to_string();
        let alive = processes_mentioning(&tmp);
        assert!(
            alive.is_empty(),
            "processes of the execution survived: {alive:?}"
        );
        assert!(
            self.sb.staging_dirs().is_empty(),
            "staging dirs left: {:?}",
            self.sb.staging_dirs()
        );
    }

    /// The ESCAPES report of a run that completed; asserts nothing got through and no secret
    /// reached the output.
    fn contained(&self, result: &Value) -> Vec<Value> {
        let output = result["output"].as_str().unwrap_or_default();
        for marker in [&self.ssh_marker, &self.project_marker, &self.env_marker] {
            assert!(
                !output.contains(marker.as_str()),
                "a secret leaked: {output}"
            );
        }
        assert_eq!(
            result["status"], "success",
            "the fixture did not finish: {result}"
        );
        let line = output
            .lines()
            .find_map(|l| l.strip_prefix("ESCAPES "))
            .unwrap_or_else(|| panic!("no ESCAPES report in: {output}"));
        let attempts: Vec<Value> = serde_json::from_str(line).unwrap();
        assert!(!attempts.is_empty());
        for a in &attempts {
            assert_eq!(a["escaped"], false, "an attempt got through: {a}");
        }
        assert_eq!(
            std::fs::read_to_string(&self.victim).unwrap(),
            "ORIGINAL",
            "the outside file was changed"
        );
        let outside: Vec<_> = std::fs::read_dir(&self.outside)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(outside.len(), 1, "files appeared outside: {outside:?}");
        attempts
    }
}

fn errno_of(attempts: &[Value], what: &str) -> i64 {
    attempts
        .iter()
        .find(|a| a["what"] == what)
        .unwrap_or_else(|| panic!("no attempt {what:?} in {attempts:?}"))["errno"]
        .as_i64()
        .unwrap_or(-1)
}

#[test]
fn reading_ssh_keys_fails() {
    require_strict!();
    let r = range();
    let attempts = r.contained(&r.attack("read_ssh", json!({}), &[]));
    assert_eq!(errno_of(&attempts, "read ~/.ssh/id_rsa"), EACCES);
}

#[test]
fn reading_etc_shadow_fails() {
    require_strict!();
    let r = range();
    let attempts = r.contained(&r.attack("read_shadow", json!({}), &[]));
    assert_eq!(errno_of(&attempts, "read /etc/passwd"), EACCES);
}

#[test]
fn reading_the_project_tree_fails() {
    require_strict!();
    let r = range();
    let attempts = r.contained(&r.attack("read_project", json!({}), &[]));
    assert_eq!(errno_of(&attempts, "read project file"), EACCES);
    assert_eq!(errno_of(&attempts, "list project dir"), EACCES);
}

#[test]
fn reading_the_supervisors_environ_and_memory_fails() {
    require_strict!();
    let r = range();
    let attempts = r.contained(&r.attack("read_supervisor_proc", json!({}), &[]));
    assert_eq!(errno_of(&attempts, "read /proc/PID/environ"), EACCES);
    assert_eq!(errno_of(&attempts, "read /proc/PID/mem"), EACCES);
}

#[test]
fn writing_outside_the_staging_dir_fails() {
    require_strict!();
    let r = range();
    let attempts = r.contained(&r.attack("write_outside", json!({}), &[]));
    assert_eq!(errno_of(&attempts, "overwrite outside file"), EACCES);
}

#[test]
fn writing_through_a_planted_symlink_fails() {
    require_strict!();
    let r = range();
    let attempts = r.contained(&r.attack("write_via_symlink", json!({}), &[]));
    assert_eq!(errno_of(&attempts, "write through file symlink"), EACCES);
}

#[test]
fn writing_through_a_planted_hard_link_fails() {
    require_strict!();
    let r = range();
    r.contained(&r.attack("write_via_hardlink", json!({}), &[]));
}

#[test]
fn tcp_to_a_loopback_listener_fails() {
    require_strict!();
    let r = range();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let attempts = r.contained(&r.attack("tcp_connect", json!({ "tcp_port": port }), &[]));
    assert_eq!(
        errno_of(&attempts, "tcp connect to loopback listener"),
        EPERM
    );
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        ErrorKind::WouldBlock,
        "the listener was reached"
    );
}

#[test]
fn udp_to_a_loopback_socket_fails() {
    require_strict!();
    let r = range();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_nonblocking(true).unwrap();
    let port = socket.local_addr().unwrap().port();
    let attempts = r.contained(&r.attack("udp_send", json!({ "udp_port": port }), &[]));
    assert_eq!(errno_of(&attempts, "udp sendto loopback"), EPERM);
    let mut buf = [0u8; 64];
    assert_eq!(
        socket.recv(&mut buf).unwrap_err().kind(),
        ErrorKind::WouldBlock,
        "a datagram arrived"
    );
}

#[test]
fn abstract_unix_sockets_are_out_of_reach() {
    require_strict!();
    let r = range();
    let name = format!("vibeos-e2e-abstract-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    let attempts = r.contained(&r.attack("unix_abstract", json!({ "abstract_name": name }), &[]));
    assert_eq!(errno_of(&attempts, "connect abstract unix socket"), EPERM);
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        ErrorKind::WouldBlock,
        "the abstract socket was reached"
    );
}

#[test]
fn pathname_unix_sockets_are_out_of_reach() {
    require_strict!();
    let r = range();
    let path = r.outside.join("listener.sock");
    let listener = UnixListener::bind(&path).unwrap();
    open_to_all(&path, 0o777);
    listener.set_nonblocking(true).unwrap();
    let result = r.attack("unix_path", json!({ "unix_path": path }), &[]);
    std::fs::remove_file(&path).unwrap();
    let attempts = r.contained(&result);
    assert_eq!(errno_of(&attempts, "connect pathname unix socket"), EPERM);
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        ErrorKind::WouldBlock,
        "the pathname socket was reached"
    );
}

#[test]
fn ptrace_of_the_supervisor_fails() {
    require_strict!();
    let r = range();
    let attempts = r.contained(&r.attack("ptrace_supervisor", json!({}), &[]));
    assert_eq!(errno_of(&attempts, "ptrace attach supervisor"), EPERM);
    assert_eq!(errno_of(&attempts, "process_vm_readv supervisor"), EPERM);
}

#[test]
fn signalling_the_supervisor_fails() {
    require_strict!();
    let r = range();
    let attempts = r.contained(&r.attack("signal_supervisor", json!({}), &[]));
    for what in [
        "signal 0 to supervisor",
        "SIGCONT to supervisor",
        "SIGCONT to reaper",
        "SIGCONT to test",
    ] {
        assert_eq!(errno_of(&attempts, what), EPERM, "{what}");
    }
}

#[test]
fn new_namespaces_are_refused() {
    require_strict!();
    let r = range();
    let attempts = r.contained(&r.attack("unshare_userns", json!({}), &[]));
    assert_eq!(errno_of(&attempts, "unshare user namespace"), EPERM);
    let attempts = r.contained(&r.attack("clone3_namespaces", json!({}), &[]));
    // clone3 answers ENOSYS so libc falls back to clone, whose flags the filter checks.
    assert_eq!(errno_of(&attempts, "clone3 new user+pid namespace"), 38);
    assert_eq!(errno_of(&attempts, "clone new user namespace"), EPERM);
}

#[test]
fn dangerous_kernel_interfaces_are_refused() {
    require_strict!();
    let r = range();
    for (fixture, what) in [
        ("io_uring", "io_uring_setup"),
        ("bpf", "bpf map create"),
        ("keyctl", "keyctl get session keyring"),
        ("mount", "mount tmpfs"),
        ("userfaultfd", "userfaultfd"),
        ("personality", "personality ADDR_NO_RANDOMIZE"),
        ("open_by_handle", "open_by_handle_at"),
    ] {
        let attempts = r.contained(&r.attack(fixture, json!({}), &[]));
        assert_eq!(errno_of(&attempts, what), EPERM, "{fixture}");
    }
}

#[test]
fn tiocsti_is_refused() {
    require_strict!();
    let r = range();
    let attempts = r.contained(&r.attack("tiocsti", json!({}), &[]));
    // On a pipe the kernel would say ENOTTY; EPERM shows the filter refused the request itself.
    assert_eq!(errno_of(&attempts, "TIOCSTI on fd 1"), EPERM);
    assert_eq!(errno_of(&attempts, "TIOCSTI on fd 2"), EPERM);
}

#[test]
fn a_setuid_root_interpreter_grants_nothing() {
    require_strict!();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        vibeos_testkit::skip!("making a setuid-root binary needs root");
    }
    let r = range();
    let suid_dir = r.sb.root.path().join("suid");
    std::fs::create_dir(&suid_dir).unwrap();
    let real = std::fs::canonicalize(vibeos_e2e::python3()).unwrap();
    let copy = suid_dir.join("python3");
    std::fs::copy(&real, &copy).unwrap();
    open_to_all(&copy, 0o4755);
    // A copy outside its prefix still finds its stdlib through the build-time prefix only for a
    // statically linked interpreter; use the system one when the configured one is not.
    let lib_ok = std::process::Command::new(&copy)
        .args(["-c", "import json"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !lib_ok {
        vibeos_testkit::skip!("a copy of {} does not run on its own", real.display());
    }
    r.sb.write_config(&format!(
        "code_execution:\n  python: {}\n  strict:\n    max_processes: 64\n",
        copy.display()
    ));
    let attempts = r.contained(&r.attack("setuid_exec", json!({}), &[]));
    let euid = attempts
        .iter()
        .find(|a| a["what"] == "euid at start")
        .unwrap();
    assert_ne!(euid["detail"], "0");
}

#[test]
fn a_setsid_double_fork_does_not_survive_the_timeout() {
    require_strict!();
    let r = range();
    let result = r.attack("setsid_double_fork", json!({}), &["--timeout", "3"]);
    assert_eq!(result["status"], "timeout", "{result}");
    let output = result["output"].as_str().unwrap();
    let pid: i32 = output
        .lines()
        .find_map(|l| l.strip_prefix("ORPHAN "))
        .unwrap_or_else(|| panic!("the orphan did not report: {output}"))
        .trim()
        .parse()
        .unwrap();
    assert!(!pid_alive(pid), "the detached grandchild {pid} survived");
}

#[test]
fn a_fork_bomb_ends_in_a_clean_error_while_tools_keep_working() {
    require_strict!();
    let r = range();
    let result = r.attack("fork_bomb", json!({}), &["--timeout", "60"]);
    assert_eq!(result["status"], "error", "{result}");
    let output = result["output"].as_str().unwrap();
    assert!(output.contains("FORK REFUSED"), "{output}");
    assert!(output.contains("fork bomb contained"), "{output}");
    assert_eq!(result["tool_calls_made"], 2, "{result}");
    assert_eq!(
        std::fs::read_to_string(r.sb.work().join("after_bomb.txt")).unwrap(),
        "still serving"
    );
    // The supervisor is fine afterwards: the next execution runs normally.
    let next = r.sb.run_json("print('next')", &["--mode", "strict"]);
    assert_eq!(next["status"], "success", "{next}");
    assert_eq!(next["output"], "next\n");
}

#[test]
fn a_memory_bomb_ends_in_a_clean_error() {
    require_strict!();
    let r = range();
    let result = r.attack("memory_bomb", json!({}), &["--timeout", "60"]);
    assert_eq!(result["status"], "error", "{result}");
    assert!(
        result["error"]
            .as_str()
            .unwrap_or("")
            .contains("MemoryError"),
        "{result}"
    );
    assert_eq!(result["tool_calls_made"], 1);
    let next = r.sb.run_json("print('next')", &["--mode", "strict"]);
    assert_eq!(next["status"], "success", "{next}");
}
