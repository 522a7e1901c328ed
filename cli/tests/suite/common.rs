//! What the backend tests share: a runtime and a way to run one request on it, requests that
//! start from a host environment full of things no script may see, backend settings whose tool
//! agent is the binary cargo built, and a look at the processes on an environment's side.
//! The daemons and stand-ins themselves come from `vibeos_testkit`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;
use vibeos_supervisor::{execute, Config, ExecutionRequest, ExecutionResult, Interrupt};
use vibeos_testkit::backends::{Sshd, SSH_USER};
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
