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
use vibeos_testkit::{fixture, pid_alive, processes_mentioning, strict_unavailable, Sandbox};

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
        ("memfd", "memfd_create"),
        ("memfd", "memfd_create raw"),
    ] {
        let result = r.attack(fixture, json!({}), &[]);
        let attempts = r.contained(&result);
        assert_eq!(errno_of(&attempts, what), EPERM, "{fixture}");
        if fixture == "memfd" {
            let output = result["output"].as_str().unwrap_or_default();
            assert!(output.contains("SORTED [1, 2, 3, 4, 5]"), "{output}");
        }
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
    let real = std::fs::canonicalize(vibeos_testkit::python3()).unwrap();
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

/// Links planted (by someone else) in the project dir, the tools' cwd root, that lead out.
fn plant_project_links(r: &Range) {
    let work = r.sb.work();
    let key = r.sb.root.path().join("fakehome/.ssh/id_rsa");
    std::fs::hard_link(&key, work.join("hardlink-to-key")).unwrap();
    std::os::unix::fs::symlink(&key, work.join("symlink-to-key")).unwrap();
    std::os::unix::fs::symlink(&r.outside, work.join("dir-link-to-outside")).unwrap();
}

#[test]
fn the_file_tools_read_nothing_outside_the_allowed_roots() {
    require_strict!();
    let r = range();
    plant_project_links(&r);
    let attempts = r.contained(&r.attack("tools_read_outside", json!({}), &[]));
    assert!(attempts.len() >= 15, "{attempts:?}");
    for a in &attempts {
        let detail = a["detail"].as_str().unwrap_or_default();
        assert!(
            !detail.contains("SSH-KEY-MARKER") && !detail.contains("root:"),
            "a secret reached the script: {a}"
        );
    }
}

#[test]
fn the_file_tools_write_nothing_outside_the_allowed_roots_and_terminal_is_not_offered() {
    require_strict!();
    let r = range();
    plant_project_links(&r);
    let before: Vec<_> = std::fs::read_dir(r.sb.work())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    let attempts = r.contained(&r.attack("tools_write_outside", json!({}), &[]));
    assert!(attempts.len() >= 10, "{attempts:?}");
    let terminal = attempts
        .iter()
        .find(|a| a["what"] == "terminal over the raw channel")
        .unwrap();
    assert!(
        terminal["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("not available"),
        "{terminal}"
    );
    let after: Vec<_> = std::fs::read_dir(r.sb.work())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        before.len(),
        after.len(),
        "files appeared in the project: {after:?}"
    );
    assert!(!std::path::Path::new("/tmp/pwned").exists());
}

#[test]
fn inotify_and_fanotify_are_refused() {
    require_strict!();
    let r = range();
    let attempts = r.contained(&r.attack("inotify_watch", json!({}), &[]));
    assert_eq!(errno_of(&attempts, "inotify_init1"), EPERM);
    assert_eq!(errno_of(&attempts, "inotify_init"), EPERM);
    assert_eq!(errno_of(&attempts, "fanotify_init"), EPERM);
}

/// Mode, owner, mtime, atime and xattrs of a file, to compare before and after an attack.
type FileMetadata = (u32, u32, i64, i64, Vec<(String, Vec<u8>)>);

fn metadata_of(p: &std::path::Path) -> FileMetadata {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).unwrap();
    let out = std::process::Command::new(vibeos_testkit::python3())
        .args([
            "-c",
            "import os,sys,json; p=sys.argv[1]; print(json.dumps([[n, list(os.getxattr(p, n))] \
             for n in sorted(os.listxattr(p))]))",
        ])
        .arg(p)
        .output()
        .unwrap();
    let xattrs: Vec<(String, Vec<u8>)> = serde_json::from_slice(&out.stdout).unwrap();
    (m.mode(), m.uid(), m.mtime(), m.atime(), xattrs)
}

