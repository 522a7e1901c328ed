//! Benchmarks of the execute_code core, each a ratio against a baseline measured in this run.
//!
//! (a) wall time of `vibeos-exec run` on a no-op script over the same interpreter running
//!     `import json, socket` (target ≤ 1.15) and running `-c pass` (target ≤ 1.3);
//! (b) per-call latency of `read_file` from inside a script (2,000 calls of a tiny file) over the
//!     round trip of a minimal JSON echo on a Unix socket (a Rust server, the same script as its
//!     client, chunks of the two alternating; target ≤ 1.5), from a cold interpreter
//!     (`vibeos-exec run`) and from a warm one (a pooled interpreter claimed by
//!     `vibeos_supervisor::execute`, and one forked by the fork server), all in this run; also
//!     over an echo that answers with `read_file`'s own reply, which sets the channel apart
//!     from the tool's payload;
//! (c) peak RSS of the supervisor while a script writes 1 GB to stdout (target ≤ 32 MiB).
//!
//! (a) also prints CPU time (user + system of every process, less sensitive to the load of a
//! shared machine than wall time), the 1-minute load, a breakdown of what a cold `run` adds,
//! what a script that prints costs over the no-op (the redaction of its output), and how much
//! of `cli/link-order.txt` the binary has.
//!
//! Run: `cargo build --release --bins && cargo run --release -p vibeos-benches --bin core`;
//! flags: `--sections abc` (any subset), `--rounds N` (a), `--call-rounds N` (b), `--one-cpu`
//! (every process of the run on CPU 0: (b) then compares the work of each path, free of the
//! scheduler's placement of the two ends of a round trip on one CPU or two, which changes the
//! echo's own figure by 3x from run to run on a 2-vCPU VM).

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

/// User + system CPU seconds of this process's waited-for children (and theirs) so far.
fn children_cpu() -> f64 {
    // SAFETY: getrusage writes one rusage struct into memory we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_CHILDREN is a valid `who`.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// The 1-minute load average, printed with every figure: on the shared 2 cores the wall times
/// depend on it far more than on the code.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// Wall and CPU medians of one command run `rounds` times (interleaved by the caller).
#[derive(Default)]
struct Samples {
    wall: Vec<f64>,
    cpu: Vec<f64>,
}

impl Samples {
    fn run(&mut self, mut c: Command) {
        let cpu = children_cpu();
        let t = Instant::now();
        let out = c.stdin(Stdio::null()).output().unwrap();
        self.wall.push(t.elapsed().as_secs_f64());
        self.cpu.push(children_cpu() - cpu);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn medians(&self) -> (f64, f64) {
        (median(self.wall.clone()), median(self.cpu.clone()))
    }
}

/// (a): `run` of a no-op against the interpreter alone, plus the pieces of a cold `run` that can
/// be timed from outside: the supervisor binary's own start (`--version`), the interpreter
/// running a script file as `run` starts it (`-u script`), and the import of the generated stub.
struct Startup {
    run: Samples,
    /// A run of a script that prints two lines (its output redacted), against `run`.
    printing: Samples,
    bare: Samples,
    pass: Samples,
    version: Samples,
    script: Samples,
    stub_import: Samples,
}

fn bench_startup(env: &Env, rounds: usize) -> Startup {
    let noop = env.dir.path().join("noop.py");
    std::fs::write(&noop, "pass\n").unwrap();
    // A script that prints, as nearly every real one does: its output is redacted.
    let printing = env.dir.path().join("printing.py");
    std::fs::write(
        &printing,
        "print('3 files, 14.21 ms')\nprint('done: http://example.invalid/report 0.21')\n",
    )
    .unwrap();
    // The stub exactly as `run` generates it, with the runtime it imports, kept by a script
    // that copies its own imports.
    let keep = env.dir.path().join("stubcopy");
    std::fs::create_dir_all(&keep).unwrap();
    let copier = env.dir.path().join("copy_stub.py");
    std::fs::write(
        &copier,
        format!(
            "import shutil, sys, vibeos_tools\n\
             for m in (vibeos_tools, sys.modules['_vibeos_runtime']):\n    shutil.copy(m.__file__, {:?})\n",
            keep.display().to_string()
        ),
    )
    .unwrap();
    assert!(env.run_cmd(&copier).status().unwrap().success());
    let python = |args: &[&str]| {
        let mut c = Command::new(&env.python);
        c.args(args).current_dir(env.dir.path());
        c
    };
    let mut s = Startup {
        run: Samples::default(),
        printing: Samples::default(),
        bare: Samples::default(),
        pass: Samples::default(),
        version: Samples::default(),
        script: Samples::default(),
        stub_import: Samples::default(),
    };
    for _ in 0..rounds {
        s.run.run(env.run_cmd(&noop));
        s.printing.run(env.run_cmd(&printing));
        s.bare.run(python(&["-c", "import json, socket"]));
        s.pass.run(python(&["-c", "pass"]));
        let mut v = Command::new(&env.bin);
        v.arg("--version");
        s.version.run(v);
        s.script.run(python(&["-u", &noop.display().to_string()]));
        let mut imp = python(&["-c", "import vibeos_tools"]);
        imp.env("PYTHONPATH", &keep)
            .env("PYTHONDONTWRITEBYTECODE", "1");
        s.stub_import.run(imp);
    }
    s
}

const CALLS: usize = 2000;
const ROUNDS: usize = 5;
/// Calls per timed chunk: the script alternates a chunk of `read_file` calls with a chunk of
/// echo round trips, `CALLS / CHUNK` times, so both see the same phase of the machine.
const CHUNK: usize = 200;

/// Per-call (wall, script CPU) seconds of each chunk of one script run: its `read_file` chunks,
/// the minimal echo's and the echo of `read_file`'s own reply timed between them, in the order
/// they ran.
struct Chunks {
    read: Vec<(f64, f64)>,
    echo: Vec<(f64, f64)>,
    same_reply: Vec<(f64, f64)>,
}

/// Parses the script's output line, `{"read": [[wall, cpu], ...], "echo": [...], "same": [...]}`.
fn chunks(out: &str) -> Chunks {
    let v: serde_json::Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("the calls script printed {out:?}: {e}"));
    let pairs = |key: &str| {
        v[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_f64().unwrap(), p[1].as_f64().unwrap()))
            .collect::<Vec<_>>()
    };
    Chunks {
        read: pairs("read"),
        echo: pairs("echo"),
        same_reply: pairs("same"),
    }
}

