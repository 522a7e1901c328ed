//! Cost of output redaction (security.redact_output) on a full 50 KB execute_code output,
//! against the baseline of what the supervisor does with that output anyway (one copy and a
//! UTF-8 check), measured in the same run.
//!
//! Run: `cargo run --release -p vibeos-benches --bin redaction`

// A benchmark harness: a panic is how a broken setup is reported.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::time::Instant;
use vibeos_benches::median;
use vibeos_tools::redact::Redactor;

fn main() {
    // A realistic environment: 60 ordinary variables, 12 secret ones.
    let mut env: Vec<(String, String)> = (0..60)
        .map(|i| (format!("SETTING_{i}"), format!("/opt/app/value-{i}")))
        .collect();
    env.extend((0..12).map(|i| {
        (
            format!("SERVICE_{i}_TOKEN"),
            format!("tok-{i:04}-abcdefghijklmnop"),
        )
    }));
    // 50 KB of log-like output with three secrets in it.
    let mut text = String::new();
    let mut n = 0;
    while text.len() < 50 * 1024 {
        text.push_str(&format!(
            "2026-12-01T01:02:{:02} INFO worker {n}: processed /srv/data/batch-{n}.json in 12 ms\n",
            n % 60
        ));
        if n == 100 {
            text.push_str("debug: aws=AKIAIOSFODNN7EXAMPLE token=tok-0003-abcdefghijklmnop\n");
        }
        n += 1;
    }
    let rounds = 200;
    let mut baseline = Vec::new();
    let mut redact = Vec::new();
    let mut build = Vec::new();
    let mut count = 0;
    for _ in 0..rounds {
        let t = Instant::now();
        let copy = String::from_utf8_lossy(text.as_bytes()).into_owned();
        baseline.push(t.elapsed().as_secs_f64() * 1e6);
        std::hint::black_box(copy);

        let t = Instant::now();
        let r = Redactor::from_env(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        build.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        let (out, c) = r.redact(&text);
        redact.push(t.elapsed().as_secs_f64() * 1e6);
        count = c;
        std::hint::black_box(out);
    }
    let (b, m, r) = (median(baseline), median(build), median(redact));
    println!("output: {} bytes, {} secrets replaced", text.len(), count);
    println!("baseline (copy + UTF-8 check): {b:.1} µs");
    println!("redactor build (72 env vars, 12 secret): {m:.1} µs");
    println!(
        "redact 50 KB: {r:.1} µs ({:.1}× the baseline)",
        r / b.max(0.001)
    );
    println!("total per execution: {:.2} ms", (m + r) / 1000.0);
}
