//! `terminal` commands and the terminal of whoever started the host: a command must not reach
//! it. The host here is a child of the test (this test binary, re-run) that has a real pseudo-
//! terminal as its controlling terminal, as `vibeos-exec run` has when an operator starts it
//! from a shell; its commands try to open `/dev/tty` and to push input into it with `TIOCSTI`.

// A test harness: a panic here is how a failed expectation is reported.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{json, Value};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::time::Duration;
use vibeos_tools::{registry, CallOrigin, ToolContext};

fn call(name: &str, args: Value, ctx: &ToolContext) -> Value {
    serde_json::from_str(&registry().handle_function_call(name, &args, ctx)).unwrap()
}

/// Set in the child of the test below, which then has a controlling terminal.
const TTY_CHILD: &str = "VIBEOS_TEST_TTY_CHILD";

/// What a command does to reach its caller's terminal: open `/dev/tty`, then `TIOCSTI` a
/// command line into whatever terminal it could reach (`/dev/tty`, then its stdio). Prints
/// `OPENED` / `REFUSED <errno>` and `INJECTED` / `NOT-INJECTED`.
const REACH_FOR_THE_TTY: &str = r#"if exec 3<>/dev/tty; then echo OPENED; else echo REFUSED; fi 2>/dev/null
python3 - <<'EOF'
import errno, fcntl, os, termios
fds = []
try:
    fds.append(os.open("/dev/tty", os.O_RDWR))
except OSError as e:
    print("TTY-OPEN", errno.errorcode.get(e.errno, e.errno))
injected = False
for fd in fds + [0, 1, 2]:
    try:
        for ch in b"echo pwned\n":
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([ch]))
        injected = True
    except OSError:
        pass
print("INJECTED" if injected else "NOT-INJECTED")
EOF"#;

/// Bytes waiting in the input queue of this process's controlling terminal.
fn queued_on_own_tty() -> i32 {
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .expect("the test's host has a controlling terminal");
    let mut queued: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which points at a live local.
    let rc = unsafe { libc::ioctl(tty.as_raw_fd(), libc::FIONREAD as _, &mut queued) };
    assert_eq!(rc, 0, "FIONREAD: {}", std::io::Error::last_os_error());
    queued
}

/// In the child: every way a command can run (agent foreground and background, a script's
/// foreground) and what it reached.
fn child_checks() {
    let dir = tempfile::tempdir().unwrap();
    // The setup works: this process has a terminal a command could have reached.
    assert_eq!(queued_on_own_tty(), 0);
    let python = which_python();
    let agent = ToolContext::agent(dir.path());
    let mut script = ToolContext::agent(dir.path());
    script.origin = CallOrigin::Script;
    script.env = Some(std::sync::Arc::new(
        std::env::vars()
            .filter(|(k, _)| k == "PATH" || k == "HOME")
            .collect(),
    ));
    for (how, ctx) in [("agent", &agent), ("script", &script)] {
        let r = call("terminal", json!({"command": REACH_FOR_THE_TTY}), ctx);
        let out = r["output"].as_str().unwrap_or_default();
        assert!(out.contains("REFUSED"), "{how}: /dev/tty opened: {r}");
        assert!(!out.contains("OPENED"), "{how}: {r}");
        if python {
            assert!(out.contains("TTY-OPEN ENXIO"), "{how}: {r}");
            assert!(out.contains("NOT-INJECTED"), "{how}: {r}");
        }
    }
    let r = call(
        "terminal",
        json!({"command": REACH_FOR_THE_TTY, "background": true}),
        &agent,
    );
    let id = r["process_id"].as_str().unwrap().to_string();
    let r = call(
        "process",
        json!({"action": "wait", "process_id": id, "timeout": 60}),
        &agent,
    );
    let out = r["output"].as_str().unwrap_or_default();
    assert!(out.contains("REFUSED") && !out.contains("OPENED"), "{r}");
    if python {
        assert!(out.contains("NOT-INJECTED"), "background: {r}");
    }
    // Nothing reached this terminal's input, which the operator's shell would read next.
    assert_eq!(queued_on_own_tty(), 0, "input was pushed into the terminal");
    // PTY mode: the command's terminal is its own PTY, not this one.
    let ours = std::env::var(TTY_CHILD).unwrap();
    let r = call(
        "terminal",
        json!({"command": "exec 3<>/dev/tty && echo OPENED; tty", "pty": true, "timeout": 30}),
        &agent,
    );
    let out = r["output"].as_str().unwrap_or_default();
    assert!(out.contains("OPENED\n/dev/pts/"), "{r}");
    assert!(!out.contains(&format!("{ours}\n")), "{ours}: {r}");
}

fn which_python() -> bool {
    std::process::Command::new("python3")
        .args(["-c", "import termios; termios.TIOCSTI"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_command_cannot_reach_the_hosts_controlling_terminal() {
    // The probe's finding: commands kept the terminal of the shell that started the host.
    // `exec 3<>/dev/tty` worked, and TIOCSTI through it queued input for the operator's shell
    // (or for the host's own approval prompt: a script approving its own command).
    let test = vibeos_testkit::current_test();
    if std::env::var_os(TTY_CHILD).is_some() {
        child_checks();
        return;
    }
    let pty = nix::pty::openpty(None, None).unwrap();
    // Neither end may pass to the child as a descriptor: it gets the terminal only as its
    // controlling terminal, as a host started from a shell has it (whose stdio a command
    // never inherits).
    for fd in [&pty.master, &pty.slave] {
        nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .unwrap();
    }
    let slave = pty.slave.as_raw_fd();
    let name = std::fs::read_link(format!("/proc/self/fd/{slave}")).unwrap();
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(TTY_CHILD, &name)
        .stdin(std::process::Stdio::null());
    // SAFETY: between fork and exec the closure calls only setsid(2) and ioctl(2), which are
    // async-signal-safe, on a descriptor the parent holds open until the spawn returns. The
    // child becomes a session leader and takes the PTY as its controlling terminal, which it
    // keeps after the descriptor closes at its exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 || libc::ioctl(slave, libc::TIOCSCTTY as _, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_with_deadline(child, Duration::from_secs(180));
    drop(pty);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("test {test} ... ok")),
        "the child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn wait_with_deadline(child: std::process::Child, limit: Duration) -> std::process::Output {
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: kill has no memory preconditions; the child is ours and hung.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the child hung (a command waiting on the terminal?)");
        }
    }
}
