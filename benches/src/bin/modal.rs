//! The modal backend against the Modal stand-in (tests/standins/modal_server.py, its
//! sandboxes real containers of a private dockerd), each figure against a baseline measured in
//! the same run:
//! - one exec round trip of the backend (`true` in the sandbox, through the SDK sidecar): the
//!   baseline of both targets;
//! - a `read_file` tool call from a script in the sandbox vs that round trip (target ≤ 1.5×);
//! - `execute_code("pass")` vs that round trip (target ≤ 2×);
//! - how Rust should talk to Modal: one exec round trip as raw gRPC calls, through the SDK
//!   in-process, and through the sidecar's socket (benches/modal_transport.py).
//!
//! Needs target/pyvenv with the pinned `modal` (scripts/test-all creates it), dockerd and the
//! release build: `cargo build --release --bins && cargo run --release -p vibeos-benches --bin
//! modal` (options: `--runs N`, default 20).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};
use vibeos_benches::sandbox::{read_file_per_call, request, timed};
use vibeos_benches::{median, ms, release_bin, runs_arg, verdict};
use vibeos_testkit::modal::ModalLab;
use vibeos_tools::environments::{self, BackendKind, BackendSettings, ExecSpec};

const IMAGE: &str = "vibeos-py:bench";
const CALLS: usize = 100;

fn exec(rt: &tokio::runtime::Runtime, code: &str) -> (f64, String) {
    timed(rt, request(code))
}

fn main() {
    let runs = runs_arg(20);
    let lab = ModalLab::start(IMAGE)
        .expect("the Modal stand-in (target/pyvenv with the pinned modal SDK, dockerd)");
    let python = &lab.python;
    let _endpoint = lab.export();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    environments::activate(BackendSettings {
        backend: BackendKind::Modal,
        modal_image: Some(IMAGE.into()),
        modal_python: python.display().to_string(),
        agent_binary: Some(release_bin()),
        ..BackendSettings::default()
    });
    let env = environments::active()
        .unwrap()
        .get(Some("bench"))
        .expect("sandbox");
    exec(&rt, "open('/root/bench.txt', 'w').write('x\\n')");

    let round_trip = || {
        let t = Instant::now();
        let out = env
            .exec(&ExecSpec::new(["true"]), b"", Duration::from_secs(60))
            .unwrap();
        assert!(out.success());
        t.elapsed().as_secs_f64()
    };
    let (mut base, mut noop) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        base.push(round_trip());
        noop.push(exec(&rt, "pass").0);
    }
    let call = read_file_per_call(&rt, "/root/bench.txt", 10, CALLS, 5);
    let (b, n) = (median(base), median(noop));
    println!("modal against the stand-in ({runs} runs, medians):");
    println!("  exec round trip (`true`)                {}", ms(b));
    println!("  read_file from a script in the sandbox  {}", ms(call));
    println!(
        "  ratio {:.2} (target ≤ 1.5) {}",
        call / b,
        verdict(call / b, 1.5)
    );
    println!("  execute_code(\"pass\"), warm sandbox      {}", ms(n));
    println!("  ratio {:.2} (target ≤ 2) {}", n / b, verdict(n / b, 2.0));
    environments::shutdown();

    // Sidecar or direct gRPC: the same exec round trip three ways.
    let transport = std::process::Command::new(python)
        .arg(vibeos_testkit::workspace_root().join("benches/modal_transport.py"))
        .arg(IMAGE)
        .arg(runs.to_string())
        .arg(environments::modal_sidecar::SIDECAR_SOURCE)
        .output()
        .unwrap();
    assert!(
        transport.status.success(),
        "{}",
        String::from_utf8_lossy(&transport.stderr)
    );
    let t: serde_json::Value = serde_json::from_slice(transport.stdout.trim_ascii()).unwrap();
    println!("one exec round trip, by transport ({runs} runs, medians):");
    println!(
        "  raw gRPC calls (what a Rust client would make)  {} ms",
        t["direct_ms"]
    );
    println!(
        "  official SDK in-process                         {} ms",
        t["sdk_ms"]
    );
    println!(
        "  through the sidecar's socket                    {} ms",
        t["sidecar_ms"]
    );
    let ratio = t["sidecar_ms"].as_f64().unwrap() / t["direct_ms"].as_f64().unwrap();
    println!("  sidecar / raw gRPC {ratio:.2}");
}
