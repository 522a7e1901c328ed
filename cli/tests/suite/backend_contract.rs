//! The `Environment` contract, checked the same way against every backend that runs here:
//! `local`, `docker` (a private dockerd and the python3 image built from Debian packages) and
//! `ssh` (an sshd on 127.0.0.1 with a non-root user), `daytona` (the stand-in of
//! tests/standins/, its sandboxes real containers). exec with argv, cwd, env and stdin; exit
//! codes; a timeout that kills the whole process group over there (checked in that side's
//! /proc); a streaming spawn whose kill reaches the group; upload and download of bytes and
//! host files; clear errors for an empty argv and a missing file. A new backend (Modal,
//! Daytona, Singularity) adds one call of [`contract`].
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::common::{backend, processes_in, ssh_backend};
use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};
use vibeos_testkit::backends::{unavailable, Dockerd};
use vibeos_testkit::daytona::DaytonaLab;
use vibeos_tools::environments::{
    self, BackendKind, BackendSettings, EnvError, Environment, ExecSpec, GroupSignal,
};

/// Whether a process whose argv is exactly `argv` runs on the environment's side.
fn running(env: &dyn Environment, argv: &[&str]) -> bool {
    let needle = argv.join(" ");
    processes_in(env).contains(&needle)
}

fn wait_gone(env: &dyn Environment, argv: &[&str]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while running(env, argv) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    true
}

/// Everything a backend must do, in one pass. `scratch` is a writable dir over there.
fn contract(env: &dyn Environment, scratch: &str) {
    let name = env.backend();
    // local and ssh share this machine's /proc and run in parallel: markers per backend.
    let m = |n: usize| (n + 100 * name.len()).to_string();
    let (m16, m17, m18, m19) = (m(3016), m(3017), m(3018), m(3019));
    // exec: argv (quoting survives), cwd, env on top of the backend's own, stdin.
    let out = env
        .exec(
            &ExecSpec::new([
                "sh",
                "-c",
                "pwd; printf '%s|%s\\n' \"$MARK\" \"$1\"; cat; test -n \"$PATH\"",
                "sh",
                "it's \"quoted\" $HOME",
            ])
            .cwd(scratch)
            .env("MARK", "a b'c"),
            b"from stdin\n",
            Duration::from_secs(60),
        )
        .unwrap();
    assert!(out.success(), "{name}: {out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{scratch}\na b'c|it's \"quoted\" $HOME\nfrom stdin\n"),
        "{name}"
    );
    // Exit codes and stderr come back.
    let out = env
        .exec(
            &ExecSpec::new(["sh", "-c", "echo oops >&2; exit 7"]),
            b"",
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(out.code, Some(7), "{name}");
    assert_eq!(out.stderr_text(), "oops", "{name}");

    // A timeout kills the whole group over there, including what the command started.
    let started = Instant::now();
    let err = env
        .exec(
            &ExecSpec::new([
                "sh".to_string(),
                "-c".into(),
                format!("sleep {m17} & sleep {m16}; wait"),
            ]),
            b"",
            Duration::from_secs(2),
        )
        .unwrap_err();
    assert!(matches!(err, EnvError::Timeout { .. }), "{name}: {err}");
    assert!(started.elapsed() < Duration::from_secs(20), "{name}");
    assert!(wait_gone(env, &["sleep", &m17]), "{name}: orphan survived");
    assert!(wait_gone(env, &["sleep", &m16]), "{name}: command survived");

    // A streaming spawn: stdin and stdout are live streams, and kill reaches the group.
    let mut spawned = env
        .spawn(&ExecSpec::new([
            "sh",
            "-c",
            &format!("read l; echo got:$l; sleep {m18} & sleep {m19}"),
        ]))
        .unwrap();
    let mut stdin = spawned.stdin.take().unwrap();
    stdin.write_all(b"ping\n").unwrap();
    stdin.flush().unwrap();
    let mut line = String::new();
    BufReader::new(spawned.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "got:ping\n", "{name}");
    assert_eq!(spawned.process.try_wait().unwrap(), None, "{name}");
    // Started in the background a moment ago: allow it time to exec under load.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !running(env, &["sleep", &m18]) {
        assert!(
            Instant::now() < deadline,
            "{name}: background sleep never ran"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    spawned.process.kill(GroupSignal::Term).unwrap();
    let code = spawned.process.wait().unwrap();
    assert_ne!(code, 0, "{name}: killed, not a clean exit");
    assert!(wait_gone(env, &["sleep", &m18]), "{name}: orphan survived");
    assert!(wait_gone(env, &["sleep", &m19]), "{name}: command survived");

    // upload / download: arbitrary bytes, permission bits, host files both ways.
    let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let path = format!("{scratch}/vibeos-contract.bin");
    env.upload(&data, &path, 0o640).unwrap();
    assert_eq!(env.download(&path).unwrap(), data, "{name}");
    let out = env
        .exec(
            &ExecSpec::new(["stat", "-c", "%a", &path]),
            b"",
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "640", "{name}");
    let host = tempfile::tempdir().unwrap();
    let src = host.path().join("src.txt");
    std::fs::write(&src, "host file\n").unwrap();
    let remote = format!("{scratch}/vibeos-contract.txt");
    env.upload_file(&src, &remote).unwrap();
    let back = host.path().join("back.txt");
    env.download_file(&remote, &back).unwrap();
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "host file\n");
    let err = env
        .download(&format!("{scratch}/no-such-file"))
        .unwrap_err();
    assert!(err.to_string().contains("no-such-file"), "{name}: {err}");

    // What no backend can run is refused with a reason, not started.
    let err = env.spawn(&ExecSpec::default()).err().unwrap();
    assert!(err.to_string().contains("argv is empty"), "{name}: {err}");
}

