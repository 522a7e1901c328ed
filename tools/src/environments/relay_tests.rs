//! The relay end to end on this machine: the real relay program in a real Python child whose
//! stdin/stdout stand for a sandbox's streaming exec, real UNIX sockets on both sides.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use std::io::{Read, Write};
use std::process::Stdio;
use std::time::Duration;
use tokio::net::UnixListener;
use tokio::process::{Child, Command};

/// A host-side server that answers each line with `echo:<line>` and closes when the client does.
fn echo_server(path: &std::path::Path) {
    let listener = UnixListener::bind(path).unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (r, mut w) = s.into_split();
                let mut lines = tokio::io::BufReader::new(r);
                let mut line = String::new();
                use tokio::io::AsyncBufReadExt;
                while lines.read_line(&mut line).await.unwrap_or(0) > 0 {
                    w.write_all(format!("echo:{line}").as_bytes())
                        .await
                        .unwrap();
                    line.clear();
                }
            });
        }
    });
}

struct Sandbox {
    _dir: tempfile::TempDir,
    root: PathBuf,
    relay: Arc<Relay>,
    events: UnboundedReceiver<RelayEvent>,
    child: Child,
}

/// Starts the relay program as a child and wires it to a [`Relay`] over its stdio.
async fn start() -> Sandbox {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let host = root.join("host.sock");
    echo_server(&host);
    let argv = relay_argv("python3");
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (relay, out, mut events) = Relay::new(host, tokio::runtime::Handle::current());
    tokio::spawn(pump_reader(
        Arc::clone(&relay),
        child.stdout.take().unwrap(),
    ));
    tokio::spawn(pump_writer(out, child.stdin.take().unwrap()));
    relay.listen(&root.join("sb").join("rpc.sock").display().to_string());
    assert_eq!(next(&mut events).await, RelayEvent::Listening);
    Sandbox {
        _dir: dir,
        root,
        relay,
        events,
        child,
    }
}

async fn next(events: &mut UnboundedReceiver<RelayEvent>) -> RelayEvent {
    tokio::time::timeout(Duration::from_secs(20), events.recv())
        .await
        .expect("relay event in time")
        .expect("event channel open")
}