#[test]
fn metadata_of_files_outside_the_staging_dir_can_be_neither_read_nor_changed() {
    require_strict!();
    let r = range();
    let secret = "XATTR-SECRET-VALUE";
    let set = std::process::Command::new(vibeos_testkit::python3())
        .args([
            "-c",
            &format!("import os,sys; os.setxattr(sys.argv[1], 'user.secret', b'{secret}')"),
        ])
        .arg(&r.victim)
        .status()
        .unwrap();
    if !set.success() {
        vibeos_testkit::skip_even_in_ci!("this filesystem has no user xattrs");
    }
    let interpreter = std::fs::canonicalize(vibeos_testkit::python3()).unwrap();
    let before = (metadata_of(&r.victim), metadata_of(&interpreter));
    let result = r.attack("metadata_outside", json!({}), &[]);
    assert!(
        !result["output"]
            .as_str()
            .unwrap_or_default()
            .contains(secret),
        "the xattr value leaked: {result}"
    );
    let attempts = r.contained(&result);
    for what in [
        "getxattr outside",
        "lgetxattr outside",
        "listxattr outside",
        "chmod outside",
        "fchmodat2 raw",
        "chown outside",
        "utime now outside",
        "fchmod interpreter",
        "futimens interpreter",
    ] {
        assert_eq!(errno_of(&attempts, what), EPERM, "{what}: {attempts:?}");
    }
    let after = (metadata_of(&r.victim), metadata_of(&interpreter));
    assert_eq!(before.0 .0, after.0 .0, "mode changed");
    assert_eq!(before.0 .2, after.0 .2, "mtime changed");
    assert_eq!(before.0 .4, after.0 .4, "xattrs changed");
    assert_eq!(before.1 .0, after.1 .0, "the interpreter's mode changed");
    assert_eq!(before.1 .2, after.1 .2, "the interpreter's mtime changed");
}

fn nice_and_affinity(pid: u32) -> (String, String) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let cpus = status
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list"))
        .unwrap_or_default()
        .to_string();
    // Field 19 of stat is nice (index 16 after the comm field).
    (fields[16].to_string(), cpus)
}

#[test]
fn other_processes_cannot_be_reniced_pinned_or_rescheduled() {
    require_strict!();
    let r = range();
    let me = std::process::id();
    let before = nice_and_affinity(me);
    let result = r.attack("renice_others", json!({}), &[]);
    assert!(
        result["output"]
            .as_str()
            .unwrap_or_default()
            .contains("SELF-SERVICE OK"),
        "the script could not renice or pin itself: {result}"
    );
    let attempts = r.contained(&result);
    for what in [
        "setpriority PRIO_USER of my uid",
        "setpriority PRIO_USER of my uid by number",
        "setpriority PRIO_PGRP",
        "setpriority of another pid",
        "sched_setaffinity of another pid",
        "sched_setscheduler of another pid",
        "sched_setparam of another pid",
        "prlimit of another pid",
    ] {
        assert_eq!(errno_of(&attempts, what), EPERM, "{what}: {attempts:?}");
    }
    assert_eq!(
        nice_and_affinity(me),
        before,
        "the test process was reniced or pinned"
    );
}

fn mounts_mentioning(needle: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

#[test]
fn filling_the_disk_ends_at_the_budget_in_a_clean_error() {
    require_strict!();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        vibeos_testkit::skip_even_in_ci!("the disk budget (a tmpfs) needs a root supervisor");
    }
    let r = range();
    r.sb.write_config(
        "code_execution:\n  strict:\n    max_processes: 64\n    memory_mb: 256\n    disk_mb: 16\n",
    );
    let tmp = r.sb.tmp().display().to_string();
    let result = r.attack("disk_fill", json!({}), &["--timeout", "60"]);
    assert_eq!(result["status"], "error", "{result}");
    let output = result["output"].as_str().unwrap();
    let line = output
        .lines()
        .find(|l| l.starts_with("DISK FULL"))
        .unwrap_or_else(|| panic!("{output}"));
    assert!(line.contains("errno=28"), "not ENOSPC: {line}");
    let mib: u64 = line.rsplit(' ').nth(1).unwrap().parse().unwrap();
    assert!(mib <= 16, "wrote {mib} MiB past a 16 MiB budget");
    assert!(output.contains("disk budget reached"), "{output}");
    assert!(
        mounts_mentioning(&tmp).is_empty(),
        "a staging mount was left: {:?}",
        mounts_mentioning(&tmp)
    );
    // The supervisor and the next execution are fine.
    let next = r.sb.run_json("print('next')", &["--mode", "strict"]);
    assert_eq!(next["status"], "success", "{next}");
}

