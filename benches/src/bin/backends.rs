//! Execution backends, each against its baseline measured in the same run:
//! - docker: `execute_code("pass")` on a warm container vs `docker exec C python3 -c pass`
//!   (target ≤ 1.5×); a `read_file` tool call from a script inside vs the same call in local
//!   mode (target ≤ 2×);
//! - ssh: `execute_code("pass")` vs `ssh -S MASTER host python3 -c pass` (target ≤ 1.5×); a
//!   tool call vs a JSON echo round trip over a socket forwarded the same way (target ≤ 1.5×).
//!
//! It starts its own dockerd and sshd (as the tests do) and uses the release vibeos-exec as the
//! tool agent. Run: `cargo build --release --bins && cargo run --release -p vibeos-benches
//! --bin backends` (options: `--runs N`, default 20).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Instant;
use vibeos_benches::sandbox::{read_file_per_call, request, timed};
use vibeos_benches::{median, ms, release_bin, runs_arg, verdict};
use vibeos_testkit::backends::{start_sshd, Dockerd, SSH_USER};
use vibeos_tools::environments::{self, settings::KnownHosts, BackendKind, BackendSettings};

const CALLS: usize = 200;

fn exec(rt: &tokio::runtime::Runtime, code: &str) -> (f64, String) {
    timed(rt, request(code))
}

fn time_cmd(cmd: &mut Command) -> f64 {
    let t = Instant::now();
    let st = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "{cmd:?}");
    t.elapsed().as_secs_f64()
}

/// Seconds per `read_file` call from a script (median of 5 samples of `CALLS` calls).
fn per_call(rt: &tokio::runtime::Runtime, path: &str) -> f64 {
    read_file_per_call(rt, path, 10, CALLS, 5)
}

