//! What the backend tests share: a runtime and a way to run one request on it, requests that
//! start from a host environment full of things no script may see, backend settings whose tool
//! agent is the binary cargo built, and a look at the processes on an environment's side.
//! The daemons and stand-ins themselves come from `vibeos_testkit`. And [`in_own_process`],
//! which lets the tests that change process-wide state run beside each other.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vibeos_supervisor::{execute, Config, ExecutionRequest, ExecutionResult, Interrupt, Status};
use vibeos_testkit::backends::{Sshd, SSH_USER};
pub(crate) use vibeos_testkit::python_output;
use vibeos_tools::environments::{
    settings::KnownHosts, BackendKind, BackendSettings, Environment, ExecSpec,
};

/// The host environment the backend tests hand the supervisor: a PATH that exists only on
/// the host, a locale scripts may keep, and two secrets that must never reach a script.
pub(crate) const HOST_ENV: &[(&str, &str)] = &[
    ("PATH", "/host/only/bin"),
    ("LANG", "C.UTF-8"),
    ("MY_SECRET_TOKEN", "hunter2-host-secret"),
    ("OPENAI_API_KEY", "sk-host-provider-secret"),
];

/// A request to run `code` as task `task` within 60 s, from the host environment `env`.
pub(crate) fn request_from(code: &str, task: &str, env: &[(&str, &str)]) -> ExecutionRequest {
    let mut r = ExecutionRequest::from_config(code, &Config::default());
    r.task_id = Some(task.into());
    r.timeout = Duration::from_secs(60);
    r.base_env = Some(
        env.iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect(),
    );
    r
}

/// A multi-threaded runtime for `execute`.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `req` to its end with the process's registry, uninterrupted.
pub(crate) fn run(rt: &tokio::runtime::Runtime, req: ExecutionRequest) -> ExecutionResult {
    rt.block_on(execute(req, vibeos_tools::registry(), Interrupt::new()))
}

/// A script that starts `sleep TAG` in the background, says `started` and hangs: what a
/// timeout must end, together with what it started.
pub(crate) fn hanging_script(tag: &str) -> String {
    format!(
        "import subprocess, time\nsubprocess.Popen(['sleep', '{tag}'])\nprint('started', flush=True)\ntime.sleep(600)"
    )
}

/// Runs `req` with a timeout of `timeout` (kill grace 1 s) and asserts that it timed out, after
/// the script said `started`, in less than `within`.
pub(crate) fn run_into_timeout(
    rt: &tokio::runtime::Runtime,
    mut req: ExecutionRequest,
    timeout: Duration,
    within: Duration,
) -> ExecutionResult {
    req.timeout = timeout;
    req.kill_grace = Duration::from_secs(1);
    let started = Instant::now();
    let r = run(rt, req);
    assert_eq!(r.status, Status::Timeout, "{r:?}");
    assert!(r.output.contains("started"), "{r:?}");
    assert!(started.elapsed() < within, "{:?}", started.elapsed());
    r
}

/// A script that ignores SIGTERM itself and starts `sleep <tag>` in a session of its own (with
/// the default SIGTERM back), prints "started" and hangs: only the SIGKILL escalation and a
/// sweep beyond the script's group end both.
pub(crate) fn ignore_term_with_setsid_child(tag: &str) -> String {
    format!(
        "import signal, subprocess, time\n\
         signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
         subprocess.Popen(['setsid', 'sleep', '{tag}'], \
         preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))\n\
         print('started', flush=True)\n\
         time.sleep(100)\n"
    )
}

/// Runs `req` and interrupts it `after` it started (as a host's cancel would), with a kill
/// grace of one second.
pub(crate) fn run_interrupted_after(
    rt: &tokio::runtime::Runtime,
    mut req: ExecutionRequest,
    after: Duration,
) -> ExecutionResult {
    let interrupt = Interrupt::new();
    let stopper = interrupt.clone();
    std::thread::spawn(move || {
        std::thread::sleep(after);
        stopper.interrupt();
    });
    req.kill_grace = Duration::from_secs(1);
    rt.block_on(execute(req, vibeos_tools::registry(), interrupt))
}