#[test]
fn the_staging_dir_is_private_and_its_parent_closed() {
    require_strict!();
    let r = range();
    let result = r.attack("staging_probe", json!({}), &[]);
    let output = result["output"].as_str().unwrap_or_default();
    assert!(
        output.contains("STAGING MODE 700 PARENT MODE 711"),
        "{output}"
    );
    let attempts = r.contained(&result);
    assert_eq!(errno_of(&attempts, "list the staging parent"), EACCES);
    assert_eq!(errno_of(&attempts, "open the staging dir to others"), EPERM);
}

#[test]
fn nothing_in_a_closed_directory_can_be_probed_and_no_capability_is_held() {
    require_strict!();
    let r = range();
    let closed = r.sb.root.path().join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::write(closed.join("secret.txt"), "CLOSED-DIR-SECRET").unwrap();
    std::os::unix::fs::symlink("/etc/CLOSED-LINK-TARGET", closed.join("link")).unwrap();
    open_to_all(&closed, 0o700);
    let result = r.attack("closed_dir_metadata", json!({ "closed_dir": closed }), &[]);
    let output = result["output"].as_str().unwrap_or_default();
    assert!(!output.contains("CLOSED-LINK-TARGET"), "{output}");
    let attempts = r.contained(&result);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        for what in [
            "stat in closed dir",
            "lstat in closed dir",
            "readlink in closed dir",
            "chdir into closed dir",
            "listdir closed dir",
        ] {
            assert_eq!(errno_of(&attempts, what), EACCES, "{what}: {attempts:?}");
        }
    }
    let caps: Value = serde_json::from_str(
        output
            .lines()
            .find_map(|l| l.strip_prefix("CAPS "))
            .unwrap_or_else(|| panic!("{output}")),
    )
    .unwrap();
    assert_eq!(
        caps,
        json!({"sets": [0, 0, 0, 0, 0, 0], "ambient": 0}),
        "the script holds a capability"
    );
}

#[test]
fn web_extract_does_not_reach_loopback_or_private_addresses_for_a_strict_script() {
    require_strict!();
    let mut r = range();
    r.sb.set_env("VIBEOS_WEB_EXTRACT_BACKEND", "http");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let attempts = r.contained(&r.attack("tools_web_loopback", json!({ "tcp_port": port }), &[]));
    assert_eq!(attempts.len(), 10, "{attempts:?}");
    all_refused_for(&attempts, "public hosts");
    // Refused by name, before any resolution (a lookup would answer `cannot resolve` or
    // `resolves to`): `localhost.` skips /etc/hosts and went to DNS.
    for what in [
        "web_extract localhost. name",
        "web_extract LOCALHOST. name",
        "web_extract name beneath localhost",
    ] {
        let a = attempts.iter().find(|a| a["what"] == what).unwrap();
        assert!(
            a["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("names the loopback"),
            "{what} was not refused by name: {a}"
        );
    }
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        ErrorKind::WouldBlock,
        "the loopback listener was reached through web_extract"
    );
}

/// Asserts every attempt was refused with a reason that says `why` (not some other error that
/// happened to stop it).
fn all_refused_for(attempts: &[Value], why: &str) {
    for a in attempts {
        assert!(
            a["detail"].as_str().unwrap_or_default().contains(why),
            "refused for another reason than {why:?}: {a}"
        );
    }
}

#[test]
fn code_that_runs_outside_later_cannot_be_planted_in_the_project_through_the_tools() {
    require_strict!();
    let r = range();
    let git = r.sb.work().join(".git");
    std::fs::create_dir_all(git.join("hooks")).unwrap();
    std::fs::write(git.join("config"), "[core]\n\tbare = false\n").unwrap();
    open_to_all(&git, 0o755);
    let attempts = r.contained(&r.attack("tools_plant_hooks", json!({}), &[]));
    assert_eq!(attempts.len(), 10, "{attempts:?}");
    all_refused_for(&attempts, "run code");
    assert_eq!(
        std::fs::read_to_string(git.join("config")).unwrap(),
        "[core]\n\tbare = false\n"
    );
    for planted in [
        "sitecustomize.py",
        "sitecustomize/__init__.py",
        "usercustomize/__init__.py",
        "lib/evil.pth",
        ".envrc",
        ".git/hooks/pre-commit",
        "wt/commondir",
    ] {
        assert!(!r.sb.work().join(planted).exists(), "{planted} was written");
    }
}

