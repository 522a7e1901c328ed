//! Benchmarks of the execute_code core, each a ratio against a baseline measured in this run.
//!
//! (a) wall time of `vibeos-exec run` on a no-op script over the same interpreter running
//!     `import json, socket` (target ≤ 1.15) and running `-c pass` (target ≤ 1.3);
//! (b) per-call latency of `read_file` from inside a script (2,000 calls of a tiny file) over the
//!     round trip of a minimal JSON echo on a Unix socket, driven by the same interpreter
//!     (target ≤ 1.5), from a cold interpreter (`vibeos-exec run`) and from a warm one (a pooled
//!     interpreter claimed by `vibeos_supervisor::execute`, and one forked by the fork server),
//!     all in this run;
//! (c) peak RSS of the supervisor while a script writes 1 GB to stdout (target ≤ 32 MiB).
//!
//! Run: `cargo build --release --bins && cargo run --release -p vibeos-benches --bin core`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use vibeos_benches::{median, release_bin};
use vibeos_supervisor::{execute, pool, zygote, Config, ExecutionRequest, Interrupt};

struct Env {
    dir: tempfile::TempDir,
    python: PathBuf,
    bin: PathBuf,
}

impl Env {
    fn new() -> Env {
        let (dir, python) = vibeos_benches::bench_home();
        Env {
            dir,
            python,
            bin: release_bin(),
        }
    }

    fn run_cmd(&self, script: &Path) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("run")
            .arg(script)
            .env("VIBEOS_HOME", self.dir.path().join("home"))
            .env_remove("VIRTUAL_ENV")
            .env_remove("CONDA_PREFIX")
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }
}

fn time_it(mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

fn bench_startup(env: &Env, rounds: usize) -> (f64, f64, f64) {
    let noop = env.dir.path().join("noop.py");
    std::fs::write(&noop, "pass\n").unwrap();
    let mut run = Vec::new();
    let mut bare = Vec::new();
    let mut pass = Vec::new();
    for _ in 0..rounds {
        run.push(time_it(|| {
            let out = env.run_cmd(&noop).output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }));
        bare.push(time_it(|| {
            let st = Command::new(&env.python)
                .args(["-c", "import json, socket"])
                .stdin(Stdio::null())
                .status()
                .unwrap();
            assert!(st.success());
        }));
        pass.push(time_it(|| {
            let st = Command::new(&env.python)
                .args(["-c", "pass"])
                .stdin(Stdio::null())
                .status()
                .unwrap();
            assert!(st.success());
        }));
    }
    (median(run), median(bare), median(pass))
}

const CALLS: usize = 2000;
const ROUNDS: usize = 5;

/// One script run doing `CALLS` read_file calls; returns seconds per call.
fn script_calls(env: &Env, script: &Path) -> f64 {
    let mut c = env.run_cmd(script);
    c.args(["--max-tool-calls", &(CALLS + 10).to_string()]);
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// One client run doing `CALLS` JSON round trips to a minimal echo server; seconds per call.
fn echo_calls(env: &Env, round: usize) -> f64 {
    let sock = env.dir.path().join(format!("echo-{round}.sock"));
    let listener = UnixListener::bind(&sock).unwrap();
    let server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut writer = stream;
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            let mut reply =
                serde_json::to_vec(&serde_json::json!({"id": v["id"], "result": {}})).unwrap();
            reply.push(b'\n');
            writer.write_all(&reply).unwrap();
        }
    });
    let client = format!(
        "import json, socket, time\ns = socket.socket(socket.AF_UNIX)\ns.connect({sock:?})\n\
         f = s.makefile('rb')\ndef call(i):\n    s.sendall((json.dumps({{'id': i, 'tool': 'read_file', \
         'args': {{'path': 'tiny.txt'}}, 'token': 'x'}}) + '\\n').encode())\n    return json.loads(f.readline())\n\
         call(0)\nt = time.perf_counter()\nfor i in range({CALLS}):\n    call(i)\n\
         print((time.perf_counter() - t) / {CALLS})\n",
        sock = sock.display().to_string()
    );
    let out = vibeos_testkit::python_output(&env.python, &client, &[], &[]);
    server.join().unwrap();
    out.parse().unwrap()
}

/// The same script run in a pooled interpreter through the library; seconds per call.
fn warm_calls(env: &Env, runtime: &tokio::runtime::Runtime, code: &str) -> f64 {
    let mut request = ExecutionRequest::from_config(code, &Config::default());
    request.python = Some(env.python.clone());
    request.cwd = Some(env.dir.path().to_path_buf());
    request.timeout = Duration::from_secs(120);
    request.max_tool_calls = CALLS + 10;
    pool::prewarm(&request);
    assert!(
        pool::wait_until_idle(Some(&request), 1, Duration::from_secs(30)),
        "the pool did not fill"
    );
    let before = pool::stats().unwrap().warm_starts;
    let r = runtime.block_on(execute(request, vibeos_tools::registry(), Interrupt::new()));
    assert_eq!(pool::stats().unwrap().warm_starts, before + 1, "not warm");
    let json = r.to_json();
    assert_eq!(json["status"], "success", "{json}");
    r.output.trim().parse().unwrap()
}

