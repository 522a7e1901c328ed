//! What the benchmark binaries share: finding the release build and summarising samples.

// A benchmark harness: a panic is how a broken setup is reported.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;

/// The release `vibeos-exec` (or `VIBEOS_EXEC_BIN`); benchmarks measure optimised code.
pub fn release_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("VIBEOS_EXEC_BIN") {
        return PathBuf::from(p);
    }
    let bin = vibeos_testkit::workspace_root().join("target/release/vibeos-exec");
    assert!(
        bin.exists(),
        "{} missing: run `cargo build --release --bins` first",
        bin.display()
    );
    bin
}

/// The debug `vibeos-exec` (or `VIBEOS_EXEC_BIN`), for the benchmarks that measure the build
/// the tests use.
pub fn debug_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("VIBEOS_EXEC_BIN") {
        return PathBuf::from(p);
    }
    let bin = vibeos_testkit::workspace_root().join("target/debug/vibeos-exec");
    assert!(
        bin.exists(),
        "{} missing: run `cargo build --bins` first",
        bin.display()
    );
    bin
}

/// The median of samples (the upper one of an even count).
pub fn median<T: PartialOrd + Copy>(mut v: Vec<T>) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

/// A temp dir with `home/config.yaml` pinning `code_execution.python` to the real interpreter
/// (not a pyenv shim) and an empty `tmp/`, so `vibeos-exec` runs with `VIBEOS_HOME=dir/home`
/// measure the same interpreter as the baselines. Returns the dir and that interpreter.
pub fn bench_home() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let python = vibeos_testkit::python3();
    std::fs::create_dir_all(dir.path().join("home")).unwrap();
    std::fs::create_dir_all(dir.path().join("tmp")).unwrap();
    std::fs::write(
        dir.path().join("home/config.yaml"),
        format!("code_execution:\n  python: {}\n", python.display()),
    )
    .unwrap();
    (dir, python)
}

/// `--runs N` from the command line, else `default`.
pub fn runs_arg(default: usize) -> usize {
    std::env::args()
        .skip_while(|a| a != "--runs")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// Seconds as right-aligned milliseconds.
pub fn ms(s: f64) -> String {
    format!("{:8.3} ms", s * 1000.0)
}

/// `OK` when `ratio` meets `target` (at most), else `MISSED`.
pub fn verdict(ratio: f64, target: f64) -> &'static str {
    if ratio <= target {
        "OK"
    } else {
        "MISSED"
    }
}

pub mod sandbox;