fn main() {
    let runs = runs_arg(20);
    let agent = release_bin();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();

    // Local tool-call baseline.
    let local_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(local_file.path(), "x\n").unwrap();
    let local_path = local_file.path().display().to_string();
    environments::activate(BackendSettings::default());
    let local_call = per_call(&rt, &local_path);

    // docker
    let daemon = Dockerd::with_python_image("vibeos-py:bench").expect("dockerd with the image");
    std::env::set_var("DOCKER_HOST", &daemon.host);
    environments::activate(BackendSettings {
        backend: BackendKind::Docker,
        docker_image: Some("vibeos-py:bench".into()),
        agent_binary: Some(agent.clone()),
        ..BackendSettings::default()
    });
    exec(&rt, "pass");
    let container = daemon.labelled().pop().expect("the warm container");
    let (mut base, mut ours) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        base.push(time_cmd(
            Command::new("docker").args(["exec", &container, "python3", "-c", "pass"]),
        ));
        ours.push(exec(&rt, "pass").0);
    }
    exec(&rt, "open('/root/bench.txt', 'w').write('x\\n')");
    let docker_call = per_call(&rt, "/root/bench.txt");
    environments::shutdown();
    drop(daemon);
    let (b, o) = (median(base), median(ours));
    println!("docker ({runs} runs, medians):");
    println!("  docker exec C python3 -c pass           {}", ms(b));
    println!("  execute_code(\"pass\"), warm container    {}", ms(o));
    println!(
        "  ratio {:.2} (target ≤ 1.5) {}",
        o / b,
        verdict(o / b, 1.5)
    );
    println!(
        "  read_file from a script, local          {}",
        ms(local_call)
    );
    println!(
        "  read_file from a script, in docker      {}",
        ms(docker_call)
    );
    let r = docker_call / local_call;
    println!("  ratio {r:.2} (target ≤ 2) {}", verdict(r, 2.0));

    // ssh
    let sshd = start_sshd().expect("sshd");
    let d = sshd.dir.path();
    let settings = BackendSettings {
        backend: BackendKind::Ssh,
        ssh_host: Some("127.0.0.1".into()),
        ssh_port: Some(sshd.port),
        ssh_user: Some(SSH_USER.into()),
        ssh_key: Some(d.join("userkey")),
        ssh_known_hosts: KnownHosts::File(d.join("known_hosts")),
        agent_binary: Some(agent),
        ..BackendSettings::default()
    };
    environments::activate(settings);
    exec(&rt, "pass");
    let master = d.join("bench-master");
    let ssh = |extra: &[&str]| {
        let mut c = Command::new("ssh");
        c.args(["-o", "BatchMode=yes", "-o"])
            .arg(format!(
                "UserKnownHostsFile={}",
                d.join("known_hosts").display()
            ))
            .arg("-i")
            .arg(d.join("userkey"))
            .args(["-p", &sshd.port.to_string(), "-l", SSH_USER, "-S"])
            .arg(&master)
            .args(extra);
        c
    };
    assert!(ssh(&[
        "-o",
        "ControlMaster=yes",
        "-o",
        "ControlPersist=yes",
        "-fN",
        "127.0.0.1"
    ])
    .status()
    .unwrap()
    .success());
    let (mut base, mut ours) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        base.push(time_cmd(&mut ssh(&["127.0.0.1", "python3 -c pass"])));
        ours.push(exec(&rt, "pass").0);
    }
    let home = d.join("home");
    exec(&rt, "open('bench.txt', 'w').write('x\\n')");
    let ssh_call = per_call(&rt, &home.join("bench.txt").display().to_string());
    // JSON echo over a socket forwarded the same way (-R remote.sock:local.sock on a master).
    let sock_dir = tempfile::tempdir().unwrap();
    let local_sock = sock_dir.path().join("echo.sock");
    let listener = std::os::unix::net::UnixListener::bind(&local_sock).unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            std::thread::spawn(move || {
                let mut w = conn.try_clone().unwrap();
                for line in BufReader::new(conn).lines() {
                    let Ok(line) = line else { return };
                    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                    let reply = serde_json::json!({"id": v["id"], "result": v["args"]});
                    if writeln!(w, "{reply}").is_err() {
                        return;
                    }
                }
            });
        }
    });
    let remote_sock = format!("{}/echo-{}.sock", home.display(), std::process::id());
    assert!(ssh(&[
        "-O",
        "forward",
        "-R",
        &format!("{remote_sock}:{}", local_sock.display()),
        "127.0.0.1"
    ])
    .status()
    .unwrap()
    .success());
    let client = format!(
        "import json, socket, time\ns = socket.socket(socket.AF_UNIX)\ns.connect('{remote_sock}')\nf = s.makefile('rwb')\n\
         def rt(i):\n    f.write((json.dumps({{'id': i, 'tool': 'read_file', 'args': {{'path': 'x'}}}}) + '\\n').encode()); f.flush(); json.loads(f.readline())\n\
         for i in range(10): rt(i)\nt = time.perf_counter()\nfor i in range({CALLS}): rt(i)\nprint((time.perf_counter() - t) / {CALLS})"
    );
    let echo = median(
        (0..5)
            .map(|_| {
                let out = ssh(&[
                    "127.0.0.1",
                    &format!("python3 -c \"{}\"", client.replace('"', "\\\"")),
                ])
                .output()
                .unwrap();
                String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse::<f64>()
                    .unwrap_or_else(|_| {
                        panic!(
                            "echo client failed: {}",
                            String::from_utf8_lossy(&out.stderr)
                        )
                    })
            })
            .collect(),
    );
    let _ = ssh(&["-O", "exit", "127.0.0.1"]).output();
    environments::shutdown();
    let (b, o) = (median(base), median(ours));
    println!("ssh ({runs} runs, medians):");
    println!("  ssh -S MASTER host python3 -c pass      {}", ms(b));
    println!("  execute_code(\"pass\") over ssh           {}", ms(o));
    println!(
        "  ratio {:.2} (target ≤ 1.5) {}",
        o / b,
        verdict(o / b, 1.5)
    );
    println!("  JSON echo over a forwarded socket       {}", ms(echo));
    println!("  read_file from a script over ssh        {}", ms(ssh_call));
    let r = ssh_call / echo;
    println!("  ratio {r:.2} (target ≤ 1.5) {}", verdict(r, 1.5));
    drop(sshd);
}
