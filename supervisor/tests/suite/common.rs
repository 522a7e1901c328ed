//! Helpers shared by the pool's and the fork server's tests: a real interpreter, a session dir
//! with a fixed environment, running a request and normalising its result for comparison, and
//! /proc probes for the processes an execution leaves.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vibeos_supervisor::{execute, Config, ExecutionRequest, ExecutionResult, Interrupt};

pub(crate) fn python() -> Option<PathBuf> {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

macro_rules! require_python {
    () => {
        match $crate::suite::common::python() {
            Some(p) => p,
            None => {
                vibeos_testkit::skip!("python3 is not on PATH");
            }
        }
    };
}

pub(crate) fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub(crate) fn fixture(rel: &str) -> String {
    std::fs::read_to_string(workspace().join("fixtures").join(rel)).unwrap()
}

/// A session dir, and requests pinned to it, to the real interpreter and to a fixed environment.
pub(crate) struct Session {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) python: PathBuf,
    pub(crate) env: Vec<(OsString, OsString)>,
}

impl Session {
    pub(crate) fn new(python: PathBuf) -> Session {
        let dir = tempfile::tempdir().unwrap();
        let dir_path = std::fs::canonicalize(dir.path()).unwrap();
        let env = vec![
            ("PATH".into(), std::env::var_os("PATH").unwrap_or_default()),
            ("HOME".into(), dir_path.clone().into_os_string()),
            ("LANG".into(), "C.UTF-8".into()),
            ("EXPECTED_CWD".into(), dir_path.into_os_string()),
            ("VIBEOS_POOL_TEST_SECRET_TOKEN".into(), "s3cret".into()),
        ];
        Session { dir, python, env }
    }

    pub(crate) fn cwd(&self) -> PathBuf {
        std::fs::canonicalize(self.dir.path()).unwrap()
    }

    pub(crate) fn request(&self, code: &str) -> ExecutionRequest {
        let mut r = ExecutionRequest::from_config(code, &Config::default());
        r.cwd = Some(self.cwd());
        r.python = Some(self.python.clone());
        r.base_env = Some(self.env.clone());
        r.timeout = Duration::from_secs(60);
        r
    }
}

pub(crate) fn run(rt: &tokio::runtime::Runtime, request: ExecutionRequest) -> ExecutionResult {
    rt.block_on(execute(request, vibeos_tools::registry(), Interrupt::new()))
}

/// The result with every staging dir path replaced, so cold and warm runs compare equal.
pub(crate) fn normalized(r: &ExecutionResult) -> Value {
    let re = |s: &str| {
        let mut out = String::new();
        let mut rest = s;
        while let Some(i) = rest.find("vibeos-exec-") {
            let start = rest[..i]
                .rfind(|c: char| c == '"' || c.is_whitespace() || c == '\'')
                .map(|p| p + 1)
                .unwrap_or(0);
            out.push_str(&rest[..start]);
            out.push_str("<staging>");
            let tail = &rest[i + "vibeos-exec-".len()..];
            let end = tail
                .find(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                .unwrap_or(tail.len());
            rest = &tail[end..];
        }
        out.push_str(rest);
        out
    };
    serde_json::json!({
        "status": r.status,
        "exit_code": r.exit_code,
        "output": re(&r.output),
        "error": r.error.as_deref().map(re),
        "tool_calls_made": r.tool_calls_made,
        "truncated": r.truncated,
        "stdout_bytes": r.stdout_bytes,
        "stderr_bytes": r.stderr_bytes,
    })
}

pub(crate) fn parent_of(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

pub(crate) fn alive(pid: i32) -> bool {
    // A zombie has exited; only its status is left to collect.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next())
                .is_some_and(|state| state != "Z")
        })
        .unwrap_or(false)
}