/// One `vibeos-exec run` of the calls script.
fn script_calls(env: &Env, script: &Path) -> Chunks {
    let mut c = env.run_cmd(script);
    c.args(["--max-tool-calls", &(CALLS + 10).to_string()]);
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    chunks(&String::from_utf8_lossy(&out.stdout))
}

/// A minimal JSON echo server on `sock` for the whole section (one thread per connection):
/// each request line gets `{"id": <its id>, "result": <result>}`, `result` being JSON text.
fn start_echo_server(sock: &Path, result: String) {
    let listener = UnixListener::bind(sock).unwrap();
    let result: Box<serde_json::value::RawValue> =
        serde_json::value::RawValue::from_string(result).expect("the echo's result is JSON");
    let result: &'static serde_json::value::RawValue = Box::leak(result);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            std::thread::spawn(move || {
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
                        serde_json::to_vec(&serde_json::json!({"id": v["id"], "result": result}))
                            .unwrap();
                    reply.push(b'\n');
                    if writer.write_all(&reply).is_err() {
                        break;
                    }
                }
            });
        }
    });
}

/// The calls script: `read_file` of a tiny file through the stub, the echo floor (the same
/// interpreter's client of the minimal server), and the same client against a server that
/// answers with `read_file`'s own reply, timed in alternating chunks. Measured apart (as this
/// bench did before stop 32), the call and the echo landed in different phases of this VM
/// (both move between about 40 and 250 us per round trip for seconds at a time), which made
/// their ratio anything from 1.0 to 2.1.
fn calls_script(echo_sock: &Path, same_reply_sock: &Path) -> String {
    format!(
        "import json, socket, time\nfrom vibeos_tools import read_file\n\
         def client(path):\n    s = socket.socket(socket.AF_UNIX)\n    s.connect(path)\n    f = s.makefile('rb')\n\
         \x20   def echo(i):\n        s.sendall((json.dumps({{'id': i, 'tool': 'read_file', \
         'args': {{'path': 'tiny.txt'}}, 'token': 'x'}}) + '\\n').encode())\n        return json.loads(f.readline())\n\
         \x20   return echo\n\
         kinds = {{'read': lambda i: read_file('tiny.txt'), 'echo': client({echo:?}), 'same': client({same:?})}}\n\
         for fn in kinds.values():\n    fn(0)\n\
         time.sleep(0.3)\n\
         def timed(fn):\n    t, c = time.perf_counter(), time.process_time()\n\
         \x20   for i in range({CHUNK}):\n        fn(i)\n\
         \x20   return [(time.perf_counter() - t) / {CHUNK}, (time.process_time() - c) / {CHUNK}]\n\
         out = {{name: [] for name in kinds}}\nfor k in range({n}):\n\
         \x20   for name in (list(kinds) if k % 2 else list(kinds)[::-1]):\n        out[name].append(timed(kinds[name]))\n\
         print(json.dumps(out))\n",
        echo = echo_sock.display().to_string(),
        same = same_reply_sock.display().to_string(),
        n = CALLS / CHUNK,
    )
}