/// Settings of backend `kind` whose tool agent is the `vibeos-exec` cargo built.
pub(crate) fn backend(kind: BackendKind) -> BackendSettings {
    BackendSettings {
        backend: kind,
        agent_binary: Some(PathBuf::from(env!("CARGO_BIN_EXE_vibeos-exec"))),
        ..BackendSettings::default()
    }
}

/// Settings of the ssh backend that log in to `sshd` (on `port`) as the test user.
pub(crate) fn ssh_backend(sshd: &Sshd, port: u16) -> BackendSettings {
    let d = sshd.dir.path();
    BackendSettings {
        ssh_host: Some("127.0.0.1".into()),
        ssh_port: Some(port),
        ssh_user: Some(SSH_USER.into()),
        ssh_key: Some(d.join("userkey")),
        ssh_known_hosts: KnownHosts::File(d.join("known_hosts")),
        ..backend(BackendKind::Ssh)
    }
}

/// Command lines (NULs as spaces) of the processes on the environment's side, read from its
/// /proc (an image may have no procps).
pub(crate) fn processes_in(env: &dyn Environment) -> Vec<String> {
    let out = env
        .exec(
            &ExecSpec::new([
                "sh",
                "-c",
                "for p in /proc/[0-9]*; do cat $p/cmdline 2>/dev/null; echo; done",
            ]),
            b"",
            Duration::from_secs(60),
        )
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_end_matches('\0').replace('\0', " "))
        .collect()
}

/// The variable that tells a re-run test it is the child [`in_own_process`] started.
const OWN_PROCESS: &str = "VIBEOS_TEST_OWN_PROCESS";

/// Runs the calling test again in a process of its own and reports that run's result here.
/// The backend choice (`environments::activate`), the Modal sidecar and the service
/// credentials a test exports are process-wide: in a child of its own, a test may change them
/// while other tests of this binary run, instead of taking turns with every other backend test.
/// Returns `true` in this (the parent) process, which then returns from the test, and `false` in
/// the child, which goes on with it. Skips are recorded by the child (it inherits
/// `VIBEOS_TEST_SKIPS`); with `CI=true` a skip fails the child, and so the test.
pub(crate) fn in_own_process() -> bool {
    let test = vibeos_testkit::current_test();
    if std::env::var(OWN_PROCESS).is_ok_and(|t| t == test) {
        return false;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .env(OWN_PROCESS, &test)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The child's output as this test's own (libtest shows it when the test fails), without the
    // child harness's own summary lines, which would count the test twice in a total.
    for line in stdout.lines() {
        if !(line.starts_with("test result:") || line.starts_with("running 1 test")) {
            println!("{line}");
        }
    }
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && stdout.contains(&format!("test {test} ... ok")),
        "{test} failed in its own process ({})",
        out.status
    );
    true
}

/// A `vibeos-exec` host process, as a user starts one: `args` then `script`, with `home` as
/// `VIBEOS_HOME` and this build as the tool agent, its output discarded. For tests that kill
/// it mid-run.
pub(crate) fn spawn_host(
    home: &std::path::Path,
    args: &[&str],
    script: &std::path::Path,
) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_vibeos-exec"))
        .args(args)
        .arg(script)
        .env("VIBEOS_HOME", home)
        .env("VIBEOS_AGENT_BINARY", env!("CARGO_BIN_EXE_vibeos-exec"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// The socket dirs `<TMPDIR>/<prefix>*` whose owner file names process `pid`
/// (`vibeos_tools::environments::host_dirs`).
pub(crate) fn host_dirs_of(pid: u32, prefix: &str) -> Vec<String> {
    let owner = format!("{pid}:");
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
                && std::fs::read_to_string(p.join("owner")).is_ok_and(|o| o.starts_with(&owner))
        })
        .map(|p| p.display().to_string())
        .collect()
}