pub(crate) fn eventually(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn status(r: &ExecutionResult) -> String {
    r.to_json()["status"].as_str().unwrap_or("").to_string()
}

pub(crate) fn json_line(r: &ExecutionResult) -> Value {
    assert_eq!(status(r), "success", "{}", r.to_json());
    serde_json::from_str(r.output.lines().last().unwrap_or("")).unwrap_or_else(|e| {
        panic!("no JSON line ({e}): {}", r.output);
    })
}

pub(crate) fn strict_unavailable() -> Option<String> {
    vibeos_supervisor::doctor::probe().strict_blocker()
}

pub(crate) fn escapes(r: &ExecutionResult) -> Vec<Value> {
    let line = r
        .output
        .lines()
        .find_map(|l| l.strip_prefix("ESCAPES "))
        .unwrap_or_else(|| panic!("no report: {}", r.to_json()));
    let attempts: Vec<Value> = serde_json::from_str(line).unwrap();
    attempts
        .into_iter()
        .map(|a| serde_json::json!({"what": a["what"], "escaped": a["escaped"], "errno": a["errno"]}))
        .collect()
}

/// The targets of the escape fixtures (fixtures/escapes/): a listening TCP port, a
/// world-writable dir outside with a victim file, a file in the project dir. Kept alive as long
/// as this value is.
pub(crate) struct Escapes {
    _listener: std::net::TcpListener,
    outside: tempfile::TempDir,
    victim: PathBuf,
    params: Value,
    prelude: String,
}

impl Escapes {
    pub(crate) fn new(session: &Session) -> Escapes {
        use std::os::unix::fs::PermissionsExt;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let victim = outside.path().join("victim.txt");
        std::fs::write(&victim, "intact").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o666)).unwrap();
        let project_file = session.cwd().join("project.txt");
        std::fs::write(&project_file, "project secret").unwrap();
        let params = serde_json::json!({
            "tcp_port": listener.local_addr().unwrap().port(),
            "supervisor_pid": std::process::id(),
            "test_pid": std::process::id(),
            "victim": victim,
            "outside_dir": outside.path(),
            "project_file": project_file,
            "project_dir": session.cwd(),
        });
        Escapes {
            _listener: listener,
            outside,
            victim,
            params,
            prelude: fixture("escapes/_prelude.py"),
        }
    }

    /// The script of escape fixture `name`, with its targets.
    pub(crate) fn code(&self, name: &str) -> String {
        format!(
            "PARAMS = {}\n{}\n{}",
            self.params,
            self.prelude,
            fixture(&format!("escapes/{name}"))
        )
    }

    /// Nothing outside was changed or added.
    pub(crate) fn assert_untouched(&self) {
        assert_eq!(std::fs::read_to_string(&self.victim).unwrap(), "intact");
        assert_eq!(std::fs::read_dir(self.outside.path()).unwrap().count(), 1);
    }
}

/// Scripts whose results a warm path (pooled, forked, prestarted) must give exactly as a cold start
/// does: exit codes and messages, tracebacks, syntax errors, `os._exit`, atexit and threads at
/// exit, Ctrl-C, pickling of `__main__` classes, stdin, cwd, environment, `__del__` at exit,
/// signals, warnings, output without a final newline.
pub(crate) fn parity_scripts() -> Vec<String> {
    vec![
        fixture("pool/semantics.py"),
        "import sys\nprint('before')\nsys.exit(3)\n".to_string(),
        "import sys\nsys.exit('bye with a message')\n".to_string(),
        "def f():\n    raise ValueError('boom')\nprint('partial')\nf()\n".to_string(),
        "def broken(:\n    pass\n".to_string(),
        "import os\nprint('x', end='')\nos._exit(7)\n".to_string(),
        "import atexit, threading, time\natexit.register(print, 'atexit ran')\n\
             t = threading.Thread(target=lambda: (time.sleep(0.2), print('thread done')))\n\
             t.start()\nprint('main done')\n"
            .to_string(),
        "raise KeyboardInterrupt\n".to_string(),
        "import pickle\nclass C: pass\nprint(type(pickle.loads(pickle.dumps(C()))).__module__)\n"
            .to_string(),
        "print(__import__('sys').stdin.read() == '')\n".to_string(),
        "import os\nprint(os.getcwd() == os.environ['EXPECTED_CWD'])\n".to_string(),
        "import os\nprint(sorted(k for k in os.environ if k.startswith('VIBEOS_POOL')))\n"
            .to_string(),
        "class D:\n    def __del__(self):\n        print('del ran at exit')\nd = D()\n".to_string(),
        "import sys\nsys.exit(256 + 5)\n".to_string(),
        "import signal, os\nos.kill(os.getpid(), signal.SIGTERM)\n".to_string(),
        "import threading\nthreading.Thread(target=lambda: 1/0).start()\n".to_string(),
        "import warnings\nwarnings.warn('careful')\nraise SystemExit(0)\n".to_string(),
        "import sys\nsys.stdout.write('no newline')\nsys.exit(None)\n".to_string(),
        // Forks of the script that end through the normal exit path, waited for: a fork's
        // exit stopped the forked script itself (it inherited the script's own exit hand-off),
        // which then hung until its timeout (stop 60's probe).
        "import os\nkids = []\nfor i in range(3):\n    pid = os.fork()\n    if pid == 0:\n        \
         raise SystemExit(i)\n    kids.append(pid)\n\
         print(sorted(os.waitpid(p, 0)[1] >> 8 for p in kids))\n"
            .to_string(),
        // The scheduling a cold start inherits from its host, not the fork server's own.
        "import os\nprint(os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))\n"
            .to_string(),
        // What `site` set up: the path (a fork server runs it itself, with -S), the builtins.
        "import sys, builtins\nprint(sys.path)\n\
         print([n for n in ('exit', 'quit', 'help', 'copyright', 'credits', 'license') \
         if hasattr(builtins, n)])\n"
            .to_string(),
    ]
}
