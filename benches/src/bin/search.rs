//! search_files over a generated 100k-file tree, against ripgrep (`rg`) on the same tree in the
//! same run, or `grep -r` when rg is not installed. Prints wall times and the ratio.
//!
//! Usage: `cargo run --release -p vibeos-benches --bin search [FILES]` (default 100000).

use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use vibeos_tools::{registry, ToolContext};

const NEEDLE: &str = "needle_[0-9]+";

fn generate(root: &Path, files: usize) -> std::io::Result<usize> {
    let per_dir = 100;
    let mut expected = 0;
    for i in 0..files {
        let dir = root.join(format!("d{:04}", i / per_dir));
        if i % per_dir == 0 {
            std::fs::create_dir_all(&dir)?;
        }
        let mut f = std::io::BufWriter::new(std::fs::File::create(dir.join(format!("f{i}.txt")))?);
        for line in 0..20 {
            if (i + line) % 97 == 0 {
                writeln!(f, "line {line} has needle_{i} in it")?;
                expected += 1;
            } else {
                writeln!(
                    f,
                    "line {line} of file {i}: lorem ipsum dolor sit amet consectetur"
                )?;
            }
        }
    }
    Ok(expected)
}

fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut last = None;
    for _ in 0..runs {
        let t = Instant::now();
        let v = f();
        best = best.min(t.elapsed());
        last = Some(v);
    }
    match last {
        Some(v) => (best, v),
        None => (best, f()),
    }
}

fn main() {
    let files: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100_000);
    let tmp = match tempfile::Builder::new()
        .prefix("vibeos-search-bench-")
        .tempdir()
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cannot create a temp dir: {e}");
            std::process::exit(1);
        }
    };
    let root = tmp.path();
    let t = Instant::now();
    let expected = match generate(root, files) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("cannot generate the tree: {e}");
            std::process::exit(1);
        }
    };
    println!(
        "tree: {files} files, {expected} matching lines, generated in {:.2?}",
        t.elapsed()
    );

    let ctx = ToolContext::agent(root);
    let args = json!({"pattern": NEEDLE, "output_mode": "count", "limit": 1});
    // Warm the page cache once for everyone.
    let _ = registry().handle_function_call("search_files", &args, &ctx);
    let (ours, result) = best_of(3, || {
        registry().handle_function_call("search_files", &args, &ctx)
    });
    let total = serde_json::from_str::<Value>(&result)
        .ok()
        .and_then(|v| v["total"].as_u64())
        .unwrap_or(0);
    println!("search_files (count mode): {ours:.2?}  total={total}");
    let (ours_page, _) = best_of(3, || {
        registry().handle_function_call(
            "search_files",
            &json!({"pattern": NEEDLE, "limit": 50}),
            &ctx,
        )
    });
    println!("search_files (content, first page of 50): {ours_page:.2?}");

    let (name, mut cmd) = if Command::new("rg").arg("--version").output().is_ok() {
        let mut c = Command::new("rg");
        c.args(["-c", NEEDLE, "."]);
        ("rg -c", c)
    } else {
        let mut c = Command::new("grep");
        c.args(["-rcE", NEEDLE, "."]);
        ("grep -rcE", c)
    };
    cmd.current_dir(root);
    let (base, out) = best_of(3, || cmd.output());
    let base_total: u64 = match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.rsplit(':').next()?.parse::<u64>().ok())
            .sum(),
        Err(e) => {
            eprintln!("{name} failed: {e}");
            0
        }
    };
    println!("{name}: {base:.2?}  total={base_total}");
    println!(
        "ratio search_files/{name} = {:.2} (count mode), {:.2} (first page)",
        ours.as_secs_f64() / base.as_secs_f64(),
        ours_page.as_secs_f64() / base.as_secs_f64()
    );
    if total != expected as u64 || base_total != expected as u64 {
        eprintln!("warning: match totals differ (expected {expected}, search_files {total}, {name} {base_total})");
    }
}
