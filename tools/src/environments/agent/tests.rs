//! Unit tests of the in-environment agent.

use super::*;
use std::io::Read;
use std::os::unix::net::UnixStream;

/// A listening agent on `sock` with the token `token`, on a thread, once it said `ready`: its
/// lifeline (drop it to end the agent) and the thread, which returns what `serve` did.
fn listening_agent(
    sock: &std::path::Path,
    token: &str,
) -> (
    std::io::PipeWriter,
    std::thread::JoinHandle<Result<(), String>>,
) {
    let (stdin_r, mut stdin_w) = std::io::pipe().unwrap();
    let (out_r, out_w) = std::io::pipe().unwrap();
    writeln!(stdin_w, "{token}").unwrap();
    let path = sock.to_path_buf();
    let agent = std::thread::spawn(move || {
        serve(
            crate::registry(),
            BufReader::new(stdin_r),
            out_w,
            Some(&path),
        )
    });
    let mut ready = String::new();
    BufReader::new(out_r).read_line(&mut ready).unwrap();
    assert_eq!(ready.trim(), "ready");
    (stdin_w, agent)
}

#[test]
fn listening_agent_answers_only_token_holders_and_exits_with_its_lifeline() {
    // `serve` ends every background process of this test process when it returns.
    let _turn = crate::environments::background::tests::BACKGROUND_REGISTRY
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let file = dir.path().join("f.txt");
    std::fs::write(&file, "agent side\n").unwrap();
    let token = "t".repeat(64);
    let (stdin_w, agent) = listening_agent(&sock, &token);

    // A wrong token: the connection is closed without an answer. The agent may
    // close it before the request is written, so a broken pipe there is the
    // refusal too; what matters is that no answer comes back.
    let mut bad = UnixStream::connect(&sock).unwrap();
    let attempt = format!(
        "{}\n{}\n",
        "x".repeat(64),
        json!({"id": 1, "tool": "read_file", "args": {"path": file}})
    );
    if let Err(e) = bad.write_all(attempt.as_bytes()) {
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ),
            "{e}"
        );
    }
    let mut buf = String::new();
    assert_eq!(bad.read_to_string(&mut buf).unwrap_or(0), 0, "{buf}");

    // The right token: the real read_file answers.
    let good = UnixStream::connect(&sock).unwrap();
    let mut w = good.try_clone().unwrap();
    writeln!(w, "{token}").unwrap();
    writeln!(
        w,
        "{}",
        json!({"id": 7, "tool": "read_file", "args": {"path": file}, "cwd": "/"})
    )
    .unwrap();
    let mut line = String::new();
    BufReader::new(good).read_line(&mut line).unwrap();
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["id"], 7);
    assert!(
        v["ok"]["content"].as_str().unwrap().contains("agent side"),
        "{v}"
    );

    // Closing its stdin ends it and removes the socket.
    drop(stdin_w);
    agent.join().unwrap().unwrap();
    assert!(!sock.exists());
}

/// An agent whose lifeline ends after the next agent took over its socket path (an ssh
/// master lost and reconnected at once: the old remote agent hears of it last) leaves the
/// new socket alone. It removed the path unconditionally, and the new agent's forward then
/// led nowhere ("master not reconnected", stop 55's flaky ssh test).
#[test]
fn an_ending_agent_leaves_a_newer_agents_socket_in_place() {
    let _turn = crate::environments::background::tests::BACKGROUND_REGISTRY
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let (stdin_w, agent) = listening_agent(&sock, &"t".repeat(64));

    // The newer agent binds the same path, as `serve` does: the old file removed first.
    std::fs::remove_file(&sock).unwrap();
    let newer = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    drop(stdin_w);
    agent.join().unwrap().unwrap();
    assert!(sock.exists(), "the newer agent's socket was removed");
    UnixStream::connect(&sock).expect("the newer agent is reachable at its path");
    drop(newer);
}
