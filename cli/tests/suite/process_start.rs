//! `vibeos-exec` starts at its own C `main` (`cli/src/process_start.rs`), not std's, to skip
//! std's stack-guard lookup; these tests hold it to the two things std's start-up did that a
//! supervisor relies on: standard descriptors that are never some other file, and a write to a
//! reader that left being an error rather than death by `SIGPIPE`. And the package's binaries
//! link the unwinder statically (`cli/build.rs`): the supervisor maps no `libgcc_s`, and a
//! panic still unwinds.

// Tests report failures by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::{Duration, Instant};
use vibeos_testkit::{exec_bin, python3, Sandbox};

/// Execs its arguments with file descriptors 0, 1 and 2 closed, as a careless caller would.
const CLOSE_STANDARD_FDS_AND_EXEC: &str = "\
import os, sys
for fd in (0, 1, 2):
    os.close(fd)
os.execv(sys.argv[1], sys.argv[1:])
";

/// `hold.py` in the sandbox's work dir: a script that holds its run open, with the
/// supervisor and everything it opened for the run, until the test releases it.
struct Hold {
    started: std::path::PathBuf,
    release: std::path::PathBuf,
}

impl Hold {
    fn new(sb: &Sandbox) -> Hold {
        let started = sb.work().join("started");
        let release = sb.work().join("release");
        let script = format!(
            "import os, time\n\
             open({started:?}, 'w').close()\n\
             deadline = time.time() + 60\n\
             while not os.path.exists({release:?}) and time.time() < deadline:\n    time.sleep(0.02)\n\
             print('released')\n",
            started = started.display().to_string(),
            release = release.display().to_string(),
        );
        std::fs::write(sb.work().join("hold.py"), script).unwrap();
        Hold { started, release }
    }

    /// Waits until the script of `run` (the `child`) has started.
    fn wait_until_started(&self, child: &mut std::process::Child) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.started.exists() {
            assert!(Instant::now() < deadline, "the script never started");
            assert!(child.try_wait().unwrap().is_none(), "the run ended early");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Lets the script end.
    fn release(&self) {
        std::fs::write(&self.release, "").unwrap();
    }
}

#[test]
fn closed_standard_descriptors_are_reopened_before_anything_else_is_opened() {
    let sb = Sandbox::new();
    // The script holds the run open (the supervisor's socket, staging dir and pipes all open)
    // until the test has looked at the supervisor's descriptors.
    let hold = Hold::new(&sb);
    let mut child = sb
        .command_for(python3())
        .arg("-c")
        .arg(CLOSE_STANDARD_FDS_AND_EXEC)
        .arg(exec_bin())
        .args(["run", "hold.py"])
        .spawn()
        .unwrap();
    hold.wait_until_started(&mut child);
    // The python wrapper exec'd the supervisor: same pid.
    let targets: Vec<String> = (0..3)
        .map(|fd| {
            std::fs::read_link(format!("/proc/{}/fd/{fd}", child.id()))
                .map(|p| p.display().to_string())
                .unwrap_or_else(|e| format!("fd {fd}: {e}"))
        })
        .collect();
    hold.release();
    let status = child.wait().unwrap();
    // stdin and stderr on /dev/null; stdout on /dev/full, so that the output that cannot be
    // delivered (the script prints `released`) fails the run instead of vanishing.
    assert_eq!(
        targets,
        ["/dev/null", "/dev/full", "/dev/null"],
        "a standard descriptor the caller left closed must not become a file, pipe or socket \
         the supervisor opens"
    );
    assert_eq!(status.code(), Some(1), "{status:?}");
}

#[test]
fn a_reader_that_leaves_makes_the_output_write_fail_instead_of_killing_the_supervisor() {
    let sb = Sandbox::new();
    std::fs::write(
        sb.work().join("loud.py"),
        "import time\ntime.sleep(0.3)\nprint('x' * 200_000)\n",
    )
    .unwrap();
    let mut child = sb
        .command()
        .args(["run", "loud.py"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader leaves before the supervisor writes the script's output.
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        status.signal(),
        None,
        "the supervisor died of a signal writing to a closed pipe: {status:?} {stderr}"
    );
    // The script itself succeeded; the lost output is the reader's doing.
    assert_eq!(status.code(), Some(0), "{status:?} {stderr}");
    assert!(sb.staging_dirs().is_empty(), "{:?}", sb.staging_dirs());
}

/// The memory map of the supervisor of a running `run` (read while its script waits).
fn running_supervisor_maps() -> String {
    let sb = Sandbox::new();
    let hold = Hold::new(&sb);
    let mut child = sb.command().args(["run", "hold.py"]).spawn().unwrap();
    hold.wait_until_started(&mut child);
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
    hold.release();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(
        maps.contains("vibeos-exec"),
        "not the supervisor's maps: {maps}"
    );
    maps
}

/// Whether the supervisor of a running `run` maps `libgcc_s`: it does not when cli/build.rs
/// found the C compiler's `libgcc_eh.a` (which sets `vibeos_static_unwind`), and does else.
#[cfg(target_env = "gnu")]
#[test]
fn the_supervisor_maps_libgcc_s_only_without_the_static_unwinder() {
    let maps = running_supervisor_maps();
    assert!(maps.contains("libc.so"), "not linked with glibc: {maps}");
    assert_eq!(
        maps.contains("libgcc_s"),
        !cfg!(vibeos_static_unwind),
        "libgcc_s mapped: {}, static unwinder linked: {}",
        maps.contains("libgcc_s"),
        cfg!(vibeos_static_unwind)
    );
}

/// A build for musl is linked statically (docs/cold-start.md, "Stop 46"): its supervisor maps
/// no shared library at all, so no loader runs before `main`.
#[cfg(not(target_env = "gnu"))]
#[test]
fn a_static_build_s_supervisor_maps_no_shared_library() {
    let maps = running_supervisor_maps();
    let shared: Vec<&str> = maps.lines().filter(|l| l.contains(".so")).collect();
    assert!(shared.is_empty(), "shared libraries mapped: {shared:?}");
}

/// This test binary links the unwinder as `vibeos-exec` does: a panic unwinds through its
/// frames, runs the destructors on the way and is caught, and a backtrace walks the stack.
#[test]
fn a_panic_unwinds_and_runs_destructors_with_the_package_s_unwinder() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static DROPPED: AtomicUsize = AtomicUsize::new(0);
    struct Counted;
    impl Drop for Counted {
        fn drop(&mut self) {
            DROPPED.fetch_add(1, Ordering::SeqCst);
        }
    }
    #[inline(never)]
    fn nested(depth: u32) -> u32 {
        let _guard = Counted;
        if depth == 0 {
            panic!("unwinding through the package's unwinder");
        }
        nested(depth - 1) + 1
    }
    let caught = std::panic::catch_unwind(|| nested(20));
    assert!(caught.is_err());
    assert_eq!(
        DROPPED.load(Ordering::SeqCst),
        21,
        "every frame's guard is dropped"
    );
    let trace = std::backtrace::Backtrace::force_capture().to_string();
    assert!(
        trace.contains("a_panic_unwinds_and_runs_destructors"),
        "the backtrace does not reach this test's frame: {trace}"
    );
}