/// A request for the tool-call script as the warm paths run it.
fn calls_request(env: &Env, code: &str) -> ExecutionRequest {
    let mut request = ExecutionRequest::from_config(code, &Config::default());
    request.python = Some(env.python.clone());
    request.cwd = Some(env.dir.path().to_path_buf());
    request.timeout = Duration::from_secs(120);
    request.max_tool_calls = CALLS + 10;
    request
}

/// The same script run in a pooled interpreter through the library. The pool exists only for
/// this call and is shut down right after it, so its refill (a full interpreter start) does not
/// run beside the next measurement.
fn warm_calls(env: &Env, runtime: &tokio::runtime::Runtime, code: &str) -> Chunks {
    let request = calls_request(env, code);
    // Hosts ask the fork server first; this round is about the pool. (The script times its
    // own calls, so the server's restart in the next round is not in any figure.)
    zygote::set_enabled(false);
    pool::enable(1);
    pool::prewarm(&request);
    assert!(
        pool::wait_until_idle(Some(&request), 1, Duration::from_secs(30)),
        "the pool did not fill"
    );
    let before = pool::stats().unwrap().warm_starts;
    let r = runtime.block_on(execute(request, vibeos_tools::registry(), Interrupt::new()));
    assert_eq!(pool::stats().unwrap().warm_starts, before + 1, "not warm");
    pool::disable();
    let json = r.to_json();
    assert_eq!(json["status"], "success", "{json}");
    chunks(&r.output)
}

/// The same script forked from the fork server through the library. The server is started
/// before the call and is idle until it (the pool is off meanwhile).
fn forked_calls(env: &Env, runtime: &tokio::runtime::Runtime, code: &str) -> Chunks {
    let request = calls_request(env, code);
    zygote::set_enabled(true);
    assert!(zygote::prewarm(&request), "the fork server did not start");
    let before = zygote::forks();
    let r = runtime.block_on(execute(request, vibeos_tools::registry(), Interrupt::new()));
    assert_eq!(zygote::forks(), before + 1, "not forked");
    let json = r.to_json();
    assert_eq!(json["status"], "success", "{json}");
    chunks(&r.output)
}

/// The result text a script's `read_file('tiny.txt')` gets.
fn tiny_read_reply(env: &Env) -> String {
    let ctx = vibeos_tools::ToolContext {
        origin: vibeos_tools::CallOrigin::Script,
        ..vibeos_tools::ToolContext::agent(env.dir.path())
    };
    vibeos_tools::registry().handle_function_call(
        "read_file",
        &serde_json::json!({"path": "tiny.txt", "offset": 1, "limit": 500}),
        &ctx,
    )
}

/// What the supervisor spends per call in the tool itself: `read_file` of the tiny file through
/// the registry's dispatch, in process (no socket, no script), as a script's call reaches it.
fn handler_call(env: &Env) -> (f64, f64) {
    let ctx = vibeos_tools::ToolContext {
        origin: vibeos_tools::CallOrigin::Script,
        ..vibeos_tools::ToolContext::agent(env.dir.path())
    };
    let args = serde_json::json!({"path": "tiny.txt"});
    let reg = vibeos_tools::registry();
    let mut wall = Vec::new();
    let mut cpu = Vec::new();
    for _ in 0..5 {
        let (t, c) = (Instant::now(), thread_cpu());
        for _ in 0..CALLS {
            std::hint::black_box(reg.handle_function_call("read_file", &args, &ctx));
        }
        wall.push(t.elapsed().as_secs_f64() / CALLS as f64);
        cpu.push((thread_cpu() - c) / CALLS as f64);
    }
    (median(wall), median(cpu))
}