/// A module the interpreter imports as it starts (`encodings`), planted at the top of the
/// project dir, which project mode puts on `PYTHONPATH`: it ran in the next project-mode run
/// there, whatever that run's script (stop 55).
#[test]
fn interpreter_startup_modules_cannot_be_planted_in_the_project_through_the_tools() {
    require_strict!();
    let r = range();
    let marker = r.outside.join("startup-module-ran");
    let attempts = r.contained(&r.attack(
        "tools_plant_startup_modules",
        json!({"marker": marker}),
        &[],
    ));
    assert_eq!(attempts.len(), 8, "{attempts:?}");
    all_refused_for(&attempts, "run code");
    for planted in [
        "encodings",
        "encodings.py",
        "os.py",
        "_distutils_hack",
        "site.py",
    ] {
        assert!(!r.sb.work().join(planted).exists(), "{planted} was written");
    }
    for lookalike in ["site/index.html", "src/os.py", "encodings.txt"] {
        assert!(
            r.sb.work().join(lookalike).exists(),
            "{lookalike} was refused"
        );
    }
    // The next project-mode interpreter in that dir starts as it would have.
    let next = r.sb.run_json("print('hello')", &["--mode", "project"]);
    assert_eq!(next["status"], "success", "{next}");
    assert!(!marker.exists(), "a planted start-up module ran");
}

#[test]
fn vibeos_config_and_plugins_cannot_be_planted_through_the_tools() {
    require_strict!();
    let r = range();
    // The home beneath a write root, named directly and through a symlink beside it (whose
    // spelling does not name the home).
    r.sb.write_config(&format!(
        "code_execution:\n  strict:\n    max_processes: 64\n    memory_mb: 256\n    write_roots: [{}]\n",
        r.sb.root.path().display()
    ));
    let config = std::fs::read_to_string(r.sb.home().join("config.yaml")).unwrap();
    open_to_all(&r.sb.home(), 0o755);
    std::os::unix::fs::symlink("home", r.sb.root.path().join("conf")).unwrap();
    let attempts = r.contained(&r.attack(
        "tools_plant_product_files",
        json!({"home": r.sb.home(), "root": r.sb.root.path()}),
        &[],
    ));
    assert_eq!(attempts.len(), 8, "{attempts:?}");
    all_refused_for(&attempts, "run code");
    assert_eq!(
        std::fs::read_to_string(r.sb.home().join("config.yaml")).unwrap(),
        config,
        "the config was changed"
    );
    for planted in [
        r.sb.home().join("plugins"),
        r.sb.work().join(".vibeos"),
        r.sb.work().join("sub/.Vibeos"),
    ] {
        assert!(!planted.exists(), "{} was made", planted.display());
    }
}

#[test]
fn swapping_a_directory_for_a_symlink_mid_call_gets_the_tools_nothing() {
    require_strict!();
    let r = range();
    let key = r.sb.root.path().join("fakehome/.ssh/id_rsa");
    let before = std::fs::read_to_string(&key).unwrap();
    let result = r.attack("tools_race", json!({}), &["--max-tool-calls", "200"]);
    r.contained(&result);
    assert_eq!(
        std::fs::read_to_string(&key).unwrap(),
        before,
        "the key was overwritten"
    );
}