/// The same script forked from the fork server through the library; seconds per call.
fn forked_calls(env: &Env, runtime: &tokio::runtime::Runtime, code: &str) -> f64 {
    let mut request = ExecutionRequest::from_config(code, &Config::default());
    request.python = Some(env.python.clone());
    request.cwd = Some(env.dir.path().to_path_buf());
    request.timeout = Duration::from_secs(120);
    request.max_tool_calls = CALLS + 10;
    zygote::set_enabled(true);
    let before = zygote::forks();
    let r = runtime.block_on(execute(request, vibeos_tools::registry(), Interrupt::new()));
    assert_eq!(zygote::forks(), before + 1, "not forked");
    zygote::set_enabled(false);
    let json = r.to_json();
    assert_eq!(json["status"], "success", "{json}");
    r.output.trim().parse().unwrap()
}

/// Cold, warm and echo figures; medians over interleaved rounds, so machine noise hits all
/// three alike.
fn bench_tool_call(env: &Env) -> (f64, f64, f64, f64) {
    std::fs::write(env.dir.path().join("tiny.txt"), "hello\n").unwrap();
    let code = format!(
        "import time\nfrom vibeos_tools import read_file\nread_file('tiny.txt')\n\
         t = time.perf_counter()\nfor _ in range({CALLS}):\n    r = read_file('tiny.txt')\n\
         print((time.perf_counter() - t) / {CALLS})\n"
    );
    let script = env.dir.path().join("calls.py");
    std::fs::write(&script, &code).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    pool::enable(1);
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    let mut forked = Vec::new();
    let mut echoes = Vec::new();
    for round in 0..ROUNDS {
        cold.push(script_calls(env, &script));
        warm.push(warm_calls(env, &runtime, &code));
        forked.push(forked_calls(env, &runtime, &code));
        echoes.push(echo_calls(env, round));
    }
    pool::disable();
    (median(cold), median(warm), median(forked), median(echoes))
}

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
}

fn bench_flood(env: &Env) -> (u64, f64, u64) {
    let script = env.dir.path().join("flood.py");
    std::fs::write(
        &script,
        "import sys\nchunk = b'x' * (1 << 20)\nw = sys.stdout.buffer\nfor _ in range(1024):\n    w.write(chunk)\n",
    )
    .unwrap();
    let mut c = env.run_cmd(&script);
    c.arg("--json");
    let started = Instant::now();
    let mut child = c.spawn().unwrap();
    let pid = child.id();
    let mut peak = 0;
    loop {
        if let Some(kib) = vm_hwm_kib(pid) {
            peak = peak.max(kib);
        }
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = started.elapsed().as_secs_f64();
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string_lossy(&mut out);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    (peak, took, v["stdout_bytes"].as_u64().unwrap_or(0))
}

trait ReadLossy {
    fn read_to_string_lossy(&mut self, s: &mut String);
}
impl<R: std::io::Read> ReadLossy for R {
    fn read_to_string_lossy(&mut self, s: &mut String) {
        let mut b = Vec::new();
        let _ = self.read_to_end(&mut b);
        s.push_str(&String::from_utf8_lossy(&b));
    }
}

fn main() {
    let env = Env::new();
    println!("interpreter: {}", env.python.display());
    let (run, bare, pass) = bench_startup(&env, 30);
    println!(
        "(a) no-op run: {:.1} ms median; python -c 'import json, socket': {:.1} ms median; ratio {:.3} (target <= 1.15)",
        run * 1e3,
        bare * 1e3,
        run / bare
    );
    println!(
        "(a) no-op run: {:.1} ms median; python -c pass: {:.1} ms median; ratio {:.3} (target <= 1.3)",
        run * 1e3,
        pass * 1e3,
        run / pass
    );
    let (cold, warm, forked, echo) = bench_tool_call(&env);
    println!(
        "(b) JSON echo over a Unix socket: {:.1} us/round trip",
        echo * 1e6
    );
    for (name, call) in [
        ("cold", cold),
        ("warm (pooled)", warm),
        ("warm (forked)", forked),
    ] {
        println!(
            "(b) read_file from a {name} script: {:.1} us/call; ratio to the echo {:.3} (target <= 1.5)",
            call * 1e6,
            call / echo
        );
    }
    let (peak_kib, took, bytes) = bench_flood(&env);
    println!(
        "(c) script wrote {:.2} GB to stdout in {:.1} s; supervisor peak RSS {:.1} MiB (target <= 32 MiB)",
        bytes as f64 / 1e9,
        took,
        peak_kib as f64 / 1024.0
    );
}
