//! Helpers for end-to-end tests: find the built `vibeos-exec`, run it on fixture scripts with a
//! controlled environment, and read its JSON result.
//!
//! The binary is the one cargo builds for the tests of package vibeos-cli ([`exec_bin`]); tests
//! drive it as a user would, with real Python children and real sockets.

// A test harness: a panic here is how a failed expectation is reported.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::Value;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Name of the variable naming the `vibeos-exec` to run when no cargo test sets it (the
/// benchmarks point it at a release build).
pub const EXEC_BIN_ENV: &str = "VIBEOS_EXEC_BIN";

/// Path of the `vibeos-exec` to run: the one cargo built for the running test of package
/// vibeos-cli (`CARGO_BIN_EXE_vibeos-exec`, which cargo also sets at run time), else
/// `VIBEOS_EXEC_BIN`. Never a lookup under `target/`: that could run a stale build.
pub fn exec_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("CARGO_BIN_EXE_vibeos-exec") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os(EXEC_BIN_ENV) {
        return PathBuf::from(p);
    }
    panic!(
        "no vibeos-exec to run: run these tests with `cargo test -p vibeos-cli` (which builds it and \
         sets CARGO_BIN_EXE_vibeos-exec), or set {EXEC_BIN_ENV} to a built binary"
    )
}

/// A file under `fixtures/`.
pub fn fixture(rel: &str) -> PathBuf {
    workspace_root().join("fixtures").join(rel)
}

/// A real Python 3 interpreter for tests (not a pyenv shim, so timing and process trees are
/// what a user would see).
pub fn python3() -> PathBuf {
    let out = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&o.stdout).trim().to_string())
        }
        _ => PathBuf::from("python3"),
    }
}