/// Collects output until the child exits.
async fn run_to_exit(events: &mut UnboundedReceiver<RelayEvent>) -> (String, String, i32) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    loop {
        match next(events).await {
            RelayEvent::Stdout(b) => out.extend(b),
            RelayEvent::Stderr(b) => err.extend(b),
            RelayEvent::Exited(code) => {
                return (
                    String::from_utf8_lossy(&out).into(),
                    String::from_utf8_lossy(&err).into(),
                    code,
                )
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn py(code: &str) -> Vec<String> {
    vec!["python3".into(), "-c".into(), code.into()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_output_and_exit_code_cross_the_relay() {
    let mut sb = start().await;
    let sock = sb.root.join("sb").join("rpc.sock");
    let mode = std::fs::metadata(sb.root.join("sb")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o700);
    // Two connections at once, one from a forked child, and a reply larger than one frame.
    let script = r#"
import os, socket, sys
path = sys.stdin.read().strip()
def ask(msg):
    s = socket.socket(socket.AF_UNIX); s.connect(path)
    s.sendall(msg.encode() + b"\n"); buf = b""
    while not buf.endswith(b"\n"):
        d = s.recv(1 << 20)
        if not d: break
        buf += d
    s.close(); return buf.decode()
a = socket.socket(socket.AF_UNIX); a.connect(path); a.sendall(b"first\n")
pid = os.fork()
if pid == 0:
    print(ask("from-child"), end="", flush=True); os._exit(0)
os.waitpid(pid, 0)
print(a.recv(100).decode(), end="")
big = ask("x" * 200000)
print(len(big), flush=True)
sys.stderr.write("to-stderr\n")
sys.exit(3)
"#;
    sb.relay
        .boot(&py(script), sock.display().to_string().as_bytes());
    let (out, err, code) = run_to_exit(&mut sb.events).await;
    assert_eq!(code, 3, "stdout {out:?} stderr {err:?}");
    assert_eq!(out, "echo:from-child\necho:first\n200006\n");
    assert_eq!(err, "to-stderr\n");
    // The relay removes its socket and exits by itself after the child.
    let status = tokio::time::timeout(Duration::from_secs(10), sb.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    assert!(!sock.exists());
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_frame_kills_the_whole_group_and_stdin_eof_kills_too() {
    let mut sb = start().await;
    let script = "import subprocess, sys, time\np = subprocess.Popen(['sleep', '300'])\nprint(p.pid, flush=True)\ntime.sleep(300)";
    sb.relay.boot(&py(script), b"");
    let RelayEvent::Stdout(pid) = next(&mut sb.events).await else {
        panic!("expected the grandchild's pid");
    };
    let pid: i32 = String::from_utf8_lossy(&pid).trim().parse().unwrap();
    assert!(alive(pid));
    sb.relay.signal("TERM");
    let (_, _, code) = run_to_exit(&mut sb.events).await;
    assert_eq!(code, -15);
    for _ in 0..100 {
        if !alive(pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!alive(pid), "the grandchild in the group died with it");

    // The host going away (stdin closed) kills a running child as well; this relay is driven
    // through the blocking pumps, as a backend with std pipes drives it.
    let dir = tempfile::tempdir().unwrap();
    let argv = relay_argv("python3");
    let mut relay = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (r, out, mut events) = Relay::new(
        dir.path().join("none.sock"),
        tokio::runtime::Handle::current(),
    );
    let stdout = relay.stdout.take().unwrap();
    let feeder = Arc::clone(&r);
    std::thread::spawn(move || pump_reader_blocking(feeder, stdout));
    let stdin = relay.stdin.take().unwrap();
    let writer = std::thread::spawn(move || pump_writer_blocking(out, stdin));
    r.boot(&py(script), b"");
    let RelayEvent::Stdout(pid) = next(&mut events).await else {
        panic!("expected the pid");
    };
    let pid: i32 = String::from_utf8_lossy(&pid).trim().parse().unwrap();
    r.close();
    writer.join().unwrap();
    let status = tokio::task::spawn_blocking(move || relay.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());
    for _ in 0..100 {
        if !alive(pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!alive(pid), "host gone: the relay killed the group");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_frame_spares_the_child_so_it_reaps_and_reports() {
    // The child stands for the bootstrap: it forks the "script" into its own group, and only
    // if it survives the host's KILL can it reap the script and report. It used to be killed
    // with the script (code -9), leaving what the script had started in other sessions.
    let mut sb = start().await;
    let leader = "import os, sys, time\npid = os.fork()\nif pid == 0:\n    time.sleep(300)\n    os._exit(0)\nprint(pid, flush=True)\n_, st = os.waitpid(pid, 0)\nprint('reaped', os.WTERMSIG(st), flush=True)\nsys.exit(7)";
    sb.relay.boot(&py(leader), b"");
    let RelayEvent::Stdout(pid) = next(&mut sb.events).await else {
        panic!("expected the script's pid");
    };
    let pid: i32 = String::from_utf8_lossy(&pid).trim().parse().unwrap();
    assert!(alive(pid));
    sb.relay.signal("KILL");
    let (out, _, code) = run_to_exit(&mut sb.events).await;
    assert!(out.contains("reaped 9"), "{out:?}");
    assert_eq!(code, 7, "the leader survived and exited by itself");
    assert!(!alive(pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_get_an_error_reply_on_both_sides() {
    let mut sb = start().await;
    // A boot frame without argv: the relay answers with an error frame, never silence.
    sb.relay.out.send(frame("B", 0, Some(b"{}"))).unwrap();
    match next(&mut sb.events).await {
        RelayEvent::Failed(m) => assert!(m.contains("relay in the sandbox: B frame"), "{m}"),
        other => panic!("unexpected {other:?}"),
    }
    // And the relay still works after it.
    sb.relay.boot(&py("print('ok')"), b"");
    let (out, _, code) = run_to_exit(&mut sb.events).await;
    assert_eq!((out.as_str(), code), ("ok\n", 0));

    // The host side refuses what is not a frame, and oversized lines.
    let (relay, _out, mut events) = Relay::new(
        PathBuf::from("/nonexistent"),
        tokio::runtime::Handle::current(),
    );
    relay.feed(b"Q 0\nX zero\n");
    for _ in 0..2 {
        assert!(matches!(next(&mut events).await, RelayEvent::Failed(_)));
    }
    relay.feed(&vec![b'A'; MAX_FRAME + 1]);
    match next(&mut events).await {
        RelayEvent::Failed(m) => assert!(m.contains("frame limit"), "{m}"),
        other => panic!("unexpected {other:?}"),
    }
    relay.stream_ended();
    assert!(matches!(next(&mut events).await, RelayEvent::Failed(_)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_spawn_behaves_like_a_plain_one() {
    // The adapter over a real environment's streaming spawn (local here): stdin becomes the
    // child's input, stdout/stderr/exit code come back, a kill reaches the child's group.
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host.sock");
    echo_server(&host);
    let env = crate::environments::local_env::LocalEnv::new(&Default::default());
    let remote = dir.path().join("sb").join("rpc.sock").display().to_string();
    let script = "import socket, sys\nline = sys.stdin.read()\ns = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\ns.sendall(line.encode()); print(s.recv(100).decode(), end='')\nsys.stderr.write('e\\n'); sys.exit(4)";
    let spec = ExecSpec::new(["python3", "-c", script, &remote]);
    let (h, r) = (host.clone(), remote.clone());
    let spawned = tokio::task::spawn_blocking(move || spawn_relayed(&env, &spec, h, &r))
        .await
        .unwrap()
        .unwrap();
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        let Spawned {
            stdin,
            stdout,
            stderr,
            process,
        } = spawned;
        let mut stdin = stdin.unwrap();
        stdin.write_all(b"ping\n").unwrap();
        drop(stdin);
        let (mut out, mut err) = (String::new(), String::new());
        stdout.unwrap().read_to_string(&mut out).unwrap();
        stderr.unwrap().read_to_string(&mut err).unwrap();
        (process.wait().unwrap(), out, err)
    })
    .await
    .unwrap();
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (4, "echo:ping\n", "e\n")
    );

    let env = crate::environments::local_env::LocalEnv::new(&Default::default());
    let spec = ExecSpec::new([
        "python3",
        "-c",
        "import time; print('up', flush=True); time.sleep(300)",
    ]);
    let r = remote.clone();
    let code = tokio::task::spawn_blocking(move || {
        let spawned = spawn_relayed(&env, &spec, host, &r).unwrap();
        drop(spawned.stdin);
        let mut out = spawned.stdout.unwrap();
        let mut buf = [0u8; 3];
        out.read_exact(&mut buf).unwrap();
        spawned.process.kill(GroupSignal::Term).unwrap();
        spawned.process.wait().unwrap()
    })
    .await
    .unwrap();
    assert_eq!(code, -15);
}

#[test]
fn the_host_side_socket_dir_is_private() {
    use std::os::unix::fs::PermissionsExt;
    // 0700 whatever the umask (the usual 022 gave 0755: tempfile's default follows it). The
    // umask is not changed here: it is the whole test process's.
    let channel = channel("daytona", "0123456789abcdef").unwrap();
    let super::super::Connections::Bind(socket) = &channel.connections else {
        panic!("a relayed channel binds a socket on the host");
    };
    let dir = socket.parent().unwrap();
    let mode = std::fs::metadata(dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}", dir.display());
}

/// A script that writes garbage into its relay's stdout (the sandbox is the script's to write)
/// gets a few lines said about it, not one per bad frame: they flooded the host's stderr and
/// rotated agent.log's earlier lines away. A newline in a message stays escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_from_the_sandbox_are_said_a_few_times_not_each_time() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host.sock");
    echo_server(&host);
    let env = crate::environments::local_env::LocalEnv::new(&Default::default());
    let remote = dir.path().join("sb").join("rpc.sock").display().to_string();
    let script = "import os, base64, sys\n\
                  fd = os.open('/proc/%d/fd/1' % os.getppid(), os.O_WRONLY)\n\
                  os.write(fd, b'E 0 ' + base64.b64encode(b'one\\ninjected') + b'\\n')\n\
                  os.write(fd, b'garbage line\\n' * 5000)\n\
                  sys.exit(3)";
    let spec = ExecSpec::new(["python3", "-c", script]);
    let r = remote.clone();
    let (code, err) = tokio::task::spawn_blocking(move || {
        let Spawned {
            stdin,
            stdout,
            stderr,
            process,
        } = spawn_relayed(&env, &spec, host, &r).unwrap();
        drop(stdin);
        // Both at once: a flood on one must not stall the other.
        let mut stderr = stderr.unwrap();
        let err = std::thread::spawn(move || {
            let mut err = String::new();
            stderr.read_to_string(&mut err).unwrap();
            err
        });
        let mut out = String::new();
        stdout.unwrap().read_to_string(&mut out).unwrap();
        (process.wait().unwrap(), err.join().unwrap())
    })
    .await
    .unwrap();
    assert_eq!(code, 3, "{err}");
    let said = err
        .lines()
        .filter(|l| l.starts_with("vibeos-exec: "))
        .count();
    assert!(said <= SHOWN_FAILURES + 1, "{said} lines: {err}");
    assert!(err.contains("only the first 10 are shown"), "{err}");
    assert!(
        err.contains("one\\ninjected"),
        "the newline is escaped: {err}"
    );
    assert!(!err.lines().any(|l| l == "injected"), "{err}");
}