/// CPU seconds this thread has used.
fn thread_cpu() -> f64 {
    // SAFETY: clock_gettime writes one timespec into memory we own.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: as above; CLOCK_THREAD_CPUTIME_ID is a valid clock.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// One path's figures over every round: medians of its `read_file` chunks, of the echo chunks
/// and of the same-reply echo chunks timed beside them (wall, script CPU), and the median of
/// each `read_file` chunk's ratio to its neighbouring chunk of either echo.
struct PathFigures {
    read: (f64, f64),
    echo: (f64, f64),
    same_reply: (f64, f64),
    ratio: f64,
    ratio_same_reply: f64,
}

impl PathFigures {
    fn of(runs: &[Chunks]) -> PathFigures {
        let all = |pick: fn(&Chunks) -> &Vec<(f64, f64)>| {
            let v: Vec<(f64, f64)> = runs.iter().flat_map(|r| pick(r).iter().copied()).collect();
            (
                median(v.iter().map(|x| x.0).collect()),
                median(v.iter().map(|x| x.1).collect()),
            )
        };
        let ratio = |pick: fn(&Chunks) -> &Vec<(f64, f64)>| {
            median(
                runs.iter()
                    .flat_map(|r| r.read.iter().zip(pick(r)).map(|(c, e)| c.0 / e.0))
                    .collect(),
            )
        };
        PathFigures {
            read: all(|r| &r.read),
            echo: all(|r| &r.echo),
            same_reply: all(|r| &r.same_reply),
            ratio: ratio(|r| &r.echo),
            ratio_same_reply: ratio(|r| &r.same_reply),
        }
    }
}

/// Cold, pooled and forked figures; rounds interleaved, and inside each run the tool calls and
/// the echo alternate, so machine noise hits all of them alike.
fn bench_tool_call(env: &Env, rounds: usize) -> [PathFigures; 3] {
    std::fs::write(env.dir.path().join("tiny.txt"), "hello\n").unwrap();
    let echo_sock = env.dir.path().join("echo.sock");
    start_echo_server(&echo_sock, "{}".into());
    // The reply `read_file` gives for the tiny file, from the registry as a script's call gets it.
    let same_reply_sock = env.dir.path().join("same-reply.sock");
    start_echo_server(&same_reply_sock, tiny_read_reply(env));
    // The pause before timing (in the script) lets the pool refill the interpreter it lent (a
    // full start) before the pooled round measures; with --one-cpu the refill would otherwise
    // share the CPU.
    let code = calls_script(&echo_sock, &same_reply_sock);
    let script = env.dir.path().join("calls.py");
    std::fs::write(&script, &code).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    zygote::set_enabled(true);
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    let mut forked = Vec::new();
    for _ in 0..rounds {
        cold.push(script_calls(env, &script));
        warm.push(warm_calls(env, &runtime, &code));
        forked.push(forked_calls(env, &runtime, &code));
    }
    zygote::set_enabled(false);
    [
        PathFigures::of(&cold),
        PathFigures::of(&warm),
        PathFigures::of(&forked),
    ]
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

/// Command-line options: `--sections abc` (any of a, b, c; default all), `--rounds N` for (a)
/// (default 30) and `--call-rounds N` for (b) (default 5).
struct Options {
    sections: String,
    rounds: usize,
    call_rounds: usize,
    one_cpu: bool,
}

fn options() -> Options {
    let mut o = Options {
        sections: "abc".into(),
        rounds: 30,
        call_rounds: ROUNDS,
        one_cpu: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().expect("a value after the flag");
        match a.as_str() {
            "--sections" => o.sections = value(),
            "--rounds" => o.rounds = value().parse().expect("--rounds N"),
            "--call-rounds" => o.call_rounds = value().parse().expect("--call-rounds N"),
            "--one-cpu" => o.one_cpu = true,
            other => {
                panic!("unknown flag {other}; flags: --sections abc, --rounds N, --call-rounds N, --one-cpu")
            }
        }
    }
    o
}

/// How much of `cli/link-order.txt` the measured binary still has, as `vibeos-link-order
/// check` tells it: a stale list (after a toolchain or dependency update) leaves a cold run's
/// code scattered again, which shows in (a) before anything else does.
fn link_order_coverage(bin: &Path) -> String {
    let tool = bin.with_file_name("vibeos-link-order");
    let list = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cli/link-order.txt");
    match Command::new(&tool)
        .args(["check", "--binary"])
        .arg(bin)
        .arg("--list")
        .arg(&list)
        .output()
    {
        Ok(output) => {
            let text = String::from_utf8_lossy(&output.stdout).trim().to_owned();
            if output.status.success() {
                text
            } else {
                format!("{text}; {}", String::from_utf8_lossy(&output.stderr).trim())
            }
        }
        Err(error) => format!(
            "not checked ({}: {error}; cargo build --release -p vibeos-link-order)",
            tool.display()
        ),
    }
}

/// Keeps this process, and every thread and process it starts from now on, on CPU 0.
fn pin_to_one_cpu() {
    let mut set = nix::sched::CpuSet::new();
    set.set(0).expect("CPU 0 exists");
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).expect("sched_setaffinity");
}

fn main() {
    let opts = options();
    if opts.one_cpu {
        // Both ends of every round trip then share one CPU, so (b) compares the work each
        // path does; without it the scheduler may put the two ends on different CPUs, which
        // adds a cross-CPU wake-up to every hop, more or less at random from run to run.
        pin_to_one_cpu();
        println!("everything on CPU 0 (--one-cpu)");
    }
    let env = Env::new();
    println!("interpreter: {}", env.python.display());
    if opts.sections.contains('a') {
        println!("(a) load {} at start", load());
        let s = bench_startup(&env, opts.rounds);
        let (run, run_cpu) = s.run.medians();
        let (bare, bare_cpu) = s.bare.medians();
        let (pass, pass_cpu) = s.pass.medians();
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
        let (printing, _) = s.printing.medians();
        println!(
            "(a) a run that prints two lines: {:.1} ms median, {:+.1} ms over the no-op run (the redaction of its output)",
            printing * 1e3,
            (printing - run) * 1e3
        );
        println!(
            "(a) CPU time (user+sys, all processes): run {:.1} ms, python -c pass {:.1} ms, ratio {:.3}; import json, socket {:.1} ms",
            run_cpu * 1e3,
            pass_cpu * 1e3,
            run_cpu / pass_cpu,
            bare_cpu * 1e3
        );
        for (name, samples) in [
            (
                "vibeos-exec --version (the supervisor binary's start)",
                &s.version,
            ),
            (
                "python -u noop.py (the interpreter as run starts it)",
                &s.script,
            ),
            (
                "python -c 'import vibeos_tools' (the generated stub)",
                &s.stub_import,
            ),
        ] {
            let (wall, cpu) = samples.medians();
            println!(
                "(a) breakdown: {name}: {:.1} ms wall ({:+.1} ms over -c pass), {:.1} ms CPU ({:+.1})",
                wall * 1e3,
                (wall - pass) * 1e3,
                cpu * 1e3,
                (cpu - pass_cpu) * 1e3
            );
        }
        println!(
            "(a) breakdown: the supervisor's own share of a no-op run: {:.1} ms wall, {:.1} ms CPU; load {} at end",
            (run - pass) * 1e3,
            (run_cpu - pass_cpu) * 1e3,
            load()
        );
        println!("(a) link order: {}", link_order_coverage(&env.bin));
    }
    if opts.sections.contains('b') {
        println!("(b) load {} at start", load());
        let [cold, warm, forked] = bench_tool_call(&env, opts.call_rounds);
        let (handler, handler_cpu) = handler_call(&env);
        println!(
            "(b) read_file's handler in process (dispatch included, no socket): {:.1} us/call, {:.1} us CPU",
            handler * 1e6,
            handler_cpu * 1e6
        );
        for (name, f) in [
            ("cold", cold),
            ("warm (pooled)", warm),
            ("warm (forked)", forked),
        ] {
            println!(
                "(b) read_file from a {name} script: {:.1} us/call, script CPU {:.1}; beside it the JSON echo {:.1} us/round trip (client CPU {:.1}), the echo of read_file's reply {:.1} (CPU {:.1}); ratio to the echo {:.3} (target <= 1.5), to the same-reply echo {:.3}",
                f.read.0 * 1e6,
                f.read.1 * 1e6,
                f.echo.0 * 1e6,
                f.echo.1 * 1e6,
                f.same_reply.0 * 1e6,
                f.same_reply.1 * 1e6,
                f.ratio,
                f.ratio_same_reply,
            );
        }
        println!("(b) load {} at end", load());
    }
    if opts.sections.contains('c') {
        let (peak_kib, took, bytes) = bench_flood(&env);
        println!(
            "(c) script wrote {:.2} GB to stdout in {:.1} s; supervisor peak RSS {:.1} MiB (target <= 32 MiB)",
            bytes as f64 / 1e9,
            took,
            peak_kib as f64 / 1024.0
        );
    }
}