/// The cargo target dir (`CARGO_TARGET_DIR`, else `target/` of the workspace), where the test
/// venvs and cached images live.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The test venv's Python (`VIBEOS_TEST_MCP_PYTHON`, else `target/pyvenv/bin/python`, which
/// scripts/test-all creates with the MCP SDK and the vibeos_exec package) when it can import
/// `modules` (as written after `import`), else what is missing, for the test's skip message.
pub fn venv_python(modules: &str) -> Result<PathBuf, String> {
    let py = std::env::var_os("VIBEOS_TEST_MCP_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("pyvenv/bin/python"));
    python_with(py, modules)
}

/// `py` when it can import `modules` (as written after `import`), else what is missing.
pub fn python_with(py: PathBuf, modules: &str) -> Result<PathBuf, String> {
    let ok = Command::new(&py)
        .args(["-c", &format!("import {modules}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if ok {
        Ok(py)
    } else {
        Err(format!(
            "{} with the Python modules {modules} (scripts/test-all creates that venv)",
            py.display()
        ))
    }
}

/// A sandbox for one test: its own `VIBEOS_HOME`, working dir and config.
pub struct Sandbox {
    /// Temporary root (removed on drop).
    pub root: tempfile::TempDir,
    /// Extra environment for the CLI.
    pub env: Vec<(OsString, OsString)>,
}

impl Sandbox {
    /// A fresh sandbox with an empty config pinned to the test's real Python.
    pub fn new() -> Self {
        let root = tempfile::Builder::new()
            .prefix("vibeos-e2e-")
            .tempdir()
            .expect("temp dir");
        std::fs::create_dir_all(root.path().join("home")).expect("home dir");
        std::fs::create_dir_all(root.path().join("work")).expect("work dir");
        std::fs::create_dir_all(root.path().join("tmp")).expect("tmp dir");
        let sb = Sandbox {
            root,
            env: Vec::new(),
        };
        sb.write_config("");
        sb
    }

    /// `VIBEOS_HOME` of the sandbox.
    pub fn home(&self) -> PathBuf {
        self.root.path().join("home")
    }

    /// The session working dir of the sandbox.
    pub fn work(&self) -> PathBuf {
        self.root.path().join("work")
    }

    /// The sandbox's TMPDIR, where its staging dirs go.
    pub fn tmp(&self) -> PathBuf {
        self.root.path().join("tmp")
    }

    /// Staging dirs left in the sandbox's TMPDIR (there should be none after a run): the
    /// `vibeos-exec-*` dirs, directly there or in their per-user `vibeos-staging-*` parent, and
    /// that parent itself (removed with the last staging dir).
    pub fn staging_dirs(&self) -> Vec<PathBuf> {
        let named = |p: &Path, prefix: &str| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        };
        let list = |dir: &Path| -> Vec<PathBuf> {
            std::fs::read_dir(dir)
                .map(|rd| rd.flatten().map(|e| e.path()).collect())
                .unwrap_or_default()
        };
        let mut out = Vec::new();
        for p in list(&self.tmp()) {
            if named(&p, "vibeos-exec-") {
                out.push(p);
            } else if named(&p, "vibeos-staging-") {
                out.extend(list(&p).into_iter().filter(|c| named(c, "vibeos-exec-")));
                out.push(p);
            }
        }
        out
    }

    /// Writes `config.yaml`; `code_execution.python` is always pinned to [`python3`] unless the
    /// text sets it.
    pub fn write_config(&self, extra: &str) {
        let mut text = String::new();
        if !extra.contains("python:") {
            let py = python3();
            if extra.contains("code_execution:") {
                text.push_str(&extra.replacen(
                    "code_execution:",
                    &format!("code_execution:\n  python: {}", py.display()),
                    1,
                ));
            } else {
                text.push_str(&format!("code_execution:\n  python: {}\n", py.display()));
                text.push_str(extra);
            }
        } else {
            text.push_str(extra);
        }
        std::fs::write(self.home().join("config.yaml"), text).expect("write config");
    }

    /// Adds an environment variable for the CLI.
    pub fn set_env(&mut self, k: &str, v: &str) {
        self.env.push((k.into(), v.into()));
    }

    /// A `vibeos-exec` command with the sandbox's environment (VIBEOS_HOME, cwd, HOME kept,
    /// no inherited VIRTUAL_ENV/CONDA_PREFIX/VIBEOS_*).
    pub fn command(&self) -> Command {
        self.command_for(exec_bin())
    }

    /// `program` with the environment, working dir and stdin [`Sandbox::command`] gives
    /// `vibeos-exec`: for a test that starts the CLI through a wrapper of its own (which gets
    /// [`exec_bin`] among its arguments).
    pub fn command_for(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        for (k, _) in std::env::vars_os() {
            let ks = k.to_string_lossy();
            if ks.starts_with("VIBEOS_")
                || ks == "VIRTUAL_ENV"
                || ks == "CONDA_PREFIX"
                || ks == "TERMINAL_CWD"
            {
                cmd.env_remove(&k);
            }
        }
        cmd.env("VIBEOS_HOME", self.home());
        cmd.env("TMPDIR", self.tmp());
        cmd.current_dir(self.work());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null());
        // The stopping signals start at their default action, whatever the harness was started
        // with: `run` leaves a signal its caller ignored ignored (`nohup` ignores SIGHUP; a
        // shell may start a background job with SIGINT ignored), and a test that sends one
        // would otherwise wait forever when the suite itself runs that way.
        // SAFETY: `signal` is async-signal-safe, and the closure touches no memory of the
        // parent's: it runs in the forked child between fork and exec.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                    libc::signal(sig, libc::SIG_DFL);
                }
                Ok(())
            });
        }
        cmd
    }

    /// Runs `vibeos-exec ARGS` and returns its output.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command().args(args).output().expect("run vibeos-exec")
    }

    /// Runs `vibeos-exec run --json ARGS SCRIPT` with the script given as text (written to a
    /// file in the sandbox) and returns the parsed result object.
    pub fn run_json(&self, script: &str, args: &[&str]) -> Value {
        let path = self.root.path().join(format!("script-{}.py", unique()));
        std::fs::write(&path, script).expect("write script");
        let p = path.to_string_lossy().into_owned();
        let mut all = vec!["run", "--json"];
        all.extend_from_slice(args);
        all.push(&p);
        let out = self.run(&all);
        parse_single_json(&out)
    }

    /// Runs a fixture script with `--json` and returns the result object.
    pub fn run_fixture(&self, rel: &str, args: &[&str]) -> Value {
        let p = fixture(rel).to_string_lossy().into_owned();
        let mut all = vec!["run", "--json"];
        all.extend_from_slice(args);
        all.push(&p);
        let out = self.run(&all);
        parse_single_json(&out)
    }

    /// Runs `vibeos-exec run ARGS -` with the script on stdin.
    pub fn run_stdin(&self, script: &[u8], args: &[&str]) -> Output {
        let mut cmd = self.command();
        cmd.arg("run").args(args).arg("-");
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn vibeos-exec");
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(script);
        }
        child.wait_with_output().expect("wait vibeos-exec")
    }
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

