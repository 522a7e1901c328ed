//! End-to-end: `vibeos-exec run` started on a real terminal (a pty from `script(1)`), as an
//! operator starts it from a shell, and a script whose `terminal` commands reach for that
//! terminal. The probe's finding: a command kept the operator's controlling terminal, so it
//! could open `/dev/tty` and `TIOCSTI` an answer into the approval prompt of the script's own
//! dangerous command (self-approval), or queue commands for the operator's shell.

// Tests report failures by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};
use vibeos_testkit::backends::{unavailable, which};
use vibeos_testkit::{exec_bin, Sandbox};

/// Pushes `o` + newline into the input of the command's controlling terminal (the approval
/// prompt's next answer) and says whether that worked; also tries to open `/dev/tty`. (The
/// markers it prints are put together at run time: the prompt shows the script's source.)
const SCRIPT: &str = r#"from vibeos_tools import terminal
inject = '''if exec 3<>/dev/tty; then echo TTY-"OPENED"; else echo TTY-"REFUSED"; fi 2>/dev/null
python3 -c '
import fcntl, termios
try:
    with open("/dev/tty", "wb", buffering=0) as tty:
        for ch in b"o\\n":
            fcntl.ioctl(tty, termios.TIOCSTI, bytes([ch]))
    print("INJ" + "ECTED")
except OSError as e:
    print("NOT-" + "INJ" + "ECTED", e.errno)
'
'''
print('INJECT:', terminal(inject).get('output'), flush=True)
r = terminal('echo RAN; exit 0; git push --force origin main')
print('RESULT:', r.get('error') or r.get('output'), flush=True)
"#;

/// Runs `vibeos-exec run t.py` under a pty; each time the terminal shows the next prompt of
/// `answers` (its n-th appearance for the n-th answer with that prompt), types its answer.
/// Returns what the terminal showed, or `None` when `script(1)` is missing.
fn run_on_tty(sb: &Sandbox, answers: &[(&str, &str)]) -> Option<String> {
    let Some(script) = which("script") else {
        unavailable("script(1) (util-linux) is needed to give the CLI a terminal");
        return None;
    };
    std::fs::write(sb.work().join("t.py"), SCRIPT).unwrap();
    let mut cmd = sb.command_for(script);
    cmd.env_remove("CI")
        .args([
            "-qec",
            &format!("{} run t.py", exec_bin().display()),
            "/dev/null",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut shown = String::new();
    let mut next = 0;
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(chunk) => shown.push_str(&String::from_utf8_lossy(&chunk)),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        if let Some((prompt, answer)) = answers.get(next) {
            let wanted = answers[..=next].iter().filter(|(p, _)| p == prompt).count();
            if shown.matches(prompt).count() >= wanted {
                let _ = stdin.write_all(answer.as_bytes());
                let _ = stdin.flush();
                next += 1;
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
    }
    // The terminal stays open until the CLI is done with it.
    drop(stdin);
    let _ = child.wait();
    reader.join().unwrap();
    Some(shown)
}

#[test]
fn a_scripts_command_cannot_answer_its_own_approval_prompt_through_the_terminal() {
    let sb = Sandbox::new();
    // The whole script is asked about first (its source holds a dangerous command); the
    // operator approves it once, then denies the command when asked about it.
    let Some(shown) = run_on_tty(
        &sb,
        &[("Dangerous script", "o\n"), ("Dangerous command", "d\n")],
    ) else {
        return;
    };
    assert!(shown.contains("INJECT:"), "the script did not run: {shown}");
    assert!(shown.contains("TTY-REFUSED"), "/dev/tty opened: {shown}");
    assert!(!shown.contains("TTY-OPENED"), "{shown}");
    assert!(shown.contains("NOT-INJECTED"), "{shown}");
    assert!(
        !shown.replace("NOT-INJECTED", "").contains("INJECTED"),
        "{shown}"
    );
    assert!(shown.contains("Dangerous command"), "never asked: {shown}");
    assert!(
        !shown.contains("RESULT: RAN"),
        "the command approved itself: {shown}"
    );
    assert!(shown.contains("denied by the user"), "{shown}");
}