#[test]
fn local_environment_contract() {
    let dir = tempfile::tempdir().unwrap();
    let settings = BackendSettings {
        cwd: Some(dir.path().display().to_string()),
        ..BackendSettings::default()
    };
    let env = environments::start(&settings, "contract").unwrap();
    assert_eq!(env.backend(), "local");
    contract(env.as_ref(), &dir.path().display().to_string());
    env.stop();
}

#[test]
fn ssh_environment_contract() {
    // Every sshd the suite starts points the one test user's home at its own dir: take turns.
    let Some((_ssh, sshd)) = super::ssh_turn(false) else {
        return;
    };
    let env = environments::start(&ssh_backend(&sshd, sshd.port), "contract").unwrap();
    assert_eq!(env.backend(), "ssh");
    let scratch = env.workdir();
    contract(env.as_ref(), &scratch);
    env.stop();
}

#[test]
fn docker_environment_contract() {
    let (daemon, cli) = match Dockerd::with_image("vibeos-py:contract") {
        Ok(d) => d,
        Err(e) => return unavailable(&e),
    };
    let settings = BackendSettings {
        docker_image: Some("vibeos-py:contract".into()),
        docker_binary: cli,
        ..backend(BackendKind::Docker)
    };
    let env = environments::start(&settings, "contract").unwrap();
    assert_eq!(env.backend(), "docker");
    contract(env.as_ref(), "/tmp");
    env.stop();
    assert!(daemon.labelled().is_empty(), "the container was removed");
}

#[test]
fn daytona_environment_contract() {
    // It exports the stand-in's credentials, which are process-wide.
    if super::common::in_own_process() {
        return;
    }
    let lab = match DaytonaLab::start("vibeos-py:contract") {
        Ok(l) => l,
        Err(e) => return unavailable(&e),
    };
    let _endpoint = lab.standin.export();
    let settings = BackendSettings {
        daytona_image: Some("vibeos-py:contract".into()),
        ..backend(BackendKind::Daytona)
    };
    let env = environments::start(&settings, "contract").unwrap();
    assert_eq!(env.backend(), "daytona");
    contract(env.as_ref(), "/tmp");
    env.stop();
    assert!(
        lab.dockerd
            .containers_with_label("daytona-standin=1")
            .is_empty(),
        "the sandbox was deleted"
    );
}

/// A test that fails before it stops its ssh environment leaves the backend's master
/// connection running; dropping the test's sshd ends it, so that no session of the test user
/// outlives the test (it would make every later sshd's usermod fail, on the whole machine).
#[test]
fn an_ssh_environment_that_was_never_stopped_ends_with_its_sshd() {
    let Some((_ssh, sshd)) = super::ssh_turn(false) else {
        return;
    };
    let dir = sshd.dir.path().display().to_string();
    let dirs_before = ssh_env_dirs();
    let env = environments::start(&ssh_backend(&sshd, sshd.port), "abandoned").unwrap();
    assert!(env
        .exec(&ExecSpec::new(["true"]), b"", Duration::from_secs(60))
        .unwrap()
        .success());
    // What a panicking test does: never stops it.
    std::mem::forget(env);
    let clients = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok())
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .filter(|c| String::from_utf8_lossy(c).contains(&dir))
            .count()
    };
    assert!(clients() > 0, "the master connection runs");
    drop(sshd);
    let deadline = Instant::now() + Duration::from_secs(10);
    while clients() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(clients(), 0, "a client of the dropped sshd is left");
    // The forgotten environment's control dir and remote socket dir stay, as a crashed host's
    // would; remove them so that the suite leaves the temp dirs as it found them.
    for leftover in ssh_env_dirs().difference(&dirs_before) {
        let _ = std::fs::remove_dir_all(leftover);
    }
}

/// The ssh backend's dirs in the temp dirs: its control dirs on this side (`vibeos-ssh-*`, in
/// $TMPDIR or /tmp) and its socket dirs on the host's side (`vibeos-exec-env-*`, in /tmp).
fn ssh_env_dirs() -> std::collections::BTreeSet<std::path::PathBuf> {
    [std::env::temp_dir(), std::path::PathBuf::from("/tmp")]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("vibeos-ssh-") || name.starts_with("vibeos-exec-env-")
        })
        .map(|e| e.path())
        .collect()
}
