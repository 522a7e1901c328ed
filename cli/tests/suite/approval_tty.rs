//! End-to-end: the interactive CLI's approval prompt on a real terminal (a pty from
//! `script(1)`). A script approved "once" at the whole-script guard has its dangerous command
//! asked about again at the terminal — as the Python and MCP hosts do — instead of being denied
//! as non-interactive in the session that just answered; and only a "deny" typed there is
//! reported as the user's denial (end of input says so). The command is behind `exit 0; `, so
//! nothing dangerous runs even when approved.

// Tests report failures by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;
use vibeos_testkit::backends::{unavailable, which};
use vibeos_testkit::{exec_bin, Sandbox};

const SCRIPT: &str = "from vibeos_tools import terminal\n\
r = terminal('echo RAN; exit 0; git push --force origin main')\n\
print('RESULT:', r.get('error') or r.get('output'))\n";

/// Runs the script under a pty, typing `answers` (each after a pause, so each meets its
/// prompt), and returns what the terminal showed.
fn run_on_tty(sb: &Sandbox, answers: &'static [&'static str]) -> String {
    let Some(script) = which("script") else {
        unavailable("script(1) (util-linux) is needed to give the CLI a terminal");
        return String::new();
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
    let typist = std::thread::spawn(move || {
        for a in answers {
            std::thread::sleep(Duration::from_millis(1500));
            let _ = stdin.write_all(a.as_bytes());
            let _ = stdin.flush();
        }
        // Keep the terminal open until the CLI is done with it.
        std::thread::sleep(Duration::from_secs(3));
    });
    let out = child.wait_with_output().unwrap();
    typist.join().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_script_approved_once_has_its_command_asked_at_the_terminal() {
    let sb = Sandbox::new();
    let shown = run_on_tty(&sb, &["o\n", "o\n"]);
    if shown.is_empty() {
        return;
    }
    assert!(shown.contains("Dangerous script"), "{shown}");
    assert!(shown.contains("Dangerous command"), "{shown}");
    assert!(shown.contains("RESULT: RAN"), "{shown}");
    assert!(!shown.contains("non-interactive"), "{shown}");

    let shown = run_on_tty(&sb, &["o\n", "d\n"]);
    assert!(shown.contains("denied by the user"), "{shown}");

    // End of input at the second prompt: no answer, and the message says so.
    let shown = run_on_tty(&sb, &["o\n", "\u{4}"]);
    assert!(
        shown.contains("no answer could be read from the terminal"),
        "{shown}"
    );
    assert!(!shown.contains("denied by the user"), "{shown}");
}