fn unique() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// Parses stdout as exactly one JSON object, failing loudly with stderr otherwise.
pub fn parse_single_json(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let trimmed = stdout.trim();
    assert_eq!(
        trimmed.lines().count(),
        1,
        "expected exactly one JSON line on stdout, got:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(trimmed).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Whether a process with this pid exists (and is not a zombie).
pub fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next())
                .unwrap_or("X");
            state != "Z" && state != "X"
        }
        Err(_) => false,
    }
}

impl Sandbox {
    /// Runs `vibeos-exec run --json ARGS -`, building the script from the supervisor's pid
    /// (known only once it is spawned; the script goes in on stdin afterwards).
    pub fn run_json_with_pid(&self, args: &[&str], build: impl FnOnce(u32) -> String) -> Value {
        let mut cmd = self.command();
        cmd.arg("run").arg("--json").args(args).arg("-");
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn vibeos-exec");
        let script = build(child.id());
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(script.as_bytes());
        }
        let out = child.wait_with_output().expect("wait vibeos-exec");
        parse_single_json(&out)
    }
}

/// Pids of live processes whose command line mentions `needle` (say, a sandbox's TMPDIR, which
/// every script of that sandbox has in its argv).
pub fn processes_mentioning(needle: &str) -> Vec<i32> {
    processes_where(|proc_dir| {
        std::fs::read(proc_dir.join("cmdline"))
            .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(needle))
    })
}

/// Pids of live processes (other than this one) for which `matches` holds, given each one's
/// `/proc/PID` dir.
pub fn processes_where(matches: impl Fn(&Path) -> bool) -> Vec<i32> {
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        if matches(&entry.path()) && pid_alive(pid) {
            found.push(pid);
        }
    }
    found
}

/// Why strict mode cannot run on this machine (from `vibeos-exec doctor --json`), or `None`
/// when it can. Tests that need strict mode skip with this message.
pub fn strict_unavailable() -> Option<String> {
    let out = Command::new(exec_bin())
        .args(["doctor", "--json"])
        .output()
        .ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    if v["strict_available"].as_bool() == Some(true) {
        None
    } else {
        Some(
            v["strict_blocker"]
                .as_str()
                .unwrap_or("vibeos-exec doctor reports strict mode unavailable")
                .to_string(),
        )
    }
}

/// Asserts that the modules under `crate_dir/src` depend on each other without cycles, as
/// `scripts/module-cycles` reads them (the crates keep a bottom-up shape; a new cycle fails).
pub fn assert_no_module_cycles(crate_dir: &str) {
    let crate_dir = Path::new(crate_dir);
    let src = crate_dir.join("src");
    let out = Command::new("python3")
        .arg(workspace_root().join("scripts/module-cycles"))
        .arg(&src)
        .output()
        .expect("python3 runs scripts/module-cycles");
    let report = String::from_utf8_lossy(&out.stdout);
    let name = crate_dir.file_name().unwrap_or_default().to_string_lossy();
    assert!(
        out.status.success(),
        "module cycles in {name}/src (move the shared items into a module below both):\n{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report.contains("no cycles"), "{report}");
}

/// Runs the Python snippet `code` with `python`, `args` as its `sys.argv[1:]` and `env` added
/// to its environment; asserts that it succeeded and returns its stdout, trimmed.
pub fn python_output(python: &Path, code: &str, args: &[&str], env: &[(&str, String)]) -> String {
    let out = Command::new(python)
        .arg("-c")
        .arg(code)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