#[test]
fn filling_the_disk_through_the_tools_stops_at_the_budget() {
    require_strict!();
    let r = range();
    r.sb.write_config(
        "code_execution:\n  strict:\n    max_processes: 64\n    memory_mb: 256\n    disk_mb: 8\n",
    );
    let result = r.attack("tools_disk_fill", json!({}), &["--max-tool-calls", "100"]);
    let output = result["output"].as_str().unwrap_or_default().to_string();
    let attempts = r.contained(&result);
    assert!(
        attempts[0]["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("disk budget"),
        "{output}"
    );
    let written: u64 = std::fs::read_dir(r.sb.work())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("fill-"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(
        written <= 8 << 20,
        "{written} bytes written past an 8 MiB budget"
    );
}

/// With `TMPDIR` at the session cwd, every execution's staging dir lies beneath the cwd, which
/// is a tool root: the tools (running with the supervisor's rights) must still not reach a
/// neighbour's staging dir, where a planted module would run as the neighbour with its token.
#[test]
fn the_tools_do_not_reach_a_neighbours_staging_dir_beneath_the_cwd() {
    require_strict!();
    let mut r = range();
    let work = r.sb.work();
    r.sb.set_env("TMPDIR", work.to_str().unwrap());
    let marker = "NEIGHBOUR-SECRET-MARKER";
    // The neighbour: writes a secret into its staging dir, waits, then imports its tools (the
    // stub imports `socket` lazily, from the staging dir first) and shows what it finds.
    let victim = format!(
        "import os, time\nopen('secret.txt', 'w').write({marker:?})\ntime.sleep(8)\n\
         from vibeos_tools import read_file\nread_file('secret.txt')\n\
         print('SECRET', open('secret.txt').read())\nprint('FILES', sorted(os.listdir('.')))\n"
    );
    let script = r.sb.root.path().join("neighbour.py");
    std::fs::write(&script, victim).unwrap();
    let neighbour_run =
        r.sb.command()
            .args(["run", "--json", "--mode", "strict"])
            .arg(&script)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
    let started = std::time::Instant::now();
    let (parent, neighbour) = loop {
        let found = std::fs::read_dir(&work).unwrap().flatten().find_map(|e| {
            let parent = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("vibeos-staging-") {
                return None;
            }
            std::fs::read_dir(&parent).ok()?.flatten().find_map(|d| {
                let dir = d.path();
                dir.join("secret.txt")
                    .exists()
                    .then(|| (parent.clone(), dir))
            })
        });
        if let Some(found) = found {
            break found;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "the neighbour's staging dir never appeared under {}",
            work.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let rel = neighbour.strip_prefix(&work).unwrap();
    std::os::unix::fs::symlink(rel, work.join("peek")).unwrap();
    let result = r.attack(
        "tools_neighbour_staging",
        json!({ "neighbour": neighbour, "staging_parent": parent }),
        &[],
    );
    let output = result["output"].as_str().unwrap_or_default();
    assert!(!output.contains(marker), "{output}");
    let attempts = r.contained(&result);
    assert_eq!(attempts.len(), 11, "{attempts:?}");
    let out = neighbour_run.wait_with_output().unwrap();
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    let seen = seen["output"].as_str().unwrap_or_default();
    assert!(seen.contains(&format!("SECRET {marker}")), "{seen}");
    assert!(
        !seen.contains("INJECTED") && !seen.contains("socket.py"),
        "{seen}"
    );
}

/// Stop 54: the strict policy files, configured in a write root, are vibeos-exec's own places:
/// a script that loosened the landlock policy loosened every strict run after it.
#[test]
fn the_strict_policy_files_cannot_be_rewritten_through_the_tools() {
    require_strict!();
    let r = range();
    let landlock = r.sb.work().join("landlock.json");
    let seccomp = r.sb.work().join("seccomp.json");
    let policies = vibeos_testkit::workspace_root().join("policies");
    std::fs::copy(policies.join("landlock.json"), &landlock).unwrap();
    std::fs::copy(policies.join("seccomp-x86_64.json"), &seccomp).unwrap();
    let before = (
        std::fs::read(&landlock).unwrap(),
        std::fs::read(&seccomp).unwrap(),
    );
    r.sb.write_config(&format!(
        "code_execution:\n  strict:\n    max_processes: 64\n    memory_mb: 256\n    \
         landlock_policy: {}\n    seccomp_policy: {}\n",
        landlock.display(),
        seccomp.display()
    ));
    let attempts = r.contained(&r.attack(
        "tools_loosen_policy",
        json!({"landlock": landlock, "seccomp": seccomp}),
        &[],
    ));
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    all_refused_for(&attempts, "run code");
    assert_eq!(
        (
            std::fs::read(&landlock).unwrap(),
            std::fs::read(&seccomp).unwrap()
        ),
        before,
        "a policy file was changed"
    );
}

/// Stop 54: a read root (or session dir) holding the home does not hand the tools its config,
/// whose MCP server headers carry credentials, nor its logs; the script's own `open()` of them
/// fails as well.
#[test]
fn vibeos_config_and_logs_cannot_be_read_through_the_tools() {
    require_strict!();
    let r = range();
    let tag = format!("{}", std::process::id());
    let secret = format!("sk-STOP54-{tag}");
    r.sb.write_config(&format!(
        "code_execution:\n  strict:\n    max_processes: 64\n    memory_mb: 256\n    \
         read_roots: [{}]\nmcp_servers:\n  remote:\n    url: https://mcp.example.invalid/\n    \
         headers:\n      Api-Key: {secret}\n",
        r.sb.root.path().display()
    ));
    std::fs::create_dir_all(r.sb.home().join("logs")).unwrap();
    std::fs::write(
        r.sb.home().join("logs/agent.log"),
        format!("Api-Key {secret}\n"),
    )
    .unwrap();
    open_to_all(&r.sb.home(), 0o755);
    std::os::unix::fs::symlink("home", r.sb.root.path().join("conf")).unwrap();
    let result = r.attack(
        "tools_read_product_files",
        json!({"home": r.sb.home(), "root": r.sb.root.path()}),
        &[],
    );
    let output = result["output"].as_str().unwrap_or_default();
    assert!(!output.contains(&secret), "the API key leaked: {output}");
    let attempts = r.contained(&result);
    assert_eq!(attempts.len(), 7, "{attempts:?}");
}

/// Kernel memory held through descriptors (socket buffers, pipes) counts against neither
/// `RLIMIT_DATA` nor `RLIMIT_AS`: under `memory_mb: 64` a script held 1255 MB in socketpairs
/// whose `SO_SNDBUF` it raised to 8 MiB. Raising a buffer or growing a pipe is refused, and
/// what default buffers on every descriptor the script may hold (and as many in flight) add up
/// to stays within `memory_mb`.
#[test]
fn socket_and_pipe_buffers_stay_within_memory_mb() {
    require_strict!();
    let r = range();
    r.sb.write_config("code_execution:\n  strict:\n    max_processes: 16\n    memory_mb: 64\n");
    let result = r.attack(
        "socket_buffers",
        json!({ "memory_mb": 64 }),
        &["--timeout", "60"],
    );
    let output = result["output"].as_str().unwrap_or_default().to_string();
    let attempts = r.contained(&result);
    for what in [
        "raise SO_SNDBUF",
        "raise SO_RCVBUF",
        "raise SO_SNDBUFFORCE",
        "raise SO_RCVBUFFORCE",
        "grow a pipe (F_SETPIPE_SZ)",
    ] {
        assert_eq!(errno_of(&attempts, what), EPERM, "{what}: {output}");
    }
    let nofile = output
        .lines()
        .find_map(|l| l.strip_prefix("NOFILE "))
        .unwrap_or_else(|| panic!("{output}"));
    // 3 descriptors per MiB of memory_mb (64 MiB: 192), soft and hard alike.
    assert_eq!(nofile, "192 192", "{output}");
}

/// `sync`/`syncfs` write back every dirty page of the machine (or a whole filesystem): a
/// script looping on them slows every other execution. fsync of its own files still works.
#[test]
fn machine_wide_writeback_is_refused() {
    require_strict!();
    let r = range();
    let result = r.attack("sync_writeback", json!({}), &[]);
    let output = result["output"].as_str().unwrap_or_default().to_string();
    assert!(output.contains("FSYNC OK"), "{output}");
    let attempts = r.contained(&result);
    for what in ["sync", "syncfs"] {
        assert_eq!(errno_of(&attempts, what), EPERM, "{what}: {output}");
    }
}

/// The directories `write_file` makes on the way to a file take disk too (a block each): with
/// `disk_mb: 1`, 20 calls of 2,000 levels left 40,021 directories (157 MB) when only contents
/// counted.
#[test]
fn directories_the_tools_make_count_against_the_disk_budget() {
    require_strict!();
    let r = range();
    r.sb.write_config(
        "code_execution:\n  strict:\n    max_processes: 64\n    memory_mb: 256\n    disk_mb: 1\n",
    );
    let result = r.attack("tools_disk_dirs", json!({}), &[]);
    let output = result["output"].as_str().unwrap_or_default().to_string();
    let attempts = r.contained(&result);
    let deep = &attempts[0]["detail"];
    assert!(
        deep.as_str().unwrap_or_default().contains("levels"),
        "{output}"
    );
    let shallow = &attempts[1]["detail"];
    assert!(
        shallow.as_str().unwrap_or_default().contains("disk budget"),
        "{output}"
    );
    fn dirs_below(p: &std::path::Path) -> u64 {
        std::fs::read_dir(p)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| 1 + dirs_below(&e.path()))
                    .sum()
            })
            .unwrap_or(0)
    }
    let made = dirs_below(&r.sb.work());
    assert!(
        made * 4096 <= 1 << 20,
        "{made} directories made past a 1 MiB budget: {output}"
    );
}

/// The budget counts what the tools leave on disk: rewriting a file frees what it held, so the
/// same text written again takes nothing more (each rewrite was charged in full, and refused
/// once the budget was spent), and growing it takes the growth.
#[test]
fn rewriting_a_file_through_the_tools_takes_only_what_it_grows_from_the_disk_budget() {
    require_strict!();
    let r = range();
    r.sb.write_config(
        "code_execution:\n  strict:\n    max_processes: 64\n    memory_mb: 256\n    disk_mb: 1\n",
    );
    let script = r#"
import json
from vibeos_tools import write_file
out = {"first": write_file("same.bin", "A" * 600000)}
out["rewrites"] = [write_file("same.bin", "A" * 600000).get("error") for _ in range(4)]
out["grown"] = write_file("same.bin", "B" * 900000).get("error")
out["other"] = write_file("other.bin", "C" * 300000).get("error")
print(json.dumps(out))
"#;
    let result = r.sb.run_json(script, &["--mode", "strict"]);
    assert_eq!(result["mode"], "strict", "{result}");
    let out: Value = serde_json::from_str(result["output"].as_str().unwrap_or_default().trim())
        .unwrap_or_else(|e| panic!("{e}: {result}"));
    assert!(out["first"].get("error").is_none(), "{out}");
    assert_eq!(out["rewrites"], json!([null, null, null, null]), "{out}");
    assert_eq!(out["grown"], Value::Null, "{out}");
    assert!(
        out["other"]
            .as_str()
            .unwrap_or_default()
            .contains("disk budget"),
        "900,000 bytes held and 300,000 more passed a 1 MiB budget: {out}"
    );
    assert_eq!(
        std::fs::metadata(r.sb.work().join("same.bin"))
            .map(|m| m.len())
            .ok(),
        Some(900_000)
    );
    assert!(!r.sb.work().join("other.bin").exists());
    r.assert_nothing_left();
}

/// A session cwd on a pseudo-filesystem is no tool root, as `/` is not: under `--cwd /proc`
/// `read_file("self/status")` read the supervisor's own /proc files.
#[test]
fn pseudo_filesystems_are_not_tool_roots() {
    require_strict!();
    let r = range();
    let planted = format!("vibeos-probe-{}", std::process::id());
    let mut cases = vec![
        (
            "/proc",
            json!({ "reads": ["self/status", "self/environ", "/proc/self/status", "1/cmdline"],
                    "writes": [], "searches": ["self"] }),
        ),
        (
            "/sys",
            json!({ "reads": ["kernel/uevent_seqnum", "devices/system/cpu/online"],
                    "writes": [], "searches": [] }),
        ),
        (
            "/dev",
            json!({ "reads": ["null"], "writes": [planted.clone()], "searches": [] }),
        ),
    ];
    if std::path::Path::new("/sys/fs/cgroup").is_dir() {
        cases.push((
            "/sys/fs/cgroup",
            json!({ "reads": ["cgroup.controllers", "memory/memory.limit_in_bytes"],
                    "writes": [], "searches": [] }),
        ));
    }
    for (cwd, params) in cases {
        let result = r.attack("tools_pseudo_roots", params, &["--cwd", cwd]);
        let output = result["output"].as_str().unwrap_or_default().to_string();
        let attempts = r.contained(&result);
        for a in &attempts {
            assert!(
                a["detail"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("outside what tools may"),
                "--cwd {cwd}: refused for another reason than no root: {a}\n{output}"
            );
        }
    }
    let planted = std::path::Path::new("/dev").join(&planted);
    let was_there = planted.exists();
    let _ = std::fs::remove_file(&planted);
    assert!(!was_there, "{} was made", planted.display());
}
