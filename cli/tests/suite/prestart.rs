//! `run` starts its interpreter before the rest of its own start (logging, the registry, the
//! stub) and releases the script through a FIFO (supervisor `prestart`, `script_feed`). These
//! tests check that the script cannot tell: its file is a regular file with its source by the
//! time it runs, tracebacks show its lines, a script larger than a pipe's buffer arrives whole,
//! and an interpreter that dies before it reads its script ends the run with its own error,
//! without a hang and without leftovers.

// Tests report failures by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use vibeos_testkit::{processes_mentioning, python3, Sandbox};

#[test]
fn the_script_finds_its_own_file_regular_and_whole_and_its_traceback_shows_its_lines() {
    let sb = Sandbox::new();
    let script = "import os, stat\n\
        st = os.stat(__file__)\n\
        print('regular', stat.S_ISREG(st.st_mode), oct(st.st_mode & 0o777))\n\
        print('whole', open(__file__).read().count('whole'))\n\
        print('siblings', sorted(n for n in os.listdir(os.path.dirname(__file__)) if n.startswith('.')))\n\
        def fails():\n    raise ValueError('from the marked line')  # MARK-LINE\n\
        fails()\n";
    let r = sb.run_json(script, &[]);
    assert_eq!(r["status"], "error", "{r}");
    let out = r["output"].as_str().unwrap();
    assert!(out.contains("regular True 0o644"), "{out}");
    // The source read back through __file__ is the script itself (that word is twice in it).
    assert!(out.contains("whole 2"), "{out}");
    // The pending file the text waited under is gone once the script runs.
    assert!(out.contains("siblings []"), "{out}");
    assert!(
        out.contains("raise ValueError('from the marked line')  # MARK-LINE"),
        "the traceback must quote the script's line: {out}"
    );
    assert!(sb.staging_dirs().is_empty(), "{:?}", sb.staging_dirs());
}

#[test]
fn a_script_larger_than_a_pipe_buffer_arrives_whole() {
    let sb = Sandbox::new();
    // About 1 MB of source: many times the FIFO's 64 KiB buffer.
    let mut script = String::from("total = 0\n");
    for i in 0..40_000 {
        script.push_str(&format!("total += {i}  # padding padding padding\n"));
    }
    script.push_str("print('total', total, len(open(__file__).read()))\n");
    let r = sb.run_json(&script, &[]);
    assert_eq!(r["status"], "success", "{r}");
    let expected: u64 = (0..40_000u64).sum();
    assert_eq!(
        r["output"].as_str().unwrap().trim(),
        format!("total {expected} {}", script.len())
    );
}

#[test]
fn an_interpreter_that_dies_before_reading_its_script_ends_the_run_with_its_error() {
    let sb = Sandbox::new();
    // An interpreter that, started on a script, exits without opening it. It waits a moment
    // first, so the run has taken it and is releasing the script to it by then: the release
    // must not wait for a reader forever. It does not say which Python it runs (the `-E -s`
    // question asked of a #! wrapper), so it is run itself rather than what it would exec.
    let wrapper = sb.work().join("dying-python");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncase \"$1\" in -u) sleep 0.5; echo 'died before the script' >&2; exit 3;; \
             -E) exit 1;; esac\n\
             exec {} \"$@\"\n",
            python3().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    sb.write_config(&format!(
        "code_execution:\n  python: {}\n",
        wrapper.display()
    ));
    // A script the FIFO's buffer takes whole (released at once), and one four times larger
    // (its rest is written by a thread, which must give up once the interpreter is gone).
    let small = String::from("print('never runs')\n");
    let large = format!(
        "{small}{}",
        "# padding padding padding padding\n".repeat(8_000)
    );
    assert!(large.len() > 4 * 65_536);
    for script in [small, large] {
        let started = std::time::Instant::now();
        let r = sb.run_json(&script, &["--timeout", "60"]);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the run waited for a reader that was gone ({} bytes)",
            script.len()
        );
        assert_eq!(r["status"], "error", "{r}");
        assert_eq!(r["exit_code"], 3, "{r}");
        assert!(
            r["output"]
                .as_str()
                .unwrap()
                .contains("died before the script"),
            "{r}"
        );
        assert!(sb.staging_dirs().is_empty(), "{:?}", sb.staging_dirs());
        assert!(processes_mentioning(&sb.tmp().display().to_string()).is_empty());
    }
}
